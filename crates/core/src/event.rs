//! Every state transition is an [`Event`] with its cause and time,
//! published on a bounded in-process [`EventBus`].
//!
//! The bus is a ring of the most recent events with sequence numbers:
//! readers ask for everything after the last sequence they saw and are told
//! how many they missed if they fell behind (like tokio's broadcast, without
//! needing a runtime in core). Listeners registered with
//! [`EventBus::subscribe`] are called synchronously on publish, so logging
//! and metrics see every event.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::outcome::FailureClass;

/// How a server is written in a file rendered for nginx (`vigil check`):
/// carried by render events and by the API's `NginxView`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NginxGiven {
    /// As in the source (up, or `down` there).
    AsWritten,
    /// Marked ` down`: nginx sends it nothing.
    Down,
    /// Ejected by core's rules but kept up by `max_ejected` (`--min-healthy`):
    /// nginx sends it traffic.
    Kept,
}

/// One transition of one peer.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Position on the bus (1-based, gapless).
    pub seq: u64,
    /// When, on the monotonic timeline.
    pub at: Timestamp,
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The upstream.
    pub upstream: Arc<str>,
    /// The peer's address as configured.
    pub peer: Arc<str>,
    /// What happened.
    pub kind: EventKind,
}

/// What happened to a peer, with its cause.
#[derive(Clone, Debug, PartialEq)]
pub enum EventKind {
    /// Passive: `fails` reached `max_fails`; no traffic until `until`.
    /// Under `passive_recovery probe` the checker probes the peer at
    /// `until` ([`crate::upstream::Upstream::probes_wanted`] lists them too).
    Excluded {
        /// The failure that tipped it.
        cause: FailureClass,
        /// Failures counted.
        fails: u32,
        /// The threshold.
        max_fails: u32,
        /// End of the exclusion (`checked + fail_timeout`, or the
        /// `passive_penalty` length).
        until: Timestamp,
        /// `passive_penalty`: the nth exclusion in a row (0: no penalty set).
        nth: u32,
    },
    /// Passive: the quiet period ended and one request was sent to test the peer.
    TrialRequest,
    /// Passive: a success after the quiet period forgave the failures.
    Readmitted {
        /// Failures forgiven.
        fails: u32,
    },
    /// `passive_recovery probation=N`: the exclusion ended; the peer takes
    /// one request at a time until `needed` succeed in a row.
    ProbationStarted {
        /// Successes in a row needed.
        needed: u32,
    },
    /// `passive_recovery probation=N`: enough successes in a row; back in
    /// full rotation, the failures forgiven.
    ProbationPassed {
        /// Successes in a row.
        successes: u32,
        /// Failures forgiven.
        fails: u32,
    },
    /// `passive_recovery probe`: a probe passed after the exclusion ended;
    /// back in rotation, the failures forgiven.
    ProbeReadmitted {
        /// Failures forgiven.
        fails: u32,
    },
    /// `slow_start`: after a readmission the weight ramps up.
    SlowStart {
        /// The weight now.
        from: u32,
        /// The configured weight, reached at `until`.
        weight: u32,
        /// The end of the ramp.
        until: Timestamp,
    },
    /// `max_ejected`: this peer starts (`kept`) or stops being kept
    /// eligible although a health rule ejects it.
    MaxEjected {
        /// Kept eligible from now (false: no longer).
        kept: bool,
        /// Primaries in service a health rule ejects.
        ejected: u32,
        /// How many may be ejected.
        allowed: u32,
    },
    /// `eject_slow`: its median time-to-header over the window was above
    /// K × the median of the other peers'; out until `until`, then back
    /// through `passive_recovery`.
    SlowEjected {
        /// Its figure, µs.
        figure_us: u64,
        /// The other peers' median, µs (0 when none had a figure).
        median_us: u64,
        /// `max=`, µs, when that bound alone made it slow.
        max_us: Option<u64>,
        /// Headers its figure was taken over.
        requests: u64,
        /// End of the exclusion (`passive_penalty` length or `fail_timeout`).
        until: Timestamp,
        /// `passive_penalty`: the nth exclusion in a row (0: no penalty set).
        nth: u32,
    },
    /// `eject_stuck`: its oldest attempt waiting for a header passed the
    /// threshold; no new requests until that attempt ends.
    Stuck {
        /// How long that attempt had waited when a pick saw it.
        waited_ms: u64,
        /// The threshold then.
        threshold_ms: u64,
    },
    /// `eject_stuck`: the attempt that made it stuck ended.
    StuckEnded {
        /// How long it waited in all.
        waited_ms: u64,
        /// `its header came`, `it failed` or `it was cancelled`.
        how: &'static str,
    },
    /// Active: probes say the peer is up.
    ProbeUp {
        /// Consecutive passes that made it so.
        streak: u32,
        /// What the last probe saw.
        detail: String,
    },
    /// Active: probes say the peer is down.
    ProbeDown {
        /// Consecutive failures that made it so.
        streak: u32,
        /// Why the last probe failed (phase and reason).
        detail: String,
    },
    /// Admin state changed through the API.
    Admin {
        /// Old state.
        from: crate::peer::AdminState,
        /// New state.
        to: crate::peer::AdminState,
    },
    /// `vigil check`: a rendered file changed and passed the test command
    /// (`nginx -t`). `peer` is the server whose line changed; empty, the
    /// file as a whole changed (created, removed, the source's directives).
    Render {
        /// The file (`NAME.conf` in the render directory).
        file: String,
        /// How the server is written now (None: the whole file).
        given: Option<NginxGiven>,
        /// Why: the comment vigil wrote on the line (the cause), or what
        /// happened to the file.
        note: String,
        /// When nginx gets it.
        timing: Timing,
    },
    /// `vigil check`: nginx reloaded and its new workers run the rendered
    /// files (`upstream` and `peer` empty: nginx as a whole).
    Reload {
        /// The files changed since the previous reload.
        files: Vec<String>,
        /// From the reload command to nginx's new workers seen (and the
        /// old ones no longer accepting).
        took_ms: u64,
        /// Why it ran when it did.
        timing: Timing,
    },
    /// `vigil check`: the reload failed or was not seen to take effect;
    /// nginx runs the files of the reload before. Retried.
    ReloadFailed {
        /// The files nginx does not run yet.
        files: Vec<String>,
        /// What went wrong.
        error: String,
        /// The next try, in milliseconds.
        retry_ms: u64,
    },
    /// `vigil check`: the test command rejected a render; the previous
    /// files were put back and nginx was not reloaded.
    Rollback {
        /// The files restored.
        files: Vec<String>,
        /// The test command's message.
        error: String,
    },
    /// Fleet mode: this member joined the fleet, fell back to probing
    /// every target itself (etcd unreachable or slow), or left it
    /// (`upstream` and `peer` empty: the instance as a whole).
    Fleet {
        /// `joined`, `degraded` or `left`.
        state: &'static str,
        /// What happened (the member count, or etcd's error).
        detail: String,
    },
    /// `server NAME resolve`: the set of addresses of NAME changed (`peer`
    /// is the written NAME); the upstream's peers were rebuilt, those of
    /// the addresses that stay keeping their state.
    Resolved {
        /// Addresses new in the answer.
        added: Vec<String>,
        /// Addresses no longer in it.
        removed: Vec<String>,
        /// The addresses in force now.
        now: Vec<String>,
    },
    /// Fleet `share_passive`: another member ejected this peer (which has
    /// no active check here) on its own traffic; its weight here is
    /// halved (`max(1, weight/2)`) until `until`.
    WeightHalved {
        /// The weight before.
        from: u32,
        /// The weight until `until`.
        to: u32,
        /// The end of the halving.
        until: Timestamp,
        /// Its length from now, in milliseconds.
        for_ms: u64,
        /// The member that ejected it.
        by: String,
    },
    /// Fleet `share_passive`: the halving ended; the weight is whole again.
    WeightRestored {
        /// The weight again.
        weight: u32,
        /// The member whose ejection halved it.
        by: String,
    },
}

