//! nginx's process model with threads: one single-threaded event loop per
//! worker, each with its own `SO_REUSEPORT` listener (its own accept queue),
//! so a request never crosses threads. Idle upstream connections are kept
//! per worker too ([`crate::pool::Pool`] shards by [`current`]).

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use vigil_core::config::Listen;

use crate::server::{serve, Proxy};

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// The index of the worker running this code (0 outside workers).
pub fn current() -> usize {
    WORKER.with(Cell::get)
}

/// Start `threads` workers, each accepting on every listen address.
/// Binding errors are returned before any worker starts serving.
pub fn spawn(
    proxy: Arc<Proxy>,
    listens: &[Listen],
    threads: usize,
    shutdown: CancellationToken,
    grace: Duration,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let threads = threads.max(1);
    // SO_REUSEPORT is needed for several workers on one address.
    let reuse = threads > 1;
    let mut per_worker: Vec<Vec<std::net::TcpListener>> = Vec::with_capacity(threads);
    for _ in 0..threads {
        let mut ls = Vec::new();
        for l in listens {
            let tl = bind_std(l.addr, reuse || l.reuseport, l.backlog)?;
            ls.push(tl);
        }
        per_worker.push(ls);
    }
    let mut handles = Vec::with_capacity(threads);
    for (i, listeners) in per_worker.into_iter().enumerate() {
        let (proxy, shutdown) = (proxy.clone(), shutdown.clone());
        let h = std::thread::Builder::new()
            .name(format!("vigil-worker-{i}"))
            .spawn(move || {
                WORKER.with(|w| w.set(i));
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(worker = i, error = %e, "cannot start worker runtime");
                        return;
                    }
                };
                rt.block_on(async move {
                    let mut tasks = Vec::new();
                    for l in listeners {
                        match tokio::net::TcpListener::from_std(l) {
                            Ok(l) => tasks.push(tokio::spawn(serve(
                                proxy.clone(),
                                l,
                                shutdown.clone(),
                                grace,
                            ))),
                            Err(e) => {
                                tracing::error!(worker = i, error = %e, "cannot register listener")
                            }
                        }
                    }
                    for t in tasks {
                        let _ = t.await;
                    }
                });
            })?;
        handles.push(h);
    }
    Ok(handles)
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
