//! nginx's process model with threads: one single-threaded event loop per
//! worker, each with its own `SO_REUSEPORT` listeners (its own accept
//! queues), so a request never crosses threads. Idle upstream connections
//! are kept per worker too ([`crate::upstream::pool::Pool`] shards by [`current`]).
//!
//! Each worker owns its listeners and takes orders over a channel: listen
//! on a socket bound for it, or close an address. [`Workers::reload`] binds
//! every new address on every worker before anything changes, so a reload
//! that cannot listen fails whole, the old configuration still in force; a
//! removed address stops accepting and its connections finish their
//! requests, then close.
//!
//! Stopping ([`Shutdown`]) is nginx's: a graceful stop (SIGQUIT) closes the
//! listeners and the idle keep-alive connections, lets every request and
//! tunnel in flight finish, and closes what is left when its bound
//! (`worker_shutdown_timeout`) passes; a fast stop (SIGTERM, SIGINT) closes
//! everything at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vigil_core::config::{Config, Listen};

use crate::conn::listener::serve_on;
pub use crate::conn::stop::Shutdown;
use crate::nginx::route::RouteError;
use crate::server::Proxy;

/// The running workers and the addresses they listen on.
pub struct Workers {
    proxy: Arc<Proxy>,
    workers: Vec<Worker>,
    /// The addresses in force; the lock also makes reloads one at a time.
    listening: Mutex<Vec<Listen>>,
}

/// Why a reload was refused (the running configuration stays in force).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// A new listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The configuration cannot be served.
    #[error(transparent)]
    Routes(#[from] RouteError),
}

struct Worker {
    orders: mpsc::UnboundedSender<Order>,
    thread: JoinHandle<()>,
}

enum Order {
    /// Accept on this socket, bound for this worker.
    Listen(Listen, std::net::TcpListener),
    /// Stop accepting on this address and drain its connections.
    Close(SocketAddr),
}

/// Every distinct listen address of `config`, in order (the first `listen`
/// of an address gives its socket parameters).
pub fn listens(config: &Config) -> Vec<Listen> {
    let mut out: Vec<Listen> = Vec::new();
    for l in config.servers.iter().flat_map(|s| &s.listen) {
        if !out.iter().any(|o| o.addr == l.addr) {
            out.push(l.clone());
        }
    }
    out
}

/// `threads` workers will run: call before the first generation is built,
/// so that its per-worker state (pool shards, request counters) has a
/// shard for each ([`crate::conn::shard`]; [`spawn`] plans too, for state made
/// after it).
pub fn plan(threads: usize) {
    crate::conn::shard::plan(threads);
}

/// Start `threads` workers, each accepting on every listen address, until
/// `shutdown`. Binding errors are returned before any worker starts serving.
pub fn spawn(
    proxy: Arc<Proxy>,
    listens: &[Listen],
    threads: usize,
    shutdown: Shutdown,
) -> Result<Workers, SpawnError> {
    let threads = threads.max(1);
    plan(threads);
    let mut sockets = Vec::with_capacity(listens.len());
    for l in listens {
        sockets.push(bind_all(l, threads)?);
    }
    let mut workers = Vec::with_capacity(threads);
    for i in 0..threads {
        let (orders, inbox) = mpsc::unbounded_channel();
        let (proxy, shutdown) = (proxy.clone(), shutdown.clone());
        let thread = std::thread::Builder::new()
            .name(format!("vigil-worker-{i}"))
            .spawn(move || run(i, proxy, inbox, shutdown))
            .map_err(SpawnError::Thread)?;
        workers.push(Worker { orders, thread });
    }
    let workers = Workers {
        proxy,
        workers,
        listening: Mutex::new(listens.to_vec()),
    };
    for (l, per_worker) in listens.iter().zip(sockets) {
        workers.hand_out(l, per_worker);
    }
    Ok(workers)
}

// === impl Workers ===

impl Workers {
    /// The addresses listened on.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.listening().iter().map(|l| l.addr).collect()
    }

    /// Put `config` in force, listeners included: new addresses are bound
    /// on every worker first (failing the reload, nothing changed, if one
    /// cannot be), then the generation is swapped, the new listeners start
    /// accepting and the removed ones stop and drain. Returns the generation.
    pub fn reload(&self, config: Config) -> Result<u64, ReloadError> {
        let mut listening = self
            .listening
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let next = listens(&config);
        let threads = self.workers.len();
        let mut added = Vec::new();
        for l in next
            .iter()
            .filter(|l| !listening.iter().any(|o| o.addr == l.addr))
        {
            let sockets = bind_all(l, threads).map_err(|e| ReloadError::Listen {
                addr: l.addr,
                source: e.error,
            })?;
            added.push((l, sockets));
        }
        let generation = self.proxy.reload(config)?;
        for (l, sockets) in added {
            self.hand_out(l, sockets);
            tracing::info!(addr = %l.addr, workers = threads, "listening");
        }
        for gone in listening
            .iter()
            .filter(|o| !next.iter().any(|l| l.addr == o.addr))
        {
            for w in &self.workers {
                let _ = w.orders.send(Order::Close(gone.addr));
            }
            tracing::info!(addr = %gone.addr, "no longer listening; open connections finish");
        }
        *listening = next;
        Ok(generation)
    }

    /// Wait for every worker thread to end (after a stop began).
    pub fn join(self) {
        for w in self.workers {
            drop(w.orders);
            let _ = w.thread.join();
        }
    }

    fn listening(&self) -> std::sync::MutexGuard<'_, Vec<Listen>> {
        self.listening
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn hand_out(&self, l: &Listen, sockets: Vec<std::net::TcpListener>) {
        for (w, s) in self.workers.iter().zip(sockets) {
            if w.orders.send(Order::Listen(l.clone(), s)).is_err() {
                tracing::error!(addr = %l.addr, "a worker has stopped; it does not listen");
            }
        }
    }
}

