//! The lab against itself: the load driver straight at the backends, one
//! behaviour at a time, and the blackhole as the kernel really treats it.

use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::timeout;

use super::*;

fn load(b: &Backend, ms: u64) -> Load {
    let mut l = Load::new(b.addr(), Duration::from_millis(ms));
    l.clients = 2;
    l.rate = 100;
    l.timeout = Duration::from_millis(500);
    l
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_behaviour_is_what_the_client_sees() {
    let lab = Lab::start(1, BackendOptions::default()).await.unwrap();
    let b = &lab[0];

    let run = load(b, 200).run().await;
    let s = Summary::of(&run);
    assert!(s.total >= 10, "{s}");
    assert_eq!(
        (s.by_status.get(&200), s.failures),
        (Some(&s.total), 0),
        "{s}"
    );
    assert_eq!(s.by_backend.get(&0), Some(&s.total), "{s}");

    b.set(Behaviour::PartialBody).await.unwrap();
    let s = Summary::of(&load(b, 200).run().await);
    assert_eq!(s.cut_short, s.total, "{s}");

    b.set(Behaviour::Status503ForPost).await.unwrap();
    let run = load(b, 200).run().await;
    for r in &run.records {
        assert_eq!(r.status(), Some(if r.post { 503 } else { 200 }), "{r:?}");
    }

    b.set(Behaviour::Hang).await.unwrap();
    let s = Summary::of(&load(b, 100).run().await);
    assert_eq!(s.failed.get(&Failure::Timeout), Some(&s.total), "{s}");

    b.set(Behaviour::Refuse).await.unwrap();
    let s = Summary::of(&load(b, 100).run().await);
    assert_eq!(s.failed.get(&Failure::Connect), Some(&s.total), "{s}");

    b.set(Behaviour::Ok).await.unwrap();
    let s = Summary::of(&load(b, 100).run().await);
    assert_eq!(s.failures, 0, "the port is open again: {s}");

    // Every id the driver sent was delivered once; POSTs were counted.
    let c = b.counts();
    assert!(c.post > 0 && c.get > 0 && c.probes == 0, "{c:?}");
    assert_eq!(lab.ledger().repeats(), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_port_lets_a_connect_hang_until_its_timeout_then_recovers() {
    let lab = Lab::start(1, BackendOptions::default()).await.unwrap();
    let b = &lab[0];
    b.set(Behaviour::Blackhole).await.unwrap();
    // Longer than the first SYN retransmission (1 s): the retry is dropped too.
    let connect = timeout(Duration::from_millis(1500), TcpStream::connect(b.addr())).await;
    assert!(connect.is_err(), "the connect did not hang: {connect:?}");

    b.set(Behaviour::Ok).await.unwrap();
    let s = Summary::of(&load(b, 100).run().await);
    assert!(s.total > 0 && s.failures == 0, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_answers_after_its_delay() {
    let lab = Lab::start(1, BackendOptions::default()).await.unwrap();
    lab[0]
        .set(Behaviour::Slow(Duration::from_millis(300)))
        .await
        .unwrap();
    let s = Summary::of(&load(&lab[0], 100).run().await);
    assert!(s.total > 0 && s.failures == 0, "{s}");
    assert!(s.p50 >= Duration::from_millis(300), "{s}");
}
