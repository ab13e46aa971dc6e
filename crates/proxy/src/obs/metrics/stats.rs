//! The atomics behind the metrics: per upstream (requests by status class,
//! retries, the duration histogram) and per peer (attempts by outcome,
//! failures counted, exclusions). Label values are shared `Arc<str>`s made
//! once, when a generation is attached; recording is a `fetch_add`.
//!
//! What every request writes (its status class, its duration's bucket and
//! sum, its attempt's outcome) is kept per worker ([`PerWorker`]): each
//! worker adds to counters on cache lines of its own, and a scrape reads
//! their sums. Counters shared by all workers had two workers move the
//! same lines between their cores on every request. The rest (retries,
//! failures, exclusions: a request that goes well writes none of them)
//! stays one atomic each.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use vigil_core::peer::PeerId;
use vigil_core::upstream::{Accounting, CountRule};
use vigil_core::{FailureClass, RetryDenied, Upstream};

/// Upper bounds of the request-duration buckets, in seconds (the last,
/// 60 s, is nginx's default `proxy_read_timeout`).
pub(crate) const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
];

/// The status classes of `vigil_requests_total`.
pub(crate) const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// What one attempt came to: `ok` or one of nginx's failure classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A response header with a status `proxy_next_upstream` cannot name.
    Ok,
    /// A transport failure, or a header whose status has a class.
    Failed(FailureClass),
}

/// Counters of one upstream in one generation: its own totals (shared
/// with the previous generation when the upstream kept its name) and one
/// entry per peer, indexed by [`PeerId`].
pub(crate) struct UpstreamStats {
    pub(crate) totals: Arc<UpstreamTotals>,
    pub(crate) peers: Box<[Arc<PeerStats>]>,
}

/// Per-upstream counters.
pub(crate) struct UpstreamTotals {
    /// The `upstream` label value.
    pub(crate) name: Arc<str>,
    /// Requests by status class ([`REQUESTS`]), non-cumulative counts per
    /// bucket of [`BUCKETS`] then the overflow ([`HISTOGRAM`]), and the
    /// sum of the durations in µs ([`SUM_US`]).
    per_request: PerWorker<{ SUM_US + 1 }>,
    pub(crate) retries: AtomicU64,
    pub(crate) no_live: AtomicU64,
    /// Hedges sent (`hedge`).
    pub(crate) hedges: AtomicU64,
    /// Retries and hedges core denied, by [`RetryDenied::index`].
    pub(crate) denied: [AtomicU64; RetryDenied::ALL.len()],
}

/// Per-peer counters.
pub(crate) struct PeerStats {
    /// The address as configured (what events name).
    pub(crate) addr: Arc<str>,
    /// The `peer` label value (the address, `#N` on a repeated one).
    pub(crate) peer: Arc<str>,
    /// The `upstream` label value.
    pub(crate) upstream: Arc<str>,
    /// By [`Outcome::index`].
    attempts: PerWorker<{ Outcome::ALL.len() }>,
    /// By [`FailureClass`] order.
    pub(crate) counted: [AtomicU64; 10],
    /// Of those, charged by a vigil-only `passive_count` rule, by
    /// [`rule_index`] ([`super::render::COUNT_RULES`] order).
    pub(crate) by_rule: [AtomicU64; 2],
    pub(crate) exclusions: AtomicU64,
    /// By [`super::render::EJECTION_RULES`] order.
    pub(crate) ejections: [AtomicU64; 4],
}

/// Where [`UpstreamTotals`]'s per-request counters start: the status
/// classes, the histogram's buckets (and overflow), the duration sum.
const REQUESTS: usize = 0;
const HISTOGRAM: usize = REQUESTS + STATUS_CLASSES.len();
const SUM_US: usize = HISTOGRAM + BUCKETS.len() + 1;

/// `N` counters per worker ([`crate::conn::shard`]), each worker's on cache
/// lines of its own; read as their sums.
pub(crate) struct PerWorker<const N: usize> {
    shards: Box<[CachePadded<[AtomicU64; N]>]>,
}

