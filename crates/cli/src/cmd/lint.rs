//! `vigil lint`: the traps in a configuration, explained.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use vigil_core::lint::{lint_config, lint_error, Finding, Severity};

use crate::load::{self, Kind};

/// Arguments of `vigil lint`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 clean, 1 findings, 2 unreadable.\n\nExamples:\n  vigil lint /etc/nginx/nginx.conf\n  vigil lint vigil.toml"
)]
pub(crate) struct Args {
    /// nginx.conf, or a vigil .toml file.
    path: PathBuf,
    /// Print findings as JSON lines.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let kind = Kind::of(&args.path);
    let findings: Vec<Finding> = match load::load(&args.path, kind) {
        Ok(l) => {
            let mut f = lint_config(&l.config);
            for (name, at) in &l.ignored {
                f.push(Finding {
                    code: "ignored-directive",
                    severity: Severity::Info,
                    at: at.clone(),
                    title: format!("\"{name}\" has no meaning for vigil and is ignored"),
                    explanation: "vigil accepts directives that only configure nginx's own process (workers, pid, temp paths, logging) and reports each once. They do not change how vigil routes, retries or checks.".into(),
                });
            }
            f
        }
        Err(e @ vigil_core::config::ConfigError::Io { .. }) => {
            eprintln!("vigil: error: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => vec![lint_error(&e)],
    };
    let mut out = std::io::stdout().lock();
    for f in &findings {
        if args.json {
            let v = serde_json::json!({
                "code": f.code, "severity": f.severity.to_string(), "at": f.at,
                "title": f.title, "explanation": f.explanation,
            });
            writeln!(out, "{v}")?;
        } else {
            let at = if f.at.is_empty() {
                args.path.display().to_string()
            } else {
                f.at.clone()
            };
            writeln!(
                out,
                "{at}: {}[{}]: {}\n    {}\n",
                f.severity, f.code, f.title, f.explanation
            )?;
        }
    }
    let counted = findings
        .iter()
        .filter(|f| f.severity != Severity::Info)
        .count();
    if !args.json {
        writeln!(
            out,
            "{} finding(s), {} informational",
            counted,
            findings.len() - counted
        )?;
    }
    Ok(if counted == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
