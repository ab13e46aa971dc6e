//! Writes under the fleet's prefix from someone who is not a member (or
//! writes in a member's name that it would never make), put with
//! `etcdctl` (Debian's etcd-client; missing, the tests fail): what a
//! member believes of them (crates/fleet/src/trust.rs, docs/fleet.md
//! "Trust model"). The real members still probe their targets, a stopped
//! backend still goes down, forged failures mark nothing down and a forged
//! ejection halves no weight for ever.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::support::{
    distinct, http_get, probed_at_least, settle, wait_for, Backends, Etcd, Etcdctl, How, Member,
};

const YEAR_MS: u64 = 365 * 86_400_000;

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Target address -> its id, as member `m` shows it.
fn ids(m: &Member) -> HashMap<String, String> {
    let v = m.fleet().unwrap_or_default();
    v["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let id = t["id"].as_str()?;
            Some((id.split('-').nth(1)?.to_string(), id.to_string()))
        })
        .collect()
}

fn ignored(m: &Member) -> u64 {
    m.fleet()
        .and_then(|v| v["ignored_writes"].as_u64())
        .unwrap_or(0)
}

/// A failing probe result, as a member would publish it.
fn failure(at_unix_ms: u64) -> String {
    format!(
        r#"{{"ok":false,"phase":"status","detail":"HTTP 500 (forged)","latency_ms":1,"at_unix_ms":{at_unix_ms}}}"#
    )
}

#[test]
fn lease_less_members_and_forged_results_take_no_target_mark_nothing_down_and_a_stopped_backend_still_goes_down(
) {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let ctl = Etcdctl::new(&etcd);
    let b = Backends::start(6);
    let members: Vec<Member> = (1..=2)
        .map(|i| Member::start(dir.path(), &format!("hx-m{i}"), "hx", &etcd.url(), 1, &b))
        .collect();
    settle(&members, 2);
    let root = "/vigil/fleet/hx/";
    let owners = members[0].owners();
    let ids = ids(&members[0]);
    let addr = |i: usize| b.addrs[i].to_string();
    let owner = |i: usize| owners[&addr(i)][0].clone();
    let other = |name: &str| {
        members
            .iter()
            .map(|m| m.name.clone())
            .find(|n| n != name)
            .expect("two members")
    };
    let lease = |name: &str| ctl.lease_of(&format!("{root}members/{name}"));
    wait_for(
        "every member to route to every peer",
        Duration::from_secs(10),
        || {
            members
                .iter()
                .all(|m| b.addrs.iter().all(|a| m.peer_state(*a) == "eligible"))
        },
    );

    let changes = |m: &Member| {
        let log = std::fs::read_to_string(&m.log).unwrap_or_default();
        log.matches("fleet: member list changed").count()
    };
    let changes_before: Vec<usize> = members.iter().map(changes).collect();

    // Ignored by every member unless named for it (a member skips what
    // is written in its own name): (key, value, lease, named for).
    let now = unix_ms();
    let mut writes: Vec<(String, String, Option<String>, Option<String>)> = Vec::new();
    // Four lease-less member keys, each twice: if they counted, they would
    // own about two targets in three, which nobody would probe.
    let ghost = r#"{"joined_unix_ms":1,"pid":1,"version":"0"}"#;
    for g in 1..=4 {
        for _ in 0..2 {
            let key = format!("{root}members/ghost-{g}");
            writes.push((key, ghost.into(), None, None));
        }
    }
    // Failures of backend 0 from no member; of backend 1 from the member
    // that does not own it, under its real lease; of backend 2 in its
    // owner's name without its lease; of backend 3 under its owner's lease
    // but from a year ahead. fall=2: three would take each down.
    let (not_owner, owner2, owner3) = (other(&owner(1)), owner(2), owner(3));
    for _ in 0..3 {
        let result = |member: &str, i: usize| format!("{root}results/{member}/{}", ids[&addr(i)]);
        writes.push((result("intruder", 0), failure(now), None, None));
        writes.push((
            result(&not_owner, 1),
            failure(now),
            Some(lease(&not_owner)),
            Some(not_owner.clone()),
        ));
        writes.push((result(&owner2, 2), failure(now), None, Some(owner2.clone())));
        writes.push((
            result(&owner3, 3),
            failure(now + YEAR_MS),
            Some(lease(&owner3)),
            Some(owner3.clone()),
        ));
    }
    // And a value that is no member's, in the name of backend 4's owner.
    let owner4 = owner(4);
    let key4 = format!("{root}results/{owner4}/{}", ids[&addr(4)]);
    writes.push((key4, "not json".into(), None, Some(owner4)));
    for (key, value, lease, _) in &writes {
        ctl.put(key, value, lease.as_deref());
    }
    // Every write reached every member and was not believed.
    for m in &members {
        let expected = writes
            .iter()
            .filter(|w| w.3.as_deref() != Some(m.name.as_str()))
            .count() as u64;
        wait_for(
            &format!("{} to ignore {expected} writes", m.name),
            Duration::from_secs(10),
            || ignored(m) >= expected,
        );
    }
    for (m, before) in members.iter().zip(changes_before) {
        assert_eq!(
            m.members(),
            ["hx-m1", "hx-m2"],
            "{}: no ghost counts",
            m.name
        );
        assert_eq!(changes(m), before, "{}: ghosts changed no list", m.name);
        for (a, o) in m.owners() {
            assert!(
                o.iter().all(|o| o.starts_with("hx-m")),
                "{}: {a} is owned by {o:?}",
                m.name
            );
        }
        for i in 0..4 {
            assert_eq!(
                m.peer_state(b.addrs[i]),
                "eligible",
                "{}: forged failures of {} took nothing down",
                m.name,
                b.addrs[i]
            );
        }
        let log = std::fs::read_to_string(&m.log).unwrap_or_default();
        assert!(!log.contains("(forged)"), "{}: {log}", m.name);
        // Put twice, logged once.
        let lines = log
            .lines()
            .filter(|l| {
                l.contains("fleet: ignored a write under the fleet's prefix")
                    && l.contains(&format!("{root}members/ghost-1\""))
            })
            .count();
        assert_eq!(lines, 1, "{}: {log}", m.name);
    }
    // The real members still probe every target, each its own.
    b.clear_probes();
    probed_at_least(&b, 3, Duration::from_secs(20));
    for i in 0..b.addrs.len() {
        let seen = distinct(&b.probers(i));
        assert_eq!(
            seen,
            distinct(&[owner(i)]),
            "{}: probed by its owner only",
            b.addrs[i]
        );
    }
    // A stopped backend goes down everywhere.
    b.stopped[5].store(true, Ordering::SeqCst);
    wait_for(
        "every member to take the stopped backend out",
        Duration::from_secs(10),
        || {
            members
                .iter()
                .all(|m| m.peer_state(b.addrs[5]) == "probe_down")
        },
    );
    for m in &members {
        let (status, _) = http_get(m.listen, "/").expect("answer");
        assert_eq!(status, 200, "{} serves", m.name);
    }
}

