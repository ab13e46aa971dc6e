//! `vigil demo`: the embedded default. Three demo backends on 127.0.0.1
//! (one steady, one that answers 503 for part of every cycle, one that
//! hangs for part of every cycle), `vigil serve` in front of them with
//! passive accounting and active checks, the admin API, and a gentle
//! built-in load so `vigil status --watch` has something to show.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use vigil_config::{literal_resolver, nginx};

use crate::stack;

/// Arguments of `vigil demo`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Runs until Ctrl-C. Example:\n  vigil demo\n  vigil demo --cycle 30s --listen 127.0.0.1:8081 --admin-listen 127.0.0.1:9902"
)]
pub(crate) struct Args {
    /// Where the proxy listens (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Where the admin API listens (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:9901")]
    admin_listen: SocketAddr,
    /// Length of one failure cycle of the demo backends.
    #[arg(long, default_value = "60s", value_parser = parse_cycle)]
    cycle: Duration,
    /// Built-in load in requests per second (0: none).
    #[arg(long, default_value_t = 4)]
    rate: u32,
}

fn parse_cycle(s: &str) -> Result<Duration, String> {
    match crate::cmd::parse_duration(s) {
        Ok(d) if d >= Duration::from_secs(2) => Ok(d),
        Ok(_) => Err("the cycle must be at least 2s".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// What a demo backend does at a moment of the cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behaviour {
    Steady,
    /// 503 on `/` (its health check stays green: passive accounting catches it).
    Flaky,
    /// Hangs on everything, health checks included (active checks catch it).
    Hung,
}

/// The share of the cycle, [from, to), in which a backend misbehaves.
fn bad_window(b: Behaviour) -> (f64, f64) {
    match b {
        Behaviour::Steady => (0.0, 0.0),
        Behaviour::Flaky => (0.2, 0.45),
        Behaviour::Hung => (0.6, 0.8),
    }
}

fn misbehaving(b: Behaviour, start: Instant, cycle: Duration) -> bool {
    let phase = (start.elapsed().as_secs_f64() % cycle.as_secs_f64()) / cycle.as_secs_f64();
    let (from, to) = bad_window(b);
    phase >= from && phase < to
}

async fn backend(b: Behaviour, start: Instant, cycle: Duration) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| async move {
                    let bad = misbehaving(b, start, cycle);
                    let health = req.uri().path() == "/health";
                    if bad && b == Behaviour::Hung {
                        tokio::time::sleep(cycle).await;
                    }
                    let (status, body) = match (b, bad, health) {
                        (Behaviour::Flaky, true, false) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "flaky: busy, try another\n",
                        ),
                        (_, _, true) => (StatusCode::OK, "healthy\n"),
                        (Behaviour::Steady, _, _) => (StatusCode::OK, "steady: hello\n"),
                        (Behaviour::Flaky, _, _) => (StatusCode::OK, "flaky: hello\n"),
                        (Behaviour::Hung, _, _) => (StatusCode::OK, "hung: hello\n"),
                    };
                    let mut r = Response::new(Full::new(Bytes::from(body)));
                    *r.status_mut() = status;
                    Ok::<_, Infallible>(r)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

fn free_port(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    if addr.port() != 0 {
        return Ok(addr);
    }
    Ok(std::net::TcpListener::bind(addr)?.local_addr()?)
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    crate::cmd::init_logging();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(demo(args))
}

async fn demo(args: Args) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let steady = backend(Behaviour::Steady, start, args.cycle).await?;
    let flaky = backend(Behaviour::Flaky, start, args.cycle).await?;
    let hung = backend(Behaviour::Hung, start, args.cycle).await?;
    let listen = free_port(args.listen)?;
    let fail_timeout = (args.cycle.as_secs() / 12).max(2);
    let conf = format!(
        "upstream demo {{
            server {steady} max_fails=1 fail_timeout={fail_timeout}s;
            server {flaky} max_fails=1 fail_timeout={fail_timeout}s;
            server {hung} max_fails=1 fail_timeout={fail_timeout}s;
            keepalive 8;
            check interval=1000 rise=2 fall=2 timeout=500 type=http default_down=false;
            check_http_send \"GET /health HTTP/1.0\\r\\n\\r\\n\";
            check_http_expect_alive http_2xx;
        }}
        server {{
            listen {listen};
            add_header X-Upstream-Addr $upstream_addr always;
            add_header X-Upstream-Status $upstream_status always;
            location / {{
                proxy_pass http://demo;
                proxy_next_upstream error timeout http_503;
                proxy_next_upstream_tries 3;
                proxy_connect_timeout 1s;
                proxy_read_timeout 1s;
            }}
        }}"
    );
    let config = nginx::load_str(
        &conf,
        Path::new("<vigil demo>"),
        Path::new("."),
        &literal_resolver,
    )?
    .config;
    let token = format!("demo-{:016x}", rand_token());
    let stack = stack::start(
        config,
        stack::Options {
            threads: 1,
            spool_dir: std::env::temp_dir(),
            admin_listen: Some(args.admin_listen),
            admin_token: Some(token.clone()),
            admin_hosts: Vec::new(),
            no_admin: false,
            no_dashboard: false,
            fleet: None,
        },
    )
    .await?;
    let admin = stack.admin_addr.unwrap_or(args.admin_listen);
    let c = args.cycle.as_secs_f64();
    let (fa, fb) = bad_window(Behaviour::Flaky);
    let (ha, hb) = bad_window(Behaviour::Hung);
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "vigil demo is running (Ctrl-C to stop)\n\n  proxy:    http://{listen}/\n  admin:    http://{admin}/api/status\n  dashboard: http://{admin}/\n\n  backends (one cycle = {c:.0}s):\n    steady  {steady}  always answers\n    flaky   {flaky}  answers 503 from {:.0}s to {:.0}s of each cycle (passive accounting takes it out)\n    hung    {hung}  hangs from {:.0}s to {:.0}s of each cycle (active checks take it out)\n\n  built-in load: {} request(s)/s\n\n  try:\n    curl -i http://{listen}/\n    vigil status --watch --admin {admin}\n    vigil explain demo --admin {admin}\n    vigil events --follow --admin {admin}\n    VIGIL_ADMIN_TOKEN={token} vigil peer drain demo {steady} --admin {admin}\n",
        fa * c,
        fb * c,
        ha * c,
        hb * c,
        args.rate
    )?;
    out.flush()?;
    drop(out);
    if args.rate > 0 {
        tokio::spawn(load(listen, args.rate, stack.shutdown.clone()));
    }
    let _ = tokio::signal::ctrl_c().await;
    // Ctrl-C: the requests in flight finish (within 2 s), as a graceful stop.
    stack
        .stop(stack::Stop::Graceful(Some(Duration::from_secs(2))))
        .await;
    Ok(ExitCode::SUCCESS)
}

/// A gentle open-loop load through the proxy.
async fn load(addr: SocketAddr, rate: u32, stop: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        tokio::spawn(async move {
            let Ok(Ok(stream)) =
                tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
                    .await
            else {
                return;
            };
            let Ok((mut tx, conn)) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
            else {
                return;
            };
            tokio::spawn(conn);
            let req = Request::builder()
                .uri("/")
                .header("host", "demo")
                .body(Full::new(Bytes::new()));
            if let Ok(req) = req {
                let _ = tokio::time::timeout(Duration::from_secs(10), tx.send_request(req)).await;
            }
        });
    }
}

fn rand_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}
