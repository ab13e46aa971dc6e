//! `vigil explain`'s sentences for upstreams read from nginx.conf text:
//! the rules as written, why a peer gets traffic or not, with its causes
//! and times (core's `api::explain` on a registry the front end built).

use std::sync::Arc;
use std::time::Duration;

use vigil_config::{literal_resolver, nginx};
use vigil_core::api;
use vigil_core::event::EventBus;
use vigil_core::registry::Registry;
use vigil_core::{
    Clock, FailureClass, ManualClock, RequestFacts, RetryPolicy, SelectKey, TransportFailure,
};

fn setup(conf: &str) -> (Registry, Arc<ManualClock>, Arc<EventBus>) {
    let loaded =
        nginx::load_str(conf, "t.conf".as_ref(), ".".as_ref(), &literal_resolver).expect("conf");
    let clock = Arc::new(ManualClock::at(12 * 3_600_000 + 67_000));
    let bus = Arc::new(EventBus::default());
    let reg = Registry::build(&loaded.config, None, bus.clone(), clock.clone());
    (reg, clock, bus)
}

#[test]
fn retry_budget_and_hedge_are_explained_with_tokens_and_denials() {
    let (reg, clock, _) = setup(
        "http { upstream u { server 10.0.0.1:80; server 10.0.0.2:80;
             retry_budget ratio=50% min=0/s; hedge after=40ms max=2; } }",
    );
    let up = reg.get("u").expect("u").clone();
    let now = clock.now();
    // Two requests: one token; one failure retried, the next denied.
    let fail = TransportFailure {
        class: FailureClass::Error,
        request_sent: true,
        cached_connection: false,
    };
    for _ in 0..2 {
        let mut sel = up.begin(
            SelectKey::None,
            RetryPolicy::default(),
            RequestFacts::default(),
            now,
        );
        let g = up.select(&mut sel, now).expect("a peer");
        let _ = sel.on_failure(g, fail, now);
    }
    let view = api::upstream_view(&up, &*clock, now);
    let b = view.rules.retry_budget.as_ref().expect("budget view");
    assert_eq!((b.requests, b.retries, b.denied), (2, 1, 1));
    assert_eq!(b.tokens, 0.0);
    let text = api::explain_rules(&view).join("\n");
    assert!(
        text.contains("u: retry_budget ratio=50% min=0/s: retries and hedges may not exceed 50% of the requests of the last 10 s plus 0 a second; 0.0 token(s) now (2 requests and 1 paid retries in the last 10 s); 1 denied so far"),
        "{text}"
    );
    assert!(
        text.contains("u: hedge after=40ms max=2: an idempotent request"),
        "{text}"
    );
    assert!(
        text.contains("each takes a token of retry_budget"),
        "{text}"
    );
    let json = serde_json::to_string(&view.rules).expect("json");
    assert!(
        json.contains("\"hedge\":{\"after\":\"40ms\",\"max\":2,\"after_now_ms\":40.0}"),
        "{json}"
    );
}

#[test]
fn an_excluded_peer_is_explained_with_its_cause_and_times() {
    let (reg, clock, bus) = setup("upstream api { server 10.0.0.1:80; server 10.0.0.2:8080; }");
    let up = reg.get("api").expect("api").clone();
    // 10.0.0.2 answers 503 with http_503 listed: one failure at 12:01:07.
    let p = RetryPolicy {
        next_upstream: vigil_core::NextUpstream::nginx_default().with(FailureClass::Http503),
        ..RetryPolicy::default()
    };
    let now = clock.now();
    let mut sel = up.begin(SelectKey::None, p, RequestFacts::default(), now);
    let g = up.select(&mut sel, now).expect("a");
    drop(g);
    let mut sel = up.begin(SelectKey::None, p, RequestFacts::default(), now);
    let g = up.select(&mut sel, now).expect("b");
    assert_eq!(&**g.peer().name(), "10.0.0.2:8080");
    let _ = sel.on_status(g, 503, now);
    let _ = TransportFailure {
        class: FailureClass::Error,
        request_sent: true,
        cached_connection: false,
    };
    clock.advance(Duration::from_secs(1));
    let doc = api::status(&reg, &*clock);
    let events: Vec<_> = bus
        .since(0, 100)
        .events
        .iter()
        .map(api::event_view)
        .collect();
    let upv = &doc.upstreams[0];
    let text = api::explain(upv, &upv.peers[1], &events).join(" ");
    assert!(
        text.contains("10.0.0.2:8080 gets no traffic: 1 failure(s) (last: http_503 at 12:01:07) reached max_fails=1; excluded until 12:01:17 (fail_timeout=10s); after that one request will test it"),
        "{text}"
    );
    let healthy = api::explain(upv, &upv.peers[0], &events).join(" ");
    assert!(healthy.contains("10.0.0.1:80 is eligible; with weight 1 of 1 it is picked about once every 1 request(s)"), "{healthy}");
}

