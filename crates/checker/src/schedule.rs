//! The scheduler: one probe loop per distinct target, shared by every peer
//! that names it; a global cap on probes in flight; an initial spread and
//! per-interval jitter so that probes do not fire in lockstep; reload that
//! keeps the loops (and, in core, the streaks) of unchanged targets.
//!
//! A loop runs its probes one after the other, so one target never has two
//! probes in flight; a probe that would start late (the cap was full) starts
//! when it can and the next one is planned from that start, so missed
//! probes are skipped, never queued.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vigil_core::health::{HealthState, ProbeReport};
use vigil_core::registry::Registry;
use vigil_core::Clock;

use crate::metrics::TargetStats;
use crate::probe::tls::{TlsCache, TlsPolicy};
use crate::probe::{NetProber, Prober, Target};
use crate::target::{plan, Member};
use crate::{CheckerError, Metrics, TargetKey};

/// Settings of the scheduler itself (the check settings come from each
/// upstream's `check`).
#[derive(Clone, Debug)]
pub struct CheckerOptions {
    /// Probes in flight at once, over all targets (default 256).
    pub max_concurrent: usize,
    /// Share one probe among all peers with the same address and check
    /// definition (default on). Off: one probe per peer (benchmarks).
    pub dedup: bool,
    /// Seed of the spread and jitter draws (default: random).
    pub seed: Option<u64>,
    /// Log every transition (default on; `vigil serve` logs them from the
    /// event bus instead).
    pub log_transitions: bool,
    /// TLS settings of `https` probes.
    pub tls: TlsPolicy,
    /// Probe every target of the first registry at once, up to `rise`
    /// times back to back while it passes (once for a peer that does not
    /// start down), before the regular schedule: see
    /// [`Checker::start_round`] (default off; `vigil serve` turns it on).
    pub start_round: bool,
    /// Who probes what, shared with other instances (the fleet,
    /// `crates/fleet`); default none: every target is probed here.
    pub sharing: Option<Arc<dyn Sharing>>,
}

/// The hook through which a fleet of instances shares the probing: it
/// chooses nothing about health (core does), only whether this instance
/// probes a target this round, and it hears every local result. Results
/// probed elsewhere come back in through [`Checker::record_remote`], the
/// same path a local result takes.
pub trait Sharing: Send + Sync + std::fmt::Debug {
    /// Whether this instance probes the target `id` ([`TargetKey::id`])
    /// now; asked before every regular probe (the start round probes
    /// every target).
    fn owns(&self, id: &str) -> bool;
    /// A probe of `id` ran here with this result (already recorded).
    fn probed(&self, id: &str, report: &ProbeReport);
}

/// What an [`Checker::update`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpdateSummary {
    /// Loops kept (with their streaks and schedule).
    pub kept: usize,
    /// Loops started.
    pub started: usize,
    /// Loops stopped.
    pub stopped: usize,
}

/// The running checker. Dropping it stops every probe loop.
pub struct Checker {
    shared: Arc<Shared>,
    root: CancellationToken,
    state: Mutex<State>,
    registry: ArcSwap<Registry>,
    tls_cache: TlsCache,
    dedup: bool,
    seed: Option<u64>,
    /// Whether the loops hear of exclusions (the event bus is subscribed once).
    subscribed: std::sync::OnceLock<()>,
    /// With [`CheckerOptions::start_round`]: loops still in their start
    /// round send here when done (or drop their end when cancelled).
    start_round: Mutex<Option<tokio::sync::mpsc::Receiver<()>>>,
    /// The senders' side, until the first registry's loops are spawned.
    start_round_tx: Mutex<Option<tokio::sync::mpsc::Sender<()>>>,
}

/// What the loops share.
struct Shared {
    prober: Arc<dyn Prober>,
    clock: Arc<dyn Clock>,
    permits: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    log_transitions: bool,
    /// Woken on every passive exclusion: under `passive_recovery probe` the
    /// loops probe an excluded peer when its exclusion ends.
    exclusions: Arc<tokio::sync::Notify>,
    sharing: Option<Arc<dyn Sharing>>,
}

