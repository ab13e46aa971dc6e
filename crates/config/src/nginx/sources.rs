//! Where the settings of a loaded nginx.conf were written: for every
//! location, the directives in force there (its own or inherited from
//! `server` and `http`, with nginx's inheritance rules), and for every
//! upstream block its `server` lines and other directives. The model
//! keeps values only; `vigil lint` uses this to point a finding at the
//! directive, or the parameter, that causes it.

use std::collections::BTreeMap;

use super::syntax::{Arg, Directive, Span};
use vigil_core::config::Origin;

/// One directive as written (without its block).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    /// Its name.
    pub name: String,
    /// Its arguments.
    pub args: Vec<Arg>,
    /// Where its name starts.
    pub span: Span,
}

/// The directives in force at one place, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placements {
    by_name: BTreeMap<String, Vec<Placed>>,
}

/// A level's own `add_header` or `proxy_set_header` that drops every one
/// it would have inherited (nginx inherits them only into a level that
/// has none of its own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shadow {
    /// The level's first directive of the name.
    pub by: Placed,
    /// The directives of the outer levels no longer in force there.
    pub dropped: Vec<Placed>,
}

/// The sources of a whole configuration (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sources {
    /// Every level whose own `add_header` / `proxy_set_header` drops
    /// inherited ones, in file order.
    shadowed: Vec<Shadow>,
    /// By server block, then location, as `config.servers[i].locations[j]`.
    locations: Vec<Vec<Placements>>,
    /// By upstream name: its `server` directives, as `up.servers`.
    servers: BTreeMap<String, Vec<Placed>>,
    /// By upstream name: its other directives.
    upstreams: BTreeMap<String, Placements>,
}

// === impl Placed ===

impl Placed {
    pub(crate) fn of(d: &Directive) -> Self {
        Self {
            name: d.name.clone(),
            args: d.args.clone(),
            span: d.span.clone(),
        }
    }

    /// Where the directive is.
    pub fn origin(&self) -> Origin {
        super::origin(&self.span)
    }

    /// The argument that is exactly `word` (`http_404`).
    pub fn word(&self, word: &str) -> Option<&Arg> {
        self.args.iter().find(|a| a.value == word)
    }

    /// The argument `key=...` (`fail_timeout=5s`).
    pub fn param(&self, key: &str) -> Option<&Arg> {
        self.args
            .iter()
            .find(|a| a.value.split_once('=').is_some_and(|(k, _)| k == key))
    }

    /// Where `word` is, else where the directive is.
    pub fn origin_of_word(&self, word: &str) -> Origin {
        self.word(word)
            .map_or_else(|| self.origin(), |a| super::origin(&a.span))
    }

    /// Where `key=` is, else where the directive is.
    pub fn origin_of_param(&self, key: &str) -> Origin {
        self.param(key)
            .map_or_else(|| self.origin(), |a| super::origin(&a.span))
    }
}

// === impl Placements ===

impl Placements {
    /// The directive `name` in force (the last one written at the level
    /// that sets it).
    pub fn get(&self, name: &str) -> Option<&Placed> {
        self.by_name.get(name).and_then(|v| v.last())
    }

    /// Every directive `name` in force (the array directives:
    /// `proxy_set_header`, `add_header`).
    pub fn all(&self, name: &str) -> &[Placed] {
        self.by_name.get(name).map_or(&[], Vec::as_slice)
    }

    /// `d` replaces what was in force under its name.
    pub(crate) fn set(&mut self, d: &Directive) {
        self.by_name.insert(d.name.clone(), vec![Placed::of(d)]);
    }

    /// `d` is added to what is in force under its name.
    pub(crate) fn push(&mut self, d: &Directive) {
        self.by_name
            .entry(d.name.clone())
            .or_default()
            .push(Placed::of(d));
    }

    /// Nothing is in force under `name` any more.
    pub(crate) fn clear(&mut self, name: &str) {
        self.by_name.remove(name);
    }
}

// === impl Sources ===

impl Sources {
    /// The directives in force in `config.servers[server].locations[location]`.
    pub fn location(&self, server: usize, location: usize) -> Option<&Placements> {
        self.locations.get(server).and_then(|s| s.get(location))
    }

    /// The `server` line of `up.servers[index]` of upstream `upstream`
    /// (None for the implicit upstream of `proxy_pass host:port`).
    pub fn server(&self, upstream: &str, index: usize) -> Option<&Placed> {
        self.servers.get(upstream).and_then(|s| s.get(index))
    }

    /// The directives of upstream block `upstream` other than `server`.
    pub fn upstream(&self, upstream: &str) -> Option<&Placements> {
        self.upstreams.get(upstream)
    }

    /// Every location, as (server index, location index, placements).
    pub fn locations(&self) -> impl Iterator<Item = (usize, usize, &Placements)> {
        self.locations
            .iter()
            .enumerate()
            .flat_map(|(s, l)| l.iter().enumerate().map(move |(i, p)| (s, i, p)))
    }

    /// The levels whose own `add_header` / `proxy_set_header` drop
    /// inherited ones.
    pub fn shadowed(&self) -> &[Shadow] {
        &self.shadowed
    }

    pub(crate) fn shadow(&mut self, by: &Directive, dropped: &[Placed]) {
        if !dropped.is_empty() {
            self.shadowed.push(Shadow {
                by: Placed::of(by),
                dropped: dropped.to_vec(),
            });
        }
    }

    pub(crate) fn add_server_block(&mut self, locations: Vec<Placements>) {
        self.locations.push(locations);
    }

    pub(crate) fn add_upstream(&mut self, name: &str, servers: Vec<Placed>, other: Placements) {
        self.servers.insert(name.to_string(), servers);
        self.upstreams.insert(name.to_string(), other);
    }
}
