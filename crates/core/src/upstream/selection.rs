//! The per-request walk: nginx's retry decision after each attempt
//! (`ngx_http_upstream_test_next` / `ngx_http_upstream_next`), and the guard
//! that releases a peer.

use std::sync::Arc;

use crate::clock::{duration_ms, Timestamp};
use crate::outcome::{FailureClass, PeerOutcome, TransportFailure};
use crate::peer::Peer;

use super::{
    Accounting, CountRule, FailureVerdict, PeerGuard, RetryDenied, Selection, StatusVerdict,
    Upstream,
};

// === impl Selection ===

impl Selection {
    /// Attempts made so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Tries left (nginx's `u->peer.tries`).
    pub fn tries_left(&self) -> u32 {
        self.tries
    }

    /// Whether the request moved to the backup servers.
    pub fn in_backup(&self) -> bool {
        self.in_backup
    }

    pub(super) fn timed_out(&self, now: Timestamp) -> bool {
        self.policy
            .timeout
            .is_some_and(|t| !t.is_zero() && now.millis_since(self.started) >= duration_ms(t))
    }

    fn count_down(&mut self, single: bool) {
        if single {
            self.tries = 0;
        } else {
            self.tries = self.tries.saturating_sub(1);
        }
    }

    /// The first rule that forbids another attempt after a failure of
    /// `class`, in nginx's order (`ngx_http_upstream_next`), if any.
    /// `tries_ok` says whether a try remains.
    fn denial(
        &self,
        class: FailureClass,
        tries_ok: bool,
        request_sent: bool,
        single: bool,
        now: Timestamp,
    ) -> Option<RetryDenied> {
        if !tries_ok {
            return Some(if single {
                RetryDenied::SingleServer
            } else {
                RetryDenied::Tries
            });
        }
        let next = self.policy.next_upstream;
        if !next.contains(class) {
            return Some(RetryDenied::NotListed);
        }
        if !next.allows(class, self.facts, request_sent) {
            return Some(RetryDenied::NonIdempotent);
        }
        if request_sent && !self.facts.body_replayable {
            return Some(RetryDenied::BodyNotReplayable);
        }
        if self.timed_out(now) {
            return Some(RetryDenied::Timeout);
        }
        None
    }

    /// While another attempt races (a hedge), what still forbids it from
    /// taking over once this one sent the request: a request that cannot
    /// be sent twice (a connect race sends it once; after that, nginx's
    /// `non_idempotent` rule and an unreplayable body decide).
    fn racing_denial(&self, class: FailureClass, request_sent: bool) -> Option<RetryDenied> {
        if !request_sent {
            return None;
        }
        if !self.policy.next_upstream.allows(class, self.facts, true) {
            return Some(RetryDenied::NonIdempotent);
        }
        (!self.facts.body_replayable).then_some(RetryDenied::BodyNotReplayable)
    }

    /// A response header arrived (nothing sent to the client yet):
    /// `ngx_http_upstream_test_next`. A listed status retries only while
    /// another try remains; otherwise it is passed through and, when the
    /// guard drops, counted as a success (nginx). Under `passive_count
    /// last_try` such a status is charged as a failure at once instead
    /// ([`PeerGuard::accounting`] says so).
    ///
    /// A retry is paid from `retry_budget`: when it is empty the status is
    /// passed through ([`RetryDenied::Budget`]) and charged at once as the
    /// failure it would have been retried as. While another attempt of the
    /// request is in flight (a hedge), a listed status is charged and the
    /// verdict is [`StatusVerdict::Retry`]: wait for that attempt.
    pub fn on_status(
        &mut self,
        mut guard: PeerGuard,
        status: u16,
        now: Timestamp,
    ) -> StatusVerdict {
        self.in_flight = self.in_flight.saturating_sub(1);
        guard.header_came(now);
        let Some(class) = FailureClass::of_status(status) else {
            return StatusVerdict::PassThrough(guard, None);
        };
        let single = guard.upstream.is_single();
        let racing = self.in_flight > 0 && self.policy.next_upstream.contains(class);
        // A header came, so the request was sent.
        let denied = if racing {
            self.racing_denial(class, true)
        } else {
            self.denial(class, self.tries > 1, true, single, now)
                .or_else(|| guard.upstream.pay_retry(now))
        };
        if let Some(denied) = denied {
            let last_try = guard.upstream.config.rules.count.last_try;
            if denied == RetryDenied::Budget && class.is_counted() {
                guard.charge_as(class, None, now);
            } else if last_try && denied != RetryDenied::NotListed && class.is_counted() {
                guard.charge(class, CountRule::LastTry, now);
            }
            return StatusVerdict::PassThrough(guard, Some(denied));
        }
        let outcome = if class.is_counted() {
            PeerOutcome::Failed(class)
        } else {
            PeerOutcome::Next(class)
        };
        guard.done = true;
        let (accounting, single) = guard
            .upstream
            .free(guard.index, outcome, guard.started, now);
        self.count_down(single);
        StatusVerdict::Retry(accounting)
    }

