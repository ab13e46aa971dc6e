//! The upstreams source (SRC): tengine-style `upstream` blocks (at the top
//! level or inside `http {}`; everything else in the file is ignored) or
//! the TOML equivalent. Gives the model the checker probes and, per block,
//! the lines to render: every directive but the `check*` family, in order,
//! with each `server` line tied to its peer.

use std::path::{Path, PathBuf};

use vigil_config::nginx::syntax::{self, Arg, Directive};
use vigil_config::{nginx, Resolver};
use vigil_core::config::value::format_time;
use vigil_core::config::{Balancer, CheckConfig, Config, InitialState, UpstreamConfig};
use vigil_core::peer::PeerId;

use super::SyncError;

/// tengine's check directives: stock nginx rejects them; they are not rendered.
pub const CHECK_DIRECTIVES: [&str; 6] = [
    "check",
    "check_http_send",
    "check_http_expect_alive",
    "check_keepalive_requests",
    "check_fastcgi_param",
    "check_shm_size",
];

/// A loaded source.
#[derive(Debug)]
pub struct Source {
    /// The file.
    pub path: PathBuf,
    /// Its upstreams (default check applied to those without one).
    pub config: Config,
    /// One block per upstream, in the same order.
    pub blocks: Vec<Block>,
}

/// The renderable lines of one upstream block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// The upstream's name (and file name: `NAME.conf`).
    pub name: String,
    /// Where it is in the source (`file:line`), for the file header.
    pub origin: String,
    /// Its directives.
    pub lines: Vec<Line>,
}

/// One directive of a block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    /// Any directive but `server`, as text without the `;`.
    Other(String),
    /// A `server` line without the `;`.
    Server {
        /// The text.
        text: String,
        /// The peer it is.
        peer: PeerId,
        /// Already `down` in the source.
        down: bool,
    },
}

/// Load `path` (`.toml` → TOML, anything else → nginx syntax); upstreams
/// without a `check` get `default_check` when given.
pub fn load(
    path: &Path,
    default_check: Option<&CheckConfig>,
    resolve: Resolver<'_>,
) -> Result<Source, SyncError> {
    let is_toml = path.extension().is_some_and(|e| e == "toml");
    let (mut config, blocks): (Config, Vec<Block>) = if is_toml {
        let config = vigil_config::toml::load_file(path, resolve)?;
        let blocks = config
            .upstreams
            .iter()
            .map(|u| Block {
                name: u.name.clone(),
                origin: u.origin.to_string(),
                lines: model_lines(u),
            })
            .collect();
        (config, blocks)
    } else {
        let directives = syntax::parse_file(path).map_err(vigil_config::ConfigError::from)?;
        let mut ups = Vec::new();
        for d in &directives {
            match (d.name.as_str(), &d.block) {
                ("upstream", _) => ups.push(d.clone()),
                ("http", Some(body)) => {
                    ups.extend(body.iter().filter(|d| d.name == "upstream").cloned())
                }
                _ => {}
            }
        }
        let config = nginx::build(&ups, resolve)?.config;
        let blocks = ups
            .iter()
            .zip(&config.upstreams)
            .map(|(d, u)| Block {
                name: u.name.clone(),
                origin: format!("{}:{}", d.span.file.display(), d.span.line),
                lines: directive_lines(d, u),
            })
            .collect();
        (
            Config {
                upstreams: config.upstreams,
                ..Config::default()
            },
            blocks,
        )
    };
    for b in &blocks {
        check_name(&b.name)?;
    }
    if let Some(default) = default_check {
        for u in &mut config.upstreams {
            if u.check.is_none() {
                u.check = Some(default.clone());
            }
        }
    }
    for u in &mut config.upstreams {
        if let Some(c) = &mut u.check {
            c.initial = checker_initial(c.initial);
        }
    }
    config.servers.clear();
    Ok(Source {
        path: path.to_path_buf(),
        config,
        blocks,
    })
}

/// nginx serves every server as written until vigil marks one, so check
/// mode starts each checked server where nginx has it: usable until its
/// first probe result, which alone decides (tengine's `default_down=true`
/// would have core eject every server before any probe). After the first
/// result, rise and fall as configured.
fn checker_initial(initial: InitialState) -> InitialState {
    match initial {
        InitialState::Down => InitialState::FirstResult,
        other => other,
    }
}

/// The file name must stay inside the render directory.
fn check_name(name: &str) -> Result<(), SyncError> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(SyncError::Render {
            name: name.to_string(),
            message:
                "the name must be letters, digits, '.', '_' or '-' (it names the rendered file)"
                    .into(),
        })
    }
}

