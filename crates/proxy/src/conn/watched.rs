//! Driving a hyper connection under its deadline: one sleep, re-armed only
//! when it fires before the (moved) deadline or when the deadline moves
//! earlier; dropping the connection when the deadline passes; draining it
//! (finish the request in flight, then close) on a signal.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::server::graceful::GracefulConnection;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

use super::{ConnState, Expiry};

/// A connection that can be told to finish its requests and close: hyper's
/// ([`GracefulConnection`]) or vigil's own HTTP/1 loop (`crate::wire::h1`).
pub(crate) trait Graceful: Future<Output = Result<(), Self::Failure>> {
    /// What the connection fails with.
    type Failure;
    /// Finish the request in flight (none: close now), then close.
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<C: GracefulConnection> Graceful for C {
    type Failure = C::Error;

    fn graceful_shutdown(self: Pin<&mut Self>) {
        GracefulConnection::graceful_shutdown(self);
    }
}

/// A hyper connection driven under its deadline and drained on `drain`.
pub(crate) struct Watched<C> {
    conn: Pin<Box<C>>,
    state: Arc<ConnState>,
    sleep: Pin<Box<Sleep>>,
    armed: Option<Instant>,
    /// The sleep was polled since it was last armed: the task's waker is
    /// registered with it (tokio's timer clones and swaps the waker at each
    /// poll, two reference counts and a lock; a connection's task wakes
    /// about twice a request).
    waiting: bool,
    drain: Arc<Drain>,
    /// Registered once, on the first poll; kept so the task stays registered.
    drain_wake: Pin<Box<OwnedNotified>>,
    registered: bool,
    draining: bool,
}

/// Tells every connection of a listener to finish its requests and close.
/// A flag read on each poll (an atomic load) and one registration per
/// connection, not a lock per poll.
#[derive(Debug, Default)]
pub(crate) struct Drain {
    on: AtomicBool,
    notify: Arc<Notify>,
}

/// How a watched connection ended.
#[derive(Debug)]
pub(crate) enum Closed<E> {
    /// hyper finished it (the client closed, or an error).
    Done(Result<(), E>),
    /// A deadline passed and vigil closed it.
    TimedOut(Expiry),
}

/// After an HTTP/2 GOAWAY for idleness, how long the client may take to close.
const GOAWAY_GRACE: Duration = Duration::from_secs(1);

// === impl Drain ===

impl Drain {
    /// Drain now.
    pub(crate) fn start(&self) {
        self.on.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }
}

// === impl Watched ===

impl<C> Watched<C>
where
    C: Graceful,
{
    /// Drive `conn` under `state`'s deadline; on `drain`, finish the
    /// request in flight (HTTP/2: the open streams) and close.
    pub(crate) fn new(conn: C, state: Arc<ConnState>, drain: Arc<Drain>) -> Self {
        let first = state.deadline();
        let far = Instant::now() + Duration::from_secs(86400 * 365);
        Self {
            conn: Box::pin(conn),
            sleep: Box::pin(tokio::time::sleep_until(first.unwrap_or(far))),
            armed: first,
            waiting: false,
            state,
            drain_wake: Box::pin(drain.notify.clone().notified_owned()),
            drain,
            registered: false,
            draining: false,
        }
    }

    fn go_away(&mut self) {
        if !self.draining {
            self.draining = true;
            self.conn.as_mut().graceful_shutdown();
        }
    }
}

impl<C> Future for Watched<C>
where
    C: Graceful,
{
    type Output = Closed<C::Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if !this.registered {
            // The task's waker does not change: one registration is enough.
            this.registered = true;
            let _ = this.drain_wake.as_mut().poll(cx);
        }
        if !this.draining && this.drain.on.load(Ordering::Acquire) {
            this.go_away();
        }
        if let Poll::Ready(r) = this.conn.as_mut().poll(cx) {
            return Poll::Ready(Closed::Done(r));
        }
        if this.state.h2.load(Ordering::Relaxed) {
            // Streams end in their own tasks and may set the deadline.
            this.state.waker.register(cx.waker());
        }
        loop {
            let Some(deadline) = this.state.deadline() else {
                return Poll::Pending;
            };
            // Re-arm only when the deadline moved earlier than the sleep;
            // a later one is noticed when the sleep fires.
            if this.armed.is_none_or(|a| deadline < a) {
                this.sleep.as_mut().reset(deadline);
                this.armed = Some(deadline);
                this.waiting = false;
            }
            // Registered already with this task's waker (which does not
            // change) and not fired: nothing to poll.
            if this.waiting && !this.sleep.is_elapsed() {
                return Poll::Pending;
            }
            if this.sleep.as_mut().poll(cx).is_pending() {
                this.waiting = true;
                return Poll::Pending;
            }
            this.armed = None;
            this.waiting = false;
            match this.state.expired(Instant::now()) {
                None => continue,
                Some(Expiry::Idle) if this.state.h2.load(Ordering::Relaxed) && !this.draining => {
                    // nginx ends an idle HTTP/2 connection with a GOAWAY.
                    this.go_away();
                    this.state.extend(GOAWAY_GRACE);
                    if let Poll::Ready(r) = this.conn.as_mut().poll(cx) {
                        return Poll::Ready(Closed::Done(r));
                    }
                }
                Some(why) => return Poll::Ready(Closed::TimedOut(why)),
            }
        }
    }
}
