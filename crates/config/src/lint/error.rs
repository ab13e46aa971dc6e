//! A configuration that cannot be loaded, as a finding.
//!
//! [`ConfigError`] carries no classification of *which* rule a setting
//! broke, only a position and a message, so the known traps are recognised
//! here by the wording of the messages the front ends produce (the texts
//! below name where each comes from; the lint tests load real configs
//! through the front end, so a change of wording fails them). Nothing else
//! in vigil looks at error texts.

use super::{Finding, Severity};
use crate::nginx::syntax::SyntaxError;
use crate::ConfigError;

/// A directive or parameter `vigil serve` does not implement.
pub const UNSUPPORTED_DIRECTIVE: &str = "unsupported-directive";
/// A variable (or header name) `vigil serve` does not know, in a value.
pub const UNSUPPORTED_VARIABLE: &str = "unsupported-variable";
/// Nothing for `vigil serve` to listen on.
pub const NO_SERVER_BLOCK: &str = "no-server-block";
/// A directive `vigil serve` accepts without effect.
pub const IGNORED_DIRECTIVE: &str = "ignored-directive";
pub(super) const BACKUP_WITH_HASH: &str = "backup-with-hash";
pub(super) const CHECK_TIMEOUT_GE_INTERVAL: &str = "check-timeout-ge-interval";
pub(super) const SYNTAX_ERROR: &str = "syntax-error";
pub(super) const CONFIG_UNREADABLE: &str = "config-unreadable";
pub(super) const CONFIG_ERROR: &str = "config-error";
pub(super) const PROBE_RECOVERY_WITHOUT_CHECK: &str = "passive-recovery-probe-without-check";
pub(super) const SLOW_START_WITH_HASH: &str = "slow-start-with-hash";

/// `config/nginx/upstream.rs`, a `backup` server with hash, ip_hash or random.
const BACKUP_TEXT: &str = "\"backup\" cannot be used with";
/// `config/validate.rs`, `check` timeout not shorter than its interval.
const CHECK_TIMEOUT_TEXT: &str = "check timeout (";
const CHECK_INTERVAL_TEXT: &str = "must be shorter than interval";
/// `config/validate.rs` `rules()`, `passive_recovery probe` without `check`.
const PROBE_WITHOUT_CHECK_TEXT: &str = "\"passive_recovery probe\" in upstream";
/// `config/validate.rs` `rules()`, `slow_start` with hash or ip_hash.
const SLOW_START_HASH_TEXT: &str = "server parameter \"slow_start\" cannot be used with";
/// `config/nginx/mod.rs` (`unknown()`, `unsupported()`) and the parameter checks.
const UNKNOWN_TEXT: &str = "unknown or unsupported directive";
const UNSUPPORTED_TEXT: &str = "not supported";

/// A configuration error as an `error` finding at the error's position,
/// explaining the trap behind it where it is a known one (for example a
/// `backup` server in a `hash` upstream, which nginx rejects too).
pub fn lint_error(err: &ConfigError) -> Finding {
    let at = position(err);
    let text = err.to_string();
    let title = text
        .strip_prefix(&format!("{at}: "))
        .unwrap_or(&text)
        .to_string();
    let (code, explanation) = classify(err);
    Finding {
        code,
        severity: Severity::Error,
        at,
        title,
        explanation: explanation.to_string(),
        serve_only: serve_only(code),
    }
}

/// Whether findings with `code` are limits of `vigil serve` rather than
/// mistakes nginx rejects or traps it falls into.
pub(super) fn serve_only(code: &str) -> bool {
    matches!(
        code,
        UNSUPPORTED_DIRECTIVE | UNSUPPORTED_VARIABLE | NO_SERVER_BLOCK | IGNORED_DIRECTIVE
    )
}

/// Where the error is: `file:line:col`, a TOML field path, or the file.
fn position(err: &ConfigError) -> String {
    match err {
        ConfigError::Io { path, .. } | ConfigError::Toml { path, .. } => path.display().to_string(),
        ConfigError::Syntax(e) => match (e.span(), e) {
            (Some(span), _) => span.to_string(),
            (None, SyntaxError::Io { path, .. }) => path.display().to_string(),
            (None, _) => String::new(),
        },
        ConfigError::Invalid { at, .. } => at.clone(),
    }
}

fn classify(err: &ConfigError) -> (&'static str, &'static str) {
    match err {
        ConfigError::Io { .. } | ConfigError::Syntax(SyntaxError::Io { .. }) => {
            (CONFIG_UNREADABLE, UNREADABLE)
        }
        ConfigError::Syntax(_) => (SYNTAX_ERROR, SYNTAX),
        ConfigError::Invalid { message, .. } => {
            if message.contains(BACKUP_TEXT) {
                (BACKUP_WITH_HASH, BACKUP)
            } else if message.starts_with(PROBE_WITHOUT_CHECK_TEXT) {
                (PROBE_RECOVERY_WITHOUT_CHECK, PROBE_WITHOUT_CHECK)
            } else if message.starts_with(SLOW_START_HASH_TEXT) {
                (SLOW_START_WITH_HASH, SLOW_START_HASH)
            } else if message.starts_with(CHECK_TIMEOUT_TEXT)
                && message.contains(CHECK_INTERVAL_TEXT)
            {
                (CHECK_TIMEOUT_GE_INTERVAL, CHECK_TIMEOUT)
            } else if message.contains(UNKNOWN_TEXT) || message.contains(UNSUPPORTED_TEXT) {
                (UNSUPPORTED_DIRECTIVE, UNSUPPORTED)
            } else {
                (CONFIG_ERROR, INVALID)
            }
        }
        ConfigError::Toml { .. } => (CONFIG_ERROR, INVALID),
    }
}