#[test]
fn a_fleet_halving_is_explained_with_the_member_and_the_end() {
    let (reg, clock, bus) = setup(
        "upstream api { server 10.0.0.1:80 weight=5; server 10.0.0.2:80; }
         upstream h { hash $uri; server 10.0.0.1:80 weight=4; server 10.0.0.2:80; }",
    );
    let now = clock.now();
    for name in ["api", "h"] {
        let up = reg.get(name).expect("upstream").clone();
        assert!(up.halve_weight(
            vigil_core::peer::PeerId(0),
            now.after(Duration::from_secs(3)),
            "b",
            now
        ));
    }
    let doc = api::status(&reg, &*clock);
    let upv = &doc.upstreams[0];
    let p = &upv.peers[0];
    assert_eq!(
        (p.weight, p.weight_now, p.halved_by.as_deref()),
        (5, 2, Some("b"))
    );
    let text = api::explain(upv, p, &[]).join(" ");
    assert!(
        text.contains("10.0.0.1:80 is eligible; weight 5 → 2 until 12:01:10: fleet member b ejected it on its traffic (share_passive; no active check here to probe it)"),
        "{text}"
    );
    let h = &doc.upstreams[1];
    let text = api::explain(h, &h.peers[0], &[]).join(" ");
    assert!(text.contains("the key picks under this method"), "{text}");
    let json = serde_json::to_string(p).expect("json");
    assert!(json.contains("\"halved_by\":\"b\""), "{json}");
    let events: Vec<_> = bus
        .since(0, 10)
        .events
        .iter()
        .map(|e| e.kind.to_string())
        .collect();
    assert_eq!(events[0], "weight halved by fleet member b: 5 → 2 for 3000 ms (member b ejected it on its traffic; no active check here to probe it)");
    clock.advance(Duration::from_secs(3));
    let doc = api::status(&reg, &*clock);
    let p = &doc.upstreams[0].peers[0];
    assert_eq!((p.weight_now, p.halved_until_unix_ms), (5, None), "over");
}

#[test]
fn single_backup_and_admin_rules_are_named() {
    let (reg, clock, _bus) = setup(
        "upstream one { server 10.0.0.1:80; }
         upstream two { server 10.0.0.1:80; server 10.0.0.2:80; server 10.0.0.3:80 backup; }",
    );
    let doc = api::status(&reg, &*clock);
    let one = &doc.upstreams[0];
    assert!(api::explain(one, &one.peers[0], &[])
        .join(" ")
        .contains("nginx's single-server rule applies"));
    let two_up = reg.get("two").expect("two");
    two_up.set_admin(
        vigil_core::peer::PeerId(1),
        vigil_core::peer::AdminState::Drain,
        clock.now(),
    );
    let doc = api::status(&reg, &*clock);
    let two = &doc.upstreams[1];
    let drain = api::explain(two, &two.peers[1], &[]).join(" ");
    assert!(
        drain.contains("set it to drain at 12:01:07")
            && drain.contains("vigil peer up two 10.0.0.2:80"),
        "{drain}"
    );
    let backup = api::explain(two, &two.peers[2], &[]).join(" ");
    assert!(backup.contains("is a backup: it gets traffic only when no primary server is eligible (now 1 of 2 primaries are)"), "{backup}");
    assert!(
        !backup.contains("10.0.0.3:80 is eligible"),
        "a backup behind live primaries gets no traffic"
    );
}

/// Requests (the other peers answer) until `addr` took one, which fails
/// or succeeds.
fn hit(up: &Arc<vigil_core::Upstream>, now: vigil_core::Timestamp, addr: &str, fail: bool) {
    for _ in 0..10 {
        let mut sel = up.begin(
            SelectKey::None,
            RetryPolicy::default(),
            RequestFacts::default(),
            now,
        );
        let Ok(g) = up.select(&mut sel, now) else {
            continue;
        };
        if &**g.peer().name() == addr {
            if fail {
                let f = TransportFailure {
                    class: FailureClass::Error,
                    request_sent: true,
                    cached_connection: false,
                };
                let _ = sel.on_failure(g, f, now);
            }
            return;
        }
    }
    panic!("{addr} never picked");
}

fn sentences(
    reg: &Registry,
    clock: &ManualClock,
    bus: &EventBus,
    up: usize,
    peer: usize,
) -> String {
    let doc = api::status(reg, clock);
    let events: Vec<_> = bus
        .since(0, 100)
        .events
        .iter()
        .map(api::event_view)
        .collect();
    let upv = &doc.upstreams[up];
    api::explain(upv, &upv.peers[peer], &events).join(" ")
}

