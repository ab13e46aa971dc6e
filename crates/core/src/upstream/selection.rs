//! The per-request walk: nginx's retry decision after each attempt
//! (`ngx_http_upstream_test_next` / `ngx_http_upstream_next`), and the guard
//! that releases a peer.

use std::sync::Arc;

use crate::clock::{duration_ms, Timestamp};
use crate::outcome::{FailureClass, PeerOutcome, TransportFailure};
use crate::peer::Peer;

use super::{FailureVerdict, PeerGuard, RetryDenied, Selection, StatusVerdict, Upstream};

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
            return StatusVerdict::PassThrough(guard, None);
        };
        let single = guard.upstream.is_single();
        // A header came, so the request was sent.
        if let Some(denied) = self.denial(class, self.tries > 1, true, single, now) {
            return StatusVerdict::PassThrough(guard, Some(denied));
        }
        let outcome = if class.is_counted() {
            PeerOutcome::Failed(class)
        } else {
            PeerOutcome::Next(class)
        };
        guard.done = true;
        let (accounting, single) = guard.upstream.free(guard.index, outcome, now);
        self.count_down(single);
        StatusVerdict::Retry(accounting)
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
        let (accounting, single) =
            guard
                .upstream
                .free(guard.index, PeerOutcome::Failed(class), now);
        self.count_down(single);
        if failure.cached_connection && class == FailureClass::Error {
            // "TODO: inform balancer instead": a stale kept-alive connection
            // does not use up a try.
            self.tries += 1;
        }
        match self.denial(class, self.tries != 0, failure.request_sent, single, now) {
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
