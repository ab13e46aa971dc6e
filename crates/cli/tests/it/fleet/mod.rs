//! Fleet mode with a real etcd (`/usr/bin/etcd`, started here on 127.0.0.1
//! with a temporary data dir), real `vigil serve` processes and real
//! backends that tell which process probed them (the probe's socket is
//! looked up in /proc, so a count at the backend is a count per member).
//!
//! The four scenarios of issue 14: each target probed by exactly R
//! members; a failing backend leaves every member's rotation; a killed
//! member's targets are probed again by the others; with etcd stopped
//! every member probes everything and serves, and rejoins when it is back.

mod check;
mod hostile;
mod support;

use std::collections::{BTreeSet, HashMap};
use std::process::{Child, Command};
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use support::{
    distinct, fleet_of, http_get, probed_at_least, settle, wait_for, Backends, Etcd, How, Member,
    INTERVAL_MS,
};

// === the scenarios ===

#[test]
fn with_three_members_and_30_targets_each_target_is_probed_by_exactly_r_members() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(30);
    // Two fleets on one etcd (their keys are apart by name): R=1 and R=2.
    let one = fleet_of(dir.path(), "r1", &etcd.url(), 1, &b);
    let two = fleet_of(dir.path(), "r2", &etcd.url(), 2, &b);
    b.clear_probes();
    probed_at_least(&b, 9, Duration::from_secs(30));
    let owners1 = one[0].owners();
    let owners2 = two[0].owners();
    let mut load = HashMap::<String, usize>::new();
    for (i, addr) in b.addrs.iter().enumerate() {
        let seen = distinct(&b.probers(i));
        assert!(
            !seen.contains("?"),
            "{addr}: a probe from an unknown process: {seen:?}"
        );
        let r1: BTreeSet<String> = seen
            .iter()
            .filter(|m| m.starts_with("r1-"))
            .cloned()
            .collect();
        let r2: BTreeSet<String> = seen
            .iter()
            .filter(|m| m.starts_with("r2-"))
            .cloned()
            .collect();
        assert_eq!(r1.len(), 1, "{addr}: fleet r1 (R=1) probers {r1:?}");
        assert_eq!(r2.len(), 2, "{addr}: fleet r2 (R=2) probers {r2:?}");
        assert_eq!(
            r1,
            distinct(&owners1[&addr.to_string()]),
            "{addr}: r1's prober is its owner"
        );
        assert_eq!(
            r2,
            distinct(&owners2[&addr.to_string()]),
            "{addr}: r2's probers are its owners"
        );
        for m in r1 {
            *load.entry(m).or_default() += 1;
        }
    }
    // Every member of r1 takes a share (rendezvous spreads 30 over 3).
    assert_eq!(load.len(), 3, "targets per member in r1: {load:?}");
    eprintln!("targets per member (R=1): {load:?}");
}

#[test]
fn a_failing_backend_leaves_every_members_rotation_after_the_deciding_probe() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(3);
    let members = fleet_of(dir.path(), "f", &etcd.url(), 1, &b);
    let bad = b.addrs[1];
    let owner = members[0].owners()[&bad.to_string()][0].clone();
    wait_for(
        "every member to route to every peer",
        Duration::from_secs(10),
        || {
            members
                .iter()
                .all(|m| b.addrs.iter().all(|a| m.peer_state(*a) == "eligible"))
        },
    );
    b.failing[1].store(true, Ordering::SeqCst);
    let failed_at = Instant::now();
    // fall=2: the owner's second failing probe decides; the others follow
    // from its published results.
    wait_for(
        "every member to take the failing peer out",
        Duration::from_secs(10),
        || members.iter().all(|m| m.peer_state(bad) == "probe_down"),
    );
    eprintln!(
        "all three members had {bad} down {:?} after it started failing (interval {INTERVAL_MS} ms, fall=2)",
        failed_at.elapsed()
    );
    let before = b.traffic[1].load(Ordering::SeqCst);
    for m in &members {
        for _ in 0..12 {
            let (status, _) = http_get(m.listen, "/").expect("answer");
            assert_eq!(status, 200, "{}: served by a healthy backend", m.name);
        }
    }
    assert_eq!(
        b.traffic[1].load(Ordering::SeqCst),
        before,
        "no member sent it traffic"
    );
    for m in members.iter().filter(|m| m.name != owner) {
        let text = m.explain(bad);
        assert!(
            text.contains(&format!("probed by member {owner}")),
            "{}: explain names the member that probed: {text}",
            m.name
        );
    }
}

