//! The load driver: N keep-alive client connections, each paced to its
//! share of a total rate, sending a fixed mix of GETs and POSTs (each with
//! a unique `X-Req-Id`) for a duration, and recording every request.
//!
//! A client reconnects after any error, a response cut short or a
//! `Connection: close`; every wait has a deadline (`Load::timeout` for a
//! whole request, `Load::connect_timeout` for a connect). A client whose
//! request takes longer than its period sends the next one right after it
//! (missed ticks are delayed, not bunched), so a stuck request costs one
//! slow request per client, not a burst.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant, MissedTickBehavior};

use super::wire::{BodyEnd, Reader};

/// What to send.
#[derive(Debug, Clone)]
pub struct Load {
    /// The proxy.
    pub target: SocketAddr,
    /// Keep-alive client connections (each one request at a time).
    pub clients: usize,
    /// Requests per second, all clients together.
    pub rate: u32,
    /// How long to send for.
    pub duration: Duration,
    /// One request in `post_every` is a POST (0: none), picked by a hash of
    /// its id: deterministic, and without a period that could line up with
    /// a round robin (a strict alternation would send every POST to the
    /// same two of four peers).
    pub post_every: u32,
    /// Size of a POST body, in bytes (it starts with the id).
    pub post_size: usize,
    /// Deadline of one whole request (connect, send, header, body).
    pub timeout: Duration,
    /// Deadline of one connect.
    pub connect_timeout: Duration,
    /// Added to every id. Ids are `id_base + (run << 40 | client << 24 | n)`
    /// with `run` counted per process, so two runs never share one.
    pub id_base: u64,
}

/// One request as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Its `X-Req-Id`.
    pub id: u64,
    /// Whether it was a POST.
    pub post: bool,
    /// When it was sent, since the run began.
    pub start: Duration,
    /// How long until it ended (complete, cut short or failed).
    pub latency: Duration,
    /// What came back.
    pub outcome: Outcome,
    /// The `X-Backend` of the response, when there was one.
    pub backend: Option<usize>,
}

/// What came back for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response head with this status; `complete` is false when the body
    /// ended before its framing said (a reset or close mid-body).
    Response {
        /// The status code.
        status: u16,
        /// Whether the whole body arrived.
        complete: bool,
    },
    /// No response head.
    Failed(Failure),
}

/// Why a request got no response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Failure {
    /// The connect to the proxy failed or timed out.
    Connect,
    /// The connection closed or failed before a head came.
    Closed,
    /// `Load::timeout` passed without a head.
    Timeout,
    /// What came was not an HTTP response.
    Garbled,
}

/// Every request of one run, in no particular order.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// The records.
    pub records: Vec<Record>,
    /// How long the run took.
    pub elapsed: Duration,
}

// === impl Load ===

impl Load {
    /// 16 clients, 640 req/s, every second request a POST of 64 bytes,
    /// 10 s per request, 2 s per connect.
    pub fn new(target: SocketAddr, duration: Duration) -> Self {
        Self {
            target,
            clients: 16,
            rate: 640,
            duration,
            post_every: 2,
            post_size: 64,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            id_base: 0,
        }
    }

    /// Send the load and return every record. Ends at most `timeout` after
    /// `duration`.
    pub async fn run(&self) -> Run {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let base = self.id_base + (RUNS.fetch_add(1, Ordering::Relaxed) << 40);
        let start = Instant::now();
        let clients = self.clients.max(1);
        let period = Duration::from_secs_f64(clients as f64 / f64::from(self.rate.max(1)));
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..clients {
            let load = self.clone();
            // Spread the clients' first requests over one period.
            let first = start + period.mul_f64(c as f64 / clients as f64);
            tasks.spawn(async move { load.client(c, base, start, first, period).await });
        }
        let mut records = Vec::new();
        while let Some(r) = tasks.join_next().await {
            if let Ok(mut r) = r {
                records.append(&mut r);
            }
        }
        Run {
            records,
            elapsed: start.elapsed(),
        }
    }