struct State {
    loops: HashMap<TargetKey, Loop>,
    /// The members and the "probe now" bell of each loop by
    /// [`TargetKey::id`] (remote results, [`Checker::probe_now`]).
    by_id: HashMap<String, ById>,
    tls: TlsPolicy,
}

struct Loop {
    members: Arc<ArcSwap<Vec<Member>>>,
    now: Arc<tokio::sync::Notify>,
    cancel: CancellationToken,
}

#[derive(Clone)]
struct ById {
    members: Arc<ArcSwap<Vec<Member>>>,
    now: Arc<tokio::sync::Notify>,
}

// === impl CheckerOptions ===

impl Default for CheckerOptions {
    fn default() -> Self {
        Self {
            max_concurrent: 256,
            dedup: true,
            seed: None,
            log_transitions: true,
            tls: TlsPolicy::default(),
            start_round: false,
            sharing: None,
        }
    }
}

// === impl Checker ===

impl Checker {
    /// Start probing every checked peer of `registry` over the network.
    /// Must be called inside a tokio runtime.
    pub fn start(
        registry: Arc<Registry>,
        clock: Arc<dyn Clock>,
        options: CheckerOptions,
    ) -> Result<Self, CheckerError> {
        Self::with_prober(registry, clock, options, Arc::new(NetProber))
    }

    /// [`Checker::start`] with another prober (tests, simulations).
    pub fn with_prober(
        registry: Arc<Registry>,
        clock: Arc<dyn Clock>,
        options: CheckerOptions,
        prober: Arc<dyn Prober>,
    ) -> Result<Self, CheckerError> {
        let checker = Self {
            shared: Arc::new(Shared {
                prober,
                clock,
                permits: Arc::new(Semaphore::new(options.max_concurrent.max(1))),
                metrics: Arc::new(Metrics::default()),
                log_transitions: options.log_transitions,
                exclusions: Arc::new(tokio::sync::Notify::new()),
                sharing: options.sharing,
            }),
            root: CancellationToken::new(),
            state: Mutex::new(State {
                loops: HashMap::new(),
                by_id: HashMap::new(),
                tls: options.tls,
            }),
            registry: ArcSwap::new(registry.clone()),
            tls_cache: TlsCache::default(),
            dedup: options.dedup,
            seed: options.seed,
            subscribed: std::sync::OnceLock::new(),
            start_round: Mutex::new(None),
            start_round_tx: Mutex::new(None),
        };
        if options.start_round {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            if let (Ok(mut t), Ok(mut r)) =
                (checker.start_round_tx.lock(), checker.start_round.lock())
            {
                (*t, *r) = (Some(tx), Some(rx));
            }
        }
        checker.update(registry)?;
        // Loops of later registries (reloads) keep the regular schedule.
        if let Ok(mut tx) = checker.start_round_tx.lock() {
            *tx = None;
        }
        Ok(checker)
    }

    /// Follow a reloaded registry: loops of unchanged targets keep running
    /// (their peers now the new registry's, which core built with the old
    /// streaks), removed targets stop, new ones start.
    pub fn update(&self, registry: Arc<Registry>) -> Result<UpdateSummary, CheckerError> {
        self.hear_exclusions(&registry);
        let tls = match self.state.lock() {
            Ok(s) => s.tls.clone(),
            Err(_) => TlsPolicy::default(),
        };
        self.update_with_tls(registry, tls)
    }

    /// Subscribe to the registry's event bus (one bus across reloads) so that
    /// the loops learn of passive exclusions as they happen.
    fn hear_exclusions(&self, registry: &Registry) {
        let Some(first) = registry.upstreams().first() else {
            return;
        };
        self.subscribed.get_or_init(|| {
            let notify = Arc::downgrade(&self.shared.exclusions);
            first.events().subscribe(move |e| {
                if matches!(e.kind, vigil_core::event::EventKind::Excluded { .. }) {
                    if let Some(n) = notify.upgrade() {
                        n.notify_waiters();
                    }
                }
            });
        });
    }

