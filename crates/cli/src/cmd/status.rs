//! `vigil status`: a table per upstream from the admin API.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use vigil_core::api::{NginxSyncView, PeerView, StatusDoc};

use crate::client;

/// Arguments of `vigil status`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 shown, 2 the admin API could not be reached.\n\nExamples:\n  vigil status\n  vigil status --watch\n  vigil status --json | jq '.upstreams[].peers[] | select(.state != \"eligible\")'"
)]
pub(crate) struct Args {
    /// Admin API address.
    #[arg(long, default_value = client::DEFAULT_ADMIN)]
    admin: SocketAddr,
    /// Print the API's JSON unchanged.
    #[arg(long)]
    json: bool,
    /// Refresh every second, in place, until Ctrl-C.
    #[arg(long)]
    watch: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        loop {
            let v = client::get(args.admin, "/api/status").await?;
            let mut out = std::io::stdout().lock();
            if args.json {
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                let doc: StatusDoc = serde_json::from_value(v)?;
                let colour =
                    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
                if args.watch {
                    write!(out, "\x1b[H\x1b[2J")?;
                }
                write!(out, "{}", render(&doc, colour))?;
            }
            out.flush()?;
            if !args.watch {
                return Ok(ExitCode::SUCCESS);
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            }
        }
    })
}

/// The tables.
pub(crate) fn render(doc: &StatusDoc, colour: bool) -> String {
    let mut s = format!(
        "generation {}  at {} UTC\n",
        doc.generation,
        client::clock(doc.now_unix_ms)
    );
    if let Some(n) = &doc.nginx {
        s.push_str(&nginx_line(n, colour));
    }
    for u in &doc.upstreams {
        let check = u
            .check
            .as_ref()
            .map(|c| {
                format!(
                    ", check {} every {} ms (rise {} fall {})",
                    c.kind, c.interval_ms, c.rise, c.fall
                )
            })
            .unwrap_or_default();
        s.push_str(&format!(
            "\nupstream {} ({}{}{})\n",
            u.name,
            u.balancer,
            if u.single { ", single" } else { "" },
            check
        ));
        // `vigil check`: vigil sees no traffic (nginx routes it), so no
        // CONNS or FAILS; instead what nginx was given.
        let checker = doc.nginx.is_some() || u.peers.iter().any(|p| p.nginx.is_some());
        if checker {
            s.push_str(&format!(
                "  {:<24} {:<11} {:>6} {:<34} {:<8} IN NGINX\n",
                "PEER", "STATE", "WEIGHT", "LAST PROBE", "SINCE",
            ));
        } else {
            s.push_str(&format!(
                "  {:<24} {:<11} {:>6} {:>5} {:>7} {:<34} SINCE\n",
                "PEER", "STATE", "WEIGHT", "CONNS", "FAILS", "LAST PROBE",
            ));
        }
        for p in &u.peers {
            s.push_str(&row(p, colour, checker));
        }
    }
    s
}

/// `vigil check`: the line above the tables: whether nginx runs what vigil
/// rendered, and a failed reload or a rejected render with its error.
fn nginx_line(n: &NginxSyncView, colour: bool) -> String {
    let at = |ms: Option<u64>| {
        ms.map(|m| format!(" at {}", client::clock(m)))
            .unwrap_or_default()
    };
    let error = n
        .last_error
        .as_deref()
        .map(|e| format!(": {}", e.split_whitespace().collect::<Vec<_>>().join(" ")))
        .unwrap_or_default();
    let (bad, text) = if n.render_rejected {
        (
            true,
            format!(
                "nginx: RENDER REJECTED by the test command; the previous files were restored, nginx was not reloaded{error}"
            ),
        )
    } else if n.reload_failed {
        (
            true,
            format!(
                "nginx: RELOAD FAILED{} ({} failed so far); nginx runs the files of its last good reload{}, retried with backoff{error}",
                at(n.last_failure_unix_ms),
                n.reload_failures,
                match n.last_reload_unix_ms {
                    Some(m) => format!(" ({})", client::clock(m)),
                    None => " (none since vigil started)".into(),
                }
            ),
        )
    } else if n.reload_pending {
        (
            false,
            format!(
                "nginx: a reload is pending; nginx runs the files of its last reload{}",
                at(n.last_reload_unix_ms)
            ),
        )
    } else {
        (
            false,
            format!(
                "nginx: runs the rendered files ({} reload(s), the last{})",
                n.reloads,
                at(n.last_reload_unix_ms)
            ),
        )
    };
    if bad && colour {
        format!("\x1b[31m{text}\x1b[0m\n")
    } else {
        format!("{text}\n")
    }
}