    async fn client(
        &self,
        c: usize,
        base: u64,
        start: Instant,
        first: Instant,
        period: Duration,
    ) -> Vec<Record> {
        let mut tick = tokio::time::interval_at(first, period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let end = start + self.duration;
        let mut conn: Option<Reader<TcpStream>> = None;
        let mut records = Vec::new();
        for n in 0u64.. {
            tick.tick().await;
            if Instant::now() >= end {
                break;
            }
            let id = base + ((c as u64) << 24 | n);
            let post = self.post_every != 0 && mix(id).is_multiple_of(u64::from(self.post_every));
            let sent = Instant::now();
            let attempt = self.request(&mut conn, id, post);
            let (outcome, backend, keep) = match timeout(self.timeout, attempt).await {
                Ok(r) => r,
                Err(_) => (Outcome::Failed(Failure::Timeout), None, false),
            };
            if !keep {
                conn = None;
            }
            records.push(Record {
                id,
                post,
                start: sent - start,
                latency: sent.elapsed(),
                outcome,
                backend,
            });
        }
        records
    }

    /// One request on `conn` (connecting first if there is none): what came
    /// back, who answered, and whether the connection may be reused.
    async fn request(
        &self,
        conn: &mut Option<Reader<TcpStream>>,
        id: u64,
        post: bool,
    ) -> (Outcome, Option<usize>, bool) {
        if conn.is_none() {
            match timeout(self.connect_timeout, TcpStream::connect(self.target)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    *conn = Some(Reader::new(s));
                }
                _ => return (Outcome::Failed(Failure::Connect), None, false),
            }
        }
        let Some(r) = conn.as_mut() else {
            return (Outcome::Failed(Failure::Connect), None, false);
        };
        let bytes = request_bytes(id, post, self.post_size);
        if r.get_mut().write_all(&bytes).await.is_err() {
            return (Outcome::Failed(Failure::Closed), None, false);
        }
        let head = match r.head().await {
            Ok(Some(h)) => h,
            Ok(None) => return (Outcome::Failed(Failure::Closed), None, false),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return (Outcome::Failed(Failure::Garbled), None, false)
            }
            Err(_) => return (Outcome::Failed(Failure::Closed), None, false),
        };
        let Some(status) = head.status() else {
            return (Outcome::Failed(Failure::Garbled), None, false);
        };
        let backend = head.field("x-backend").and_then(|v| v.trim().parse().ok());
        let complete = r.skip_body(&head, head.closes()).await == BodyEnd::Complete;
        let keep = complete && !head.closes();
        (Outcome::Response { status, complete }, backend, keep)
    }
}

/// splitmix64's finaliser.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn request_bytes(id: u64, post: bool, post_size: usize) -> Vec<u8> {
    if !post {
        return format!("GET /?id={id} HTTP/1.1\r\nHost: lab\r\nX-Req-Id: {id}\r\n\r\n")
            .into_bytes();
    }
    let mut body = format!("id={id}&pad=").into_bytes();
    body.resize(post_size.max(body.len()), b'x');
    let mut out = format!(
        "POST /?id={id} HTTP/1.1\r\nHost: lab\r\nX-Req-Id: {id}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

// === impl Record ===

impl Record {
    /// Whether a response head came whose body was cut short.
    pub fn cut_short(&self) -> bool {
        matches!(
            self.outcome,
            Outcome::Response {
                complete: false,
                ..
            }
        )
    }

    /// The status, when a head came.
    pub fn status(&self) -> Option<u16> {
        match self.outcome {
            Outcome::Response { status, .. } => Some(status),
            Outcome::Failed(_) => None,
        }
    }

    /// Whether it failed for the client: no head, a body cut short, or a
    /// status of 500 or more.
    pub fn failed(&self) -> bool {
        match self.outcome {
            Outcome::Response { status, complete } => !complete || status >= 500,
            Outcome::Failed(_) => true,
        }
    }
}

// === impl Failure ===

impl Failure {
    /// A short word for tables.
    pub fn word(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::Closed => "closed",
            Failure::Timeout => "timeout",
            Failure::Garbled => "garbled",
        }
    }
}

// === impl Run ===

impl Run {
    /// The records of requests sent in `[from, to)` since the run began.
    pub fn between(&self, from: Duration, to: Duration) -> Run {
        Run {
            records: self
                .records
                .iter()
                .filter(|r| r.start >= from && r.start < to)
                .copied()
                .collect(),
            elapsed: to.saturating_sub(from),
        }
    }
}
