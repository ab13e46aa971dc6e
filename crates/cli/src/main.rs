//! `vigil`: the upstream health plane. This binary is the composition root
//! (config → state → proxy + checker + admin API) and the inspection CLI.
//!
//! Exit codes: 0 success; 1 findings (`lint`) or a failed command (an
//! address to listen on is taken); 2 bad input (unreadable or invalid
//! configuration, bad arguments).

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod client;
mod cmd;
mod fleet;
mod load;
mod nginx;
mod resolve;
mod stack;

use std::io::Write as _;
use std::process::ExitCode;

/// The `mimalloc` feature's allocator (see crates/cli/Cargo.toml).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// The admin API is the library target's (so the fuzz crate reaches it).
use vigil::admin;

use clap::{Parser, Subcommand};

/// vigil: keep traffic off broken backends, and show why.
#[derive(Debug, Parser)]
#[command(name = "vigil", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the reverse proxy (nginx-compatible passive accounting and retries).
    Serve(Box<cmd::serve::Args>),
    /// Explain the traps in an nginx.conf or vigil TOML file.
    Lint(cmd::lint::Args),
    /// Print the vigil TOML equivalent of an nginx.conf.
    Convert(cmd::convert::Args),
    /// Run the active checker beside a stock nginx: probe, render upstream files, reload.
    Check(Box<cmd::check::Args>),
    /// Show every upstream and peer of a running vigil.
    Status(cmd::status::Args),
    /// Explain, in sentences, why a peer does or does not get traffic.
    Explain(cmd::explain::Args),
    /// Print the transition log (`--follow` to keep watching).
    Events(cmd::events::Args),
    /// Set a peer down, up or draining.
    Peer(cmd::peer::Args),
    /// Ask a running `vigil serve` or `vigil check` to reload its configuration (as SIGHUP).
    Reload(cmd::reload::Args),
    /// Run the embedded demo: three misbehaving backends behind vigil, with the admin API.
    Demo(cmd::demo::Args),
    /// Stand in for the nginx binary: nginx's command line (-t, -T, -s reload, -p, -c, -e, -g,
    /// -V), pid file, error log, daemon and signals. Also `vigil -t ...`, or vigil installed as
    /// `nginx` (docs/nginx-cli.md).
    #[command(disable_help_flag = true)]
    Nginx {
        /// nginx's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(skip) = nginx::wants(&argv) {
        return nginx::main(&argv, skip);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(a) => cmd::serve::run(*a),
        Command::Lint(a) => cmd::lint::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::Check(a) => cmd::check::run(*a),
        Command::Status(a) => cmd::status::run(a),
        Command::Explain(a) => cmd::explain::run(a),
        Command::Events(a) => cmd::events::run(a),
        Command::Peer(a) => cmd::peer::run(a),
        Command::Reload(a) => cmd::reload::run(a),
        Command::Demo(a) => cmd::demo::run(a),
        // Taken by `nginx::wants` above; here for `vigil help`.
        Command::Nginx { args } => {
            let mut argv = vec![std::ffi::OsString::from("vigil")];
            argv.extend(args);
            return nginx::main(&argv, 1);
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            // Not eprintln!: a closed standard error must not turn the
            // error into a panic.
            let _ = writeln!(std::io::stderr(), "vigil: error: {e:#}");
            // An address another process holds is a failed start (nginx
            // exits 1 on its bind() error), not bad input.
            if is_listen_error(&e) {
                return ExitCode::from(1);
            }
            ExitCode::from(2)
        }
    }
}

/// Raise the open-file limit (`RLIMIT_NOFILE`) to the hard limit, as
/// nginx's `worker_rlimit_nofile` does, so that client connections exhaust
/// descriptors as late as possible; logs the figure. Call after logging is set up.
pub(crate) fn raise_nofile_limit() {
    let before = match rlimit::Resource::NOFILE.get() {
        Ok((soft, _)) => soft,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-file limit (RLIMIT_NOFILE)");
            return;
        }
    };
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(now) if now > before => {
            tracing::info!(
                from = before,
                to = now,
                "open-file limit (RLIMIT_NOFILE) raised to the hard limit"
            )
        }
        Ok(now) => tracing::info!(limit = now, "open-file limit (RLIMIT_NOFILE)"),
        Err(e) => {
            tracing::warn!(limit = before, error = %e, "cannot raise the open-file limit (RLIMIT_NOFILE)")
        }
    }
}

/// The proxy could not listen on an address of its configuration.
fn is_listen_error(e: &anyhow::Error) -> bool {
    use vigil_proxy::worker::{ListenError, SpawnError};
    e.chain().any(|c| {
        c.downcast_ref::<ListenError>().is_some()
            || matches!(c.downcast_ref::<SpawnError>(), Some(SpawnError::Listen(_)))
    })
}

/// `vigil status | head` closing the pipe early is not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
