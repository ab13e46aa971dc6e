//! What one attempt's result does to a peer's passive record: nginx's
//! `ngx_http_upstream_free_round_robin_peer` and the pick's `checked` move,
//! plus vigil's `passive_penalty` (exclusions that grow) and
//! `passive_recovery` (how an excluded peer comes back), and the one
//! readmission entry point every return to rotation goes through (which
//! starts the `slow_start` ramp).
//!
//! The caller holds the tier's lock and publishes the events afterwards.

use crate::clock::Timestamp;
use crate::config::{HealthRules, Penalty, Recovery};
use crate::event::EventKind;
use crate::outcome::FailureClass;
use crate::peer::Peer;

use super::super::slot::Slot;
use super::{over_max_fails, ramp, window_ms, window_over};

type Events = Vec<(u32, EventKind)>;

/// Why a peer comes back into rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Readmission {
    /// A passive exclusion ended (nginx's trial success, a recovery probe,
    /// or probation passed): the rule state is cleared too.
    Passive,
    /// Active checks say up again.
    ProbeUp,
    /// An operator set it up.
    AdminUp,
}

/// After a pick: nginx's `if (now - best->checked > best->fail_timeout)
/// best->checked = now;` A peer past its exclusion gets its one trial
/// request here (`passive_recovery window`); under `probation` the
/// exclusion does not restart (one request at a time is the limit), and
/// under `probe` only a probe readmits, so `checked` stays.
#[inline(always)]
pub(crate) fn picked(
    rules: &HealthRules,
    peer: &Peer,
    s: &mut Slot,
    global: usize,
    now: Timestamp,
    events: &mut Events,
) {
    // At most once per window per peer: the rest is out of line.
    if window_over(peer, s, now) {
        Record {
            rules,
            peer,
            s,
            global,
            events,
        }
        .window_passed(now);
    }
}

/// One peer's passive record under the tier's lock, with the rules in
/// force and the events its changes cause.
pub(crate) struct Record<'a> {
    pub(crate) rules: &'a HealthRules,
    pub(crate) peer: &'a Peer,
    pub(crate) s: &'a mut Slot,
    /// The peer's index in the upstream (for the events).
    pub(crate) global: usize,
    pub(crate) events: &'a mut Events,
}

// === impl Record ===