/// One worker thread: its runtime, its listeners, its orders; on a
/// graceful stop, its connections and tunnels finish (until `shutdown`
/// says close), then the runtime is dropped with whatever is left.
fn run(i: usize, proxy: Arc<Proxy>, mut inbox: mpsc::UnboundedReceiver<Order>, shutdown: Shutdown) {
    crate::conn::shard::enter(i);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // The worker's cached clock, read once per event-loop iteration
        // as nginx does (vigil_net::clock::coarse_now).
        .on_thread_unpark(vigil_net::clock::refresh)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(worker = i, error = %e, "cannot start worker runtime");
            return;
        }
    };
    rt.block_on(async move {
        // The worker's one sweeper of upstream timers (crate::conn::timer).
        crate::conn::timer::install();
        let tunnels = TaskTracker::new();
        crate::conn::tunnel::track_on_this_thread(Some(tunnels.clone()));
        let mut tasks = tokio::task::JoinSet::new();
        let mut listeners: HashMap<SocketAddr, CancellationToken> = HashMap::new();
        loop {
            let order = tokio::select! {
                o = inbox.recv() => o,
                () = shutdown.begun() => None,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            };
            match order {
                Some(Order::Listen(l, socket)) => match tokio::net::TcpListener::from_std(socket) {
                    Ok(listener) => {
                        let stop = shutdown.graceful_token().child_token();
                        if let Some(old) = listeners.insert(l.addr, stop.clone()) {
                            old.cancel();
                        }
                        tasks.spawn(serve_on(
                            proxy.clone(),
                            listener,
                            l.addr,
                            stop,
                            shutdown.clone(),
                        ));
                    }
                    Err(e) => {
                        tracing::error!(worker = i, addr = %l.addr, error = %e, "cannot register listener")
                    }
                },
                Some(Order::Close(addr)) => {
                    if let Some(stop) = listeners.remove(&addr) {
                        stop.cancel();
                    }
                }
                None => break,
            }
        }
        // Each listener's task ends when its connections have finished
        // (or `now`); the tunnels they made run on until they end or `now`.
        while tasks.join_next().await.is_some() {}
        tunnels.close();
        tokio::select! {
            () = tunnels.wait() => {}
            () = shutdown.closing() => {}
        }
        crate::conn::tunnel::track_on_this_thread(None);
    });
    // Dropping the runtime drops every task still running: the connections
    // of a fast stop, or those left when the graceful stop's bound passed.
    drop(rt);
}

/// Why the workers could not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// An address could not be listened on.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// A worker thread could not be started.
    #[error("cannot start a worker thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// An address could not be listened on.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {error}{hint}")]
pub struct ListenError {
    /// The address.
    pub addr: SocketAddr,
    /// Why (in the message, not a source: said once).
    pub error: std::io::Error,
    hint: &'static str,
}

impl ListenError {
    fn new(addr: SocketAddr, source: std::io::Error) -> Self {
        let hint = if source.kind() == std::io::ErrorKind::AddrInUse {
            " (another process listens there: as nginx, vigil shares an address only when its listen line says `reuseport`)"
        } else {
            ""
        };
        Self {
            addr,
            error: source,
            hint,
        }
    }
}

/// The sockets of `l`, one per worker. As nginx: without `reuseport` one
/// socket, which every worker accepts on (a descriptor of it each), so no
/// other process can bind the address; with `reuseport` a socket per
/// worker with `SO_REUSEPORT` (its own accept queue).
fn bind_all(l: &Listen, threads: usize) -> Result<Vec<std::net::TcpListener>, ListenError> {
    let err = |e| ListenError::new(l.addr, e);
    if l.reuseport {
        return (0..threads)
            .map(|_| bind_std(l.addr, true, l.backlog).map_err(err))
            .collect();
    }
    let first = bind_std(l.addr, false, l.backlog).map_err(err)?;
    let mut out = Vec::with_capacity(threads);
    for _ in 1..threads {
        out.push(first.try_clone().map_err(err)?);
    }
    out.insert(0, first);
    Ok(out)
}

/// A listening socket on `addr` as a `listen` directive makes one
/// (`SO_REUSEADDR`, `SO_REUSEPORT` with `reuseport`, nginx's backlog of 511
/// unless given), on the runtime of the caller: what a worker accepts on,
/// and what a program (or a test) serving on its own runtime binds.
pub fn bind(
    addr: SocketAddr,
    reuseport: bool,
    backlog: Option<u32>,
) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::from_std(bind_std(addr, reuseport, backlog)?)
}

fn bind_std(
    addr: SocketAddr,
    reuseport: bool,
    backlog: Option<u32>,
) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuseport {
        socket.set_reuse_port(true)?;
    }
    socket.set_tcp_nodelay(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(i32::try_from(backlog.unwrap_or(511)).unwrap_or(511))?;
    Ok(socket.into())
}
