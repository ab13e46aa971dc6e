//! nginx's rewrite module: a server's or a location's script (its
//! `rewrite`, `set`, `return` in file order) compiled and run on a
//! request, and the `map` variables. The phases that run the scripts (the
//! server's, the location search, the location's, again from the search
//! after `rewrite ... last`, at most 10 times, then 500, as
//! `NGX_HTTP_MAX_URI_CHANGES`) are the routes' (route.rs).

use std::cell::Cell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use http::request::Parts;
use vigil_config::pattern::Regex;
use vigil_core::config::{Location, MapBlock, MapKey, RewriteFlag, RewriteStep};

use crate::nginx::reply::Reply;
use crate::nginx::router::{RouteError, Target};
use crate::nginx::vars::{MapVar, RequestVars, Scope, Template, VarContext};

/// A compiled rewrite-phase script.
#[derive(Default)]
pub(crate) struct Script(Vec<Step>);

enum Step {
    Rewrite {
        re: Regex,
        replacement: Template,
        drop_args: bool,
        flag: RewriteFlag,
    },
    Set {
        name: Arc<str>,
        value: Template,
    },
    Return(Arc<Reply>),
}

/// How a script ended.
pub(crate) enum Ran {
    /// It ran to its end (or `break`): the location's content answers.
    Done,
    /// `rewrite ... last`: search the location again.
    Last,
    /// A `return` or a redirecting `rewrite`.
    Return(Arc<Reply>),
}

/// A `map`'s compiled table, filled once every map is known (maps may
/// name each other in any order).
#[derive(Debug, Default)]
pub(crate) struct MapCell(OnceLock<MapTable>);

#[derive(Debug)]
struct MapTable {
    source: Template,
    hostnames: bool,
    exact: HashMap<String, Template>,
    /// `.x.com` / `*.x.com` keys: the suffix (with its dot), and whether
    /// the bare name (`x.com`) matches too.
    heads: Vec<(String, bool, Template)>,
    /// `www.x.*` keys: the prefix (with its dot).
    tails: Vec<(String, Template)>,
    regexes: Vec<(Regex, Template)>,
    default: Option<Template>,
}

/// Maps evaluating maps: nginx stops a cycle with "cycle while evaluating
/// variable"; this bounds the depth instead.
const MAX_MAP_DEPTH: u8 = 16;

thread_local! {
    static MAP_DEPTH: Cell<u8> = const { Cell::new(0) };
}

/// Restarts after `last` nginx allows (`NGX_HTTP_MAX_URI_CHANGES`).
pub(crate) const MAX_URI_CHANGES: usize = 10;

// === impl Scope building ===

/// The configuration's own variables: every `set` name, the named groups
/// of every regex (`server_name`s, locations, `rewrite`s, map keys), every map.
pub(crate) fn scope(config: &vigil_core::config::Config) -> Result<Scope, RouteError> {
    let mut scope = Scope::default();
    let mut cells: HashMap<String, Arc<MapCell>> = HashMap::new();
    let names = |script: &[RewriteStep], scope: &mut Scope| {
        for s in script {
            match s {
                // `set $args` changes the request's arguments, not a variable of its own.
                RewriteStep::Set(v) if v.name == "args" => {}
                RewriteStep::Set(v) => scope.declare(&v.name),
                RewriteStep::Rewrite(r) => {
                    if let Ok(re) = vigil_config::pattern::compile(&r.regex, false) {
                        for n in vigil_config::pattern::group_names(&re) {
                            scope.declare(n);
                        }
                    }
                }
                RewriteStep::Return(_) => {}
            }
        }
    };
    for s in &config.servers {
        // ngx_http_core_server_name: caseless with an upper-case letter.
        for p in s.server_names.iter().filter_map(|n| n.strip_prefix('~')) {
            let caseless = p.bytes().any(|b| b.is_ascii_uppercase());
            if let Ok(re) = vigil_config::pattern::compile(p, caseless) {
                for n in vigil_config::pattern::group_names(&re) {
                    scope.declare(n);
                }
            }
        }
        names(&s.rewrite, &mut scope);
        for l in &s.locations {
            names(&l.routing.script, &mut scope);
        }
    }
    for m in &config.maps {
        for e in &m.entries {
            if let MapKey::Regex { pattern, caseless } = &e.key {
                if let Ok(re) = vigil_config::pattern::compile(pattern, *caseless) {
                    for n in vigil_config::pattern::group_names(&re) {
                        scope.declare(n);
                    }
                }
            }
        }
        let cell = Arc::new(MapCell::default());
        cells.insert(m.variable.clone(), cell.clone());
        scope.maps.insert(m.variable.clone(), cell);
    }
    for m in &config.maps {
        let table = MapTable::build(m, &scope).map_err(|message| RouteError {
            at: m.origin.to_string(),
            message,
        })?;
        if let Some(cell) = cells.get(&m.variable) {
            let _ = cell.0.set(table);
        }
    }
    Ok(scope)
}

