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
    // A log that cannot be written (standard error a closed pipe, a full
    // disk) is not reported on standard error again: tracing-subscriber's
    // report of it would panic there.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .log_internal_errors(false);
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

/// nginx's signals, as one stream: HUP reload, USR1 reopen the logs, QUIT
/// graceful stop, TERM and INT fast stop; USR2 and WINCH (nginx's binary
/// upgrade) are caught so that they do not end the process, and refused.
pub(crate) struct Signals {
    hup: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
    winch: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

/// What a signal asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SignalAction {
    /// SIGHUP: read the configuration again.
    Reload,
    /// SIGUSR1: reopen the log files (logrotate).
    Reopen,
    /// SIGQUIT: graceful stop.
    Quit,
    /// SIGTERM: fast stop (nginx); `vigil serve --grace` makes it graceful.
    Terminate,
    /// SIGINT (Ctrl-C): fast stop.
    Interrupt,
    /// SIGUSR2 or SIGWINCH: nginx's binary upgrade, which vigil does not
    /// do (docs/operations.md says how to upgrade); logged, nothing else.
    Unsupported(&'static str),
}

impl Signals {
    /// Install the handlers.
    pub(crate) fn install() -> anyhow::Result<Self> {
        use anyhow::Context;
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            hup: signal(SignalKind::hangup()).context("installing SIGHUP handler")?,
            usr1: signal(SignalKind::user_defined1()).context("installing SIGUSR1 handler")?,
            usr2: signal(SignalKind::user_defined2()).context("installing SIGUSR2 handler")?,
            winch: signal(SignalKind::window_change()).context("installing SIGWINCH handler")?,
            term: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            quit: signal(SignalKind::quit()).context("installing SIGQUIT handler")?,
            int: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
        })
    }

    /// The next signal.
    pub(crate) async fn next(&mut self) -> SignalAction {
        tokio::select! {
            _ = self.hup.recv() => SignalAction::Reload,
            _ = self.usr1.recv() => SignalAction::Reopen,
            _ = self.term.recv() => SignalAction::Terminate,
            _ = self.quit.recv() => SignalAction::Quit,
            _ = self.int.recv() => SignalAction::Interrupt,
            _ = self.usr2.recv() => SignalAction::Unsupported("SIGUSR2"),
            _ = self.winch.recv() => SignalAction::Unsupported("SIGWINCH"),
        }
    }
}

/// SIGUSR2 / SIGWINCH: nginx's binary upgrade (a new master beside the
/// old, then the old one's workers stopped) is not vigil's; say what to do.
pub(crate) fn refuse_upgrade(signal: &str) {
    tracing::warn!(
        signal,
        "nginx's binary upgrade (SIGUSR2, SIGWINCH) is not supported: vigil keeps running unchanged. \
         To upgrade without a gap, start the new binary beside this one on listen lines with `reuseport`, \
         then send this one SIGQUIT (docs/operations.md, \"Binary upgrade\")"
    );
}