    /// [`Checker::update`] with new TLS settings.
    pub fn update_with_tls(
        &self,
        registry: Arc<Registry>,
        tls: TlsPolicy,
    ) -> Result<UpdateSummary, CheckerError> {
        let planned = plan(&registry, self.dedup, &tls, &self.tls_cache)?;
        let Ok(mut state) = self.state.lock() else {
            return Ok(UpdateSummary::default());
        };
        let mut summary = UpdateSummary::default();
        let mut loops = HashMap::with_capacity(planned.len());
        let mut keys = HashSet::with_capacity(planned.len());
        let mut by_id = HashMap::with_capacity(planned.len());
        for p in planned {
            keys.insert(p.key.clone());
            if let Some(l) = state.loops.remove(&p.key) {
                l.members.store(Arc::new(p.members));
                by_id.insert(
                    p.key.id(),
                    ById {
                        members: l.members.clone(),
                        now: l.now.clone(),
                    },
                );
                loops.insert(p.key, l);
                summary.kept += 1;
                continue;
            }
            let members = Arc::new(ArcSwap::from_pointee(p.members));
            let cancel = self.root.child_token();
            let stats = self.shared.metrics.target(&p.key);
            let rng = self.rng(&p.key);
            let start_round = self
                .start_round_tx
                .lock()
                .ok()
                .and_then(|tx| tx.as_ref().cloned());
            let now = Arc::new(tokio::sync::Notify::new());
            by_id.insert(
                p.key.id(),
                ById {
                    members: members.clone(),
                    now: now.clone(),
                },
            );
            tokio::spawn(probe_loop(
                self.shared.clone(),
                (p.key.id(), p.target),
                (members.clone(), now.clone()),
                stats,
                cancel.clone(),
                rng,
                start_round,
            ));
            loops.insert(
                p.key,
                Loop {
                    members,
                    now,
                    cancel,
                },
            );
            summary.started += 1;
        }
        for (_, l) in state.loops.drain() {
            l.cancel.cancel();
            summary.stopped += 1;
        }
        state.loops = loops;
        state.by_id = by_id;
        state.tls = tls;
        self.shared.metrics.retain(&keys);
        self.registry.store(registry);
        Ok(summary)
    }

    fn rng(&self, key: &TargetKey) -> StdRng {
        match self.seed {
            Some(seed) => {
                let mut h = DefaultHasher::new();
                key.hash(&mut h);
                StdRng::seed_from_u64(seed ^ h.finish())
            }
            None => StdRng::from_rng(&mut rand::rng()),
        }
    }

