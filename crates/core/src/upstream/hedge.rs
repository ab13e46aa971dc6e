//! `hedge after=T|pNN [max=M]`: when a safe request without a body (GET,
//! HEAD, OPTIONS, TRACE: [`crate::RequestFacts::sends_twice`]) has no
//! response header after T, the same request goes to another eligible
//! peer too; the
//! first header core lets through wins and the other attempt is cancelled
//! ([`PeerGuard::cancel`]: released, nothing charged). A hedge is a retry
//! for every limit: it takes a try of `proxy_next_upstream_tries`, a token
//! of `retry_budget`, and is only sent where a `timeout` could move the
//! request on (`proxy_next_upstream` lists `timeout`, the method is not
//! POST, LOCK or PATCH — even with `non_idempotent` —, the body can be sent
//! again, `proxy_next_upstream_timeout` has not passed).
//!
//! A request that cannot be sent twice (any other method, or a body) is
//! still hedged while every attempt of it is connecting: a
//! connect race. The request then goes out once, on the first connection
//! that is ready ([`crate::RequestFacts::sends_once`]); the proxy cancels
//! the others before they send anything.
//!
//! While two attempts race, a failure of one (a transport failure, or a
//! status `proxy_next_upstream` lists) is charged as usual and the request
//! waits for the other: the verdict is a retry that needs no new peer.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::config::HedgeAfter;
use crate::outcome::FailureClass;

use super::budget::Paid;
use super::{PeerGuard, RetryDenied, Selection, Upstream};

// === impl Upstream ===

impl Upstream {
    /// When the next hedge of this request is due, counted from the start
    /// of its latest attempt: None when it will never be hedged (no
    /// `hedge`, a single server, a method or body that cannot be sent
    /// twice, `timeout` not in `proxy_next_upstream`, `max=` hedges sent,
    /// or, for `after=pNN`, too few time-to-header samples in the
    /// upstream's window yet: [`super::MIN_SAMPLES`]). `connecting`: every
    /// attempt in flight is still connecting (nothing was sent), so even a
    /// request that cannot be sent twice may race a connect.
    pub fn hedge_after(
        &self,
        sel: &Selection,
        now: Timestamp,
        connecting: bool,
    ) -> Option<Duration> {
        let h = self.config.rules.hedge?;
        if sel.hedges >= h.max.get()
            || self.is_single()
            || sel.static_hedge_denial(connecting).is_some()
        {
            return None;
        }
        self.hedge_delay_now(now)
    }

    /// The `hedge after=` delay now: T, or the upstream's recent NN-th
    /// percentile time-to-header (None while it has too few headers),
    /// refreshed from the window at most every 100 ms.
    pub fn hedge_delay_now(&self, now: Timestamp) -> Option<Duration> {
        match self.config.rules.hedge?.after {
            HedgeAfter::Fixed(d) => Some(d),
            // Core measures an upstream with a percentile hedge (latency::wanted).
            HedgeAfter::Percentile(_) => {
                let l = self.latency.as_ref()?;
                l.hedge.as_ref()?.at(&l.header, now)
            }
        }
    }

    /// Send a hedge: pick another peer for `sel` while its other attempts
    /// wait. Denied (nothing picked, nothing charged) by the rules of
    /// [`Upstream::hedge_after`], by the tries left (a hedge is a try), by
    /// `proxy_next_upstream_timeout`, by `retry_budget`
    /// ([`RetryDenied::Budget`]), or when no other peer is eligible
    /// ([`RetryDenied::NoPeer`]). `connecting` as for
    /// [`Upstream::hedge_after`].
    pub fn hedge(
        self: &Arc<Self>,
        sel: &mut Selection,
        now: Timestamp,
        connecting: bool,
    ) -> Result<PeerGuard, RetryDenied> {
        let Some(h) = self.config.rules.hedge else {
            return Err(RetryDenied::NotListed);
        };
        if self.is_single() {
            return Err(RetryDenied::SingleServer);
        }
        if sel.hedges >= h.max.get() || sel.tries <= sel.in_flight {
            return Err(RetryDenied::Tries);
        }
        if let Some(d) = sel.static_hedge_denial(connecting) {
            return Err(d);
        }
        if sel.timed_out(now) {
            return Err(RetryDenied::Timeout);
        }
        let paid = match &self.budget {
            Some(b) => Some(b.withdraw(now).ok_or(RetryDenied::Budget)?),
            None => None,
        };
        match self.select(sel, now) {
            Ok(guard) => {
                sel.hedges += 1;
                Ok(guard)
            }
            Err(_) => {
                if let (Some(b), Some(p)) = (&self.budget, paid) {
                    b.refund(p, now);
                }
                Err(RetryDenied::NoPeer)
            }
        }
    }

    /// Pay for a retry from `retry_budget`, if the upstream has one:
    /// [`RetryDenied::Budget`] when it is empty.
    pub(super) fn pay_retry(&self, now: Timestamp) -> Option<RetryDenied> {
        match self.budget.as_ref().map(|b| b.withdraw(now)) {
            Some(None) => Some(RetryDenied::Budget),
            Some(Some(Paid::Ratio | Paid::Reserve)) | None => None,
        }
    }

    /// `retry_budget` now, if the upstream has one.
    pub fn retry_budget_now(&self, now: Timestamp) -> Option<super::BudgetNow> {
        self.budget.as_ref().map(|b| b.now(now))
    }
}

// === impl Selection ===

impl Selection {
    /// Hedges sent so far.
    pub fn hedges(&self) -> u32 {
        self.hedges
    }

    /// Attempts picked and not yet handed back to core.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// What about this request forbids a hedge whatever the time; while
    /// its attempts are `connecting`, only a `proxy_next_upstream` without
    /// `timeout` does (the request will be sent once, on the first
    /// connection ready).
    fn static_hedge_denial(&self, connecting: bool) -> Option<RetryDenied> {
        if !connecting && self.facts.non_idempotent {
            return Some(RetryDenied::NonIdempotent);
        }
        if !connecting && !self.facts.body_replayable {
            return Some(RetryDenied::BodyNotReplayable);
        }
        if !connecting && !self.facts.hedgeable {
            return Some(RetryDenied::NotSafe);
        }
        if !self.policy.next_upstream.contains(FailureClass::Timeout) {
            return Some(RetryDenied::NotListed);
        }
        None
    }
}

// === impl PeerGuard ===

impl PeerGuard {
    /// The attempt lost a race to another one of its request: release the
    /// peer with nothing charged and nothing forgiven (its connection is
    /// the caller's to close). The request is over (the winner answers it),
    /// so its [`Selection`] is not told.
    pub fn cancel(mut self) {
        self.done = true;
        self.upstream.peers[self.index as usize].release();
    }

    /// The attempt lost a connect race before it sent anything (another
    /// attempt of `sel`'s request connected first and sends it): released
    /// uncharged, as [`PeerGuard::cancel`], and no longer in flight for
    /// `sel`, whose request goes on.
    pub fn withdraw(self, sel: &mut Selection) {
        sel.in_flight = sel.in_flight.saturating_sub(1);
        self.cancel();
    }
}
