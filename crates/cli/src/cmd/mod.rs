//! One module per subcommand, each with its `Args` and `run`.

pub(crate) mod check;
pub(crate) mod convert;
pub(crate) mod demo;
pub(crate) mod events;
pub(crate) mod explain;
pub(crate) mod lint;
pub(crate) mod peer;
pub(crate) mod reload;
pub(crate) mod serve;
pub(crate) mod status;

/// Logs to stderr: human-readable by default, JSON with `VIGIL_LOG_FORMAT=json`;
/// the level from `VIGIL_LOG` (default `info`).
pub(crate) fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("VIGIL_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only on a terminal (and not with NO_COLOR): log files stay plain.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let json = std::env::var("VIGIL_LOG_FORMAT").is_ok_and(|v| v == "json");
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// A duration argument in nginx's notation (`500ms`, `10s`, `1m30s`).
pub(crate) fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    vigil_core::config::value::parse_time(s).map_err(|e| e.to_string())
}

/// Shutdown and reload signals, as one stream.
pub(crate) struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

/// What a signal asks for.
pub(crate) enum SignalAction {
    /// SIGHUP.
    Reload,
    /// SIGTERM, SIGQUIT or SIGINT.
    Stop,
}

impl Signals {
    /// Install the handlers.
    pub(crate) fn install() -> anyhow::Result<Self> {
        use anyhow::Context;
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            hup: signal(SignalKind::hangup()).context("installing SIGHUP handler")?,
            term: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            quit: signal(SignalKind::quit()).context("installing SIGQUIT handler")?,
            int: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
        })
    }

    /// The next signal.
    pub(crate) async fn next(&mut self) -> SignalAction {
        tokio::select! {
            _ = self.hup.recv() => SignalAction::Reload,
            _ = self.term.recv() => SignalAction::Stop,
            _ = self.quit.recv() => SignalAction::Stop,
            _ = self.int.recv() => SignalAction::Stop,
        }
    }
}
