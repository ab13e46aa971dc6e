//! The balancing methods' per-request walks, each as its nginx 1.22
//! function does it (the source function is named on each).

use crate::balancer::{hash_step, ip_hash_step, Method};
use crate::clock::Timestamp;
use crate::event::EventKind;

use super::policy::passive;
use super::policy::{self, Gate};
use super::tier::{Tier, TierState};
use super::{KeyState, Selection, Upstream};

type Events = Vec<(u32, EventKind)>;

/// Hash-based methods give up and fall back to round robin after this many misses.
const HASH_TRIES: u32 = 20;

/// Pick from the primary tier with the upstream's method.
#[inline]
pub(super) fn primary(
    up: &Upstream,
    sel: &mut Selection,
    now: Timestamp,
    ev: &mut Events,
) -> Option<usize> {
    let tier = &up.primary;
    match &up.method {
        Method::RoundRobin | Method::LeastConn => self::tier(up, tier, sel, now, ev),
        Method::Hash(cum) => {
            let KeyState::Hash {
                key,
                hash,
                rehash,
                tries,
            } = &mut sel.key
            else {
                return round_robin(up, tier, sel, now, ev);
            };
            if *tries > HASH_TRIES || tier.single || cum.total() == 0 {
                return round_robin(up, tier, sel, now, ev);
            }
            let mut slots = tier.lock();
            let gate = tier.gate(up, &mut slots, now, ev);
            // ngx_http_upstream_get_hash_peer
            loop {
                *hash = hash.wrapping_add(hash_step(key, *rehash));
                *rehash += 1;
                let p = cum.find(*hash % cum.total());
                let global = tier.offset + p;
                if !sel.tried.contains(p) && gate.eligible(&up.peers[global], p, &slots[p]) {
                    return Some(take(up, &gate, tier, &mut slots, &mut sel.tried, p, ev));
                }
                *tries += 1;
                if *tries > HASH_TRIES {
                    drop(slots);
                    return round_robin(up, tier, sel, now, ev);
                }
            }
        }
        Method::Consistent(ring) => {
            let KeyState::Consistent {
                point,
                tries,
                empty,
            } = &mut sel.key
            else {
                return round_robin(up, tier, sel, now, ev);
            };
            if *tries > HASH_TRIES || tier.single || *empty || ring.len() == 0 {
                return round_robin(up, tier, sel, now, ev);
            }
            let mut slots = tier.lock();
            let gate = tier.gate(up, &mut slots, now, ev);
            // ngx_http_upstream_get_chash_peer: smooth WRR among the
            // eligible peers of the server name at the current point.
            loop {
                let group = ring.group_at(*point);
                if let Some(p) = swrr(
                    up,
                    &gate,
                    tier,
                    &mut slots,
                    &sel.tried,
                    group.iter().map(|&i| i as usize),
                ) {
                    return Some(take(up, &gate, tier, &mut slots, &mut sel.tried, p, ev));
                }
                *point += 1;
                *tries += 1;
                if *tries > HASH_TRIES {
                    drop(slots);
                    return round_robin(up, tier, sel, now, ev);
                }
            }
        }
        Method::IpHash(cum) => {
            let KeyState::Ip {
                addr,
                len,
                hash,
                tries,
            } = &mut sel.key
            else {
                return round_robin(up, tier, sel, now, ev);
            };
            if *tries > HASH_TRIES || tier.single || cum.total() == 0 {
                return round_robin(up, tier, sel, now, ev);
            }
            let mut slots = tier.lock();
            let gate = tier.gate(up, &mut slots, now, ev);
            // ngx_http_upstream_get_ip_hash_peer
            let mut h = *hash;
            loop {
                h = ip_hash_step(h, &addr[..*len]);
                let p = cum.find(u64::from(h) % cum.total());
                let global = tier.offset + p;
                if !sel.tried.contains(p) && gate.eligible(&up.peers[global], p, &slots[p]) {
                    *hash = h;
                    return Some(take(up, &gate, tier, &mut slots, &mut sel.tried, p, ev));
                }
                *tries += 1;
                if *tries > HASH_TRIES {
                    drop(slots);
                    return round_robin(up, tier, sel, now, ev);
                }
            }
        }
        Method::Random { ranges, two } => {
            let KeyState::Random { rng, tries } = &mut sel.key else {
                return round_robin(up, tier, sel, now, ev);
            };
            if *tries > HASH_TRIES || tier.single || ranges.total() == 0 {
                return round_robin(up, tier, sel, now, ev);
            }
            let mut slots = tier.lock();
            let gate = tier.gate(up, &mut slots, now, ev);
            // ngx_http_upstream_get_random_peer / get_random2_peer
            let mut prev: Option<usize> = None;
            loop {
                let p = ranges.find(next_random(rng) % ranges.total());
                let peer = &up.peers[tier.offset + p];
                let ok = Some(p) != prev
                    && !sel.tried.contains(p)
                    && gate.eligible(peer, p, &slots[p])
                    && (!gate.ramps() || ramp_admits(&gate, peer, rng));
                if ok {
                    if !*two {
                        return Some(take(up, &gate, tier, &mut slots, &mut sel.tried, p, ev));
                    }
                    if let Some(first) = prev {
                        // Keep the second draw unless it is strictly more
                        // loaded: conns/weight compared by cross-multiplying.
                        let (a, b) = (&up.peers[tier.offset + first], peer);
                        let load = |x: &crate::peer::Peer, y: &crate::peer::Peer| {
                            u64::from(x.conns()) * u64::from(gate.nominal(y))
                        };
                        let pick = if load(b, a) > load(a, b) { first } else { p };
                        return Some(take(up, &gate, tier, &mut slots, &mut sel.tried, pick, ev));
                    }
                    prev = Some(p);
                }
                *tries += 1;
                if *tries > HASH_TRIES {
                    drop(slots);
                    return round_robin(up, tier, sel, now, ev);
                }
            }
        }
    }
}