/// `vigil check`: when a render reaches nginx.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// At startup.
    Startup,
    /// At once: a server leaves nginx (only a short least time between
    /// reloads applies).
    AtOnce,
    /// After the debounce and the least time between reloads (servers
    /// coming back, bursts, other changes).
    Debounced,
    /// A retry of a failed reload.
    Retry,
}

type Listener = Box<dyn Fn(&Event) + Send + Sync>;

/// A bounded, multi-reader event log.
pub struct EventBus {
    ring: Mutex<VecDeque<Event>>,
    capacity: usize,
    next_seq: AtomicU64,
    listeners: RwLock<Vec<Listener>>,
}

/// Events read from the bus after a sequence number.
#[derive(Clone, Debug, PartialEq)]
pub struct Since {
    /// The events, oldest first.
    pub events: Vec<Event>,
    /// How many events after the requested sequence had already left the ring.
    pub missed: u64,
    /// The sequence to ask from next time.
    pub next: u64,
}

// === impl EventKind ===

impl EventKind {
    /// A short name for the kind (`excluded`, `probe_down`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Excluded { .. } => "excluded",
            EventKind::TrialRequest => "trial_request",
            EventKind::Readmitted { .. } => "readmitted",
            EventKind::ProbationStarted { .. } => "probation_started",
            EventKind::ProbationPassed { .. } => "probation_passed",
            EventKind::ProbeReadmitted { .. } => "probe_readmitted",
            EventKind::SlowStart { .. } => "slow_start",
            EventKind::MaxEjected { .. } => "max_ejected",
            EventKind::SlowEjected { .. } => "slow_ejected",
            EventKind::Stuck { .. } => "stuck",
            EventKind::StuckEnded { .. } => "stuck_ended",
            EventKind::ProbeUp { .. } => "probe_up",
            EventKind::ProbeDown { .. } => "probe_down",
            EventKind::Admin { .. } => "admin",
            EventKind::Render { .. } => "render",
            EventKind::Reload { .. } => "reload",
            EventKind::ReloadFailed { .. } => "reload_failed",
            EventKind::Rollback { .. } => "rollback",
            EventKind::Fleet { .. } => "fleet",
            EventKind::WeightHalved { .. } => "weight_halved",
            EventKind::WeightRestored { .. } => "weight_restored",
            EventKind::Resolved { .. } => "resolved",
        }
    }

    /// Whether the event reports trouble (logged at WARN): an exclusion, a
    /// probe down, `max_ejected` keeping a failing peer, a failed reload, a
    /// rejected render. Good news (a peer back up, readmitted) and routine
    /// steps are INFO.
    pub fn is_warning(&self) -> bool {
        matches!(
            self,
            EventKind::Excluded { .. }
                | EventKind::ProbeDown { .. }
                | EventKind::MaxEjected { kept: true, .. }
                | EventKind::ReloadFailed { .. }
                | EventKind::Rollback { .. }
                | EventKind::Fleet {
                    state: "degraded",
                    ..
                }
                | EventKind::WeightHalved { .. }
        )
    }
}

