//! Client connection timing, as nginx does it, with one deadline per
//! connection instead of a timer per request:
//!
//! - from accept, `client_header_timeout` (of the address's default server)
//!   until the request header is complete;
//! - while a request is served, no deadline (the body has its own
//!   `client_body_timeout`, see body.rs);
//! - after the response, `keepalive_timeout` (of the request's location)
//!   until the first byte of the next request, which starts
//!   `client_header_timeout` again; over HTTP/2, `keepalive_timeout` while no
//!   stream is open, refreshed by every frame;
//! - whenever a write waits for a client that does not read,
//!   `send_timeout` between two successful writes.
//!
//! The deadline lives in atomics of [`ConnState`] that [`TimedIo`] and the
//! service ([`tracking`]) update; [`Watched`] drives the hyper connection
//! with one sleep that is re-armed only when it fires early or the deadline
//! moves earlier, and drops the connection (closing it, as nginx does:
//! nothing is sent) when the deadline passes.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::task::AtomicWaker;
use http::Version;
use tokio::time::Instant;
use vigil_core::config::{ProxySettings, ServerBlock};
use vigil_net::clock::Tick;

use crate::wire::request_check::HeadLimits;

mod io;
mod service;
mod watched;

// The connection's surroundings: accepting it, the workers that run it,
// its socket, timers and clocks, TLS, and the tunnel after a 101.
pub(crate) mod client_io;
pub(crate) mod listener;
pub(crate) mod shard;
pub(crate) mod sock;
pub(crate) mod stop;
pub(crate) mod timer;
pub(crate) mod tls;
pub(crate) mod tunnel;
pub(crate) mod wallclock;
pub mod worker;

pub(crate) use io::TimedIo;
pub(crate) use service::{aborted, begin, close_silently, on_route, prepare, tracking};
pub(crate) use watched::{Closed, Drain, Graceful, Watched};

/// The limits a connection starts with: those of its address's default server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConnLimits {
    /// `client_header_timeout`.
    pub(crate) header: Duration,
    /// `keepalive_timeout` until a request picks its location.
    pub(crate) keepalive: Duration,
    /// `send_timeout` until a request picks its location.
    pub(crate) send: Duration,
}

/// Which deadline closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// No complete request header within `client_header_timeout`.
    Header,
    /// Idle longer than `keepalive_timeout`.
    Idle,
    /// A write waited longer than `send_timeout`.
    Send,
}

/// The timing state of one client connection.
pub(crate) struct ConnState {
    origin: Instant,
    /// `origin` as a tick, for [`ConnState::now_ms`].
    origin_tick: Tick,
    phase: AtomicU8,
    /// Milliseconds since `origin`, [`NONE`] for none.
    phase_deadline: AtomicU64,
    write_deadline: AtomicU64,
    in_flight: AtomicU32,
    h2: AtomicBool,
    /// HTTP/1: the client closed (or reset) the connection while its
    /// request waited for the upstream (see [`ConnState::client_gone`]).
    client_gone: AtomicBool,
    header_ms: u64,
    keepalive_ms: AtomicU64,
    send_ms: AtomicU64,
    /// Wakes [`Watched`] when an HTTP/2 stream task (another task) sets a deadline.
    waker: AtomicWaker,
    /// HTTP/1: the head of the request in service, whose bytes hold the
    /// client's spelling of its field names (see
    /// [`ConnState::request_head`]).
    head: std::sync::Mutex<Option<bytes::Bytes>>,
}

const NONE: u64 = u64::MAX;
const HEADER: u8 = 0;
const BUSY: u8 = 1;
const IDLE: u8 = 2;
const TUNNEL: u8 = 3;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(NONE)
}

// === impl ConnState ===

impl ConnState {
    /// A connection accepted now.
    #[cfg(test)]
    pub(crate) fn new(t: ConnLimits) -> Arc<Self> {
        Self::since(t, Instant::now())
    }