#[test]
fn a_killed_members_targets_are_probed_again_within_ttl_and_interval() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(12);
    let mut members = fleet_of(dir.path(), "k", &etcd.url(), 1, &b);
    let owners = members[0].owners();
    let owned_by = |name: &str| -> Vec<usize> {
        (0..b.addrs.len())
            .filter(|i| owners[&b.addrs[*i].to_string()] == [name.to_string()])
            .collect()
    };
    // The victim is whichever of members 1 and 2 owns more targets (one of
    // three may own none of 12: (2/3)^12); the other leaves with SIGTERM.
    let (v, leaver) = if owned_by(&members[1].name).len() > owned_by(&members[2].name).len() {
        (1, 2)
    } else {
        (2, 1)
    };
    let victim = members[v].name.clone();
    let orphans = owned_by(&victim);
    assert!(
        !orphans.is_empty(),
        "{victim} owns some of the 12 targets: {owners:?}"
    );
    members[v].kill();
    let killed_at = Instant::now();
    b.clear_probes();
    // TTL 2s + interval 0.3s, plus etcd's lease check: bounded at 15s.
    wait_for(
        "the orphaned targets to be probed by a survivor",
        Duration::from_secs(15),
        || {
            orphans
                .iter()
                .all(|i| b.probers(*i).iter().any(|m| m != &victim && m != "?"))
        },
    );
    eprintln!(
        "{} orphaned targets probed again {:?} after {victim} was killed (TTL 2s, interval {INTERVAL_MS} ms)",
        orphans.len(),
        killed_at.elapsed()
    );
    settle(&members, 2);
    assert!(members[0].members().iter().all(|m| *m != victim));
    // A member stopped with SIGTERM leaves: it revokes its lease.
    let pid = members[leaver]
        .child
        .as_ref()
        .map(Child::id)
        .expect("running");
    let status = Command::new("kill")
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(status.success());
    if let Some(mut c) = members[leaver].child.take() {
        let _ = c.wait();
    }
    let log = std::fs::read_to_string(&members[leaver].log).unwrap_or_default();
    assert!(log.contains("fleet: left (lease revoked"), "{log}");
    settle(&members, 1);
    // The last member probes every target, once an interval.
    b.clear_probes();
    probed_at_least(&b, 4, Duration::from_secs(20));
    for i in 0..b.addrs.len() {
        let seen = distinct(&b.probers(i));
        assert_eq!(seen.len(), 1, "{}: probers {seen:?}", b.addrs[i]);
    }
}

#[test]
fn with_etcd_stopped_every_member_probes_on_its_own_and_serves_then_rejoins() {
    let dir = tempfile::tempdir().expect("test step");
    let mut etcd = Etcd::start();
    let b = Backends::start(6);
    let members = fleet_of(dir.path(), "d", &etcd.url(), 1, &b);
    etcd.stop();
    wait_for(
        "every member to notice etcd is gone",
        Duration::from_secs(15),
        || members.iter().all(|m| m.state() == "degraded"),
    );
    b.clear_probes();
    wait_for(
        "every member to probe every target itself",
        Duration::from_secs(15),
        || (0..b.addrs.len()).all(|i| distinct(&b.probers(i)).len() == 3),
    );
    for m in &members {
        for _ in 0..6 {
            let (status, _) = http_get(m.listen, "/").expect("answer");
            assert_eq!(status, 200, "{} serves without etcd", m.name);
        }
        let log = std::fs::read_to_string(&m.log).unwrap_or_default();
        assert!(
            log.contains("etcd unreachable or slow; probing every target here"),
            "{}: {log}",
            m.name
        );
    }
    etcd.restart();
    settle(&members, 3);
    for m in &members {
        let v = m.fleet().expect("test step");
        let history: Vec<&str> = v["history"]
            .as_array()
            .expect("test step")
            .iter()
            .filter_map(|h| h["state"].as_str())
            .collect();
        assert_eq!(history, ["joined", "degraded", "joined"], "{}", m.name);
        // The same changes are events (`vigil events`), degraded as a warning.
        let (_, body) = http_get(m.admin, "/api/events?limit=1000").expect("events");
        let v: serde_json::Value = serde_json::from_str(&body).expect("events json");
        let fleet: Vec<String> = v["events"]
            .as_array()
            .expect("test step")
            .iter()
            .filter(|e| e["kind"] == "fleet")
            .filter_map(|e| e["text"].as_str().map(str::to_string))
            .collect();
        let states: Vec<&str> = fleet
            .iter()
            .filter_map(|t| t.strip_prefix("fleet: "))
            .filter_map(|t| t.split(' ').next())
            .collect();
        assert_eq!(
            states,
            ["joined", "degraded", "joined"],
            "{}: {fleet:?}",
            m.name
        );
    }
    b.clear_probes();
    probed_at_least(&b, 4, Duration::from_secs(20));
    for i in 0..b.addrs.len() {
        let seen = distinct(&b.probers(i));
        assert_eq!(
            seen.len(),
            1,
            "{}: sharded again after the rejoin: {seen:?}",
            b.addrs[i]
        );
    }
}

