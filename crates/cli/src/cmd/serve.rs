//! `vigil serve`: the reverse proxy.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::load;
use crate::stack;

/// Arguments of `vigil serve`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  vigil serve --nginx-conf /etc/nginx/nginx.conf\n  vigil serve --config vigil.toml --listen 127.0.0.1:8080\n\nSignals, as nginx's: SIGHUP reloads the configuration (unchanged peers keep their state); SIGUSR1 reopens the access logs; SIGQUIT stops gracefully (no new connections, idle ones closed, requests and tunnels in flight finish within --grace, else worker_shutdown_timeout, else without limit); SIGTERM and SIGINT (Ctrl-C) stop at once, and SIGTERM stops gracefully too when --grace is given."
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
    /// A graceful stop's bound: how long the requests and tunnels in flight
    /// may take to finish after SIGQUIT (default: the conf's
    /// worker_shutdown_timeout, else no limit, as nginx). Given, SIGTERM
    /// stops gracefully within it too (else SIGTERM is nginx's fast stop).
    #[arg(long, value_parser = crate::cmd::parse_duration)]
    grace: Option<Duration>,
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
    let loader = load::Loader {
        path: path.clone(),
        kind,
        globals: String::new(),
        listen: args.listen,
    };
    let loaded = loader.load().map_err(|e| every_refusal(e, &loader))?;
    let fleet = crate::fleet::Settings::gather(&args.fleet, Some(&path))?;
    // Before any listener or connection takes a descriptor.
    crate::raise_nofile_limit();
    for (name, at) in &loaded.ignored {
        tracing::info!(directive = %name, at = %at, "directive has no meaning for vigil and is ignored");
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let launch = Launch {
        grace: Grace {
            given: args.grace,
            conf: loaded.config.shutdown_timeout,
        },
        loader,
        options: stack::Options {
            threads,
            spool_dir: args.spool_dir.clone().unwrap_or_else(std::env::temp_dir),
            admin_listen: args.admin_listen,
            admin_token: args.admin_token.clone(),
            admin_hosts: args.admin_hosts.clone(),
            no_admin: args.no_admin,
            no_dashboard: args.no_dashboard,
            fleet,
        },
        hooks: Box::new(NoHooks),
    };
    control_runtime()?.block_on(serve(launch, loaded.config))
}

/// A start refused for its nginx.conf names every refusal, not only the
/// first: the error, then one line for each other place `vigil serve`
/// refuses (as `vigil lint --for serve` lists them), so that one run
/// shows all there is to change.
fn every_refusal(e: anyhow::Error, loader: &load::Loader) -> anyhow::Error {
    if loader.kind != load::Kind::Nginx || e.downcast_ref::<vigil_config::ConfigError>().is_none() {
        return e;
    }
    let Ok(lenient) =
        vigil_config::nginx::lenient_file(&loader.path, &vigil_config::system_resolver)
    else {
        return e;
    };
    let first = e.to_string();
    let others: Vec<String> = lenient
        .refusals
        .iter()
        .map(ToString::to_string)
        .filter(|r| *r != first)
        .collect();
    if others.is_empty() {
        return e;
    }
    let mut text = first;
    for r in &others {
        text.push_str("\nvigil: error: ");
        text.push_str(r);
    }
    anyhow::Error::msg(text)
}

/// The control runtime: signals, reloads, probes. Requests run on the
/// workers (one single-threaded event loop per thread, see vigil_proxy::worker).
pub(crate) fn control_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// What a server is started with.
pub(crate) struct Launch {
    /// How the configuration is read (again at each reload).
    pub(crate) loader: load::Loader,
    pub(crate) options: stack::Options,
    pub(crate) grace: Grace,
    /// What the nginx command line adds around the stack.
    pub(crate) hooks: Box<dyn Hooks>,
}

/// What a launcher does at the moments of a server's life (the nginx
/// command line: the pid file, the error logs; `vigil serve`: nothing).
pub(crate) trait Hooks: Send {
    /// Every listener is bound and the stack serves.
    fn ready(&mut self, _stack: &stack::Stack) -> anyhow::Result<()> {
        Ok(())
    }
    /// A reload was applied; `process` holds its process directives.
    fn reloaded(&mut self, _process: &vigil_config::nginx::process::Process) {}
    /// SIGUSR1, after the access logs were reopened.
    fn reopen(&mut self) {}
    /// The server stopped.
    fn stopped(&mut self) {}
}

struct NoHooks;

impl Hooks for NoHooks {}

/// Start the stack on `config` and serve until a signal stops it.
pub(crate) async fn serve(
    mut launch: Launch,
    config: vigil_core::config::Config,
) -> anyhow::Result<ExitCode> {
    // Before anything can tell that vigil runs (the pid file, the
    // listeners): a signal sent then is not lost nor fatal.
    let signals = crate::cmd::Signals::install()?;
    let stack = Arc::new(
        stack::start(config, launch.options)
            .await
            .with_context(|| format!("starting {}", launch.loader.path.display()))?,
    );
    stack.start_resolving();
    if let Some(admin) = &stack.admin {
        let (st, loader) = (stack.clone(), launch.loader.clone());
        admin.set_reload(move || {
            let loaded = loader.load().map_err(|e| format!("{e:#}"))?;
            st.reload(loaded.config)
        });
    }
    if let Err(e) = launch.hooks.ready(&stack) {
        stack.begin_stop(stack::Stop::Fast);
        stack.stopped().await;
        return Err(e);
    }
    let r = on_signals(
        signals,
        &stack,
        &launch.loader,
        launch.grace,
        &mut *launch.hooks,
    )
    .await;
    launch.hooks.stopped();
    r.map(|()| ExitCode::SUCCESS)
}