#[test]
fn penalty_probe_recovery_and_max_ejected_are_explained() {
    let (reg, clock, bus) = setup(
        "upstream api {
            server 10.0.0.1:80; server 10.0.0.2:80;
            check interval=3000 rise=1 fall=3 timeout=1000 default_down=false;
            passive_recovery probe;
            passive_penalty base=2s max=8s;
            max_ejected 50%;
        }",
    );
    let up = reg.get("api").expect("api").clone();
    hit(&up, clock.now(), "10.0.0.2:80", true);
    let text = sentences(&reg, &clock, &bus, 0, 1);
    assert!(
        text.contains("10.0.0.2:80 gets no traffic: 1 failure(s) (last: error at 12:01:07) reached max_fails=1; excluded until 12:01:09 (exclusion 1 in a row, 2s (passive_penalty base=2s max=8s)); after that it stays out until an active probe passes"),
        "{text}"
    );
    clock.advance(Duration::from_millis(2_001));
    let text = sentences(&reg, &clock, &bus, 0, 1);
    assert!(
        text.contains("its exclusion ended at 12:01:09 and under passive_recovery probe it returns only when an active probe passes; no client request is spent testing it"),
        "{text}"
    );
    // The other one fails too: max_ejected keeps the one that failed last.
    hit(&up, clock.now(), "10.0.0.1:80", true);
    let text = sentences(&reg, &clock, &bus, 0, 0);
    assert!(
        text.contains("10.0.0.1:80 would be ejected (excluded: 1/1 failures) but max_ejected 50% keeps it eligible: 2 of the 2 primaries in service would be ejected and at most 1 may be"),
        "{text}"
    );
    let doc = api::status(&reg, &*clock);
    let json = serde_json::to_string(&doc.upstreams[0]).expect("json");
    for field in [
        "\"passive_recovery\":\"probe\"",
        "\"max_ejected\":{\"percent\":50,\"in_service\":2,\"ejected\":2,\"allowed\":1}",
        "\"state\":\"awaiting_probe\"",
        "\"waived\":[{\"rule\":\"excluded\"",
    ] {
        assert!(json.contains(field), "{field} in {json}");
    }
}

#[test]
fn probation_and_slow_start_are_explained() {
    let (reg, clock, bus) = setup(
        "upstream app {
            server 10.0.0.1:80 weight=10 slow_start=30s; server 10.0.0.2:80;
            passive_recovery probation=2;
        }",
    );
    let up = reg.get("app").expect("app").clone();
    hit(&up, clock.now(), "10.0.0.1:80", true);
    clock.advance(Duration::from_millis(10_001));
    let text = sentences(&reg, &clock, &bus, 0, 0);
    assert!(
        text.contains("10.0.0.1:80 is eligible; it is on probation (passive_recovery probation=2): one request at a time until 2 succeed in a row (0 so far)"),
        "{text}"
    );
    hit(&up, clock.now(), "10.0.0.1:80", false);
    hit(&up, clock.now(), "10.0.0.1:80", false);
    let text = sentences(&reg, &clock, &bus, 0, 0);
    assert!(
        text.contains("10.0.0.1:80 is eligible; slow start: its weight is 1 of 10 now, rising until 12:01:47 (slow_start=30s)"),
        "{text}"
    );
    let kinds: Vec<String> = bus
        .since(0, 100)
        .events
        .iter()
        .map(|e| e.kind.name().to_string())
        .collect();
    assert_eq!(
        kinds,
        vec![
            "excluded",
            "probation_started",
            "probation_passed",
            "slow_start"
        ]
    );
}

#[test]
fn a_ramping_peer_is_explained_with_its_weight_now() {
    let (reg, clock, bus) = setup(
        "upstream app { server 10.0.0.1:80 weight=10 slow_start=20s; server 10.0.0.2:80 weight=10; }",
    );
    let up = reg.get("app").expect("app").clone();
    up.set_admin(
        vigil_core::peer::PeerId(0),
        vigil_core::peer::AdminState::Down,
        clock.now(),
    );
    up.set_admin(
        vigil_core::peer::PeerId(0),
        vigil_core::peer::AdminState::Up,
        clock.now(),
    );
    clock.advance(Duration::from_secs(10));
    let text = sentences(&reg, &clock, &bus, 0, 0);
    assert!(
        text.contains("10.0.0.1:80 is eligible; slow start: its weight is 5 of 10 now, rising until 12:01:27 (slow_start=20s); with weight 5 of 15 it is picked about once every 3 request(s)"),
        "{text}"
    );
}