/// The probe load at the backends with 1, 3 and 10 members, in a fleet
/// (R=1) and as plain instances. What is asserted is who probes: in the
/// fleet each target by exactly one member, plain by every instance. The
/// rates it prints are the figures of docs/fleet.md (`cargo test -p vigil
/// --features fleet --test it fleet::probe_load -- --nocapture`).
#[test]
fn probe_load_at_1_3_and_10_members() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(30);
    // 1 s, not the tests' 300 ms: ten processes on two cores must not
    // saturate the machine, or the figures measure the CPU, not the fleet.
    let interval_ms = 1000;
    // Probes per target to count over: the rate is taken over the time
    // they take.
    let rounds = 4;
    for n in [1, 3, 10] {
        for in_fleet in [false, true] {
            let fleet = format!("load{n}{}", if in_fleet { "f" } else { "p" });
            let url = if in_fleet { etcd.url() } else { String::new() };
            let members: Vec<Member> = (1..=n)
                .map(|i| {
                    let how = How {
                        interval_ms,
                        ..How::default()
                    };
                    Member::start_with(dir.path(), &format!("{fleet}-m{i}"), &fleet, &url, &b, &how)
                })
                .collect();
            if in_fleet {
                settle(&members, n);
            } else {
                // Every instance past its start round and probing (the
                // probes of the phase before do not count).
                b.clear_probes();
                wait_for(
                    "every instance to probe every target",
                    Duration::from_secs(20),
                    || {
                        (0..b.addrs.len()).all(|i| {
                            distinct(&b.probers(i))
                                .iter()
                                .filter(|m| m.starts_with(&fleet))
                                .count()
                                == n
                        })
                    },
                );
            }
            b.clear_probes();
            let start = Instant::now();
            let expected_per_round = if in_fleet { 1 } else { n };
            probed_at_least(&b, rounds * expected_per_round, Duration::from_secs(30));
            let total: usize = (0..b.addrs.len()).map(|i| b.probers(i).len()).sum();
            let unknown: usize = (0..b.addrs.len())
                .map(|i| b.probers(i).iter().filter(|m| *m == "?").count())
                .sum();
            let per_s = total as f64 / start.elapsed().as_secs_f64();
            let max_probers = (0..b.addrs.len())
                .map(|i| distinct(&b.probers(i)).len())
                .max()
                .unwrap_or(0);
            eprintln!(
                "members={n:>2} {:<6} 30 targets, interval {interval_ms} ms: {per_s:7.1} probes/s at the backends ({:.2} per target per interval), at most {max_probers} prober(s) per target, {unknown} probe(s) of no known member",
                if in_fleet { "fleet" } else { "plain" },
                per_s / 30.0 * interval_ms as f64 / 1000.0,
            );
            // Known members only: a probe whose sender could not be told
            // ("?") says nothing about who probes.
            let probers: Vec<usize> = (0..b.addrs.len())
                .map(|i| distinct(&b.probers(i)).iter().filter(|m| *m != "?").count())
                .collect();
            let expected = if in_fleet { 1 } else { n };
            assert!(
                probers.iter().all(|&p| p == expected),
                "{n} members, in a fleet: {in_fleet}: distinct probers per target {probers:?}, expected {expected} each"
            );
            drop(members);
        }
    }
}

