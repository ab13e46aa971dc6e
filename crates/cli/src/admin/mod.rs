//! The admin API, served by `vigil serve` and `vigil check` on
//! `admin.listen` (default 127.0.0.1:9901):
//!
//! | method and path | what |
//! | --- | --- |
//! | `GET /` | the live dashboard ([`dashboard`]); with it off, the endpoint list |
//! | `GET /api/status` | every upstream and peer ([`vigil_core::api::StatusDoc`]) |
//! | `GET /api/upstreams/NAME` | one upstream |
//! | `GET /api/explain?upstream=U[&peer=P]` | the sentences of `vigil explain` |
//! | `GET /api/events?since=SEQ&limit=N[&upstream=U]` | the transition log |
//! | `GET /api/config` | generation and the last reload's result |
//! | `GET /api/fleet` | fleet mode: members, who probes what, where each verdict came from |
//! | `POST /api/peers/UPSTREAM/PEER/{up,down,drain}` | admin state (bearer token) |
//! | `POST /api/reload` | reload the configuration (bearer token) |
//! | `GET /status`, `GET /metrics` | tengine's status page, Prometheus |
//!
//! Write endpoints need `Authorization: Bearer TOKEN`; without a configured
//! token they are refused. A non-loopback listen address needs a token.
//! Only requests whose `Host` names the listener are answered ([`host`]:
//! an address, `localhost`, or a name in `[admin] hosts`), so a page whose
//! DNS name is re-pointed at the listener cannot read it.
//! Every response but tengine's `/status` and `/metrics` carries
//! `Cache-Control: no-store` and `X-Content-Type-Options: nosniff`.

pub mod dashboard;
mod host;
mod listener;
mod route;
mod slots;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::Full;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use vigil_checker::status::StatusPage;
use vigil_core::api;
use vigil_core::event::EventBus;
use vigil_core::peer::AdminState;
use vigil_core::registry::Registry;
use vigil_core::Clock;

pub use host::AllowedHosts;
pub use listener::{Limits, HEADER_TIMEOUT, MAX_CONNECTIONS, REFUSED_LOG_INTERVAL, SEND_TIMEOUT};
pub use route::{
    parse_query, percent_decode_utf8, segments, BadRequest, DashboardAsset, Route,
    MAX_EVENTS_PER_CALL,
};

/// The default admin listen address.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9901);

type RegistryFn = Arc<dyn Fn() -> Arc<Registry> + Send + Sync>;
type ReloadFn = Arc<dyn Fn() -> Result<u64, String> + Send + Sync>;
type AnnotateFn = Arc<dyn Fn(&mut api::UpstreamView) + Send + Sync>;
type NginxStatusFn = Arc<dyn Fn() -> api::NginxSyncView + Send + Sync>;
type FleetFn = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Everything the admin API reads and acts on.
#[derive(Clone)]
pub struct Admin {
    registry: RegistryFn,
    clock: Arc<dyn Clock>,
    events: Arc<EventBus>,
    token: Option<String>,
    reload: Arc<std::sync::OnceLock<ReloadFn>>,
    last_reload: Arc<Mutex<Option<ReloadResult>>>,
    status: StatusPage,
    limits: Limits,
    refused: Arc<listener::Refused>,
    /// `vigil check`: adds what nginx was given to every upstream view.
    annotate: Option<AnnotateFn>,
    /// `vigil check`: the render and reload loop, for `/api/status`.
    nginx_status: Option<NginxStatusFn>,
    /// `GET /` serves the dashboard (else the endpoint list).
    dashboard: bool,
    /// Fleet mode: the fleet's view for `GET /api/fleet`.
    fleet: Option<FleetFn>,
    /// The `Host` names answered besides addresses and `localhost`.
    hosts: Arc<AllowedHosts>,
}

