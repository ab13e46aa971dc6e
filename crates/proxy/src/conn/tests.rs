//! The connection deadlines in paused time, over in-memory streams: hyper
//! serves a [`tracking`] service on a [`TimedIo`] under [`Watched`], as the
//! accept loop does, and the test is the client.

use std::sync::atomic::AtomicUsize;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper::body::{Frame, Incoming};
use tokio::time::Instant;
use vigil_core::config::ProxySettings;

use super::*;
use crate::handler::body::{self, BoxError, UpBody};

const T: ConnLimits = ConnLimits {
    header: Duration::from_secs(60),
    keepalive: Duration::from_secs(75),
    send: Duration::from_secs(60),
};

/// How the server side ended (`Some(why)` when vigil closed it on a
/// deadline), and when.
type Ended = JoinHandle<(Option<Expiry>, Instant)>;

/// Serve one connection (`handle` is given each request and the
/// connection's state, as the handler is); the client end, the server's
/// outcome, its drain signal.
fn serve<F, Fut>(t: ConnLimits, pipe: usize, handle: F) -> (DuplexStream, Ended, Arc<Drain>)
where
    F: Fn(Request<Incoming>, Arc<ConnState>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Response<UpBody>> + Send + 'static,
{
    let (client, server) = tokio::io::duplex(pipe);
    let state = ConnState::new(t);
    let io = TokioIo::new(TimedIo::new(server, state.clone()));
    let conn = state.clone();
    let svc = tracking(state.clone(), move |req| handle(req, conn.clone()));
    let conn = auto::Builder::new(TokioExecutor::new())
        .serve_connection_with_upgrades(io, svc)
        .into_owned();
    let drain = Arc::new(Drain::default());
    let watched = Watched::new(conn, state, drain.clone());
    let ended = tokio::spawn(async move {
        let why = match watched.await {
            Closed::TimedOut(why) => Some(why),
            Closed::Done(_) => None,
        };
        (why, Instant::now())
    });
    (client, ended, drain)
}

/// Far beyond every timeout here: a deadline that never fires fails the
/// test instead of hanging it (paused time jumps to this).
const NEVER: Duration = Duration::from_secs(3600);

async fn end(ended: Ended) -> (Option<Expiry>, Instant) {
    tokio::time::timeout(NEVER, ended)
        .await
        .expect("the connection is still open")
        .expect("join")
}

async fn ok(_: Request<Incoming>, _: Arc<ConnState>) -> Response<UpBody> {
    Response::new(body::full("ok"))
}

/// A handler's response, boxed.
type Served = std::pin::Pin<Box<dyn Future<Output = Response<UpBody>> + Send>>;

/// A handler routed to a location with these client timeouts.
fn routed(
    keepalive: Duration,
    send: Duration,
) -> impl Fn(Request<Incoming>, Arc<ConnState>) -> Served + Clone + Send + 'static {
    move |_req, conn| {
        Box::pin(async move {
            let settings = ProxySettings {
                client_keepalive_timeout: keepalive,
                client_send_timeout: send,
                ..ProxySettings::default()
            };
            on_route(&conn, &settings);
            Response::new(body::full("ok"))
        })
    }
}