/// Pick within one tier with round robin or least_conn (backups use the
/// upstream's method only if it is one of these two).
pub(super) fn tier(
    up: &Upstream,
    tier: &Tier,
    sel: &mut Selection,
    now: Timestamp,
    ev: &mut Events,
) -> Option<usize> {
    match up.method {
        Method::LeastConn => least_conn(up, tier, sel, now, ev),
        _ => round_robin(up, tier, sel, now, ev),
    }
}

/// `ngx_http_upstream_get_round_robin_peer` for one tier.
fn round_robin(
    up: &Upstream,
    tier: &Tier,
    sel: &mut Selection,
    now: Timestamp,
    ev: &mut Events,
) -> Option<usize> {
    let mut slots = tier.lock();
    if tier.single {
        // One primary, no backup: only `down` and `max_conns` (plus vigil's
        // admin and probe states, and max_ejected) can refuse it; no
        // passive exclusion.
        let peer = &up.peers[tier.offset];
        let gate = tier.gate(up, &mut slots, now, ev);
        if !gate.eligible(peer, 0, &slots[0]) {
            return None;
        }
        peer.acquire();
        sel.tried.insert(0);
        return Some(tier.offset);
    }
    let fresh = sel.tried.is_empty();
    if tier.plannable() {
        if slots.impaired_count() == 0 && fresh {
            if let Some(p) = tier.fast_pick(&mut slots) {
                // Every peer is at rest: no rule is in force, so the pick
                // needs no max_ejected count.
                let gate = Gate::new(&up.config.rules, false, now, None, false);
                return Some(take(up, &gate, tier, &mut slots, &mut sel.tried, p, ev));
            }
        } else {
            tier.materialize(&mut slots);
        }
    }
    let gate = tier.gate(up, &mut slots, now, ev);
    let n = slots.len();
    let p = swrr(up, &gate, tier, &mut slots, &sel.tried, 0..n)?;
    let picked = take(up, &gate, tier, &mut slots, &mut sel.tried, p, ev);
    if tier.plannable() && fresh {
        tier.try_resume(&mut slots);
    }
    Some(picked)
}

/// `ngx_http_upstream_get_peer`: smooth weighted round robin over the
/// eligible peers among `candidates`; ties go to the earlier peer. Returns
/// the winner after taking the total from its current weight.
fn swrr(
    up: &Upstream,
    gate: &Gate<'_>,
    tier: &Tier,
    slots: &mut TierState,
    tried: &super::Tried,
    candidates: impl Iterator<Item = usize>,
) -> Option<usize> {
    if gate.ramps() {
        swrr_scan::<true>(up, gate, tier, slots, tried, candidates)
    } else {
        swrr_scan::<false>(up, gate, tier, slots, tried, candidates)
    }
}