// === impl Timing ===

impl fmt::Display for Timing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Timing::Startup => "at startup",
            Timing::AtOnce => "at once (a server leaves nginx)",
            Timing::Debounced => "after the debounce",
            Timing::Retry => "retried",
        })
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventKind::Excluded {
                cause,
                fails,
                max_fails,
                nth,
                ..
            } => {
                write!(
                    f,
                    "excluded: {fails} failure(s) reached max_fails={max_fails} (last: {cause})"
                )?;
                if *nth > 0 {
                    write!(f, "; exclusion {nth} in a row (passive_penalty)")?;
                }
                Ok(())
            }
            EventKind::TrialRequest => f.write_str("quiet period over: one request tests the peer"),
            EventKind::Readmitted { fails } => {
                write!(
                    f,
                    "readmitted: a success after the quiet period forgave {fails} failure(s)"
                )
            }
            EventKind::ProbationStarted { needed } => write!(
                f,
                "exclusion over: probation, one request at a time until {needed} succeed in a row"
            ),
            EventKind::ProbationPassed { successes, fails } => write!(
                f,
                "readmitted: {successes} success(es) in a row on probation forgave {fails} failure(s)"
            ),
            EventKind::ProbeReadmitted { fails } => write!(
                f,
                "readmitted: a probe passed after the exclusion and forgave {fails} failure(s)"
            ),
            EventKind::SlowStart { from, weight, .. } => {
                write!(f, "slow start: weight ramps from {from} to {weight}")
            }
            EventKind::MaxEjected {
                kept: true,
                ejected,
                allowed,
            } => write!(
                f,
                "max_ejected: {ejected} primaries would be ejected, at most {allowed} may be: kept eligible (best recent record)"
            ),
            EventKind::MaxEjected {
                kept: false,
                ejected,
                allowed,
            } => write!(
                f,
                "max_ejected no longer keeps it eligible ({ejected} ejected, {allowed} allowed)"
            ),
            EventKind::SlowEjected {
                figure_us,
                median_us,
                max_us,
                requests,
                nth,
                ..
            } => {
                match max_us {
                    Some(max) => write!(
                        f,
                        "slow: median time-to-header {} over {requests} request(s), above eject_slow max={}",
                        micros(*figure_us),
                        micros(*max)
                    )?,
                    None => write!(
                        f,
                        "slow: median time-to-header {} over {requests} request(s), the other peers' median {} (eject_slow)",
                        micros(*figure_us),
                        micros(*median_us)
                    )?,
                }
                if *nth > 0 {
                    write!(f, "; exclusion {nth} in a row (passive_penalty)")?;
                }
                Ok(())
            }
            EventKind::Stuck {
                waited_ms,
                threshold_ms,
            } => write!(
                f,
                "stuck: an attempt has waited {waited_ms} ms for its header, over the {threshold_ms} ms threshold (eject_stuck): no new requests until it ends"
            ),
            EventKind::StuckEnded { waited_ms, how } => write!(
                f,
                "no longer stuck: the attempt ended after {waited_ms} ms ({how})"
            ),
            EventKind::ProbeUp { streak, detail } => {
                write!(f, "probe up after {streak} pass(es): {detail}")
            }
            EventKind::ProbeDown { streak, detail } => {
                write!(f, "probe down after {streak} failure(s): {detail}")
            }
            EventKind::Admin { from, to } => write!(f, "admin state {from} -> {to}"),
            EventKind::Render {
                file,
                given,
                note,
                timing,
            } => {
                let what = match given {
                    Some(NginxGiven::Down) => format!("marked `down` ({note})"),
                    Some(NginxGiven::Kept) => format!("left up although failing ({note})"),
                    Some(NginxGiven::AsWritten) if note.is_empty() => "as written".to_string(),
                    Some(NginxGiven::AsWritten) => format!("as written ({note})"),
                    None => note.clone(),
                };
                write!(f, "{file}: {what}; nginx reloads {timing}")
            }
            EventKind::Reload {
                files,
                took_ms,
                timing,
            } => {
                write!(
                    f,
                    "nginx reloaded {timing}: new workers in {took_ms} ms"
                )?;
                if !files.is_empty() {
                    write!(f, ", running {}", files.join(", "))?;
                }
                Ok(())
            }
            EventKind::ReloadFailed {
                files,
                error,
                retry_ms,
            } => {
                f.write_str("nginx reload failed")?;
                if !files.is_empty() {
                    write!(f, " (nginx does not run {} yet)", files.join(", "))?;
                }
                write!(f, ": {error}; retry in {retry_ms} ms")
            }
            EventKind::Fleet { state, detail } => write!(f, "fleet: {state} ({detail})"),
            EventKind::Resolved {
                added,
                removed,
                now,
            } => write!(
                f,
                "name re-resolved: added [{}], removed [{}], now [{}]",
                added.join(", "),
                removed.join(", "),
                now.join(", ")
            ),
            EventKind::WeightHalved {
                from, to, for_ms, by, ..
            } => write!(
                f,
                "weight halved by fleet member {by}: {from} → {to} for {for_ms} ms (member {by} ejected it on its traffic; no active check here to probe it)"
            ),
            EventKind::WeightRestored { weight, by } => write!(
                f,
                "weight restored to {weight} (the halving after fleet member {by}'s ejection ended)"
            ),
            EventKind::Rollback { files, error } => write!(
                f,
                "nginx -t rejected {}; previous files restored, no reload: {error}",
                if files.is_empty() {
                    "the render".to_string()
                } else {
                    files.join(", ")
                }
            ),
        }
    }
}

