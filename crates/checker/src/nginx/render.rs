//! One `upstream` block as stock nginx reads it: the source's directives
//! in order, `check*` removed, and ` down` added to servers the probes
//! took out, never to all of them (the minimum-healthy guard).

use std::fmt::Write as _;

use vigil_core::peer::PeerId;

use super::source::{Block, Line};

/// What to do when the probes would leave fewer than `min_healthy`
/// servers of an upstream usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guard {
    /// Servers (not `down` in the source) that must stay usable (default 1).
    pub min_healthy: usize,
    /// `true` (default): mark none down, so nginx's passive checks spread
    /// traffic over all of them; `false`: mark them as the probes say, even
    /// every server (nginx then answers 502, or uses `backup` servers).
    pub fail_open: bool,
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
    /// Whether the guard held back marks.
    pub guarded: bool,
}

impl Default for Guard {
    fn default() -> Self {
        Self {
            min_healthy: 1,
            fail_open: true,
        }
    }
}

/// Render `block`; `down(peer)` says whether probes want the peer marked.
pub fn render(block: &Block, down: &dyn Fn(PeerId) -> bool, guard: Guard) -> Rendered {
    let usable = block
        .lines
        .iter()
        .filter(|l| matches!(l, Line::Server { down: false, .. }))
        .count();
    let wanted: Vec<PeerId> = block
        .lines
        .iter()
        .filter_map(|l| match l {
            Line::Server {
                peer, down: false, ..
            } if down(*peer) => Some(*peer),
            _ => None,
        })
        .collect();
    let left = usable - wanted.len();
    let guarded = !wanted.is_empty() && left < guard.min_healthy.min(usable);
    let apply = !guarded || !guard.fail_open;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# Rendered by vigil check from {}; do not edit: vigil rewrites this file.",
        block.origin.replace(['\n', '\r'], " ")
    );
    let _ = writeln!(text, "upstream {} {{", block.name);
    if guarded && guard.fail_open {
        let _ = writeln!(
            text,
            "    # vigil: {} of {usable} servers fail their checks; none marked down (fail-open guard, min_healthy={})",
            wanted.len(),
            guard.min_healthy
        );
    }
    let mut marked = Vec::new();
    for line in &block.lines {
        match line {
            Line::Other(t) => {
                let _ = writeln!(text, "    {t};");
            }
            Line::Server { text: t, peer, .. } if apply && wanted.contains(peer) => {
                let _ = writeln!(text, "    {t} down; # vigil: down by active check");
                marked.push(t.clone());
            }
            Line::Server { text: t, .. } => {
                let _ = writeln!(text, "    {t};");
            }
        }
    }
    text.push_str("}\n");
    Rendered {
        name: block.name.clone(),
        text,
        marked,
        guarded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block() -> Block {
        Block {
            name: "app".into(),
            origin: "src.conf:1".into(),
            lines: vec![
                Line::Other("hash $request_uri consistent".into()),
                Line::Server {
                    text: "server 127.0.0.1:1 weight=2".into(),
                    peer: PeerId(0),
                    down: false,
                },
                Line::Server {
                    text: "server 127.0.0.1:2".into(),
                    peer: PeerId(1),
                    down: false,
                },
                Line::Server {
                    text: "server 127.0.0.1:3 down".into(),
                    peer: PeerId(2),
                    down: true,
                },
            ],
        }
    }

    #[test]
    fn marks_down_in_place_and_keeps_order() {
        let r = render(&block(), &|p| p == PeerId(1), Guard::default());
        assert_eq!(
            r.text,
            "# Rendered by vigil check from src.conf:1; do not edit: vigil rewrites this file.\n\
             upstream app {\n    hash $request_uri consistent;\n    server 127.0.0.1:1 weight=2;\n    \
             server 127.0.0.1:2 down; # vigil: down by active check\n    server 127.0.0.1:3 down;\n}\n"
        );
        assert_eq!(r.marked, vec!["server 127.0.0.1:2".to_string()]);
        assert!(!r.guarded);
        assert_eq!(
            r,
            render(&block(), &|p| p == PeerId(1), Guard::default()),
            "deterministic"
        );
    }

    #[test]
    fn never_marks_every_server_unless_fail_closed() {
        let all = |_| true;
        let r = render(&block(), &all, Guard::default());
        assert!(r.guarded);
        assert!(r.marked.is_empty());
        assert!(!r.text.contains("down; # vigil"));
        let closed = Guard {
            min_healthy: 1,
            fail_open: false,
        };
        let r = render(&block(), &all, closed);
        assert!(r.guarded);
        assert_eq!(r.marked.len(), 2);
    }
}
