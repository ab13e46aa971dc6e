//! Issue 10's fault scenario: 4 local backends under ≥ 500 req/s from 16
//! keep-alive clients while, one phase after another, backend 0 hangs
//! (reads requests, never answers), backend 1 is blackholed (SYNs dropped)
//! and backend 2 answers after 300 ms; run against stock nginx and against
//! `vigil serve` on the same nginx.conf, once per `--extra` (directives
//! added inside `upstream {}` for vigil only). A load run, not a test.
//!
//! ```text
//! cargo build --release -p vigil -p vigil-benches --bins
//! target/release/faults [--vigil PATH] [--extra DIRECTIVES]... [--no-nginx] [--no-vigil]
//!     [--clients 16] [--rate 640] [--phase 5] [--post-every 2] [--keepalive N]
//!     [--server-params "max_fails=1 fail_timeout=2s"]
//!     [--location "proxy_connect_timeout 1s; proxy_read_timeout 1s;"]
//! e.g. --extra "" --extra 'health_preset recommended; check interval=500 rise=1 fall=1 timeout=400 type=http; check_http_send "GET / HTTP/1.0\r\n\r\n";'
//! ```
//!
//! For each proxy it prints: requests slower than 900 ms, failed requests
//! by cause, the slow peer's share while slow, duplicate POST deliveries
//! and retries the backends saw (the same request id delivered again),
//! per phase and in all.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tokio::time::{sleep_until, Instant};
use vigil_benches::lab::{
    free_addr, BackendOptions, Behaviour, Failure, Lab, Load, Outcome, Proxy, Run, Site, Summary,
};

const USAGE: &str = "\
faults: issue 10's fault scenario (hang, blackhole, 300 ms) against nginx and vigil serve

