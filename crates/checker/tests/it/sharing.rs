//! The fleet's hook into the scheduler ([`vigil_checker::Sharing`]): a
//! target this instance does not own is not probed here, an owned one is
//! and its results are handed over, and a result probed elsewhere goes
//! through the same rise/fall as a local one.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vigil_checker::probe::{FailureKind, ProbeFuture};
use vigil_checker::{Checker, CheckerOptions, ProbeFailure, Prober, Sharing, Target};
use vigil_core::event::EventKind;
use vigil_core::health::{ProbePhase, ProbeReport};

use crate::support::registry;

/// Owns the targets whose address is listed; remembers what it heard.
#[derive(Debug, Default)]
struct Owner {
    owned: Mutex<HashSet<String>>,
    heard: Mutex<Vec<(String, bool)>>,
}

impl Sharing for Owner {
    fn owns(&self, id: &str) -> bool {
        self.owned
            .lock()
            .expect("test step")
            .iter()
            .any(|a| id.contains(a.as_str()))
    }
    fn probed(&self, id: &str, report: &ProbeReport) {
        self.heard
            .lock()
            .expect("test step")
            .push((id.to_string(), report.ok));
    }
}

/// Fails every probe; counts them per address.
#[derive(Default)]
struct Failing(Mutex<Vec<std::net::SocketAddr>>);

impl Prober for Failing {
    fn probe<'a>(&'a self, target: &'a Target) -> ProbeFuture<'a> {
        Box::pin(async move {
            self.0.lock().expect("test step").push(target.addr);
            Err(ProbeFailure::new(
                ProbePhase::Connect,
                FailureKind::Refused,
                "refused",
            ))
        })
    }
}

fn start(
    conf: &str,
    owner: &Arc<Owner>,
) -> (
    Arc<vigil_core::registry::Registry>,
    Arc<vigil_core::event::EventBus>,
    Checker,
    Arc<Failing>,
) {
    let (r, events, clock) = registry(conf);
    let sharing: Arc<dyn Sharing> = owner.clone();
    let prober = Arc::new(Failing::default());
    let c = Checker::with_prober(
        r.clone(),
        clock,
        CheckerOptions {
            seed: Some(3),
            sharing: Some(sharing),
            ..CheckerOptions::default()
        },
        prober.clone(),
    )
    .expect("checker");
    (r, events, c, prober)
}

#[tokio::test(start_paused = true)]
async fn only_owned_targets_are_probed_and_their_results_handed_over() {
    let (pa, pb) = (9001, 9002);
    let owner = Arc::new(Owner::default());
    owner
        .owned
        .lock()
        .expect("test step")
        .insert(format!("127.0.0.1:{pa}-"));
    let conf = format!(
        "upstream u {{ server 127.0.0.1:{pa}; server 127.0.0.1:{pb}; check interval=1000 rise=1 fall=1 timeout=500; }}"
    );
    let (_r, _e, c, prober) = start(&conf, &owner);
    let mut ids: Vec<String> = c.target_keys().iter().map(|k| k.id()).collect();
    ids.sort();
    assert_eq!(ids.len(), 2);
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    let heard = owner.heard.lock().expect("test step").clone();
    assert!(!heard.is_empty(), "the owned target was probed");
    assert!(
        heard
            .iter()
            .all(|(id, ok)| id.contains(&format!("127.0.0.1:{pa}-")) && !ok),
        "only the owned target was probed: {heard:?}"
    );
    let probed = prober.0.lock().expect("test step").clone();
    assert!(probed.len() >= 5, "one probe an interval: {probed:?}");
    assert!(
        probed.iter().all(|a| a.port() == pa),
        "the other target is not probed here: {probed:?}"
    );
    assert_eq!(heard.len(), probed.len());
}

#[tokio::test(start_paused = true)]
async fn a_remote_result_goes_through_rise_and_fall_and_says_who_probed() {
    let owner = Arc::new(Owner::default()); // owns nothing: never probes
    let (r, events, c, prober) = start(
        "upstream u { server 127.0.0.1:9001; check interval=1000 rise=2 fall=2 timeout=500 default_down=false; }",
        &owner,
    );
    let id = c.target_keys()[0].id();
    let fail = |n: u64| ProbeReport {
        ok: false,
        phase: Some(ProbePhase::Status),
        latency: Duration::from_millis(2),
        detail: "HTTP 500 (probed by member b)".into(),
        at: vigil_core::clock::Timestamp(n),
    };
    let peer = |r: &vigil_core::registry::Registry| r.get("u").expect("u").peers()[0].is_routable();
    assert!(peer(&r));
    assert!(c.record_remote(&id, fail(10)));
    assert!(peer(&r), "fall=2: one failure keeps it up");
    assert!(c.record_remote(&id, fail(20)));
    assert!(!peer(&r), "the second remote failure takes it down");
    assert!(!c.record_remote("tcp-10.0.0.1:1-00000000", fail(30)));
    let downs: Vec<String> = events
        .since(0, 10)
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ProbeDown { streak, detail } => Some(format!("{streak} {detail}")),
            _ => None,
        })
        .collect();
    assert_eq!(
        downs,
        vec!["2 status: HTTP 500 (probed by member b) (2 ms)"]
    );
    tokio::time::sleep(Duration::from_millis(5_000)).await;
    assert!(
        owner.heard.lock().expect("test step").is_empty(),
        "nothing probed here"
    );
    assert!(prober.0.lock().expect("test step").is_empty());
}

#[tokio::test(start_paused = true)]
async fn probe_now_probes_a_target_not_owned_once_and_target_of_names_it() {
    let owner = Arc::new(Owner::default()); // owns nothing
    let (_r, _e, c, prober) = start(
        "upstream u { server 127.0.0.1:9001; server 127.0.0.1:9002; check interval=1000 rise=1 fall=1 timeout=500; }",
        &owner,
    );
    let id = c.target_of("u", "127.0.0.1:9002").expect("a checked peer");
    assert!(id.contains("127.0.0.1:9002-"), "{id}");
    assert_eq!(c.target_of("u", "127.0.0.1:9999"), None);
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert!(prober.0.lock().expect("test step").is_empty());
    assert!(c.probe_now(&id));
    assert!(!c.probe_now("tcp-10.0.0.1:1-00000000"));
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let probed = prober.0.lock().expect("test step").clone();
    assert_eq!(
        probed.len(),
        1,
        "one probe, then the schedule again: {probed:?}"
    );
    assert_eq!(probed[0].port(), 9002);
}