    /// The attempt failed before a response header (`ngx_http_upstream_next`):
    /// the failure is counted first, then the retry rules decide, then
    /// `retry_budget` pays for the retry ([`RetryDenied::Budget`] when it
    /// is empty). While another attempt of the request is in flight (a
    /// hedge) the verdict is [`FailureVerdict::Retry`]: wait for it.
    pub fn on_failure(
        &mut self,
        mut guard: PeerGuard,
        failure: TransportFailure,
        now: Timestamp,
    ) -> FailureVerdict {
        let class = failure.class;
        self.in_flight = self.in_flight.saturating_sub(1);
        guard.stop_waiting(true);
        guard.done = true;
        let (accounting, single) = if guard.charged.is_some() {
            // Charged already (cannot happen before a header; kept exact).
            guard.upstream.peers[guard.index as usize].release();
            (Accounting::default(), guard.upstream.is_single())
        } else {
            guard
                .upstream
                .free(guard.index, PeerOutcome::Failed(class), guard.started, now)
        };
        self.count_down(single);
        if failure.cached_connection && class == FailureClass::Error {
            // "TODO: inform balancer instead": a stale kept-alive connection
            // does not use up a try.
            self.tries += 1;
        }
        if self.in_flight > 0 {
            return match self.racing_denial(class, failure.request_sent) {
                Some(denied) => FailureVerdict::Fail {
                    status: class.final_status(),
                    accounting,
                    denied,
                },
                None => FailureVerdict::Retry(accounting),
            };
        }
        let denied = self
            .denial(class, self.tries != 0, failure.request_sent, single, now)
            .or_else(|| guard.upstream.pay_retry(now));
        match denied {
            Some(denied) => FailureVerdict::Fail {
                status: class.final_status(),
                accounting,
                denied,
            },
            None => FailureVerdict::Retry(accounting),
        }
    }
}

// === impl PeerGuard ===

impl PeerGuard {
    /// The upstream the peer belongs to.
    pub fn upstream(&self) -> &Arc<Upstream> {
        &self.upstream
    }

    /// The picked peer.
    pub fn peer(&self) -> &Arc<Peer> {
        &self.upstream.peers[self.index as usize]
    }

    /// When the attempt started, on core's clock.
    pub fn started(&self) -> Timestamp {
        self.started
    }

    /// The response body failed after its header went out to the client
    /// (cut short, reset, or a read timeout mid-body; `class` is `Error` or
    /// `Timeout`). Never retried. nginx counts the attempt a success; under
    /// `passive_count after_header` it is charged as a failure now, and
    /// dropping the guard then only releases the peer. Without the rule
    /// (or for the single server of an upstream) nothing is charged.
    /// Calling it twice charges once.
    pub fn fail_after_header(&mut self, class: FailureClass, now: Timestamp) -> Accounting {
        if self.upstream.config.rules.count.after_header {
            self.charge(class, CountRule::AfterHeader, now)
        } else {
            Accounting::default()
        }
    }

    /// What a `passive_count` rule charged for this attempt while the guard
    /// is held (empty otherwise): the proxy's metrics report it.
    pub fn accounting(&self) -> Accounting {
        self.charged.unwrap_or_default()
    }

    /// Charge `class` now, keeping the connection count until drop.
    fn charge(&mut self, class: FailureClass, rule: CountRule, now: Timestamp) -> Accounting {
        self.charge_as(class, Some(rule), now)
    }

    /// [`PeerGuard::charge`] by `rule`, or by nginx's own rule (None).
    fn charge_as(
        &mut self,
        class: FailureClass,
        rule: Option<CountRule>,
        now: Timestamp,
    ) -> Accounting {
        if self.done || self.charged.is_some() {
            return Accounting::default();
        }
        let (mut a, _) =
            self.upstream
                .account(self.index, PeerOutcome::Failed(class), self.started, now);
        if a.charged.is_some() {
            a.rule = rule;
            self.charged = Some(a);
        }
        a
    }
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        self.stop_waiting(false);
        if self.done {
            return;
        }
        if self.charged.is_some() {
            self.upstream.peers[self.index as usize].release();
            return;
        }
        // A success needs no time unless a rule needs it (then the tier
        // reads the clock), and events are stamped when published.
        self.upstream
            .free(self.index, PeerOutcome::Success, self.started, Timestamp(0));
    }
}

// === impl StatusVerdict ===

impl StatusVerdict {
    /// What core charged: for a retry, the retried attempt; for a pass
    /// through, what `passive_count last_try` charged (usually nothing).
    pub fn accounting(&self) -> Accounting {
        match self {
            StatusVerdict::Retry(a) => *a,
            StatusVerdict::PassThrough(g, _) => g.accounting(),
        }
    }
}

impl std::fmt::Debug for PeerGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PeerGuard")
            .field(self.peer().name())
            .finish()
    }
}
