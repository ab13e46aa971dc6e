//! What the handler tells about one client request: each attempt's
//! outcome, each failure core counted, each retry, the final status. The
//! counters are bumped at once (no allocation); the spans, only when a
//! tracer is set, are built when the request's answer is ready, from the
//! times noted on the way.

use std::sync::Arc;
use std::time::{Duration, SystemTime};
use vigil_net::clock::Tick;

use http::Method;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use vigil_core::config::PeerAddr;
use vigil_core::peer::Peer;
use vigil_core::upstream::Accounting;
use vigil_core::RetryDenied;

use super::RequestTracer;
use crate::obs::metrics::{Outcome, UpstreamStats};

/// Metrics and (optionally) the trace of one request.
pub(crate) struct RequestObserver<'a> {
    stats: Option<Arc<UpstreamStats>>,
    trace: Option<Box<RequestTrace<'a>>>,
    start: Tick,
}

struct RequestTrace<'a> {
    tracer: &'a RequestTracer,
    method: Method,
    location: String,
    upstream: Arc<str>,
    attempts: Vec<AttemptTrace>,
}

struct AttemptTrace {
    peer: Arc<str>,
    addr: PeerAddr,
    outcome: Outcome,
    status: Option<u16>,
    connect_time: Option<f64>,
    duration: Duration,
    end: SystemTime,
}

// === impl RequestObserver ===

impl<'a> RequestObserver<'a> {
    /// Observe a request that arrived at `start`, routed to `location` and
    /// `upstream`. `stats` are the upstream's counters (None without
    /// metrics), `tracer` is set when traces are exported.
    pub(crate) fn new(
        start: Tick,
        stats: Option<Arc<UpstreamStats>>,
        tracer: Option<&'a RequestTracer>,
        method: &Method,
        location: &str,
        upstream: &Arc<str>,
    ) -> Self {
        let trace = tracer.map(|tracer| {
            Box::new(RequestTrace {
                tracer,
                method: method.clone(),
                location: location.to_string(),
                upstream: upstream.clone(),
                attempts: Vec::new(),
            })
        });
        Self {
            stats,
            trace,
            start,
        }
    }

    /// An attempt on `peer` took `duration` and came to `outcome` (with
    /// the response's `status` when a header arrived).
    pub(crate) fn attempt(
        &mut self,
        peer: &Peer,
        outcome: Outcome,
        status: Option<u16>,
        connect_time: Option<f64>,
        duration: Duration,
    ) {
        if let Some(s) = &self.stats {
            s.attempt(peer.id(), outcome);
        }
        if let Some(t) = &mut self.trace {
            t.attempts.push(AttemptTrace {
                peer: peer.name().clone(),
                addr: peer.config().peer_addr(),
                outcome,
                status,
                connect_time,
                duration,
                end: SystemTime::now(),
            });
        }
    }

    /// What core charged `peer` toward `max_fails` for one attempt.
    pub(crate) fn charged(&self, peer: &Peer, accounting: Accounting) {
        if let Some(s) = &self.stats {
            s.charged(peer.id(), accounting);
        }
    }

    /// The upstream's counters, for a response body that may still be
    /// charged after the header (`passive_count after_header`).
    pub(crate) fn stats(&self) -> Option<Arc<UpstreamStats>> {
        self.stats.clone()
    }

    /// The request moves to the next peer.
    pub(crate) fn retry(&self) {
        if let Some(s) = &self.stats {
            s.retry();
        }
    }

    /// A hedge went out.
    pub(crate) fn hedge(&self) {
        if let Some(s) = &self.stats {
            s.hedge();
        }
    }

    /// Core denied a retry or a hedge.
    pub(crate) fn denied(&self, why: RetryDenied) {
        if let Some(s) = &self.stats {
            s.denied(why);
        }
    }

    /// No peer was eligible.
    pub(crate) fn no_live_upstreams(&self) {
        if let Some(s) = &self.stats {
            s.no_live_upstreams();
        }
    }

    /// The client is answered with `status`.
    pub(crate) fn finish(self, status: u16) {
        let elapsed = vigil_net::clock::coarse_tick().since(self.start);
        if let Some(s) = &self.stats {
            s.request(status, elapsed);
        }
        if let Some(t) = self.trace {
            (*t).emit(status, elapsed);
        }
    }
}

// === impl RequestTrace ===

impl RequestTrace<'_> {
    fn emit(self, status: u16, elapsed: Duration) {
        let end = SystemTime::now();
        let tracer = &self.tracer.0;
        let request = tracer
            .span_builder("request")
            .with_kind(SpanKind::Server)
            .with_start_time(end.checked_sub(elapsed).unwrap_or(end))
            .with_attributes([
                KeyValue::new("http.request.method", self.method.as_str().to_string()),
                KeyValue::new("http.route", self.location),
                KeyValue::new("vigil.upstream", self.upstream),
                KeyValue::new("http.response.status_code", i64::from(status)),
                KeyValue::new("vigil.attempts", self.attempts.len() as i64),
            ])
            .start(tracer);
        let cx = Context::new().with_span(request);
        for a in self.attempts {
            let mut attributes = vec![
                KeyValue::new("vigil.peer", a.peer),
                KeyValue::new("vigil.outcome", a.outcome.as_str()),
                KeyValue::new("vigil.duration_s", a.duration.as_secs_f64()),
            ];
            match &a.addr {
                PeerAddr::Inet(sa) => {
                    attributes.push(KeyValue::new("network.peer.address", sa.ip().to_string()));
                    attributes.push(KeyValue::new("network.peer.port", i64::from(sa.port())));
                }
                // OpenTelemetry's semantic conventions: the path, transport `unix`.
                PeerAddr::Unix(p) => {
                    attributes.push(KeyValue::new(
                        "network.peer.address",
                        p.display().to_string(),
                    ));
                    attributes.push(KeyValue::new("network.transport", "unix"));
                }
            }
            if let Some(c) = a.connect_time {
                attributes.push(KeyValue::new("vigil.connect_time_s", c));
            }
            if let Some(s) = a.status {
                attributes.push(KeyValue::new("http.response.status_code", i64::from(s)));
            }
            let span = tracer
                .span_builder("attempt")
                .with_kind(SpanKind::Client)
                .with_start_time(a.end.checked_sub(a.duration).unwrap_or(a.end))
                .with_attributes(attributes);
            let mut span = span.start_with_context(tracer, &cx);
            if a.outcome != Outcome::Ok {
                span.set_status(Status::error(a.outcome.as_str()));
            }
            span.end_with_timestamp(a.end);
        }
        let request = cx.span();
        if status >= 500 {
            request.set_status(Status::error(format!("answered {status}")));
        }
        request.end_with_timestamp(end);
    }
}
