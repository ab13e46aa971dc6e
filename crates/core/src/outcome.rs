//! What happened to one attempt, and nginx's rules for what follows from it:
//! whether the peer is charged a failure, whether the request may go to the
//! next peer, and what the client is told when it may not.
//!
//! The rules are `ngx_http_upstream_next()` and `ngx_http_upstream_test_next()`
//! of nginx 1.22 (`src/http/ngx_http_upstream.c`); see `docs/semantics.md`.

use std::fmt;
use std::str::FromStr;

/// nginx's failure classes: the values of `proxy_next_upstream`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureClass {
    /// Connect refused or reset, or the connection closed before a response header.
    Error,
    /// Connect, send or read timed out before a response header.
    Timeout,
    /// The upstream sent an empty or malformed response header.
    InvalidHeader,
    /// Status 500.
    Http500,
    /// Status 502.
    Http502,
    /// Status 503.
    Http503,
    /// Status 504.
    Http504,
    /// Status 403.
    Http403,
    /// Status 404.
    Http404,
    /// Status 429.
    Http429,
}

/// The set of classes that may move a request to the next peer
/// (`proxy_next_upstream`), plus `non_idempotent`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NextUpstream {
    bits: u16,
}

/// How a transport-level attempt failed before a response header arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransportFailure {
    /// `Error`, `Timeout` or `InvalidHeader`.
    pub class: FailureClass,
    /// Whether any byte of the request reached the upstream (nginx's `u->request_sent`).
    pub request_sent: bool,
    /// Whether the attempt used a kept-alive connection from the pool
    /// (nginx's `pc->cached`): an `error` on one does not use up a try.
    pub cached_connection: bool,
}

/// What the balancer is told about a finished attempt (nginx's `NGX_PEER_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerOutcome {
    /// State 0: a success for accounting (also a passed-through listed status
    /// on the last try, and any failure after the header reached the client).
    Success,
    /// `NGX_PEER_FAILED`: counts toward `max_fails`.
    Failed(FailureClass),
    /// `NGX_PEER_NEXT`: `http_403`/`http_404`, retried but never counted.
    Next(FailureClass),
}

/// Facts about the client request that the retry rules need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestFacts {
    /// POST, LOCK or PATCH: not retried after the request was sent unless
    /// `non_idempotent` is listed.
    pub non_idempotent: bool,
    /// The body can be sent again (it was buffered, or there is none).
    /// With `proxy_request_buffering off` a started body cannot be replayed.
    pub body_replayable: bool,
    /// The request may be sent to two peers at once (a hedge): a safe
    /// method (GET, HEAD, OPTIONS, TRACE; RFC 9110 §9.2.1) and no body.
    /// Retries after a failure follow nginx's rule instead
    /// ([`RequestFacts::non_idempotent`]).
    pub hedgeable: bool,
}

/// Error for a `proxy_next_upstream` word that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid proxy_next_upstream value \"{0}\", expected one of error, timeout, invalid_header, http_500, http_502, http_503, http_504, http_403, http_404, http_429, non_idempotent, off")]
pub struct UnknownClass(pub String);

// === impl RequestFacts ===

impl RequestFacts {
    /// The facts of a request with `method` (as sent, case-sensitive);
    /// `body_replayable`: its body was buffered, or it has none.
    pub fn new(method: &str, body_replayable: bool) -> Self {
        Self {
            non_idempotent: is_non_idempotent(method),
            body_replayable,
            hedgeable: is_safe(method),
        }
    }

    /// The request carries a body (`has_body`): it is not hedged, even
    /// with a safe method (a GET with a body has no defined meaning, and
    /// some APIs give it effects).
    pub fn with_body(mut self, has_body: bool) -> Self {
        self.hedgeable &= !has_body;
        self
    }

    /// Whether a hedge may send the request while an earlier attempt of it
    /// may still be running: only a safe method without a body. Anything
    /// else (PUT and DELETE too: run twice at once, a PUT can undo another
    /// client's write between them, and a DELETE's second run answers 404)
    /// is only raced while connecting and sent once, on the first
    /// connection ready.
    pub fn sends_twice(&self) -> bool {
        self.hedgeable && self.body_replayable && !self.non_idempotent
    }

    /// Whether the request, on an upstream with `hedge` (`hedged`), is sent
    /// once only: its attempts may race while connecting, and the first
    /// connection ready sends it (the others are cancelled before they send
    /// anything). False without a hedge, where attempts never overlap, and
    /// for a request that [`sends_twice`](Self::sends_twice).
    pub fn sends_once(&self, hedged: bool) -> bool {
        hedged && !self.sends_twice()
    }
}

