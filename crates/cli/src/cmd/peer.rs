//! `vigil peer down|up|drain`: set a peer's admin state.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use crate::client;

/// Arguments of `vigil peer`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "The token comes from --token or VIGIL_ADMIN_TOKEN.\nExit codes: 0 changed, 1 refused by the API (token, unknown peer), 2 the admin API could not be reached.\n\nExamples:\n  vigil peer drain api 10.0.0.2:8080\n  vigil peer up api 10.0.0.2:8080"
)]
pub(crate) struct Args {
    /// `down` (no requests), `drain` (no new requests) or `up`.
    #[arg(value_parser = ["down", "up", "drain"])]
    action: String,
    /// The upstream.
    upstream: String,
    /// The peer's address as configured.
    peer: String,
    /// Bearer token of the admin API.
    #[arg(long, env = "VIGIL_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Admin API address.
    #[arg(long, default_value = client::DEFAULT_ADMIN)]
    admin: SocketAddr,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let path = format!(
            "/api/peers/{}/{}/{}",
            client::encode(&args.upstream),
            client::encode(&args.peer),
            args.action
        );
        let (status, v) =
            client::call(args.admin, http::Method::POST, &path, args.token.as_deref()).await?;
        if !status.is_success() {
            writeln!(
                std::io::stderr(),
                "vigil: {status}: {}",
                v["error"].as_str().unwrap_or("error")
            )?;
            return Ok(ExitCode::from(1));
        }
        writeln!(
            std::io::stdout(),
            "{} {}: {} -> {}",
            args.upstream,
            args.peer,
            v["from"].as_str().unwrap_or("?"),
            v["to"].as_str().unwrap_or("?")
        )?;
        Ok(ExitCode::SUCCESS)
    })
}
