//! The per-request walk: nginx's retry decision after each attempt
//! (`ngx_http_upstream_test_next` / `ngx_http_upstream_next`), and the guard
//! that releases a peer.

use std::sync::Arc;

use crate::clock::{duration_ms, Timestamp};
use crate::outcome::{FailureClass, PeerOutcome, TransportFailure};
use crate::peer::Peer;

use super::{FailureVerdict, PeerGuard, Selection, StatusVerdict, Upstream};

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

    fn timed_out(&self, now: Timestamp) -> bool {
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

    /// A response header arrived (nothing sent to the client yet):
    /// `ngx_http_upstream_test_next`. A listed status retries only while
    /// another try remains; otherwise it is passed through and, when the
    /// guard drops, counted as a success.
    pub fn on_status(
        &mut self,
        mut guard: PeerGuard,
        status: u16,
        now: Timestamp,
    ) -> StatusVerdict {
        let Some(class) = FailureClass::of_status(status) else {
            return StatusVerdict::PassThrough(guard);
        };
        let retry = self.tries > 1
            && self.policy.next_upstream.allows(class, self.facts, true)
            && self.facts.body_replayable
            && !self.timed_out(now);
        if !retry {
            return StatusVerdict::PassThrough(guard);
        }
        let outcome = if class.is_counted() {
            PeerOutcome::Failed(class)
        } else {
            PeerOutcome::Next(class)
        };
        guard.done = true;
        let single = guard.upstream.free(guard.index, outcome, now);
        self.count_down(single);
        StatusVerdict::Retry
    }

    /// The attempt failed before a response header (`ngx_http_upstream_next`):
    /// the failure is counted first, then the retry rules decide.
    pub fn on_failure(
        &mut self,
        mut guard: PeerGuard,
        failure: TransportFailure,
        now: Timestamp,
    ) -> FailureVerdict {
        let class = failure.class;
        guard.done = true;
        let single = guard
            .upstream
            .free(guard.index, PeerOutcome::Failed(class), now);
        self.count_down(single);
        if failure.cached_connection && class == FailureClass::Error {
            // "TODO: inform balancer instead": a stale kept-alive connection
            // does not use up a try.
            self.tries += 1;
        }
        let stop = self.tries == 0
            || !self
                .policy
                .next_upstream
                .allows(class, self.facts, failure.request_sent)
            || (failure.request_sent && !self.facts.body_replayable)
            || self.timed_out(now);
        if stop {
            FailureVerdict::Fail(class.final_status())
        } else {
            FailureVerdict::Retry
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
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        if !self.done {
            // A success needs no time unless it forgives an exclusion, and
            // then the event is stamped when published.
            self.upstream
                .free(self.index, PeerOutcome::Success, Timestamp(0));
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