/// The bounds of a graceful stop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grace {
    /// `--grace`.
    pub(crate) given: Option<Duration>,
    /// `worker_shutdown_timeout` of the configuration started with.
    pub(crate) conf: Option<Duration>,
}

impl Grace {
    /// How a signal stops vigil: SIGQUIT gracefully (within `--grace`,
    /// else `worker_shutdown_timeout`, else without limit); SIGTERM fast as
    /// nginx, or gracefully within `--grace` when it is given; SIGINT fast.
    fn stop_for(self, signal: crate::cmd::SignalAction) -> Option<stack::Stop> {
        use crate::cmd::SignalAction as S;
        match signal {
            S::Quit => Some(stack::Stop::Graceful(self.given.or(self.conf))),
            S::Terminate => Some(match self.given {
                Some(g) => stack::Stop::Graceful(Some(g)),
                None => stack::Stop::Fast,
            }),
            S::Interrupt => Some(stack::Stop::Fast),
            S::Reload | S::Reopen | S::Unsupported(_) => None,
        }
    }
}

/// nginx's signals until vigil has stopped: SIGHUP reloads, SIGUSR1
/// reopens the access logs, SIGQUIT/SIGTERM/SIGINT stop (see
/// [`Grace::stop_for`]); a fast stop's signal during a graceful stop makes
/// it fast.
async fn on_signals(
    mut signals: crate::cmd::Signals,
    stack: &stack::Stack,
    loader: &load::Loader,
    grace: Grace,
    hooks: &mut dyn Hooks,
) -> anyhow::Result<()> {
    use crate::cmd::SignalAction as S;
    let stopped = stack.stopped();
    tokio::pin!(stopped);
    let mut stopping = false;
    loop {
        let signal = tokio::select! {
            s = signals.next() => s,
            () = &mut stopped, if stopping => return Ok(()),
        };
        match signal {
            S::Reload if stopping => {
                tracing::info!("SIGHUP while stopping: the configuration is not reloaded")
            }
            S::Reload => {
                let r = loader.load().map_err(|e| format!("{e:#}")).and_then(|l| {
                    let generation = stack.reload(l.config)?;
                    hooks.reloaded(&l.process);
                    Ok(generation)
                });
                if let Err(e) = &r {
                    tracing::error!(error = %e, "reload failed; keeping the running configuration");
                }
                if let Some(admin) = &stack.admin {
                    admin.record_reload(&r);
                }
            }
            S::Reopen => {
                reopen_logs();
                hooks.reopen();
            }
            S::Unsupported(name) => crate::cmd::refuse_upgrade(name),
            stop => {
                if let Some(how) = grace.stop_for(stop) {
                    stack.begin_stop(how);
                    stopping = true;
                }
            }
        }
    }
}

/// SIGUSR1: every access log file opened again by its path (logrotate).
fn reopen_logs() {
    let r = vigil_proxy::reopen_logs();
    for (path, e) in &r.failed {
        tracing::error!(path = %path.display(), error = %e, "SIGUSR1: cannot reopen the access log; it is still written where it was");
    }
    tracing::info!(
        reopened = r.files.len(),
        failed = r.failed.len(),
        "SIGUSR1: access logs reopened"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::SignalAction as S;
    use stack::Stop;

    const S5: Duration = Duration::from_secs(5);
    const S30: Duration = Duration::from_secs(30);

    #[test]
    fn quit_is_graceful_term_and_int_fast_as_nginx() {
        let g = Grace {
            given: None,
            conf: None,
        };
        assert_eq!(g.stop_for(S::Quit), Some(Stop::Graceful(None)));
        assert_eq!(g.stop_for(S::Terminate), Some(Stop::Fast));
        assert_eq!(g.stop_for(S::Interrupt), Some(Stop::Fast));
        assert_eq!(g.stop_for(S::Reload), None);
        assert_eq!(g.stop_for(S::Reopen), None);
    }

    #[test]
    fn worker_shutdown_timeout_bounds_quit_and_grace_overrides_it() {
        let conf = Grace {
            given: None,
            conf: Some(S30),
        };
        assert_eq!(conf.stop_for(S::Quit), Some(Stop::Graceful(Some(S30))));
        assert_eq!(conf.stop_for(S::Terminate), Some(Stop::Fast));
        let given = Grace {
            given: Some(S5),
            conf: Some(S30),
        };
        assert_eq!(given.stop_for(S::Quit), Some(Stop::Graceful(Some(S5))));
        assert_eq!(
            given.stop_for(S::Terminate),
            Some(Stop::Graceful(Some(S5))),
            "--grace makes SIGTERM graceful"
        );
        assert_eq!(given.stop_for(S::Interrupt), Some(Stop::Fast));
    }
}
