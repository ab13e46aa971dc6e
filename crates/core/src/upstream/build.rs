//! Building an upstream, and carrying its peers' state over a reload.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::balancer::Method;
use crate::clock::Clock;
use crate::config::UpstreamConfig;
use crate::event::EventBus;
use crate::health::{ActiveHealth, HealthPolicy};
use crate::peer::{Peer, PeerId};

use super::budget::RetryBudgetState;
use super::slot;
use super::tier::Tier;
use super::Upstream;

impl Upstream {
    /// Build an upstream, carrying over the state of peers of `previous`
    /// whose address and settings did not change (nginx loses it on reload).
    pub fn with_previous(
        config: UpstreamConfig,
        previous: Option<&Upstream>,
        events: Arc<EventBus>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let name: Arc<str> = config.name.as_str().into();
        let policy = config.check.as_ref().map(|c| HealthPolicy {
            rise: c.rise.get(),
            fall: c.fall.get(),
            initial: c.initial,
        });
        let ordered: Vec<_> = config
            .servers
            .iter()
            .filter(|s| !s.backup)
            .chain(config.servers.iter().filter(|s| s.backup))
            .cloned()
            .collect();
        let n_primary = config.servers.iter().filter(|s| !s.backup).count();
        let peers: Box<[Arc<Peer>]> = ordered
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let health = match policy {
                    Some(p) => ActiveHealth::new(p),
                    None => ActiveHealth::disabled(),
                };
                Arc::new(Peer::new(PeerId(i as u32), name.clone(), s, health))
            })
            .collect();
        let has_backup = peers.len() > n_primary;
        // Under eject_stuck a peer leaves rotation by time passing alone,
        // with no event to leave the precomputed cycle on: nginx's scan.
        let rr = config.balancer == crate::config::Balancer::RoundRobin
            && config.rules.eject_stuck.is_none();
        let single = n_primary == 1 && !has_backup;
        let primary = Tier::new(&peers[..n_primary], 0, single, rr, true);
        let backup =
            has_backup.then(|| Tier::new(&peers[n_primary..], n_primary, false, rr, false));
        let primaries: Vec<_> = peers[..n_primary].iter().map(|p| p.config()).collect();
        let method = Method::build(&config.balancer, &primaries);
        let budget = config.rules.retry_budget.map(|b| {
            previous
                .and_then(|p| p.budget.as_ref())
                .filter(|old| old.config() == b)
                .cloned()
                .unwrap_or_else(|| Arc::new(RetryBudgetState::new(b, clock.clone())))
        });
        let latency = super::latency::Latency::new(&config, peers.len());
        let up = Self {
            latency,
            name,
            config,
            peers,
            primary,
            backup,
            method,
            budget,
            events,
            clock,
            jitter: AtomicU64::new(rand::random()),
        };
        if let Some(prev) = previous {
            up.inherit(prev);
        }
        up
    }

    fn inherit(&self, prev: &Upstream) {
        let same_check = prev.config.check == self.config.check;
        let same_rules = prev.config.rules == self.config.rules;
        for peer in self.peers.iter() {
            let Some(old) = prev
                .peers
                .iter()
                .find(|o| o.config().same_server(peer.config()))
            else {
                continue;
            };
            let (Some(new_tier), Some(old_tier)) =
                (self.tier_of(peer.id()), prev.tier_of(old.id()))
            else {
                continue;
            };
            let mut slot = old_tier.slot(old.id().0 as usize - old_tier.offset);
            if !same_rules {
                // The rule state means nothing under other rules: nginx's
                // fields stay, vigil's start afresh.
                slot = slot::Slot {
                    current: slot.current,
                    effective: slot.effective,
                    fails: slot.fails,
                    accessed: slot.accessed,
                    checked: slot.checked,
                    ..slot::Slot::default()
                };
            }
            let _ = peer.set_admin(old.admin(), old.admin_since());
            peer.set_ramp_until(old.ramp_until());
            if same_check {
                peer.health().inherit(old.health());
                if let Some(r) = old.last_probe() {
                    peer.set_last_probe(r);
                }
            }
            new_tier.restore(peer.id().0 as usize - new_tier.offset, slot, peer);
            let halved = old.halved_until();
            if halved != crate::clock::Timestamp(0) {
                self.carry_halving(peer.id(), halved, old.halved_by());
            }
        }
    }
}
