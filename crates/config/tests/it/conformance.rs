//! Every recorded nginx 1.22.1 conformance scenario (`tests/conformance/`,
//! copied from `shared/conformance/golden/`) replayed at the core level:
//! the scenario's own nginx.conf goes through vigil's nginx front end, a
//! simulated proxy drives `Upstream::select` / `on_status` / `on_failure`
//! exactly as `vigil serve` does, backends behave as `backends.py`'s modes,
//! and time is a manual clock (each `sleep` step advances it). Status,
//! body completeness and the attempt sequence (with refused connects as
//! `A-`) must equal what nginx did.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use vigil_config::{literal_resolver, nginx};
use vigil_core::config::{Location, LocationMatch};
use vigil_core::event::EventBus;
use vigil_core::upstream::{PeerGuard, Selection};
use vigil_core::{
    Clock, FailureClass, FailureVerdict, ManualClock, RequestFacts, RetryPolicy, SelectKey,
    StatusVerdict, TransportFailure, Upstream,
};

#[derive(Clone, Debug, PartialEq)]
enum Mode {
    Ok,
    Status(u16),
    Close,
    Reset,
    Down,
    Blackhole,
    Hang,
    Partial,
    BadHeader,
    Delay(u64),
}

#[derive(Debug, PartialEq)]
struct Outcome {
    status: u16,
    complete: bool,
    attempts: Vec<String>,
}

struct Pending {
    id: String,
    peer: String,
    sel: Selection,
    guard: PeerGuard,
    attempts: Vec<String>,
}

struct Sim {
    clock: Arc<ManualClock>,
    upstreams: HashMap<String, Arc<Upstream>>,
    locations: Vec<Location>,
    labels: HashMap<String, String>,
    modes: HashMap<String, Mode>,
}

fn port_of(i: usize) -> u16 {
    20_000 + i as u16
}

impl Sim {
    fn new(g: &Value) -> Self {
        let peers: Vec<String> = g["peers"]
            .as_array()
            .expect("peers")
            .iter()
            .map(|v| v.as_str().expect("label").to_string())
            .collect();
        let mut text = format!(
            "worker_processes 1; error_log logs/error.log info; pid logs/nginx.pid;\n\
             events {{ worker_connections 1024; }}\nhttp {{\n access_log off; client_body_temp_path tmp/client_body;\n{}\n server {{\n  listen 127.0.0.1:8080;\n  add_header X-Upstream-Addr $upstream_addr always;\n  add_header X-Upstream-Status $upstream_status always;\n{}\n }}\n}}\n",
            g["upstreams"].as_str().expect("upstreams"),
            g["locations"].as_str().expect("locations"),
        );
        let mut labels = HashMap::new();
        for (i, p) in peers.iter().enumerate() {
            let addr = format!("127.0.0.1:{}", port_of(i));
            text = text.replace(&format!("{{{p}}}"), &addr);
            labels.insert(addr, p.clone());
        }
        let loaded = nginx::load_str(
            &text,
            Path::new("scenario.conf"),
            Path::new("."),
            &literal_resolver,
        )
        .unwrap_or_else(|e| panic!("{}: {e}\n{text}", g["scenario"]));
        let clock = Arc::new(ManualClock::at(1_700_000_000_000));
        let events = Arc::new(EventBus::default());
        let upstreams = loaded
            .config
            .upstreams
            .iter()
            .map(|u| {
                let c: Arc<dyn Clock> = clock.clone();
                (
                    u.name.clone(),
                    Arc::new(Upstream::new(u.clone(), events.clone(), c)),
                )
            })
            .collect();
        let locations = loaded.config.servers[0].locations.clone();
        Self {
            clock,
            upstreams,
            locations,
            modes: peers.iter().map(|p| (p.clone(), Mode::Ok)).collect(),
            labels,
        }
    }

    fn route(&self, path: &str) -> &Location {
        self.locations
            .iter()
            .filter(|l| match l.matcher {
                LocationMatch::Exact => l.path == path,
                _ => path.starts_with(&l.path),
            })
            .max_by_key(|l| (l.matcher == LocationMatch::Exact, l.path.len()))
            .expect("a location")
    }

