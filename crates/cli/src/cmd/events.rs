//! `vigil events`: the transition log.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use crate::client;

/// Arguments of `vigil events`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 done, 2 the admin API could not be reached.\n\nExamples:\n  vigil events\n  vigil events --follow --upstream api"
)]
pub(crate) struct Args {
    /// Keep printing new events until Ctrl-C.
    #[arg(long, short)]
    follow: bool,
    /// Only this upstream's events.
    #[arg(long)]
    upstream: Option<String>,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
    /// Admin API address.
    #[arg(long, default_value = client::DEFAULT_ADMIN)]
    admin: SocketAddr,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut since = 0u64;
        loop {
            let mut path = format!("/api/events?since={since}&limit=1000");
            if let Some(u) = &args.upstream {
                path.push_str(&format!("&upstream={}", client::encode(u)));
            }
            let v = client::get(args.admin, &path).await?;
            let mut out = std::io::stdout().lock();
            if v["missed"].as_u64().unwrap_or(0) > 0 {
                writeln!(
                    out,
                    "({} older events were dropped from the bounded log)",
                    v["missed"]
                )?;
            }
            for e in v["events"].as_array().into_iter().flatten() {
                if args.json {
                    writeln!(out, "{e}")?;
                } else {
                    writeln!(
                        out,
                        "{} #{:<5} {:<14} {:<22} {:<13} {}",
                        client::clock(e["at_unix_ms"].as_u64().unwrap_or(0)),
                        e["seq"],
                        e["upstream"].as_str().unwrap_or(""),
                        e["peer"].as_str().unwrap_or(""),
                        e["kind"].as_str().unwrap_or(""),
                        e["text"].as_str().unwrap_or("")
                    )?;
                }
            }
            out.flush()?;
            since = v["next"].as_u64().unwrap_or(since);
            if !args.follow {
                return Ok(ExitCode::SUCCESS);
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            }
        }
    })
}
