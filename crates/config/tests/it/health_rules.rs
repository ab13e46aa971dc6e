//! vigil's peer rules beyond nginx in both front ends: `passive_count`,
//! `passive_recovery`, `passive_penalty` and `max_ejected` inside
//! `upstream {}` (and the same keys in TOML), `slow_start=` on servers;
//! errors at their positions, `vigil convert` round trips, and the lint
//! codes for their misuse.

use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use vigil_config::convert::nginx_to_toml;
use vigil_config::{literal_resolver, nginx};
use vigil_core::config::{HealthRules, PassiveCount, Penalty, Recovery};

use crate::support::{nginx_err, nginx_load, toml_err, toml_load};
use vigil_config::lint::{lint_config, lint_error, Finding};

const RULES_NGINX: &str = "http {
  upstream api {
    server 127.0.0.1:8001 weight=4 slow_start=30s;
    server 127.0.0.1:8002;
    server 127.0.0.1:8003 backup;
    check interval=2000 rise=2 fall=3 timeout=500 type=http;
    passive_count after_header last_try;
    passive_recovery probe;
    passive_penalty base=5s max=5m jitter=10%;
    max_ejected 50%;
  }
  upstream app { least_conn; server 127.0.0.1:9001 slow_start=1m; server 127.0.0.1:9002;
    passive_count last_try; passive_recovery probation=3; }
  server { listen 8080; location / { proxy_pass http://api; proxy_next_upstream error timeout http_503; } }
}";

const RULES_TOML: &str = r#"
[upstream.api]
balancer = "round_robin"
passive_count = ["after_header", "last_try"]
passive_recovery = "probe"
passive_penalty = { base = "5s", max = "5m", jitter = "10%" }
max_ejected = "50%"
server = [
  { address = "127.0.0.1:8001", weight = 4, slow_start = "30s" },
  { address = "127.0.0.1:8002" },
  { address = "127.0.0.1:8003", backup = true },
]
[upstream.api.check]
type = "http"
interval = "2s"
rise = 2
fall = 3
timeout = "500ms"

[upstream.app]
balancer = "least_conn"
passive_count = ["last_try"]
passive_recovery = "probation=3"
server = [{ address = "127.0.0.1:9001", slow_start = "1m" }, { address = "127.0.0.1:9002" }]

[[server]]
listen = ["0.0.0.0:8080"]
[[server.location]]
path = "/"
proxy_pass = "http://api"
next_upstream = ["error", "timeout", "http_503"]
"#;

#[test]
fn nginx_directives_build_the_rules() {
    let c = nginx_load(RULES_NGINX).expect("loads");
    let api = c.upstream("api").expect("api");
    assert_eq!(
        api.rules,
        HealthRules {
            count: PassiveCount {
                after_header: true,
                last_try: true
            },
            recovery: Recovery::Probe,
            penalty: Some(Penalty {
                base: Duration::from_secs(5),
                max: Duration::from_secs(300),
                jitter_percent: 10,
            }),
            max_ejected: Some(50),
            ..HealthRules::default()
        }
    );
    assert_eq!(api.servers[0].slow_start, Some(Duration::from_secs(30)));
    assert_eq!(
        api.rules.origins.recovery.to_string(),
        "t.conf:8:5",
        "each directive keeps its position"
    );
    let app = c.upstream("app").expect("app");
    assert_eq!(
        app.rules.recovery,
        Recovery::Probation(NonZeroU32::new(3).expect("3"))
    );
    assert!(app.rules.count.last_try && !app.rules.count.after_header);
    // Without the directives: nginx's rules.
    let plain =
        nginx_load("upstream u { server 127.0.0.1:1; server 127.0.0.1:2; }").expect("plain");
    assert!(plain.upstreams[0].rules.is_nginx());
}

#[test]
fn toml_keys_build_the_same_model() {
    let from_toml = toml_load(RULES_TOML).unwrap_or_else(|e| panic!("{e}"));
    let from_nginx = nginx_load(RULES_NGINX).expect("loads");
    assert_eq!(from_toml.upstreams, from_nginx.upstreams);
    assert_eq!(
        from_toml.upstreams[0].rules.origins.penalty.to_string(),
        "vigil.toml:6:1"
    );
}

#[test]
fn rules_round_trip_through_convert() {
    let loaded = nginx::load_str(
        RULES_NGINX,
        Path::new("t.conf"),
        Path::new("."),
        &literal_resolver,
    )
    .expect("loads");
    let text = nginx_to_toml(&loaded);
    for key in [
        "passive_count = [\"after_header\", \"last_try\"]",
        "passive_recovery = \"probe\"",
        "max_ejected = \"50%\"",
        "slow_start = \"30s\"",
        "passive_recovery = \"probation=3\"",
    ] {
        assert!(text.contains(key), "{key} in\n{text}");
    }
    let back = toml_load(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back, loaded.config, "{text}");
}

#[test]
fn nginx_rule_errors_name_the_line_and_what_was_expected() {
    let up = |body: &str| {
        format!("upstream u {{\n  server 127.0.0.1:1;\n  server 127.0.0.1:2;\n  {body}\n}}\n")
    };
    let cases: &[(String, &str)] = &[
        (
            up("passive_recovery probe;"),
            "t.conf:4:3: \"passive_recovery probe\" in upstream \"u\" needs an active \"check\"",
        ),
        (
            up("passive_recovery sometimes;"),
            "t.conf:4:20: invalid value \"sometimes\" in \"passive_recovery\" directive, expected window, probe or probation=N",
        ),
        (
            up("passive_recovery probation=0;"),
            "t.conf:4:20: invalid value \"probation=0\" in \"passive_recovery\" directive, expected probation=N with N >= 1",
        ),
        (
            up("passive_count after_body;"),
            "t.conf:4:17: invalid value \"after_body\" in \"passive_count\" directive, expected after_header or last_try",
        ),
        (
            up("passive_count last_try last_try;"),
            "t.conf:4:26: invalid value \"last_try\" in \"passive_count\" directive, expected each word once",
        ),
        (
            up("passive_count;"),
            "t.conf:4:3: invalid number of arguments in \"passive_count\" directive",
        ),
        (
            up("passive_penalty base=10s;"),
            "t.conf:4:3: invalid number of arguments in \"passive_penalty\" directive",
        ),
        (
            up("passive_penalty base=10s jitter=5%;"),
            "t.conf:4:3: \"passive_penalty\" needs base=T and max=T",
        ),
        (
            up("passive_penalty base=10s max=1m jitter=120%;"),
            "t.conf:4:35: \"passive_penalty\" invalid percentage \"120%\", expected 0% to 100%",
        ),
        (
            up("passive_penalty base=0s max=1m;"),
            "t.conf:4:3: \"passive_penalty\" base and max must be greater than 0",
        ),
        (
            up("passive_penalty base=10x max=1m;"),
            "t.conf:4:19: \"passive_penalty\": invalid time \"10x\"",
        ),
        (
            up("max_ejected 50;"),
            "t.conf:4:15: \"max_ejected\": invalid percentage \"50\", expected 0% to 100%",
        ),
        (
            up("max_ejected 10%;\n  max_ejected 20%;"),
            "t.conf:5:3: \"max_ejected\" directive is duplicate (first at t.conf:4:3)",
        ),
        (
            "upstream u {\n  hash $uri;\n  server 127.0.0.1:1;\n  server 127.0.0.1:2 slow_start=10s;\n}\n".into(),
            "t.conf:4:3: server parameter \"slow_start\" cannot be used with \"hash\" in upstream \"u\"",
        ),
        (
            "upstream u {\n  ip_hash;\n  server 127.0.0.1:1 slow_start=10s;\n}\n".into(),
            "t.conf:3:3: server parameter \"slow_start\" cannot be used with \"ip_hash\"",
        ),
        (
            "upstream u {\n  server 127.0.0.1:1 slow_start=fast;\n}\n".into(),
            "t.conf:2:22: \"server\": invalid time \"fast\"",
        ),
    ];
    for (conf, want) in cases {
        let got = nginx_err(conf);
        assert!(
            got.starts_with(want),
            "want {want}\n got {got}\n--- conf ---\n{conf}"
        );
    }
}

#[test]
fn toml_rule_errors_name_the_field() {
    let up = |keys: &str| {
        format!("[upstream.u]\n{keys}\nserver = [{{ address = \"127.0.0.1:1\" }}, {{ address = \"127.0.0.1:2\" }}]\n")
    };
    let cases: &[(String, &str)] = &[
        (
            up("passive_recovery = \"probe\""),
            "vigil.toml: upstream.u.passive_recovery: \"passive_recovery probe\" in upstream \"u\" needs an active \"check\"",
        ),
        (
            up("passive_recovery = \"probation=x\""),
            "vigil.toml: upstream.u.passive_recovery: invalid \"probation=x\", expected probation=N with N >= 1",
        ),
        (
            up("passive_count = [\"last_try\", \"after\"]"),
            "vigil.toml: upstream.u.passive_count[1]: invalid passive_count \"after\", expected after_header or last_try",
        ),
        (
            up("passive_count = []"),
            "vigil.toml: upstream.u.passive_count: passive_count lists nothing",
        ),
        (
            up("passive_penalty = { base = \"5s\" }"),
            "vigil.toml: upstream.u.passive_penalty: missing field `max`",
        ),
        (
            up("passive_penalty = { base = \"5\", max = \"1m\" }"),
            "vigil.toml: upstream.u.passive_penalty.base: invalid time \"5\", expected a unit",
        ),
        (
            up("passive_penalty = { base = \"5s\", max = \"1m\", jitter = \"x\" }"),
            "vigil.toml: upstream.u.passive_penalty.jitter: invalid percentage \"x\"",
        ),
        (
            up("max_ejected = \"101%\""),
            "vigil.toml: upstream.u.max_ejected: invalid percentage \"101%\", expected 0% to 100%",
        ),
        (
            "[upstream.u]\nbalancer = \"ip_hash\"\nserver = [{ address = \"127.0.0.1:1\" }, { address = \"127.0.0.1:2\", slow_start = \"5s\" }]\n".into(),
            "vigil.toml: upstream.u.server[1].slow_start: server parameter \"slow_start\" cannot be used with \"ip_hash\"",
        ),
    ];
    for (src, want) in cases {
        let got = toml_err(src);
        assert!(
            got.starts_with(want),
            "want {want}\n got {got}\n--- src ---\n{src}"
        );
    }
}

/// Lint nginx.conf text that loads.
fn lint(text: &str) -> Vec<Finding> {
    lint_config(&nginx_load(text).unwrap_or_else(|e| panic!("{e}\n{text}")))
}

fn codes(found: &[Finding]) -> Vec<&'static str> {
    found.iter().map(|f| f.code).collect()
}