/// Read one response with a Content-Length body (or up to EOF).
async fn response(c: &mut DuplexStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if len.is_some_and(|n| got.len() >= end + 4 + n) {
                return text;
            }
        }
        match c.read(&mut buf).await {
            Ok(0) | Err(_) => return String::from_utf8_lossy(&got).into_owned(),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// The client sees the connection closed without another byte.
async fn closed_silently(c: &mut DuplexStream) {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(NEVER, c.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the connection is still open");
    assert_eq!(String::from_utf8_lossy(&rest), "", "nothing is sent");
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";

#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed_at_client_header_timeout() {
    let start = Instant::now();
    let (mut c, ended, _) = serve(T, 4096, ok);
    closed_silently(&mut c).await;
    assert_eq!(end(ended).await.0, Some(Expiry::Header));
    assert_eq!(start.elapsed(), T.header, "from accept");
}

#[tokio::test(start_paused = true)]
async fn a_trickled_header_is_closed_at_the_timeout_counted_from_accept() {
    let start = Instant::now();
    let (mut c, ended, _) = serve(T, 4096, ok);
    // One byte every 10 s: each arrives, but the header never completes in time.
    for b in b"GET / HTTP/1.1\r\nHost: trickle\r\n" {
        if c.write_all(&[*b]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        if ended.is_finished() {
            break;
        }
    }
    let (why, at) = end(ended).await;
    assert_eq!(why, Some(Expiry::Header));
    assert_eq!(at - start, T.header);
    closed_silently(&mut c).await;
}

#[tokio::test(start_paused = true)]
async fn a_request_in_time_is_served() {
    let (mut c, ended, _) = serve(T, 4096, ok);
    tokio::time::sleep(T.header - Duration::from_secs(1)).await;
    c.write_all(GET).await.expect("write");
    assert!(response(&mut c).await.ends_with("\r\n\r\nok"));
    drop(c);
    assert_eq!(end(ended).await.0, None);
}

#[tokio::test(start_paused = true)]
async fn an_idle_kept_alive_connection_is_closed_at_the_locations_keepalive_timeout() {
    let ka = Duration::from_secs(5);
    let (mut c, ended, _) = serve(T, 4096, routed(ka, T.send));
    c.write_all(GET).await.expect("write");
    let r = response(&mut c).await;
    assert!(r.ends_with("\r\n\r\nok"), "{r}");
    assert!(!r.contains("connection: close"), "{r}");
    let served = Instant::now();
    closed_silently(&mut c).await;
    assert_eq!(end(ended).await.0, Some(Expiry::Idle));
    assert_eq!(served.elapsed(), ka);
}

#[tokio::test(start_paused = true)]
async fn the_first_byte_of_the_next_request_starts_client_header_timeout() {
    let t = ConnLimits {
        header: Duration::from_secs(10),
        ..T
    };
    let (mut c, ended, _) = serve(t, 4096, ok);
    c.write_all(GET).await.expect("write");
    response(&mut c).await;
    // Idle for longer than the header timeout, within keepalive_timeout.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!ended.is_finished());
    c.write_all(b"GE").await.expect("write");
    let byte = Instant::now();
    closed_silently(&mut c).await;
    assert_eq!(end(ended).await.0, Some(Expiry::Header));
    assert_eq!(byte.elapsed(), t.header);
}

#[tokio::test(start_paused = true)]
async fn keepalive_timeout_0_says_connection_close_and_closes_after_the_response() {
    let (mut c, ended, _) = serve(T, 4096, routed(Duration::ZERO, T.send));
    c.write_all(GET).await.expect("write");
    let r = response(&mut c).await;
    assert!(r.contains("connection: close\r\n"), "{r}");
    let mut rest = Vec::new();
    tokio::time::timeout(NEVER, c.read_to_end(&mut rest))
        .await
        .expect("closed")
        .expect("eof");
    assert!(rest.is_empty());
    assert_eq!(end(ended).await.0, None, "hyper closed it");
}

#[tokio::test(start_paused = true)]
async fn no_deadline_while_the_request_is_served() {
    let slow = |_req: Request<Incoming>, _: Arc<ConnState>| async {
        // Longer than every client timeout: the upstream's limits apply, not these.
        tokio::time::sleep(Duration::from_secs(600)).await;
        Response::new(body::full("late"))
    };
    let (mut c, ended, _) = serve(T, 4096, slow);
    c.write_all(GET).await.expect("write");
    assert!(response(&mut c).await.ends_with("late"));
    drop(c);
    assert_eq!(end(ended).await.0, None);
}

/// A body of `n` bytes that records when it is dropped.
fn big_body(n: usize, dropped: Arc<AtomicUsize>) -> UpBody {
    struct Flag(Arc<AtomicUsize>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let flag = Flag(dropped);
    let chunks = (0..n / 1024).map(move |_| {
        let _keep = &flag;
        Ok::<_, BoxError>(Frame::data(Bytes::from(vec![b'x'; 1024])))
    });
    http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(futures_util::stream::iter(
        chunks,
    )))
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_is_cut_after_send_timeout_and_the_body_released() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    let handle = move |_req: Request<Incoming>, _: Arc<ConnState>| {
        let d = d.clone();
        async move { Response::new(big_body(1 << 20, d)) }
    };
    let (mut c, ended, _) = serve(T, 8192, handle);
    c.write_all(GET).await.expect("write");
    let mut first = [0u8; 1024];
    let _ = c.read(&mut first).await.expect("read");
    // Then the client reads nothing.
    let stalled = Instant::now();
    assert_eq!(end(ended).await.0, Some(Expiry::Send));
    assert!(stalled.elapsed() <= T.send, "{:?}", stalled.elapsed());
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the response body (and with it the upstream connection) is released"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_reader_that_keeps_reading_is_not_cut() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    let handle = move |_req: Request<Incoming>, _: Arc<ConnState>| {
        let d = d.clone();
        async move { Response::new(big_body(64 * 1024, d)) }
    };
    let (mut c, ended, _) = serve(T, 8192, handle);
    c.write_all(GET).await.expect("write");
    let mut got = 0usize;
    let mut buf = [0u8; 8192];
    // 8 KiB every 50 s: slower than send_timeout in total, never between two writes.
    while got < 64 * 1024 {
        tokio::time::sleep(Duration::from_secs(50)).await;
        match c.read(&mut buf).await.expect("read") {
            0 => break,
            n => got += n,
        }
    }
    assert!(got >= 64 * 1024, "the whole body arrived ({got} bytes)");
    drop(c);
    assert_eq!(end(ended).await.0, None);
}

#[tokio::test(start_paused = true)]
async fn draining_finishes_the_request_in_flight_then_closes() {
    let slow = |_req: Request<Incoming>, _: Arc<ConnState>| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Response::new(body::full("done"))
    };
    let (mut c, ended, drain) = serve(T, 4096, slow);
    c.write_all(GET).await.expect("write");
    tokio::time::sleep(Duration::from_secs(1)).await;
    drain.start();
    let r = response(&mut c).await;
    assert!(r.ends_with("done"), "{r}");
    let mut rest = Vec::new();
    tokio::time::timeout(NEVER, c.read_to_end(&mut rest))
        .await
        .expect("closed")
        .expect("eof");
    assert_eq!(end(ended).await.0, None);
}

#[tokio::test(start_paused = true)]
async fn draining_closes_an_idle_connection_at_once() {
    let (mut c, ended, drain) = serve(T, 4096, ok);
    c.write_all(GET).await.expect("write");
    response(&mut c).await;
    let t0 = Instant::now();
    drain.start();
    closed_silently(&mut c).await;
    assert_eq!(end(ended).await.0, None);
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn an_upgraded_connection_has_no_client_timeouts() {
    let handle = |mut req: Request<Incoming>, _: Arc<ConnState>| async move {
        let up = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(u) = up.await {
                let mut io = TokioIo::new(u);
                let mut b = [0u8; 4];
                if io.read_exact(&mut b).await.is_ok() {
                    let _ = io.write_all(&b).await;
                }
            }
        });
        let mut r = Response::new(body::empty());
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        r.headers_mut()
            .insert(header::UPGRADE, HeaderValue::from_static("echo"));
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        r
    };
    let (mut c, _ended, _) = serve(T, 4096, handle);
    c.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nUpgrade: echo\r\nConnection: upgrade\r\n\r\n")
        .await
        .expect("write");
    let mut head = vec![0u8; 256];
    let n = c.read(&mut head).await.expect("101");
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 101"));
    // Silent for longer than every client timeout.
    tokio::time::sleep(Duration::from_secs(600)).await;
    c.write_all(b"ping").await.expect("write");
    let mut echo = [0u8; 4];
    c.read_exact(&mut echo).await.expect("echo");
    assert_eq!(&echo, b"ping");
}

