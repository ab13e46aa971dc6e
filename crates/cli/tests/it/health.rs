//! Issue 9's load scenarios, `vigil serve` beside stock nginx on the same
//! nginx.conf (nginx without the vigil-only directives, which it refuses),
//! run at the same time on separate backends of the fault lab
//! (`vigil_benches::lab`): 4 backends, `max_fails=1 fail_timeout=2s`,
//! connect/read timeouts 1s, 16 keep-alive clients at 560 req/s, half of
//! them POSTs. Only counts are asserted, never latencies.

use std::time::Duration;

use tokio::time::{sleep_until, Instant};
use vigil_benches::lab::{
    free_addr, BackendOptions, Behaviour, Kind, Lab, Load, Proxy, Run, Site, Summary,
};

const SERVER: &str = "max_fails=1 fail_timeout=2s";
const TIMEOUTS: &str = "proxy_connect_timeout 1s; proxy_read_timeout 1s;";
/// The active check of the partial-body case: every 500 ms, one failure
/// takes a peer down, one pass brings it back.
const CHECK: &str = "check interval=500 rise=1 fall=1 timeout=400 type=http; \
                     check_http_send \"GET / HTTP/1.0\\r\\n\\r\\n\";";

/// What one proxy's run came to.
struct Seen {
    run: Run,
    lab: Lab,
}

/// Start the lab and `kind` on `site` (`upstream_extra` is dropped for
/// nginx), wait until every backend answered through it, then send `secs`
/// of load while `schedule` switches backends at offsets from the start.
async fn scenario(
    kind: Kind,
    site: impl Fn(Vec<std::net::SocketAddr>) -> Site,
    secs: u64,
    schedule: &[(u64, usize, Behaviour)],
) -> Seen {
    let lab = Lab::start(4, BackendOptions::default())
        .await
        .expect("start the backends");
    let mut site = site(lab.addrs());
    site.listen = free_addr();
    let proxy = match kind {
        Kind::Vigil => Proxy::vigil(env!("CARGO_BIN_EXE_vigil").as_ref(), &site).await,
        Kind::Nginx => Proxy::nginx(&site).await,
    }
    .expect("start the proxy");
    lab.wait_serving(proxy.addr)
        .await
        .unwrap_or_else(|e| panic!("{kind:?}: {e}\n{}", proxy.log()));
    let mut load = Load::new(proxy.addr, Duration::from_secs(secs));
    load.rate = 560;
    let start = Instant::now();
    let running = tokio::spawn(async move { load.run().await });
    for &(at_ms, backend, b) in schedule {
        // The scenario's clock, not a wait for a condition.
        sleep_until(start + Duration::from_millis(at_ms)).await;
        lab[backend].set(b).await.expect("switch the backend");
    }
    let run = running.await.expect("the load task");
    drop(proxy);
    Seen { run, lab }
}

