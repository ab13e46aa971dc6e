//! What core tells the proxy after each attempt: what it charged, whether
//! it excluded the peer, and whether the request may move on (and if not,
//! why). The proxy's metrics and access log report these, never their own
//! guess.

use crate::outcome::FailureClass;

use super::PeerGuard;

/// What core did with one attempt's result toward the peer's record:
/// the proxy's metrics and logs report this, never their own guess.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Accounting {
    /// The failure charged toward `max_fails`, if any (none for a single
    /// server, for `http_403`/`http_404`, and for a passed-through status
    /// unless `passive_count last_try`).
    pub charged: Option<FailureClass>,
    /// Whether this charge excluded the peer (it reached `max_fails`;
    /// `max_ejected` may still keep it eligible).
    pub excluded: bool,
    /// The vigil-only rule that made this a charge, where nginx would not
    /// have charged it.
    pub rule: Option<CountRule>,
}

/// The `passive_count` rule behind a charge nginx would not make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountRule {
    /// `passive_count after_header`: the body failed after the header went out.
    AfterHeader,
    /// `passive_count last_try`: a listed status that could not be retried.
    LastTry,
}

/// Why a failed attempt was not retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryDenied {
    /// `proxy_next_upstream_tries` or the number of peers used up.
    Tries,
    /// The upstream has a single server: nginx never retries it.
    SingleServer,
    /// The failure class is not listed in `proxy_next_upstream`.
    NotListed,
    /// POST, LOCK or PATCH already sent, without `non_idempotent`.
    NonIdempotent,
    /// The request body was streamed (`proxy_request_buffering off`) and cannot be sent again.
    BodyNotReplayable,
    /// `proxy_next_upstream_timeout` has passed.
    Timeout,
    /// `retry_budget` has no token left (the ratio and the reserve are empty).
    Budget,
    /// A hedge found no other eligible peer (hedges only: a retry that
    /// finds none is nginx's "no live upstreams").
    NoPeer,
    /// A hedge of a request that may be sent only once at a time: a method
    /// other than GET, HEAD, OPTIONS and TRACE, or a body (hedges only;
    /// see [`crate::RequestFacts::sends_twice`]).
    NotSafe,
}

/// What to do with a response header.
pub enum StatusVerdict {
    /// The peer was charged (or told `next`); try the next one.
    Retry(Accounting),
    /// Send this response to the client; drop the guard when it is done.
    /// For a listed status, why it was not retried (nginx then counts the
    /// attempt as a success).
    PassThrough(PeerGuard, Option<RetryDenied>),
}

/// What to do after a transport failure (always charged, except for a single server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureVerdict {
    /// Try the next peer.
    Retry(Accounting),
    /// Stop and answer with `status` (502 or 504).
    Fail {
        /// The status for the client.
        status: u16,
        /// What was charged.
        accounting: Accounting,
        /// Why no retry.
        denied: RetryDenied,
    },
}

impl FailureVerdict {
    /// Whether the request goes to the next peer.
    pub fn is_retry(&self) -> bool {
        matches!(self, FailureVerdict::Retry(_))
    }

    /// The status for the client when it does not.
    pub fn status(&self) -> Option<u16> {
        match self {
            FailureVerdict::Retry(_) => None,
            FailureVerdict::Fail { status, .. } => Some(*status),
        }
    }

    /// What core charged.
    pub fn accounting(&self) -> Accounting {
        match self {
            FailureVerdict::Retry(a) | FailureVerdict::Fail { accounting: a, .. } => *a,
        }
    }
}

impl CountRule {
    /// The word used in metrics and logs (the `passive_count` word).
    pub fn as_str(self) -> &'static str {
        match self {
            CountRule::AfterHeader => "after_header",
            CountRule::LastTry => "last_try",
        }
    }
}

impl RetryDenied {
    /// Every reason, in declaration order (the metrics' label values).
    pub const ALL: [RetryDenied; 9] = [
        RetryDenied::Tries,
        RetryDenied::SingleServer,
        RetryDenied::NotListed,
        RetryDenied::NonIdempotent,
        RetryDenied::BodyNotReplayable,
        RetryDenied::Timeout,
        RetryDenied::Budget,
        RetryDenied::NoPeer,
        RetryDenied::NotSafe,
    ];

    /// Position in [`RetryDenied::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The word used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryDenied::Tries => "tries",
            RetryDenied::SingleServer => "single_server",
            RetryDenied::NotListed => "not_listed",
            RetryDenied::NonIdempotent => "non_idempotent",
            RetryDenied::BodyNotReplayable => "body_not_replayable",
            RetryDenied::Timeout => "timeout",
            RetryDenied::Budget => "budget",
            RetryDenied::NoPeer => "no_peer",
            RetryDenied::NotSafe => "not_safe",
        }
    }
}
