//! `vigil serve`: the reverse proxy.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::load::{self, Kind};
use crate::stack;

/// Arguments of `vigil serve`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  vigil serve --nginx-conf /etc/nginx/nginx.conf\n  vigil serve --config vigil.toml --listen 127.0.0.1:8080\n\nSignals: SIGHUP reloads the configuration (unchanged peers keep their state); SIGTERM, SIGQUIT and Ctrl-C stop accepting and let requests finish within --grace."
)]
pub(crate) struct Args {
    /// An nginx.conf to serve (its upstream, server and location blocks).
    #[arg(long, value_name = "PATH")]
    nginx_conf: Option<PathBuf>,
    /// A vigil TOML configuration.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Replace the first `listen` of the first server block.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Worker threads, each one event loop with its own accept queue (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// How long in-flight requests may take to finish at shutdown.
    #[arg(long, default_value = "10s", value_parser = crate::cmd::parse_duration)]
    grace: Duration,
    /// Directory for spooled request bodies (default: the system temp dir).
    #[arg(long, value_name = "DIR")]
    spool_dir: Option<PathBuf>,
    /// Admin API address (default: the config's admin.listen, else 127.0.0.1:9901).
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<SocketAddr>,
    /// Bearer token for the admin API's write endpoints.
    #[arg(long, env = "VIGIL_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// A host name the admin API answers to besides IP addresses and
    /// localhost (repeatable; added to the config's admin.hosts). Requests
    /// naming any other Host get 421 (DNS rebinding).
    #[arg(long = "admin-host", value_name = "NAME", value_parser = vigil_core::config::AdminConfig::host_name)]
    admin_hosts: Vec<String>,
    /// Do not serve the admin API.
    #[arg(long)]
    no_admin: bool,
    /// Do not serve the web dashboard on the admin listener's `GET /` (it
    /// lists the endpoints instead; also `[admin] dashboard = false`).
    #[arg(long)]
    no_dashboard: bool,
    #[command(flatten)]
    fleet: crate::fleet::FleetArgs,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    crate::cmd::init_logging();
    let (path, kind) = load::pick(args.nginx_conf.clone(), args.config.clone())?;
    let loaded = load_with_override(&path, kind, args.listen)?;
    let fleet = crate::fleet::Settings::gather(&args.fleet, Some(&path))?;
    // Before any listener or connection takes a descriptor.
    crate::raise_nofile_limit();
    for (name, at) in &loaded.ignored {
        tracing::info!(directive = %name, at = %at, "directive has no meaning for vigil and is ignored");
    }
    // The control runtime: signals, reloads, probes. Requests run on the
    // workers (one single-threaded event loop per thread, see vigil_proxy::worker).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(serve(args, path, kind, loaded.config, fleet))
}

fn load_with_override(
    path: &std::path::Path,
    kind: Kind,
    listen: Option<SocketAddr>,
) -> anyhow::Result<load::Loaded> {
    let mut loaded = load::load(path, kind)?;
    if let Some(addr) = listen {
        let Some(first) = loaded.config.servers.first_mut() else {
            anyhow::bail!("{}: no server block to apply --listen to", path.display());
        };
        match first.listen.first_mut() {
            Some(l) => l.addr = addr,
            None => first.listen.push(vigil_core::config::Listen {
                addr,
                default_server: false,
                reuseport: false,
                backlog: None,
                ssl: false,
                http2: false,
            }),
        }
    }
    Ok(loaded)
}

async fn serve(
    args: Args,
    path: PathBuf,
    kind: Kind,
    config: vigil_core::config::Config,
    fleet: Option<crate::fleet::Settings>,
) -> anyhow::Result<ExitCode> {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let stack = Arc::new(
        stack::start(
            config,
            stack::Options {
                threads,
                grace: args.grace,
                spool_dir: args.spool_dir.clone().unwrap_or_else(std::env::temp_dir),
                admin_listen: args.admin_listen,
                admin_token: args.admin_token.clone(),
                admin_hosts: args.admin_hosts.clone(),
                no_admin: args.no_admin,
                no_dashboard: args.no_dashboard,
                fleet,
            },
        )
        .await
        .with_context(|| format!("starting {}", path.display()))?,
    );
    stack.start_resolving();
    let listen = args.listen;
    if let Some(admin) = &stack.admin {
        let (st, p) = (stack.clone(), path.clone());
        admin.set_reload(move || {
            let loaded = load_with_override(&p, kind, listen).map_err(|e| format!("{e:#}"))?;
            st.reload(loaded.config)
        });
    }
    signals(&stack, &path, kind, listen).await?;
    match Arc::try_unwrap(stack) {
        Ok(stack) => stack.stop().await,
        Err(stack) => {
            // The admin API still holds a reference: stop the parts it does not own.
            stack.shutdown.cancel();
            stack.checker.shutdown();
            if let Some(f) = &stack.fleet {
                f.leave().await;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Wait for signals: SIGHUP reloads, SIGTERM/SIGQUIT/SIGINT stop.
async fn signals(
    stack: &stack::Stack,
    path: &std::path::Path,
    kind: Kind,
    listen: Option<SocketAddr>,
) -> anyhow::Result<()> {
    let mut signals = crate::cmd::Signals::install()?;
    while let crate::cmd::SignalAction::Reload = signals.next().await {
        let r = load_with_override(path, kind, listen)
            .map_err(|e| format!("{e:#}"))
            .and_then(|l| stack.reload(l.config));
        if let Err(e) = &r {
            tracing::error!(error = %e, "reload failed; keeping the running configuration");
        }
        if let Some(admin) = &stack.admin {
            admin.record_reload(&r);
        }
    }
    Ok(())
}