#[test]
fn a_forged_ejection_halves_no_weight_for_ever() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let ctl = Etcdctl::new(&etcd);
    let b = Backends::start(2);
    // No check: an ejection halves the peer's weight at the other member,
    // for at most this member's own fail_timeout (3 s).
    let how = How {
        no_check: true,
        share_passive: true,
        server_params: "weight=4 max_fails=1 fail_timeout=3s",
        ..How::default()
    };
    let members: Vec<Member> = ["hh-a", "hh-b"]
        .iter()
        .map(|n| Member::start_with(dir.path(), n, "hh", &etcd.url(), &b, &how))
        .collect();
    settle(&members, 2);
    let (a, other) = (&members[0], &members[1]);
    let root = "/vigil/fleet/hh/";
    let peer = b.addrs[0].to_string();
    let key = |member: &str| {
        format!(
            "{root}passive/{member}/{}",
            vigil_fleet::wire::peer_id("u", &peer)
        )
    };
    let lease_a = ctl.lease_of(&format!("{root}members/hh-a"));
    let ejection = |at: u64, penalty_ms: u64| {
        format!(r#"{{"upstream":"u","peer":"{peer}","at_unix_ms":{at},"penalty_ms":{penalty_ms}}}"#)
    };
    let now = unix_ms();
    // From no member; in A's name without its lease; under A's lease from
    // a year ahead (its penalty would end in a year and a half).
    ctl.put(&key("intruder"), &ejection(now, YEAR_MS), None);
    ctl.put(&key("hh-a"), &ejection(now, YEAR_MS), None);
    ctl.put(
        &key("hh-a"),
        &ejection(now + YEAR_MS, YEAR_MS / 2),
        Some(&lease_a),
    );
    wait_for("B to ignore the three", Duration::from_secs(10), || {
        ignored(other) >= 3
    });
    let p = other.peer(b.addrs[0]);
    assert_eq!(p["weight_now"], 4, "B halved nothing: {p}");
    assert!(p.get("halved_by").is_none(), "{p}");
    // Under A's lease, now, for a year: believed (lease ids are readable:
    // this is what etcd's auth is for), but capped at B's own fail_timeout.
    let at = unix_ms();
    ctl.put(&key("hh-a"), &ejection(at, YEAR_MS), Some(&lease_a));
    wait_for("B to halve the peer", Duration::from_secs(10), || {
        other.peer(b.addrs[0])["halved_by"] == "hh-a"
    });
    let p = other.peer(b.addrs[0]);
    assert_eq!(p["weight_now"], 2, "{p}");
    let until = p["halved_until_unix_ms"].as_u64().expect("until");
    assert!(
        until <= at + 3_000 + 1_000,
        "halved until {until}, more than B's fail_timeout (3 s) after {at}: {p}"
    );
    // And it comes back.
    wait_for("B's weight to recover", Duration::from_secs(15), || {
        let p = other.peer(b.addrs[0]);
        p["weight_now"] == 4 && p.get("halved_by").is_none()
    });
    assert!(a.peer(b.addrs[0]).get("halved_by").is_none());
}
