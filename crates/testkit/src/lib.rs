//! Test support that every crate's integration tests and the benches share.
//!
//! - [`free_addr`] / [`free_port`]: an address on 127.0.0.1 for a server a
//!   test starts later (stock nginx, a `vigil` process, a listener built by
//!   the code under test). The port is taken below the kernel's ephemeral
//!   range, so no outgoing connection of a test running in parallel is
//!   given it as its source port between the pick and the bind, and from a
//!   per-process counter, so two tests of one binary never pick the same.
//! - [`nginx_bin`] / [`find_nginx`]: the stock nginx the comparisons run,
//!   and [`stop_nginx`] to stop one the tests started in the foreground.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// First port of the range handed out (below Linux's default ephemeral
/// range, 32768–60999, `/proc/sys/net/ipv4/ip_local_port_range`).
const FIRST: u32 = 20_000;
/// Ports per process; processes running at once (test binaries and the
/// programs they start) get different slices by their pid.
const SLICE: u32 = 1_000;
const SLICES: u32 = 12;

/// A port on 127.0.0.1 that nothing listens on now (see the crate docs).
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = FIRST + (std::process::id() % SLICES) * SLICE;
    for _ in 0..SLICE {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % SLICE;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    // Every port of the slice is taken: let the kernel pick one.
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port on 127.0.0.1: {e}"))
}

/// [`free_port`] as an address.
pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// The stock nginx binary: the first `nginx` on PATH, else
/// `/usr/sbin/nginx`, if it is there.
pub fn find_nginx() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("nginx"))
            .find(|c| c.is_file())
    });
    on_path
        .or_else(|| Some(PathBuf::from("/usr/sbin/nginx")))
        .filter(|p| p.is_file())
}

/// The stock nginx binary, for tests that compare with it or drive it:
/// they need one, and say how to get it.
pub fn nginx_bin() -> PathBuf {
    find_nginx().unwrap_or_else(|| {
        panic!(
            "nginx is not installed (looked on PATH and at /usr/sbin/nginx): these tests \
             compare vigil with a stock nginx or drive one; install it with \
             `apt-get install -y nginx` (.ci/run does)"
        )
    })
}

/// Stop a stock nginx started in the foreground (`daemon off`) with prefix
/// `prefix` and conf `conf`: `nginx -s stop` and up to 2 s for the master
/// to exit (a bounded wait on the condition), else SIGKILL.
pub fn stop_nginx(bin: &Path, prefix: &Path, conf: &Path, child: &mut Child) {
    let _ = Command::new(bin)
        .arg("-p")
        .arg(prefix)
        .arg("-c")
        .arg(conf)
        .args(["-s", "stop"])
        .stderr(Stdio::null())
        .status();
    for _ in 0..200 {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_not_repeated() {
        let a = free_port();
        let b = free_port();
        assert_ne!(a, b);
        for p in [a, b] {
            assert!((20_000..32_000).contains(&p), "{p}");
            TcpListener::bind(("127.0.0.1", p)).expect("still free");
        }
    }
}
