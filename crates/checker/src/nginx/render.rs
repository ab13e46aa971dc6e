//! One `upstream` block as stock nginx reads it: the source's directives
//! in order, `check*` and vigil's rules removed, and ` down` added to the
//! servers core says take no traffic. Which ones is core's answer
//! ([`decide`]): the admin states, and every server a health rule ejects
//! unless `max_ejected` keeps it ([`vigil_core::upstream::Upstream::ejected_now`]);
//! the `--min-healthy` guard is that same rule ([`super::Guard`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use vigil_core::clock::Timestamp;
use vigil_core::peer::{AdminState, PeerId};
use vigil_core::upstream::{policy, Ineligible, Upstream};

use super::source::{Block, Line};

/// How one server is rendered, with the comment that says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mark {
    /// As in the source.
    AsWritten,
    /// ` down` added; the comment names the cause.
    Down(String),
    /// Left up although a health rule ejects it: `max_ejected` keeps it,
    /// and nginx sends it traffic.
    Kept(String),
}

/// A rendered file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// The upstream.
    pub name: String,
    /// The file's text.
    pub text: String,
    /// Servers marked down (their text).
    pub marked: Vec<String>,
    /// Servers `max_ejected` keeps up although they fail (their text).
    pub kept: Vec<String>,
    /// Every server line of the source (its text) and how it is rendered.
    pub servers: Vec<(String, Mark)>,
}

// === impl Mark ===

impl Mark {
    /// The comment on the line, if any.
    pub fn note(&self) -> Option<&str> {
        match self {
            Mark::AsWritten => None,
            Mark::Down(n) | Mark::Kept(n) => Some(n),
        }
    }

    /// The API's word for it.
    pub fn given(&self) -> vigil_core::api::NginxGiven {
        use vigil_core::api::NginxGiven;
        match self {
            Mark::AsWritten => NginxGiven::AsWritten,
            Mark::Down(_) => NginxGiven::Down,
            Mark::Kept(_) => NginxGiven::Kept,
        }
    }
}

// === impl Rendered ===

impl Rendered {
    /// Whether `max_ejected` keeps some failing server up.
    pub fn guarded(&self) -> bool {
        !self.kept.is_empty()
    }
}

/// What core says each server of `up` is to nginx at `now`: set down or
/// draining through the admin API (nginx has no drain: down), ejected by a
/// health rule (down), or ejected but kept by `max_ejected` (up). Servers
/// not listed are rendered as written. The comments carry no streak or
/// time, so the text changes only when a decision does.
pub fn decide(up: &Upstream, now: Timestamp) -> BTreeMap<PeerId, Mark> {
    let mut out = BTreeMap::new();
    // Out of service through the admin API (a server `down` in the source
    // stays as written).
    for p in up
        .peers()
        .iter()
        .filter(|p| !p.config().down && !policy::in_service(p))
    {
        let note = if p.admin() == AdminState::Drain {
            "draining through the admin API (nginx has no drain)"
        } else {
            "set down through the admin API"
        };
        out.insert(p.id(), Mark::Down(note.into()));
    }
    let limit = up.max_ejected_now(now);
    for e in up.ejected_now(now) {
        if out.contains_key(&e.peer) {
            continue;
        }
        let mark = if e.kept {
            let counts = limit
                .map(|m| {
                    format!(
                        " ({} of {} would be ejected, at most {} may be)",
                        m.ejected, m.in_service, m.allowed
                    )
                })
                .unwrap_or_default();
            Mark::Kept(format!(
                "{}, kept by max_ejected{counts}",
                match e.reason {
                    Ineligible::ProbeDown { .. } => "failing its checks",
                    _ => cause(&e.reason),
                }
            ))
        } else {
            Mark::Down(cause(&e.reason).into())
        };
        out.insert(e.peer, mark);
    }
    out
}

fn cause(r: &Ineligible) -> &'static str {
    match r {
        Ineligible::ProbeDown { .. } => "down by active check",
        Ineligible::Excluded { .. } => "excluded by passive checks",
        Ineligible::AwaitingProbe { .. } => "waiting for a recovery probe",
        _ => "ejected",
    }
}

/// Render `block` with `marks` (from [`decide`]; servers `down` in the
/// source stay as written).
pub fn render(block: &Block, marks: &BTreeMap<PeerId, Mark>) -> Rendered {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# Rendered by vigil check from {}; do not edit: vigil rewrites this file.",
        block.origin.replace(['\n', '\r'], " ")
    );
    let _ = writeln!(text, "upstream {} {{", block.name);
    let (mut marked, mut kept, mut servers) = (Vec::new(), Vec::new(), Vec::new());
    for line in &block.lines {
        match line {
            Line::Other(t) => {
                let _ = writeln!(text, "    {t};");
            }
            Line::Server {
                text: t,
                peer,
                down,
            } => {
                let mark = match marks.get(peer) {
                    Some(m) if !down => m.clone(),
                    _ => Mark::AsWritten,
                };
                let _ = match &mark {
                    Mark::AsWritten => writeln!(text, "    {t};"),
                    Mark::Down(n) => {
                        marked.push(t.clone());
                        writeln!(text, "    {t} down; # vigil: {n}")
                    }
                    Mark::Kept(n) => {
                        kept.push(t.clone());
                        writeln!(text, "    {t}; # vigil: {n}")
                    }
                };
                servers.push((t.clone(), mark));
            }
        }
    }
    text.push_str("}\n");
    Rendered {
        name: block.name.clone(),
        text,
        marked,
        kept,
        servers,
    }
}

#[cfg(test)]
mod tests;
