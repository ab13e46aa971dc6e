//! The admin listener's open connections, and which one gives way when
//! they are at the cap. As nginx reuses its idle keep-alive connections when
//! `worker_connections` run out (`ngx_drain_connections`), a new connection
//! at the cap closes the one that has waited longest without a request in
//! hand: one waiting for (the rest of) a request head, since it was accepted
//! or since its last response ended (idle keep-alive, slowloris), or one
//! whose response write has stalled, since it stalled. A connection whose
//! request is being answered and written is never closed for another; only
//! when all are, is the new one closed at once. So 256 idle or slow clients
//! cannot keep an operator's `vigil status` out.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The open connections (shared by the accept loop and every connection).
#[derive(Debug)]
pub(super) struct Slots {
    max: usize,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    open: Vec<Entry>,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    /// Cancelled when the connection is closed to make room.
    close: CancellationToken,
    /// A request is being answered (from the service's call to the end of
    /// its response body).
    answering: bool,
    /// Since when it has waited for a request head.
    waiting_since: Instant,
    /// Since when its writes have made no progress.
    stalled_since: Option<Instant>,
}

/// What the accept loop does with a new connection.
#[derive(Debug)]
pub(super) enum Admission {
    /// Room was free.
    Admitted(Place),
    /// Another connection was closed to make room.
    Evicted(Place),
    /// Every connection is answering a request: close the new one.
    Full,
}

/// One connection's place, held by its task and released on drop.
#[derive(Debug)]
pub(super) struct Place(Slot);

/// A handle on a place, to tell it what the connection is doing.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    slots: Arc<Slots>,
    id: u64,
    close: CancellationToken,
}

/// A response body that tells its slot when the response is done (dropped).
pub(super) struct Answered<B> {
    body: B,
    slot: Slot,
}

// === impl Slots ===

impl Slots {
    pub(super) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            table: Mutex::new(Table::default()),
        })
    }

    /// Take a place for a connection accepted `now`.
    pub(super) fn admit(self: &Arc<Self>, now: Instant) -> Admission {
        let mut t = self.lock();
        let evicted = if t.open.len() < self.max {
            false
        } else {
            let victim = t
                .open
                .iter()
                .enumerate()
                .filter_map(|(i, e)| e.evictable_since().map(|since| (since, i)))
                .min();
            let Some((_, i)) = victim else {
                return Admission::Full;
            };
            t.open.swap_remove(i).close.cancel();
            true
        };
        t.next_id += 1;
        let id = t.next_id;
        let close = CancellationToken::new();
        t.open.push(Entry {
            id,
            close: close.clone(),
            answering: false,
            waiting_since: now,
            stalled_since: None,
        });
        let place = Place(Slot {
            slots: self.clone(),
            id,
            close,
        });
        if evicted {
            Admission::Evicted(place)
        } else {
            Admission::Admitted(place)
        }
    }

    /// Connections open now.
    #[cfg(test)]
    pub(super) fn open(&self) -> usize {
        self.lock().open.len()
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic elsewhere while holding it leaves a table that is still whole.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, id: u64, f: impl FnOnce(&mut Entry)) {
        if let Some(e) = self.lock().open.iter_mut().find(|e| e.id == id) {
            f(e);
        }
    }
}

// === impl Entry ===

impl Entry {
    fn evictable_since(&self) -> Option<Instant> {
        match self.stalled_since {
            Some(s) => Some(s),
            None => (!self.answering).then_some(self.waiting_since),
        }
    }
}

// === impl Slot ===

impl Slot {
    /// A request head was read: it is being answered.
    pub(super) fn answering(&self) {
        self.slots.update(self.id, |e| e.answering = true);
    }

    /// Its response is done: waiting for the next request from `now`.
    pub(super) fn answered(&self, now: Instant) {
        self.slots.update(self.id, |e| {
            e.answering = false;
            e.waiting_since = now;
        });
    }

    /// A write could not proceed at `now` (the first time it is told so
    /// counts) or, with None, made progress.
    pub(super) fn stalled(&self, now: Option<Instant>) {
        self.slots.update(self.id, |e| match now {
            Some(t) => {
                e.stalled_since.get_or_insert(t);
            }
            None => e.stalled_since = None,
        });
    }

    /// `body` reports the end of the response to this slot when dropped.
    pub(super) fn answer<B>(&self, body: B) -> Answered<B> {
        self.answering();
        Answered {
            body,
            slot: self.clone(),
        }
    }
}

// === impl Place ===

impl Place {
    /// A handle for the connection's bodies and writer.
    pub(super) fn slot(&self) -> Slot {
        self.0.clone()
    }

    /// Cancelled when this connection is closed to make room for another.
    pub(super) fn closed(&self) -> &CancellationToken {
        &self.0.close
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let id = self.0.id;
        self.0.slots.lock().open.retain(|e| e.id != id);
    }
}

// === impl Answered ===

impl<B: Body<Data = Bytes> + Unpin> Body for Answered<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> Drop for Answered<B> {
    fn drop(&mut self) {
        self.slot.answered(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn place(a: Admission) -> Place {
        match a {
            Admission::Admitted(p) | Admission::Evicted(p) => p,
            Admission::Full => panic!("no place"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_waiting_gives_way_and_one_answering_never_does() {
        let slots = Slots::new(3);
        let at = |n: u64| Instant::now() + Duration::from_secs(n);
        let a = place(slots.admit(at(0)));
        let b = place(slots.admit(at(1)));
        let c = place(slots.admit(at(2)));
        let n = match slots.admit(at(2)) {
            Admission::Evicted(p) => p,
            other => panic!("at the cap the oldest wait gives way: {other:?}"),
        };
        assert!(a.closed().is_cancelled());
        drop(a);
        assert_eq!(slots.open(), 3, "a's place was n's already");
        // b answers a request; c answered one at 3s; n waits since 2s.
        b.slot().answering();
        c.slot().answering();
        c.slot().answered(at(3));
        let d = place(slots.admit(at(4)));
        assert!(n.closed().is_cancelled());
        assert!(!b.closed().is_cancelled() && !c.closed().is_cancelled());
        drop(n);
        // A stalled write gives way from when it stalled (2s), before c (3s).
        b.slot().stalled(Some(at(2)));
        let e = place(slots.admit(at(5)));
        assert!(b.closed().is_cancelled() && !c.closed().is_cancelled());
        drop(b);
        // Every connection answering: the new one is refused.
        for p in [&c, &d, &e] {
            p.slot().answering();
        }
        assert!(matches!(slots.admit(at(6)), Admission::Full));
        // A writer that made progress again is answering, not stalled.
        c.slot().stalled(Some(at(6)));
        c.slot().stalled(None);
        assert!(matches!(slots.admit(at(7)), Admission::Full));
        // A response's end puts its connection back among the waiting.
        drop(d.slot().answer(()));
        assert!(matches!(slots.admit(at(8)), Admission::Evicted(_)));
        assert!(d.closed().is_cancelled() && !c.closed().is_cancelled());
        drop((c, d, e));
        assert_eq!(slots.open(), 0);
    }
}
