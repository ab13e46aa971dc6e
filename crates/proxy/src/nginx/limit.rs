//! nginx's preaccess phase: `limit_req`, then `limit_conn` (nginx runs the
//! two modules' handlers in that order), after the realip module and
//! before `allow`/`deny`. The rules are core's (`vigil_core::limit`);
//! here are the zones of a generation, each location's compiled limits,
//! their keys expanded from the request's variables, the error log lines
//! in nginx's words and `$limit_req_status` / `$limit_conn_status`.
//!
//! A location without limits has no [`Limits`] (`Route::limits` is None):
//! it pays one branch. A zone keeps its keys across a reload when its
//! name, kind, key and size are the same (nginx keeps a shared memory zone
//! of the same name and size; its rate may change).

use std::collections::HashMap;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::StatusCode;
use vigil_core::config::{self, Config, LimitLogLevel, LimitZone, ZoneKind};
use vigil_core::limit::conn::{self, ConnHold, ConnRule, ConnVerdict, ConnZone};
use vigil_core::limit::req::{self, ReqRule, ReqVerdict, ReqZone};

use crate::nginx::vars::{Scope, Template, VarContext};
use crate::wire::payload::{BoxError, UpBody};

/// The zones of one generation, by name.
#[derive(Default)]
pub(crate) struct Zones {
    req: HashMap<String, (LimitZone, Arc<ReqZone>)>,
    conn: HashMap<String, (LimitZone, Arc<ConnZone>)>,
}

/// One location's limits, compiled.
pub(crate) struct Limits {
    req: Vec<ReqUse>,
    req_status: StatusCode,
    req_log: LimitLogLevel,
    req_dry_run: bool,
    conn: Vec<ConnUse>,
    conn_status: StatusCode,
    conn_log: LimitLogLevel,
    conn_dry_run: bool,
}

struct ReqUse {
    zone: Arc<ReqZone>,
    name: Arc<str>,
    key: Key,
    rate: u64,
    burst: u64,
    delay: u64,
}

struct ConnUse {
    zone: Arc<ConnZone>,
    name: Arc<str>,
    key: Key,
    conn: u32,
}

/// A zone's key: its text (for the error log) and its template.
struct Key {
    text: Arc<str>,
    template: Template,
}

/// What the limits say of a request: as `$limit_req_status` and
/// `$limit_conn_status` read it (nginx's `r->main->limit_req_status`),
/// and once set, the limits of an internal redirect's location do not run
/// again.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LimitStatus {
    pub(crate) req: Option<&'static str>,
    pub(crate) conn: Option<&'static str>,
}

/// What `limit_req` decided.
enum ReqPhase {
    /// Go on.
    Pass,
    /// Go on after this long (no upstream contact meanwhile).
    Delay(Duration),
    /// Answer with this status.
    Reject(StatusCode),
}

/// Why the preaccess phase ends a request.
pub(crate) enum Refused {
    /// A limit refused it: answer with this status.
    Status(StatusCode),
    /// The client closed its connection while the request was delayed
    /// (nginx's `ngx_http_test_reading`: 499, nothing sent upstream).
    ClientGone,
}

impl Refused {
    /// The answer: the limit's status page, or a 499 closing the
    /// connection without a response.
    pub(crate) fn response(self) -> http::Response<UpBody> {
        match self {
            Refused::Status(s) => crate::nginx::status_page::error_page(s),
            Refused::ClientGone => crate::conn::close_silently(
                StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            ),
        }
    }
}

