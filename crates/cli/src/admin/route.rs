//! The admin API's request decoding: method, path and query → [`Route`].
//!
//! Path segments and query keys and values are percent-decoded as bytes
//! (the `percent-encoding` crate) and must be UTF-8 afterwards; `+` in the
//! query is a space (form encoding), in the path it is itself. Anything
//! that does not decode, a missing required parameter or a number that is
//! not one is a [`BadRequest`] (answered 400 with its text), never a panic.
//! Pure: no registry, no I/O (the `admin_query` fuzz target drives it).

use std::collections::HashMap;
use std::fmt;

use http::Method;
use percent_encoding::percent_decode;

/// Most events one `GET /api/events` returns (`limit=` is capped here).
pub const MAX_EVENTS_PER_CALL: usize = 10_000;

/// What a request asks for, decoded and checked; nothing has been done yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /`: the dashboard, or the list of endpoints when it is off.
    Index,
    /// `GET /dashboard/upstreams`: the dashboard's upstream tables alone
    /// (an HTML fragment the page's script swaps in).
    DashboardUpstreams,
    /// `GET /dashboard.js`, `GET /dashboard.css`: the dashboard's embedded files.
    DashboardAsset(DashboardAsset),
    /// `/status`, `/metrics`: tengine's status page and Prometheus (the
    /// status page judges the method itself).
    StatusPage,
    /// `GET /api/status`.
    Status,
    /// `GET /api/upstreams/NAME`.
    Upstream {
        /// The upstream's name.
        name: String,
    },
    /// `GET /api/explain?upstream=U[&peer=P]`.
    Explain {
        /// The upstream.
        upstream: String,
        /// Only this peer (its address as configured).
        peer: Option<String>,
    },
    /// `GET /api/events?since=SEQ&limit=N[&upstream=U]`.
    Events {
        /// First sequence number wanted (default 0).
        since: u64,
        /// At most this many (default 1000, capped at [`MAX_EVENTS_PER_CALL`]).
        limit: usize,
        /// Only this upstream's.
        upstream: Option<String>,
    },
    /// `GET /api/config`.
    Config,
    /// `GET /api/fleet`: the fleet as this member sees it.
    Fleet,
    /// `POST /api/peers/UPSTREAM/PEER/ACTION` (bearer token).
    SetAdmin {
        /// The upstream.
        upstream: String,
        /// The peer's address as configured.
        peer: String,
        /// `up`, `down` or `drain` (checked when acting).
        action: String,
    },
    /// `POST /api/reload` (bearer token).
    Reload,
    /// An `/api/` path with a method other than GET and POST.
    MethodNotAllowed,
    /// Nothing here.
    NotFound,
}

/// The files of the dashboard, embedded in the binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DashboardAsset {
    /// `/dashboard.js`.
    Script,
    /// `/dashboard.css`.
    Style,
}

/// Why a request cannot be decoded (the 400's message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRequest(String);

// === impl Route ===

impl Route {
    /// Decode a request's method, path (`/api/...`, still percent-encoded)
    /// and query (without the `?`).
    pub fn decode(method: &Method, path: &str, query: Option<&str>) -> Result<Self, BadRequest> {
        let segs = segments(path)?;
        let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
        let is_api = segs.first() == Some(&"api");
        let mut q = if is_api {
            parse_query(query.unwrap_or(""))?
        } else {
            HashMap::new()
        };
        Ok(match (method, segs.as_slice()) {
            (&Method::GET, []) => Route::Index,
            (&Method::GET, ["dashboard", "upstreams"]) => Route::DashboardUpstreams,
            (&Method::GET, ["dashboard.js"]) => Route::DashboardAsset(DashboardAsset::Script),
            (&Method::GET, ["dashboard.css"]) => Route::DashboardAsset(DashboardAsset::Style),
            (_, ["status"]) | (_, ["metrics"]) => Route::StatusPage,
            (&Method::GET, ["api", "status"]) => Route::Status,
            (&Method::GET, ["api", "upstreams", name]) => Route::Upstream {
                name: (*name).to_string(),
            },
            (&Method::GET, ["api", "explain"]) => Route::Explain {
                upstream: q
                    .remove("upstream")
                    .ok_or_else(|| BadRequest::new("upstream=NAME is required"))?,
                peer: q.remove("peer"),
            },
            (&Method::GET, ["api", "events"]) => Route::Events {
                since: number(&q, "since")?.unwrap_or(0),
                limit: number::<usize>(&q, "limit")?
                    .unwrap_or(1000)
                    .min(MAX_EVENTS_PER_CALL),
                upstream: q.remove("upstream"),
            },
            (&Method::GET, ["api", "config"]) => Route::Config,
            (&Method::GET, ["api", "fleet"]) => Route::Fleet,
            (&Method::POST, ["api", "peers", upstream, peer, action]) => Route::SetAdmin {
                upstream: (*upstream).to_string(),
                peer: (*peer).to_string(),
                action: (*action).to_string(),
            },
            (&Method::POST, ["api", "reload"]) => Route::Reload,
            (m, ["api", ..]) if m != Method::GET && m != Method::POST => Route::MethodNotAllowed,
            _ => Route::NotFound,
        })
    }
}

// === impl BadRequest ===

impl BadRequest {
    fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl fmt::Display for BadRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadRequest {}

/// The non-empty path segments, each percent-decoded (`%2F` inside a
/// segment stays inside it: the path is split first).
pub fn segments(path: &str) -> Result<Vec<String>, BadRequest> {
    path.split('/')
        .filter(|s| !s.is_empty())
        .map(|s| decode(s.as_bytes(), || format!("path segment \"{}\"", shorten(s))))
        .collect()
}

/// `k=v&k2=v2` → a map (the last of a repeated key wins).
pub fn parse_query(query: &str) -> Result<HashMap<String, String>, BadRequest> {
    let mut out = HashMap::new();
    for pair in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode_form(k, || format!("query key \"{}\"", shorten(k)))?;
        let value = decode_form(v, || format!("the value of query parameter \"{key}\""))?;
        out.insert(key, value);
    }
    Ok(out)
}

/// Percent-decode `%3A` → `:` as bytes; the result must be UTF-8.
/// A `%` not followed by two hex digits is kept as it is.
pub fn percent_decode_utf8(s: &str) -> Result<String, BadRequest> {
    decode(s.as_bytes(), || format!("\"{}\"", shorten(s)))
}

fn decode(raw: &[u8], what: impl FnOnce() -> String) -> Result<String, BadRequest> {
    percent_decode(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| BadRequest::new(format!("{} is not UTF-8 after percent-decoding", what())))
}

/// Query form: `+` is a space, then percent-decoding.
fn decode_form(s: &str, what: impl FnOnce() -> String) -> Result<String, BadRequest> {
    let plus = s.replace('+', " ");
    decode(plus.as_bytes(), what)
}

fn number<T: std::str::FromStr>(
    q: &HashMap<String, String>,
    key: &str,
) -> Result<Option<T>, BadRequest> {
    match q.get(key) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            BadRequest::new(format!(
                "{key}=\"{}\" is not a non-negative integer",
                shorten(v)
            ))
        }),
    }
}

/// At most 64 characters of `s` (error messages quote the request).
fn shorten(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push_str("...");
    }
    out
}
