//! The admin API, served by `vigil serve` and `vigil check` on
//! `admin.listen` (default 127.0.0.1:9901):
//!
//! | method and path | what |
//! | --- | --- |
//! | `GET /api/status` | every upstream and peer ([`vigil_core::api::StatusDoc`]) |
//! | `GET /api/upstreams/NAME` | one upstream |
//! | `GET /api/explain?upstream=U[&peer=P]` | the sentences of `vigil explain` |
//! | `GET /api/events?since=SEQ&limit=N[&upstream=U]` | the transition log |
//! | `GET /api/config` | generation and the last reload's result |
//! | `POST /api/peers/UPSTREAM/PEER/{up,down,drain}` | admin state (bearer token) |
//! | `POST /api/reload` | reload the configuration (bearer token) |
//! | `GET /status`, `GET /metrics` | tengine's status page, Prometheus |
//!
//! Write endpoints need `Authorization: Bearer TOKEN`; without a configured
//! token they are refused. A non-loopback listen address needs a token.

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use vigil_checker::status::StatusPage;
use vigil_core::api;
use vigil_core::event::EventBus;
use vigil_core::peer::AdminState;
use vigil_core::registry::Registry;
use vigil_core::Clock;

type RegistryFn = Arc<dyn Fn() -> Arc<Registry> + Send + Sync>;
type ReloadFn = Arc<dyn Fn() -> Result<u64, String> + Send + Sync>;

/// Everything the admin API reads and acts on.
#[derive(Clone)]
pub(crate) struct Admin {
    registry: RegistryFn,
    clock: Arc<dyn Clock>,
    events: Arc<EventBus>,
    token: Option<String>,
    reload: Arc<std::sync::OnceLock<ReloadFn>>,
    last_reload: Arc<Mutex<Option<ReloadResult>>>,
    status: StatusPage,
}

#[derive(Clone, Debug, Serialize)]
struct ReloadResult {
    at_unix_ms: u64,
    ok: bool,
    generation: Option<u64>,
    error: Option<String>,
}

#[derive(Serialize)]
struct ConfigDoc {
    generation: u64,
    last_reload: Option<ReloadResult>,
}

#[derive(Serialize)]
struct EventsDoc {
    events: Vec<api::EventView>,
    missed: u64,
    next: u64,
}

#[derive(Serialize)]
struct ExplainDoc {
    upstream: String,
    peers: Vec<ExplainPeer>,
}

#[derive(Serialize)]
struct ExplainPeer {
    peer: String,
    sentences: Vec<String>,
}

#[derive(Serialize)]
struct AdminChange {
    upstream: String,
    peer: String,
    from: String,
    to: String,
}

#[derive(Serialize)]
struct ErrorDoc {
    error: String,
}

/// Why the admin listener will not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminError {
    /// Writes from anywhere but this host need a token.
    #[error(
        "admin listen address {0} is not loopback: configure admin.token (or --admin-token) first"
    )]
    NeedsToken(SocketAddr),
    /// Bind failed.
    #[error("cannot listen on {addr} for the admin API: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

// === impl Admin ===

impl Admin {
    pub(crate) fn new(
        registry: impl Fn() -> Arc<Registry> + Send + Sync + 'static,
        clock: Arc<dyn Clock>,
        events: Arc<EventBus>,
        token: Option<String>,
        status: StatusPage,
    ) -> Self {
        Self {
            registry: Arc::new(registry),
            clock,
            events,
            token: token.filter(|t| !t.is_empty()),
            reload: Arc::new(std::sync::OnceLock::new()),
            last_reload: Arc::new(Mutex::new(None)),
            status,
        }
    }

    /// Let `POST /api/reload` reload (every clone sees it; set once).
    pub(crate) fn set_reload(&self, f: impl Fn() -> Result<u64, String> + Send + Sync + 'static) {
        let _ = self.reload.set(Arc::new(f));
    }

