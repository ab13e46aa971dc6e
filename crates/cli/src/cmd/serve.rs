//! `vigil serve`: the reverse proxy.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use vigil_core::event::EventBus;
use vigil_core::{Clock, SystemClock};
use vigil_proxy::{Generation, Proxy};

use crate::load::{self, Kind};

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
    /// Worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// How long in-flight requests may take to finish at shutdown.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    grace: Duration,
    /// Directory for spooled request bodies (default: the system temp dir).
    #[arg(long, value_name = "DIR")]
    spool_dir: Option<PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    vigil_core::config::value::parse_time(s).map_err(|e| e.to_string())
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    crate::cmd::init_logging();
    let (path, kind) = load::pick(args.nginx_conf.clone(), args.config.clone())?;
    let loaded = load_with_override(&path, kind, args.listen)?;
    for (name, at) in &loaded.ignored {
        tracing::info!(directive = %name, at = %at, "directive has no meaning for vigil and is ignored");
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(serve(args, path, kind, loaded.config))
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
) -> anyhow::Result<ExitCode> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let events = Arc::new(EventBus::default());
    events.subscribe(|e| tracing::warn!(upstream = %e.upstream, peer = %e.peer, event = e.kind.name(), "{}", e.kind));
    let listens = vigil_proxy::route::Routes::listeners(&config);
    if listens.is_empty() {
        anyhow::bail!("{}: no server block with a listen address", path.display());
    }
    let generation = Generation::build(config, None, events.clone(), clock.clone())?;
    let spool = args.spool_dir.clone().unwrap_or_else(std::env::temp_dir);
    let proxy = Arc::new(Proxy::new(generation, events, clock, spool));
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    for l in &listens {
        let listener = vigil_proxy::bind(l.addr, l.reuseport, l.backlog)
            .with_context(|| format!("cannot listen on {}", l.addr))?;
        tracing::info!(addr = %l.addr, "listening");
        tasks.push(tokio::spawn(vigil_proxy::serve(
            proxy.clone(),
            listener,
            shutdown.clone(),
            args.grace,
        )));
    }
    signals(proxy.clone(), path, kind, args.listen, shutdown.clone()).await?;
    for t in tasks {
        let _ = t.await;
    }
    Ok(ExitCode::SUCCESS)
}

/// Wait for signals: SIGHUP reloads, SIGTERM/SIGQUIT/SIGINT stop.
async fn signals(
    proxy: Arc<Proxy>,
    path: PathBuf,
    kind: Kind,
    listen: Option<SocketAddr>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut quit = signal(SignalKind::quit()).context("installing SIGQUIT handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    loop {
        tokio::select! {
            _ = hup.recv() => {
                match load_with_override(&path, kind, listen).map(|l| proxy.reload(l.config)) {
                    Ok(Ok(generation)) => tracing::info!(generation, "configuration reloaded"),
                    Ok(Err(e)) => tracing::error!(error = %e, "reload failed; keeping the running configuration"),
                    Err(e) => tracing::error!(error = %format!("{e:#}"), "reload failed; keeping the running configuration"),
                }
            }
            _ = term.recv() => break,
            _ = quit.recv() => break,
            _ = int.recv() => break,
        }
    }
    tracing::info!("shutting down");
    shutdown.cancel();
    Ok(())
}
