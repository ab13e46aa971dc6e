//! `vigil status`: a table per upstream from the admin API.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use vigil_core::api::{PeerView, StatusDoc};

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
        let checker = u.peers.iter().any(|p| p.nginx.is_some());
        s.push_str(&format!(
            "  {:<24} {:<11} {:>6} {:>5} {:>7} {:<34} {}{}\n",
            "PEER",
            "STATE",
            "WEIGHT",
            "CONNS",
            "FAILS",
            "LAST PROBE",
            "SINCE",
            if checker { "    IN NGINX" } else { "" }
        ));
        for p in &u.peers {
            s.push_str(&row(p, colour, checker));
        }
    }
    s
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
    let since = if checker {
        format!("{since:<8} {}", in_nginx(p))
    } else {
        since
    };
    format!(
        "  {:<24} {} {:>6} {:>5} {:>7} {:<34} {}\n",
        p.address, painted, p.weight, p.conns, fails, probe, since
    )
}
