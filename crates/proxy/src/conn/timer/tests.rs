use std::sync::atomic::AtomicUsize;

use super::*;

/// Live entries and heap items of this thread's wheel.
fn counts() -> (usize, usize) {
    let w = local_wheel().expect("a runtime");
    let inner = w.lock();
    (inner.used, inner.heap.len())
}

/// Poll once (registering it): still pending?
async fn pending(s: &mut Sleep) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *s).poll(cx).is_pending())).await
}

async fn fired_after(deadline: Instant) -> Duration {
    sleep_until(deadline).await;
    Instant::now() - deadline
}

#[tokio::test(start_paused = true)]
async fn a_sleep_fires_at_its_deadline_never_before() {
    let t0 = Instant::now();
    let late = fired_after(t0 + Duration::from_secs(1)).await;
    // Paused time: an isolated deadline fires exactly.
    assert_eq!(late, Duration::ZERO);
    assert_eq!(counts().0, 0, "the entry left the wheel when it fired");
}

#[tokio::test(start_paused = true)]
async fn many_timers_fire_in_order_within_the_resolution() {
    let t0 = Instant::now();
    let fired = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..500u64 {
        // Spread over 0..10 s, not in order.
        let at = t0 + Duration::from_millis((i * 7919) % 10_000 + 1);
        let fired = fired.clone();
        tasks.spawn(async move {
            sleep_until(at).await;
            fired.lock().unwrap().push((at, Instant::now()));
        });
    }
    while tasks.join_next().await.is_some() {}
    let fired = fired.lock().unwrap();
    assert_eq!(fired.len(), 500);
    for &(at, when) in fired.iter() {
        assert!(when >= at, "fired {:?} early", at - when);
        assert!(when - at <= LAZY, "fired {:?} late", when - at);
    }
    assert_eq!(counts(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_sleep_leaves_the_wheel_and_never_wakes() {
    let t0 = Instant::now();
    let polls = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..1000u64 {
        let polls = polls.clone();
        let mut s = sleep_until(t0 + Duration::from_secs(60 + i));
        tasks.push(tokio::spawn(async move {
            std::future::poll_fn(|cx| {
                polls.fetch_add(1, Ordering::Relaxed);
                Pin::new(&mut s).poll(cx)
            })
            .await
        }));
    }
    tokio::task::yield_now().await;
    while counts().0 < 1000 {
        tokio::task::yield_now().await;
    }
    let before = polls.load(Ordering::Relaxed);
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.unwrap_err().is_cancelled());
    }
    assert_eq!(counts().0, 0, "every entry left the wheel on drop");
    // The stale heap items go when the heap is compacted by new entries.
    for i in 0..100u64 {
        let mut s = sleep_until(t0 + Duration::from_secs(i + 1));
        assert!(pending(&mut s).await);
    }
    assert!(counts().1 < 1000, "the heap was compacted: {:?}", counts());
    tokio::time::sleep(Duration::from_secs(4000)).await;
    assert_eq!(
        polls.load(Ordering::Relaxed),
        before,
        "no dropped entry was woken"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_earlier_than_the_armed_sweep_moves_it() {
    let t0 = Instant::now();
    let mut far = sleep_until(t0 + Duration::from_secs(60));
    assert!(pending(&mut far).await);
    tokio::task::yield_now().await;
    let late = fired_after(t0 + Duration::from_secs(1)).await;
    assert_eq!(late, Duration::ZERO, "the sweep moved earlier");
    // One within LAZY before the armed sweep fires with it: late, never early.
    let mut armed = sleep_until(t0 + Duration::from_secs(2));
    assert!(pending(&mut armed).await);
    tokio::task::yield_now().await;
    let near = Instant::now() + Duration::from_secs(1) - LAZY / 2;
    let late = fired_after(near).await;
    assert!(late <= LAZY, "{late:?}");
    armed.await;
    far.await;
    assert_eq!(Instant::now(), t0 + Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn reset_moves_a_sleep_later_and_earlier_and_rearms_after_firing() {
    let t0 = Instant::now();
    let mut s = sleep_until(t0 + Duration::from_secs(1));
    assert!(pending(&mut s).await);
    s.reset(t0 + Duration::from_secs(5));
    (&mut s).await;
    assert_eq!(
        Instant::now(),
        t0 + Duration::from_secs(5),
        "later: fired at the new deadline"
    );
    s.reset(t0 + Duration::from_secs(8));
    assert!(pending(&mut s).await, "re-armed after firing");
    s.reset(t0 + Duration::from_secs(6));
    (&mut s).await;
    assert_eq!(
        Instant::now(),
        t0 + Duration::from_secs(6),
        "earlier: fired at the new deadline"
    );
    assert_eq!(s.deadline, t0 + Duration::from_secs(6));
}

#[tokio::test(start_paused = true)]
async fn timeout_at_passes_a_ready_future_without_registering_and_cuts_a_slow_one() {
    let t0 = Instant::now();
    let r = timeout_at(t0 + Duration::from_secs(1), async { 7 }).await;
    assert_eq!(r, Ok(7));
    assert_eq!(counts(), (0, 0), "a ready future registers nothing");
    let r = timeout(Duration::from_secs(1), std::future::pending::<()>()).await;
    assert_eq!(r, Err(Elapsed));
    assert_eq!(Instant::now(), t0 + Duration::from_secs(1));
    let r = timeout(
        Duration::from_secs(2),
        tokio::time::sleep(Duration::from_secs(1)),
    )
    .await;
    assert_eq!(r, Ok(()));
    assert_eq!(counts().0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_multi_thread_runtime_sleeps_fire_never_early() {
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..50u64 {
        let at = t0 + Duration::from_millis(20 + (i % 5) * 10);
        tasks.spawn(async move {
            let r = timeout_at(at, std::future::pending::<()>()).await;
            (r, at, Instant::now())
        });
    }
    while let Some(r) = tasks.join_next().await {
        let (r, at, when) = r.unwrap();
        assert_eq!(r, Err(Elapsed));
        assert!(when >= at, "fired {:?} early", at - when);
    }
}

#[test]
fn a_new_runtime_on_the_same_thread_gets_a_new_sweeper() {
    for _ in 0..2 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let t0 = Instant::now();
            sleep_until(t0 + Duration::from_secs(3)).await;
            assert_eq!(Instant::now(), t0 + Duration::from_secs(3));
        });
    }
}

#[tokio::test]
async fn a_timeout_holds_its_future_once() {
    let big = [7u8; 4096];
    let fut = async move {
        tokio::task::yield_now().await;
        big.len()
    };
    let size = std::mem::size_of_val(&fut);
    let t = timeout(Duration::from_secs(1), fut);
    assert!(
        std::mem::size_of_val(&t) < size + 128,
        "{} bytes around a {size}-byte future",
        std::mem::size_of_val(&t)
    );
    assert_eq!(t.await, Ok(4096));
}
