//! The running pieces of `vigil serve` (and `vigil demo`): the proxy's
//! workers, the active checker writing into the same peer records, and the
//! admin API, with reload and graceful shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use vigil_core::config::Config;
use vigil_core::event::{Event, EventBus};
use vigil_core::Clock;
use vigil_net::SystemClock;
use vigil_proxy::{Generation, Proxy, ProxyMetrics, Telemetry};

use crate::admin::Admin;

/// How to run the stack.
pub(crate) struct Options {
    pub(crate) threads: usize,
    pub(crate) spool_dir: PathBuf,
    /// Admin listen address (None: the config's, else 127.0.0.1:9901).
    pub(crate) admin_listen: Option<SocketAddr>,
    /// Admin token (overrides the config's).
    pub(crate) admin_token: Option<String>,
    /// Host names the admin API answers to, besides the config's
    /// `admin.hosts` (`--admin-host`).
    pub(crate) admin_hosts: Vec<String>,
    /// Turn the admin API off.
    pub(crate) no_admin: bool,
    /// Serve the endpoint list on `GET /` instead of the dashboard (else
    /// the config's `admin.dashboard` decides).
    pub(crate) no_dashboard: bool,
    /// Fleet mode: join this fleet (`--fleet-etcd`, `[fleet]`).
    pub(crate) fleet: Option<crate::fleet::Settings>,
}

/// A running stack.
pub(crate) struct Stack {
    pub(crate) proxy: Arc<Proxy>,
    pub(crate) checker: Arc<vigil_checker::Checker>,
    pub(crate) admin: Option<Admin>,
    pub(crate) admin_addr: Option<SocketAddr>,
    /// Fires when a stop begins (graceful or fast): the admin API, the
    /// resolver and the demo's load stop with it.
    pub(crate) shutdown: CancellationToken,
    pub(crate) fleet: Option<Arc<crate::fleet::Member>>,
    /// How the workers stop (`shutdown` is its graceful token).
    stopping: vigil_proxy::worker::Shutdown,
    /// Taken by the stop that waits for them.
    workers: std::sync::Mutex<Option<vigil_proxy::worker::Workers>>,
    telemetry: std::sync::Mutex<Option<Telemetry>>,
    events: Arc<EventBus>,
    clock: Arc<dyn Clock>,
}

/// How to stop (nginx's signals: QUIT graceful, TERM and INT fast).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Stop accepting, close idle connections, let the requests and tunnels
    /// in flight finish; close what is left after the bound (None: never).
    Graceful(Option<Duration>),
    /// Close every connection now.
    Fast,
}

/// Log a transition: trouble (an exclusion, a probe down) at WARN, good
/// news (a probe up, a readmission) and routine steps at INFO.
fn log_event(e: &Event) {
    if e.kind.is_warning() {
        tracing::warn!(upstream = %e.upstream, peer = %e.peer, event = e.kind.name(), "{}", e.kind);
    } else {
        tracing::info!(upstream = %e.upstream, peer = %e.peer, event = e.kind.name(), "{}", e.kind);
    }
}

/// Wait for the checker's start round, at most the longest `timeout` of
/// the checks; log how many checked peers it brought up.
async fn start_round(checker: &vigil_checker::Checker, registry: &vigil_core::registry::Registry) {
    let bound = registry
        .upstreams()
        .iter()
        .filter_map(|u| u.config().check.as_ref())
        .map(|c| c.timeout)
        .max();
    let Some(bound) = bound else {
        return;
    };
    let done = checker.start_round(bound).await;
    let checked: Vec<bool> = registry
        .upstreams()
        .iter()
        .filter(|u| u.config().check.is_some())
        .flat_map(|u| u.peers())
        .map(|p| p.health().allows_traffic())
        .collect();
    let up = checked.iter().filter(|u| **u).count();
    if done {
        tracing::info!(
            up,
            checked = checked.len(),
            "first probe round done before accepting traffic"
        );
    } else {
        tracing::warn!(
            up,
            checked = checked.len(),
            waited_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
            "first probe round not done within the longest check timeout; accepting traffic, the probes go on"
        );
    }
}