// === impl PerWorker ===

impl<const N: usize> PerWorker<N> {
    fn new() -> Self {
        Self {
            shards: (0..crate::conn::shard::count())
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// This worker's counters (looked up once for several adds).
    fn mine(&self) -> Option<&[AtomicU64; N]> {
        crate::conn::shard::of(&self.shards).map(|s| &**s)
    }

    /// Add `n` to counter `i` of this worker's.
    fn add(&self, i: usize, n: u64) {
        if let Some(mine) = self.mine() {
            add_to(mine, i, n);
        }
    }

    /// Counter `i`, over all workers.
    pub(crate) fn get(&self, i: usize) -> u64 {
        self.shards
            .iter()
            .filter_map(|s| s.get(i))
            .fold(0, |sum, c| sum.wrapping_add(c.load(Ordering::Relaxed)))
    }
}

/// Add `n` to counter `i` of a worker's (from [`PerWorker::mine`]).
fn add_to(counters: &[AtomicU64], i: usize, n: u64) {
    if let Some(c) = counters.get(i) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

// === impl Outcome ===

impl Outcome {
    /// Every outcome, in [`Outcome::index`] order.
    pub(crate) const ALL: [Outcome; 11] = [
        Outcome::Ok,
        Outcome::Failed(FailureClass::Error),
        Outcome::Failed(FailureClass::Timeout),
        Outcome::Failed(FailureClass::InvalidHeader),
        Outcome::Failed(FailureClass::Http500),
        Outcome::Failed(FailureClass::Http502),
        Outcome::Failed(FailureClass::Http503),
        Outcome::Failed(FailureClass::Http504),
        Outcome::Failed(FailureClass::Http403),
        Outcome::Failed(FailureClass::Http404),
        Outcome::Failed(FailureClass::Http429),
    ];

    /// The outcome of a response header with `status`.
    pub(crate) fn of_status(status: u16) -> Self {
        FailureClass::of_status(status).map_or(Outcome::Ok, Outcome::Failed)
    }

    /// Position in [`Outcome::ALL`].
    pub(crate) fn index(self) -> usize {
        match self {
            Outcome::Ok => 0,
            Outcome::Failed(c) => 1 + class_index(c),
        }
    }

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed(c) => c.as_str(),
        }
    }
}

/// Position of `class` in [`FailureClass::ALL`].
pub(crate) fn class_index(class: FailureClass) -> usize {
    match class {
        FailureClass::Error => 0,
        FailureClass::Timeout => 1,
        FailureClass::InvalidHeader => 2,
        FailureClass::Http500 => 3,
        FailureClass::Http502 => 4,
        FailureClass::Http503 => 5,
        FailureClass::Http504 => 6,
        FailureClass::Http403 => 7,
        FailureClass::Http404 => 8,
        FailureClass::Http429 => 9,
    }
}

// === impl UpstreamStats ===

impl UpstreamStats {
    /// Counters for `up`, reusing `old`'s totals and the counters of every
    /// peer whose label is unchanged.
    pub(crate) fn build(up: &Upstream, old: Option<&UpstreamStats>) -> Self {
        let totals = old.map_or_else(
            || Arc::new(UpstreamTotals::new(up.name().clone())),
            |o| o.totals.clone(),
        );
        let kept: HashMap<&str, &Arc<PeerStats>> = old
            .map(|o| o.peers.iter().map(|p| (&*p.peer, p)).collect())
            .unwrap_or_default();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let peers = up
            .peers()
            .iter()
            .map(|p| {
                let n = seen.entry(&**p.name()).or_insert(0);
                *n += 1;
                let peer: Arc<str> = if *n == 1 {
                    p.name().clone()
                } else {
                    format!("{}#{n}", p.name()).into()
                };
                match kept.get(&*peer) {
                    Some(s) => Arc::clone(s),
                    None => Arc::new(PeerStats::new(up.name().clone(), p.name().clone(), peer)),
                }
            })
            .collect();
        Self { totals, peers }
    }

