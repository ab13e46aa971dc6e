//! The sync loop: render every block from the current peer states, and
//! when the files would change, write them (atomically, keeping the
//! previous ones), test, and reload; a failed or unverified reload is
//! retried with exponential backoff.
//!
//! When a render takes a server out of nginx (a server nginx serves is
//! now rendered ` down`), it is written, tested and reloaded at once,
//! bounded only by [`SyncOptions::down_reload_interval`] since the previous
//! reload: every request nginx sends there meanwhile fails. Anything else
//! (servers coming back, comment changes, source changes) waits for the
//! debounce and [`SyncOptions::min_reload_interval`], so a flapping server
//! cannot make nginx reload over and over: it is taken out at most once
//! per time it was let back in, and it is let back in at most once per
//! `min_reload_interval`. Every step is an event on core's bus (`render`,
//! `reload`, `reload_failed`, `rollback`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_core::api::NginxSyncView;
use vigil_core::event::{Event, EventBus, EventKind, Timing};
use vigil_core::registry::Registry;
use vigil_core::Clock;

use super::files::{self, Change};
use super::render::{decide, render, Mark};
use super::source::{Block, Line};
use super::{Guard, Nginx, SyncError};

/// Timing and safety settings of the sync loop.
#[derive(Clone, Debug)]
pub struct SyncOptions {
    /// Where `NAME.conf` files go.
    pub render_dir: PathBuf,
    /// The minimum-healthy guard (applied to core's rules when the source
    /// is loaded: see [`Guard::apply`]).
    pub guard: Guard,
    /// Quiet time after the last transition before rendering a change that
    /// takes no server out (default 1s).
    pub debounce: Duration,
    /// Longest a burst may delay such a render (default 5s).
    pub max_delay: Duration,
    /// Least time between a reload and the next one, unless the next takes
    /// a server out (default 5s).
    pub min_reload_interval: Duration,
    /// Least time between a reload and the next one when the next takes a
    /// server out of nginx; such a render does not wait for the debounce
    /// (default 1s; at most `min_reload_interval`). Both intervals count
    /// from the end of the previous reload (its verification).
    pub down_reload_interval: Duration,
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
    /// When nginx last reloaded (verified), ms since the epoch.
    pub last_reload_unix_ms: Option<u64>,
    /// When a reload last failed, ms since the epoch.
    pub last_failure_unix_ms: Option<u64>,
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
    events: Option<Arc<EventBus>>,
    /// Files as last applied (name → text).
    current: BTreeMap<String, String>,
    /// How each server is written in the files as last applied.
    applied: BTreeMap<(String, String), Mark>,
    /// Files applied since the last verified reload.
    unloaded: BTreeSet<String>,
    /// A render the test rejected; not retried until something changes.
    failed: Option<BTreeMap<String, String>>,
    last_guarded: Vec<String>,
}

/// What a render owes nginx.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owed {
    /// It takes a server out: at once.
    AtOnce,
    /// Anything else: after the debounce.
    Debounced,
}

struct Desired {
    files: BTreeMap<String, String>,
    servers: BTreeMap<(String, String), Mark>,
    /// The peer each server line is (for events).
    names: BTreeMap<(String, String), Arc<str>>,
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
            down_reload_interval: Duration::from_secs(1),
            poll: Duration::from_secs(1),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
        }
    }
}

// === impl SyncStatus ===

