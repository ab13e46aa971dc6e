//! Rendering with core's rule: which servers are marked `down` and which
//! `max_ejected` (the minimum-healthy guard is its count form) keeps up,
//! for 1, 2 and 3 servers, `--min-healthy 1` and `2`, `--fail-closed`, and
//! an upstream's own `max_ejected`. The registries come from the source as
//! `vigil check` loads it (tengine's `default_down` included).

use std::sync::Arc;
use std::time::Duration;

use vigil_config::literal_resolver;
use vigil_core::clock::{Clock, ManualClock, Timestamp};
use vigil_core::event::EventBus;
use vigil_core::health::ProbeReport;
use vigil_core::peer::{AdminState, PeerId};
use vigil_core::registry::Registry;

use super::super::{source, Guard};
use super::*;

struct Fixture {
    block: Block,
    registry: Registry,
    clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
}

const FAIL_CLOSED: Guard = Guard {
    min_healthy: 1,
    fail_open: false,
};

fn guard(n: usize) -> Guard {
    Guard {
        min_healthy: n,
        fail_open: true,
    }
}

/// An upstream `app` of `n` servers 127.0.0.1:1..=n (rise=2 fall=2,
/// tengine's default_down), with `extra` directives, loaded as `vigil
/// check` loads it under `guard`.
fn fixture(n: usize, extra: &str, guard: Guard) -> Fixture {
    let servers: Vec<String> = (1..=n).map(|i| format!("127.0.0.1:{i}")).collect();
    let servers: Vec<&str> = servers.iter().map(String::as_str).collect();
    fixture_of(&servers, extra, guard)
}

/// As [`fixture`], with these server lines (address and parameters).
fn fixture_of(servers: &[&str], extra: &str, guard: Guard) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut text = String::from("upstream app {\n");
    for s in servers {
        text.push_str(&format!("    server {s};\n"));
    }
    text.push_str(extra);
    text.push_str("    check interval=1000 rise=2 fall=2 timeout=500;\n}\n");
    let path = dir.path().join("src.conf");
    std::fs::write(&path, text).expect("write");
    let mut s = source::load(&path, None, &literal_resolver).expect("loads");
    guard.apply(&mut s.config);
    let clock = Arc::new(ManualClock::at(1_000));
    let c: Arc<dyn Clock> = clock.clone();
    let registry = Registry::build(&s.config, None, Arc::new(EventBus::default()), c);
    Fixture {
        block: s.blocks.remove(0),
        registry,
        clock,
        _dir: dir,
    }
}

impl Fixture {
    /// `k` probe results for server `i` (0-based), one second apart.
    fn probe(&self, i: u32, ok: bool, k: usize) {
        let up = self.registry.get("app").expect("app");
        for _ in 0..k {
            self.clock.advance(Duration::from_secs(1));
            up.record_probe(
                PeerId(i),
                ProbeReport {
                    ok,
                    phase: None,
                    latency: Duration::ZERO,
                    detail: String::new(),
                    at: self.clock.now(),
                },
            );
        }
    }

    fn render(&self) -> Rendered {
        let up = self.registry.get("app").expect("app");
        render(&self.block, &decide(up, self.clock.now()))
    }

    /// The rendered server lines, without the header.
    fn lines(&self) -> Vec<String> {
        self.render()
            .text
            .lines()
            .filter(|l| l.trim_start().starts_with("server "))
            .map(|l| l.trim().to_string())
            .collect()
    }
}

const DOWN: &str = " down; # vigil: down by active check";

#[test]
fn before_any_probe_every_server_is_as_written_whatever_default_down_says() {
    let f = fixture(3, "", guard(1));
    assert_eq!(
        f.render().text,
        "# Rendered by vigil check from ".to_string()
            + &f.block.origin
            + "; do not edit: vigil rewrites this file.\n\
               upstream app {\n    server 127.0.0.1:1;\n    server 127.0.0.1:2;\n    server 127.0.0.1:3;\n}\n"
    );
    // One pass decides (rise is not needed to stay up); one failure too.
    f.probe(0, true, 1);
    f.probe(1, false, 1);
    assert_eq!(
        f.lines(),
        [
            "server 127.0.0.1:1;".to_string(),
            format!("server 127.0.0.1:2{DOWN}"),
            "server 127.0.0.1:3;".into(),
        ]
    );
}