/// RFC 9110's safe methods (§9.2.1), which nginx's `proxy_next_upstream`
/// does not know: vigil's rule for hedges.
pub fn is_safe(method: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "OPTIONS" | "TRACE")
}

/// nginx's non-idempotent methods (`ngx_http_upstream_next`: POST, LOCK,
/// PATCH), which are not sent to a second peer unless `proxy_next_upstream`
/// lists `non_idempotent`.
pub fn is_non_idempotent(method: &str) -> bool {
    matches!(method, "POST" | "LOCK" | "PATCH")
}

// === impl FailureClass ===

impl FailureClass {
    /// Every class, in nginx's documentation order.
    pub const ALL: [FailureClass; 10] = [
        FailureClass::Error,
        FailureClass::Timeout,
        FailureClass::InvalidHeader,
        FailureClass::Http500,
        FailureClass::Http502,
        FailureClass::Http503,
        FailureClass::Http504,
        FailureClass::Http403,
        FailureClass::Http404,
        FailureClass::Http429,
    ];

    /// The class of an upstream status that `proxy_next_upstream` can name.
    pub fn of_status(status: u16) -> Option<FailureClass> {
        Some(match status {
            500 => FailureClass::Http500,
            502 => FailureClass::Http502,
            503 => FailureClass::Http503,
            504 => FailureClass::Http504,
            403 => FailureClass::Http403,
            404 => FailureClass::Http404,
            429 => FailureClass::Http429,
            _ => return None,
        })
    }

    /// The word used in nginx.conf and in vigil's output.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Error => "error",
            FailureClass::Timeout => "timeout",
            FailureClass::InvalidHeader => "invalid_header",
            FailureClass::Http500 => "http_500",
            FailureClass::Http502 => "http_502",
            FailureClass::Http503 => "http_503",
            FailureClass::Http504 => "http_504",
            FailureClass::Http403 => "http_403",
            FailureClass::Http404 => "http_404",
            FailureClass::Http429 => "http_429",
        }
    }

    /// `http_403` and `http_404` retry but are never counted as failures.
    pub fn is_counted(self) -> bool {
        !matches!(self, FailureClass::Http403 | FailureClass::Http404)
    }

    /// The status nginx answers with when this class ends the request
    /// without a passed-through response.
    pub fn final_status(self) -> u16 {
        match self {
            FailureClass::Timeout | FailureClass::Http504 => 504,
            FailureClass::Http500 => 500,
            FailureClass::Http503 => 503,
            FailureClass::Http403 => 403,
            FailureClass::Http404 => 404,
            FailureClass::Http429 => 429,
            FailureClass::Error | FailureClass::InvalidHeader | FailureClass::Http502 => 502,
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FailureClass {
    type Err = UnknownClass;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FailureClass::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownClass(s.to_string()))
    }
}

// === impl NextUpstream ===

const NON_IDEMPOTENT: u16 = 1 << 12;

impl NextUpstream {
    /// `proxy_next_upstream off`.
    pub const OFF: NextUpstream = NextUpstream { bits: 0 };

    /// nginx's default, `error timeout`.
    pub fn nginx_default() -> Self {
        Self::OFF
            .with(FailureClass::Error)
            .with(FailureClass::Timeout)
    }

    /// This set plus `class`.
    pub fn with(self, class: FailureClass) -> Self {
        Self {
            bits: self.bits | class.bit(),
        }
    }

    /// This set plus `non_idempotent`.
    pub fn with_non_idempotent(self) -> Self {
        Self {
            bits: self.bits | NON_IDEMPOTENT,
        }
    }

    /// Whether `class` is listed.
    pub fn contains(self, class: FailureClass) -> bool {
        self.bits & class.bit() != 0
    }

    /// Whether `non_idempotent` is listed.
    pub fn non_idempotent(self) -> bool {
        self.bits & NON_IDEMPOTENT != 0
    }

    /// Whether this is `off` (nothing listed).
    pub fn is_off(self) -> bool {
        self.bits == 0
    }

    /// The listed classes, in documentation order.
    pub fn classes(self) -> impl Iterator<Item = FailureClass> {
        FailureClass::ALL
            .into_iter()
            .filter(move |c| self.contains(*c))
    }