type ReloadResult = api::ReloadView;

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
    /// The upstream's own rules: the preset and what it switched on, the
    /// latency rules with their figures.
    rules: Vec<String>,
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
pub enum AdminError {
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

// === impl AdminError ===

impl AdminError {
    /// The address is held by another process (`EADDRINUSE`).
    pub fn is_addr_in_use(&self) -> bool {
        matches!(self, AdminError::Bind { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse)
    }
}

/// Log why the admin API is off when the *default* address (nobody asked
/// for it) could not be bound; the caller runs on without it. When another
/// process holds the port, the CLI commands would talk to that process and
/// hand it the operator's token: say so plainly.
pub fn warn_default_unavailable(err: &AdminError, how_to_set: &str) {
    let addr = match err {
        AdminError::Bind { addr, .. } | AdminError::NeedsToken(addr) => *addr,
    };
    tracing::warn!(%addr, "{}", default_unavailable_message(err, how_to_set));
}

/// The sentence [`warn_default_unavailable`] logs.
pub fn default_unavailable_message(err: &AdminError, how_to_set: &str) -> String {
    match err {
        AdminError::Bind { addr, .. } if err.is_addr_in_use() => format!(
            "{addr} is in use (EADDRINUSE) by another process; the admin API is off. \
             `vigil status` and the other commands would talk to that process and send it your token \
             ({how_to_set} to serve the admin API elsewhere)"
        ),
        _ => format!("{err}; the admin API is off ({how_to_set})"),
    }
}

// === impl Admin ===

impl Admin {
    /// An admin API over the registry `registry` returns (the current
    /// generation's), writing transitions to `events`; `token` (empty: none)
    /// guards the write endpoints and the reload error text.
    pub fn new(
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
            limits: Limits::default(),
            refused: Arc::default(),
            annotate: None,
            nginx_status: None,
            dashboard: true,
            fleet: None,
            hosts: Arc::default(),
        }
    }

    /// Answer requests whose `Host` is one of `names` too (lower-case, as
    /// `AdminConfig::host_name` makes them), besides addresses and
    /// `localhost` ([`AllowedHosts`]).
    pub fn with_hosts(mut self, names: impl IntoIterator<Item = String>) -> Self {
        self.hosts = Arc::new(AllowedHosts::new(names));
        self
    }

    /// Fleet mode: serve `f()` on `GET /api/fleet`.
    pub fn with_fleet(mut self, f: impl Fn() -> serde_json::Value + Send + Sync + 'static) -> Self {
        self.fleet = Some(Arc::new(f));
        self
    }

    /// `vigil check`: add the render and reload loop's state (`nginx`) to
    /// `/api/status`.
    pub fn with_nginx_status(
        mut self,
        f: impl Fn() -> api::NginxSyncView + Send + Sync + 'static,
    ) -> Self {
        self.nginx_status = Some(Arc::new(f));
        self
    }

    /// Pass every upstream view (status, upstream, explain) through `f`
    /// first: `vigil check` adds what nginx was given for each server.
    pub fn with_annotate(
        mut self,
        f: impl Fn(&mut api::UpstreamView) + Send + Sync + 'static,
    ) -> Self {
        self.annotate = Some(Arc::new(f));
        self
    }

    fn annotated(&self, mut view: api::UpstreamView) -> api::UpstreamView {
        if let Some(f) = &self.annotate {
            f(&mut view);
        }
        view
    }

    /// Serve the dashboard on `GET /` (the default), or only the list of
    /// endpoints there (`--no-dashboard`, `[admin] dashboard = false`).
    pub fn with_dashboard(mut self, on: bool) -> Self {
        self.dashboard = on;
        self
    }

    /// Other listener bounds than the defaults.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Connections closed at once because [`Limits::max_connections`] were
    /// open and every one was being answered.
    pub fn refused_connections(&self) -> u64 {
        self.refused.get()
    }

    /// Connections closed to make room for a new one at
    /// [`Limits::max_connections`] (the one that waited longest without a
    /// request in hand).
    pub fn evicted_connections(&self) -> u64 {
        self.refused.evicted()
    }

    /// Let `POST /api/reload` reload (every clone sees it; set once).
    pub fn set_reload(&self, f: impl Fn() -> Result<u64, String> + Send + Sync + 'static) {
        let _ = self.reload.set(Arc::new(f));
    }