// === impl Script ===

impl Script {
    /// Compile `steps` (`loc`: the location they are in, for a `return`'s
    /// headers and log).
    pub(crate) fn build(
        steps: &[RewriteStep],
        loc: Option<&Location>,
        scope: &Scope,
        mut reply: impl FnMut(&vigil_core::config::Return) -> Result<Reply, RouteError>,
    ) -> Result<Self, RouteError> {
        let mut out = Vec::new();
        for s in steps {
            out.push(match s {
                RewriteStep::Rewrite(r) => {
                    let err = |message: String| RouteError {
                        at: r.origin.to_string(),
                        message,
                    };
                    Step::Rewrite {
                        re: vigil_config::pattern::compile(&r.regex, false).map_err(err)?,
                        replacement: Template::parse_with(&r.replacement, scope)
                            .map_err(|e| err(e.to_string()))?,
                        drop_args: r.drop_args,
                        flag: r.flag,
                    }
                }
                RewriteStep::Set(v) => Step::Set {
                    name: Arc::from(v.name.as_str()),
                    value: Template::parse_with(&v.value, scope).map_err(|e| RouteError {
                        at: v.origin.to_string(),
                        message: e.to_string(),
                    })?,
                },
                RewriteStep::Return(r) => Step::Return(Arc::new(reply(r)?)),
            });
        }
        let _ = loc;
        Ok(Self(out))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Run the script on the request (`max_body`: the location's, for a
    /// redirect it makes).
    pub(crate) fn run(
        &self,
        parts: &mut Parts,
        t: &mut Target,
        net: Net,
        base: Option<&Reply>,
    ) -> Ran {
        for step in &self.0 {
            match step {
                Step::Return(r) => return Ran::Return(r.clone()),
                Step::Set { name, value } => {
                    let v = value.expand(&net.cx(parts, t));
                    if &**name == "args" {
                        let path = t.uri.path().to_vec();
                        // The routed arguments are text (uri.rs).
                        t.uri
                            .rewrite(path, String::from_utf8_lossy(&v).into_owned());
                    } else {
                        vars(parts).named.insert(name.clone(), v);
                    }
                }
                Step::Rewrite {
                    re,
                    replacement,
                    drop_args,
                    flag,
                } => {
                    let groups = match re.captures(t.uri.path()) {
                        Ok(Some(groups)) => groups,
                        Ok(None) => {
                            // nginx: a regex that does not match clears the captures.
                            vars(parts).captures.clear();
                            continue;
                        }
                        Err(e) => {
                            // ngx_http_script_regex_start_code: 500.
                            tracing::error!(uri = %String::from_utf8_lossy(t.uri.path()), "{e}");
                            return Ran::Return(Arc::new(
                                base.map_or_else(Reply::internal_error, |b| b.status(500)),
                            ));
                        }
                    };
                    let v = vars(parts);
                    // ngx_http_regex_exec sets every named group, "" for
                    // one that took no part.
                    for (i, name) in re.capture_names().enumerate() {
                        if let Some(name) = name {
                            let value = groups.get(i).cloned().flatten().unwrap_or_default();
                            v.named.insert(Arc::from(name), value);
                        }
                    }
                    v.captures = groups;
                    let text = replacement.expand(&net.cx(parts, t));
                    let args = t.uri.args().to_string();
                    match flag {
                        RewriteFlag::Redirect | RewriteFlag::Permanent => {
                            let mut url = text;
                            if !drop_args && !args.is_empty() {
                                url.push(if url.contains(&b'?') { b'&' } else { b'?' });
                                url.extend_from_slice(args.as_bytes());
                            }
                            let code = if *flag == RewriteFlag::Permanent {
                                301
                            } else {
                                302
                            };
                            return Ran::Return(Arc::new(base.map_or_else(
                                || Reply::internal_error().redirect(code, &url),
                                |b| b.redirect(code, &url),
                            )));
                        }
                        _ => {}
                    }
                    // The path keeps its bytes; the routed arguments are text (uri.rs).
                    let (path, new_args) = match text.iter().position(|&b| b == b'?') {
                        Some(q) => {
                            let mut a = String::from_utf8_lossy(&text[q + 1..]).into_owned();
                            if !drop_args && !args.is_empty() {
                                a.push('&');
                                a.push_str(&args);
                            }
                            (text[..q].to_vec(), a)
                        }
                        None if *drop_args => (text, String::new()),
                        None => (text, args),
                    };
                    if path.is_empty() {
                        tracing::error!("the rewritten URI has a zero length");
                        let page = base.map_or_else(Reply::internal_error, |b| b.status(500));
                        return Ran::Return(Arc::new(page));
                    }
                    t.uri.rewrite(path, new_args);
                    t.internal = true;
                    match flag {
                        RewriteFlag::Break => {
                            t.valid_location = false;
                            return Ran::Done;
                        }
                        RewriteFlag::Last => return Ran::Last,
                        _ => {}
                    }
                }
            }
        }
        Ran::Done
    }
}

/// The addresses a variable may need while a script runs.
#[derive(Clone, Copy)]
pub(crate) struct Net {
    pub(crate) local: SocketAddr,
    pub(crate) client: SocketAddr,
}

impl Net {
    fn cx<'a>(&self, parts: &'a Parts, target: &'a Target) -> VarContext<'a> {
        VarContext {
            parts,
            target: Some(target),
            client: self.client,
            local: self.local,
            proxy_host: "",
            attempts: &[],
            status: 0,
            request_time: 0.0,
        }
    }
}

pub(crate) fn vars(parts: &mut Parts) -> &mut RequestVars {
    parts.extensions.get_or_insert_default::<RequestVars>()
}

// === impl MapCell ===

impl MapVar for MapCell {
    fn write(&self, cx: &VarContext<'_>, out: &mut Vec<u8>) {
        let Some(t) = self.0.get() else {
            return;
        };
        let depth = MAP_DEPTH.with(|d| d.get());
        if depth >= MAX_MAP_DEPTH {
            return;
        }
        MAP_DEPTH.with(|d| d.set(depth + 1));
        t.write(cx, out);
        MAP_DEPTH.with(|d| d.set(depth));
    }
}

// === impl MapTable ===

impl MapTable {
    fn build(m: &MapBlock, scope: &Scope) -> Result<Self, String> {
        let tpl = |v: &str| Template::parse_with(v, scope).map_err(|e| e.to_string());
        let mut t = Self {
            source: tpl(&m.source)?,
            hostnames: m.hostnames,
            exact: HashMap::new(),
            heads: Vec::new(),
            tails: Vec::new(),
            regexes: Vec::new(),
            default: m.default.as_deref().map(tpl).transpose()?,
        };
        for e in &m.entries {
            let value = tpl(&e.value)?;
            match &e.key {
                MapKey::Regex { pattern, caseless } => t
                    .regexes
                    .push((vigil_config::pattern::compile(pattern, *caseless)?, value)),
                MapKey::Exact(k) => {
                    let k = k.to_ascii_lowercase();
                    if m.hostnames {
                        if let Some(rest) = k.strip_prefix("*.") {
                            t.heads.push((format!(".{rest}"), false, value));
                            continue;
                        }
                        if k.starts_with('.') {
                            t.heads.push((k, true, value));
                            continue;
                        }
                        if let Some(rest) = k.strip_suffix(".*") {
                            t.tails.push((format!("{rest}."), value));
                            continue;
                        }
                    }
                    t.exact.entry(k).or_insert(value);
                }
            }
        }
        // The most specific wildcard wins.
        t.heads.sort_by_key(|h| std::cmp::Reverse(h.0.len()));
        t.tails.sort_by_key(|h| std::cmp::Reverse(h.0.len()));
        Ok(t)
    }

    /// `ngx_http_map_find`: exact (case-insensitive), wildcards, regexes
    /// in order, else the default. The source is bytes; a key of the conf is text, which a source
    /// that is not UTF-8 never equals.
    fn write(&self, cx: &VarContext<'_>, out: &mut Vec<u8>) {
        let mut src = self.source.expand(cx);
        if self.hostnames && src.ends_with(b".") {
            src.pop();
        }
        let low = src.to_ascii_lowercase();
        if let Some(v) = std::str::from_utf8(&low)
            .ok()
            .and_then(|k| self.exact.get(k))
        {
            return v.write(cx, None, out);
        }
        if self.hostnames {
            for (suffix, bare, v) in &self.heads {
                if low.ends_with(suffix.as_bytes()) || (*bare && low == suffix.as_bytes()[1..]) {
                    return v.write(cx, None, out);
                }
            }
            for (prefix, v) in &self.tails {
                if low.starts_with(prefix.as_bytes()) {
                    return v.write(cx, None, out);
                }
            }
        }
        for (re, v) in &self.regexes {
            match re.captures(&src) {
                Ok(Some(groups)) => return v.write(cx, Some(&groups), out),
                Ok(None) => {}
                Err(e) => {
                    // ngx_http_map_find gives up: the default value.
                    tracing::error!(value = %String::from_utf8_lossy(&src), "{e}");
                    break;
                }
            }
        }
        if let Some(d) = &self.default {
            d.write(cx, None, out);
        }
    }
}
