//! `vigil check`: the checker beside a stock nginx, which has no active
//! checks and no runtime API. The operator keeps tengine-style upstream
//! blocks in a source file nginx does not read; vigil probes their
//! servers and renders one stock-nginx `upstream` file per block into a
//! directory that nginx.conf includes, marking `down` the servers core's
//! rules take out (never more than `max_ejected` and the minimum-healthy
//! guard, which is that rule, let go), then tests and reloads nginx.
//!
//! - [`source`]: the source file → model + renderable lines;
//! - [`Guard`]: `--min-healthy` / `--fail-closed` as core's `max_ejected`;
//! - [`render`]: core's answer → one block's file text (deterministic);
//! - [`sync`]: write atomically, test, roll back, reload (at once when a
//!   server leaves nginx, else debounced; rate-limited, verified, retried);
//! - [`control`]: the nginx commands and the reload proof.

pub mod control;
mod error;
mod files;
mod guard;
mod metrics;
pub mod render;
pub mod source;
pub mod sync;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use vigil_config::system_resolver;
use vigil_core::api::{NginxView, UpstreamView};
use vigil_core::config::CheckConfig;
use vigil_core::event::{EventBus, EventKind};
use vigil_core::registry::Registry;
use vigil_core::Clock;
use vigil_net::SystemClock;

use crate::status::StatusPage;
use crate::{Checker, CheckerOptions, UpdateSummary};
pub use control::{CommandLine, Nginx, NginxControl};
pub use error::SyncError;
pub use guard::Guard;
pub use sync::{Snapshot, SyncOptions, SyncStatus, Syncer};

/// Everything `vigil check` needs.
#[derive(Clone, Debug)]
pub struct CheckOnlyOptions {
    /// The upstreams source (nginx syntax, or `.toml`).
    pub source: PathBuf,
    /// Check settings for upstreams without a `check`.
    pub default_check: Option<CheckConfig>,
    /// The nginx commands.
    pub control: NginxControl,
    /// Render directory, guard, debounce, rate limit, retries.
    pub sync: SyncOptions,
    /// The scheduler's settings.
    pub checker: CheckerOptions,
    /// Where to serve `/status` and `/metrics`.
    pub status_listen: Option<SocketAddr>,
}

/// The running checker-only mode.
pub struct CheckOnly {
    options: CheckOnlyOptions,
    checker: Arc<Checker>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    status: Arc<Mutex<SyncStatus>>,
    wake: Arc<Notify>,
    events: Arc<EventBus>,
    clock: Arc<dyn Clock>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    status_addr: Option<SocketAddr>,
    /// One source reload at a time (SIGHUP and the admin API).
    reload_lock: Arc<Mutex<()>>,
}

/// Re-reads the upstreams source: see [`CheckOnly::source_reloader`].
#[derive(Clone)]
pub struct SourceReloader {
    options: CheckOnlyOptions,
    checker: Arc<Checker>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    wake: Arc<Notify>,
    events: Arc<EventBus>,
    clock: Arc<dyn Clock>,
    lock: Arc<Mutex<()>>,
}

// === impl SourceReloader ===

impl SourceReloader {
    /// Re-read the source: unchanged peers keep their state and probe
    /// loops. Returns the new generation; on an error nothing changed.
    pub fn reload(&self) -> Result<(u64, UpdateSummary), SyncError> {
        // A poisoned lock guards nothing but the order of reloads.
        let _one = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.snapshot.load_full();
        let snap = load(
            &self.options,
            Some(&old.registry),
            &self.events,
            &self.clock,
        )?;
        let registry = snap.registry.clone();
        let summary = self.checker.update(registry.clone())?;
        self.snapshot.store(Arc::new(snap));
        self.wake.notify_one();
        Ok((registry.generation(), summary))
    }
}

