//! `vigil lint`: the traps of a configuration, explained.
//!
//! [`lint_config`] looks at a loaded [`Config`] for settings that nginx
//! accepts but that do not do what operators expect (the field notes in
//! `shared/seeds/` and `docs/lint.md`); [`lint_error`] turns a
//! configuration that cannot be loaded at all into the same kind of
//! [`Finding`], with the trap behind the error explained where it is a
//! known one. Each finding has a stable `code`; `docs/lint.md` documents
//! every code, its rule and the nginx behaviour behind it.
//!
//! The model keeps values, not whether they were written: a parameter
//! "set" means "different from nginx's default" (see
//! `max-fails-single-server`).

mod error;
mod latency;
mod location;
mod rules;
mod traffic;
mod upstream;

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, Origin, SourcePos};

pub use error::lint_error;

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The configuration cannot work (it is rejected, or every request fails).
    Error,
    /// nginx accepts it, but it does not do what it seems to do.
    Warning,
    /// Worth knowing: a trade-off or a difference between nginx and vigil.
    Info,
}

/// One trap found in a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Stable identifier, e.g. `fail-timeout-vs-read-timeout` (see [`CODES`]).
    pub code: &'static str,
    /// How bad it is.
    pub severity: Severity,
    /// `file:line:col` of the setting at fault, or `""` when unknown.
    pub at: String,
    /// One line: what is wrong here, with the numbers.
    pub title: String,
    /// One paragraph: what nginx does, why it bites, what to do.
    pub explanation: String,
}

/// Every code [`lint_config`] and [`lint_error`] can produce, with its
/// severity, in the order of `docs/lint.md`.
pub const CODES: &[(&str, Severity)] = &[
    (location::FAIL_TIMEOUT_VS_READ_TIMEOUT, Severity::Warning),
    (upstream::MAX_FAILS_SINGLE_SERVER, Severity::Warning),
    (location::NEXT_UPSTREAM_4XX, Severity::Warning),
    (location::NEXT_UPSTREAM_NON_IDEMPOTENT, Severity::Warning),
    (location::RETRIES_UNBOUNDED, Severity::Warning),
    (traffic::RETRY_BUDGET_ZERO, Severity::Warning),
    (traffic::HEDGE_SINGLE_SERVER, Severity::Warning),
    (traffic::HEDGE_NEVER_SENT, Severity::Warning),
    (traffic::HEDGE_WITHOUT_BUDGET, Severity::Info),
    (location::NO_BUFFERING_WITH_RETRIES, Severity::Info),
    (upstream::KEEPALIVE_IS_NOT_A_CAP, Severity::Info),
    (location::PROXY_HTTP_10_KEEPALIVE, Severity::Info),
    (upstream::DEFAULT_DOWN_LONG_INTERVAL, Severity::Warning),
    (upstream::ALL_SERVERS_DOWN, Severity::Error),
    (error::BACKUP_WITH_HASH, Severity::Error),
    (error::CHECK_TIMEOUT_GE_INTERVAL, Severity::Error),
    (error::UNSUPPORTED_DIRECTIVE, Severity::Error),
    (error::SYNTAX_ERROR, Severity::Error),
    (error::CONFIG_UNREADABLE, Severity::Error),
    (error::CONFIG_ERROR, Severity::Error),
    (rules::PENALTY_MAX_BELOW_BASE, Severity::Warning),
    (rules::MAX_EJECTED_ZERO, Severity::Warning),
    (rules::MAX_EJECTED_ALL, Severity::Info),
    (rules::MAX_EJECTED_WITH_BACKUP, Severity::Info),
    (rules::LAST_TRY_NOTHING_LISTED, Severity::Warning),
    (error::PROBE_RECOVERY_WITHOUT_CHECK, Severity::Error),
    (error::SLOW_START_WITH_HASH, Severity::Error),
    (latency::EJECT_SLOW_FEW_PEERS, Severity::Warning),
    (latency::EJECT_SLOW_TWO_PEERS, Severity::Info),
    (latency::EJECT_STUCK_NEVER, Severity::Warning),
    (latency::EJECT_STUCK_LONG_POLL, Severity::Info),
];

/// The traps of a loaded configuration, sorted by position (file, line,
/// column; findings without a position last), then by code.
pub fn lint_config(config: &Config) -> Vec<Finding> {
    let mut found = Vec::new();
    for up in &config.upstreams {
        upstream::lint(up, &mut found);
    }
    for up in &config.upstreams {
        location::lint_upstream(config, up, &mut found);
        traffic::lint(config, up, &mut found);
        rules::lint(config, up, &mut found);
        latency::lint(config, up, &mut found);
    }
    for block in &config.servers {
        for loc in &block.locations {
            location::lint(config, loc, &mut found);
        }
    }
    found.sort_by(|a, b| {
        cmp_pos(a.pos.as_deref(), b.pos.as_deref()).then_with(|| a.finding.code.cmp(b.finding.code))
    });
    found.into_iter().map(|p| p.finding).collect()
}

/// A finding with its sort key, before sorting.
struct Positioned {
    pos: Option<Arc<SourcePos>>,
    finding: Finding,
}

/// Build a finding at `origin`.
fn finding(
    code: &'static str,
    severity: Severity,
    origin: &Origin,
    title: String,
    explanation: String,
) -> Positioned {
    Positioned {
        pos: origin.0.clone(),
        finding: Finding {
            code,
            severity,
            at: origin
                .0
                .as_ref()
                .map(|_| origin.to_string())
                .unwrap_or_default(),
            title,
            explanation,
        },
    }
}

fn cmp_pos(a: Option<&SourcePos>, b: Option<&SourcePos>) -> Ordering {
    match (a, b) {
        (Some(a), Some(b)) => (&a.file, a.line, a.col).cmp(&(&b.file, b.line, b.col)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// `d × n`, saturating instead of panicking on absurd configured values.
fn times(d: Duration, n: u32) -> Duration {
    d.checked_mul(n).unwrap_or(Duration::MAX)
}

/// A duration as nginx.conf writes it.
fn t(d: Duration) -> String {
    crate::config::value::format_time(d)
}

// === impl Severity ===

impl Severity {
    /// The lowercase word (`error`, `warning`, `info`).
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl Finding ===

impl fmt::Display for Finding {
    /// `at: severity[code]: title` (the position is left out when unknown).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.at.is_empty() {
            write!(f, "{}: ", self.at)?;
        }
        write!(f, "{}[{}]: {}", self.severity, self.code, self.title)
    }
}