#[test]
fn lint_reports_each_misused_rule_at_its_directive() {
    let conf = |rules: &str, next: &str| {
        format!(
            "http {{\n upstream u {{\n  server 127.0.0.1:1 fail_timeout=2m;\n  server 127.0.0.1:2 fail_timeout=2m;\n  server 127.0.0.1:3 backup;\n  {rules}\n }}\n server {{ listen 80; location / {{ proxy_pass http://u; proxy_next_upstream {next}; }} }}\n}}\n"
        )
    };
    let found = lint(&conf("passive_penalty base=1m max=10s;", "error timeout"));
    let f = found
        .iter()
        .find(|f| f.code == "passive-penalty-max-below-base")
        .unwrap_or_else(|| panic!("{found:#?}"));
    assert_eq!(f.at, "t.conf:6:3");
    assert!(f.title.contains("every exclusion lasts 10s"), "{}", f.title);
    assert!(!codes(&lint(&conf(
        "passive_penalty base=10s max=1m;",
        "error timeout"
    )))
    .contains(&"passive-penalty-max-below-base"));

    let zero = lint(&conf("max_ejected 0%;", "error timeout"));
    assert!(codes(&zero).contains(&"max-ejected-zero"), "{zero:#?}");
    let all = lint(&conf("max_ejected 100%;", "error timeout"));
    assert!(codes(&all).contains(&"max-ejected-all"), "{all:#?}");
    let fine = lint(&conf("max_ejected 50%;", "error timeout"));
    assert!(!codes(&fine)
        .iter()
        .any(|c| *c == "max-ejected-zero" || *c == "max-ejected-all"));
    assert!(
        codes(&fine).contains(&"max-ejected-with-backup"),
        "{fine:#?}"
    );

    let idle = lint(&conf("passive_count last_try;", "error timeout"));
    let f = idle
        .iter()
        .find(|f| f.code == "last-try-nothing-listed")
        .unwrap_or_else(|| panic!("{idle:#?}"));
    assert_eq!(f.at, "t.conf:6:3");
    assert!(!codes(&lint(&conf(
        "passive_count last_try;",
        "error timeout http_503"
    )))
    .contains(&"last-try-nothing-listed"));
}

#[test]
fn lint_explains_the_rule_errors() {
    let probe = nginx_load(
        "upstream u { server 127.0.0.1:1; server 127.0.0.1:2;\n passive_recovery probe; }",
    )
    .expect_err("probe without check");
    let f = lint_error(&probe);
    assert_eq!(
        (f.code, f.at.as_str()),
        ("passive-recovery-probe-without-check", "t.conf:2:2")
    );
    assert!(f.explanation.contains("probation=N"), "{}", f.explanation);
    let hash = nginx_load(
        "upstream u { hash $uri; server 127.0.0.1:1 slow_start=5s; server 127.0.0.1:2; }",
    )
    .expect_err("slow_start with hash");
    assert_eq!(lint_error(&hash).code, "slow-start-with-hash");
}
