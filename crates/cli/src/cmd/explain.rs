//! `vigil explain`: why a peer does or does not get traffic.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use crate::client;

/// Arguments of `vigil explain`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 explained, 1 no such upstream or peer, 2 the admin API could not be reached.\n\nExamples:\n  vigil explain api\n  vigil explain api 10.0.0.2:8080"
)]
pub(crate) struct Args {
    /// The upstream.
    upstream: String,
    /// One peer (address as configured); all peers when left out.
    peer: Option<String>,
    /// Admin API address.
    #[arg(long, default_value = client::DEFAULT_ADMIN)]
    admin: SocketAddr,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut path = format!("/api/explain?upstream={}", client::encode(&args.upstream));
        if let Some(p) = &args.peer {
            path.push_str(&format!("&peer={}", client::encode(p)));
        }
        let (status, v) = client::call(args.admin, http::Method::GET, &path, None).await?;
        let mut out = std::io::stdout().lock();
        if !status.is_success() {
            writeln!(
                std::io::stderr(),
                "vigil: {}",
                v["error"].as_str().unwrap_or("error")
            )?;
            return Ok(ExitCode::from(1));
        }
        let rules: Vec<&str> = v["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str())
            .collect();
        if args.peer.is_none() && !rules.is_empty() {
            for s in rules {
                writeln!(out, "{s}")?;
            }
            writeln!(out)?;
        }
        for p in v["peers"].as_array().into_iter().flatten() {
            for s in p["sentences"].as_array().into_iter().flatten() {
                writeln!(out, "{}", s.as_str().unwrap_or_default())?;
            }
            writeln!(out)?;
        }
        Ok(ExitCode::SUCCESS)
    })
}
