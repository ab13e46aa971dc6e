//! `vigil lint`: every trap is found in an nginx.conf that has it, at the
//! line of the setting at fault, and is not found once the setting is
//! corrected.

use std::path::Path;

use vigil_config::lint::{lint_config, lint_error, lint_loaded, Finding, Severity, CODES};
use vigil_config::{literal_resolver, nginx, ConfigError};

/// Load nginx.conf text (as `t.conf`) and lint it as `vigil lint` does
/// (the traps, at the directives; what serve ignores left out).
fn lint(text: &str) -> Vec<Finding> {
    let loaded = nginx::load_str(text, Path::new("t.conf"), Path::new("."), &literal_resolver)
        .unwrap_or_else(|e| panic!("config does not load: {e}\n{text}"));
    // The model alone finds the same traps (at the blocks).
    let by_model: Vec<&str> = lint_config(&loaded.config).iter().map(|f| f.code).collect();
    let found: Vec<Finding> = lint_loaded(&loaded)
        .into_iter()
        .filter(|f| !f.serve_only)
        .collect();
    let mut codes: Vec<&str> = found.iter().map(|f| f.code).collect();
    let mut model_codes = by_model.clone();
    codes.sort_unstable();
    model_codes.sort_unstable();
    assert_eq!(codes, model_codes, "lint_loaded and lint_config differ");
    for f in &found {
        assert!(
            severity_of(f.code).is_some_and(|s| s.contains(&f.severity)),
            "{f}: code missing from CODES or with another severity"
        );
        assert!(!f.title.contains('\n'), "{f}: title is one line");
        assert!(f.explanation.len() > 200, "{f}: explanation too short");
    }
    found
}

/// Load text that must fail, and lint the error.
fn lint_err(text: &str) -> Finding {
    match nginx::load_str(text, Path::new("t.conf"), Path::new("."), &literal_resolver) {
        Ok(_) => panic!("config loads but should not:\n{text}"),
        Err(e) => lint_error(&e),
    }
}

fn severity_of(code: &str) -> Option<&'static [Severity]> {
    CODES.iter().find(|(c, _)| *c == code).map(|(_, s)| *s)
}

/// The one finding with `code`.
fn one<'a>(found: &'a [Finding], code: &str) -> &'a Finding {
    let hits: Vec<&Finding> = found.iter().filter(|f| f.code == code).collect();
    assert_eq!(hits.len(), 1, "want exactly one {code}, got {found:#?}");
    hits[0]
}

fn none(found: &[Finding], code: &str) {
    assert!(
        found.iter().all(|f| f.code != code),
        "unexpected {code}: {found:#?}"
    );
}

/// The 1-based line of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> u32 {
    let i = text
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in text"));
    u32::try_from(i + 1).expect("small")
}

/// Asserts that `f` points at the line of `needle` in t.conf.
fn assert_at(f: &Finding, text: &str, needle: &str) {
    let want = format!("t.conf:{}:", line_of(text, needle));
    assert!(
        f.at.starts_with(&want),
        "{} at {:?}, want the line of {needle:?} ({want})",
        f.code,
        f.at
    );
}

/// Asserts that `f` points at `word` on the line of `needle` (its first
/// occurrence on that line), column included.
fn assert_at_word(f: &Finding, text: &str, needle: &str, word: &str) {
    let line = line_of(text, needle);
    let l = text.lines().nth(line as usize - 1).expect("line");
    let col = l
        .find(word)
        .unwrap_or_else(|| panic!("{word:?} not on {l:?}"));
    let col = l[..col].chars().count() + 1;
    assert_eq!(
        f.at,
        format!("t.conf:{line}:{col}"),
        "{} should point at {word:?} on the line of {needle:?}",
        f.code
    );
}