    /// As [`ConnState::new`] for a connection accepted at `origin` (a TLS
    /// handshake since then counts against `client_header_timeout`, as
    /// in nginx).
    pub(crate) fn since(t: ConnLimits, origin: Instant) -> Arc<Self> {
        let header_ms = ms(t.header);
        Arc::new(Self {
            origin,
            origin_tick: Tick::of(origin),
            phase: AtomicU8::new(HEADER),
            phase_deadline: AtomicU64::new(header_ms),
            write_deadline: AtomicU64::new(NONE),
            in_flight: AtomicU32::new(0),
            h2: AtomicBool::new(false),
            client_gone: AtomicBool::new(false),
            header_ms,
            keepalive_ms: AtomicU64::new(ms(t.keepalive)),
            send_ms: AtomicU64::new(ms(t.send)),
            waker: AtomicWaker::new(),
            head: std::sync::Mutex::new(None),
        })
    }

    /// Milliseconds since `origin`, by the worker's cached clock (as
    /// nginx sets its timers from `ngx_current_msec`): a deadline may be
    /// early by the reading's age, the time since the worker's last wait
    /// for events (or its last 32 cached readings, on a loop that does not
    /// wait).
    fn now_ms(&self) -> u64 {
        vigil_net::clock::coarse_tick().millis_since(self.origin_tick)
    }

    fn after(&self, timeout_ms: u64) -> u64 {
        self.now_ms().saturating_add(timeout_ms)
    }

    fn at(&self, deadline_ms: u64) -> Option<Instant> {
        if deadline_ms == NONE {
            return None;
        }
        self.origin.checked_add(Duration::from_millis(deadline_ms))
    }

    /// The client closed or reset the connection while its request was
    /// being served (HTTP/1: nginx's broken-connection check; the handler
    /// ends its attempts unless `proxy_ignore_client_abort` is on).
    pub(crate) fn client_gone(&self) -> bool {
        self.client_gone.load(Ordering::Relaxed)
    }

    /// HTTP/1: the head of the request in service (None between requests
    /// and on HTTP/2, whose field names are lower case on the wire). The
    /// upstream request writes each client field under the name's spelling
    /// in it, as nginx passes a field's name as the client wrote it.
    pub(crate) fn request_head(&self) -> Option<bytes::Bytes> {
        self.head.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// See [`ConnState::request_head`].
    pub(crate) fn set_request_head(&self, head: Option<bytes::Bytes>) {
        *self.head.lock().unwrap_or_else(|p| p.into_inner()) = head;
    }

    /// See [`ConnState::client_gone`].
    pub(crate) fn set_client_gone(&self) {
        self.client_gone.store(true, Ordering::Relaxed);
    }

    /// Bytes came from the client.
    fn on_read(&self) {
        if self.phase.load(Ordering::Relaxed) != IDLE {
            return;
        }
        if self.h2.load(Ordering::Relaxed) {
            // Any frame keeps an idle HTTP/2 connection (nginx re-arms its
            // idle timer on every read).
            let ka = self.keepalive_ms.load(Ordering::Relaxed);
            self.phase_deadline.store(self.after(ka), Ordering::Relaxed);
        } else {
            // The first byte of the next request: the header timer starts.
            self.phase.store(HEADER, Ordering::Relaxed);
            self.phase_deadline
                .store(self.after(self.header_ms), Ordering::Relaxed);
        }
    }

    /// A write could not proceed: `send_timeout` runs unless it already does.
    fn on_write_blocked(&self) {
        if self.write_deadline.load(Ordering::Relaxed) == NONE {
            let send = self.send_ms.load(Ordering::Relaxed);
            self.write_deadline
                .store(self.after(send), Ordering::Relaxed);
        }
    }

    /// A write went through.
    fn on_written(&self) {
        if self.write_deadline.load(Ordering::Relaxed) == NONE {
            return;
        }
        self.write_deadline.store(NONE, Ordering::Relaxed);
        if self.phase.load(Ordering::Relaxed) == IDLE {
            // The end of the response is out only now: idle from here.
            let ka = self.keepalive_ms.load(Ordering::Relaxed);
            self.phase_deadline.store(self.after(ka), Ordering::Relaxed);
        }
    }

    /// A request header is complete.
    fn request(&self, version: Version) {
        if version == Version::HTTP_2 && !self.h2.load(Ordering::Relaxed) {
            self.h2.store(true, Ordering::Relaxed);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if self.phase.load(Ordering::Relaxed) != TUNNEL {
            self.phase.store(BUSY, Ordering::Relaxed);
            self.phase_deadline.store(NONE, Ordering::Relaxed);
        }
    }

    /// A request is over (its response body dropped by hyper).
    fn finished(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) != 1
            || self.phase.load(Ordering::Relaxed) == TUNNEL
        {
            return;
        }
        self.phase.store(IDLE, Ordering::Relaxed);
        let ka = self.keepalive_ms.load(Ordering::Relaxed);
        self.phase_deadline.store(self.after(ka), Ordering::Relaxed);
        if self.h2.load(Ordering::Relaxed) {
            // HTTP/2 streams run in their own tasks.
            self.waker.wake();
        }
    }

    fn set_location(&self, settings: &ProxySettings) {
        self.keepalive_ms
            .store(ms(settings.client_keepalive_timeout), Ordering::Relaxed);
        self.send_ms
            .store(ms(settings.client_send_timeout), Ordering::Relaxed);
    }

    /// The connection became a tunnel (101): no client timers any more.
    fn upgraded(&self) {
        self.phase.store(TUNNEL, Ordering::Relaxed);
        self.phase_deadline.store(NONE, Ordering::Relaxed);
        self.write_deadline.store(NONE, Ordering::Relaxed);
    }

    /// The deadline in force (milliseconds since accept) and what it
    /// guards: the write in progress, else the phase's. One rule for both
    /// [`ConnState::deadline`] and [`ConnState::expired`], so that a
    /// deadline that has passed is always an expiry.
    fn due(&self) -> Option<(u64, Expiry)> {
        let phase = self.phase.load(Ordering::Relaxed);
        if phase == TUNNEL {
            return None;
        }
        match self.write_deadline.load(Ordering::Relaxed) {
            NONE => {}
            w => return Some((w, Expiry::Send)),
        }
        let p = self.phase_deadline.load(Ordering::Relaxed);
        if p == NONE {
            return None;
        }
        match phase {
            HEADER => Some((p, Expiry::Header)),
            // A stream that started as the last one ended (HTTP/2, another
            // thread) keeps the connection busy.
            IDLE if self.in_flight.load(Ordering::Acquire) == 0 => Some((p, Expiry::Idle)),
            _ => None,
        }
    }

    /// When the connection must be closed, if nothing changes.
    fn deadline(&self) -> Option<Instant> {
        self.due().and_then(|(d, _)| self.at(d))
    }

    /// Which deadline has passed at `now`, if one has.
    fn expired(&self, now: Instant) -> Option<Expiry> {
        let (d, why) = self.due()?;
        let now = ms(now.saturating_duration_since(self.origin));
        (now >= d).then_some(why)
    }

    /// Give a connection that was told to go away `grace` to do so.
    fn extend(&self, grace: Duration) {
        self.phase_deadline
            .store(self.after(ms(grace)), Ordering::Relaxed);
    }
}

// === impl Expiry ===

impl std::fmt::Display for Expiry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Expiry::Header => "while reading the request header (client_header_timeout)",
            Expiry::Idle => "while idle (keepalive_timeout)",
            Expiry::Send => "while sending to the client (send_timeout)",
        })
    }
}