fn site(upstream_extra: &str, location: &str) -> impl Fn(Vec<std::net::SocketAddr>) -> Site {
    let (extra, location) = (upstream_extra.to_string(), location.to_string());
    move |servers| Site {
        server_params: SERVER.to_string(),
        upstream_extra: extra.clone(),
        location: location.clone(),
        ..Site::new(free_addr(), servers)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_cuts_its_bodies_costs_a_handful_of_responses_not_its_share() {
    // Backend 1 sends `200` + half its body then resets, from 1 s to 6 s.
    let schedule = [(1000, 1, Behaviour::PartialBody), (6000, 1, Behaviour::Ok)];
    let extra = format!("passive_count after_header; passive_recovery probe; {CHECK}");
    let (vigil, nginx) = tokio::join!(
        scenario(Kind::Vigil, site(&extra, TIMEOUTS), 7, &schedule),
        scenario(Kind::Nginx, site(&extra, TIMEOUTS), 7, &schedule),
    );
    let (v, n) = (Summary::of(&vigil.run), Summary::of(&nginx.run));
    eprintln!("vigil: {v}\nnginx: {n}");
    let cuts: Vec<Duration> = vigil
        .run
        .records
        .iter()
        .filter(|r| r.cut_short())
        .map(|r| r.start)
        .collect();
    eprintln!("vigil: cut responses sent at {cuts:?}");
    eprintln!(
        "backend 1 probes: vigil {}, nginx {}",
        vigil.lab[1].counts().probes,
        nginx.lab[1].counts().probes
    );
    // nginx never charges a failure after the header: backend 1 keeps its
    // quarter and every response it gives for 5 s is cut (~700).
    assert!(n.cut_short > 50, "nginx: {n}");
    // vigil charges the first cut when the reset comes and excludes the
    // peer for 2 s; under `probe` it comes back only through a probe. One
    // exclusion costs the cut that causes it plus the requests picked for
    // the peer before that reset was read (16 clients over 4 round-robin
    // peers: at most 4 in flight to it; 1 to 3 seen): at most 5, the
    // issue's "handful".
    // The recovery probe reads the framed body, so it fails too while the
    // peer cuts: one exclusion for the whole fault, and the peer returns
    // only after the fault, through a probe that got a whole body.
    // The active check (every 500 ms, `fall=1`) may see the fault before
    // any request is picked for the peer (one pick every ~7 ms): then the
    // exclusion costs no cut at all.
    let per = bursts(&cuts);
    eprintln!("vigil: cut responses per exclusion {per:?}");
    assert!(
        cuts.len() <= 5 && per.len() <= 1,
        "vigil: {v}, cuts at {cuts:?} ({per:?} per exclusion)"
    );
    // Either way the peer was out for the fault: it served far less than
    // its quarter (about 2 s of 7 against the others' whole run).
    let served = |b: usize| v.by_backend.get(&b).copied().unwrap_or(0);
    assert!(served(1) * 2 < served(0), "vigil: {v}");
    // Nothing else failed: the other three peers took the load.
    assert_eq!(v.failures, v.cut_short, "vigil: {v}");
    // The scenario ran: the load reached the peers on both sides.
    assert!(v.total > 2000 && n.total > 2000, "vigil: {v}\nnginx: {n}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_answering_503_to_posts_gets_one_post_per_exclusion() {
    // Backend 1 answers 503 to every POST for the whole 6 s run.
    let schedule = [(0, 1, Behaviour::Status503ForPost)];
    let location = format!("{TIMEOUTS} proxy_next_upstream error timeout http_503;");
    let (vigil, nginx) = tokio::join!(
        scenario(
            Kind::Vigil,
            site("passive_count last_try;", &location),
            6,
            &schedule
        ),
        scenario(
            Kind::Nginx,
            site("passive_count last_try;", &location),
            6,
            &schedule
        ),
    );
    let (v, n) = (Summary::of(&vigil.run), Summary::of(&nginx.run));
    let posts = |s: &Seen| {
        s.lab[1]
            .deliveries()
            .iter()
            .filter(|d| d.post)
            .map(|d| d.at)
            .collect::<Vec<_>>()
    };
    let (vp, np) = (posts(&vigil), posts(&nginx));
    eprintln!("vigil: {v}\nnginx: {n}\nvigil: backend 1 got POSTs at {vp:?}");
    // A POST is never retried (non-idempotent), on either side: each 503
    // the backend gave reached the client, and no id came twice.
    for s in [&vigil, &nginx] {
        assert_eq!(s.lab.ledger().repeats().1, 0);
    }
    assert_eq!(
        v.by_status.get(&503).copied().unwrap_or(0),
        vp.len(),
        "vigil: {v}"
    );
    assert_eq!(
        n.by_status.get(&503).copied().unwrap_or(0),
        np.len(),
        "nginx: {n}"
    );
    // nginx counts a 503 it cannot retry as a success: the peer keeps its
    // quarter of the POSTs (~420 in 6 s).
    assert!(np.len() > 50, "nginx: backend 1 got {} POSTs", np.len());
    // vigil (`last_try`) excludes the peer at its first 503 for 2 s; after
    // the window one trial request tests it (nginx's rule), a GET passes,
    // and the next POST excludes it again: one exclusion per window, so at
    // most 3 bursts of POSTs in 6 s, 2 s apart. A burst is that first POST
    // plus the POSTs picked for the peer before its 503 was read (16
    // clients over 4 round-robin peers: at most 4 in all).
    let bursts = bursts(&vp);
    eprintln!("vigil: POSTs per exclusion {bursts:?}");
    assert!(
        (1..=3).contains(&bursts.len()) && bursts.iter().all(|n| *n <= 4),
        "vigil: backend 1 got POSTs at {vp:?}"
    );
}

/// Sizes of the groups of `times` (sorted) separated by more than 1 s: the
/// deliveries of one exclusion window are milliseconds apart, windows are
/// 2 s apart.
fn bursts(times: &[Duration]) -> Vec<usize> {
    let mut sorted = times.to_vec();
    sorted.sort();
    let mut out: Vec<usize> = Vec::new();
    let mut last: Option<Duration> = None;
    for t in sorted {
        match (last, out.last_mut()) {
            (Some(l), Some(n)) if t - l <= Duration::from_secs(1) => *n += 1,
            _ => out.push(1),
        }
        last = Some(t);
    }
    out
}
