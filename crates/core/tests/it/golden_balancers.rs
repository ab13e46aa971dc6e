//! Key-to-peer maps and round-robin orders recorded from nginx 1.22.1
//! (`tests/golden/record.py`), replayed against vigil's balancers.

use std::path::PathBuf;

use serde_json::Value;
use vigil_core::config::Balancer;
use vigil_core::{Clock, RequestFacts, RetryPolicy, SelectKey};

use crate::support::{server, upstream};

fn golden(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden is JSON")
}

/// Servers of a golden case, and a map from address text to label.
fn servers_of(v: &Value) -> (Vec<vigil_core::config::ServerConfig>, Vec<(String, String)>) {
    let mut servers = Vec::new();
    let mut labels = Vec::new();
    for s in v["servers"].as_array().expect("servers") {
        let addr = s["server"].as_str().expect("server");
        let mut cfg = server(addr, s["weight"].as_u64().expect("weight") as u32);
        cfg.down = s["down"].as_bool().unwrap_or(false);
        labels.push((
            addr.to_string(),
            s["label"].as_str().expect("label").to_string(),
        ));
        servers.push(cfg);
    }
    (servers, labels)
}

fn label_of(labels: &[(String, String)], name: &str) -> String {
    labels
        .iter()
        .find(|(a, _)| a == name)
        .map(|(_, l)| l.clone())
        .unwrap_or_else(|| panic!("unknown peer {name}"))
}

/// Replay one keyed golden file: every key must land where nginx sent it.
fn replay_keyed(file: &str, balancer: Balancer) {
    let g = golden(file);
    let (servers, labels) = servers_of(&g);
    let (up, clock) = upstream(balancer, servers);
    let mut mismatches = Vec::new();
    let cases = g["cases"].as_array().expect("cases");
    for case in cases {
        let key = case["key"].as_str().expect("key");
        let want = case["label"].as_str().expect("label");
        let now = clock.now();
        let select_key = match file.starts_with("ip_hash") {
            true => SelectKey::Client(key.parse().expect("ip")),
            false => SelectKey::Hash(key.as_bytes()),
        };
        let mut sel = up.begin(
            select_key,
            RetryPolicy::default(),
            RequestFacts::default(),
            now,
        );
        let guard = up.select(&mut sel, now).expect("a peer");
        let got = label_of(&labels, guard.peer().name());
        if got != want {
            mismatches.push(format!("{key}: nginx {want}, vigil {got}"));
        }
    }
    assert!(cases.len() >= 300, "{file}: too few cases");
    assert!(
        mismatches.is_empty(),
        "{file}: {} of {} differ: {:?}",
        mismatches.len(),
        cases.len(),
        &mismatches[..mismatches.len().min(10)]
    );
}

#[test]
fn consistent_hash_matches_nginx() {
    let b = || Balancer::Hash {
        key: "$arg_k".into(),
        consistent: true,
    };
    replay_keyed("chash_3.json", b());
    replay_keyed("chash_weighted.json", b());
}

#[test]
fn consistent_hash_skips_a_down_server_like_nginx() {
    replay_keyed(
        "chash_down.json",
        Balancer::Hash {
            key: "$arg_k".into(),
            consistent: true,
        },
    );
}

#[test]
fn hash_matches_nginx() {
    let b = || Balancer::Hash {
        key: "$arg_k".into(),
        consistent: false,
    };
    replay_keyed("hash_3.json", b());
    replay_keyed("hash_weighted.json", b());
}

#[test]
fn ip_hash_matches_nginx() {
    replay_keyed("ip_hash.json", Balancer::IpHash);
    replay_keyed("ip_hash_weighted.json", Balancer::IpHash);
}

#[test]
fn smooth_round_robin_order_matches_nginx() {
    let g = golden("swrr.json");
    for case in g["cases"].as_array().expect("cases") {
        let (servers, labels) = servers_of(case);
        let (up, clock) = upstream(Balancer::RoundRobin, servers);
        let want: Vec<&str> = case["sequence"]
            .as_array()
            .expect("sequence")
            .iter()
            .map(|v| v.as_str().expect("label"))
            .collect();
        let got: Vec<String> = (0..want.len())
            .map(|_| {
                let now = clock.now();
                let mut sel = up.begin(
                    SelectKey::None,
                    RetryPolicy::default(),
                    RequestFacts::default(),
                    now,
                );
                let g = up.select(&mut sel, now).expect("a peer");
                label_of(&labels, g.peer().name())
            })
            .collect();
        assert_eq!(got, want, "weights {}", case["weights"]);
    }
}

#[test]
fn weights_5_1_1_give_aabacaa() {
    let (up, clock) = upstream(
        Balancer::RoundRobin,
        vec![
            server("10.0.0.1:80", 5),
            server("10.0.0.2:80", 1),
            server("10.0.0.3:80", 1),
        ],
    );
    let order: String = (0..7)
        .map(|_| {
            let now = clock.now();
            let mut sel = up.begin(
                SelectKey::None,
                RetryPolicy::default(),
                RequestFacts::default(),
                now,
            );
            let g = up.select(&mut sel, now).expect("peer");
            match &**g.peer().name() {
                "10.0.0.1:80" => 'A',
                "10.0.0.2:80" => 'B',
                _ => 'C',
            }
        })
        .collect();
    assert_eq!(order, "AABACAA");
}