const BACKUP: &str = "nginx rejects this too: the nginx docs say that `backup` \"cannot be \
    used along with the hash, ip_hash, and random load balancing methods\", and nginx -t \
    fails with \"balancing method does not support parameter \\\"backup\\\"\" when the method \
    comes first (vigil refuses either order). These methods map a key (or a draw) straight \
    to a peer and have no second tier to fall back to. Remove `backup`: a hashed key already \
    moves to another peer when its own is unavailable. If a standby group is what you need, \
    use round robin or least_conn, which have one.";

const PROBE_WITHOUT_CHECK: &str = "`passive_recovery probe` (vigil only) keeps a peer \
    out after its passive exclusion until an active probe passes, so an upstream without a \
    `check` could never get it back: every peer that reached max_fails would stay out for \
    good. Add a `check` to the upstream (the recovery probe runs as soon as the exclusion \
    ends, whatever the check's interval), or use `passive_recovery probation=N`, which \
    needs no check: the peer then takes one request at a time until N succeed in a row.";

const SLOW_START_HASH: &str = "`slow_start` ramps a readmitted server's weight up, but \
    `hash` and `ip_hash` send each key to its server whatever the weights say (the weight \
    only shapes the key space, and a ramp would move keys between servers as it goes), so \
    nginx Plus refuses the parameter with them and vigil does too. Remove `slow_start`, or \
    use round robin, least_conn or random, where the ramp shifts requests gradually.";

const CHECK_TIMEOUT: &str = "A probe must finish before the next one is due: the checker \
    starts one probe per interval, so with timeout >= interval a slow peer could have two \
    probes in flight and rise/fall would count overlapping results. Set timeout well below \
    interval (for example `check interval=3000 rise=2 fall=5 timeout=1000`, the example of \
    tengine's ngx_http_upstream_check_module documentation); remember that tengine's bare \
    numbers are milliseconds: `interval=3000 timeout=1000` is 3 s and 1 s, and \
    `interval=1000 timeout=10000` is a 10 s timeout on a 1 s interval.";

const UNSUPPORTED: &str = "vigil serve refuses a directive or parameter that would \
    change behaviour but that it does not implement, rather than silently ignoring it and \
    behaving differently from nginx (directives with no meaning for a proxy, such as \
    worker_processes or the temp paths, are accepted and listed as ignored instead). This \
    is vigil serve's limit, not a mistake in the file: if the configuration keeps running \
    on nginx, nothing needs to change, and `vigil check` can watch its upstreams beside \
    nginx. If the name is a typo, `nginx -t` rejects it as an unknown directive too. To \
    serve the file with vigil, remove the directive or keep the part of the configuration \
    that needs it on nginx.";

/// The explanation of `unsupported-variable` (used by `vigil lint`).
pub const UNSUPPORTED_VARIABLE_TEXT: &str = "vigil serve compiles the values of \
    proxy_set_header, add_header and the hash key when it starts, and refuses a variable \
    it does not implement rather than sending an empty or wrong value (nginx documents its \
    variables at https://nginx.org/en/docs/varindex.html; vigil implements the common \
    request and upstream ones, listed in docs/configuration.md). A header name that is not \
    a valid HTTP token is refused the same way. This is vigil serve's limit, not a mistake \
    in the file when nginx knows the variable: keep the file on nginx, or remove or \
    replace the value before serving it with vigil.";

pub(super) const IGNORED: &str = "vigil serve accepts directives that only configure \
    nginx's own process or features that do not change what a proxy sends (workers, pid, \
    temp paths, buffer sizes, how files are read: sendfile, open_file_cache; TLS session \
    settings) and reports each of them. \
    They do not change how vigil routes, retries or checks; under nginx they keep their \
    meaning (see https://nginx.org/en/docs/dirindex.html).";

pub(super) const NO_SERVER: &str = "vigil serve needs at least one server block to listen \
    on and refuses to start without one. A file that holds only upstream blocks is what \
    `vigil check` reads beside nginx (the upstreams of the nginx it watches); for that use \
    nothing needs to change.";

const SYNTAX: &str = "The file does not follow nginx.conf's grammar (vigil's parser is a \
    port of nginx's own and uses its messages, so nginx -t rejects the file the same way). \
    Fix the file at the position shown; an unexpected \"}\" or end of file usually means a \
    missing \";\" or brace just before it.";

const UNREADABLE: &str = "The file, or a file named by `include`, could not be read: check \
    the path (relative includes resolve against the directory of the main file, as nginx \
    resolves them against its configuration prefix) and the permissions.";

const INVALID: &str = "vigil cannot use this setting: the message says what was found and \
    what was expected. Nothing is started on a configuration with an error, as with nginx -t.";
