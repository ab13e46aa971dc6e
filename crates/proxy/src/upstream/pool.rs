//! Idle upstream connections, per upstream: `keepalive N` keeps at most N
//! idle connections (the least recently used go first). It is a cache, not
//! a cap: connections in use are never limited by it (seed 003).
//!
//! A plain mutex: the pool changes on every use and is rarely contended,
//! as hyper-util's legacy pool does it.
//!
//! One shard per worker ([`crate::conn::shard::count`]), each an allocation of
//! its own padded to its own cache lines: a worker's check-out and
//! check-in, and the response body that holds its shard until it checks
//! the connection in, write nothing another worker's requests write
//! (where the shards side by side in one slice had two workers' locks on
//! one cache line, and every body cloned the one `Arc` of the pool).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vigil_net::clock::Tick;

use crossbeam_utils::CachePadded;
use vigil_core::config::UpstreamConfig;
use vigil_core::peer::PeerId;

use crate::upstream::H1;

/// Idle connections of one upstream, one shard per worker (as nginx keeps
/// `keepalive N` per worker process): a connection is only reused by the
/// worker whose event loop drives it.
pub(crate) struct Pool {
    shards: Box<[Arc<Shard>]>,
}

/// One worker's idle connections of an upstream.
pub(crate) struct Shard {
    idle: CachePadded<Mutex<VecDeque<Conn>>>,
    cap: usize,
    timeout: Duration,
    max_requests: u32,
}

/// A connection to one peer.
pub(crate) struct Conn {
    pub(crate) peer: PeerId,
    pub(crate) link: Link,
    pub(crate) idle_since: Tick,
    pub(crate) requests: u32,
}

/// What carries a connection's requests.
pub(crate) enum Link {
    /// HTTP/1.1 (plain, TLS or unix), driven by the request's own task.
    H1(H1),
    /// Lent to the response body that is being read on it.
    Lent,
}

impl Link {
    /// Closed, as far as can be seen without a syscall.
    fn is_closed(&self) -> bool {
        match self {
            Link::H1(_) => false,
            Link::Lent => true,
        }
    }

    /// Usable for a request now (probed for a close or stray bytes,
    /// without waiting).
    fn is_usable(&mut self) -> bool {
        match self {
            Link::H1(h) => h.is_usable(),
            Link::Lent => false,
        }
    }
}

impl Pool {
    /// A pool per the upstream's `keepalive` settings (none: no pooling).
    pub(crate) fn new(config: &UpstreamConfig) -> Self {
        let (cap, timeout, max_requests) = config
            .keepalive
            .as_ref()
            .map_or((0, Duration::ZERO, 0), |k| {
                (k.idle.get() as usize, k.timeout, k.requests)
            });
        let shards = if cap == 0 {
            1
        } else {
            crate::conn::shard::count()
        };
        Self {
            shards: (0..shards)
                .map(|_| {
                    Arc::new(Shard {
                        idle: CachePadded::new(Mutex::new(VecDeque::new())),
                        cap,
                        timeout,
                        max_requests,
                    })
                })
                .collect(),
        }
    }

    /// Whether connections are kept at all.
    pub(crate) fn enabled(&self) -> bool {
        self.shards.first().is_some_and(|s| s.cap > 0)
    }

    /// Idle connections held now, over all workers.
    pub(crate) fn idle_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.idle.lock().map_or(0, |q| q.len()))
            .sum()
    }

    /// This worker's shard, for a response body to check its connection
    /// in to when it ends (None: no pooling).
    pub(crate) fn shard(&self) -> Option<&Arc<Shard>> {
        crate::conn::shard::of(&self.shards).filter(|s| s.cap > 0)
    }

    /// Take the most recently used idle connection to `peer`, if any.
    pub(crate) fn checkout(&self, peer: PeerId) -> Option<Conn> {
        self.shard()?.checkout(peer)
    }

    /// Give a connection back after a complete response.
    pub(crate) fn checkin(&self, conn: Conn) {
        if let Some(s) = self.shard() {
            s.checkin(conn);
        }
    }
}

// === impl Shard ===

impl Shard {
    fn checkout(&self, peer: PeerId) -> Option<Conn> {
        let mut q = self.idle.lock().ok()?;
        let now = vigil_net::clock::coarse_tick();
        // The oldest go first when they expire; the newest is reused first.
        while q
            .front()
            .is_some_and(|c| c.link.is_closed() || now.since(c.idle_since) >= self.timeout)
        {
            q.pop_front();
        }
        loop {
            let i = q.iter().rposition(|c| c.peer == peer)?;
            let mut c = q.remove(i)?;
            if now.since(c.idle_since) < self.timeout && c.link.is_usable() {
                return Some(c);
            }
        }
    }

    /// Give a connection back after a complete response.
    pub(crate) fn checkin(&self, mut conn: Conn) {
        if self.cap == 0
            || conn.link.is_closed()
            || (self.max_requests != 0 && conn.requests >= self.max_requests)
        {
            return;
        }
        conn.idle_since = vigil_net::clock::coarse_tick();
        if let Ok(mut q) = self.idle.lock() {
            if q.len() >= self.cap {
                q.pop_front();
            }
            q.push_back(conn);
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("cap", &self.shards.first().map_or(0, |s| s.cap))
            .field("idle", &self.idle_count())
            .finish()
    }
}
