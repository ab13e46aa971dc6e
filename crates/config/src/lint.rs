//! `vigil lint`: the traps of a configuration, explained.
//!
//! [`lint_loaded`] reads a lenient load of an nginx.conf
//! ([`crate::nginx::lenient_file`]) whole: every directive that
//! `vigil serve` refuses is its own finding (flagged
//! [`Finding::serve_only`] when it is vigil's limit rather than a mistake
//! nginx would reject too), and the traps of everything that was
//! understood are found whatever else the file holds. [`lint_config`]
//! looks at a loaded [`Config`] for settings that nginx accepts but that
//! do not do what operators expect (nginx's documentation and source are
//! cited in each explanation and in `docs/lint.md`); [`lint_error`] turns
//! one load error into the same kind of [`Finding`], with the trap behind
//! the error explained where it is a known one. Each finding has a stable
//! `code`; `docs/lint.md` documents every code, its rule and the nginx
//! behaviour behind it.
//!
//! The model keeps values, not whether they were written: a parameter
//! "set" means "different from nginx's default" (see
//! `max-fails-single-server`). Where the nginx front end recorded where a
//! setting was written ([`Sources`]), a finding points at the directive or
//! the parameter that causes it; otherwise at the block.

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

use crate::nginx::{Loaded, Placed, Sources};
use vigil_core::config::{Config, Location, Origin, SourcePos, UpstreamConfig};

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
    /// A limit of `vigil serve` (a directive it refuses or ignores), not a
    /// trap of the configuration under nginx: `vigil lint --for nginx`
    /// reports these as info, `--for serve` as errors.
    pub serve_only: bool,
}

/// Every code [`lint_loaded`], [`lint_config`] and [`lint_error`] can
/// produce, with the severities it can have, in the order of `docs/lint.md`.
/// A finding with [`Finding::serve_only`] set may be reported with another
/// severity, as the audience asks (`vigil lint --for`).
pub const CODES: &[(&str, &[Severity])] = &[
    (
        location::FAIL_TIMEOUT_VS_READ_TIMEOUT,
        &[Severity::Warning, Severity::Info],
    ),
    (upstream::MAX_FAILS_SINGLE_SERVER, &[Severity::Warning]),
    (location::NEXT_UPSTREAM_4XX, &[Severity::Warning]),
    (location::NEXT_UPSTREAM_NON_IDEMPOTENT, &[Severity::Warning]),
    (location::RETRIES_UNBOUNDED, &[Severity::Warning]),
    (traffic::RETRY_BUDGET_ZERO, &[Severity::Warning]),
    (traffic::HEDGE_SINGLE_SERVER, &[Severity::Warning]),
    (traffic::HEDGE_NEVER_SENT, &[Severity::Warning]),
    (traffic::HEDGE_WITHOUT_BUDGET, &[Severity::Info]),
    (location::NO_BUFFERING_WITH_RETRIES, &[Severity::Info]),
    (upstream::KEEPALIVE_IS_NOT_A_CAP, &[Severity::Info]),
    (location::PROXY_HTTP_10_KEEPALIVE, &[Severity::Info]),
    (location::INHERITED_HEADERS_DROPPED, &[Severity::Warning]),
    (upstream::DEFAULT_DOWN_LONG_INTERVAL, &[Severity::Warning]),
    (upstream::ALL_SERVERS_DOWN, &[Severity::Error]),
    (error::BACKUP_WITH_HASH, &[Severity::Error]),
    (error::CHECK_TIMEOUT_GE_INTERVAL, &[Severity::Error]),
    (error::UNSUPPORTED_DIRECTIVE, &[Severity::Error]),
    (error::UNSUPPORTED_VARIABLE, &[Severity::Error]),
    (error::NO_SERVER_BLOCK, &[Severity::Error]),
    (error::IGNORED_DIRECTIVE, &[Severity::Info]),
    (error::SYNTAX_ERROR, &[Severity::Error]),
    (error::CONFIG_UNREADABLE, &[Severity::Error]),
    (error::CONFIG_ERROR, &[Severity::Error]),
    (rules::PENALTY_MAX_BELOW_BASE, &[Severity::Warning]),
    (rules::MAX_EJECTED_ZERO, &[Severity::Warning]),
    (rules::MAX_EJECTED_ALL, &[Severity::Info]),
    (rules::MAX_EJECTED_WITH_BACKUP, &[Severity::Info]),
    (rules::LAST_TRY_NOTHING_LISTED, &[Severity::Warning]),
    (error::PROBE_RECOVERY_WITHOUT_CHECK, &[Severity::Error]),
    (error::SLOW_START_WITH_HASH, &[Severity::Error]),
    (latency::EJECT_SLOW_FEW_PEERS, &[Severity::Warning]),
    (latency::EJECT_SLOW_TWO_PEERS, &[Severity::Info]),
    (latency::EJECT_STUCK_NEVER, &[Severity::Warning]),
    (latency::EJECT_STUCK_LONG_POLL, &[Severity::Info]),
];