impl SyncStatus {
    /// The admin API's view (`vigil status`).
    pub fn view(&self) -> NginxSyncView {
        NginxSyncView {
            reloads: self.reloads,
            reload_failures: self.reload_failures,
            renders_rejected: self.test_failures,
            reload_pending: self.reload_pending,
            reload_failed: self.reload_failed,
            render_rejected: self.rejected,
            last_error: self.last_error.clone(),
            last_reload_unix_ms: self.last_reload_unix_ms,
            last_failure_unix_ms: self.last_failure_unix_ms,
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
            events: None,
            current,
            applied: BTreeMap::new(),
            unloaded: BTreeSet::new(),
            failed: None,
            last_guarded: Vec::new(),
        })
    }

    /// Publish renders, reloads, failed reloads and rollbacks on `events`
    /// (they are logged either way).
    pub fn with_events(mut self, events: Arc<EventBus>) -> Self {
        self.events = Some(events);
        self
    }

    fn update_status(&self, f: impl FnOnce(&mut SyncStatus)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }

    /// Log `kind` and publish it, if there is a bus.
    fn publish(&self, upstream: &str, peer: &str, kind: EventKind) {
        let name = kind.name();
        match &kind {
            EventKind::ReloadFailed { .. } | EventKind::Rollback { .. } => {
                tracing::error!(upstream, peer, event = name, "{kind}")
            }
            k if k.is_warning() => tracing::warn!(upstream, peer, event = name, "{kind}"),
            _ => tracing::info!(upstream, peer, event = name, "{kind}"),
        }
        let Some(bus) = &self.events else {
            return;
        };
        let clock = &self.snapshot.load().clock;
        let at = clock.now();
        bus.publish(Event {
            seq: 0,
            at,
            unix_ms: clock.unix_ms(at),
            upstream: upstream.into(),
            peer: peer.into(),
            kind,
        });
    }

    /// Render every block as core's rules say now ([`decide`]).
    fn desired(&self) -> Desired {
        let snap = self.snapshot.load_full();
        let now = snap.clock.now();
        let mut out = Desired {
            files: BTreeMap::new(),
            servers: BTreeMap::new(),
            names: BTreeMap::new(),
            marked: Vec::new(),
            kept: Vec::new(),
            guarded: Vec::new(),
        };
        for block in &snap.blocks {
            let up = snap.registry.get(&block.name);
            let marks = up.map(|up| decide(up, now)).unwrap_or_default();
            let r = render(block, &marks);
            let name = &block.name;
            out.marked
                .extend(r.marked.iter().map(|m| (name.clone(), m.clone())));
            out.kept
                .extend(r.kept.iter().map(|m| (name.clone(), m.clone())));
            if r.guarded() {
                out.guarded.push(name.clone());
            }
            let peers = block.lines.iter().filter_map(|l| match l {
                Line::Server { peer, .. } => Some(*peer),
                Line::Other(_) => None,
            });
            for (peer, (text, mark)) in peers.zip(r.servers) {
                let key = (name.clone(), text);
                if let Some(p) = up.and_then(|u| u.peers().get(peer.0 as usize)) {
                    out.names.insert(key.clone(), p.name().clone());
                }
                out.servers.insert(key, mark);
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

    /// What a render now would owe nginx (None: nothing to render).
    fn owed(&self) -> Option<Owed> {
        let d = self.desired();
        if self.changes(&d.files).is_empty() || self.failed.as_ref() == Some(&d.files) {
            return None;
        }
        Some(if self.takes_out(&d) {
            Owed::AtOnce
        } else {
            Owed::Debounced
        })
    }

    /// Whether `d` marks down a server the files as applied do not.
    fn takes_out(&self, d: &Desired) -> bool {
        d.servers.iter().any(|(k, m)| {
            matches!(m, Mark::Down(_)) && !matches!(self.applied.get(k), Some(Mark::Down(_)))
        })
    }

    /// Write what changed and test it. `Ok(true)`: files changed and passed.
    /// With `force`, the test runs even when nothing changed.
    pub async fn converge(&mut self, force: bool) -> Result<bool, SyncError> {
        self.converge_as(force, Timing::Startup).await
    }

    async fn converge_as(&mut self, force: bool, timing: Timing) -> Result<bool, SyncError> {
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
        let names: Vec<String> = changes.iter().map(|c| format!("{}.conf", c.name)).collect();
        files::apply(&dir, &changes)?;
        if let Err(e) = self.nginx.test().await {
            files::rollback(&dir, &changes);
            self.failed = Some(desired.files);
            self.publish(
                "",
                "",
                EventKind::Rollback {
                    files: names,
                    error: e.to_string(),
                },
            );
            self.update_status(|s| {
                s.test_failures += 1;
                s.rejected = true;
                s.last_error = Some(e.to_string());
            });
            return Err(e);
        }
        self.publish_renders(&changes, &desired, timing);
        self.unloaded.extend(names);
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

    /// A `render` event per server line whose mark changed, and per file
    /// created, removed or changed otherwise.
    fn publish_renders(&self, changes: &[Change], desired: &Desired, timing: Timing) {
        for c in changes {
            let file = format!("{}.conf", c.name);
            let whole = |note: &str| EventKind::Render {
                file: file.clone(),
                given: None,
                note: note.into(),
                timing,
            };
            let Some(_) = &c.new else {
                self.publish(&c.name, "", whole("removed (no longer in the source)"));
                continue;
            };
            let mut servers = 0;
            for (key, mark) in desired.servers.range((c.name.clone(), String::new())..) {
                if key.0 != c.name {
                    break;
                }
                let before = self.applied.get(key);
                if before == Some(mark) || (before.is_none() && *mark == Mark::AsWritten) {
                    continue;
                }
                servers += 1;
                let note = match (mark, before) {
                    (Mark::AsWritten, Some(Mark::Down(_))) => "no longer marked `down`",
                    (Mark::AsWritten, Some(Mark::Kept(_))) => "no longer failing",
                    (m, _) => m.note().unwrap_or(""),
                };
                let peer = desired.names.get(key).map(|n| &**n).unwrap_or(&key.1);
                self.publish(
                    &c.name,
                    peer,
                    EventKind::Render {
                        file: file.clone(),
                        given: Some(mark.given()),
                        note: note.into(),
                        timing,
                    },
                );
            }
            if c.old.is_none() {
                self.publish(&c.name, "", whole("written"));
            } else if servers == 0 {
                self.publish(&c.name, "", whole("rewritten (the source changed)"));
            }
        }
    }

    /// Reload nginx and verify; updates the status.
    pub async fn reload(&mut self) -> Result<(), SyncError> {
        let retry = self.options.retry_min;
        self.reload_as(Timing::Startup, retry).await
    }

    /// Reload; `retry` is when the loop tries again if this fails.
    async fn reload_as(&mut self, timing: Timing, retry: Duration) -> Result<(), SyncError> {
        let started = Instant::now();
        let result = self.nginx.reload().await;
        let clock = self.snapshot.load().clock.clone();
        let at = clock.unix_ms(clock.now());
        let files: Vec<String> = self.unloaded.iter().cloned().collect();
        match result {
            Ok(()) => {
                let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                self.unloaded.clear();
                self.publish(
                    "",
                    "",
                    EventKind::Reload {
                        files,
                        took_ms,
                        timing,
                    },
                );
                let loaded = self.applied.clone();
                self.update_status(|s| {
                    s.reloads += 1;
                    s.reload_pending = false;
                    s.reload_failed = false;
                    s.last_error = None;
                    s.last_reload_unix_ms = Some(at);
                    s.loaded = Some(loaded);
                });
                Ok(())
            }
            Err(e) => {
                self.publish(
                    "",
                    "",
                    EventKind::ReloadFailed {
                        files,
                        error: e.to_string(),
                        retry_ms: u64::try_from(retry.as_millis()).unwrap_or(u64::MAX),
                    },
                );
                self.update_status(|s| {
                    s.reload_failures += 1;
                    s.reload_pending = true;
                    s.reload_failed = true;
                    s.last_error = Some(e.to_string());
                    s.last_failure_unix_ms = Some(at);
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
        let mut o = self.options.clone();
        o.down_reload_interval = o.down_reload_interval.min(o.min_reload_interval);
        let mut backoff = o.retry_min;
        let mut retry_at: Option<Instant> = reload_pending.then(|| Instant::now() + backoff);
        let mut retrying = reload_pending;
        let mut last_reload: Option<Instant> = None;
        // The owed reload takes a server out of nginx.
        let mut owed_out = false;
        // The first and the latest transition of what is not rendered yet.
        let mut burst: Option<(Instant, Instant)> = None;
        // No render before this (after a render that could not be written).
        let mut hold: Option<Instant> = None;
        let after = |last: Option<Instant>, gap: Duration, now: Instant| {
            last.map_or(now, |l| (l + gap).max(now))
        };
        loop {
            let now = Instant::now();
            let owed = self.owed();
            if owed.is_none() {
                burst = None;
            }
            let render_at = owed.map(|k| {
                let (first, last) = *burst.get_or_insert((now, now));
                let at = match k {
                    Owed::AtOnce => after(last_reload, o.down_reload_interval, now),
                    Owed::Debounced => (last + o.debounce).min(first + o.max_delay).max(after(
                        last_reload,
                        o.min_reload_interval,
                        now,
                    )),
                };
                hold.map_or(at, |h| h.max(at))
            });
            if let (Some(at), Some(k)) = (render_at, owed) {
                if at <= now {
                    burst = None;
                    let timing = match k {
                        Owed::AtOnce => Timing::AtOnce,
                        Owed::Debounced => Timing::Debounced,
                    };
                    match self.converge_as(false, timing).await {
                        Ok(true) => {
                            hold = None;
                            reload_pending = true;
                            owed_out |= k == Owed::AtOnce;
                            retry_at = None;
                            retrying = false;
                            backoff = o.retry_min;
                        }
                        // Not written (a file error): try again later, not
                        // in a busy loop. A rejected render is not retried
                        // until something changes (`failed`).
                        _ => hold = Some(Instant::now() + o.retry_min),
                    }
                    continue;
                }
            }
            let gap = if owed_out {
                o.down_reload_interval
            } else {
                o.min_reload_interval
            };
            let reload_at = reload_pending.then(|| {
                let t = after(last_reload, gap, now);
                retry_at.map_or(t, |r| r.max(t))
            });
            if reload_at.is_some_and(|t| t <= now) {
                let timing = if retrying {
                    Timing::Retry
                } else if owed_out {
                    Timing::AtOnce
                } else {
                    Timing::Debounced
                };
                let result = self.reload_as(timing, backoff.max(gap)).await;
                // Counted from the end of a reload (nginx's new workers
                // seen), so a slow reload spaces the next one further.
                last_reload = Some(Instant::now());
                match result {
                    Ok(()) => {
                        reload_pending = false;
                        owed_out = false;
                        retrying = false;
                        retry_at = None;
                        backoff = o.retry_min;
                    }
                    Err(_) => {
                        retrying = true;
                        retry_at = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(o.retry_max);
                    }
                }
                continue;
            }
            let next = render_at.into_iter().chain(reload_at).min();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = wake.notified() => {
                    if let Some(b) = burst.as_mut() {
                        b.1 = Instant::now();
                    }
                }
                _ = tokio::time::sleep(o.poll) => {}
                _ = tokio::time::sleep_until(next.unwrap_or(now)), if next.is_some() => {}
            }
        }
    }
}