/// `vigil check`: what nginx was given for the server (`down`, `kept`
/// (failing, kept up by the guard: gets traffic), `as written`), and what
/// vigil decided when nginx does not run it yet.
fn in_nginx(p: &PeerView) -> String {
    use vigil_core::api::NginxGiven;
    let Some(n) = &p.nginx else {
        return String::new();
    };
    let word = |g: Option<NginxGiven>| match g {
        Some(NginxGiven::Down) => "down",
        Some(NginxGiven::Kept) => "kept (failing, gets traffic)",
        Some(NginxGiven::AsWritten) => "as written",
        None => "not reloaded yet",
    };
    match &n.pending {
        None => word(n.given).to_string(),
        Some(why) => format!(
            "{}; decided: {} ({})",
            word(n.given),
            word(Some(n.decided)),
            why.replace('_', " ")
        ),
    }
}

fn row(p: &PeerView, colour: bool, checker: bool) -> String {
    let state = if p.backup && p.state == "eligible" {
        "backup".to_string()
    } else {
        p.state.clone()
    };
    let painted = if colour {
        let code = match p.state.as_str() {
            "eligible" => "32",
            "draining" | "full" => "33",
            _ => "31",
        };
        format!("\x1b[{code}m{state:<11}\x1b[0m")
    } else {
        format!("{state:<11}")
    };
    let probe = p
        .active
        .as_ref()
        .and_then(|a| a.last_probe.as_ref())
        .map(|pr| {
            let t = format!(
                "{} {:.0}ms {}",
                if pr.ok { "ok" } else { "FAIL" },
                pr.latency_ms,
                pr.detail
            );
            t.chars().take(34).collect::<String>()
        })
        .unwrap_or_else(|| "-".into());
    let since = p
        .reasons
        .first()
        .and_then(|r| r.since_unix_ms)
        .or_else(|| p.active.as_ref().and_then(|a| a.since_unix_ms))
        .map(client::clock)
        .unwrap_or_else(|| "-".into());
    let fails = if p.max_fails == 0 {
        format!("{}/-", p.fails)
    } else {
        format!("{}/{}", p.fails, p.max_fails)
    };
    if checker {
        return format!(
            "  {:<24} {} {:>6} {:<34} {since:<8} {}\n",
            p.address,
            painted,
            p.weight,
            probe,
            in_nginx(p)
        );
    }
    format!(
        "  {:<24} {} {:>6} {:>5} {:>7} {:<34} {}\n",
        p.address, painted, p.weight, p.conns, fails, probe, since
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(nginx: Option<serde_json::Value>) -> StatusDoc {
        let mut v = serde_json::json!({
            "generation": 1, "now_unix_ms": 0,
            "upstreams": [{
                "name": "app", "balancer": "round_robin", "single": false, "check": null,
                "peers": [{
                    "address": "10.0.0.1:80", "backup": false, "state": "eligible", "weight": 1,
                    "effective_weight": 1, "conns": 7, "max_conns": 0, "fails": 3, "max_fails": 1,
                    "fail_timeout_ms": 10000, "last_failure_unix_ms": null, "admin": "up",
                    "active": null, "reasons": [],
                }],
            }],
        });
        if let Some(n) = nginx {
            v["nginx"] = n;
        }
        serde_json::from_value(v).expect("a status document")
    }

    #[test]
    fn check_mode_hides_what_vigil_cannot_see_and_shows_a_failed_reload() {
        // vigil serve: CONNS and FAILS, no nginx line.
        let serve = render(&doc(None), false);
        assert!(serve.contains("CONNS"), "{serve}");
        assert!(serve.contains("FAILS"), "{serve}");
        assert!(serve.contains("3/1"), "{serve}");
        assert!(!serve.contains("nginx:"), "{serve}");
        // vigil check: neither column, and the reload failure above the table.
        let failed = serde_json::json!({
            "reloads": 1, "reload_failures": 2, "renders_rejected": 0,
            "reload_pending": true, "reload_failed": true, "render_rejected": false,
            "last_error": "nginx master 7 did not replace its worker processes\nwithin 10s",
            "last_reload_unix_ms": 3_600_000, "last_failure_unix_ms": 3_661_000,
        });
        let check = render(&doc(Some(failed)), false);
        assert!(!check.contains("CONNS"), "{check}");
        assert!(!check.contains("FAILS"), "{check}");
        assert!(!check.contains("3/1"), "{check}");
        assert!(check.contains("IN NGINX"), "{check}");
        let lines: Vec<&str> = check.lines().collect();
        assert_eq!(
            lines[1],
            "nginx: RELOAD FAILED at 01:01:01 (2 failed so far); nginx runs the files of its last good reload (01:00:00), retried with backoff: nginx master 7 did not replace its worker processes within 10s"
        );
        assert!(lines[2..].iter().all(|l| !l.starts_with("nginx:")));
        // Healthy: one line that says nginx runs the files.
        let ok = serde_json::json!({
            "reloads": 3, "reload_failures": 0, "renders_rejected": 0,
            "reload_pending": false, "reload_failed": false, "render_rejected": false,
            "last_error": null, "last_reload_unix_ms": 3_600_000, "last_failure_unix_ms": null,
        });
        let check = render(&doc(Some(ok)), false);
        assert_eq!(
            check.lines().nth(1),
            Some("nginx: runs the rendered files (3 reload(s), the last at 01:00:00)")
        );
    }
}
