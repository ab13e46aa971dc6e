//! `vigil status`: a table per upstream from the admin API.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use vigil_core::api::{NginxSyncView, PeerView, ReloadView, StatusDoc};
use vigil_core::upstream::PeerState;

use crate::client;

/// Arguments of `vigil status`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 shown, 2 the admin API could not be reached.\n\nExamples:\n  vigil status\n  vigil status --watch\n  vigil status --json | jq '.upstreams[].peers[] | select(.state != \"eligible\")'"
)]
pub(crate) struct Args {
    /// Admin API address.
    #[arg(long, default_value = client::DEFAULT_ADMIN)]
    admin: SocketAddr,
    /// Print the API's JSON unchanged.
    #[arg(long)]
    json: bool,
    /// Refresh every second, in place, until Ctrl-C.
    #[arg(long)]
    watch: bool,
    /// Bearer token of the admin API: with it, a failed reload's error text is shown.
    #[arg(long, env = "VIGIL_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Show the fleet instead (`GET /api/fleet`): members, who probes each
    /// target, and which member's probe gave its last verdict.
    #[arg(long)]
    fleet: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        loop {
            let path = if args.fleet {
                "/api/fleet"
            } else {
                "/api/status"
            };
            let v = client::get_with(args.admin, path, args.token.as_deref()).await?;
            let mut out = std::io::stdout().lock();
            if args.json {
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            } else if args.fleet {
                if args.watch {
                    write!(out, "\x1b[H\x1b[2J")?;
                }
                write!(out, "{}", crate::fleet::render(&v))?;
            } else {
                let doc: StatusDoc = serde_json::from_value(v)?;
                let colour =
                    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
                if args.watch {
                    write!(out, "\x1b[H\x1b[2J")?;
                }
                write!(out, "{}", render(&doc, colour))?;
            }
            out.flush()?;
            if !args.watch {
                return Ok(ExitCode::SUCCESS);
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            }
        }
    })
}

/// The tables.
pub(crate) fn render(doc: &StatusDoc, colour: bool) -> String {
    let mut s = format!(
        "generation {}  at {} UTC\n",
        doc.generation,
        client::clock(doc.now_unix_ms)
    );
    if let Some(r) = doc.last_reload.as_ref().filter(|r| !r.ok) {
        s.push_str(&reload_failed_line(r, doc.generation, colour));
    }
    if let Some(n) = &doc.nginx {
        s.push_str(&nginx_line(n, colour));
    }
    for u in &doc.upstreams {
        let check = u
            .check
            .as_ref()
            .map(|c| {
                format!(
                    ", check {} every {} ms (rise {} fall {})",
                    c.kind, c.interval_ms, c.rise, c.fall
                )
            })
            .unwrap_or_default();
        s.push_str(&format!(
            "\nupstream {} ({}{}{})\n",
            u.name,
            u.balancer,
            if u.single { ", single" } else { "" },
            check
        ));
        // `vigil check`: vigil sees no traffic (nginx routes it), so no
        // CONNS or FAILS; instead what nginx was given.
        let checker = doc.nginx.is_some() || u.peers.iter().any(|p| p.nginx.is_some());
        s.push_str(&table(&u.peers, colour, checker));
    }
    s
}