/// [`swrr`] with the weights static (`RAMPS` false: no server has
/// `slow_start`) or ramping.
fn swrr_scan<const RAMPS: bool>(
    up: &Upstream,
    gate: &Gate<'_>,
    tier: &Tier,
    slots: &mut TierState,
    tried: &super::Tried,
    candidates: impl Iterator<Item = usize>,
) -> Option<usize> {
    let mut best: Option<(usize, i64)> = None;
    let mut total = 0i64;
    for i in candidates {
        if tried.contains(i) {
            continue;
        }
        let peer = &up.peers[tier.offset + i];
        let s = &mut slots[i];
        if !gate.eligible(peer, i, s) {
            continue;
        }
        let weight = i64::from(peer.config().weight.get());
        let now_weight = if RAMPS {
            gate.weight(peer, s)
        } else {
            s.effective
        };
        s.current += now_weight;
        total += now_weight;
        let mut restored = false;
        if s.effective < weight {
            s.effective += 1;
            restored = s.effective == weight;
        }
        if best.is_none_or(|(_, cur)| s.current > cur) {
            best = Some((i, s.current));
        }
        if RAMPS && gate.settle(peer) {
            restored = true;
        }
        if restored {
            tier.refresh(slots, i, peer);
        }
    }
    let (b, _) = best?;
    slots[b].current -= total;
    Some(b)
}

/// `ngx_http_upstream_get_least_conn_peer` for one tier.
fn least_conn(
    up: &Upstream,
    tier: &Tier,
    sel: &mut Selection,
    now: Timestamp,
    ev: &mut Events,
) -> Option<usize> {
    let mut slots = tier.lock();
    let gate = tier.gate(up, &mut slots, now, ev);
    // Two copies of the scan: without slow_start the weights are static.
    if gate.ramps() {
        least_conn_scan::<true>(up, &gate, tier, &mut slots, sel, ev)
    } else {
        least_conn_scan::<false>(up, &gate, tier, &mut slots, sel, ev)
    }
}

fn least_conn_scan<const RAMPS: bool>(
    up: &Upstream,
    gate: &Gate<'_>,
    tier: &Tier,
    slots: &mut TierState,
    sel: &mut Selection,
    ev: &mut Events,
) -> Option<usize> {
    let n = slots.len();
    let mut best: Option<usize> = None;
    let mut many = false;
    let load = |i: usize, j: usize| {
        // conns(i) * weight(j), the weight with its slow-start ramp
        let pj = &up.peers[tier.offset + j];
        let w = if RAMPS {
            gate.nominal(pj)
        } else {
            pj.config().weight.get()
        };
        u64::from(up.peers[tier.offset + i].conns()) * u64::from(w)
    };
    for i in 0..n {
        if sel.tried.contains(i) || !gate.eligible(&up.peers[tier.offset + i], i, &slots[i]) {
            continue;
        }
        match best {
            Some(b) if load(i, b) == load(b, i) => many = true,
            Some(b) if load(i, b) >= load(b, i) => {}
            _ => {
                best = Some(i);
                many = false;
            }
        }
    }
    let mut b = best?;
    if many {
        let first = b;
        let tied = (first..n).filter(|&i| load(i, first) == load(first, i));
        b = swrr_scan::<RAMPS>(up, gate, tier, slots, &sel.tried, tied)?;
    }
    Some(take(up, gate, tier, slots, &mut sel.tried, b, ev))
}

/// Common end of every pick: the trial-request `checked` move, the
/// connection count and the tried bit.
#[inline(always)]
fn take(
    up: &Upstream,
    gate: &Gate<'_>,
    tier: &Tier,
    slots: &mut TierState,
    tried: &mut super::Tried,
    p: usize,
    ev: &mut Events,
) -> usize {
    let global = tier.offset + p;
    let peer = &up.peers[global];
    passive::picked(gate.rules(), peer, &mut slots[p], global, gate.now(), ev);
    peer.acquire();
    tried.insert(p);
    global
}

/// `slow_start` (or a fleet halving) with `random`: a draw of a ramping
/// peer is kept with probability (weight now / weight), so draws follow
/// the ramped weights.
#[cold]
fn ramp_admits(gate: &Gate<'_>, peer: &crate::peer::Peer, rng: &mut u64) -> bool {
    if !policy::ramp::ramping(peer) && !policy::halve::in_force(peer, gate.now()) {
        return true;
    }
    let w = u64::from(peer.config().weight.get());
    next_random(rng) % w < u64::from(gate.nominal(peer))
}

/// xorshift64*: the per-request generator for `random`.
fn next_random(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 1
}
