//! Pick + report cost: one `begin`, one `select`, and the guard's release
//! (a success), at 3, 100 and 1,000 peers, on one thread and on two
//! threads sharing the upstream.
//!
//! `cargo bench -p vigil-benches --bench pick`

// A benchmark times on the OS clock, not on tokio's.
#![allow(clippy::disallowed_types)]
#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use vigil_benches::upstream;
use vigil_core::config::Balancer;
use vigil_core::{Clock, RequestFacts, RetryPolicy, SelectKey, Upstream};
use vigil_net::SystemClock;

fn pick_report(up: &Arc<Upstream>, now: vigil_core::Timestamp, key: &[u8]) {
    let key = if key.is_empty() {
        SelectKey::None
    } else {
        SelectKey::Hash(key)
    };
    let mut sel = up.begin(key, RetryPolicy::default(), RequestFacts::default(), now);
    let g = up.select(&mut sel, now);
    black_box(&g);
}

fn balancers() -> Vec<(&'static str, Balancer, &'static [u8])> {
    vec![
        ("round_robin", Balancer::RoundRobin, b""),
        ("least_conn", Balancer::LeastConn, b""),
        (
            "chash",
            Balancer::Hash {
                key: "$request_uri".into(),
                consistent: true,
            },
            b"/some/path?id=42",
        ),
        ("random_two", Balancer::Random { two: true }, b""),
    ]
}

fn single_thread(c: &mut Criterion) {
    let clock = SystemClock::new();
    let mut g = c.benchmark_group("pick_report/1thread");
    for (name, b, key) in balancers() {
        for n in [3usize, 100, 1000] {
            let up = upstream(n, b.clone());
            g.bench_with_input(BenchmarkId::new(name, n), &n, |bch, _| {
                bch.iter(|| pick_report(&up, clock.now(), key))
            });
        }
    }
    g.finish();
}

fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("pick_report/2threads");
    for (name, b, key) in balancers() {
        for n in [3usize, 100, 1000] {
            let up = upstream(n, b.clone());
            g.bench_with_input(BenchmarkId::new(name, n), &n, |bch, _| {
                // Time per operation with two threads hammering one upstream:
                // wall time of both threads doing `iters` each, over `iters`.
                bch.iter_custom(|iters| {
                    let barrier = Arc::new(Barrier::new(2));
                    let start = Instant::now();
                    std::thread::scope(|s| {
                        for _ in 0..2 {
                            let (up, barrier) = (up.clone(), barrier.clone());
                            s.spawn(move || {
                                let clock = SystemClock::new();
                                barrier.wait();
                                for _ in 0..iters {
                                    pick_report(&up, clock.now(), key);
                                }
                            });
                        }
                    });
                    let d = start.elapsed();
                    Duration::from_nanos((d.as_nanos() / 2) as u64)
                })
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1)).sample_size(20);
    targets = single_thread, two_threads
}
criterion_main!(benches);
