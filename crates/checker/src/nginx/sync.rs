//! The sync loop: render every block from the current peer states, and
//! when the files would change, write them (atomically, keeping the
//! previous ones), test, and reload, debounced and rate-limited; a failed
//! or unverified reload is retried with exponential backoff.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_core::health::HealthState;
use vigil_core::registry::Registry;

use super::files::{self, Change};
use super::render::{render, Guard};
use super::source::Block;
use super::{Nginx, SyncError};

/// Timing and safety settings of the sync loop.
#[derive(Clone, Debug)]
pub struct SyncOptions {
    /// Where `NAME.conf` files go.
    pub render_dir: PathBuf,
    /// The minimum-healthy guard.
    pub guard: Guard,
    /// Quiet time after the last transition before rendering (default 1s).
    pub debounce: Duration,
    /// Longest a burst may delay a render (default 5s).
    pub max_delay: Duration,
    /// Least time between two reloads (default 5s).
    pub min_reload_interval: Duration,
    /// How often the loop re-renders to catch changes that raise no event,
    /// such as a first failed probe of a peer that starts down (default 1s).
    pub poll: Duration,
    /// First retry delay of a failed reload, doubled up to `retry_max` (default 1s).
    pub retry_min: Duration,
    /// Longest retry delay (default 60s).
    pub retry_max: Duration,
}

/// What the sync loop has done (for the status page, metrics and tests).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncStatus {
    /// Renders written and passed by the test command.
    pub applied: u64,
    /// Renders rejected by the test command (and rolled back).
    pub test_failures: u64,
    /// Verified reloads.
    pub reloads: u64,
    /// Failed or unverified reloads.
    pub reload_failures: u64,
    /// A reload is owed to nginx.
    pub reload_pending: bool,
    /// The last error, if the last attempt failed.
    pub last_error: Option<String>,
    /// Servers marked down in the files on disk (`upstream`, server text).
    pub marked: Vec<(String, String)>,
    /// Upstreams where the guard held marks back.
    pub guarded: Vec<String>,
}

/// The blocks and the registry they render from, swapped together.
#[derive(Debug)]
pub struct Snapshot {
    /// The source's blocks.
    pub blocks: Vec<Block>,
    /// The peer states.
    pub registry: Arc<Registry>,
}

/// The loop's state.
pub struct Syncer {
    options: SyncOptions,
    nginx: Arc<dyn Nginx>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    status: Arc<Mutex<SyncStatus>>,
    /// Files as last applied (name → text).
    current: BTreeMap<String, String>,
    /// Peers marked down once; they stay marked until probes say up.
    sticky: BTreeSet<(String, String)>,
    /// A render the test rejected; not retried until something changes.
    failed: Option<BTreeMap<String, String>>,
    last_guarded: Vec<String>,
}

struct Desired {
    files: BTreeMap<String, String>,
    marked: Vec<(String, String)>,
    guarded: Vec<String>,
}

// === impl SyncOptions ===

impl SyncOptions {
    /// Defaults for `render_dir`.
    pub fn new(render_dir: PathBuf) -> Self {
        Self {
            render_dir,
            guard: Guard::default(),
            debounce: Duration::from_secs(1),
            max_delay: Duration::from_secs(5),
            min_reload_interval: Duration::from_secs(5),
            poll: Duration::from_secs(1),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
        }
    }
}

// === impl Syncer ===

impl Syncer {
    /// A loop over `snapshot`; `current` starts as the files on disk.
    pub fn new(
        options: SyncOptions,
        nginx: Arc<dyn Nginx>,
        snapshot: Arc<ArcSwap<Snapshot>>,
        status: Arc<Mutex<SyncStatus>>,
    ) -> Result<Self, SyncError> {
        let mut current = BTreeMap::new();
        for b in &snapshot.load().blocks {
            if let Some(text) = files::read(&options.render_dir, &b.name)? {
                current.insert(b.name.clone(), text);
            }
        }
        Ok(Self {
            options,
            nginx,
            snapshot,
            status,
            current,
            sticky: BTreeSet::new(),
            failed: None,
            last_guarded: Vec::new(),
        })
    }

    fn update_status(&self, f: impl FnOnce(&mut SyncStatus)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }

    /// Render every block from the peer states now.
    fn desired(&mut self) -> Desired {
        let snap = self.snapshot.load_full();
        let mut out = Desired {
            files: BTreeMap::new(),
            marked: Vec::new(),
            guarded: Vec::new(),
        };
        let mut sticky = BTreeSet::new();
        for block in &snap.blocks {
            let up = snap.registry.get(&block.name);
            let wants = |peer: vigil_core::peer::PeerId| -> Option<(String, String)> {
                let p = up?.peers().get(peer.0 as usize)?;
                let v = p.health().view();
                let key = (block.name.clone(), p.name().to_string());
                let probed_down = v.state == Some(HealthState::Down)
                    && v.decided
                    && (v.fail_streak > 0 || self.sticky.contains(&key));
                // `vigil peer down|drain` through the admin API is rendered
                // too (stock nginx has no drain: the peer is marked down and
                // requests in flight finish on the old workers).
                let admin_down = p.admin() != vigil_core::peer::AdminState::Up;
                if probed_down {
                    return Some(key);
                }
                admin_down.then_some((block.name.clone(), format!("{}#admin", p.name())))
            };
            let marks: BTreeSet<_> = block
                .lines
                .iter()
                .filter_map(|l| match l {
                    super::source::Line::Server { peer, .. } => wants(*peer).map(|k| (*peer, k)),
                    _ => None,
                })
                .collect();
            let r = render(
                block,
                &|p| marks.iter().any(|(q, _)| *q == p),
                self.options.guard,
            );
            for (_, key) in marks {
                // Only probe verdicts are sticky; admin marks follow the admin state.
                if !key.1.ends_with("#admin") {
                    sticky.insert(key);
                }
            }
            for m in &r.marked {
                out.marked.push((block.name.clone(), m.clone()));
            }
            if r.guarded {
                out.guarded.push(block.name.clone());
            }
            out.files.insert(block.name.clone(), r.text);
        }
        self.sticky = sticky;
        out
    }

