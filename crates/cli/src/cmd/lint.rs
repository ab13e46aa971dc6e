//! `vigil lint`: the traps in a configuration, explained, and what
//! `vigil serve` could not serve, in one run.
//!
//! An nginx.conf is loaded in the front end's lenient mode
//! ([`nginx::lenient_file`]): every refusal is a finding and the traps of
//! everything else are found ([`lint_loaded`]). Then the checks `vigil
//! serve` makes when it compiles its routes ([`serve_checks`]: variables
//! and header names with the proxy's own parser, server names and
//! default servers with its router, the TLS settings of `https://`
//! upstreams), so that a file that lints clean `--for serve` starts.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use vigil_config::lint::{
    lint_config, lint_error, lint_loaded, Finding, Severity, IGNORED_DIRECTIVE,
    UNSUPPORTED_VARIABLE, UNSUPPORTED_VARIABLE_TEXT,
};
use vigil_config::nginx::{self, Loaded};
use vigil_config::{system_resolver, ConfigError};

use crate::load::Kind;

/// Who the report is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Audience {
    /// The file keeps running on nginx: what `vigil serve` refuses is
    /// nginx's own business, listed apart as info and not counted.
    Nginx,
    /// The file is for `vigil serve`: what it refuses is an error.
    Serve,
}

/// Arguments of `vigil lint`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Every finding is reported in one run: the traps of the file under nginx, and, \
listed apart, each directive `vigil serve` would refuse.

Audiences (--for):
  nginx  (default) the file keeps running on nginx; serve's refusals are info
         and do not change the exit code (--hide-refusals leaves them out)
  serve  the file is for `vigil serve`; each refusal is an error, so a file
         that lints clean starts under `vigil serve`

Exit codes:
  0  no error or warning (info findings only, or none)
  1  at least one error or warning
  2  the file (or a file it includes) cannot be read

Examples:
  vigil lint /etc/nginx/nginx.conf
  vigil lint --for serve --short nginx.conf
  vigil lint --json vigil.toml")]