    /// Play one request until it finishes or parks on a hanging peer (async).
    fn request(
        &self,
        id: &str,
        method: &str,
        path: &str,
        park: bool,
    ) -> Result<Outcome, Box<Pending>> {
        let loc = self.route(path);
        let pass = loc.proxy.pass.as_ref().expect("proxy_pass");
        let up = &self.upstreams[&pass.upstream];
        let facts = RequestFacts {
            non_idempotent: matches!(method, "POST" | "LOCK" | "PATCH"),
            body_replayable: true,
            hedgeable: matches!(method, "GET" | "HEAD" | "OPTIONS" | "TRACE"),
        };
        let mut sel = up.begin(
            SelectKey::None,
            RetryPolicy::of(&loc.proxy),
            facts,
            self.clock.now(),
        );
        let mut attempts = Vec::new();
        loop {
            let now = self.clock.now();
            let Ok(guard) = up.select(&mut sel, now) else {
                return Ok(Outcome {
                    status: 502,
                    complete: true,
                    attempts,
                });
            };
            let label = self.labels[&**guard.peer().name()].clone();
            let mode = self.modes[&label].clone();
            let fail = |class, sent| TransportFailure {
                class,
                request_sent: sent,
                cached_connection: false,
            };
            let (failure, status) = match mode {
                Mode::Ok | Mode::Delay(_) => (None, 200),
                Mode::Partial => (None, 200),
                Mode::Status(s) => (None, s),
                Mode::Close | Mode::Reset => (Some(fail(FailureClass::Error, true)), 0),
                Mode::BadHeader => (Some(fail(FailureClass::InvalidHeader, true)), 0),
                Mode::Down => (Some(fail(FailureClass::Error, false)), 0),
                Mode::Blackhole => {
                    self.clock.advance(loc.proxy.connect_timeout);
                    (Some(fail(FailureClass::Timeout, false)), 0)
                }
                Mode::Hang if park => {
                    attempts.push(label.clone());
                    return Err(Box::new(Pending {
                        id: id.to_string(),
                        peer: label,
                        sel,
                        guard,
                        attempts,
                    }));
                }
                Mode::Hang => {
                    self.clock.advance(loc.proxy.read_timeout);
                    (Some(fail(FailureClass::Timeout, true)), 0)
                }
            };
            if let Mode::Delay(ms) = mode {
                self.clock.advance(Duration::from_millis(ms));
            }
            let now = self.clock.now();
            match failure {
                Some(f) => {
                    attempts.push(if f.request_sent {
                        label
                    } else {
                        format!("{label}-")
                    });
                    match sel.on_failure(guard, f, now) {
                        FailureVerdict::Retry(_) => continue,
                        FailureVerdict::Fail { status, .. } => {
                            return Ok(Outcome {
                                status,
                                complete: true,
                                attempts,
                            })
                        }
                    }
                }
                None => {
                    attempts.push(label);
                    match sel.on_status(guard, status, now) {
                        StatusVerdict::Retry(_) => continue,
                        StatusVerdict::PassThrough(guard, _) => {
                            drop(guard);
                            return Ok(Outcome {
                                status,
                                complete: mode != Mode::Partial,
                                attempts,
                            });
                        }
                    }
                }
            }
        }
    }
}

fn mode_of(step: &Value) -> Mode {
    match step["mode"].as_str().expect("mode") {
        "ok" => Mode::Ok,
        "status" => Mode::Status(step["status"].as_u64().expect("status") as u16),
        "close" => Mode::Close,
        "reset" => Mode::Reset,
        "down" => Mode::Down,
        "blackhole" => Mode::Blackhole,
        "hang" => Mode::Hang,
        "partial" => Mode::Partial,
        "badheader" => Mode::BadHeader,
        "delay" => Mode::Delay(step["delay_ms"].as_u64().unwrap_or(0)),
        other => panic!("unknown mode {other}"),
    }
}

