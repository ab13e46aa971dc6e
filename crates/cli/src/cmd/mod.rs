//! One module per subcommand, each with its `Args` and `run`.

pub(crate) mod check;
pub(crate) mod convert;
pub(crate) mod demo;
pub(crate) mod events;
pub(crate) mod explain;
pub(crate) mod lint;
pub(crate) mod peer;
pub(crate) mod serve;
pub(crate) mod status;

/// Logs to stderr: human-readable by default, JSON with `VIGIL_LOG_FORMAT=json`;
/// the level from `VIGIL_LOG` (default `info`).
pub(crate) fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("VIGIL_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let json = std::env::var("VIGIL_LOG_FORMAT").is_ok_and(|v| v == "json");
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