/// Render every file as in the source, test, keep it if it passes (no
/// reload): to prepare the files before nginx first starts.
pub async fn render_once(options: &CheckOnlyOptions) -> Result<(), SyncError> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let snapshot = load(options, None, &Arc::default(), &clock)?;
    let mut syncer = Syncer::new(
        options.sync.clone(),
        Arc::new(options.control.clone()),
        Arc::new(ArcSwap::from_pointee(snapshot)),
        Arc::default(),
    )?;
    syncer.converge(true).await.map(|_| ())
}

/// Load the source into a snapshot; with `previous`, unchanged peers keep
/// their state.
fn load(
    options: &CheckOnlyOptions,
    previous: Option<&Registry>,
    events: &Arc<EventBus>,
    clock: &Arc<dyn Clock>,
) -> Result<Snapshot, SyncError> {
    let mut source = source::load(
        &options.source,
        options.default_check.as_ref(),
        &system_resolver,
    )?;
    options.sync.guard.apply(&mut source.config);
    let registry = Arc::new(Registry::build(
        &source.config,
        previous,
        events.clone(),
        clock.clone(),
    ));
    Ok(Snapshot {
        blocks: source.blocks,
        registry,
        clock: clock.clone(),
    })
}

/// Fills in what nginx was given for each server ([`NginxView`]) in the
/// admin API's views of `vigil check`: how the server is written in the
/// files nginx last loaded, how core's rules render it now, and why
/// nginx does not run that yet.
#[derive(Clone)]
pub struct Annotator {
    snapshot: Arc<ArcSwap<Snapshot>>,
    status: Arc<Mutex<SyncStatus>>,
}

// === impl Annotator ===

impl Annotator {
    /// An annotator over the sync loop's `snapshot` and `status`.
    pub fn new(snapshot: Arc<ArcSwap<Snapshot>>, status: Arc<Mutex<SyncStatus>>) -> Self {
        Self { snapshot, status }
    }

    /// The render and reload loop's state (`nginx` of `/api/status`).
    pub fn sync_view(&self) -> vigil_core::api::NginxSyncView {
        self.status.lock().map(|s| s.view()).unwrap_or_default()
    }

    /// Set `nginx` on every peer of `view` that the source renders.
    pub fn annotate(&self, view: &mut UpstreamView) {
        let snap = self.snapshot.load_full();
        let (Some(block), Some(up)) = (
            snap.blocks.iter().find(|b| b.name == view.name),
            snap.registry.get(&view.name),
        ) else {
            return;
        };
        let marks = render::decide(up, snap.clock.now());
        let rendered = render::render(block, &marks);
        let Ok(st) = self.status.lock() else {
            return;
        };
        let ids = block.lines.iter().filter_map(|l| match l {
            source::Line::Server { peer, .. } => Some(*peer),
            source::Line::Other(_) => None,
        });
        for (peer, (text, decided)) in ids.zip(rendered.servers) {
            let (Some(p), Some(pv)) = (
                up.peers().get(peer.0 as usize),
                view.peers.get_mut(peer.0 as usize),
            ) else {
                continue;
            };
            if pv.address != p.config().address {
                continue;
            }
            let given = st
                .loaded
                .as_ref()
                .and_then(|m| m.get(&(view.name.clone(), text)));
            let pending = (given != Some(&decided)).then(|| {
                if st.rejected {
                    "render_rejected"
                } else if st.reload_failed {
                    "reload_failed"
                } else {
                    "waiting_for_reload"
                }
                .to_string()
            });
            pv.nginx = Some(NginxView {
                given: given.map(render::Mark::given),
                given_note: given.and_then(|g| g.note()).map(str::to_string),
                decided: decided.given(),
                decided_note: decided.note().map(str::to_string),
                pending,
            });
        }
    }
}

impl std::fmt::Debug for Annotator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Annotator").finish_non_exhaustive()
    }
}

// === impl CheckOnly ===