/// Peer ids of `u`'s servers in config order (core puts primaries first).
fn peer_ids(u: &UpstreamConfig) -> Vec<PeerId> {
    let n_primary = u.servers.iter().filter(|s| !s.backup).count() as u32;
    let (mut p, mut b) = (0u32, 0u32);
    u.servers
        .iter()
        .map(|s| {
            if s.backup {
                b += 1;
                PeerId(n_primary + b - 1)
            } else {
                p += 1;
                PeerId(p - 1)
            }
        })
        .collect()
}

fn directive_lines(d: &Directive, u: &UpstreamConfig) -> Vec<Line> {
    let ids = peer_ids(u);
    // One line per written server: a name of several addresses is several
    // peers, the line stands for its first.
    let mut servers = u.servers.iter().zip(ids).filter(|(s, _)| s.addr_nth == 0);
    let mut out = Vec::new();
    for d in d.block.iter().flatten() {
        // Stock nginx refuses tengine's check and vigil's own health rules.
        if CHECK_DIRECTIVES.contains(&d.name.as_str())
            || vigil_core::config::HealthRules::DIRECTIVES.contains(&d.name.as_str())
            || vigil_core::config::HealthRules::TRAFFIC_DIRECTIVES.contains(&d.name.as_str())
        {
            continue;
        }
        let text = if d.name == "server" {
            emit_server(d)
        } else {
            emit(d)
        };
        if d.name == "server" {
            if let Some((s, peer)) = servers.next() {
                out.push(Line::Server {
                    text,
                    peer,
                    down: s.down,
                });
                continue;
            }
        }
        out.push(Line::Other(text));
    }
    out
}

/// A directive as nginx.conf text (without `;`), quoting where needed.
pub fn emit(d: &Directive) -> String {
    let mut s = d.name.clone();
    for a in &d.args {
        s.push(' ');
        s.push_str(&quote(a));
    }
    s
}

/// A `server` line without the nginx Plus parameters stock nginx refuses
/// (`slow_start=`: vigil applies it, nginx must not see it).
fn emit_server(d: &Directive) -> String {
    let mut s = d.name.clone();
    for a in &d.args {
        let plus = vigil_core::config::ServerConfig::NGINX_PLUS_PARAMETERS
            .iter()
            .any(|p| a.value.starts_with(&format!("{p}=")));
        if !plus {
            s.push(' ');
            s.push_str(&quote(a));
        }
    }
    s
}

fn quote(a: &Arg) -> String {
    quote_str(&a.value, a.quoted)
}

fn quote_str(v: &str, quoted: bool) -> String {
    let needs = quoted
        || v.is_empty()
        || v.starts_with('#')
        || v.chars()
            .any(|c| c.is_whitespace() || matches!(c, ';' | '{' | '}' | '"' | '\'' | '\\'));
    if !needs {
        return v.to_string();
    }
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Lines of a TOML upstream, written as nginx would read them.
fn model_lines(u: &UpstreamConfig) -> Vec<Line> {
    let mut out = Vec::new();
    match &u.balancer {
        Balancer::RoundRobin => {}
        Balancer::LeastConn => out.push(Line::Other("least_conn".into())),
        Balancer::IpHash => out.push(Line::Other("ip_hash".into())),
        Balancer::Hash { key, consistent } => out.push(Line::Other(format!(
            "hash {}{}",
            quote_str(key, false),
            if *consistent { " consistent" } else { "" }
        ))),
        Balancer::Random { two } => out.push(Line::Other(
            if *two { "random two" } else { "random" }.into(),
        )),
    }
    if let Some(z) = &u.zone {
        out.push(Line::Other(format!("zone {}", quote_str(z, false))));
    }
    for (s, peer) in u
        .servers
        .iter()
        .zip(peer_ids(u))
        .filter(|(s, _)| s.addr_nth == 0)
    {
        let mut text = format!("server {}", quote_str(&s.address, false));
        if s.weight.get() != 1 {
            text.push_str(&format!(" weight={}", s.weight));
        }
        if s.max_fails != 1 {
            text.push_str(&format!(" max_fails={}", s.max_fails));
        }
        if s.fail_timeout != std::time::Duration::from_secs(10) {
            text.push_str(&format!(" fail_timeout={}", format_time(s.fail_timeout)));
        }
        if s.max_conns != 0 {
            text.push_str(&format!(" max_conns={}", s.max_conns));
        }
        // slow_start= is nginx Plus's: stock nginx refuses it, so it is not rendered.
        if s.backup {
            text.push_str(" backup");
        }
        if s.down {
            text.push_str(" down");
        }
        out.push(Line::Server {
            text,
            peer,
            down: s.down,
        });
    }
    if let Some(k) = &u.keepalive {
        out.push(Line::Other(format!("keepalive {}", k.idle)));
        if k.timeout != std::time::Duration::from_secs(60) {
            out.push(Line::Other(format!(
                "keepalive_timeout {}",
                format_time(k.timeout)
            )));
        }
        if k.requests != 1000 {
            out.push(Line::Other(format!("keepalive_requests {}", k.requests)));
        }
    }
    out
}