pub use error::{
    IGNORED_DIRECTIVE, NO_SERVER_BLOCK, UNSUPPORTED_DIRECTIVE, UNSUPPORTED_VARIABLE,
    UNSUPPORTED_VARIABLE_TEXT,
};

/// Everything about a lenient (or strict) load of an nginx.conf, in one
/// list sorted by position: each refusal (see [`lint_error`]), each trap
/// of the model ([`lint_config`], pointing at the directives recorded in
/// [`Loaded::sources`]), each directive accepted without effect
/// (`ignored-directive`, serve only), and `no-server-block` when there is
/// nothing for `vigil serve` to listen on. The variables and header names
/// of `proxy_set_header` and `add_header` are checked by `vigil lint`
/// itself, with the proxy's own parser.
pub fn lint_loaded(loaded: &Loaded) -> Vec<Finding> {
    let cx = Cx {
        config: &loaded.config,
        sources: Some(&loaded.sources),
    };
    let mut found = traps(&cx);
    location::lint_shadowed(&loaded.sources, &mut found);
    for e in &loaded.refusals {
        let f = lint_error(e);
        found.push(Positioned {
            pos: pos_of(&f.at),
            finding: f,
        });
    }
    for (name, span) in &loaded.ignored_at {
        found.push(finding(
            IGNORED_DIRECTIVE,
            Severity::Info,
            &vigil_core::config::Origin::at((*span.file).clone(), span.line, span.col),
            match name.as_str() {
                // Accepted, but only part of it is ignored.
                "access_log" => {
                    "the format of \"access_log\" is not one vigil serve writes: it logs in nginx's combined format".to_string()
                }
                "proxy_buffering" => {
                    "\"proxy_buffering\" is ignored: vigil serve streams responses (as proxy_buffering off)".to_string()
                }
                _ => format!("\"{name}\" has no meaning for vigil serve and is ignored"),
            },
            error::IGNORED.to_string(),
        ));
    }
    if loaded.config.servers.is_empty() {
        let first = loaded
            .config
            .upstreams
            .first()
            .map(|u| u.origin.clone())
            .unwrap_or_default();
        found.push(finding(
            NO_SERVER_BLOCK,
            Severity::Error,
            &first,
            "no server block: vigil serve has nothing to listen on".to_string(),
            error::NO_SERVER.to_string(),
        ));
    }
    for p in &mut found {
        p.finding.serve_only |= error::serve_only(p.finding.code);
    }
    sorted(found)
}

/// The traps of a loaded configuration, sorted by position (file, line,
/// column; findings without a position last), then by code. Positions are
/// those of the model (a location's settings at its `location` line); see
/// [`lint_loaded`] for findings at the directive.
pub fn lint_config(config: &Config) -> Vec<Finding> {
    sorted(traps(&Cx {
        config,
        sources: None,
    }))
}