/// What applies on an address before a request picks its server and
/// location: the address's default server's limits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DefaultServer {
    /// The connection's first timeouts.
    pub(crate) timeouts: ConnLimits,
    /// How request heads are judged (`large_client_header_buffers`,
    /// `underscores_in_headers`, `ignore_invalid_headers`).
    pub(crate) limits: HeadLimits,
}

// === impl DefaultServer ===

impl DefaultServer {
    /// The limits of `server` (nginx's defaults without one).
    pub(crate) fn of(server: Option<&ServerBlock>) -> Self {
        let client = server.map(|s| s.client.clone()).unwrap_or_default();
        // Before a location is known: the server's first location's (which
        // inherit the server's), else nginx's defaults.
        let fallback = ProxySettings::default();
        let loc = server
            .and_then(|s| s.locations.first())
            .map_or(&fallback, |l| &l.proxy);
        Self {
            timeouts: ConnLimits {
                header: client.header_timeout,
                keepalive: loc.client_keepalive_timeout,
                send: loc.client_send_timeout,
            },
            limits: HeadLimits::of(&client),
        }
    }

    /// hyper's `max_buf_size`: above the gate's own bound of the head
    /// (`crate::wire::request_check` refuses a head as nginx does, with nginx's
    /// status), and never below hyper's default.
    pub(crate) fn max_buf(&self) -> usize {
        self.limits
            .max_head()
            .saturating_add(16 * 1024)
            .max(8192 + 4096 * 100)
    }
}

#[cfg(test)]
mod tests;