usage: faults [OPTIONS]
  --vigil PATH            the vigil binary (default: `vigil` beside this one)
  --extra DIRECTIVES      directives added inside upstream {} for one vigil run;
                          repeat for several runs (default: one run with none)
  --no-nginx              skip stock nginx
  --no-vigil              skip vigil
  --clients N             keep-alive client connections (16)
  --rate N                requests per second, all clients (640)
  --phase SECS            length of each fault phase (5)
  --post-every N          one request in N is a POST (2)
  --keepalive N           `keepalive N;` in the upstream (default: none, nginx's default)
  --server-params S       parameters of every server line (\"max_fails=1 fail_timeout=2s\")
  --location S            directives beside proxy_pass
                          (\"proxy_connect_timeout 1s; proxy_read_timeout 1s;\")
  -h, --help              this text

schedule: 2 s warm-up; backend 0 hangs; backend 1 blackholed; backend 2 answers
after 300 ms; 2 s all well (each fault one phase, the backend well again after it).
";

/// Parsed options.
struct Options {
    vigil: PathBuf,
    extras: Vec<String>,
    nginx: bool,
    run_vigil: bool,
    clients: usize,
    rate: u32,
    phase: Duration,
    post_every: u32,
    keepalive: Option<u32>,
    server_params: String,
    location: String,
}

/// One fault phase: from, to, backend, behaviour, name.
struct Phase {
    from: Duration,
    to: Duration,
    backend: usize,
    behaviour: Behaviour,
    name: &'static str,
}

fn main() -> ExitCode {
    let opts = match parse(std::env::args().skip(1).collect()) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("faults: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("faults: cannot start a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run_all(&opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("faults: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse(args: Vec<String>) -> Result<Option<Options>, String> {
    let mut o = Options {
        vigil: std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("vigil")))
            .unwrap_or_else(|| PathBuf::from("vigil")),
        extras: Vec::new(),
        nginx: true,
        run_vigil: true,
        clients: 16,
        rate: 640,
        phase: Duration::from_secs(5),
        post_every: 2,
        keepalive: None,
        server_params: "max_fails=1 fail_timeout=2s".to_string(),
        location: "proxy_connect_timeout 1s; proxy_read_timeout 1s;".to_string(),
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--vigil" => o.vigil = PathBuf::from(value("--vigil")?),
            "--extra" => o.extras.push(value("--extra")?),
            "--no-nginx" => o.nginx = false,
            "--no-vigil" => o.run_vigil = false,
            "--clients" => o.clients = number(&value("--clients")?, "--clients")?,
            "--rate" => o.rate = number(&value("--rate")?, "--rate")?,
            "--phase" => o.phase = Duration::from_secs(number(&value("--phase")?, "--phase")?),
            "--post-every" => o.post_every = number(&value("--post-every")?, "--post-every")?,
            "--keepalive" => o.keepalive = Some(number(&value("--keepalive")?, "--keepalive")?),
            "--server-params" => o.server_params = value("--server-params")?,
            "--location" => o.location = value("--location")?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if o.extras.is_empty() {
        o.extras.push(String::new());
    }
    if o.clients == 0 || o.rate == 0 || o.phase.is_zero() {
        return Err("--clients, --rate and --phase must be above 0".to_string());
    }
    Ok(Some(o))
}

fn number<T: std::str::FromStr>(s: &str, name: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{name}: {s:?} is not a number"))
}

fn schedule(phase: Duration) -> (Vec<Phase>, Duration) {
    let warm = Duration::from_secs(2);
    let faults = [
        (0, Behaviour::Hang, "b0 hangs"),
        (1, Behaviour::Blackhole, "b1 blackholed"),
        (2, Behaviour::Slow(Duration::from_millis(300)), "b2 300 ms"),
    ];
    let phases = faults
        .iter()
        .enumerate()
        .map(|(i, &(backend, behaviour, name))| Phase {
            from: warm + phase * i as u32,
            to: warm + phase * (i as u32 + 1),
            backend,
            behaviour,
            name,
        })
        .collect();
    (phases, warm + phase * 3 + Duration::from_secs(2))
}

async fn run_all(o: &Options) -> Result<(), String> {
    let mut rows = Vec::new();
    if o.nginx {
        rows.push(("nginx".to_string(), scenario(o, None).await?));
    }
    if o.run_vigil {
        for extra in &o.extras {
            let name = if extra.is_empty() {
                "vigil".to_string()
            } else {
                format!("vigil + {extra}")
            };
            rows.push((name, scenario(o, Some(extra)).await?));
        }
    }
    println!(
        "\n== side by side ({} clients, {} req/s target, phases of {} s)",
        o.clients,
        o.rate,
        o.phase.as_secs()
    );
    println!(
        "{:>8} {:>8} {:>8} {:>10} {:>9} {:>9}  proxy",
        "requests", "slow>900", "failed", "slow-share", "dup-POST", "retries"
    );
    for (name, r) in &rows {
        println!(
            "{:>8} {:>8} {:>8} {:>9.1}% {:>9} {:>9}  {name}",
            r.all.total,
            r.all.slow,
            r.all.failures,
            r.slow_share * 100.0,
            r.repeats.1,
            r.repeats.0 + r.repeats.1,
        );
    }
    Ok(())
}

/// The figures of one proxy's run.
struct Figures {
    all: Summary,
    slow_share: f64,
    /// Deliveries beyond the first per id: (GETs, POSTs).
    repeats: (usize, usize),
}

/// One run: `extra` is `None` for nginx, the upstream's extra directives
/// for vigil.
async fn scenario(o: &Options, extra: Option<&str>) -> Result<Figures, String> {
    let lab = Lab::start(4, BackendOptions::default())
        .await
        .map_err(|e| format!("starting the backends: {e}"))?;
    let mut upstream_extra = extra.unwrap_or("").to_string();
    if let Some(k) = o.keepalive {
        upstream_extra = format!("keepalive {k}; {upstream_extra}");
    }
    let location = if o.keepalive.is_some() {
        format!(
            "{} proxy_http_version 1.1; proxy_set_header Connection \"\";",
            o.location
        )
    } else {
        o.location.clone()
    };
    let site = Site {
        server_params: o.server_params.clone(),
        upstream_extra,
        location,
        ..Site::new(free_addr(), lab.addrs())
    };
    let site = if extra.is_none() {
        // nginx: the vigil-only directives dropped, keepalive kept.
        Site {
            upstream_extra: o
                .keepalive
                .map(|k| format!("keepalive {k};"))
                .unwrap_or_default(),
            ..site
        }
    } else {
        site
    };
    let proxy = match extra {
        None => Proxy::nginx(&site).await,
        Some(_) => Proxy::vigil(&o.vigil, &site).await,
    }
    .map_err(|e| e.to_string())?;
    let label = match extra {
        None => "nginx".to_string(),
        Some("") => "vigil".to_string(),
        Some(e) => format!("vigil + {e}"),
    };
    lab.wait_serving(proxy.addr)
        .await
        .map_err(|e| format!("{label}: {e}\n{}", proxy.log()))?;

    let (phases, total) = schedule(o.phase);
    let mut load = Load::new(proxy.addr, total);
    load.clients = o.clients;
    load.rate = o.rate;
    load.post_every = o.post_every;
    let start = Instant::now();
    let running = tokio::spawn(async move { load.run().await });
    for p in &phases {
        sleep_until(start + p.from).await;
        lab[p.backend]
            .set(p.behaviour)
            .await
            .map_err(|e| e.to_string())?;
        sleep_until(start + p.to).await;
        lab[p.backend]
            .set(Behaviour::Ok)
            .await
            .map_err(|e| e.to_string())?;
    }
    let run = running.await.map_err(|e| format!("the load task: {e}"))?;
    let repeats = lab.ledger().repeats();
    let log = proxy.log();
    drop(proxy);

    println!("\n== {label}");
    let all = Summary::of(&run);
    println!("all          {all}");
    print_causes("", &run);
    let mut slow_share = 0.0;
    for p in &phases {
        let s = Summary::of(&run.between(p.from, p.to));
        println!(
            "{:<13} b{} served {:.1}%; {s}",
            p.name,
            p.backend,
            s.share(p.backend) * 100.0
        );
        print_causes("  ", &run.between(p.from, p.to));
        if matches!(p.behaviour, Behaviour::Slow(_)) {
            slow_share = s.share(p.backend);
        }
    }
    println!(
        "backends saw {} GET retries, {} duplicate POST deliveries; per backend (GET/POST/probes): {}",
        repeats.0,
        repeats.1,
        lab.backends()
            .iter()
            .map(|b| {
                let c = b.counts();
                format!("b{} {}/{}/{}", b.index(), c.get, c.post, c.probes)
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    let warnings = log.lines().filter(|l| !l.trim().is_empty()).count();
    if warnings > 0 {
        println!(
            "proxy log: {warnings} lines (last: {})",
            log.lines().last().unwrap_or("")
        );
    }
    Ok(Figures {
        all,
        slow_share,
        repeats,
    })
}

/// Failures of `run` by cause: status, transport failure, cut short.
fn print_causes(indent: &str, run: &Run) {
    let mut causes: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    for r in run.records.iter().filter(|r| r.failed()) {
        let cause = match (r.status(), r.outcome) {
            (Some(s), _) if r.cut_short() => format!("{s} cut short"),
            (Some(s), _) => s.to_string(),
            (None, Outcome::Failed(f)) => failure(f).to_string(),
            (None, _) => "?".to_string(),
        };
        let e = causes.entry(cause).or_default();
        if r.post {
            e.1 += 1;
        } else {
            e.0 += 1;
        }
    }
    if causes.is_empty() {
        return;
    }
    let text: Vec<String> = causes
        .iter()
        .map(|(c, (g, p))| format!("{c}: {g} GET + {p} POST"))
        .collect();
    println!("{indent}failed by cause: {}", text.join(", "));
}

fn failure(f: Failure) -> &'static str {
    match f {
        Failure::Connect => "client connect failed",
        Failure::Closed => "closed before a response",
        Failure::Timeout => "no response in 10 s",
        Failure::Garbled => "not HTTP",
    }
}