impl CheckOnly {
    /// Load the source, render it as written, test, reload once (a failed
    /// reload is reported and retried; a failed test is an error), then
    /// start probing, syncing and serving the status page.
    pub async fn start(options: CheckOnlyOptions) -> Result<Self, SyncError> {
        let events = Arc::new(EventBus::default());
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let first = load(&options, None, &events, &clock)?;
        let registry = first.registry.clone();
        let snapshot = Arc::new(ArcSwap::from_pointee(first));
        let status = Arc::new(Mutex::new(SyncStatus::default()));
        let mut syncer = Syncer::new(
            options.sync.clone(),
            Arc::new(options.control.clone()),
            snapshot.clone(),
            status.clone(),
        )?
        .with_events(events.clone());
        syncer.converge(true).await?;
        let reload_pending = syncer.reload().await.is_err();

        let checker = Arc::new(Checker::start(
            registry,
            clock.clone(),
            options.checker.clone(),
        )?);
        let wake = Arc::new(Notify::new());
        let w = wake.clone();
        events.subscribe(move |e| {
            // Transitions that can change what is rendered (the sync
            // loop's own events cannot).
            if matches!(
                e.kind,
                EventKind::ProbeUp { .. }
                    | EventKind::ProbeDown { .. }
                    | EventKind::Admin { .. }
                    | EventKind::MaxEjected { .. }
                    | EventKind::Excluded { .. }
                    | EventKind::ProbeReadmitted { .. }
            ) {
                w.notify_one();
            }
        });
        let cancel = CancellationToken::new();
        let mut tasks = vec![tokio::spawn(syncer.run(
            wake.clone(),
            cancel.clone(),
            reload_pending,
        ))];
        let mut status_addr = None;
        if let Some(addr) = options.status_listen {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| SyncError::io(format!("status listener {addr}"), e))?;
            status_addr = listener.local_addr().ok();
            let page = StatusPage::for_checker(checker.clone());
            let mut prometheus = page.prometheus_registry(Some(checker.metrics().clone()));
            prometheus.register_collector(Box::new(metrics::SyncMetrics(status.clone())));
            let page = page.with_prometheus(Arc::new(prometheus));
            tasks.push(tokio::spawn(page.serve(listener, cancel.clone())));
        }
        Ok(Self {
            options,
            checker,
            snapshot,
            status,
            wake,
            events,
            clock,
            cancel,
            tasks,
            status_addr,
            reload_lock: Arc::default(),
        })
    }

    /// Re-read the source (SIGHUP): unchanged peers keep their state and
    /// probe loops, new servers render as written until probed.
    pub async fn reload_source(&self) -> Result<UpdateSummary, SyncError> {
        self.source_reloader().reload().map(|(_, s)| s)
    }

    /// A handle that re-reads the source as [`CheckOnly::reload_source`]
    /// does, from anywhere (the admin API's `POST /api/reload`).
    pub fn source_reloader(&self) -> SourceReloader {
        SourceReloader {
            options: self.options.clone(),
            checker: self.checker.clone(),
            snapshot: self.snapshot.clone(),
            wake: self.wake.clone(),
            events: self.events.clone(),
            clock: self.clock.clone(),
            lock: self.reload_lock.clone(),
        }
    }

    /// What fills in [`NginxView`] in the admin API's views.
    pub fn annotator(&self) -> Annotator {
        Annotator {
            snapshot: self.snapshot.clone(),
            status: self.status.clone(),
        }
    }

    /// What the sync loop has done so far.
    pub fn status(&self) -> SyncStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The checker.
    pub fn checker(&self) -> &Arc<Checker> {
        &self.checker
    }

    /// The event bus transitions are published on.
    pub fn events(&self) -> &Arc<EventBus> {
        &self.events
    }

    /// The clock transitions are stamped with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Where the status page listens, if it does.
    pub fn status_addr(&self) -> Option<SocketAddr> {
        self.status_addr
    }

    /// Stop probing and syncing; waits for the loops to end.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.checker.shutdown();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

impl std::fmt::Debug for CheckOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckOnly")
            .field("source", &self.options.source)
            .finish()
    }
}