    /// Parse the words of a `proxy_next_upstream` directive. `off` must
    /// stand alone, as nginx's `ngx_conf_set_bitmask_slot` with
    /// `NGX_HTTP_UPSTREAM_FT_OFF` effectively requires.
    pub fn parse_words<'a>(words: impl IntoIterator<Item = &'a str>) -> Result<Self, UnknownClass> {
        let mut set = Self::OFF;
        for w in words {
            match w {
                "off" => {}
                "non_idempotent" => set = set.with_non_idempotent(),
                other => set = set.with(other.parse()?),
            }
        }
        Ok(set)
    }

    /// The words of this set as nginx.conf would write them.
    pub fn words(self) -> Vec<&'static str> {
        let mut w: Vec<&'static str> = self.classes().map(FailureClass::as_str).collect();
        if self.non_idempotent() {
            w.push("non_idempotent");
        }
        if w.is_empty() {
            w.push("off");
        }
        w
    }

    /// Whether a retry for `class` is allowed for this request, as nginx's
    /// `(next_upstream & ft_type) == ft_type`, with `NON_IDEMPOTENT` added to
    /// `ft_type` for POST/LOCK/PATCH once the request was sent.
    pub fn allows(self, class: FailureClass, facts: RequestFacts, request_sent: bool) -> bool {
        if !self.contains(class) {
            return false;
        }
        !(request_sent && facts.non_idempotent && !self.non_idempotent())
    }
}

impl Default for NextUpstream {
    fn default() -> Self {
        Self::nginx_default()
    }
}

impl fmt::Debug for NextUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NextUpstream({})", self.words().join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn post_lock_and_patch_are_the_non_idempotent_methods() {
        for m in ["POST", "LOCK", "PATCH"] {
            assert!(RequestFacts::new(m, true).non_idempotent, "{m}");
        }
        for m in ["GET", "HEAD", "PUT", "DELETE", "OPTIONS", "post", "UNLOCK"] {
            assert!(!RequestFacts::new(m, true).non_idempotent, "{m}");
        }
    }

    #[test]
    fn default_is_error_timeout() {
        assert_eq!(NextUpstream::default().words(), vec!["error", "timeout"]);
    }

    #[test]
    fn parse_round_trips() {
        let set = NextUpstream::parse_words(["http_503", "error", "non_idempotent"]).unwrap();
        assert_eq!(set.words(), vec!["error", "http_503", "non_idempotent"]);
        assert_eq!(
            NextUpstream::parse_words(["off"]).unwrap().words(),
            vec!["off"]
        );
        assert!(NextUpstream::parse_words(["http_418"]).is_err());
    }

    #[test]
    fn only_safe_methods_without_a_body_are_sent_twice_at_once() {
        for m in ["GET", "HEAD", "OPTIONS", "TRACE"] {
            assert!(RequestFacts::new(m, true).sends_twice(), "{m}");
            assert!(
                !RequestFacts::new(m, true).with_body(true).sends_twice(),
                "{m} with a body"
            );
            assert!(!RequestFacts::new(m, false).sends_twice(), "{m} streamed");
        }
        for m in ["PUT", "DELETE", "POST", "PATCH", "LOCK", "PURGE", "get"] {
            assert!(!RequestFacts::new(m, true).sends_twice(), "{m}");
        }
        // Retries after a failure keep nginx's rule: only POST, LOCK, PATCH
        // need `non_idempotent`.
        assert!(!RequestFacts::new("DELETE", true).non_idempotent);
    }

    #[test]
    fn under_a_hedge_only_what_cannot_be_sent_twice_is_sent_once() {
        let get = RequestFacts::new("GET", true);
        let put = RequestFacts::new("PUT", true);
        let get_body = RequestFacts::new("GET", true).with_body(true);
        let streamed = RequestFacts::new("GET", false);
        for f in [get, put, get_body, streamed] {
            assert!(!f.sends_once(false), "no hedge, no race: {f:?}");
        }
        assert!(!get.sends_once(true), "a hedged GET may go to two peers");
        for f in [put, get_body, streamed] {
            assert!(f.sends_once(true), "hedged, sent once: {f:?}");
        }
    }

    #[test]
    fn non_idempotent_needs_the_flag_only_after_sending() {
        let post = RequestFacts {
            non_idempotent: true,
            body_replayable: true,
            hedgeable: false,
        };
        let set = NextUpstream::nginx_default();
        assert!(set.allows(FailureClass::Error, post, false));
        assert!(!set.allows(FailureClass::Error, post, true));
        assert!(set
            .with_non_idempotent()
            .allows(FailureClass::Error, post, true));
    }

    #[test]
    fn status_classes() {
        assert_eq!(FailureClass::of_status(503), Some(FailureClass::Http503));
        assert_eq!(FailureClass::of_status(501), None);
        assert!(!FailureClass::Http404.is_counted());
        assert_eq!(FailureClass::Timeout.final_status(), 504);
        assert_eq!(FailureClass::InvalidHeader.final_status(), 502);
    }
}