    /// Remember a reload's result for `GET /api/config`.
    pub fn record_reload(&self, r: &Result<u64, String>) {
        let result = ReloadResult {
            at_unix_ms: self.clock.unix_ms(self.clock.now()),
            ok: r.is_ok(),
            generation: r.as_ref().ok().copied(),
            error: r.as_ref().err().cloned(),
            error_withheld: None,
        };
        if let Ok(mut g) = self.last_reload.lock() {
            *g = Some(result);
        }
    }

    /// Bind and serve until `shutdown`; returns the bound address.
    pub async fn listen(
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

    /// Serve on an already bound listener until `shutdown` (see [`Limits`]).
    pub async fn serve(self, listener: TcpListener, shutdown: CancellationToken) {
        listener::serve(self, listener, shutdown).await;
    }

    /// Answer one request that came over the listener: first its `Host`
    /// ([`AllowedHosts::check`]: 421 for a name that is not this
    /// listener's), then [`Admin::handle`].
    pub fn answer<B>(&self, req: &Request<B>) -> Response<Full<Bytes>> {
        match self.hosts.check(req) {
            Ok(()) => self.handle(req),
            Err(refused) => *refused,
        }
    }

    /// Answer one request (its `Host` is not looked at: see
    /// [`Admin::answer`]). Bodies are never read: every input is in the
    /// path or the query. Nothing in the request can make this panic.
    pub fn handle<B>(&self, req: &Request<B>) -> Response<Full<Bytes>> {
        let route = match Route::decode(req.method(), req.uri().path(), req.uri().query()) {
            Ok(r) => r,
            Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
        };
        match route {
            Route::Index => self.index(),
            Route::DashboardUpstreams => self.dashboard_upstreams(),
            Route::DashboardAsset(a) => self.dashboard_asset(a),
            Route::StatusPage => self.status.respond(req),
            Route::Status => {
                let mut doc = api::status(&(self.registry)(), &*self.clock);
                if let Some(f) = &self.annotate {
                    doc.upstreams.iter_mut().for_each(|u| f(u));
                }
                doc.nginx = self.nginx_status.as_ref().map(|f| f());
                doc.last_reload = self.last_reload(self.authorize(req).is_ok());
                json(StatusCode::OK, &doc)
            }
            Route::Upstream { name } => {
                let reg = (self.registry)();
                match reg.get(&name) {
                    Some(u) => json(
                        StatusCode::OK,
                        &self.annotated(api::upstream_view(u, &*self.clock, self.clock.now())),
                    ),
                    None => error(StatusCode::NOT_FOUND, format!("no upstream \"{name}\"")),
                }
            }
            Route::Explain { upstream, peer } => self.explain(&upstream, peer.as_deref()),
            Route::Events {
                since,
                limit,
                upstream,
            } => self.events(since, limit, upstream.as_deref()),
            Route::Config => self.config(self.authorize(req).is_ok()),
            Route::Fleet => match &self.fleet {
                Some(f) => json(StatusCode::OK, &f()),
                None => error(
                    StatusCode::NOT_FOUND,
                    "this vigil is not in a fleet (see --fleet-etcd)".into(),
                ),
            },
            Route::SetAdmin {
                upstream,
                peer,
                action,
            } => match self.authorize(req) {
                Err(r) => *r,
                Ok(()) => self.set_admin(&upstream, &peer, &action),
            },
            Route::Reload => match self.authorize(req) {
                Err(r) => *r,
                Ok(()) => self.reload(),
            },
            Route::MethodNotAllowed => {
                let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "GET or POST only".into());
                r.headers_mut()
                    .insert(header::ALLOW, header::HeaderValue::from_static("GET, POST"));
                r
            }
            Route::NotFound => error(
                StatusCode::NOT_FOUND,
                format!(
                    "no such endpoint: {} {}",
                    req.method(),
                    shorten(req.uri().path())
                ),
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
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        if given.is_some_and(|g| token_matches(g, token.as_bytes())) {
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

    /// `GET /api/config`. A reload error quotes the configuration (a
    /// `proxy_set_header Authorization ...`, a token in a URL): its text
    /// is shown only to a caller with the token.
    fn config(&self, authorized: bool) -> Response<Full<Bytes>> {
        json(
            StatusCode::OK,
            &ConfigDoc {
                generation: (self.registry)().generation(),
                last_reload: self.last_reload(authorized),
            },
        )
    }

    /// The last reload's result, its error text withheld unless `authorized`.
    fn last_reload(&self, authorized: bool) -> Option<ReloadResult> {
        let mut last = self.last_reload.lock().ok().and_then(|g| g.clone());
        if let Some(r) = last.as_mut().filter(|r| !authorized && r.error.is_some()) {
            r.error = None;
            r.error_withheld = Some(format!(
                "last reload failed at {}; the error text is shown with the admin token (Authorization: Bearer) and in the server log",
                http_date(r.at_unix_ms)
            ));
        }
        last
    }

    fn reload(&self) -> Response<Full<Bytes>> {
        let Some(f) = self.reload.get() else {
            return error(
                StatusCode::NOT_IMPLEMENTED,
                "this process cannot reload".into(),
            );
        };
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

    fn events(&self, since: u64, limit: usize, upstream: Option<&str>) -> Response<Full<Bytes>> {
        let got = self.events.since(since, limit);
        let events = got
            .events
            .iter()
            // Events of nginx as a whole (`vigil check`'s reloads) have no
            // upstream: they concern every one.
            .filter(|e| upstream.is_none_or(|u| &*e.upstream == u || e.upstream.is_empty()))
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

    fn explain(&self, name: &str, peer: Option<&str>) -> Response<Full<Bytes>> {
        let reg = (self.registry)();
        let Some(up) = reg.get(name) else {
            return error(StatusCode::NOT_FOUND, format!("no upstream \"{name}\""));
        };
        let view = self.annotated(api::upstream_view(up, &*self.clock, self.clock.now()));
        let events: Vec<api::EventView> = self
            .events
            .since(0, usize::MAX)
            .events
            .iter()
            .filter(|e| &*e.upstream == name)
            .map(api::event_view)
            .collect();
        let peers: Vec<ExplainPeer> = view
            .peers
            .iter()
            .filter(|p| peer.is_none_or(|want| p.address == want))
            .map(|p| ExplainPeer {
                peer: p.address.clone(),
                sentences: api::explain(&view, p, &events),
            })
            .collect();
        if peers.is_empty() {
            return error(
                StatusCode::NOT_FOUND,
                format!("no peer \"{}\" in upstream \"{name}\"", peer.unwrap_or("")),
            );
        }
        json(
            StatusCode::OK,
            &ExplainDoc {
                upstream: name.to_string(),
                rules: api::explain_rules(&view),
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
    no_store(r.headers_mut());
    r
}

/// State is never cached (a stale "eligible" misleads), and no browser
/// guesses another type than the one sent.
fn no_store(h: &mut http::HeaderMap) {
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
}

fn error(status: StatusCode, message: String) -> Response<Full<Bytes>> {
    json(status, &ErrorDoc { error: message })
}

/// The bearer token check, in constant time over the bytes (`subtle`): how
/// long it takes does not tell how many leading bytes were right.
fn token_matches(given: &[u8], token: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(given.ct_eq(token))
}

/// `Tue, 01 Dec 2026 08:26:12 GMT` for Unix milliseconds (past year 9999,
/// which HTTP dates cannot write, the milliseconds).
fn http_date(unix_ms: u64) -> String {
    const YEAR_10000_MS: u64 = 253_402_300_800_000;
    match std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_millis(unix_ms)) {
        Some(t) if unix_ms < YEAR_10000_MS => httpdate::fmt_http_date(t),
        _ => format!("{unix_ms} ms after 1970"),
    }
}

/// At most 200 characters of a request's path, for an error message.
fn shorten(s: &str) -> String {
    let mut out: String = s.chars().take(200).collect();
    if out.len() < s.len() {
        out.push_str("...");
    }
    out
}