#[test]
fn one_server_failing_is_kept_under_the_guard_and_marked_when_fail_closed() {
    let f = fixture(1, "", guard(1));
    f.probe(0, false, 3);
    assert_eq!(
        f.lines(),
        ["server 127.0.0.1:1; # vigil: failing its checks, kept by max_ejected (1 of 1 would be ejected, at most 0 may be)"]
    );
    assert!(f.render().guarded());
    let f = fixture(1, "", FAIL_CLOSED);
    f.probe(0, false, 3);
    assert_eq!(f.lines(), [format!("server 127.0.0.1:1{DOWN}")]);
    assert!(!f.render().guarded());
}

#[test]
fn two_of_two_failing_keep_the_least_bad_one() {
    let f = fixture(2, "", guard(1));
    f.probe(0, false, 2);
    // :2 fails fewer probes in a row: the better record stays.
    f.probe(1, false, 1);
    f.probe(0, false, 2);
    let r = f.render();
    assert_eq!(
        f.lines(),
        [
            format!("server 127.0.0.1:1{DOWN}"),
            "server 127.0.0.1:2; # vigil: failing its checks, kept by max_ejected (2 of 2 would be ejected, at most 1 may be)".into(),
        ]
    );
    assert_eq!(r.marked, ["server 127.0.0.1:1"]);
    assert_eq!(r.kept, ["server 127.0.0.1:2"]);
    // The same states render the same bytes (the syncer compares text).
    assert_eq!(r, f.render());
    // --min-healthy 2 of 2: both stay up; fail-closed: both down.
    let f = fixture(2, "", guard(2));
    f.probe(0, false, 2);
    f.probe(1, false, 2);
    assert!(f.lines().iter().all(|l| l.contains("kept by max_ejected")));
    let f = fixture(2, "", FAIL_CLOSED);
    f.probe(0, false, 2);
    f.probe(1, false, 2);
    assert_eq!(f.render().marked.len(), 2);
}

#[test]
fn three_servers_with_min_healthy_one_and_two() {
    for (min, down) in [(1, 2), (2, 1)] {
        let f = fixture(3, "", guard(min));
        // :1 goes down first, :3 last; each keeps failing.
        for i in 0..3 {
            f.probe(i, false, 2 + i as usize);
        }
        let r = f.render();
        assert_eq!(r.marked.len(), down, "min_healthy {min}");
        assert_eq!(r.kept.len(), 3 - down, "min_healthy {min}");
        // Past `fall` failed probes they rank the same; the latest to go
        // down (it served until most recently) is kept first.
        assert!(r.kept.contains(&"server 127.0.0.1:3".to_string()));
        assert!(r.marked.contains(&"server 127.0.0.1:1".to_string()));
        // More failed probes of the same servers change nothing: the file
        // does not churn while they all stay down.
        for i in 0..3 {
            f.probe(i, false, 1 + i as usize);
            assert_eq!(f.render(), r, "min_healthy {min}, after probing {i}");
        }
    }
    // One of three failing is marked with either guard.
    for g in [guard(1), guard(2), FAIL_CLOSED] {
        let f = fixture(3, "", g);
        f.probe(1, false, 2);
        assert_eq!(f.render().marked, ["server 127.0.0.1:2"], "{g:?}");
        assert!(f.render().kept.is_empty());
    }
    // Two of three with --min-healthy 2: one is kept, and a server that
    // passes a probe on its way back (rise=2) has the better record.
    let f = fixture(3, "", guard(2));
    f.probe(2, false, 3);
    f.probe(0, false, 2);
    let r = f.render();
    assert_eq!(r.marked, ["server 127.0.0.1:3"]);
    assert_eq!(r.kept, ["server 127.0.0.1:1"]);
    f.probe(2, true, 1);
    let r = f.render();
    assert_eq!(r.marked, ["server 127.0.0.1:1"]);
    assert_eq!(r.kept, ["server 127.0.0.1:3"]);
}

