//! Every upstream of a configuration, built once per (re)load and shared
//! by the proxy, the checker and the admin API.

use std::collections::HashMap;
use std::sync::Arc;

use crate::clock::Clock;
use crate::config::Config;
use crate::event::EventBus;
use crate::upstream::Upstream;

/// The upstreams of one configuration generation.
#[derive(Debug)]
pub struct Registry {
    upstreams: Vec<Arc<Upstream>>,
    by_name: HashMap<String, usize>,
    generation: u64,
}

impl Registry {
    /// Build the upstreams of `config`. With `previous`, peers whose address
    /// and settings did not change keep their passive and active state.
    pub fn build(
        config: &Config,
        previous: Option<&Registry>,
        events: Arc<EventBus>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let mut upstreams = Vec::with_capacity(config.upstreams.len());
        let mut by_name = HashMap::new();
        for u in &config.upstreams {
            let prev = previous.and_then(|p| p.get(&u.name));
            let up = Upstream::with_previous(
                u.clone(),
                prev.map(|a| &**a),
                events.clone(),
                clock.clone(),
            );
            by_name.insert(u.name.clone(), upstreams.len());
            upstreams.push(Arc::new(up));
        }
        Self {
            upstreams,
            by_name,
            generation: previous.map_or(1, |p| p.generation + 1),
        }
    }

    /// The upstream called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Upstream>> {
        self.by_name.get(name).map(|&i| &self.upstreams[i])
    }

    /// All upstreams in config order.
    pub fn upstreams(&self) -> &[Arc<Upstream>] {
        &self.upstreams
    }

    /// 1 for the first load, +1 per reload.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}