#[test]
fn with_share_passive_a_peer_one_member_ejects_is_probed_by_the_others_not_ejected() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(3);
    // A long interval: a probe a member does not own is a probe asked for.
    let how = How {
        interval_ms: 60_000,
        share_passive: true,
        server_params: "max_fails=1 fail_timeout=30s",
        ..How::default()
    };
    let members: Vec<Member> = (1..=3)
        .map(|i| Member::start_with(dir.path(), &format!("p-m{i}"), "p", &etcd.url(), &b, &how))
        .collect();
    settle(&members, 3);
    let bad = b.addrs[0];
    let owner = members[0].owners()[&bad.to_string()][0].clone();
    let mut others = members.iter().filter(|m| m.name != owner);
    let (ejector, bystander) = (
        others.next().expect("test step"),
        others.next().expect("test step"),
    );
    wait_for(
        "the start round to bring every peer up",
        Duration::from_secs(10),
        || {
            members
                .iter()
                .all(|m| b.addrs.iter().all(|a| m.peer_state(*a) == "eligible"))
        },
    );
    b.clear_probes();
    b.broken[0].store(true, Ordering::SeqCst);
    // The ejector's traffic meets the broken peer (round robin over 3).
    wait_for(
        "the ejector to exclude the peer",
        Duration::from_secs(10),
        || {
            let _ = http_get(ejector.listen, "/");
            ejector.peer_state(bad) == "excluded"
        },
    );
    wait_for(
        "the bystander to probe the ejected peer at once",
        Duration::from_secs(10),
        || b.probers(0).contains(&bystander.name),
    );
    let log = std::fs::read_to_string(&bystander.log).unwrap_or_default();
    assert!(
        log.contains(&format!(
            "fleet: member {} ejected upstream u server {bad} on its traffic; probing it here now",
            ejector.name
        )),
        "{log}"
    );
    // Its probe passed (only traffic is broken): the others keep the peer.
    let owner = members.iter().find(|m| m.name == owner).expect("test step");
    for m in [bystander, owner] {
        assert_eq!(
            m.peer_state(bad),
            "eligible",
            "{} did not eject it blindly",
            m.name
        );
    }
}

#[test]
fn a_frozen_etcd_is_a_slow_one_every_member_probes_on_its_own_until_it_answers() {
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(6);
    let members = fleet_of(dir.path(), "s", &etcd.url(), 1, &b);
    // SIGSTOP: connections stay open, nothing answers (no error to see).
    etcd.signal("STOP");
    wait_for(
        "every member to call etcd slow",
        Duration::from_secs(15),
        || {
            members.iter().all(|m| {
                // Why: a timeout, the client's or vigil's own bound.
                m.fleet().is_some_and(|v| {
                    v["state"] == "degraded" && v["reason"].as_str().is_some_and(|r| !r.is_empty())
                })
            })
        },
    );
    b.clear_probes();
    wait_for(
        "every member to probe every target itself",
        Duration::from_secs(15),
        || (0..b.addrs.len()).all(|i| distinct(&b.probers(i)).len() == 3),
    );
    etcd.signal("CONT");
    settle(&members, 3);
}

#[test]
fn over_tls_with_a_client_certificate_a_member_joins_and_without_one_it_serves_degraded() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let dir = tempfile::tempdir().expect("test step");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("key")).expect("ca");
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("test step");
        p
    };
    let leaf = |names: Vec<String>| {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(names)
            .expect("params")
            .signed_by(&key, &ca)
            .expect("cert");
        (cert.pem(), key.serialize_pem())
    };
    let ca_pem = write("ca.pem", ca.pem());
    let (c, k) = leaf(vec!["127.0.0.1".into(), "localhost".into()]);
    let (srv_cert, srv_key) = (write("etcd.pem", c), write("etcd.key", k));
    let (c, k) = leaf(vec!["vigil".into()]);
    let (cli_cert, cli_key) = (write("vigil.pem", c), write("vigil.key", k));
    let etcd = Etcd::start_tls(srv_cert, srv_key, ca_pem.clone());
    let b = Backends::start(2);
    let arg = |flag: &str, p: &std::path::Path| format!("--{flag}={}", p.display());
    let with_cert = How {
        extra: vec![
            arg("fleet-etcd-ca", &ca_pem),
            arg("fleet-etcd-cert", &cli_cert),
            arg("fleet-etcd-key", &cli_key),
        ],
        ..How::default()
    };
    let good = Member::start_with(dir.path(), "t-m1", "t", &etcd.url(), &b, &with_cert);
    wait_for(
        "the member with a certificate to join",
        Duration::from_secs(15),
        || good.state() == "joined" && good.members() == ["t-m1"],
    );
    let without = How {
        extra: vec![arg("fleet-etcd-ca", &ca_pem)],
        ..How::default()
    };
    let bad = Member::start_with(dir.path(), "t-m2", "t", &etcd.url(), &b, &without);
    wait_for(
        "the member without a certificate to be refused",
        Duration::from_secs(15),
        || bad.state() == "degraded",
    );
    assert_eq!(good.members(), ["t-m1"], "the refused member never joined");
    let (status, _) = http_get(bad.listen, "/").expect("answer");
    assert_eq!(status, 200, "traffic does not depend on etcd");
}