/// The requests in flight this request holds (`limit_conn`), given back
/// when it ends.
#[derive(Debug)]
pub(crate) struct Held(#[allow(dead_code, reason = "held for its Drop")] Vec<ConnHold>);

/// A response body that holds the request's `limit_conn` counts until it
/// ends (nginx gives them back when the request is freed).
pub(crate) struct HeldBody {
    inner: UpBody,
    _held: Held,
}

// === impl Zones ===

impl Zones {
    /// The zones of `config`, keeping those of `previous` that did not change.
    pub(crate) fn build(config: &Config, previous: Option<&Zones>) -> Self {
        let mut zones = Zones::default();
        for z in &config.limit_zones {
            match z.kind {
                ZoneKind::Req { .. } => {
                    let kept = previous
                        .and_then(|p| p.req.get(&z.name))
                        .filter(|(old, _)| same_zone(old, z))
                        .map(|(_, zone)| Arc::clone(zone));
                    let zone = kept.unwrap_or_else(|| Arc::new(ReqZone::new(z.size)));
                    zones.req.insert(z.name.clone(), (z.clone(), zone));
                }
                ZoneKind::Conn => {
                    let kept = previous
                        .and_then(|p| p.conn.get(&z.name))
                        .filter(|(old, _)| same_zone(old, z))
                        .map(|(_, zone)| Arc::clone(zone));
                    let zone = kept.unwrap_or_else(|| Arc::new(ConnZone::new(z.size)));
                    zones.conn.insert(z.name.clone(), (z.clone(), zone));
                }
            }
        }
        zones
    }
}

/// Whether a zone's keys stay valid under `new` (its rate may change).
fn same_zone(old: &LimitZone, new: &LimitZone) -> bool {
    old.key == new.key
        && old.size == new.size
        && matches!(old.kind, ZoneKind::Conn) == matches!(new.kind, ZoneKind::Conn)
}

// === impl Limits ===

impl Limits {
    /// The limits of a location (None when it has none).
    pub(crate) fn build(
        l: &config::Limits,
        zones: &Zones,
        scope: &Scope,
    ) -> Result<Option<Box<Self>>, String> {
        if l.is_empty() {
            return Ok(None);
        }
        let key = |z: &LimitZone| {
            Template::parse_with(&z.key, scope)
                .map(|template| Key {
                    text: Arc::from(z.key.as_str()),
                    template,
                })
                .map_err(|e| format!("key of zone \"{}\": {e}", z.name))
        };
        let mut req = Vec::new();
        for r in &l.req {
            let (def, zone) = zones
                .req
                .get(&r.zone)
                .ok_or_else(|| format!("zero size shared memory zone \"{}\"", r.zone))?;
            let rate = match def.kind {
                ZoneKind::Req { rate } => rate.max(1),
                ZoneKind::Conn => 1,
            };
            req.push(ReqUse {
                zone: Arc::clone(zone),
                name: Arc::from(r.zone.as_str()),
                key: key(def)?,
                rate,
                burst: u64::from(r.burst) * 1000,
                delay: r.delay.milli(),
            });
        }
        let mut conn = Vec::new();
        for c in &l.conn {
            let (def, zone) = zones
                .conn
                .get(&c.zone)
                .ok_or_else(|| format!("zero size shared memory zone \"{}\"", c.zone))?;
            conn.push(ConnUse {
                zone: Arc::clone(zone),
                name: Arc::from(c.zone.as_str()),
                key: key(def)?,
                conn: c.conn,
            });
        }
        let status =
            |s: u16| StatusCode::from_u16(s).map_err(|_| format!("invalid limit status {s}"));
        Ok(Some(Box::new(Self {
            req,
            req_status: status(l.req_status)?,
            req_log: l.req_log_level,
            req_dry_run: l.req_dry_run,
            conn,
            conn_status: status(l.conn_status)?,
            conn_log: l.conn_log_level,
            conn_dry_run: l.conn_dry_run,
        })))
    }

    /// `limit_req` for the request of `cx` at core's `now` (ms), unless
    /// it ran for this request already (`status.req`, which it sets).
    fn requests(&self, cx: &VarContext<'_>, status: &mut LimitStatus, now: u64) -> ReqPhase {
        if self.req.is_empty() || status.req.is_some() {
            return ReqPhase::Pass;
        }
        let keys: Vec<Vec<u8>> = self.req.iter().map(|r| key_of(&r.key, cx, 65535)).collect();
        let rules: Vec<ReqRule<'_>> = self
            .req
            .iter()
            .map(|r| ReqRule {
                zone: &r.zone,
                rate: r.rate,
                burst: r.burst,
                delay: r.delay,
            })
            .collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let verdict = req::check(&rules, &keys, now);
        self.log_req(&verdict, cx);
        let dry = self.req_dry_run;
        let (word, phase) = match verdict {
            ReqVerdict::Declined => return ReqPhase::Pass,
            ReqVerdict::Passed => ("PASSED", ReqPhase::Pass),
            ReqVerdict::Delayed { .. } if dry => ("DELAYED_DRY_RUN", ReqPhase::Pass),
            ReqVerdict::Delayed { ms, .. } => {
                ("DELAYED", ReqPhase::Delay(Duration::from_millis(ms)))
            }
            ReqVerdict::Rejected { .. } | ReqVerdict::NoRoom { .. } if dry => {
                ("REJECTED_DRY_RUN", ReqPhase::Pass)
            }
            ReqVerdict::Rejected { .. } | ReqVerdict::NoRoom { .. } => {
                ("REJECTED", ReqPhase::Reject(self.req_status))
            }
        };
        status.req = Some(word);
        phase
    }

    /// `limit_conn` for the request of `cx`, unless it ran for this
    /// request already (`status.conn`, which it sets): what the request
    /// holds until it ends, or the status it is refused with.
    fn connections(
        &self,
        cx: &VarContext<'_>,
        status: &mut LimitStatus,
    ) -> Result<Option<Held>, StatusCode> {
        if self.conn.is_empty() || status.conn.is_some() {
            return Ok(None);
        }
        let keys: Vec<Vec<u8>> = self.conn.iter().map(|c| key_of(&c.key, cx, 255)).collect();
        let rules: Vec<ConnRule<'_>> = self
            .conn
            .iter()
            .map(|c| ConnRule {
                zone: &c.zone,
                conn: c.conn,
            })
            .collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let verdict = conn::acquire(&rules, &keys);
        if let ConnVerdict::Rejected { rule, full: true } = verdict {
            let dry = if self.conn_dry_run { ", dry run," } else { "" };
            let zone = &self.conn[rule].name;
            log(
                self.conn_log,
                cx,
                format_args!("limiting connections{dry} by zone \"{zone}\""),
            );
        }
        let (word, out) = match verdict {
            ConnVerdict::Declined => return Ok(None),
            ConnVerdict::Passed(h) => ("PASSED", Ok(Some(Held(h)))),
            ConnVerdict::Rejected { .. } if self.conn_dry_run => ("REJECTED_DRY_RUN", Ok(None)),
            ConnVerdict::Rejected { .. } => ("REJECTED", Err(self.conn_status)),
        };
        status.conn = Some(word);
        out
    }

    /// nginx's lines: "limiting requests, excess: E by zone" at the
    /// level set, "delaying request, excess: E, by zone" one lower.
    fn log_req(&self, verdict: &ReqVerdict, cx: &VarContext<'_>) {
        let dry = if self.req_dry_run { ", dry run" } else { "" };
        match *verdict {
            ReqVerdict::Rejected { excess, rule } => {
                let zone = &self.req[rule].name;
                let e = Excess(excess);
                log(
                    self.req_log,
                    cx,
                    format_args!("limiting requests{dry}, excess: {e} by zone \"{zone}\""),
                );
            }
            ReqVerdict::Delayed { excess, rule, .. } => {
                let zone = &self.req[rule].name;
                let e = Excess(excess);
                log(
                    self.req_log.lower(),
                    cx,
                    format_args!("delaying request{dry}, excess: {e}, by zone \"{zone}\""),
                );
            }
            ReqVerdict::NoRoom { rule } => {
                let zone = &self.req[rule].name;
                tracing::error!("could not allocate node in limit_req zone \"{zone}\"");
            }
            ReqVerdict::Declined | ReqVerdict::Passed => {}
        }
    }
}

/// The preaccess phase of a request routed to `route` (whose limits are
/// `limits`), from `client` (after realip) on `local`: `limit_req` (a
/// delay is waited out here, on the worker's timer, unless the client of
/// `conn` goes away), then `limit_conn`. Ok: what the request holds until
/// it ends.
pub(crate) async fn preaccess(
    limits: &Limits,
    proxy_host: &str,
    target: Option<&crate::nginx::router::Target>,
    (client, local, conn): (
        std::net::SocketAddr,
        std::net::SocketAddr,
        &crate::conn::ConnState,
    ),
    parts: &mut Parts,
    now: u64,
) -> Result<Option<Held>, Refused> {
    let mut status = parts
        .extensions
        .get::<LimitStatus>()
        .copied()
        .unwrap_or_default();
    let phase = limits.requests(
        &vars(parts, target, (client, local), proxy_host),
        &mut status,
        now,
    );
    parts.extensions.insert(status);
    match phase {
        ReqPhase::Pass => {}
        ReqPhase::Delay(d) => {
            let mut sleep = std::pin::pin!(crate::conn::timer::sleep(d));
            // The connection's watch polls the handler again when the
            // client goes away.
            let gone = std::future::poll_fn(|task| {
                if conn.client_gone() {
                    return Poll::Ready(true);
                }
                sleep.as_mut().poll(task).map(|()| false)
            });
            if gone.await {
                tracing::info!(client = %client.ip(), "client closed the connection while its request was delayed by limit_req");
                return Err(Refused::ClientGone);
            }
        }
        ReqPhase::Reject(s) => return Err(Refused::Status(s)),
    }
    let held = limits.connections(
        &vars(parts, target, (client, local), proxy_host),
        &mut status,
    );
    parts.extensions.insert(status);
    held.map_err(Refused::Status)
}

/// The variables of a request for the limits' keys.
fn vars<'a>(
    parts: &'a Parts,
    target: Option<&'a crate::nginx::router::Target>,
    (client, local): (std::net::SocketAddr, std::net::SocketAddr),
    proxy_host: &'a str,
) -> VarContext<'a> {
    VarContext {
        parts,
        target,
        client,
        local,
        proxy_host,
        attempts: &[],
        status: 0,
        request_time: 0.0,
    }
}

