//! The attempt ledger: one call per thing that happens to an attempt,
//! which writes it into the three places that must agree: the request's
//! `$upstream_*` record (nginx's `u->state` list, read by the access log
//! and `add_header`), the observer (metrics and the trace) and core's
//! selection (what is charged, whether the request may move on).

use std::sync::Arc;

use smallvec::SmallVec;
use vigil_core::peer::Peer;
use vigil_core::upstream::{PeerGuard, Selection, Upstream};
use vigil_core::{Clock, FailureVerdict, StatusVerdict};
use vigil_net::clock::{coarse_tick, Tick};

use crate::handler::record::AttemptRecord;
use crate::obs::metrics::Outcome;
use crate::obs::telemetry::request::RequestObserver;
use crate::upstream::attempt::{self, Failed};

/// A request's attempts, in the order they started (inline while they are
/// two: a malloc and a free fewer per request).
pub(super) type Attempts = SmallVec<[AttemptRecord; 2]>;

/// One request's attempts on one upstream, as its record, its observer
/// and core see them.
pub(super) struct Ledger<'r, 'o> {
    records: Attempts,
    /// How many records an earlier pass made (an `error_page`'s: see
    /// [`crate::handler::record::EarlierAttempts`]).
    group: usize,
    obs: &'r mut RequestObserver<'o>,
    sel: Selection,
    upstream: &'r Arc<Upstream>,
    clock: &'r dyn Clock,
}

impl<'r, 'o> Ledger<'r, 'o> {
    /// The ledger of a request's pass that begins with `earlier` records.
    pub(super) fn new(
        obs: &'r mut RequestObserver<'o>,
        sel: Selection,
        upstream: &'r Arc<Upstream>,
        clock: &'r dyn Clock,
        earlier: Attempts,
    ) -> Self {
        Self {
            group: earlier.len(),
            records: earlier,
            obs,
            sel,
            upstream,
            clock,
        }
    }

    /// The records so far, in start order.
    pub(super) fn records(&self) -> &[AttemptRecord] {
        &self.records
    }

    /// The upstream's counters, for a response body that charges after the
    /// header (`passive_count after_header`).
    pub(super) fn stats(&self) -> Option<Arc<crate::obs::metrics::UpstreamStats>> {
        self.obs.stats()
    }

    /// The next peer by core's rules; None is nginx's "no live upstreams",
    /// recorded as its 502 attempt (`$upstream_addr` the upstream's name).
    pub(super) fn pick(&mut self) -> Option<PeerGuard> {
        match self.upstream.select(&mut self.sel, self.clock.now()) {
            Ok(g) => Some(g),
            Err(_) => {
                self.obs.no_live_upstreams();
                tracing::error!(upstream = %self.upstream.name(), "no live upstreams");
                let redirected = self.redirected();
                self.records.push(AttemptRecord {
                    addr: self.upstream.name().clone(),
                    status: Some(502),
                    response_time: 0.0,
                    connect_time: None,
                    redirected,
                });
                None
            }
        }
    }

    /// How long after the latest attempt's start a hedge is due (None: no
    /// hedge); `connecting`: every attempt in flight is still connecting.
    pub(super) fn hedge_after(&self, connecting: bool) -> Option<std::time::Duration> {
        self.upstream
            .hedge_after(&self.sel, self.clock.now(), connecting)
    }

    /// A hedge's peer, or None when core denies it (counted).
    pub(super) fn hedge(&mut self, connecting: bool) -> Option<PeerGuard> {
        match self
            .upstream
            .hedge(&mut self.sel, self.clock.now(), connecting)
        {
            Ok(guard) => {
                self.obs.hedge();
                tracing::debug!(upstream = %self.upstream.name(), peer = %guard.peer().name(), "hedge");
                Some(guard)
            }
            Err(denied) => {
                self.obs.denied(denied);
                None
            }
        }
    }

    /// An attempt on `peer` starts: its record, with no status yet (kept in
    /// start order, as nginx's list); its index.
    pub(super) fn opened(&mut self, peer: &Peer) -> usize {
        let redirected = self.redirected();
        self.records.push(AttemptRecord {
            addr: peer.addr_text().clone(),
            status: None,
            response_time: 0.0,
            connect_time: None,
            redirected,
        });
        self.records.len() - 1
    }

    /// An attempt ended without an answer of its own (cancelled, lost a
    /// connect race, its client left): the time it ran, no status (what
    /// nginx shows for an attempt cut short).
    pub(super) fn cut_short(&mut self, record: usize, t0: Tick, connect_time: Option<f64>) {
        if let Some(r) = self.records.get_mut(record) {
            r.response_time = attempt::secs(coarse_tick().since(t0));
            if connect_time.is_some() {
                r.connect_time = connect_time;
            }
        }
    }

    /// An attempt that lost a connect race: released uncharged, no longer
    /// in flight for the request.
    pub(super) fn withdraw(&mut self, guard: PeerGuard, record: usize, t0: Tick) {
        self.cut_short(record, t0, None);
        guard.withdraw(&mut self.sel);
    }

    /// A response header came from `peer`: recorded, observed, and judged
    /// by core (a retry charges as core says; a pass-through may have been
    /// charged by `passive_count last_try`).
    pub(super) fn answered(
        &mut self,
        guard: PeerGuard,
        peer: &Peer,
        record: usize,
        t0: Tick,
        status: u16,
        connect_time: f64,
    ) -> StatusVerdict {
        let took = coarse_tick().since(t0);
        if let Some(r) = self.records.get_mut(record) {
            r.status = Some(status);
            r.response_time = attempt::secs(took);
            r.connect_time = Some(connect_time);
        }
        self.obs.attempt(
            peer,
            Outcome::of_status(status),
            Some(status),
            Some(connect_time),
            took,
        );
        let verdict = self.sel.on_status(guard, status, self.clock.now());
        match &verdict {
            StatusVerdict::Retry(accounting) => {
                self.obs.charged(peer, *accounting);
                self.obs.retry();
            }
            StatusVerdict::PassThrough(guard, denied) => {
                if let Some(why) = denied {
                    self.obs.denied(*why);
                }
                self.obs.charged(peer, guard.accounting());
            }
        }
        verdict
    }

    /// An attempt on `peer` failed before a header: recorded with its
    /// final status, observed, and judged by core (charged, then a retry or
    /// the end).
    pub(super) fn failed(
        &mut self,
        guard: PeerGuard,
        peer: &Peer,
        record: usize,
        t0: Tick,
        failed: Failed,
    ) -> FailureVerdict {
        tracing::warn!(upstream = %self.upstream.name(), peer = %peer.name(), class = %failed.failure.class, "{}", failed.detail);
        let took = coarse_tick().since(t0);
        let class = failed.failure.class;
        if let Some(r) = self.records.get_mut(record) {
            r.status = Some(class.final_status());
            r.response_time = attempt::secs(took);
            r.connect_time = failed.connect_time;
        }
        self.obs.attempt(
            peer,
            Outcome::Failed(class),
            None,
            failed.connect_time,
            took,
        );
        let verdict = self.sel.on_failure(guard, failed.failure, self.clock.now());
        // What core charged (nothing for the single server of an upstream).
        self.obs.charged(peer, verdict.accounting());
        match verdict {
            FailureVerdict::Retry(_) => self.obs.retry(),
            FailureVerdict::Fail { denied, .. } => self.obs.denied(denied),
        }
        verdict
    }

    /// The next record is the first of an `error_page`'s pass.
    fn redirected(&self) -> bool {
        self.group > 0 && self.records.len() == self.group
    }
}