/// Requests sent to `m`, and how many of them each backend saw.
fn shares(m: &Member, b: &Backends, n: usize) -> Vec<usize> {
    let before: Vec<usize> = b.traffic.iter().map(|t| t.load(Ordering::SeqCst)).collect();
    for _ in 0..n {
        let (status, _) = http_get(m.listen, "/").expect("answer");
        assert_eq!(status, 200, "{} serves", m.name);
    }
    b.traffic
        .iter()
        .zip(before)
        .map(|(t, was)| t.load(Ordering::SeqCst) - was)
        .collect()
}

#[test]
fn with_share_passive_a_peer_without_a_check_one_member_ejects_has_its_weight_halved_by_the_other()
{
    let dir = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(2);
    // No check: passive accounting only. fail_timeout is the penalty the
    // other member halves the weight for; 60 s outlasts the test.
    let how = How {
        no_check: true,
        share_passive: true,
        server_params: "weight=4 max_fails=1 fail_timeout=60s",
        ..How::default()
    };
    let members: Vec<Member> = ["hw-a", "hw-b"]
        .iter()
        .map(|n| Member::start_with(dir.path(), n, "hw", &etcd.url(), &b, &how))
        .collect();
    settle(&members, 2);
    let (a, other) = (&members[0], &members[1]);
    let bad = b.addrs[0];
    // Before: B splits its traffic evenly (smooth round robin, 4 and 4).
    let even = shares(other, &b, 60);
    assert_eq!(even, [30, 30], "B's split before");
    // Only A's traffic meets the broken backend: it is broken while A alone
    // is sent requests.
    b.broken[0].store(true, Ordering::SeqCst);
    wait_for("A to exclude the peer", Duration::from_secs(10), || {
        let _ = http_get(a.listen, "/");
        a.peer_state(bad) == "excluded"
    });
    b.broken[0].store(false, Ordering::SeqCst);
    wait_for(
        "B to halve the peer's weight",
        Duration::from_secs(10),
        || other.peer(bad)["halved_by"] == "hw-a",
    );
    let p = other.peer(bad);
    assert_eq!(
        (&p["state"], &p["weight"], &p["weight_now"]),
        (&"eligible".into(), &4.into(), &2.into()),
        "B keeps it, at half its weight: {p}"
    );
    assert!(p["halved_until_unix_ms"].as_u64().is_some(), "{p}");
    let text = other.explain(bad);
    assert!(
        text.contains("weight 4 → 2 until")
            && text.contains("fleet member hw-a ejected it on its traffic"),
        "B's explain says why: {text}"
    );
    let (_, body) = http_get(other.admin, "/api/events?limit=1000").expect("events");
    assert!(body.contains("\"weight_halved\""), "B's events: {body}");
    // B's share to it drops from 4 in 8 to 2 in 6.
    let halved = shares(other, &b, 120);
    assert!(
        (36..=44).contains(&halved[0]) && halved[0] + halved[1] == 120,
        "B's split while halved: {halved:?} (a third of 120 expected, half before)"
    );
    eprintln!("B's split over 60 requests before: {even:?}; over 120 while halved: {halved:?}");
    // A keeps nginx's own exclusion, and halves nothing itself.
    let pa = a.peer(bad);
    assert_eq!(pa["state"], "excluded", "{pa}");
    assert!(pa.get("halved_by").is_none(), "{pa}");
}