    fn changes(&self, desired: &BTreeMap<String, String>) -> Vec<Change> {
        let mut out = Vec::new();
        for (name, text) in desired {
            let old = self.current.get(name);
            if old != Some(text) {
                out.push(Change {
                    name: name.clone(),
                    old: old.cloned(),
                    new: Some(text.clone()),
                });
            }
        }
        for (name, old) in &self.current {
            if !desired.contains_key(name) {
                out.push(Change {
                    name: name.clone(),
                    old: Some(old.clone()),
                    new: None,
                });
            }
        }
        out
    }

    /// Write what changed and test it. `Ok(true)`: files changed and passed.
    /// With `force`, the test runs even when nothing changed.
    pub async fn converge(&mut self, force: bool) -> Result<bool, SyncError> {
        let desired = self.desired();
        if desired.guarded != self.last_guarded {
            for name in desired
                .guarded
                .iter()
                .filter(|n| !self.last_guarded.contains(n))
            {
                tracing::warn!(upstream = %name, "upstream {name}: the probes would leave too few servers; minimum-healthy guard engaged");
            }
            self.last_guarded = desired.guarded.clone();
        }
        let changes = self.changes(&desired.files);
        if changes.is_empty() && !force {
            return Ok(false);
        }
        if !force && self.failed.as_ref() == Some(&desired.files) {
            return Ok(false);
        }
        let dir = self.options.render_dir.clone();
        files::apply(&dir, &changes)?;
        if let Err(e) = self.nginx.test().await {
            files::rollback(&dir, &changes);
            self.failed = Some(desired.files);
            tracing::error!(error = %e, "rendered upstream files rejected; previous files restored");
            self.update_status(|s| {
                s.test_failures += 1;
                s.last_error = Some(e.to_string());
            });
            return Err(e);
        }
        for c in &changes {
            let file = files::conf_path(&dir, &c.name);
            tracing::info!(upstream = %c.name, file = %file.display(), "rendered upstream file updated");
        }
        self.failed = None;
        self.current = desired.files;
        self.update_status(|s| {
            s.applied += 1;
            s.last_error = None;
            s.marked = desired.marked;
            s.guarded = desired.guarded;
        });
        Ok(!changes.is_empty() || force)
    }

    /// Reload nginx and verify; updates the status.
    pub async fn reload(&mut self) -> Result<(), SyncError> {
        match self.nginx.reload().await {
            Ok(()) => {
                tracing::info!("nginx reloaded (new workers seen)");
                self.update_status(|s| {
                    s.reloads += 1;
                    s.reload_pending = false;
                    s.last_error = None;
                });
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, "nginx reload failed; will retry");
                self.update_status(|s| {
                    s.reload_failures += 1;
                    s.reload_pending = true;
                    s.last_error = Some(e.to_string());
                });
                Err(e)
            }
        }
    }

    /// Run until `cancel`: `wake` is notified on every transition.
    pub async fn run(
        mut self,
        wake: Arc<Notify>,
        cancel: CancellationToken,
        mut reload_pending: bool,
    ) {
        let o = self.options.clone();
        let mut backoff = o.retry_min;
        let mut retry_at: Option<Instant> = reload_pending.then(|| Instant::now() + backoff);
        let mut last_reload: Option<Instant> = None;
        loop {
            let retry_sleep = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now));
            let dirty = tokio::select! {
                _ = cancel.cancelled() => return,
                _ = wake.notified() => true,
                _ = tokio::time::sleep(o.poll) => {
                    let d = self.desired();
                    !self.changes(&d.files).is_empty() && self.failed.as_ref() != Some(&d.files)
                }
                _ = retry_sleep, if retry_at.is_some() => false,
            };
            if dirty {
                let first = Instant::now();
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(o.debounce) => break,
                        _ = wake.notified() => if first.elapsed() >= o.max_delay { break },
                    }
                }
                if let Some(last) = last_reload {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep_until(last + o.min_reload_interval) => {}
                    }
                }
                if let Ok(true) = self.converge(false).await {
                    reload_pending = true;
                    retry_at = None;
                    backoff = o.retry_min;
                }
            }
            let due = retry_at.is_none_or(|t| t <= Instant::now());
            if reload_pending && due {
                if let Some(last) = last_reload {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep_until(last + o.min_reload_interval) => {}
                    }
                }
                last_reload = Some(Instant::now());
                match self.reload().await {
                    Ok(()) => {
                        reload_pending = false;
                        retry_at = None;
                        backoff = o.retry_min;
                    }
                    Err(_) => {
                        retry_at = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(o.retry_max);
                    }
                }
            }
        }
    }
}
