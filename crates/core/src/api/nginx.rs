//! `vigil check`: what nginx was actually given for a server, beside what
//! core's rules say. In checker-only mode vigil routes nothing: nginx does,
//! from the files vigil renders, and only once it has reloaded them. The
//! check-mode sync loop fills [`PeerView::nginx`]; `explain` then leads
//! with what nginx does and does not claim "gets no traffic" for a server
//! nginx still sends traffic to.

use serde::{Deserialize, Serialize};

use super::PeerView;
pub use crate::event::NginxGiven;

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

/// `vigil check`: the render and reload loop, for `vigil status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NginxSyncView {
    /// Verified reloads since vigil started (the startup one included).
    pub reloads: u64,
    /// Failed or unverified reloads.
    pub reload_failures: u64,
    /// Renders the test command rejected (and that were rolled back).
    pub renders_rejected: u64,
    /// Rendered files nginx does not run yet: a reload is owed.
    pub reload_pending: bool,
    /// The last reload failed or was unverified: nginx runs older files.
    pub reload_failed: bool,
    /// The last render was rejected by the test command.
    pub render_rejected: bool,
    /// The last error (nginx's message), while the last attempt failed.
    pub last_error: Option<String>,
    /// When nginx last reloaded (verified), ms since the epoch.
    pub last_reload_unix_ms: Option<u64>,
    /// When the last reload failed, ms since the epoch.
    pub last_failure_unix_ms: Option<u64>,
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
                _ if n.decided == NginxGiven::Down => {
                    "waiting for the reload, which goes at once for a server leaving nginx (--down-reload-min-interval)"
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(nginx: Option<NginxView>) -> PeerView {
        let json = serde_json::json!({
            "address": "10.0.0.1:80", "backup": false, "state": "probe_down", "weight": 1,
            "effective_weight": 1, "conns": 0, "max_conns": 0, "fails": 0, "max_fails": 1,
            "fail_timeout_ms": 10000, "last_failure_unix_ms": null, "admin": "up",
            "active": null, "reasons": [],
        });
        let mut p: PeerView = serde_json::from_value(json).expect("a peer view");
        p.nginx = nginx;
        p
    }

    fn said(n: NginxView) -> Vec<String> {
        let mut out = vec![
            "10.0.0.1:80 gets no traffic: active checks say down.".to_string(),
            "Active checks say up.".into(),
        ];
        amend("app", &peer(Some(n)), &mut out);
        out
    }

    #[test]
    fn a_server_nginx_still_serves_is_not_said_to_get_no_traffic() {
        let waiting = said(NginxView {
            given: Some(NginxGiven::AsWritten),
            given_note: None,
            decided: NginxGiven::Down,
            decided_note: Some("down by active check".into()),
            pending: Some("waiting_for_reload".into()),
        });
        assert_eq!(
            waiting[0],
            "In nginx: vigil decided to mark it `down` (down by active check) in app.conf, but nginx still has it up: it gets traffic; waiting for the reload, which goes at once for a server leaving nginx (--down-reload-min-interval)."
        );
        assert_eq!(
            waiting[1],
            "10.0.0.1:80 is out by vigil's rules, but nginx still sends it traffic (see above): active checks say down."
        );
        let failed = said(NginxView {
            pending: Some("reload_failed".into()),
            ..waiting_view()
        });
        assert!(
            failed[0].contains("the reload failed and is retried"),
            "{failed:?}"
        );
        // Once nginx has it down, core's sentence stands.
        let down = said(NginxView {
            given: Some(NginxGiven::Down),
            given_note: Some("down by active check".into()),
            pending: None,
            ..waiting_view()
        });
        assert_eq!(
            down[0],
            "In nginx: 10.0.0.1:80 is marked `down` in app.conf (down by active check); nginx sends it nothing."
        );
        assert_eq!(
            down[1],
            "10.0.0.1:80 gets no traffic: active checks say down."
        );
        // Outside check mode nothing changes.
        let mut out = vec!["10.0.0.1:80 gets no traffic: x.".to_string()];
        amend("app", &peer(None), &mut out);
        assert_eq!(out, ["10.0.0.1:80 gets no traffic: x."]);
    }

    fn waiting_view() -> NginxView {
        NginxView {
            given: Some(NginxGiven::AsWritten),
            given_note: None,
            decided: NginxGiven::Down,
            decided_note: Some("down by active check".into()),
            pending: Some("waiting_for_reload".into()),
        }
    }
}