/// A sensible configuration: short timeouts, long fail_timeout, bounded
/// retries, keepalive with HTTP/1.1 and max_conns, a fast active check.
const CLEAN: &str = r#"
worker_processes 1;
events { worker_connections 1024; }
http {
    upstream api {
        server 127.0.0.1:8081 max_fails=2 fail_timeout=60s max_conns=200;
        server 127.0.0.1:8082 max_fails=2 fail_timeout=60s max_conns=200;
        server 127.0.0.1:8083 max_fails=2 fail_timeout=60s max_conns=200;
        keepalive 16;
        check interval=2000 rise=2 fall=3 timeout=1000 type=http;
        check_http_send "GET /health HTTP/1.0\r\n\r\n";
    }
    upstream legacy {
        server 127.0.0.1:9000;
    }
    server {
        listen 127.0.0.1:8080;
        proxy_connect_timeout 2s;
        proxy_read_timeout 10s;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_next_upstream error timeout http_502 http_503;
        proxy_next_upstream_tries 2;
        location /api/ { proxy_pass http://api; }
        location /legacy/ { proxy_pass http://legacy; }
        location /direct/ { proxy_pass http://127.0.0.1:9001; }
    }
}
"#;

#[test]
fn clean_config_has_no_findings() {
    let found = lint(CLEAN);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn severity_displays_lowercase() {
    assert_eq!(Severity::Error.to_string(), "error");
    assert_eq!(Severity::Warning.to_string(), "warning");
    assert_eq!(Severity::Info.to_string(), "info");
}

// --- fail-timeout-vs-read-timeout ---------------------------------------

const FAIL_TIMEOUT: &str = r#"
http {
    upstream api {
        server 127.0.0.1:8081;
        server 127.0.0.1:8082;
        server 127.0.0.1:8083 max_fails=0;
    }
    server {
        listen 127.0.0.1:8080;
        proxy_next_upstream_tries 2;
        location /api/ { proxy_pass http://api; }
    }
}
"#;

#[test]
fn nginx_defaults_without_a_check_are_info_at_the_server() {
    // nginx's defaults: fail_timeout 10s against proxy_read_timeout 60s (6x).
    let found = lint(FAIL_TIMEOUT);
    let f = one(&found, "fail-timeout-vs-read-timeout");
    assert_eq!(f.severity, Severity::Info);
    // Nothing written: the server line.
    assert_at_word(f, FAIL_TIMEOUT, "server 127.0.0.1:8081", "server");
    assert!(f.title.contains("6×"), "{}", f.title);
    assert!(f.title.contains("(and 1 more server)"), "{}", f.title);
    assert!(f.title.contains("fail_timeout 10s"), "{}", f.title);
    assert!(f.title.contains("proxy_read_timeout 1m"), "{}", f.title);
    assert!(
        f.explanation.contains("ngx_http_upstream_get_peer()"),
        "{}",
        f.explanation
    );
}

#[test]
fn nginx_defaults_with_an_active_check_are_clean() {
    for check in [
        "check interval=3000 rise=2 fall=5 timeout=1000 type=http;",
        "check interval=3000 rise=2 fall=5 timeout=1000;",
    ] {
        let checked = FAIL_TIMEOUT.replace(
            "server 127.0.0.1:8083 max_fails=0;",
            &format!("server 127.0.0.1:8083 max_fails=0;\n        {check}"),
        );
        none(&lint(&checked), "fail-timeout-vs-read-timeout");
    }
}

#[test]
fn a_long_read_timeout_without_a_check_is_a_warning_at_the_directive() {
    // 300s / 10s = 30x: the threshold.
    let long = FAIL_TIMEOUT.replace(
        "proxy_next_upstream_tries 2;",
        "proxy_next_upstream_tries 2;\n        proxy_read_timeout 300s;",
    );
    let found = lint(&long);
    let f = one(&found, "fail-timeout-vs-read-timeout");
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.title.contains("30×"), "{}", f.title);
    // fail_timeout is the default: the written proxy_read_timeout is the cause.
    assert_at_word(f, &long, "proxy_read_timeout 300s", "proxy_read_timeout");
    // Just under the threshold: info.
    let under = long.replace("300s", "299s");
    assert_eq!(
        one(&lint(&under), "fail-timeout-vs-read-timeout").severity,
        Severity::Info
    );
    // A TCP check does not find a hung peer: info, not clean.
    let tcp = long.replace(
        "server 127.0.0.1:8083 max_fails=0;",
        "server 127.0.0.1:8083 max_fails=0;\n        check interval=3000 timeout=1000;",
    );
    let f = one(&lint(&tcp), "fail-timeout-vs-read-timeout").clone();
    assert_eq!(f.severity, Severity::Info);
    assert!(f.explanation.contains("type=tcp"), "{}", f.explanation);
    // An HTTP check finds it.
    let http = tcp.replace("timeout=1000;", "timeout=1000 type=http;");
    none(&lint(&http), "fail-timeout-vs-read-timeout");
}

#[test]
fn fail_timeout_at_least_read_timeout_is_clean() {
    let fixed = FAIL_TIMEOUT
        .replace("8081;", "8081 fail_timeout=10s;")
        .replace("8082;", "8082 fail_timeout=10s;")
        .replace(
            "proxy_next_upstream_tries 2;",
            "proxy_next_upstream_tries 2; proxy_read_timeout 10s;",
        );
    none(&lint(&fixed), "fail-timeout-vs-read-timeout");

    // Just under: reported at the fail_timeout= of the server that falls short.
    let short = fixed.replace("8082 fail_timeout=10s", "8082 fail_timeout=9s");
    let found = lint(&short);
    let f = one(&found, "fail-timeout-vs-read-timeout");
    assert_at_word(f, &short, "server 127.0.0.1:8082", "fail_timeout=");
    assert!(!f.title.contains("more server"), "{}", f.title);
}

#[test]
fn fail_timeout_is_held_against_the_slowest_location() {
    let text = r#"
http {
    upstream api {
        server 127.0.0.1:8081 fail_timeout=1s;
        server 127.0.0.1:8082 fail_timeout=1s;
    }
    server {
        listen 127.0.0.1:8080;
        proxy_next_upstream_tries 2;
        location /fast/ { proxy_read_timeout 1s; proxy_pass http://api; }
        location /slow/ { proxy_read_timeout 30s; proxy_pass http://api; }
    }
}
"#;
    let found = lint(text);
    let f = one(&found, "fail-timeout-vs-read-timeout");
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.title.contains("location /slow/"), "{}", f.title);
    assert!(f.title.contains("30×"), "{}", f.title);
    // Without the slow location, 1s >= 1s.
    let fast_only = text.replace(
        "location /slow/ { proxy_read_timeout 30s; proxy_pass http://api; }",
        "",
    );
    none(&lint(&fast_only), "fail-timeout-vs-read-timeout");
}

#[test]
fn fail_timeout_on_a_single_server_is_left_to_max_fails_single_server() {
    let text = r#"
http {
    upstream one { server 127.0.0.1:8081; }
    server { listen 127.0.0.1:8080; location / { proxy_pass http://one; } }
}
"#;
    none(&lint(text), "fail-timeout-vs-read-timeout");
}

// --- max-fails-single-server --------------------------------------------

const SINGLE: &str = r#"
http {
    upstream one {
        server 127.0.0.1:8081 max_fails=3 fail_timeout=30s;
    }
    server {
        listen 127.0.0.1:8080;
        location / { proxy_pass http://one; }
    }
}
"#;

#[test]
fn max_fails_on_a_single_server_is_a_warning() {
    let found = lint(SINGLE);
    let f = one(&found, "max-fails-single-server");
    assert_eq!(f.severity, Severity::Warning);
    assert_at(f, SINGLE, "server 127.0.0.1:8081");
    assert!(
        f.title.contains("max_fails=3 fail_timeout=30s"),
        "{}",
        f.title
    );

    // fail_timeout alone is set too.
    let ft = SINGLE.replace("max_fails=3 ", "");
    one(&lint(&ft), "max-fails-single-server");
}

#[test]
fn max_fails_with_a_second_server_or_backup_or_defaults_is_clean() {
    let two = SINGLE.replace(
        "fail_timeout=30s;",
        "fail_timeout=30s;\n        server 127.0.0.1:8082 max_fails=3 fail_timeout=30s;",
    );
    none(&lint(&two), "max-fails-single-server");
    let backup = SINGLE.replace(
        "fail_timeout=30s;",
        "fail_timeout=30s;\n        server 127.0.0.1:8082 backup;",
    );
    none(&lint(&backup), "max-fails-single-server");
    let defaults = SINGLE.replace(" max_fails=3 fail_timeout=30s", "");
    none(&lint(&defaults), "max-fails-single-server");
    let off = SINGLE.replace("max_fails=3", "max_fails=0");
    none(&lint(&off), "max-fails-single-server");
}

// --- next-upstream-4xx ---------------------------------------------------

const FOUR_XX: &str = r#"
http {
    upstream api {
        server 127.0.0.1:8081 fail_timeout=60s;
        server 127.0.0.1:8082 fail_timeout=60s;
        server 127.0.0.1:8083 fail_timeout=60s;
    }
    server {
        listen 127.0.0.1:8080;
        proxy_connect_timeout 2s;
        proxy_read_timeout 5s;
        location /api/ {
            proxy_next_upstream error timeout http_500 http_404;
            proxy_pass http://api;
        }
    }
}
"#;

#[test]
fn http_404_in_next_upstream_is_a_warning_at_the_word() {
    let found = lint(FOUR_XX);
    let f = one(&found, "next-upstream-4xx");
    assert_eq!(f.severity, Severity::Warning);
    assert_at_word(f, FOUR_XX, "proxy_next_upstream error", "http_404");
    assert!(f.title.contains("http_404"), "{}", f.title);
    assert!(f.title.contains("up to 3 peers"), "{}", f.title);

    let with_403 = FOUR_XX.replace("http_404", "http_403 http_404");
    let found = lint(&with_403);
    assert!(one(&found, "next-upstream-4xx")
        .title
        .contains("http_403 and http_404"));
}

#[test]
fn next_upstream_without_4xx_or_without_retries_is_clean() {
    let fixed = FOUR_XX.replace(" http_404", "");
    none(&lint(&fixed), "next-upstream-4xx");
    let one_try = FOUR_XX.replace(
        "proxy_pass http://api;",
        "proxy_next_upstream_tries 1; proxy_pass http://api;",
    );
    none(&lint(&one_try), "next-upstream-4xx");
    let single = FOUR_XX
        .replace("        server 127.0.0.1:8082 fail_timeout=60s;\n", "")
        .replace("        server 127.0.0.1:8083 fail_timeout=60s;\n", "");
    none(&lint(&single), "next-upstream-4xx");
}

// --- next-upstream-non-idempotent ---------------------------------------

const NON_IDEMPOTENT: &str = r#"
http {
    upstream api {
        server 127.0.0.1:8081 fail_timeout=60s;
        server 127.0.0.1:8082 fail_timeout=60s;
    }
    server {
        listen 127.0.0.1:8080;
        proxy_read_timeout 5s;
        location /orders {
            proxy_next_upstream error timeout non_idempotent;
            proxy_pass http://api;
        }
    }
}
"#;

#[test]
fn non_idempotent_retries_are_a_warning_at_the_word() {
    let found = lint(NON_IDEMPOTENT);
    let f = one(&found, "next-upstream-non-idempotent");
    assert_eq!(f.severity, Severity::Warning);
    assert_at_word(f, NON_IDEMPOTENT, "non_idempotent", "non_idempotent");
    assert!(f.title.contains("POST"), "{}", f.title);
}

#[test]
fn next_upstream_without_non_idempotent_is_clean() {
    let fixed = NON_IDEMPOTENT.replace(" non_idempotent", "");
    none(&lint(&fixed), "next-upstream-non-idempotent");
}

// --- retries-unbounded ---------------------------------------------------

const UNBOUNDED: &str = r#"
http {
    upstream api {
        server 127.0.0.1:8081 fail_timeout=60s;
        server 127.0.0.1:8082 fail_timeout=60s;
        server 127.0.0.1:8083 fail_timeout=60s;
        server 127.0.0.1:8084 down;
    }
    server {
        listen 127.0.0.1:8080;
        proxy_connect_timeout 10s;
        proxy_read_timeout 5s;
        location /api/ { proxy_pass http://api; }
    }
}
"#;

#[test]
fn unbounded_retries_are_a_warning_with_the_worst_case() {
    let found = lint(UNBOUNDED);
    let f = one(&found, "retries-unbounded");
    assert_eq!(f.severity, Severity::Warning);
    assert_at(f, UNBOUNDED, "location /api/");
    // The down server is not tried: 3 peers, 3 x 10s.
    assert!(
        f.title
            .contains("3 peers × proxy_connect_timeout 10s = 30s"),
        "{}",
        f.title
    );
    assert!(
        f.title.contains("3 × proxy_read_timeout 5s = 15s"),
        "{}",
        f.title
    );

    // A long read timeout alone is enough.
    let slow = UNBOUNDED
        .replace("proxy_connect_timeout 10s", "proxy_connect_timeout 1s")
        .replace("proxy_read_timeout 5s", "proxy_read_timeout 60s");
    let found = lint(&slow);
    let f = one(&found, "retries-unbounded");
    assert!(
        f.title.contains("3 × proxy_read_timeout 1m = 3m"),
        "{}",
        f.title
    );
}

#[test]
fn bounded_or_short_retries_are_clean() {
    let cases = [
        UNBOUNDED.replace(
            "listen 127.0.0.1:8080;",
            "listen 127.0.0.1:8080; proxy_next_upstream_tries 2;",
        ),
        UNBOUNDED.replace(
            "listen 127.0.0.1:8080;",
            "listen 127.0.0.1:8080; proxy_next_upstream_timeout 6s;",
        ),
        UNBOUNDED.replace("proxy_connect_timeout 10s", "proxy_connect_timeout 3s"),
        UNBOUNDED.replace(
            "listen 127.0.0.1:8080;",
            "listen 127.0.0.1:8080; proxy_next_upstream error;",
        ),
        UNBOUNDED.replace("        server 127.0.0.1:8083 fail_timeout=60s;\n", ""),
    ];
    for text in &cases {
        none(&lint(text), "retries-unbounded");
    }
}

// --- no-buffering-with-retries -------------------------------------------

const NO_BUFFERING: &str = r#"
http {
    upstream api {
        server 127.0.0.1:8081 fail_timeout=60s;
        server 127.0.0.1:8082 fail_timeout=60s;
    }
    server {
        listen 127.0.0.1:8080;
        proxy_read_timeout 5s;
        location /upload {
            proxy_request_buffering off;
            proxy_pass http://api;
        }
    }
}
"#;

#[test]
fn unbuffered_body_with_retries_is_info_at_the_directive() {
    let found = lint(NO_BUFFERING);
    let f = one(&found, "no-buffering-with-retries");
    assert_eq!(f.severity, Severity::Info);
    assert_at_word(
        f,
        NO_BUFFERING,
        "proxy_request_buffering off",
        "proxy_request_buffering",
    );
}

#[test]
fn buffered_body_or_no_retries_is_clean() {
    let buffered =
        NO_BUFFERING.replace("proxy_request_buffering off", "proxy_request_buffering on");
    none(&lint(&buffered), "no-buffering-with-retries");
    let no_retry = NO_BUFFERING.replace(
        "proxy_request_buffering off;",
        "proxy_request_buffering off; proxy_next_upstream off;",
    );
    none(&lint(&no_retry), "no-buffering-with-retries");
}

// --- keepalive-is-not-a-cap and proxy-http-10-keepalive ------------------

const KEEPALIVE: &str = r#"
http {
    upstream api {
        server 127.0.0.1:8081 fail_timeout=60s;
        server 127.0.0.1:8082 fail_timeout=60s;
        keepalive 32;
    }
    server {
        listen 127.0.0.1:8080;
        proxy_read_timeout 5s;
        location /api/ { proxy_pass http://api; }
    }
}
"#;

#[test]
fn keepalive_without_max_conns_is_info_at_keepalive() {
    let found = lint(KEEPALIVE);
    let f = one(&found, "keepalive-is-not-a-cap");
    assert_eq!(f.severity, Severity::Info);
    assert_at(f, KEEPALIVE, "keepalive 32");
    assert!(f.title.contains("keepalive 32"), "{}", f.title);
}

#[test]
fn keepalive_with_max_conns_is_clean() {
    let fixed = KEEPALIVE.replace(
        "8082 fail_timeout=60s",
        "8082 fail_timeout=60s max_conns=50",
    );
    none(&lint(&fixed), "keepalive-is-not-a-cap");
    let no_keepalive = KEEPALIVE.replace("        keepalive 32;\n", "");
    none(&lint(&no_keepalive), "keepalive-is-not-a-cap");
}

#[test]
fn keepalive_with_http_10_is_info_at_the_location() {
    let found = lint(KEEPALIVE);
    let f = one(&found, "proxy-http-10-keepalive");
    assert_eq!(f.severity, Severity::Info);
    assert_at(f, KEEPALIVE, "location /api/");
    assert!(f.explanation.contains("Connection"), "{}", f.explanation);
}

#[test]
fn keepalive_with_http_11_or_without_keepalive_is_clean() {
    let fixed = KEEPALIVE.replace(
        "proxy_read_timeout 5s;",
        "proxy_read_timeout 5s; proxy_http_version 1.1; proxy_set_header Connection \"\";",
    );
    none(&lint(&fixed), "proxy-http-10-keepalive");
    let no_keepalive = KEEPALIVE.replace("        keepalive 32;\n", "");
    none(&lint(&no_keepalive), "proxy-http-10-keepalive");
}

// --- default-down-long-interval ------------------------------------------

const DEFAULT_DOWN: &str = r#"
upstream api {
    server 127.0.0.1:8081;
    server 127.0.0.1:8082;
    check interval=3000 rise=5 fall=3 timeout=1000 type=tcp;
}
"#;

#[test]
fn default_down_with_a_long_rise_is_a_warning_at_check() {
    let found = lint(DEFAULT_DOWN);
    let f = one(&found, "default-down-long-interval");
    assert_eq!(f.severity, Severity::Warning);
    assert_at(f, DEFAULT_DOWN, "check interval");
    assert!(
        f.title.contains("rise 5 × interval 3s = 15s"),
        "{}",
        f.title
    );

    // tengine's defaults (interval 30s, rise 2): a minute.
    let defaults = DEFAULT_DOWN.replace("interval=3000 rise=5 fall=3 timeout=1000 type=tcp", "");
    let found = lint(&defaults);
    assert!(one(&found, "default-down-long-interval")
        .title
        .contains("= 1m"));
}

#[test]
fn default_down_with_a_short_rise_or_starting_up_is_clean() {
    let short = DEFAULT_DOWN.replace("interval=3000 rise=5", "interval=3000 rise=3");
    none(&lint(&short), "default-down-long-interval");
    let up = DEFAULT_DOWN.replace("type=tcp", "type=tcp default_down=false");
    none(&lint(&up), "default-down-long-interval");
    let first = DEFAULT_DOWN.replace("type=tcp", "type=tcp initial=first-result");
    none(&lint(&first), "default-down-long-interval");
}

// --- all-servers-down ------------------------------------------------------

const ALL_DOWN: &str = r#"
http {
    upstream api {
        server 127.0.0.1:8081 down;
        server 127.0.0.1:8082 down;
    }
    server {
        listen 127.0.0.1:8080;
        location /api/ { proxy_pass http://api; }
    }
}
"#;

#[test]
fn every_server_down_is_an_error_at_the_first_down() {
    let found = lint(ALL_DOWN);
    let f = one(&found, "all-servers-down");
    assert_eq!(f.severity, Severity::Error);
    assert_at_word(f, ALL_DOWN, "server 127.0.0.1:8081", "down");

    let backups_down = ALL_DOWN.replace(
        "8082 down;",
        "8082 down;\n        server 127.0.0.1:8083 backup down;",
    );
    one(&lint(&backups_down), "all-servers-down");
}

#[test]
fn one_server_or_a_backup_up_is_clean() {
    let one_up = ALL_DOWN.replace("8082 down;", "8082;");
    none(&lint(&one_up), "all-servers-down");
    let backup = ALL_DOWN.replace(
        "8082 down;",
        "8082 down;\n        server 127.0.0.1:8083 backup;",
    );
    none(&lint(&backup), "all-servers-down");
}

// --- load errors -----------------------------------------------------------

const HASH_BACKUP: &str = r#"
upstream api {
    hash $request_uri consistent;
    server 127.0.0.1:8081;
    server 127.0.0.1:8082 backup;
}
"#;

#[test]
fn backup_with_hash_is_an_explained_error_at_the_backup_server() {
    let f = lint_err(HASH_BACKUP);
    assert_eq!(f.code, "backup-with-hash");
    assert_eq!(f.severity, Severity::Error);
    assert_at(&f, HASH_BACKUP, "8082 backup");
    assert!(!f.title.starts_with("t.conf"), "{}", f.title);
    assert!(f.explanation.contains("nginx rejects this too"));

    for method in ["ip_hash", "random two"] {
        let text = HASH_BACKUP.replace("hash $request_uri consistent", method);
        assert_eq!(lint_err(&text).code, "backup-with-hash", "{method}");
    }
}

#[test]
fn backup_with_round_robin_loads() {
    let rr = HASH_BACKUP.replace("    hash $request_uri consistent;\n", "");
    none(&lint(&rr), "backup-with-hash");
    let lc = HASH_BACKUP.replace("hash $request_uri consistent", "least_conn");
    none(&lint(&lc), "backup-with-hash");
}

/// Field notes 001 show this very line: a 10 s timeout on a 1 s interval.
const CHECK_TIMEOUT: &str = r#"
upstream nerf {
    server 172.16.0.249:8091 weight=1;
    server 172.16.1.246:9019 weight=4;
    check interval=1000 rise=2 fall=5 timeout=10000 type=tcp;
}
"#;

#[test]
fn check_timeout_not_under_interval_is_an_explained_error_at_check() {
    let f = lint_err(CHECK_TIMEOUT);
    assert_eq!(f.code, "check-timeout-ge-interval");
    assert_eq!(f.severity, Severity::Error);
    assert_at(&f, CHECK_TIMEOUT, "check interval");
    let equal = CHECK_TIMEOUT.replace("timeout=10000", "timeout=1000");
    assert_eq!(lint_err(&equal).code, "check-timeout-ge-interval");
}

#[test]
fn check_timeout_under_interval_loads() {
    let fixed = CHECK_TIMEOUT
        .replace("interval=1000", "interval=3000")
        .replace("timeout=10000", "timeout=1000");
    none(&lint(&fixed), "check-timeout-ge-interval");
}

#[test]
fn other_load_errors_keep_their_position_and_message() {
    let text = "http {\n    server {\n        listen 127.0.0.1:8080;\n        location / { if ($x) { return 404; } }\n    }\n}\n";
    let f = lint_err(text);
    assert_eq!(f.code, "unsupported-directive");
    assert_eq!(f.severity, Severity::Error);
    assert!(f.at.starts_with("t.conf:4:"), "{}", f.at);
    assert!(f.title.contains("\"if\""), "{}", f.title);

    let f = lint_err("http {\n    server {\n        listen 127.0.0.1:8080;\n    }\n");
    assert_eq!(f.code, "syntax-error");
    assert!(f.at.starts_with("t.conf:"), "{}", f.at);
    assert!(f.title.contains("unexpected end of file"), "{}", f.title);

    let f = lint_err("upstream api {\n    server 127.0.0.1:8081 weight=0;\n}\n");
    assert_eq!(f.code, "config-error");
    assert!(f.at.starts_with("t.conf:2:"), "{}", f.at);

    let io = ConfigError::Io {
        path: "missing.conf".into(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    };
    let f = lint_error(&io);
    assert_eq!(f.code, "config-unreadable");
    assert_eq!(f.at, "missing.conf");
}

// --- order and documentation -----------------------------------------------

#[test]
fn findings_are_sorted_by_position() {
    let text = r#"
http {
    upstream api {
        server 127.0.0.1:8081;
        server 127.0.0.1:8082;
        server 127.0.0.1:8083;
        keepalive 8;
        check interval=30000 timeout=1000;
    }
    upstream one { server 127.0.0.1:9000 max_fails=5; }
    server {
        listen 127.0.0.1:8080;
        location /b { proxy_next_upstream error timeout http_404; proxy_pass http://api; }
        location /a { proxy_pass http://one; }
    }
}
"#;
    let found = lint(text);
    let lines: Vec<u32> = found
        .iter()
        .map(|f| {
            f.at.split(':')
                .nth(1)
                .and_then(|l| l.parse().ok())
                .unwrap_or_else(|| panic!("{f}"))
        })
        .collect();
    let mut sorted = lines.clone();
    sorted.sort_unstable();
    assert_eq!(lines, sorted, "{found:#?}");
    // Everything this config gets wrong is there.
    let codes: Vec<&str> = found.iter().map(|f| f.code).collect();
    for code in [
        "keepalive-is-not-a-cap",
        "default-down-long-interval",
        "max-fails-single-server",
        "next-upstream-4xx",
        "retries-unbounded",
        "proxy-http-10-keepalive",
    ] {
        assert!(codes.contains(&code), "{code} missing: {codes:?}");
    }
}

#[test]
fn docs_describe_every_code() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/lint.md");
    let doc = std::fs::read_to_string(&path).expect("docs/lint.md");
    for (code, severities) in CODES {
        let heading = format!("## `{code}`");
        let at = doc
            .find(&heading)
            .unwrap_or_else(|| panic!("docs/lint.md has no heading {heading}"));
        let section = &doc[at..];
        let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
        let words: Vec<&str> = severities.iter().map(|s| s.as_str()).collect();
        let want = format!("Severity: {}", words.join(" or "));
        assert!(
            section[..end].contains(&want),
            "docs/lint.md: {code} should say `{want}`"
        );
    }
}

#[test]
fn rule_findings_point_at_the_parameter_at_fault() {
    let text = r#"
http {
    upstream api {
        server 127.0.0.1:8081;
        server 127.0.0.1:8082;
        passive_penalty base=10s max=5s;
        eject_stuck factor=3 min=120s;
    }
    server {
        listen 127.0.0.1:8080;
        location / { proxy_pass http://api; }
    }
}
"#;
    let found = lint(text);
    assert_at_word(
        one(&found, "passive-penalty-max-below-base"),
        text,
        "passive_penalty",
        "max=",
    );
    assert_at_word(
        one(&found, "eject-stuck-never"),
        text,
        "eject_stuck",
        "min=",
    );
}

// --- inherited-headers-dropped and "did you mean" ---------------------------

const SHADOW: &str = "http {
    add_header X-Frame-Options DENY;
    add_header X-Content-Type-Options nosniff;
    upstream app { server 127.0.0.1:8081; }
    server {
        listen 127.0.0.1:8080;
        proxy_set_header X-Forwarded-For $remote_addr;
        location / {
            proxy_pass http://app;
        }
        location /api/ {
            add_header Cache-Control no-store;
            proxy_set_header X-Api yes;
            proxy_pass http://app;
        }
    }
}
";

#[test]
fn an_own_add_header_or_proxy_set_header_that_drops_inherited_ones_is_a_warning() {
    let loaded = nginx::load_str(
        SHADOW,
        Path::new("t.conf"),
        Path::new("."),
        &literal_resolver,
    )
    .expect("loads");
    let found: Vec<Finding> = lint_loaded(&loaded)
        .into_iter()
        .filter(|f| f.code == "inherited-headers-dropped")
        .collect();
    assert_eq!(found.len(), 2, "{found:#?}");
    for f in &found {
        assert_eq!(f.severity, Severity::Warning);
        assert!(severity_of(f.code).is_some_and(|s| s.contains(&f.severity)));
        assert!(f.explanation.len() > 200);
    }
    assert_at(&found[0], SHADOW, "add_header Cache-Control");
    assert!(
        found[0].title.contains("drops 2 \"add_header\"")
            && found[0].title.contains("X-Frame-Options (t.conf:2:")
            && found[0].title.contains("X-Content-Type-Options (t.conf:3:"),
        "{}",
        found[0].title
    );
    assert_at(&found[1], SHADOW, "proxy_set_header X-Api");
    assert!(
        found[1].title.contains("X-Forwarded-For (t.conf:7:"),
        "{}",
        found[1].title
    );
    // Nothing written above, or nothing of its own: nothing dropped.
    let clean = SHADOW
        .replace("    add_header X-Frame-Options DENY;\n    add_header X-Content-Type-Options nosniff;\n", "")
        .replace("            proxy_set_header X-Api yes;\n", "");
    let loaded = nginx::load_str(
        &clean,
        Path::new("t.conf"),
        Path::new("."),
        &literal_resolver,
    )
    .expect("loads");
    none(&lint_loaded(&loaded), "inherited-headers-dropped");
}

#[test]
fn a_misspelt_directive_is_refused_with_the_name_it_likely_meant() {
    let f = lint_err(
        "http { server { listen 127.0.0.1:8080; location / { proxy_pas http://127.0.0.1:1; } } }",
    );
    assert_eq!(f.code, "unsupported-directive");
    assert!(
        f.title.ends_with("did you mean \"proxy_pass\"?"),
        "{}",
        f.title
    );
}