fn replay(file: &Path) -> Vec<String> {
    let g: Value =
        serde_json::from_str(&std::fs::read_to_string(file).expect("read")).expect("json");
    let mut sim = Sim::new(&g);
    let golden: HashMap<String, &Value> = g["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .map(|r| (r["id"].as_str().expect("id").to_string(), r))
        .collect();
    let mut got: HashMap<String, Outcome> = HashMap::new();
    let steps = g["steps"].as_array().expect("steps").clone();
    // Requests parked on a hanging peer borrow `sim`; mode changes happen
    // between them only for other peers, so collect modes first per phase.
    let mut i = 0;
    while i < steps.len() {
        let step = &steps[i];
        match step["op"].as_str().expect("op") {
            "mode" => {
                sim.modes.insert(
                    step["peer"].as_str().expect("peer").to_string(),
                    mode_of(step),
                );
                i += 1;
            }
            "sleep" => {
                sim.clock.advance(Duration::from_secs_f64(
                    step["s"].as_f64().expect("seconds"),
                ));
                i += 1;
            }
            "req" => {
                let id = step["id"].as_str().expect("id");
                let out = sim
                    .request(
                        id,
                        step["method"].as_str().unwrap_or("GET"),
                        step["path"].as_str().expect("path"),
                        false,
                    )
                    .unwrap_or_else(|_| panic!("{id} parked"));
                got.insert(id.to_string(), out);
                i += 1;
            }
            "req_async" => {
                // Play the async request and everything up to its `wait`
                // while it is parked, then release it.
                let mut pending: Vec<Pending> = Vec::new();
                let mut j = i;
                let mut modes_after: Vec<(String, Mode)> = Vec::new();
                while j < steps.len() {
                    let s = &steps[j];
                    match s["op"].as_str().expect("op") {
                        "req_async" => {
                            let id = s["id"].as_str().expect("id");
                            match sim.request(
                                id,
                                s["method"].as_str().unwrap_or("GET"),
                                s["path"].as_str().expect("path"),
                                true,
                            ) {
                                Ok(out) => {
                                    got.insert(id.to_string(), out);
                                }
                                Err(p) => pending.push(*p),
                            }
                        }
                        "req" => {
                            let id = s["id"].as_str().expect("id");
                            let out = sim
                                .request(
                                    id,
                                    s["method"].as_str().unwrap_or("GET"),
                                    s["path"].as_str().expect("path"),
                                    false,
                                )
                                .unwrap_or_else(|_| panic!("{id} parked"));
                            got.insert(id.to_string(), out);
                        }
                        "wait_seen" => {}
                        "release" => {
                            let peer = s["peer"].as_str().expect("peer");
                            let status = s["status"].as_u64().unwrap_or(200) as u16;
                            let now = sim.clock.now();
                            let (done, rest): (Vec<_>, Vec<_>) =
                                pending.into_iter().partition(|p| p.peer == peer);
                            pending = rest;
                            for mut p in done {
                                let st = match p.sel.on_status(p.guard, status, now) {
                                    StatusVerdict::PassThrough(g, _) => {
                                        drop(g);
                                        status
                                    }
                                    StatusVerdict::Retry(_) => {
                                        panic!("{}: retry after release not modelled", p.id)
                                    }
                                };
                                got.insert(
                                    p.id.clone(),
                                    Outcome {
                                        status: st,
                                        complete: true,
                                        attempts: std::mem::take(&mut p.attempts),
                                    },
                                );
                            }
                        }
                        "wait" => {
                            if pending.is_empty() {
                                j += 1;
                                break;
                            }
                        }
                        "mode" => {
                            // A mode change while requests are parked applies to later requests.
                            modes_after
                                .push((s["peer"].as_str().expect("peer").to_string(), mode_of(s)));
                            break;
                        }
                        other => panic!("unexpected step {other} inside an async block"),
                    }
                    j += 1;
                }
                assert!(pending.is_empty(), "requests still parked at step {j}");
                drop(pending);
                for (p, m) in modes_after {
                    sim.modes.insert(p, m);
                    j += 1;
                }
                i = j;
            }
            "wait" | "wait_seen" => i += 1,
            other => panic!("unknown step {other}"),
        }
    }
    let mut diffs = Vec::new();
    let mut ids: Vec<_> = golden.keys().cloned().collect();
    ids.sort_by_key(|id| {
        id.trim_start_matches(|c: char| c.is_alphabetic())
            .parse::<u32>()
            .unwrap_or(0)
    });
    for id in ids {
        let want = golden[&id];
        let Some(o) = got.get(&id) else {
            diffs.push(format!("{id}: not played"));
            continue;
        };
        let want_attempts: Vec<String> = want["attempts_full"]
            .as_array()
            .or(want["attempts"].as_array())
            .expect("attempts")
            .iter()
            .map(|v| v.as_str().expect("label").to_string())
            .collect();
        let want_status = want["status"].as_u64().unwrap_or(0) as u16;
        let want_complete = want["complete"].as_bool().unwrap_or(true);
        if o.status != want_status || o.attempts != want_attempts || o.complete != want_complete {
            diffs.push(format!(
                "{id}: vigil {} {:?} complete={}, nginx {} {:?} complete={}",
                o.status, o.attempts, o.complete, want_status, want_attempts, want_complete
            ));
        }
    }
    diffs
}

#[test]
fn every_recorded_scenario_matches_nginx() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("conformance dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 13, "expected the 13 recorded scenarios");
    let mut failures = Vec::new();
    for f in &files {
        for d in replay(f) {
            failures.push(format!(
                "{}: {d}",
                f.file_name().unwrap_or_default().to_string_lossy()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
