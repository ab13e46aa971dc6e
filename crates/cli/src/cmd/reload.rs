//! `vigil reload`: ask a running `vigil serve` or `vigil check` to reload
//! its configuration (what SIGHUP does), through the admin API.

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;

use http::{Method, StatusCode};

use crate::client;

/// Arguments of `vigil reload`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 reloaded, 1 the reload failed (the running configuration is kept) or was refused, 2 the admin API could not be reached.\n\nExamples:\n  VIGIL_ADMIN_TOKEN=secret vigil reload\n  vigil reload --admin 127.0.0.1:9901 --token secret"
)]
pub(crate) struct Args {
    /// Admin API address.
    #[arg(long, default_value = client::DEFAULT_ADMIN)]
    admin: SocketAddr,
    /// Bearer token of the admin API.
    #[arg(long, env = "VIGIL_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (status, body) = rt.block_on(client::call(
        args.admin,
        Method::POST,
        "/api/reload",
        args.token.as_deref(),
    ))?;
    let (ok, text) = outcome(status, &body);
    if ok {
        writeln!(std::io::stdout(), "{text}")?;
        Ok(ExitCode::SUCCESS)
    } else {
        let _ = writeln!(std::io::stderr(), "vigil: {text}");
        Ok(ExitCode::from(1))
    }
}

/// What the admin API's answer means, as one line.
fn outcome(status: StatusCode, body: &serde_json::Value) -> (bool, String) {
    let error = body["error"].as_str().unwrap_or("no error text");
    match status {
        StatusCode::OK => match body["generation"].as_u64() {
            Some(g) => (true, format!("reloaded: generation {g}")),
            None => (true, "reloaded".into()),
        },
        StatusCode::UNPROCESSABLE_ENTITY => (
            false,
            format!("reload failed; the running configuration is kept: {error}"),
        ),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => (
            false,
            format!("reload refused ({status}): {error}; pass the admin token with --token or VIGIL_ADMIN_TOKEN"),
        ),
        _ => (false, format!("reload not done ({status}): {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_answer_of_the_admin_api_reads_as_one_line() {
        let ok = outcome(
            StatusCode::OK,
            &serde_json::json!({"ok": true, "generation": 4}),
        );
        assert_eq!(ok, (true, "reloaded: generation 4".to_string()));
        let failed = outcome(
            StatusCode::UNPROCESSABLE_ENTITY,
            &serde_json::json!({"error": "/etc/nginx/nginx.conf:12:5: unknown directive \"proxy_pas\""}),
        );
        assert_eq!(
            failed,
            (
                false,
                "reload failed; the running configuration is kept: /etc/nginx/nginx.conf:12:5: unknown directive \"proxy_pas\"".to_string()
            )
        );
        let refused = outcome(
            StatusCode::UNAUTHORIZED,
            &serde_json::json!({"error": "a valid bearer token is required"}),
        );
        assert!(
            !refused.0 && refused.1.contains("VIGIL_ADMIN_TOKEN"),
            "{refused:?}"
        );
        let cannot = outcome(
            StatusCode::NOT_IMPLEMENTED,
            &serde_json::json!({"error": "this process cannot reload"}),
        );
        assert!(
            !cannot.0 && cannot.1.contains("cannot reload"),
            "{cannot:?}"
        );
    }
}