#[test]
fn the_upstreams_own_max_ejected_applies_and_the_stricter_wins() {
    // max_ejected 50% of 3: one may be ejected; the guard alone would let two go.
    let f = fixture(3, "    max_ejected 50%;\n", guard(1));
    assert!(
        !f.render().text.contains("max_ejected"),
        "vigil's directive is not given to nginx"
    );
    f.probe(0, false, 2);
    f.probe(1, false, 3);
    let r = f.render();
    assert_eq!(r.marked, ["server 127.0.0.1:1"]);
    assert_eq!(r.kept, ["server 127.0.0.1:2"]);
    assert!(r
        .text
        .contains("(2 of 3 would be ejected, at most 1 may be)"));
    // Even fail-closed: the upstream's own rule still holds.
    let f = fixture(3, "    max_ejected 50%;\n", FAIL_CLOSED);
    for i in 0..3 {
        f.probe(i, false, 2);
    }
    assert_eq!(f.render().marked.len(), 1);
    assert_eq!(f.render().kept.len(), 2);
    // The guard is stricter than max_ejected 100%: --min-healthy 2 keeps two.
    let f = fixture(3, "    max_ejected 100%;\n", guard(2));
    for i in 0..3 {
        f.probe(i, false, 2);
    }
    assert_eq!(f.render().kept.len(), 2);
}

#[test]
fn admin_states_are_marked_with_their_cause_and_not_counted_in_service() {
    let f = fixture(3, "", guard(1));
    let up = f.registry.get("app").expect("app");
    up.set_admin(PeerId(0), AdminState::Down, Timestamp(1));
    up.set_admin(PeerId(1), AdminState::Drain, Timestamp(1));
    f.probe(2, false, 2);
    assert_eq!(
        f.lines(),
        [
            "server 127.0.0.1:1 down; # vigil: set down through the admin API",
            "server 127.0.0.1:2 down; # vigil: draining through the admin API (nginx has no drain)",
            // The one server in service is kept, though it fails.
            "server 127.0.0.1:3; # vigil: failing its checks, kept by max_ejected (1 of 1 would be ejected, at most 0 may be)",
        ]
    );
}

#[test]
fn a_recovering_server_comes_back_after_rise_and_source_down_stays() {
    let f = fixture(2, "    server 127.0.0.1:9 down;\n", guard(1));
    f.probe(0, false, 2);
    assert_eq!(f.render().marked, ["server 127.0.0.1:1"]);
    f.probe(0, true, 1);
    assert_eq!(f.render().marked, ["server 127.0.0.1:1"], "rise=2");
    f.probe(0, true, 1);
    assert!(f.render().marked.is_empty());
    assert!(f.render().text.contains("    server 127.0.0.1:9 down;\n"));
}

/// The guard counts a backup whose probes pass, as nginx sends it the
/// traffic: with one, every failing primary is marked down (nginx then
/// uses the backup); when the backup fails too, the least bad primary is
/// kept.
#[test]
fn a_healthy_backup_lets_every_failing_primary_be_marked() {
    let f = fixture_of(
        &["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3 backup"],
        "",
        guard(1),
    );
    f.probe(2, true, 2);
    f.probe(0, false, 2);
    f.probe(1, false, 2);
    assert_eq!(
        f.lines(),
        [
            format!("server 127.0.0.1:1{DOWN}"),
            format!("server 127.0.0.1:2{DOWN}"),
            "server 127.0.0.1:3 backup;".into(),
        ]
    );
    f.probe(2, false, 2);
    let kept = f.render().kept;
    assert_eq!(kept.len(), 1, "{:?}", f.lines());
    assert_eq!(
        f.render().marked.len(),
        2,
        "two of three down: {:?}",
        f.lines()
    );
}