impl Record<'_> {
    fn event(&mut self, kind: EventKind) {
        self.events.push((self.global as u32, kind));
    }

    /// A failure charged toward `max_fails` (`NGX_PEER_FAILED`). Returns
    /// whether the peer is now excluded. `jitter` draws the random part of
    /// a `passive_penalty`.
    pub(crate) fn fail(
        &mut self,
        cause: FailureClass,
        now: Timestamp,
        jitter: impl FnOnce() -> u64,
    ) -> bool {
        let (peer, cfg) = (self.peer, self.peer.config());
        // A failure while an exclusion runs (not its trial request)
        // continues it; any other failure that reaches max_fails starts a
        // new one.
        let was_over = over_max_fails(peer, self.s);
        let continuing = was_over && !window_over(peer, self.s, now) && !self.s.trial;
        let s = &mut *self.s;
        s.fails = s.fails.saturating_add(1);
        if super::failed_out(peer, s) {
            // Failures now keep it out, whatever a slow ejection said.
            s.slow = false;
        }
        s.accessed = now;
        s.checked = now;
        let mut excluded = false;
        if let Some(cut) = cfg.weight.get().checked_div(cfg.max_fails) {
            s.effective -= i64::from(cut);
            if over_max_fails(peer, s) {
                excluded = true;
                if let (Some(p), false) = (&self.rules.penalty, continuing) {
                    penalize(p, s, was_over, now, jitter());
                }
                s.trial = false;
                s.probation_ok = 0;
                let kind = EventKind::Excluded {
                    cause,
                    fails: s.fails,
                    max_fails: cfg.max_fails,
                    until: Timestamp(now.0.saturating_add(window_ms(peer, s))),
                    nth: u32::from(s.nth),
                };
                self.event(kind);
            }
        }
        self.s.effective = self.s.effective.max(0);
        excluded
    }

    /// A success, or a status that moves on without counting
    /// (`NGX_PEER_NEXT`). `started` is when the attempt was picked; `now`
    /// gives the time when a rule needs it (a guard dropped after
    /// streaming passes no time).
    pub(crate) fn succeed(&mut self, started: Timestamp, now: impl Fn() -> Timestamp) {
        let over = over_max_fails(self.peer, self.s);
        match (over, self.rules.recovery) {
            (true, Recovery::Probation(needed)) => {
                // Only attempts picked after the exclusion ended count.
                if started.millis_since(self.s.checked) > window_ms(self.peer, self.s) {
                    self.s.probation_ok = self.s.probation_ok.saturating_add(1);
                    if u32::from(self.s.probation_ok) >= needed.get() {
                        let kind = EventKind::ProbationPassed {
                            successes: u32::from(self.s.probation_ok),
                            fails: self.s.fails,
                        };
                        self.event(kind);
                        self.s.fails = 0;
                        self.readmit(now(), Readmission::Passive);
                    }
                }
            }
            // Only a passing probe brings the peer back.
            (true, Recovery::Probe) => {}
            _ => {
                // nginx: `if (peer->accessed < peer->checked) peer->fails = 0;`
                if self.s.accessed < self.s.checked {
                    let forgiven = std::mem::take(&mut self.s.fails);
                    if over {
                        self.event(EventKind::Readmitted { fails: forgiven });
                        self.readmit(now(), Readmission::Passive);
                    }
                }
            }
        }
    }

    /// `eject_slow`: the peer's figure (`figure_us`, over `requests`
    /// headers) is above the rule's bar against the others' median
    /// (`median_us`): a passive exclusion of its own cause, as long as
    /// `passive_penalty` says (its nth in a row) or `fail_timeout`, then
    /// back through `passive_recovery`. The caller forgets the figure.
    pub(crate) fn slow(
        &mut self,
        figure_us: u64,
        median_us: u64,
        by_max: bool,
        requests: u64,
        now: Timestamp,
        jitter: impl FnOnce() -> u64,
    ) {
        let was_over = over_max_fails(self.peer, self.s);
        let s = &mut *self.s;
        s.slow = true;
        s.slow_figure_us = u32::try_from(figure_us).unwrap_or(u32::MAX);
        s.slow_median_us = u32::try_from(median_us).unwrap_or(u32::MAX);
        s.slow_by_max = by_max;
        s.accessed = now;
        s.checked = now;
        s.trial = false;
        s.probation_ok = 0;
        if let Some(p) = &self.rules.penalty {
            penalize(p, s, was_over, now, jitter());
        }
        let max = self.rules.eject_slow.and_then(|r| r.max);
        let kind = EventKind::SlowEjected {
            figure_us,
            median_us,
            max_us: max.filter(|_| by_max).map(crate::clock::duration_us),
            requests,
            until: Timestamp(now.0.saturating_add(window_ms(self.peer, self.s))),
            nth: u32::from(self.s.nth),
        };
        self.event(kind);
    }

    /// [`picked`] once the window has passed.
    #[cold]
    fn window_passed(&mut self, now: Timestamp) {
        if !over_max_fails(self.peer, self.s) {
            self.s.checked = now;
            return;
        }
        match self.rules.recovery {
            Recovery::Window => {
                self.event(EventKind::TrialRequest);
                self.s.trial = true;
                self.s.checked = now;
            }
            Recovery::Probation(needed) => {
                if self.s.probation_ok == 0 {
                    self.event(EventKind::ProbationStarted {
                        needed: needed.get(),
                    });
                }
            }
            Recovery::Probe => {}
        }
    }

    /// A probe passed at `at`. Under `passive_recovery probe`, a peer whose
    /// exclusion has ended (at or after its end) is readmitted.
    pub(crate) fn probe_passed(&mut self, single: bool, at: Timestamp) {
        if self.rules.recovery != Recovery::Probe || single || !over_max_fails(self.peer, self.s) {
            return;
        }
        if at.millis_since(self.s.checked) < window_ms(self.peer, self.s) {
            return;
        }
        let fails = std::mem::take(&mut self.s.fails);
        self.event(EventKind::ProbeReadmitted { fails });
        self.readmit(at, Readmission::Passive);
    }

    /// The one entry point for a peer coming back into rotation: clears
    /// the passive rule state after an exclusion and starts the
    /// `slow_start` ramp.
    pub(crate) fn readmit(&mut self, now: Timestamp, why: Readmission) {
        if why == Readmission::Passive {
            self.s.slow = false;
            self.s.trial = false;
            self.s.probation_ok = 0;
            self.s.clean_since = now;
        }
        if let Some(until) = ramp::start(self.peer, now) {
            let weight = self.peer.config().weight.get();
            self.event(EventKind::SlowStart {
                from: (weight / 10).max(1),
                weight,
                until,
            });
        }
    }
}