fn traps(cx: &Cx<'_>) -> Vec<Positioned> {
    let config = cx.config;
    let mut found = Vec::new();
    for up in &config.upstreams {
        upstream::lint(cx, up, &mut found);
    }
    for up in &config.upstreams {
        location::lint_upstream(cx, up, &mut found);
        traffic::lint(config, up, &mut found);
        rules::lint(cx, up, &mut found);
        latency::lint(cx, up, &mut found);
    }
    for l in cx.locations() {
        location::lint(cx, &l, &mut found);
    }
    found
}

fn sorted(mut found: Vec<Positioned>) -> Vec<Finding> {
    found.sort_by(|a, b| {
        cmp_pos(a.pos.as_deref(), b.pos.as_deref()).then_with(|| a.finding.code.cmp(b.finding.code))
    });
    found.dedup_by(|a, b| a.finding == b.finding);
    found.into_iter().map(|p| p.finding).collect()
}

/// `file:line:col` back to a sort key (the file may contain `:`).
fn pos_of(at: &str) -> Option<Arc<SourcePos>> {
    let mut it = at.rsplitn(3, ':');
    let col = it.next()?.parse().ok()?;
    let line = it.next()?.parse().ok()?;
    let file = it.next()?;
    Some(Arc::new(SourcePos {
        file: file.into(),
        line,
        col,
    }))
}

/// What the rules look at: the model and, for an nginx.conf, where its
/// settings were written.
struct Cx<'a> {
    config: &'a Config,
    sources: Option<&'a Sources>,
}

/// One location of the model, with its indexes.
struct Loc<'a> {
    server: usize,
    index: usize,
    loc: &'a Location,
}

impl<'a> Cx<'a> {
    fn locations(&self) -> impl Iterator<Item = Loc<'a>> + 'a {
        self.config
            .servers
            .iter()
            .enumerate()
            .flat_map(|(server, b)| {
                b.locations
                    .iter()
                    .enumerate()
                    .map(move |(index, loc)| Loc { server, index, loc })
            })
    }

    /// The directive `name` in force in `l`, if it was written.
    fn directive(&self, l: &Loc<'_>, name: &str) -> Option<&'a Placed> {
        self.sources?.location(l.server, l.index)?.get(name)
    }

    /// Where the directive `name` in force in `l` is, else the location.
    fn at_directive(&self, l: &Loc<'_>, name: &str) -> Origin {
        self.directive(l, name)
            .map_or_else(|| l.loc.origin.clone(), Placed::origin)
    }

    /// Where `word` of the directive `name` in force in `l` is.
    fn at_word(&self, l: &Loc<'_>, name: &str, word: &str) -> Origin {
        self.directive(l, name)
            .map_or_else(|| l.loc.origin.clone(), |d| d.origin_of_word(word))
    }

    /// The `server` line of `up.servers[i]`, if it was written.
    fn server_line(&self, up: &UpstreamConfig, i: usize) -> Option<&'a Placed> {
        // A line whose name resolved to several addresses is several servers.
        let line = up
            .servers
            .get(..=i)?
            .iter()
            .filter(|s| s.addr_nth == 0)
            .count();
        self.sources?.server(&up.name, line.checked_sub(1)?)
    }

    /// The directive `name` of upstream block `up`, if written.
    fn upstream_directive(&self, up: &UpstreamConfig, name: &str) -> Option<&'a Placed> {
        self.sources?.upstream(&up.name)?.get(name)
    }

    /// Where `key=` of directive `name` of upstream `up` is, else `fallback`.
    fn at_upstream_param(
        &self,
        up: &UpstreamConfig,
        name: &str,
        key: &str,
        fallback: &Origin,
    ) -> Origin {
        self.upstream_directive(up, name)
            .and_then(|d| d.param(key))
            .map_or_else(|| fallback.clone(), |a| crate::nginx::origin(&a.span))
    }
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
            serve_only: false,
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
    vigil_core::config::value::format_time(d)
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