/// An HTTP/2 client on the connection.
async fn h2_client(
    c: DuplexStream,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Empty<Bytes>> {
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(c))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    sender
}

fn h2_get() -> Request<http_body_util::Empty<Bytes>> {
    Request::builder()
        .uri("http://t/")
        .body(http_body_util::Empty::new())
        .expect("request")
}

#[tokio::test(start_paused = true)]
async fn http2_is_idle_when_no_stream_is_open() {
    let slow = |_req: Request<Incoming>, conn: Arc<ConnState>| async move {
        tokio::time::sleep(Duration::from_secs(200)).await;
        on_route(
            &conn,
            &ProxySettings {
                client_keepalive_timeout: Duration::from_secs(5),
                ..ProxySettings::default()
            },
        );
        Response::new(body::full("h2"))
    };
    let (c, ended, _) = serve(T, 65536, slow);
    let mut sender = h2_client(c).await;
    // A stream open longer than every client timeout is not cut...
    let resp = sender.send_request(h2_get()).await.expect("response");
    assert_eq!(resp.status(), 200);
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body");
    assert_eq!(body.to_bytes(), "h2");
    // ...and once none is open, keepalive_timeout closes the connection.
    let idle = Instant::now();
    assert_eq!(end(ended).await.0, None, "closed after a GOAWAY");
    assert_eq!(idle.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn http2_without_a_request_is_closed_at_client_header_timeout() {
    let start = Instant::now();
    let (c, ended, _) = serve(T, 65536, ok);
    let _sender = h2_client(c).await;
    assert_eq!(end(ended).await.0, Some(Expiry::Header));
    assert_eq!(start.elapsed(), T.header);
}

#[tokio::test(start_paused = true)]
async fn an_idle_phase_with_a_stream_in_flight_has_no_deadline() {
    // What two HTTP/2 stream tasks on two threads can leave behind: the last
    // stream ended (idle, deadline set) while a new one started.
    let s = ConnState::new(T);
    s.request(http::Version::HTTP_2);
    s.phase.store(IDLE, Ordering::Relaxed);
    s.phase_deadline.store(0, Ordering::Relaxed);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        s.deadline(),
        None,
        "a past deadline would make the watcher spin"
    );
    assert_eq!(s.expired(Instant::now()), None);
    s.finished();
    assert_eq!(s.expired(Instant::now() + T.keepalive), Some(Expiry::Idle));
}
