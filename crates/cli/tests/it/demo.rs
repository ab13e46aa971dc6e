//! `vigil demo` starts, and `vigil status --json` shows its flaky backend
//! excluded by passive accounting and then readmitted.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::time::Instant;

struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn vigil() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vigil"))
}

fn status(admin: &str) -> serde_json::Value {
    let out = vigil()
        .args(["status", "--json", "--admin", admin])
        .output()
        .expect("run vigil status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

fn wait_for(what: &str, deadline: Duration, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_demo_shows_a_backend_excluded_and_readmitted() {
    let mut child = vigil()
        .args([
            "demo",
            "--cycle",
            "8s",
            "--rate",
            "20",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env("VIGIL_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start vigil demo");
    let stdout = child.stdout.take().expect("stdout");
    let demo = Demo(child);
    let mut admin = None;
    let mut flaky = None;
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.expect("line");
        if let Some(rest) = line.trim().strip_prefix("admin:") {
            admin = rest
                .trim()
                .trim_start_matches("http://")
                .split('/')
                .next()
                .map(String::from);
        }
        if let Some(rest) = line.trim().strip_prefix("flaky") {
            flaky = rest.split_whitespace().next().map(String::from);
        }
        if line.trim().starts_with("try:") {
            break;
        }
    }
    // Keep reading: the banner goes on after "try:", and a closed pipe
    // ends the demo (a broken pipe is a normal exit for vigil).
    std::thread::spawn(move || lines.for_each(drop));
    let (admin, flaky) = (
        admin.expect("admin address printed"),
        flaky.expect("flaky backend printed"),
    );
    let state = |s: &serde_json::Value| {
        s["upstreams"][0]["peers"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["address"] == flaky.as_str()))
            .map(|p| p["state"].as_str().unwrap_or("").to_string())
            .unwrap_or_default()
    };
    // The flaky backend answers 503 in the second quarter of each 8s cycle:
    // the built-in load meets it, and passive accounting takes it out.
    wait_for(
        "the flaky backend excluded",
        Duration::from_secs(20),
        || state(&status(&admin)) == "excluded",
    );
    let s = status(&admin);
    let peer = s["upstreams"][0]["peers"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["address"] == flaky.as_str()).cloned())
        .expect("peer");
    assert_eq!(peer["reasons"][0]["rule"], "excluded");
    assert!(peer["fails"].as_u64().unwrap_or(0) >= 1);
    // Once its window is over, a trial request succeeds and it is back.
    wait_for(
        "the flaky backend readmitted",
        Duration::from_secs(20),
        || state(&status(&admin)) == "eligible",
    );
    let out = vigil()
        .args(["events", "--admin", &admin])
        .output()
        .expect("events");
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(log.contains("excluded") && log.contains(&flaky), "{log}");
    let out = vigil()
        .args(["explain", "demo", &flaky, "--admin", &admin])
        .output()
        .expect("explain");
    assert!(out.status.success());
    drop(demo);
}