/// What the limits said of a request (`from`, its extensions), copied
/// beside its response (`to`) for an `error_page`'s pass, which does not
/// run them again (nginx keeps them in the main request).
pub(crate) fn carry(from: &http::Extensions, to: &mut http::Extensions) {
    if let Some(s) = from.get::<LimitStatus>() {
        to.insert(*s);
    }
}

/// The key of a zone for a request; empty (not accounted) when longer
/// than nginx takes, with its error line.
fn key_of(key: &Key, cx: &VarContext<'_>, max: usize) -> Vec<u8> {
    let v = key.template.expand(cx);
    if v.len() > max {
        tracing::error!(
            "the value of the \"{}\" key is more than {max} bytes: \"{}\"",
            key.text,
            String::from_utf8_lossy(&v)
        );
        return Vec::new();
    }
    v
}

/// Milli-requests as nginx prints them (`1.000`).
struct Excess(u64);

impl std::fmt::Display for Excess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
    }
}

/// One error log line at `level`, with nginx's request context.
fn log(level: LimitLogLevel, cx: &VarContext<'_>, what: std::fmt::Arguments<'_>) {
    let p = cx.parts;
    let pq = p.uri.path_and_query().map_or("/", |q| q.as_str());
    let server = cx.target.map_or("", |t| &*t.server_name);
    let host = crate::nginx::router::host_of(p);
    let client = cx.client.ip();
    let line = format_args!(
        "{what}, client: {client}, server: {server}, request: \"{} {pq} {:?}\", host: \"{host}\"",
        p.method, p.version
    );
    match level {
        LimitLogLevel::Error => tracing::error!("{line}"),
        LimitLogLevel::Warn => tracing::warn!("{line}"),
        LimitLogLevel::Notice | LimitLogLevel::Info => tracing::info!("{line}"),
    }
}