/// The line above the tables when the last configuration reload (SIGHUP,
/// `vigil reload`) failed: the running configuration is kept.
fn reload_failed_line(r: &ReloadView, generation: u64, colour: bool) -> String {
    let why = r
        .error
        .as_deref()
        .or(r.error_withheld.as_deref())
        .map(|e| e.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let text = format!(
        "config: RELOAD FAILED at {}; still running generation {generation}: {why}",
        client::clock(r.at_unix_ms)
    );
    if colour {
        format!("\x1b[31m{text}\x1b[0m\n")
    } else {
        format!("{text}\n")
    }
}

/// `vigil check`: the line above the tables: whether nginx runs what vigil
/// rendered, and a failed reload or a rejected render with its error.
fn nginx_line(n: &NginxSyncView, colour: bool) -> String {
    let at = |ms: Option<u64>| {
        ms.map(|m| format!(" at {}", client::clock(m)))
            .unwrap_or_default()
    };
    let error = n
        .last_error
        .as_deref()
        .map(|e| format!(": {}", e.split_whitespace().collect::<Vec<_>>().join(" ")))
        .unwrap_or_default();
    let (bad, text) = if n.render_rejected {
        (
            true,
            format!(
                "nginx: RENDER REJECTED by the test command; the previous files were restored, nginx was not reloaded{error}"
            ),
        )
    } else if n.reload_failed {
        (
            true,
            format!(
                "nginx: RELOAD FAILED{} ({} failed so far); nginx runs the files of its last good reload{}, retried with backoff{error}",
                at(n.last_failure_unix_ms),
                n.reload_failures,
                match n.last_reload_unix_ms {
                    Some(m) => format!(" ({})", client::clock(m)),
                    None => " (none since vigil started)".into(),
                }
            ),
        )
    } else if n.reload_pending {
        (
            false,
            format!(
                "nginx: a reload is pending; nginx runs the files of its last reload{}",
                at(n.last_reload_unix_ms)
            ),
        )
    } else {
        (
            false,
            format!(
                "nginx: runs the rendered files ({} reload(s), the last{})",
                n.reloads,
                at(n.last_reload_unix_ms)
            ),
        )
    };
    if bad && colour {
        format!("\x1b[31m{text}\x1b[0m\n")
    } else {
        format!("{text}\n")
    }
}

/// `vigil check`: what nginx was given for the server (`down`, `kept`
/// (failing, kept up by the guard: gets traffic), `as written`), and what
/// vigil decided when nginx does not run it yet.
fn in_nginx(p: &PeerView) -> String {
    use vigil_core::api::NginxGiven;
    let Some(n) = &p.nginx else {
        return String::new();
    };
    let word = |g: Option<NginxGiven>| match g {
        Some(NginxGiven::Down) => "down",
        Some(NginxGiven::Kept) => "kept (failing, gets traffic)",
        Some(NginxGiven::AsWritten) => "as written",
        None => "not reloaded yet",
    };
    match &n.pending {
        None => word(n.given).to_string(),
        Some(why) => format!(
            "{}; decided: {} ({})",
            word(n.given),
            word(Some(n.decided)),
            why.replace('_', " ")
        ),
    }
}

/// One table: columns as wide as their widest cell, two spaces apart; the
/// last column (the probe's detail, of any length) is not padded.
fn table(peers: &[PeerView], colour: bool, checker: bool) -> String {
    let head: &[&str] = if checker {
        &["PEER", "STATE", "WEIGHT", "SINCE", "IN NGINX", "LAST PROBE"]
    } else {
        &[
            "PEER",
            "STATE",
            "WEIGHT",
            "CONNS",
            "FAILS",
            "SINCE",
            "LAST PROBE",
        ]
    };
    // Right-aligned: the numbers.
    let right = |i: usize| i == 2 || (!checker && i == 3);
    let rows: Vec<Vec<String>> = peers.iter().map(|p| cells(p, checker)).collect();
    let mut width: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String], state: Option<PeerState>| {
        let last = cells.len() - 1;
        let mut out = String::from(" ");
        for (i, c) in cells.iter().enumerate() {
            let pad = width[i].saturating_sub(c.chars().count());
            let text = match (i, state) {
                (1, Some(st)) if colour => {
                    let code = match st {
                        PeerState::Eligible => "32",
                        PeerState::Draining | PeerState::Full => "33",
                        _ => "31",
                    };
                    format!("\x1b[{code}m{c}\x1b[0m")
                }
                _ => c.clone(),
            };
            out.push(' ');
            if i == last {
                out.push_str(&text);
            } else if right(i) {
                out.push_str(&format!("{}{text} ", " ".repeat(pad)));
            } else {
                out.push_str(&format!("{text}{} ", " ".repeat(pad)));
            }
        }
        let mut out = out.trim_end().to_string();
        out.push('\n');
        out
    };
    let mut s = line(
        &head.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
        None,
    );
    for (p, r) in peers.iter().zip(&rows) {
        s.push_str(&line(r, Some(p.state)));
    }
    s
}