/// Start the next exclusion of a `passive_penalty`: the k-th in a row lasts
/// `min(base × 2^(k−1), max)`, ± jitter. A peer never readmitted since its
/// last exclusion (`was_over`: its trial, probation or kept request failed)
/// is in a row whatever the time; a readmitted one starts again at k = 1
/// once it has been clean (readmitted) for as long as `max`.
fn penalize(p: &Penalty, s: &mut Slot, was_over: bool, now: Timestamp, random: u64) {
    let max = crate::clock::duration_ms(p.max);
    let clean = s.nth == 0 || (!was_over && now.millis_since(s.clean_since) >= max);
    s.nth = if clean { 1 } else { s.nth.saturating_add(1) };
    s.pause_ms = pause_ms(p, s.nth, random);
}

/// The length of the `nth` exclusion in a row, in ms (at least 1).
pub(crate) fn pause_ms(p: &Penalty, nth: u8, random: u64) -> u32 {
    let base = crate::clock::duration_ms(p.base);
    let max = crate::clock::duration_ms(p.max);
    let shift = u32::from(nth.saturating_sub(1)).min(63);
    let grown = base.checked_shl(shift).filter(|g| g >> shift == base);
    let d = grown.map_or(max, |g| g.min(max));
    let span = d / 100 * u64::from(p.jitter_percent) + d % 100 * u64::from(p.jitter_percent) / 100;
    let d = if span == 0 {
        d
    } else {
        // Uniform in [d − span, d + span].
        let r = random % (2 * span + 1);
        (d - span).saturating_add(r)
    };
    u32::try_from(d.max(1)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn penalty(base: u64, max: u64, jitter: u8) -> Penalty {
        Penalty {
            base: Duration::from_secs(base),
            max: Duration::from_secs(max),
            jitter_percent: jitter,
        }
    }

    #[test]
    fn exclusions_double_up_to_the_cap() {
        let p = penalty(10, 60, 0);
        let got: Vec<u32> = (1..=6).map(|k| pause_ms(&p, k, 0)).collect();
        assert_eq!(got, vec![10_000, 20_000, 40_000, 60_000, 60_000, 60_000]);
        assert_eq!(pause_ms(&p, u8::MAX, 0), 60_000, "no overflow far along");
    }

    #[test]
    fn jitter_stays_within_its_percentage_and_covers_it() {
        let p = penalty(10, 60, 20);
        let got: Vec<u32> = (0..2000u64)
            .map(|r| pause_ms(&p, 1, r.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect();
        assert!(got.iter().all(|d| (8_000..=12_000).contains(d)), "{got:?}");
        assert!(got.iter().any(|d| *d < 8_500) && got.iter().any(|d| *d > 11_500));
    }
}
