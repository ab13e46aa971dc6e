//! Scale benchmark of the checker: N probe targets against local backends.
//!
//! ```text
//! ulimit -n 65536
//! cargo run --release -p vigil-checker --example scale -- 3000 3000 1000 30
//! #                                                 targets ports interval_ms seconds [no-dedup]
//! ```
//!
//! The backends run in a child process (this program with `backend N`),
//! each port answering `HTTP/1.0 200`; this process runs only the checker
//! (http probes, one upstream per 10 servers) and reports its own CPU time
//! and resident memory, per target. With fewer ports than targets and
//! `no-dedup`, many targets share a port under different upstreams.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use vigil_checker::{Checker, CheckerOptions};
use vigil_config::{literal_resolver, nginx};
use vigil_core::event::EventBus;
use vigil_core::registry::Registry;
use vigil_core::Clock;
use vigil_net::SystemClock;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("backend") {
        let n: usize = args.get(1).ok_or("backend N")?.parse()?;
        return backend(n);
    }
    let num = |i: usize, d: u64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let targets = num(0, 3000) as usize;
    let ports = num(1, targets as u64) as usize;
    let interval = num(2, 1000);
    let seconds = num(3, 30);
    let dedup = args.get(4).map(String::as_str) != Some("no-dedup");

    let mut child = Command::new(std::env::current_exe()?)
        .args(["backend", &ports.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut addrs = Vec::with_capacity(ports);
    for _ in 0..ports {
        addrs.push(lines.next().ok_or("backend ended")??);
    }
    let mut text = String::new();
    for (u, chunk) in (0..targets).collect::<Vec<_>>().chunks(10).enumerate() {
        text.push_str(&format!("upstream u{u} {{\n"));
        for i in chunk {
            text.push_str(&format!("    server {};\n", addrs[i % ports]));
        }
        text.push_str(&format!(
            "    check type=http interval={interval} timeout={} rise=2 fall=3 jitter={};\n}}\n",
            interval / 2,
            interval / 10
        ));
    }
    let config = nginx::load_str(
        &text,
        "scale.conf".as_ref(),
        ".".as_ref(),
        &literal_resolver,
    )?
    .config;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let (cpu0, rss0) = usage();
    let result = runtime.block_on(async {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let registry = Arc::new(Registry::build(
            &config,
            None,
            Arc::new(EventBus::default()),
            clock.clone(),
        ));
        let options = CheckerOptions {
            dedup,
            ..CheckerOptions::default()
        };
        let checker = Checker::start(registry.clone(), clock, options)?;
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let up = registry
            .upstreams()
            .iter()
            .flat_map(|u| u.peers().iter())
            .filter(|p| p.is_routable())
            .count();
        let probes = checker.metrics().probes();
        Ok::<_, Box<dyn std::error::Error>>((checker.targets(), probes, up, started.elapsed()))
    })?;
    let (cpu1, rss1) = usage();
    let _ = child.kill();
    let _ = child.wait();
    let (distinct, probes, up, elapsed) = result;
    let cpu = cpu1 - cpu0;
    let mut out = std::io::stdout().lock();
    writeln!(out, "server lines {targets}, backend ports {ports}, distinct targets {distinct} (dedup {dedup})")?;
    writeln!(
        out,
        "interval {interval} ms, ran {:.1} s, probes {probes} ({:.0}/s), peers up {up}",
        elapsed.as_secs_f64(),
        probes as f64 / elapsed.as_secs_f64()
    )?;
    writeln!(
        out,
        "checker CPU {cpu:.2} s = {:.1} ms CPU per target per minute; {:.1} us per probe",
        cpu / distinct.max(1) as f64 * 60_000.0 / elapsed.as_secs_f64(),
        cpu * 1e6 / probes.max(1) as f64
    )?;
    writeln!(
        out,
        "RSS {:.1} MiB before, {:.1} MiB after: {:.1} KiB per target",
        rss0 as f64 / 1024.0,
        rss1 as f64 / 1024.0,
        (rss1.saturating_sub(rss0)) as f64 / distinct.max(1) as f64
    )?;
    Ok(())
}

/// CPU seconds (user + system) and RSS in KiB of this process.
fn usage() -> (f64, u64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    // After the comm field: state is 0, utime 11, stime 12 (clock ticks, 100/s on Linux).
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let cpu = (ticks(11) + ticks(12)) / 100.0;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (cpu, rss)
}

/// Listen on `n` ports of 127.0.0.1; answer every connection with a 200.
fn backend(n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut out = std::io::stdout().lock();
        for _ in 0..n {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            writeln!(out, "{}", l.local_addr()?)?;
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                while let Ok((mut s, _)) = l.accept().await {
                    tokio::spawn(async move {
                        let mut buf = [0u8; 512];
                        let _ = s.read(&mut buf).await;
                        let _ = s
                            .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
                            .await;
                    });
                }
            });
        }
        out.flush()?;
        drop(out);
        std::future::pending::<()>().await;
        Ok(())
    })
}