    /// The registry being probed.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.load_full()
    }

    /// Probe counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// Distinct targets being probed.
    pub fn targets(&self) -> usize {
        self.state.lock().map_or(0, |s| s.loops.len())
    }

    /// Every target's key, in no particular order.
    pub fn target_keys(&self) -> Vec<TargetKey> {
        self.state
            .lock()
            .map_or_else(|_| Vec::new(), |s| s.loops.keys().cloned().collect())
    }

    /// Record a result that another instance probed (see [`Sharing`]) into
    /// every peer of the target `id`, exactly as a local result is recorded
    /// (rise/fall, events), as of now on this checker's clock (`report.at`
    /// is replaced: another process's clock means nothing here). Returns
    /// whether `id` is a target here.
    pub fn record_remote(&self, id: &str, mut report: ProbeReport) -> bool {
        report.at = self.shared.clock.now();
        let members = match self.state.lock() {
            Ok(s) => s.by_id.get(id).map(|b| b.members.clone()),
            Err(_) => None,
        };
        let Some(members) = members else {
            return false;
        };
        for m in members.load().iter() {
            record(&self.shared, m, report.clone());
        }
        true
    }

    /// Whether `id` is a target here (a peer it probes).
    pub fn has_target(&self, id: &str) -> bool {
        self.state.lock().is_ok_and(|s| s.by_id.contains_key(id))
    }

    /// Probe the target `id` as soon as its loop is free, whoever owns it
    /// (a fleet member heard that another ejected the peer passively), and
    /// go on with the regular schedule after. Returns whether `id` is a
    /// target here.
    pub fn probe_now(&self, id: &str) -> bool {
        let bell = match self.state.lock() {
            Ok(s) => s.by_id.get(id).map(|b| b.now.clone()),
            Err(_) => None,
        };
        match bell {
            Some(b) => {
                b.notify_one();
                true
            }
            None => false,
        }
    }

    /// The id of the target that probes peer `peer` (its address as
    /// configured) of upstream `upstream`, if it has a check.
    pub fn target_of(&self, upstream: &str, peer: &str) -> Option<String> {
        let s = self.state.lock().ok()?;
        s.by_id.iter().find_map(|(id, b)| {
            b.members
                .load()
                .iter()
                .any(|m| {
                    &**m.upstream.name() == upstream
                        && m.upstream
                            .peers()
                            .get(m.peer.0 as usize)
                            .is_some_and(|p| &**p.name() == peer)
                })
                .then(|| id.clone())
        })
    }

    /// Wait, at most `within`, until every target of the first registry has
    /// had its start round ([`CheckerOptions::start_round`]): a peer whose
    /// check passed `rise` times in a row is up when this returns. Returns
    /// whether every round finished in time (a later call, or a checker
    /// without the option, returns `true` at once).
    pub async fn start_round(&self, within: Duration) -> bool {
        let rx = self.start_round.lock().ok().and_then(|mut g| g.take());
        let Some(mut rx) = rx else {
            return true;
        };
        // Every sender is a loop's; the channel closes when the last one
        // is done (sent, or cancelled).
        tokio::time::timeout(within, async { while rx.recv().await.is_some() {} })
            .await
            .is_ok()
    }

    /// Stop every probe loop.
    pub fn shutdown(&self) {
        self.root.cancel();
    }
}

impl Drop for Checker {
    fn drop(&mut self) {
        self.root.cancel();
    }
}

impl std::fmt::Debug for Checker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker")
            .field("targets", &self.targets())
            .finish()
    }
}

/// A uniform draw in `[0, d)`.
fn below(rng: &mut StdRng, d: Duration) -> Duration {
    let n = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    if n == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(rng.random_range(0..n))
}

/// A uniform draw in `[0, d]`.
fn up_to(rng: &mut StdRng, d: Duration) -> Duration {
    let n = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.random_range(0..=n))
}

/// The loop of one target, named by its [`TargetKey::id`].
async fn probe_loop(
    shared: Arc<Shared>,
    (id, target): (String, Arc<Target>),
    (members, now): (Arc<ArcSwap<Vec<Member>>>, Arc<tokio::sync::Notify>),
    stats: Arc<TargetStats>,
    cancel: CancellationToken,
    mut rng: StdRng,
    start_round: Option<tokio::sync::mpsc::Sender<()>>,
) {
    if let Some(done) = start_round {
        // Up to `rise` probes back to back (those a peer that starts down
        // needs to come up), stopping at the first failure.
        let rounds = members
            .load()
            .iter()
            .filter_map(|m| m.upstream.peers().get(m.peer.0 as usize))
            .filter_map(|p| p.health().policy())
            .map(|p| {
                if p.initial == vigil_core::config::InitialState::Down {
                    p.rise.max(1)
                } else {
                    1
                }
            })
            .max()
            .unwrap_or(1);
        for _ in 0..rounds {
            let Some((ok, _, _)) =
                probe_once(&shared, &id, &target, &members, &stats, &cancel).await
            else {
                return;
            };
            if !ok {
                break;
            }
        }
        // The receiver may be gone (nobody waits): nothing to tell.
        let _ = done.try_send(());
    }
    // tengine fires the first probe at a random point of the first
    // interval; so does vigil (after the start round, if any).
    let mut next = Instant::now() + below(&mut rng, target.interval);
    // Core time of the last probe's start: a recovery probe is wanted only
    // for an exclusion that ends after it (else the interval rules).
    let mut last = vigil_core::Timestamp(0);
    loop {
        let wake = recovery_due(&shared, &members.load(), last).map_or(next, |at| at.min(next));
        let asked = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            // A new exclusion: plan again (its end may come before `next`).
            _ = shared.exclusions.notified() => continue,
            _ = now.notified() => true,
            _ = tokio::time::sleep_until(wake) => false,
        };
        if !asked && shared.sharing.as_ref().is_some_and(|s| !s.owns(&id)) {
            // Another instance probes it this round; its results come in
            // through `record_remote`. Ask again at the next round.
            next = Instant::now() + target.interval + up_to(&mut rng, target.jitter);
            continue;
        }
        let Some((_, started, at)) =
            probe_once(&shared, &id, &target, &members, &stats, &cancel).await
        else {
            return;
        };
        last = at;
        next = (started + target.interval + up_to(&mut rng, target.jitter)).max(Instant::now());
    }
}