/// Start everything on the current (control) runtime.
pub(crate) async fn start(config: Config, opts: Options) -> anyhow::Result<Stack> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let events = Arc::new(EventBus::default());
    events.subscribe(log_event);
    let listens = vigil_proxy::worker::listens(&config);
    if listens.is_empty() {
        anyhow::bail!("no server block with a listen address");
    }
    let admin_cfg = config.admin.clone();
    // Per-worker state (pool shards, request counters) has a shard per worker.
    vigil_proxy::worker::plan(opts.threads);
    let generation = Generation::build(config, None, events.clone(), clock.clone())?;
    // Fleet mode: the fleet chooses who probes what (joining runs in the
    // background; until then every target is probed here).
    let fleet = match &opts.fleet {
        Some(s) => Some(Arc::new(crate::fleet::Member::start(s)?)),
        None => None,
    };
    // Active checks write into the same peer records the proxy reads;
    // transitions are logged by the event-bus subscriber above.
    let checker = Arc::new(vigil_checker::Checker::start(
        generation.registry.clone(),
        clock.clone(),
        vigil_checker::CheckerOptions {
            log_transitions: false,
            tls: vigil_checker::TlsPolicy::from_config(&generation.config),
            start_round: true,
            sharing: fleet.as_ref().and_then(|f| f.sharing()),
            ..vigil_checker::CheckerOptions::default()
        },
    )?);
    if let Some(f) = &fleet {
        f.attach(&checker);
        f.wire_events(&events, &clock);
    }
    // No 502 window at start: the first probe round (up to `rise` probes
    // back to back while they pass) runs before the listeners open, for at
    // most the longest check timeout (docs/checker.md).
    start_round(&checker, &generation.registry).await;
    let metrics = Arc::new(ProxyMetrics::new());
    // Export requests are spawned on this (control) runtime.
    let telemetry = Telemetry::start(&generation.config.telemetry, metrics.clone())
        .context("cannot start OpenTelemetry export")?;
    let mut proxy = Proxy::new(generation, events.clone(), clock.clone(), opts.spool_dir)
        .with_metrics(metrics.clone());
    if let Some(t) = &telemetry {
        proxy = proxy.with_tracer(t.tracer());
        tracing::info!("exporting metrics and traces over OTLP");
    }
    let proxy = Arc::new(proxy);
    let shutdown = CancellationToken::new();
    let stopping = vigil_proxy::worker::Shutdown::with_graceful(shutdown.clone());
    let mut admin = None;
    let mut admin_addr = None;
    if !opts.no_admin {
        let explicit = opts.admin_listen.or(admin_cfg.listen);
        let addr = explicit.unwrap_or(crate::admin::DEFAULT_LISTEN);
        let token = opts.admin_token.clone().or(admin_cfg.token.clone());
        let p = proxy.clone();
        let status = vigil_checker::status::StatusPage::new(move || p.current().registry.clone());
        // One registry for `/metrics`: the peer gauges, the probe counters
        // and the proxy's request metrics, each read at scrape time.
        let mut prometheus = status.prometheus_registry(Some(checker.metrics().clone()));
        prometheus.register_collector(Box::new(metrics.clone()));
        let status = status.with_prometheus(Arc::new(prometheus));
        let p2 = proxy.clone();
        let mut a = Admin::new(
            move || p2.current().registry.clone(),
            clock.clone(),
            events.clone(),
            token,
            status,
        )
        .with_dashboard(admin_cfg.dashboard && !opts.no_dashboard)
        .with_hosts(admin_cfg.hosts.iter().chain(&opts.admin_hosts).cloned());
        if let Some(f) = fleet.clone() {
            a = a.with_fleet(move || f.view_json());
        }
        match a.clone().listen(addr, shutdown.clone()).await {
            Ok(bound) => {
                admin = Some(a);
                admin_addr = Some(bound);
            }
            // The default address being taken (another vigil on this host)
            // must not keep the proxy down; an address asked for must work.
            Err(e @ crate::admin::AdminError::Bind { .. }) if explicit.is_none() => {
                crate::admin::warn_default_unavailable(&e, "set admin.listen or --admin-listen");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let workers =
        vigil_proxy::worker::spawn(proxy.clone(), &listens, opts.threads, stopping.clone())?;
    for l in &listens {
        tracing::info!(addr = %l.addr, workers = opts.threads, "listening");
    }
    Ok(Stack {
        proxy,
        checker,
        admin,
        admin_addr,
        shutdown,
        fleet,
        stopping,
        workers: std::sync::Mutex::new(Some(workers)),
        telemetry: std::sync::Mutex::new(telemetry),
        events,
        clock,
    })
}

impl Stack {
    /// Re-resolve the `server NAME resolve` lines while the stack runs
    /// (crate::resolve), until shutdown.
    pub(crate) fn start_resolving(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let stack: std::sync::Weak<dyn crate::resolve::Reload> = weak;
        crate::resolve::spawn(
            stack,
            self.events.clone(),
            self.clock.clone(),
            self.shutdown.clone(),
        );
    }

    /// Swap in a new configuration, listen addresses included; probes
    /// follow. On an error nothing changed.
    pub(crate) fn reload(&self, config: Config) -> Result<u64, String> {
        let generation = {
            let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
            let Some(workers) = workers.as_ref() else {
                return Err("vigil is stopping: the configuration is not reloaded".into());
            };
            workers.reload(config).map_err(|e| e.to_string())?
        };
        let current = self.proxy.current();
        let tls = vigil_checker::TlsPolicy::from_config(&current.config);
        match self.checker.update_with_tls(current.registry.clone(), tls) {
            Ok(s) => tracing::info!(
                kept = s.kept,
                started = s.started,
                stopped = s.stopped,
                "active checks updated"
            ),
            Err(e) => {
                tracing::error!(error = %e, "active checks not updated; probing the previous targets")
            }
        }
        tracing::info!(generation, "configuration reloaded");
        Ok(generation)
    }

    /// Begin a stop (or make a graceful one fast): the listeners close at
    /// once; the probes stop. Returns at once: [`Stack::stopped`] waits.
    pub(crate) fn begin_stop(&self, how: Stop) {
        match how {
            Stop::Graceful(bound) if !self.shutdown.is_cancelled() => {
                match bound {
                    Some(b) => tracing::info!(
                        bound = %vigil_core::config::value::format_time(b),
                        "graceful stop: no new connections; idle ones close, requests and tunnels in flight finish"
                    ),
                    None => tracing::info!(
                        "graceful stop: no new connections; idle ones close, requests and tunnels in flight finish (no time limit: worker_shutdown_timeout is not set)"
                    ),
                }
                self.stopping.graceful(bound);
            }
            Stop::Graceful(_) => {}
            Stop::Fast => {
                tracing::info!("fast stop: closing every connection");
                self.stopping.fast();
            }
        }
        self.checker.shutdown();
    }

    /// Wait for the stop begun by [`Stack::begin_stop`]: the workers end
    /// (their connections finished or closed), the fleet is left and the
    /// telemetry flushed. Only the first caller waits for the workers.
    pub(crate) async fn stopped(&self) {
        if let Some(f) = &self.fleet {
            f.leave().await;
        }
        let workers = self
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(workers) = workers {
            let _ = tokio::task::spawn_blocking(move || workers.join()).await;
        }
        let telemetry = self
            .telemetry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = telemetry {
            if let Err(e) = t.shutdown().await {
                tracing::warn!(error = %e, "OpenTelemetry export did not flush");
            }
        }
        tracing::info!("stopped");
    }

    /// Stop as `how` says and wait until stopped.
    pub(crate) async fn stop(&self, how: Stop) {
        self.begin_stop(how);
        self.stopped().await;
    }
}

impl crate::resolve::Reload for Stack {
    fn current(&self) -> Arc<Generation> {
        self.proxy.current()
    }

    fn reload(&self, config: Config) -> Result<u64, String> {
        Stack::reload(self, config)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use vigil_core::clock::Timestamp;
    use vigil_core::event::{Event, EventKind};

    #[derive(Clone)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn good_news_is_logged_at_info_trouble_at_warn() {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink(buf.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || sink.clone())
            .finish();
        let ev = |kind| Event {
            seq: 1,
            at: Timestamp(1),
            unix_ms: 1,
            upstream: "app".into(),
            peer: "10.0.0.1:80".into(),
            kind,
        };
        tracing::subscriber::with_default(subscriber, || {
            super::log_event(&ev(EventKind::ProbeUp {
                streak: 2,
                detail: "HTTP 200".into(),
            }));
            super::log_event(&ev(EventKind::Readmitted { fails: 1 }));
            super::log_event(&ev(EventKind::ProbeDown {
                streak: 3,
                detail: "refused".into(),
            }));
        });
        let text = String::from_utf8_lossy(&buf.lock().expect("lock")).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].contains(" INFO ") && lines[0].contains("probe_up"),
            "{text}"
        );
        assert!(
            lines[1].contains(" INFO ") && lines[1].contains("readmitted"),
            "{text}"
        );
        assert!(
            lines[2].contains(" WARN ") && lines[2].contains("probe_down"),
            "{text}"
        );
    }
}
