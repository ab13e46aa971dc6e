//! nginx's process model with threads: one single-threaded event loop per
//! worker, each with its own `SO_REUSEPORT` listeners (its own accept
//! queues), so a request never crosses threads. Idle upstream connections
//! are kept per worker too ([`crate::pool::Pool`] shards by [`current`]).
//!
//! Each worker owns its listeners and takes orders over a channel: listen
//! on a socket bound for it, or close an address. [`Workers::reload`] binds
//! every new address on every worker before anything changes, so a reload
//! that cannot listen fails whole, the old configuration still in force; a
//! removed address stops accepting and its connections finish their
//! requests, then close.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use vigil_core::config::{Config, Listen};

use crate::listener::serve_on;
use crate::route::RouteError;
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
/// shard for each ([`crate::shard`]; [`spawn`] plans too, for state made
/// after it).
pub fn plan(threads: usize) {
    crate::shard::plan(threads);
}

/// Start `threads` workers, each accepting on every listen address.
/// Binding errors are returned before any worker starts serving.
pub fn spawn(
    proxy: Arc<Proxy>,
    listens: &[Listen],
    threads: usize,
    shutdown: CancellationToken,
    grace: Duration,
) -> std::io::Result<Workers> {
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
            .spawn(move || run(i, proxy, inbox, shutdown, grace))?;
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
            let sockets = bind_all(l, threads).map_err(|source| ReloadError::Listen {
                addr: l.addr,
                source,
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

    /// Wait for every worker thread to end (after the shutdown token fired).
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

/// One worker thread: its runtime, its listeners, its orders.
fn run(
    i: usize,
    proxy: Arc<Proxy>,
    mut inbox: mpsc::UnboundedReceiver<Order>,
    shutdown: CancellationToken,
    grace: Duration,
) {
    crate::shard::enter(i);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // The worker's cached clock, read once per event-loop iteration
        // as nginx does (vigil_core::clock::coarse_now).
        .on_thread_unpark(vigil_core::clock::refresh)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(worker = i, error = %e, "cannot start worker runtime");
            return;
        }
    };
    rt.block_on(async move {
        // The worker's one sweeper of upstream timers (crate::timer).
        crate::timer::install();
        let mut tasks = tokio::task::JoinSet::new();
        let mut listeners: HashMap<SocketAddr, CancellationToken> = HashMap::new();
        loop {
            let order = tokio::select! {
                o = inbox.recv() => o,
                _ = shutdown.cancelled() => None,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            };
            match order {
                Some(Order::Listen(l, socket)) => match tokio::net::TcpListener::from_std(socket) {
                    Ok(listener) => {
                        let stop = shutdown.child_token();
                        if let Some(old) = listeners.insert(l.addr, stop.clone()) {
                            old.cancel();
                        }
                        tasks.spawn(serve_on(
                            proxy.clone(),
                            listener,
                            l.addr,
                            stop,
                            shutdown.clone(),
                            grace,
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
        while tasks.join_next().await.is_some() {}
    });
}

/// One socket for `l` per worker (`SO_REUSEPORT` when there are several).
fn bind_all(l: &Listen, threads: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    (0..threads)
        .map(|_| bind_std(l.addr, threads > 1 || l.reuseport, l.backlog))
        .collect()
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