    /// Remember a reload's result for `GET /api/config`.
    pub(crate) fn record_reload(&self, r: &Result<u64, String>) {
        let result = ReloadResult {
            at_unix_ms: self.clock.unix_ms(self.clock.now()),
            ok: r.is_ok(),
            generation: r.as_ref().ok().copied(),
            error: r.as_ref().err().cloned(),
        };
        if let Ok(mut g) = self.last_reload.lock() {
            *g = Some(result);
        }
    }

    /// Bind and serve until `shutdown`; returns the bound address.
    pub(crate) async fn listen(
        self,
        addr: SocketAddr,
        shutdown: CancellationToken,
    ) -> Result<SocketAddr, AdminError> {
        if !addr.ip().is_loopback() && self.token.is_none() {
            return Err(AdminError::NeedsToken(addr));
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| AdminError::Bind { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| AdminError::Bind { addr, source })?;
        tracing::info!(addr = %bound, "admin API listening");
        tokio::spawn(self.serve(listener, shutdown));
        Ok(bound)
    }

    /// Serve on an already bound listener until `shutdown`.
    pub(crate) async fn serve(self, listener: TcpListener, shutdown: CancellationToken) {
        let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "admin accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = shutdown.cancelled() => return,
            };
            let admin = self.clone();
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let admin = admin.clone();
                async move { Ok::<_, Infallible>(admin.handle(&req)) }
            });
            let conn = builder
                .serve_connection(TokioIo::new(stream), svc)
                .into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    }

    /// Answer one request (bodies are never read: every input is in the path or query).
    pub(crate) fn handle<B>(&self, req: &Request<B>) -> Response<Full<Bytes>> {
        let path = req.uri().path().trim_end_matches('/');
        let query = parse_query(req.uri().query().unwrap_or(""));
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let method = req.method().clone();
        match (method, segs.as_slice()) {
            (_, ["status"]) | (_, ["metrics"]) => self.status.respond(req),
            (Method::GET, ["api", "status"]) => json(
                StatusCode::OK,
                &api::status(&(self.registry)(), &*self.clock),
            ),
            (Method::GET, ["api", "upstreams", name]) => {
                let reg = (self.registry)();
                match reg.get(name) {
                    Some(u) => json(
                        StatusCode::OK,
                        &api::upstream_view(u, &*self.clock, self.clock.now()),
                    ),
                    None => error(StatusCode::NOT_FOUND, format!("no upstream \"{name}\"")),
                }
            }
            (Method::GET, ["api", "explain"]) => self.explain(&query),
            (Method::GET, ["api", "events"]) => self.events(&query),
            (Method::GET, ["api", "config"]) => json(
                StatusCode::OK,
                &ConfigDoc {
                    generation: (self.registry)().generation(),
                    last_reload: self.last_reload.lock().ok().and_then(|g| g.clone()),
                },
            ),
            (Method::POST, ["api", "peers", upstream, peer, action]) => {
                if let Err(r) = self.authorize(req) {
                    return *r;
                }
                self.set_admin(upstream, &percent_decode(peer), action)
            }
            (Method::POST, ["api", "reload"]) => {
                if let Err(r) = self.authorize(req) {
                    return *r;
                }
                match self.reload.get() {
                    None => error(
                        StatusCode::NOT_IMPLEMENTED,
                        "this process cannot reload".into(),
                    ),
                    Some(f) => {
                        let r = f();
                        self.record_reload(&r);
                        match r {
                            Ok(g) => json(
                                StatusCode::OK,
                                &serde_json::json!({"ok": true, "generation": g}),
                            ),
                            Err(e) => error(StatusCode::UNPROCESSABLE_ENTITY, e),
                        }
                    }
                }
            }
            (m, ["api", ..]) if m != Method::GET && m != Method::POST => {
                error(StatusCode::METHOD_NOT_ALLOWED, "GET or POST only".into())
            }
            _ => error(
                StatusCode::NOT_FOUND,
                format!("no such endpoint: {} {}", req.method(), req.uri().path()),
            ),
        }
    }

    fn authorize<B>(&self, req: &Request<B>) -> Result<(), Box<Response<Full<Bytes>>>> {
        let Some(token) = &self.token else {
            return Err(Box::new(error(
                StatusCode::FORBIDDEN,
                "write endpoints are disabled: no admin token is configured".into(),
            )));
        };
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
            Ok(())
        } else {
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "a valid bearer token is required".into(),
            );
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            Err(Box::new(r))
        }
    }

    fn set_admin(&self, upstream: &str, peer: &str, action: &str) -> Response<Full<Bytes>> {
        let to: AdminState = match action.parse() {
            Ok(s) => s,
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        };
        let reg = (self.registry)();
        let Some(up) = reg.get(upstream) else {
            return error(StatusCode::NOT_FOUND, format!("no upstream \"{upstream}\""));
        };
        let Some(p) = up.peer_by_name(peer) else {
            return error(
                StatusCode::NOT_FOUND,
                format!("no peer \"{peer}\" in upstream \"{upstream}\""),
            );
        };
        match up.set_admin(p.id(), to, self.clock.now()) {
            Some(from) => json(
                StatusCode::OK,
                &AdminChange {
                    upstream: upstream.into(),
                    peer: peer.into(),
                    from: from.to_string(),
                    to: to.to_string(),
                },
            ),
            None => error(StatusCode::NOT_FOUND, format!("no peer \"{peer}\"")),
        }
    }

    fn events(&self, q: &HashMap<String, String>) -> Response<Full<Bytes>> {
        let since = q.get("since").and_then(|s| s.parse().ok()).unwrap_or(0);
        let limit = q
            .get("limit")
            .and_then(|s| s.parse().ok())
            .unwrap_or(1000usize)
            .min(10_000);
        let got = self.events.since(since, limit);
        let events = got
            .events
            .iter()
            .filter(|e| q.get("upstream").is_none_or(|u| &*e.upstream == u.as_str()))
            .map(api::event_view)
            .collect();
        json(
            StatusCode::OK,
            &EventsDoc {
                events,
                missed: got.missed,
                next: got.next,
            },
        )
    }

    fn explain(&self, q: &HashMap<String, String>) -> Response<Full<Bytes>> {
        let Some(name) = q.get("upstream") else {
            return error(StatusCode::BAD_REQUEST, "upstream=NAME is required".into());
        };
        let reg = (self.registry)();
        let Some(up) = reg.get(name) else {
            return error(StatusCode::NOT_FOUND, format!("no upstream \"{name}\""));
        };
        let view = api::upstream_view(up, &*self.clock, self.clock.now());
        let events: Vec<api::EventView> = self
            .events
            .since(0, usize::MAX)
            .events
            .iter()
            .filter(|e| &*e.upstream == name.as_str())
            .map(api::event_view)
            .collect();
        let peers: Vec<ExplainPeer> = view
            .peers
            .iter()
            .filter(|p| q.get("peer").is_none_or(|want| &p.address == want))
            .map(|p| ExplainPeer {
                peer: p.address.clone(),
                sentences: api::explain(&view, p, &events),
            })
            .collect();
        if peers.is_empty() {
            return error(
                StatusCode::NOT_FOUND,
                format!(
                    "no peer \"{}\" in upstream \"{name}\"",
                    q.get("peer").map_or("", String::as_str)
                ),
            );
        }
        json(
            StatusCode::OK,
            &ExplainDoc {
                upstream: name.clone(),
                peers,
            },
        )
    }
}

fn json<T: Serialize>(status: StatusCode, v: &T) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(v)
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}").into_bytes());
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(status: StatusCode, message: String) -> Response<Full<Bytes>> {
    json(status, &ErrorDoc { error: message })
}

fn parse_query(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// `%3A` → `:` (peer addresses travel in paths and queries).
pub(crate) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