/// The peer's name as configured, with the address it resolved to when
/// that is other text (`backend.internal:8080 (10.0.0.7:8080)`).
fn peer_name(p: &PeerView) -> String {
    if let Some(server) = &p.server {
        // One of several addresses of a written name.
        return format!("{} ({server})", p.address);
    }
    if p.addr.is_empty() || p.addr == p.address {
        p.address.clone()
    } else {
        format!("{} ({})", p.address, p.addr)
    }
}

/// `3 (limit 1)`: failures counted, and the `max_fails` that excludes.
fn fails(p: &PeerView) -> String {
    if p.max_fails == 0 {
        format!("{} (no limit)", p.fails)
    } else {
        format!("{} (limit {})", p.fails, p.max_fails)
    }
}

/// The weight column: `5`, or `5->2 until 12:00:03 (by b)` while a fleet
/// member's ejection halves it (share_passive). ASCII, as the table is.
fn weight(p: &PeerView) -> String {
    match p.halved_until_unix_ms {
        Some(until) => format!(
            "{}->{} until {} (by {})",
            p.weight,
            p.weight_now,
            client::clock(until),
            p.halved_by.as_deref().unwrap_or("?")
        ),
        None => p.weight.to_string(),
    }
}

fn cells(p: &PeerView, checker: bool) -> Vec<String> {
    let state = if p.backup && p.state == PeerState::Eligible {
        "backup".to_string()
    } else {
        p.state.to_string()
    };
    let probe = p
        .active
        .as_ref()
        .and_then(|a| a.last_probe.as_ref())
        .map(|pr| {
            // One line, whatever the detail holds.
            let detail = pr.detail.split_whitespace().collect::<Vec<_>>().join(" ");
            format!(
                "{} {:.0}ms {detail}",
                if pr.ok { "ok" } else { "FAIL" },
                pr.latency_ms,
            )
            .trim_end()
            .to_string()
        })
        .unwrap_or_else(|| "-".into());
    let since = p
        .reasons
        .first()
        .and_then(|r| r.since_unix_ms)
        .or_else(|| p.active.as_ref().and_then(|a| a.since_unix_ms))
        .map(client::clock)
        .unwrap_or_else(|| "-".into());
    if checker {
        let given = in_nginx(p);
        return vec![
            peer_name(p),
            state,
            p.weight.to_string(),
            since,
            if given.is_empty() { "-".into() } else { given },
            probe,
        ];
    }
    vec![
        peer_name(p),
        state,
        weight(p),
        p.conns.to_string(),
        fails(p),
        since,
        probe,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(nginx: Option<serde_json::Value>) -> StatusDoc {
        let mut v = serde_json::json!({
            "generation": 1, "now_unix_ms": 0,
            "upstreams": [{
                "name": "app", "balancer": "round_robin", "single": false, "check": null,
                "peers": [{
                    "address": "10.0.0.1:80", "backup": false, "state": "eligible", "weight": 1,
                    "effective_weight": 1, "conns": 7, "max_conns": 0, "fails": 3, "max_fails": 1,
                    "fail_timeout_ms": 10000, "last_failure_unix_ms": null, "admin": "up",
                    "active": null, "reasons": [],
                }],
            }],
        });
        if let Some(n) = nginx {
            v["nginx"] = n;
        }
        serde_json::from_value(v).expect("a status document")
    }

    #[test]
    fn check_mode_hides_what_vigil_cannot_see_and_shows_a_failed_reload() {
        // vigil serve: CONNS and FAILS, no nginx line.
        let serve = render(&doc(None), false);
        assert!(serve.contains("CONNS"), "{serve}");
        assert!(serve.contains("FAILS"), "{serve}");
        assert!(serve.contains("3 (limit 1)"), "{serve}");
        assert!(!serve.contains("nginx:"), "{serve}");
        // vigil check: neither column, and the reload failure above the table.
        let failed = serde_json::json!({
            "reloads": 1, "reload_failures": 2, "renders_rejected": 0,
            "reload_pending": true, "reload_failed": true, "render_rejected": false,
            "last_error": "nginx master 7 did not replace its worker processes\nwithin 10s",
            "last_reload_unix_ms": 3_600_000, "last_failure_unix_ms": 3_661_000,
        });
        let check = render(&doc(Some(failed)), false);
        assert!(!check.contains("CONNS"), "{check}");
        assert!(!check.contains("FAILS"), "{check}");
        assert!(!check.contains("limit 1"), "{check}");
        assert!(check.contains("IN NGINX"), "{check}");
        let lines: Vec<&str> = check.lines().collect();
        assert_eq!(
            lines[1],
            "nginx: RELOAD FAILED at 01:01:01 (2 failed so far); nginx runs the files of its last good reload (01:00:00), retried with backoff: nginx master 7 did not replace its worker processes within 10s"
        );
        assert!(lines[2..].iter().all(|l| !l.starts_with("nginx:")));
        // Healthy: one line that says nginx runs the files.
        let ok = serde_json::json!({
            "reloads": 3, "reload_failures": 0, "renders_rejected": 0,
            "reload_pending": false, "reload_failed": false, "render_rejected": false,
            "last_error": null, "last_reload_unix_ms": 3_600_000, "last_failure_unix_ms": null,
        });
        let check = render(&doc(Some(ok)), false);
        assert_eq!(
            check.lines().nth(1),
            Some("nginx: runs the rendered files (3 reload(s), the last at 01:00:00)")
        );
    }

    /// A document with one upstream of `peers` (JSON peer views, merged
    /// over a healthy default).
    fn doc_of(peers: Vec<serde_json::Value>) -> StatusDoc {
        let peers: Vec<serde_json::Value> = peers
            .into_iter()
            .map(|over| {
                let mut p = serde_json::json!({
                    "address": "10.0.0.1:80", "backup": false, "state": "eligible", "weight": 1,
                    "effective_weight": 1, "conns": 0, "max_conns": 0, "fails": 0, "max_fails": 1,
                    "fail_timeout_ms": 10000, "last_failure_unix_ms": null, "admin": "up",
                    "active": null, "reasons": [],
                });
                for (k, v) in over.as_object().expect("an object") {
                    p[k] = v.clone();
                }
                p
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "generation": 1, "now_unix_ms": 0,
            "upstreams": [{
                "name": "app", "balancer": "round_robin", "single": false, "check": null,
                "peers": peers,
            }],
        }))
        .expect("a status document")
    }

    #[test]
    fn a_weight_a_fleet_member_halved_shows_both_weights_the_end_and_who() {
        let d = doc_of(vec![serde_json::json!({
            "weight": 4, "weight_now": 2, "halved_until_unix_ms": 3_603_000, "halved_by": "b",
        })]);
        let text = render(&d, false);
        assert!(text.contains("4->2 until 01:00:03 (by b)"), "{text}");
        let whole = render(&doc_of(vec![serde_json::json!({"weight": 4})]), false);
        assert!(!whole.contains("->"), "{whole}");
    }

    fn probe(ok: bool, detail: &str) -> serde_json::Value {
        serde_json::json!({
            "state": if ok { "up" } else { "down" }, "decided": true, "rise_streak": 1,
            "fall_streak": 0, "since_unix_ms": 3_600_000,
            "last_probe": {"ok": ok, "phase": null, "latency_ms": 2.0, "detail": detail, "at_unix_ms": 3_600_000},
        })
    }

    /// The byte column where `needle` starts in `line` (the tables are ASCII).
    fn col(line: &str, needle: &str) -> usize {
        line.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in {line:?}"))
    }

    #[test]
    fn long_names_full_addresses_and_probe_details_are_shown_whole_in_aligned_columns() {
        let long = "payments-backend-primary.eu-west-1.internal.example.com:8443";
        let detail = "HTTP 503 from GET /healthz: upstream said \"maintenance in progress\"";
        let d = doc_of(vec![
            serde_json::json!({"address": long, "addr": "10.20.30.40:8443", "fails": 3,
                "conns": 12345, "active": probe(false, detail), "state": "probe_down"}),
            serde_json::json!({"address": "10.0.0.2:80", "addr": "10.0.0.2:80",
                "max_fails": 0, "active": probe(true, "HTTP 200")}),
        ]);
        let out = render(&d, false);
        let lines: Vec<&str> = out.lines().collect();
        let head = lines
            .iter()
            .position(|l| l.contains("PEER"))
            .expect("a header");
        let (h, a, b) = (lines[head], lines[head + 1], lines[head + 2]);
        // Whole: the configured name, the resolved address, the probe's detail.
        assert!(a.contains(&format!("{long} (10.20.30.40:8443)")), "{out}");
        assert!(a.ends_with(&format!("FAIL 2ms {detail}")), "{out}");
        assert!(b.ends_with("ok 2ms HTTP 200"), "{out}");
        // An IP address is not repeated.
        assert!(!b.contains("(10.0.0.2:80)"), "{out}");
        // FAILS reads as failures and their limit.
        assert!(a.contains("3 (limit 1)"), "{out}");
        assert!(b.contains("0 (no limit)"), "{out}");
        // Every left-aligned column starts where its header does, past the
        // longest name; the numbers end where their header ends.
        for name in ["STATE", "FAILS", "SINCE", "LAST PROBE"] {
            let at = col(h, name);
            assert!(at > long.len(), "{out}");
            for row in [a, b] {
                assert_eq!(row.as_bytes()[at - 1], b' ', "{name}: {out}");
                assert_ne!(row.as_bytes()[at], b' ', "{name}: {out}");
            }
        }
        let conns_end = col(h, "CONNS") + "CONNS".len();
        assert_eq!(&a[conns_end - 5..conns_end], "12345", "{out}");
        assert_eq!(&b[conns_end - 1..conns_end], "0", "{out}");
        // No trailing blanks.
        assert!(lines.iter().all(|l| !l.ends_with(' ')), "{out}");
    }

    #[test]
    fn a_peer_of_a_name_with_several_addresses_shows_the_written_server() {
        let d = doc_of(vec![
            serde_json::json!({"address": "10.0.0.1:80", "addr": "10.0.0.1:80", "server": "app:80"}),
            serde_json::json!({"address": "app2:80", "addr": "10.0.0.9:80"}),
        ]);
        let out = render(&d, false);
        assert!(out.contains("10.0.0.1:80 (app:80)"), "{out}");
        assert!(out.contains("app2:80 (10.0.0.9:80)"), "{out}");
    }

    #[test]
    fn a_short_table_is_narrow_and_colour_does_not_shift_columns() {
        let d = doc_of(vec![
            serde_json::json!({"address": "a:1", "addr": "127.0.0.1:1"}),
            serde_json::json!({"address": "127.0.0.1:2", "state": "excluded"}),
        ]);
        let plain = render(&d, false);
        // Sized to content: the PEER column is as wide as its widest cell.
        assert!(
            plain.contains("\n  PEER               STATE     WEIGHT"),
            "{plain}"
        );
        let painted = render(&d, true);
        let strip = painted
            .replace("\x1b[32m", "")
            .replace("\x1b[31m", "")
            .replace("\x1b[0m", "");
        assert_eq!(strip, plain);
    }

    #[test]
    fn a_failed_reload_is_the_line_above_the_tables_and_a_good_one_says_nothing() {
        let mut d = doc(None);
        d.last_reload = Some(ReloadView {
            at_unix_ms: 3_661_000,
            ok: false,
            generation: None,
            error: Some("/etc/nginx/nginx.conf:12:5: unknown directive\n\"proxy_pas\"".into()),
            error_withheld: None,
        });
        let out = render(&d, false);
        assert_eq!(
            out.lines().nth(1),
            Some("config: RELOAD FAILED at 01:01:01; still running generation 1: /etc/nginx/nginx.conf:12:5: unknown directive \"proxy_pas\""),
            "{out}"
        );
        // Without the token the API withholds the text and says so.
        d.last_reload = Some(ReloadView {
            error: None,
            error_withheld: Some(
                "last reload failed at ...; the error text is shown with the admin token".into(),
            ),
            ..d.last_reload.clone().expect("set above")
        });
        let out = render(&d, false);
        assert!(
            out.lines().nth(1).is_some_and(|l| l.starts_with(
                "config: RELOAD FAILED at 01:01:01; still running generation 1: last reload failed"
            )),
            "{out}"
        );
        d.last_reload = Some(ReloadView {
            at_unix_ms: 3_661_000,
            ok: true,
            generation: Some(2),
            error: None,
            error_withheld: None,
        });
        let out = render(&d, false);
        assert!(!out.contains("config:"), "{out}");
    }
}