    /// A client request finished with `status` after `elapsed`.
    pub(crate) fn request(&self, status: u16, elapsed: Duration) {
        let Some(t) = self.totals.per_request.mine() else {
            return;
        };
        let add = |i: usize, n: u64| add_to(t, i, n);
        let class = usize::from((status / 100).clamp(1, 5) - 1);
        add(REQUESTS + class, 1);
        let secs = elapsed.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(BUCKETS.len());
        add(HISTOGRAM + i, 1);
        add(
            SUM_US,
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
        );
    }

    /// One attempt on `peer` ended with `outcome`.
    pub(crate) fn attempt(&self, peer: PeerId, outcome: Outcome) {
        if let Some(p) = self.peer(peer) {
            p.attempts.add(outcome.index(), 1);
        }
    }

    /// What core charged `peer` for one attempt (nothing, or a failure of
    /// a class, maybe by a vigil-only rule).
    pub(crate) fn charged(&self, peer: PeerId, a: Accounting) {
        let (Some(class), Some(p)) = (a.charged, self.peer(peer)) else {
            return;
        };
        p.counted[class_index(class)].fetch_add(1, Ordering::Relaxed);
        if let Some(rule) = a.rule {
            p.by_rule[rule_index(rule)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The request moved to the next peer.
    pub(crate) fn retry(&self) {
        self.totals.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// A hedge was sent.
    pub(crate) fn hedge(&self) {
        self.totals.hedges.fetch_add(1, Ordering::Relaxed);
    }

    /// Core denied a retry or a hedge.
    pub(crate) fn denied(&self, why: RetryDenied) {
        if let Some(n) = self.totals.denied.get(why.index()) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// No peer was eligible.
    pub(crate) fn no_live_upstreams(&self) {
        self.totals.no_live.fetch_add(1, Ordering::Relaxed);
    }

    fn peer(&self, id: PeerId) -> Option<&PeerStats> {
        self.peers.get(id.0 as usize).map(|p| &**p)
    }
}

// === impl UpstreamTotals ===

impl UpstreamTotals {
    fn new(name: Arc<str>) -> Self {
        Self {
            name,
            per_request: PerWorker::new(),
            retries: AtomicU64::new(0),
            no_live: AtomicU64::new(0),
            hedges: AtomicU64::new(0),
            denied: Default::default(),
        }
    }

    /// Requests answered with a status of class `class` (its index in
    /// [`STATUS_CLASSES`]).
    pub(crate) fn requests(&self, class: usize) -> u64 {
        if class < STATUS_CLASSES.len() {
            self.per_request.get(REQUESTS + class)
        } else {
            0
        }
    }

    /// Non-cumulative counts per bucket of [`BUCKETS`], then the overflow.
    pub(crate) fn buckets(&self) -> [u64; BUCKETS.len() + 1] {
        std::array::from_fn(|i| self.per_request.get(HISTOGRAM + i))
    }

    /// The requests' durations summed, µs.
    pub(crate) fn sum_us(&self) -> u64 {
        self.per_request.get(SUM_US)
    }

    /// Requests observed by the histogram (the sum of its buckets).
    pub(crate) fn count(&self) -> u64 {
        self.buckets().iter().sum()
    }
}

// === impl PeerStats ===

impl PeerStats {
    /// Attempts that ended with `outcome`.
    pub(crate) fn attempts(&self, outcome: Outcome) -> u64 {
        self.attempts.get(outcome.index())
    }

    fn new(upstream: Arc<str>, addr: Arc<str>, peer: Arc<str>) -> Self {
        Self {
            upstream,
            addr,
            peer,
            attempts: PerWorker::new(),
            counted: Default::default(),
            by_rule: Default::default(),
            exclusions: AtomicU64::new(0),
            ejections: Default::default(),
        }
    }
}

/// The position of a `passive_count` rule in [`super::render::COUNT_RULES`].
pub(crate) fn rule_index(rule: CountRule) -> usize {
    match rule {
        CountRule::AfterHeader => 0,
        CountRule::LastTry => 1,
    }
}