/// One probe of `target` (waiting for a permit first), recorded into every
/// member: whether it passed, and when it started on tokio's and core's
/// clocks. `None` when cancelled.
async fn probe_once(
    shared: &Shared,
    id: &str,
    target: &Target,
    members: &ArcSwap<Vec<Member>>,
    stats: &TargetStats,
    cancel: &CancellationToken,
) -> Option<(bool, Instant, vigil_core::Timestamp)> {
    let permit = tokio::select! {
        biased;
        _ = cancel.cancelled() => return None,
        p = shared.permits.clone().acquire_owned() => p.ok()?,
    };
    let started = Instant::now();
    let at = shared.clock.now();
    let result = tokio::select! {
        biased;
        _ = cancel.cancelled() => return None,
        r = shared.prober.probe(target) => r,
    };
    drop(permit);
    let latency = started.elapsed();
    let (ok, phase, detail) = match result {
        Ok(d) => (true, None, d),
        Err(f) => (false, Some(f.phase()), f.detail().to_string()),
    };
    stats.record(phase, latency);
    let report = ProbeReport {
        ok,
        phase,
        latency,
        detail,
        at: shared.clock.now(),
    };
    for m in members.load().iter() {
        record(shared, m, report.clone());
    }
    if let Some(s) = &shared.sharing {
        s.probed(id, &report);
    }
    Some((ok, started, at))
}

/// When the earliest recovery probe of `members` is due (`passive_recovery
/// probe`: at the end of a peer's exclusion, if that is after the last
/// probe), on tokio's clock.
fn recovery_due(
    shared: &Shared,
    members: &[Member],
    last: vigil_core::Timestamp,
) -> Option<Instant> {
    let at = members
        .iter()
        .flat_map(|m| {
            m.upstream
                .probes_wanted()
                .into_iter()
                .filter(move |w| w.peer == m.peer)
        })
        .map(|w| w.at)
        .filter(|at| *at > last)
        .min()?;
    let wait = at.0.saturating_sub(shared.clock.now().0);
    Some(Instant::now() + Duration::from_millis(wait))
}

/// Record one result into one peer; a transition is one log line.
fn record(shared: &Shared, m: &Member, report: ProbeReport) {
    let cause = match report.phase {
        Some(phase) => format!(
            "{phase}: {} ({} ms)",
            report.detail,
            report.latency.as_millis()
        ),
        None => format!("{} ({} ms)", report.detail, report.latency.as_millis()),
    };
    let Some(t) = m.upstream.record_probe(m.peer, report) else {
        return;
    };
    shared.metrics.transition(t.to == HealthState::Up);
    if !shared.log_transitions {
        return;
    }
    let server = m
        .upstream
        .peers()
        .get(m.peer.0 as usize)
        .map(|p| p.name().clone())
        .unwrap_or_else(|| "?".into());
    let upstream = m.upstream.name();
    let what = if t.to == HealthState::Up {
        "passes"
    } else {
        "failures"
    };
    let line = format!(
        "upstream {upstream} server {server}: {} -> {} after {} {what}: {cause}",
        t.from, t.to, t.streak
    );
    if t.to == HealthState::Down {
        tracing::warn!(target: "vigil::checker", %upstream, %server, from = %t.from, to = %t.to, streak = t.streak, %cause, "{line}");
    } else {
        tracing::info!(target: "vigil::checker", %upstream, %server, from = %t.from, to = %t.to, streak = t.streak, %cause, "{line}");
    }
}
