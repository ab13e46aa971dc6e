//! The sync loop: render every block from the current peer states, and
//! when the files would change, write them (atomically, keeping the
//! previous ones), test, and reload, debounced and rate-limited; a failed
//! or unverified reload is retried with exponential backoff.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_core::registry::Registry;
use vigil_core::Clock;

use super::files::{self, Change};
use super::render::{decide, render, Mark};
use super::source::Block;
use super::{Guard, Nginx, SyncError};

/// Timing and safety settings of the sync loop.
#[derive(Clone, Debug)]
pub struct SyncOptions {
    /// Where `NAME.conf` files go.
    pub render_dir: PathBuf,
    /// The minimum-healthy guard (applied to core's rules when the source
    /// is loaded: see [`Guard::apply`]).
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
    /// The last reload failed or was unverified.
    pub reload_failed: bool,
    /// The last render was rejected by the test command.
    pub rejected: bool,
    /// The last error, if the last attempt failed.
    pub last_error: Option<String>,
    /// Servers marked down in the files on disk (`upstream`, server text).
    pub marked: Vec<(String, String)>,
    /// Servers `max_ejected` (the guard) keeps up in the files on disk
    /// although they fail (`upstream`, server text).
    pub kept: Vec<(String, String)>,
    /// Upstreams where `max_ejected` (the guard) keeps failing servers up.
    pub guarded: Vec<String>,
    /// How every server is written in the files nginx last loaded (a
    /// verified reload), by (`upstream`, server text); None before the
    /// first verified reload.
    pub loaded: Option<BTreeMap<(String, String), Mark>>,
}

/// The blocks and the registry they render from, swapped together.
pub struct Snapshot {
    /// The source's blocks.
    pub blocks: Vec<Block>,
    /// The peer states.
    pub registry: Arc<Registry>,
    /// The clock core's rules are judged on.
    pub clock: Arc<dyn Clock>,
}

/// The loop's state.
pub struct Syncer {
    options: SyncOptions,
    nginx: Arc<dyn Nginx>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    status: Arc<Mutex<SyncStatus>>,
    /// Files as last applied (name → text).
    current: BTreeMap<String, String>,
    /// How each server is written in the files as last applied.
    applied: BTreeMap<(String, String), Mark>,
    /// A render the test rejected; not retried until something changes.
    failed: Option<BTreeMap<String, String>>,
    last_guarded: Vec<String>,
}

struct Desired {
    files: BTreeMap<String, String>,
    servers: BTreeMap<(String, String), Mark>,
    marked: Vec<(String, String)>,
    kept: Vec<(String, String)>,
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
            applied: BTreeMap::new(),
            failed: None,
            last_guarded: Vec::new(),
        })
    }

    fn update_status(&self, f: impl FnOnce(&mut SyncStatus)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }

    /// Render every block as core's rules say now ([`decide`]).
    fn desired(&self) -> Desired {
        let snap = self.snapshot.load_full();
        let now = snap.clock.now();
        let mut out = Desired {
            files: BTreeMap::new(),
            servers: BTreeMap::new(),
            marked: Vec::new(),
            kept: Vec::new(),
            guarded: Vec::new(),
        };
        for block in &snap.blocks {
            let marks = snap
                .registry
                .get(&block.name)
                .map(|up| decide(up, now))
                .unwrap_or_default();
            let r = render(block, &marks);
            let name = &block.name;
            out.marked
                .extend(r.marked.iter().map(|m| (name.clone(), m.clone())));
            out.kept
                .extend(r.kept.iter().map(|m| (name.clone(), m.clone())));
            if r.guarded() {
                out.guarded.push(name.clone());
            }
            for (text, mark) in r.servers {
                out.servers.insert((name.clone(), text), mark);
            }
            out.files.insert(name.clone(), r.text);
        }
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
                tracing::warn!(upstream = %name, "upstream {name}: more servers fail than max_ejected (the minimum-healthy guard) lets go; the least bad stay in nginx");
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
                s.rejected = true;
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
        self.applied = desired.servers;
        let owed = !changes.is_empty() || force;
        self.update_status(|s| {
            s.applied += 1;
            s.rejected = false;
            s.last_error = None;
            s.marked = desired.marked;
            s.kept = desired.kept;
            s.guarded = desired.guarded;
            s.reload_pending |= owed;
        });
        Ok(owed)
    }

    /// Reload nginx and verify; updates the status.
    pub async fn reload(&mut self) -> Result<(), SyncError> {
        match self.nginx.reload().await {
            Ok(()) => {
                tracing::info!("nginx reloaded (new workers seen)");
                let loaded = self.applied.clone();
                self.update_status(|s| {
                    s.reloads += 1;
                    s.reload_pending = false;
                    s.reload_failed = false;
                    s.last_error = None;
                    s.loaded = Some(loaded);
                });
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, "nginx reload failed; will retry");
                self.update_status(|s| {
                    s.reload_failures += 1;
                    s.reload_pending = true;
                    s.reload_failed = true;
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
