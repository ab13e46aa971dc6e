//! `vigil check`: what nginx was actually given for a server, beside what
//! core's rules say. In checker-only mode vigil routes nothing: nginx does,
//! from the files vigil renders, and only once it has reloaded them. The
//! check-mode sync loop fills [`PeerView::nginx`]; `explain` then leads
//! with what nginx does and does not claim "gets no traffic" for a server
//! nginx still sends traffic to.

use serde::{Deserialize, Serialize};

use super::PeerView;

/// How a server is written in a rendered file.
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

/// What nginx runs for one server, and what vigil decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NginxView {
    /// The server in the files nginx last loaded (a verified reload); None
    /// before vigil's first verified reload.
    pub given: Option<NginxGiven>,
    /// The comment vigil wrote on its line there (the cause).
    pub given_note: Option<String>,
    /// The server as vigil renders it now.
    pub decided: NginxGiven,
    /// The comment on that line.
    pub decided_note: Option<String>,
    /// Why nginx does not run the decision yet: `waiting_for_reload`,
    /// `reload_failed`, `render_rejected` (None: it does).
    pub pending: Option<String>,
}

/// Lead `out` (core's sentences about `peer` of upstream `name`) with what
/// nginx was given, and reword core's "gets no traffic" and "is eligible"
/// where nginx does otherwise.
pub(super) fn amend(name: &str, peer: &PeerView, out: &mut Vec<String>) {
    let Some(n) = &peer.nginx else {
        return;
    };
    let addr = &peer.address;
    let file = format!("{name}.conf");
    let note = |n: &Option<String>| n.as_ref().map(|t| format!(" ({t})")).unwrap_or_default();
    let lead = match (&n.pending, n.given) {
        (None, Some(NginxGiven::Down)) => format!(
            "In nginx: {addr} is marked `down` in {file}{}; nginx sends it nothing.",
            note(&n.given_note)
        ),
        (None, Some(NginxGiven::Kept)) => format!(
            "In nginx: {addr} stays up in {file} although it fails its checks{}: nginx still sends it traffic.",
            note(&n.given_note)
        ),
        (None, _) => format!(
            "In nginx: {addr} is as written in the source ({file}); nginx's own max_fails and fail_timeout apply to it."
        ),
        (Some(why), given) => {
            let decided = match n.decided {
                NginxGiven::Down => format!("to mark it `down`{}", note(&n.decided_note)),
                NginxGiven::Kept => format!(
                    "to keep it up although it fails its checks{}",
                    note(&n.decided_note)
                ),
                NginxGiven::AsWritten => "to render it as written".into(),
            };
            let now = match given {
                Some(NginxGiven::Down) => "nginx still has it `down`: it gets no traffic",
                Some(_) => "nginx still has it up: it gets traffic",
                None => "nginx runs files vigil has not reloaded yet",
            };
            let why = match why.as_str() {
                "reload_failed" => "the reload failed and is retried with backoff (vigil's log has the error)",
                "render_rejected" => "nginx -t rejected the new files, which were rolled back (vigil's log has nginx's message)",
                _ => "waiting for the reload (--debounce, --reload-min-interval)",
            };
            format!("In nginx: vigil decided {decided} in {file}, but {now}; {why}.")
        }
    };
    let in_nginx_down = n.given == Some(NginxGiven::Down);
    for s in out.iter_mut() {
        for claim in ["gets no traffic", "gets no new requests"] {
            let prefix = format!("{addr} {claim}: ");
            if !in_nginx_down && s.starts_with(&prefix) {
                *s = format!(
                    "{addr} is out by vigil's rules, but nginx still sends it traffic (see above): {}",
                    &s[prefix.len()..]
                );
            }
        }
        let eligible = format!("{addr} is eligible");
        if in_nginx_down && s.starts_with(&eligible) {
            *s = format!(
                "{addr} is eligible by vigil's rules, but nginx still has it `down` (see above){}",
                &s[eligible.len()..]
            );
        }
    }
    out.insert(0, lead);
}
