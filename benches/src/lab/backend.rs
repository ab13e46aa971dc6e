//! A backend on 127.0.0.1 whose behaviour a scenario switches at run time,
//! and the ledger of every request the backends received.
//!
//! Every response carries `X-Backend: N` (the backend's index) so a client
//! knows who answered. A request the load driver sent carries `X-Req-Id`;
//! each delivery of one is written to the shared [`Ledger`], so the same id
//! seen twice is a retry (a POST seen twice: a duplicate delivery). A request
//! without the header (a health probe) is only counted.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{timeout, Instant};

use super::wire::{BodyEnd, Head, Reader};

/// What a backend does with the next request (or connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// `200` with the configured body, `Content-Length`, keep-alive.
    Ok,
    /// `200` announcing the whole body, then half of it, then a reset
    /// (SO_LINGER 0). Probes get the same.
    PartialBody,
    /// `503` to a POST, `200` to anything else.
    Status503ForPost,
    /// Reads the request and never answers (the connection stays open
    /// until the other side closes it).
    Hang,
    /// Answers as `Ok` after this delay.
    Slow(Duration),
    /// New connections are never accepted and their SYNs go unanswered
    /// (the listener's backlog is shrunk to 0 and filled); established
    /// connections behave as `Hang` (their packets are lost too).
    Blackhole,
    /// The port is closed (connections refused); established connections
    /// are reset.
    Refuse,
}

/// Settings of one backend.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// Body size of a `200`, in bytes.
    pub body_size: usize,
    /// Under `PartialBody`, how long the backend waits between the part it
    /// sends and the reset (default 0: at once; on loopback the bytes
    /// written before a reset are still read by the proxy, the header
    /// included). A proxy can charge the failure only when it reads the
    /// reset, so every request picked for the peer in the meantime is cut
    /// too: a longer pause means more cut responses per exclusion.
    pub cut_after: Duration,
}

/// One delivery of a request that carried `X-Req-Id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// The load driver's request id.
    pub id: u64,
    /// The backend that received it.
    pub backend: usize,
    /// Whether it was a POST.
    pub post: bool,
    /// When its head was read, since the ledger was made.
    pub at: Duration,
}

/// Every delivery to every backend of one lab.
#[derive(Debug)]
pub struct Ledger {
    start: Instant,
    deliveries: Mutex<Vec<Delivery>>,
}

/// What one backend received, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// GETs (and HEADs) with an id.
    pub get: u64,
    /// POSTs with an id.
    pub post: u64,
    /// Requests without an id: health probes.
    pub probes: u64,
}

/// A running backend; dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct Backend {
    index: usize,
    addr: SocketAddr,
    shared: Arc<Shared>,
    control: watch::Sender<(u64, Behaviour)>,
    applied: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
struct Shared {
    index: usize,
    options: BackendOptions,
    body: Vec<u8>,
    ledger: Arc<Ledger>,
    get: AtomicU64,
    post: AtomicU64,
    probes: AtomicU64,
}

/// The accept loop's side of the switch.
struct Acceptor {
    addr: SocketAddr,
    shared: Arc<Shared>,
    control: watch::Receiver<(u64, Behaviour)>,
    applied: watch::Sender<u64>,
    conns: JoinSet<()>,
}

// === impl BackendOptions ===

impl Default for BackendOptions {
    fn default() -> Self {
        Self {
            body_size: 1024,
            cut_after: Duration::ZERO,
        }
    }
}

// === impl Ledger ===