pub(crate) struct Args {
    /// nginx.conf, or a vigil .toml file.
    path: PathBuf,
    /// Who the report is for.
    #[arg(long = "for", value_enum, default_value_t = Audience::Nginx)]
    audience: Audience,
    /// One line per finding: `file:line:col: severity[code]: message`.
    #[arg(long, conflicts_with = "json")]
    short: bool,
    /// Print findings as JSON lines (one object per finding).
    #[arg(long)]
    json: bool,
    /// With --for nginx, leave out what `vigil serve` would refuse or ignore.
    #[arg(long)]
    hide_refusals: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let findings = match collect(&args.path, Kind::of(&args.path)) {
        Ok(f) => f,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "vigil: error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let findings = for_audience(findings, args.audience, args.hide_refusals);
    let mut out = std::io::stdout().lock();
    let file = args.path.display().to_string();
    if args.json {
        for f in &findings {
            let v = serde_json::json!({
                "code": f.code, "severity": f.severity.to_string(), "at": f.at,
                "title": f.title, "explanation": f.explanation,
                "serve_only": f.serve_only,
            });
            writeln!(out, "{v}")?;
        }
    } else if args.short {
        for f in &findings {
            writeln!(out, "{}", short_line(f, &file))?;
        }
    } else {
        write!(out, "{}", long_report(&findings, &file, args.audience))?;
    }
    Ok(exit_code(&findings))
}

/// 1 when an error or a warning is left, else 0.
fn exit_code(findings: &[Finding]) -> ExitCode {
    if findings.iter().any(|f| f.severity != Severity::Info) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Everything about `path`, before the audience is applied; an error only
/// when the file, or a file it includes, cannot be read.
fn collect(path: &Path, kind: Kind) -> Result<Vec<Finding>, ConfigError> {
    match kind {
        Kind::Nginx => match nginx::lenient_file(path, &system_resolver) {
            Ok(loaded) => Ok(lint_nginx(&loaded)),
            Err(e) if unreadable(&e) => Err(e),
            Err(e) => Ok(vec![lint_error(&e)]),
        },
        Kind::Toml => match vigil_config::toml::load_file(path, &system_resolver) {
            Ok(config) => Ok(lint_config(&config)),
            Err(e) if unreadable(&e) => Err(e),
            Err(e) => Ok(vec![lint_error(&e)]),
        },
    }
}

fn unreadable(e: &ConfigError) -> bool {
    matches!(
        e,
        ConfigError::Io { .. } | ConfigError::Syntax(nginx::syntax::SyntaxError::Io { .. })
    )
}

/// The findings of a lenient load and of serve's own startup checks.
fn lint_nginx(loaded: &Loaded) -> Vec<Finding> {
    let mut found = lint_loaded(loaded);
    found.extend(serve_checks(loaded));
    sort(&mut found);
    found
}

/// What `vigil serve` refuses after the front end, when it compiles its
/// routes (`vigil_proxy::route`): a variable or header name it does not
/// know in `proxy_set_header`, `add_header` or the `hash` key of a
/// location that proxies; its router's checks (server names, default
/// servers); the TLS settings of an `https://` proxy_pass. Each at the
/// directive or argument at fault, once.
fn serve_checks(loaded: &Loaded) -> Vec<Finding> {
    use vigil_proxy::vars::Template;
    let config = &loaded.config;
    let mut found = Vec::new();
    let mut seen = BTreeSet::new();
    let mut refuse = |found: &mut Vec<Finding>, at: String, title: String| {
        if seen.insert((at.clone(), title.clone())) {
            found.push(Finding {
                code: UNSUPPORTED_VARIABLE,
                severity: Severity::Error,
                at,
                title,
                explanation: UNSUPPORTED_VARIABLE_TEXT.to_string(),
                serve_only: true,
            });
        }
    };
    let mut hashed = BTreeSet::new();
    // Maps, `set` names and named captures are variables too.
    let scope = vigil_proxy::route::scope_of(config).unwrap_or_default();
    for e in vigil_proxy::route::variable_errors(config) {
        refuse(
            &mut found,
            e.at,
            format!("{} (vigil serve does not implement it)", e.message),
        );
    }
    for (si, li, placed) in loaded.sources.locations() {
        let Some(loc) = config.servers.get(si).and_then(|s| s.locations.get(li)) else {
            continue;
        };
        let Some(pass) = &loc.proxy.pass else {
            continue;
        };
        hashed.insert(pass.upstream.clone());
        for name in ["proxy_set_header", "add_header"] {
            for d in placed.all(name) {
                let (Some(h), Some(v)) = (d.args.first(), d.args.get(1)) else {
                    continue;
                };
                if http::HeaderName::from_bytes(h.value.as_bytes()).is_err() {
                    refuse(
                        &mut found,
                        h.span.to_string(),
                        format!("invalid header name \"{}\" in \"{name}\"", h.value),
                    );
                }
                if name == "proxy_set_header" && v.value.is_empty() {
                    continue;
                }
                if let Err(e) = Template::parse_with(&v.value, &scope) {
                    refuse(
                        &mut found,
                        v.span.to_string(),
                        format!("{e} in \"{name}\" (vigil serve does not implement it)"),
                    );
                }
            }
        }
        if pass.tls {
            let tls = vigil_proxy::connect::TlsSettings::new(
                loc.proxy.ssl_verify,
                loc.proxy.ssl_trusted_certificate.as_deref(),
                loc.proxy.ssl_server_name,
            );
            if let Err(e) = tls {
                let at = placed
                    .get("proxy_ssl_trusted_certificate")
                    .or_else(|| placed.get("proxy_pass"))
                    .map_or_else(|| loc.origin.to_string(), |d| d.span.to_string());
                found.push(config_error(at, format!("TLS settings: {e}")));
            }
        }
    }
    for up in config.upstreams.iter().filter(|u| hashed.contains(&u.name)) {
        let vigil_core::config::Balancer::Hash { key, .. } = &up.balancer else {
            continue;
        };
        if let Err(e) = Template::parse_with(key, &scope) {
            let at = loaded
                .sources
                .upstream(&up.name)
                .and_then(|p| p.get("hash"))
                .and_then(|d| d.args.first())
                .map_or_else(|| up.origin.to_string(), |a| a.span.to_string());
            refuse(
                &mut found,
                at,
                format!("hash key: {e} (vigil serve does not implement it)"),
            );
        }
    }
    if let Err(e) = vigil_proxy::route::Router::build(config) {
        found.push(config_error(e.at, e.message));
    }
    if let Err(e) = vigil_proxy::route::certificate_errors(config) {
        found.push(config_error(e.at, e.message));
    }
    for e in vigil_proxy::route::error_page_errors(config) {
        found.push(config_error(e.at, e.message));
    }
    found
}

/// A refusal that nginx would make too (`config-error`).
fn config_error(at: String, message: String) -> Finding {
    lint_error(&ConfigError::Invalid { at, message })
}

/// By position (`file:line:col`, numerically), then code.
fn sort(found: &mut [Finding]) {
    fn key(f: &Finding) -> (String, u64, u64, &'static str) {
        let mut it = f.at.rsplitn(3, ':');
        let col = it.next().and_then(|c| c.parse().ok());
        let line = it.next().and_then(|l| l.parse().ok());
        match (line, col, it.next()) {
            (Some(line), Some(col), Some(file)) => (file.to_string(), line, col, f.code),
            _ => (f.at.clone(), u64::MAX, u64::MAX, f.code),
        }
    }
    found.sort_by(|a, b| key(a).cmp(&key(b)));
}

/// Serve's refusals as the audience sees them: errors `--for serve`;
/// info (or left out) `--for nginx`. Ignored directives stay info.
fn for_audience(found: Vec<Finding>, audience: Audience, hide: bool) -> Vec<Finding> {
    found
        .into_iter()
        .filter(|f| !(f.serve_only && hide && audience == Audience::Nginx))
        .map(|mut f| {
            if f.serve_only && f.code != IGNORED_DIRECTIVE {
                f.severity = match audience {
                    Audience::Serve => Severity::Error,
                    Audience::Nginx => Severity::Info,
                };
            }
            f
        })
        .collect()
}

/// `file:line:col: severity[code]: title`.
fn short_line(f: &Finding, file: &str) -> String {
    let at = if f.at.is_empty() { file } else { &f.at };
    format!("{at}: {}[{}]: {}", f.severity, f.code, f.title)
}

/// The long report: the traps, then (apart) what `vigil serve` would
/// refuse and ignore. Findings with the same code and explanation are one
/// entry: the places, then the explanation once.
fn long_report(findings: &[Finding], file: &str, audience: Audience) -> String {
    let (mut serve, traps): (Vec<&Finding>, Vec<&Finding>) =
        findings.iter().partition(|f| f.serve_only);
    // Refusals first, then what serve ignores.
    serve.sort_by_key(|f| f.code == IGNORED_DIRECTIVE);
    let mut out = String::new();
    if traps.is_empty() {
        out.push_str("No trap found for nginx.\n\n");
    }
    group(&mut out, &traps, file);
    if !serve.is_empty() {
        let refused = serve.iter().filter(|f| f.code != IGNORED_DIRECTIVE).count();
        let ignored = serve.len() - refused;
        let verdict = match audience {
            Audience::Nginx => "nginx's own business here (--for serve makes them errors)",
            Audience::Serve => "errors for vigil serve",
        };
        out.push_str(&format!(
            "--- vigil serve: {refused} refusal(s), {ignored} ignored directive(s); {verdict}\n\n"
        ));
        group(&mut out, &serve, file);
    }
    let count = |s: Severity| findings.iter().filter(|f| f.severity == s).count();
    out.push_str(&format!(
        "{} error(s), {} warning(s), {} info\n",
        count(Severity::Error),
        count(Severity::Warning),
        count(Severity::Info)
    ));
    out
}

fn group(out: &mut String, findings: &[&Finding], file: &str) {
    let mut done = vec![false; findings.len()];
    for i in 0..findings.len() {
        if done[i] {
            continue;
        }
        let f = findings[i];
        let same: Vec<usize> = (i..findings.len())
            .filter(|&j| {
                !done[j]
                    && findings[j].code == f.code
                    && findings[j].severity == f.severity
                    && findings[j].explanation == f.explanation
            })
            .collect();
        if same.len() == 1 {
            out.push_str(&format!("{}\n", short_line(f, file)));
        } else {
            out.push_str(&format!(
                "{}[{}], {} places:\n",
                f.severity,
                f.code,
                same.len()
            ));
            for &j in &same {
                let g = findings[j];
                let at = if g.at.is_empty() { file } else { &g.at };
                out.push_str(&format!("  {at}: {}\n", g.title));
            }
        }
        for j in same {
            done[j] = true;
        }
        out.push_str(&format!("    {}\n\n", f.explanation));
    }
}

#[cfg(test)]
mod tests;