/// A µs figure for people: `1.23 ms` or `250 µs`.
fn micros(us: u64) -> String {
    crate::clock::human_us(us)
}

// === impl EventBus ===

impl EventBus {
    /// Default number of events kept.
    pub const DEFAULT_CAPACITY: usize = 4096;

    /// A bus keeping the last `capacity` events (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            ring: Mutex::new(VecDeque::with_capacity(capacity.clamp(1, 1 << 16))),
            capacity: capacity.max(1),
            next_seq: AtomicU64::new(1),
            listeners: RwLock::new(Vec::new()),
        }
    }

    /// Call `f` for every event published from now on.
    pub fn subscribe(&self, f: impl Fn(&Event) + Send + Sync + 'static) {
        if let Ok(mut l) = self.listeners.write() {
            l.push(Box::new(f));
        }
    }

    /// Publish an event (its `seq` is assigned here).
    pub fn publish(&self, mut event: Event) {
        {
            let Ok(mut ring) = self.ring.lock() else {
                return;
            };
            event.seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
            if ring.len() == self.capacity {
                ring.pop_front();
            }
            ring.push_back(event.clone());
        }
        if let Ok(listeners) = self.listeners.read() {
            for l in listeners.iter() {
                l(&event);
            }
        }
    }

    /// The sequence the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed)
    }

    /// Events with `seq > after`, at most `limit`.
    pub fn since(&self, after: u64, limit: usize) -> Since {
        let Ok(ring) = self.ring.lock() else {
            return Since {
                events: Vec::new(),
                missed: 0,
                next: after,
            };
        };
        let oldest = ring.front().map_or(self.next_seq(), |e| e.seq);
        let missed = oldest.saturating_sub(after + 1);
        let events: Vec<Event> = ring
            .iter()
            .filter(|e| e.seq > after)
            .take(limit)
            .cloned()
            .collect();
        let next = events
            .last()
            .map_or(after.max(oldest.saturating_sub(1)), |e| e.seq);
        Since {
            events,
            missed,
            next,
        }
    }
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new(Self::DEFAULT_CAPACITY)
    }
}