// === impl HeldBody ===

impl HeldBody {
    /// `inner`, holding `held` until it ends or is dropped.
    pub(crate) fn wrap(inner: UpBody, held: Held) -> UpBody {
        http_body_util::BodyExt::boxed(Self { inner, _held: held })
    }
}

impl hyper::body::Body for HeldBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(zones: &[(&str, &str, u64, ZoneKind)]) -> Config {
        let mut c = Config::default();
        for (name, key, size, kind) in zones {
            c.limit_zones.push(LimitZone {
                name: name.to_string(),
                key: key.to_string(),
                size: *size,
                kind: *kind,
                origin: Default::default(),
            });
        }
        c
    }

    #[test]
    fn a_reload_keeps_the_keys_of_a_zone_that_did_not_change() {
        let req = |rate| ZoneKind::Req { rate };
        let first = Zones::build(
            &config(&[
                ("a", "$binary_remote_addr", 1 << 20, req(1000)),
                ("b", "$binary_remote_addr", 1 << 20, req(1000)),
                ("c", "$binary_remote_addr", 1 << 20, ZoneKind::Conn),
            ]),
            None,
        );
        let next = Zones::build(
            &config(&[
                // The rate may change; the key or the size may not.
                ("a", "$binary_remote_addr", 1 << 20, req(2000)),
                ("b", "$remote_addr", 1 << 20, req(1000)),
                ("c", "$binary_remote_addr", 2 << 20, ZoneKind::Conn),
            ]),
            Some(&first),
        );
        assert!(Arc::ptr_eq(&first.req["a"].1, &next.req["a"].1));
        assert!(!Arc::ptr_eq(&first.req["b"].1, &next.req["b"].1));
        assert!(!Arc::ptr_eq(&first.conn["c"].1, &next.conn["c"].1));
    }

    #[test]
    fn excess_prints_as_nginx_prints_it() {
        assert_eq!(Excess(1000).to_string(), "1.000");
        assert_eq!(Excess(2997).to_string(), "2.997");
        assert_eq!(Excess(40).to_string(), "0.040");
    }
}