impl Ledger {
    /// An empty ledger; delivery times count from now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            deliveries: Mutex::new(Vec::new()),
        })
    }

    /// When the ledger was made (the zero of [`Delivery::at`]).
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Every delivery so far, in arrival order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.lock().clone()
    }

    /// Deliveries beyond the first of each id (retries the backends saw),
    /// as (of GETs, of POSTs). A POST here is a duplicate delivery.
    pub fn repeats(&self) -> (usize, usize) {
        let mut d = self.deliveries();
        d.sort_by_key(|d| d.id);
        let (mut get, mut post) = (0, 0);
        for w in d.windows(2) {
            if w[0].id == w[1].id {
                if w[1].post {
                    post += 1;
                } else {
                    get += 1;
                }
            }
        }
        (get, post)
    }

    fn record(&self, d: Delivery) {
        self.lock().push(d);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Delivery>> {
        // A poisoned lock only means a backend task panicked mid-push; the
        // list is still a list.
        self.deliveries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

// === impl Backend ===

impl Backend {
    /// Start backend `index` on an ephemeral port of 127.0.0.1, behaving
    /// as `Ok`.
    pub async fn start(
        index: usize,
        ledger: Arc<Ledger>,
        options: BackendOptions,
    ) -> io::Result<Self> {
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = listener.local_addr()?;
        let body = (0..options.body_size)
            .map(|i| b"abcdefghijklmnopqrstuvwxyz"[i % 26])
            .collect();
        let shared = Arc::new(Shared {
            index,
            options,
            body,
            ledger,
            get: AtomicU64::new(0),
            post: AtomicU64::new(0),
            probes: AtomicU64::new(0),
        });
        let (control, control_rx) = watch::channel((0, Behaviour::Ok));
        let (applied_tx, applied) = watch::channel(0);
        let acceptor = Acceptor {
            addr,
            shared: shared.clone(),
            control: control_rx,
            applied: applied_tx,
            conns: JoinSet::new(),
        };
        let task = tokio::spawn(acceptor.run(listener));
        Ok(Self {
            index,
            addr,
            shared,
            control,
            applied,
            task,
        })
    }

    /// Its index (the `X-Backend` value).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The behaviour now.
    pub fn behaviour(&self) -> Behaviour {
        self.control.borrow().1
    }

    /// Switch to `b`. Request behaviours apply to the next request read;
    /// `Blackhole` and `Refuse` return once the listener is in that state
    /// (for `Blackhole`: a connect to it was seen to time out).
    pub async fn set(&self, b: Behaviour) -> io::Result<()> {
        let mut generation = 0;
        self.control.send_modify(|(g, old)| {
            *g += 1;
            generation = *g;
            *old = b;
        });
        let mut applied = self.applied.clone();
        let wait = async { applied.wait_for(|&g| g >= generation).await.map(|_| ()) };
        match timeout(Duration::from_secs(10), wait).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(io::Error::other(format!(
                "backend {} ({}): its accept loop ended before applying {b:?}",
                self.index, self.addr
            ))),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "backend {} ({}): {b:?} not applied within 10s",
                    self.index, self.addr
                ),
            )),
        }
    }

    /// What it received so far.
    pub fn counts(&self) -> Counts {
        Counts {
            get: self.shared.get.load(Ordering::Relaxed),
            post: self.shared.post.load(Ordering::Relaxed),
            probes: self.shared.probes.load(Ordering::Relaxed),
        }
    }

    /// Its deliveries from the shared ledger.
    pub fn deliveries(&self) -> Vec<Delivery> {
        let mut d = self.shared.ledger.deliveries();
        d.retain(|d| d.backend == self.index);
        d
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// === impl Acceptor ===

impl Acceptor {
    async fn run(mut self, listener: TcpListener) {
        let mut listener = Some(listener);
        // Connections this loop made to fill its own accept queue.
        let mut fillers: Vec<TcpStream> = Vec::new();
        loop {
            let (generation, b) = *self.control.borrow_and_update();
            match b {
                Behaviour::Refuse => {
                    listener = None;
                    fillers.clear();
                }
                Behaviour::Blackhole => {
                    let Some(l) = self.ensure(&mut listener) else {
                        return;
                    };
                    if fillers.is_empty() {
                        match blackhole(l, self.addr).await {
                            Ok(f) => fillers = f,
                            Err(e) => eprintln!("lab: backend {}: {e}", self.shared.index),
                        }
                    }
                }
                _ => {
                    let Some(l) = self.ensure(&mut listener) else {
                        return;
                    };
                    if !fillers.is_empty() {
                        fillers.clear();
                        let _ = socket2::SockRef::from(l).listen(1024);
                    }
                }
            }
            let _ = self.applied.send(generation);
            let accepting = !matches!(b, Behaviour::Refuse | Behaviour::Blackhole);
            tokio::select! {
                changed = self.control.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                accepted = accept(listener.as_ref()), if accepting => {
                    if let Ok((stream, _)) = accepted {
                        let (shared, control) = (self.shared.clone(), self.control.clone());
                        self.conns.spawn(serve(stream, shared, control));
                    }
                }
            }
            // Reap finished connections.
            while self.conns.try_join_next().is_some() {}
        }
    }

    /// The listener, bound again on the same address after a `Refuse`.
    fn ensure<'a>(&self, listener: &'a mut Option<TcpListener>) -> Option<&'a TcpListener> {
        if listener.is_none() {
            match bind(self.addr) {
                Ok(l) => *listener = Some(l),
                Err(e) => {
                    eprintln!(
                        "lab: backend {}: cannot listen on {} again: {e}",
                        self.shared.index, self.addr
                    );
                    return None;
                }
            }
        }
        listener.as_ref()
    }
}