impl fmt::Debug for EventBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventBus")
            .field("capacity", &self.capacity)
            .field("next_seq", &self.next_seq())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(n: u64) -> Event {
        Event {
            seq: 0,
            at: Timestamp(n),
            unix_ms: n,
            upstream: "u".into(),
            peer: "p".into(),
            kind: EventKind::TrialRequest,
        }
    }

    #[test]
    fn ring_is_bounded_and_reports_missed() {
        let bus = EventBus::new(3);
        for n in 0..5 {
            bus.publish(ev(n));
        }
        let s = bus.since(0, 100);
        assert_eq!(
            s.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![3, 4, 5]
        );
        assert_eq!(s.missed, 2);
        assert_eq!(s.next, 5);
        let s = bus.since(4, 100);
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.missed, 0);
        assert!(bus.since(5, 100).events.is_empty());
    }

    #[test]
    fn good_news_is_no_warning() {
        let up = EventKind::ProbeUp {
            streak: 2,
            detail: "200".into(),
        };
        let down = EventKind::ProbeDown {
            streak: 2,
            detail: "refused".into(),
        };
        assert!(!up.is_warning());
        assert!(!EventKind::Readmitted { fails: 1 }.is_warning());
        assert!(!EventKind::ProbeReadmitted { fails: 1 }.is_warning());
        assert!(down.is_warning());
        let failed = EventKind::ReloadFailed {
            files: vec!["app.conf".into()],
            error: "no new worker".into(),
            retry_ms: 2000,
        };
        assert!(failed.is_warning());
        assert_eq!(failed.name(), "reload_failed");
        assert_eq!(
            failed.to_string(),
            "nginx reload failed (nginx does not run app.conf yet): no new worker; retry in 2000 ms"
        );
        let render = EventKind::Render {
            file: "app.conf".into(),
            given: Some(NginxGiven::Down),
            note: "down by active check".into(),
            timing: Timing::AtOnce,
        };
        assert!(!render.is_warning());
        assert_eq!(
            render.to_string(),
            "app.conf: marked `down` (down by active check); nginx reloads at once (a server leaves nginx)"
        );
        let reload = EventKind::Reload {
            files: vec!["app.conf".into()],
            took_ms: 80,
            timing: Timing::Debounced,
        };
        assert_eq!(
            reload.to_string(),
            "nginx reloaded after the debounce: new workers in 80 ms, running app.conf"
        );
    }

    #[test]
    fn listeners_see_every_event() {
        let bus = EventBus::new(1);
        let seen = Arc::new(AtomicU64::new(0));
        let s2 = seen.clone();
        bus.subscribe(move |_| {
            s2.fetch_add(1, Ordering::Relaxed);
        });
        for n in 0..10 {
            bus.publish(ev(n));
        }
        assert_eq!(seen.load(Ordering::Relaxed), 10);
    }
}