async fn accept(l: Option<&TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match l {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = TcpSocket::new_v4()?;
    s.set_reuseaddr(true)?;
    s.bind(addr)?;
    s.listen(1024)
}

/// Shrink the backlog of `l` (which nobody accepts from now on) to 0 and
/// fill it with our own connections until a connect times out: from then
/// on the kernel drops SYNs to it (`tcp_abort_on_overflow` = 0, Linux's
/// default), so a client's connect hangs until its own timeout.
async fn blackhole(l: &TcpListener, addr: SocketAddr) -> io::Result<Vec<TcpStream>> {
    socket2::SockRef::from(l).listen(0)?;
    let mut fillers = Vec::new();
    for _ in 0..16 {
        match timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => fillers.push(s),
            Ok(Err(e)) => return Err(io::Error::other(format!("filling the backlog: {e}"))),
            Err(_) => return Ok(fillers),
        }
    }
    Err(io::Error::other(format!(
        "{addr}: 16 connects went through a backlog of 0: SYNs are not dropped here"
    )))
}

/// One connection: requests in, behaviour-driven answers out.
async fn serve(
    stream: TcpStream,
    shared: Arc<Shared>,
    mut control: watch::Receiver<(u64, Behaviour)>,
) {
    let _ = stream.set_nodelay(true);
    let mut r = Reader::new(stream);
    loop {
        let head = tokio::select! {
            head = r.head() => head,
            () = refused(&mut control) => return reset(r.get_ref()),
        };
        let Ok(Some(head)) = head else { return };
        let post = head.method().eq_ignore_ascii_case("POST");
        let n = head.content_length().unwrap_or(0);
        if r.body(n).await.1 == BodyEnd::CutShort {
            return;
        }
        shared.count(&head, post);
        let b = control.borrow().1;
        let close = head.closes();
        let keep = match b {
            Behaviour::Ok => shared.answer(&mut r, 200, close).await,
            Behaviour::Slow(d) => {
                tokio::time::sleep(d).await;
                shared.answer(&mut r, 200, close).await
            }
            Behaviour::Status503ForPost if post => shared.answer(&mut r, 503, close).await,
            Behaviour::Status503ForPost => shared.answer(&mut r, 200, close).await,
            Behaviour::PartialBody => {
                shared.partial(&mut r).await;
                false
            }
            Behaviour::Refuse => {
                reset(r.get_ref());
                false
            }
            Behaviour::Hang | Behaviour::Blackhole => {
                // Never answer; hold the connection until the other side
                // closes it, or the port is "closed".
                let mut sink = [0u8; 4096];
                loop {
                    tokio::select! {
                        n = tokio::io::AsyncReadExt::read(r.get_mut(), &mut sink) => {
                            if !matches!(n, Ok(n) if n > 0) {
                                return;
                            }
                        }
                        () = refused(&mut control) => return reset(r.get_ref()),
                    }
                }
            }
        };
        if !keep {
            return;
        }
    }
}

/// Resolves when the behaviour becomes `Refuse` (never, if the sender is gone).
async fn refused(control: &mut watch::Receiver<(u64, Behaviour)>) {
    if control
        .wait_for(|(_, b)| *b == Behaviour::Refuse)
        .await
        .is_err()
    {
        std::future::pending::<()>().await;
    }
}

/// Close with a reset (SO_LINGER 0).
fn reset(s: &TcpStream) {
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
}

// === impl Shared ===

impl Shared {
    fn count(&self, head: &Head, post: bool) {
        let id = head.field("x-req-id").and_then(|v| v.trim().parse().ok());
        let Some(id) = id else {
            self.probes.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if post {
            self.post.fetch_add(1, Ordering::Relaxed);
        } else {
            self.get.fetch_add(1, Ordering::Relaxed);
        }
        self.ledger.record(Delivery {
            id,
            backend: self.index,
            post,
            at: self.ledger.start.elapsed(),
        });
    }

    /// Write a whole response; whether the connection stays open.
    async fn answer(&self, r: &mut Reader<TcpStream>, status: u16, close: bool) -> bool {
        let (reason, body): (&str, &[u8]) = match status {
            200 => ("OK", &self.body),
            _ => ("Service Unavailable", b"busy\n"),
        };
        let mut out = self.head(status, reason, body.len(), close).into_bytes();
        out.extend_from_slice(body);
        r.get_mut().write_all(&out).await.is_ok() && !close
    }

    /// The `PartialBody` answer: the whole header, half the body, a reset.
    async fn partial(&self, r: &mut Reader<TcpStream>) {
        let half = self.body.len() / 2;
        let mut out = self.head(200, "OK", self.body.len(), false).into_bytes();
        out.extend_from_slice(&self.body[..half]);
        if r.get_mut().write_all(&out).await.is_ok() {
            tokio::time::sleep(self.options.cut_after).await;
        }
        reset(r.get_ref());
    }

    fn head(&self, status: u16, reason: &str, len: usize, close: bool) -> String {
        let conn = if close { "Connection: close\r\n" } else { "" };
        format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len}\r\n\
             X-Backend: {}\r\n{conn}\r\n",
            self.index
        )
    }
}
