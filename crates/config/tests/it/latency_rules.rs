//! vigil's latency rules and the preset in both front ends: `eject_stuck`,
//! `eject_slow` and `health_preset` inside `upstream {}` and as TOML keys;
//! the preset's expansion and overrides, errors at their positions,
//! `vigil convert` round trips, lint codes and `explain`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use vigil_config::convert::nginx_to_toml;
use vigil_config::{literal_resolver, nginx, preset};
use vigil_core::config::{EjectSlow, EjectStuck, Recovery};

use crate::support::{nginx_err, nginx_load, toml_load};
use vigil_config::lint::lint_config;
use vigil_core::event::EventBus;
use vigil_core::registry::Registry;
use vigil_core::ManualClock;

fn up(body: &str) -> String {
    format!("upstream u {{\n  server 127.0.0.1:1;\n  server 127.0.0.1:2;\n  {body}\n}}\n")
}

const PRESET_NGINX: &str = "http {
  upstream api {
    server 127.0.0.1:8001;
    server 127.0.0.1:8002;
    server 127.0.0.1:8003;
    check interval=500 rise=1 fall=2 timeout=400 type=http;
    health_preset recommended;
    max_ejected 34%;
    eject_slow factor=5 window=20s;
  }
  server { listen 8080; location / { proxy_pass http://api; proxy_connect_timeout 1s; proxy_read_timeout 1s; } }
}";

#[test]
fn the_latency_rules_load_in_both_front_ends() {
    let c = nginx_load(&up(
        "eject_stuck factor=2.5 min=150ms;\n  eject_slow factor=4 window=30s min_requests=50 min=5ms max=2s;",
    ))
    .expect("loads");
    let r = &c.upstreams[0].rules;
    assert_eq!(
        r.eject_stuck,
        Some(EjectStuck {
            factor: 2.5,
            min: Duration::from_millis(150)
        })
    );
    assert_eq!(
        r.eject_slow,
        Some(EjectSlow {
            factor: 4.0,
            window: Duration::from_secs(30),
            min_requests: 50,
            min: Duration::from_millis(5),
            max: Some(Duration::from_secs(2)),
        })
    );
    let t = toml_load(
        r#"
[upstream.u]
server = [{ address = "127.0.0.1:1" }, { address = "127.0.0.1:2" }]
eject_stuck = { factor = 2.5, min = "150ms" }
eject_slow = { factor = 4, window = "30s", min_requests = 50, min = "5ms", max = "2s" }
"#,
    )
    .expect("toml");
    assert_eq!(t.upstreams[0].rules, *r);
    // Parameters left out take the preset's values.
    let c = nginx_load(&up("eject_stuck;\n  eject_slow min_requests=5;")).expect("loads");
    assert_eq!(c.upstreams[0].rules.eject_stuck, Some(preset::STUCK));
    assert_eq!(
        c.upstreams[0].rules.eject_slow,
        Some(EjectSlow {
            min_requests: 5,
            ..preset::SLOW
        })
    );
}

#[test]
fn latency_rule_errors_name_the_place_and_what_was_expected() {
    let cases: &[(String, &str)] = &[
        (
            up("eject_stuck factor=0.5;"),
            "t.conf:4:15: \"eject_stuck\": invalid factor \"0.5\", expected a number from 1 to 1000",
        ),
        (
            up("eject_slow factor=1;"),
            "t.conf:4:14: \"eject_slow\": invalid factor \"1\", expected a number above 1",
        ),
        (
            up("eject_slow window=50ms;"),
            "t.conf:4:14: \"eject_slow\" window=50ms is too short, expected at least 100ms",
        ),
        (
            up("eject_slow max=0;"),
            "t.conf:4:14: \"eject_slow\" max=0 would eject every peer, expected a time above 0",
        ),
        (
            up("eject_slow min_requests=0;"),
            "t.conf:4:14: \"eject_slow\" invalid min_requests \"0\"",
        ),
        (
            up("eject_stuck min=soon;"),
            "t.conf:4:15: \"eject_stuck\":",
        ),
        (
            up("eject_stuck factor=2 factor=3;"),
            "t.conf:4:24: invalid value \"factor=3\" in \"eject_stuck\" directive",
        ),
        (
            up("health_preset aggressive;"),
            "t.conf:4:17: invalid value \"aggressive\" in \"health_preset\" directive, expected recommended",
        ),
        (
            up("health_preset recommended;\n  health_preset recommended;"),
            "t.conf:5:3: \"health_preset\" directive is duplicate (first at t.conf:4:3)",
        ),
    ];
    for (src, want) in cases {
        let got = nginx_err(src);
        assert!(got.starts_with(want), "{src}\n got: {got}\nwant: {want}");
    }
    let e = toml_load(
        "[upstream.u]\nserver = [{ address = \"127.0.0.1:1\" }]\neject_slow = { factor = 0.9 }\n",
    )
    .map(|_| ())
    .expect_err("refused")
    .to_string();
    assert!(
        e.contains("eject_slow.factor") && e.contains("above 1"),
        "{e}"
    );
    let e = toml_load(
        "[upstream.u]\nserver = [{ address = \"127.0.0.1:1\" }]\nhealth_preset = \"x\"\n",
    )
    .map(|_| ())
    .expect_err("refused")
    .to_string();
    assert!(
        e.contains("health_preset") && e.contains("expected recommended"),
        "{e}"
    );
}

#[test]
fn the_preset_expands_and_what_is_written_beside_it_wins() {
    let c = nginx_load(PRESET_NGINX).expect("loads");
    let r = &c.upstreams[0].rules;
    assert!(r.count.after_header && r.count.last_try);
    assert_eq!(r.recovery, Recovery::Probe, "the upstream has a check");
    assert_eq!(r.penalty, Some(preset::PENALTY));
    assert_eq!(r.max_ejected, Some(34), "written");
    assert_eq!(r.eject_stuck, Some(preset::STUCK));
    assert_eq!(
        r.eject_slow.map(|s| (s.factor, s.window, s.min_requests)),
        Some((5.0, Duration::from_secs(20), preset::SLOW.min_requests)),
        "written, its other parameters at the preset's values"
    );
    let p = r.preset.expect("preset");
    assert_eq!(
        p.supplied.names(),
        [
            "passive_count",
            "passive_recovery",
            "passive_penalty",
            "eject_stuck",
            "retry_budget",
            "hedge"
        ]
    );
    // No check: probation instead of probe.
    let c = nginx_load(&up("health_preset recommended;")).expect("loads");
    assert_eq!(
        c.upstreams[0].rules.recovery,
        Recovery::Probation(preset::PROBATION)
    );
    // The same in TOML.
    let t = toml_load(
        r#"
[upstream.api]
server = [{ address = "127.0.0.1:8001" }, { address = "127.0.0.1:8002" }, { address = "127.0.0.1:8003" }]
check = { type = "http", interval = "500ms", rise = 1, fall = 2, timeout = "400ms" }
health_preset = "recommended"
max_ejected = "34%"
eject_slow = { factor = 5, window = "20s" }
"#,
    )
    .expect("toml");
    let n = nginx_load(PRESET_NGINX).expect("loads");
    assert_eq!(t.upstreams[0].rules, n.upstreams[0].rules);
}

#[test]
fn convert_writes_the_preset_and_only_the_overrides() {
    let loaded = nginx::load_str(
        PRESET_NGINX,
        Path::new("t.conf"),
        Path::new("."),
        &literal_resolver,
    )
    .expect("loads");
    let text = nginx_to_toml(&loaded);
    assert!(text.contains("health_preset = \"recommended\""), "{text}");
    assert!(text.contains("max_ejected = \"34%\""), "{text}");
    assert!(text.contains("eject_slow"), "{text}");
    for supplied in ["passive_penalty", "eject_stuck", "passive_count"] {
        assert!(
            !text.contains(supplied),
            "{supplied} is the preset's:\n{text}"
        );
    }
    let back = toml_load(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back, loaded.config, "{text}");
    // Without a preset every rule is written out.
    let loaded = nginx::load_str(
        &up("eject_stuck factor=2 min=1s;\n  eject_slow max=750ms;"),
        Path::new("t.conf"),
        Path::new("."),
        &literal_resolver,
    )
    .expect("loads");
    let text = nginx_to_toml(&loaded);
    assert!(text.contains("eject_stuck"), "{text}");
    assert!(text.contains("max = \"750ms\""), "{text}");
    let back = toml_load(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back, loaded.config, "{text}");
}

#[test]
fn lint_knows_the_latency_rules() {
    let codes = |src: &str| -> Vec<&'static str> {
        lint_config(&nginx_load(src).expect("loads"))
            .into_iter()
            .map(|f| f.code)
            .collect()
    };
    let one = "http { upstream u { server 127.0.0.1:1; eject_slow; eject_stuck; } }";
    let got = codes(one);
    assert!(
        got.contains(&"eject-slow-few-peers") && got.contains(&"eject-stuck-never"),
        "{got:?}"
    );
    let two =
        "http { upstream u { server 127.0.0.1:1; server 127.0.0.1:2; health_preset recommended; }
      server { listen 80; location / { proxy_pass http://u; proxy_read_timeout 120s; } } }";
    let got = codes(two);
    assert!(got.contains(&"eject-slow-two-peers"), "{got:?}");
    assert!(got.contains(&"eject-stuck-long-poll"), "{got:?}");
    let never = "http { upstream u { server 127.0.0.1:1; server 127.0.0.1:2; eject_stuck min=5s; }
      server { listen 80; location / { proxy_pass http://u; proxy_connect_timeout 1s; proxy_read_timeout 2s; } } }";
    let f = lint_config(&nginx_load(never).expect("loads"));
    let f = f
        .iter()
        .find(|f| f.code == "eject-stuck-never")
        .expect("finding");
    assert!(f.at.starts_with("t.conf:1:61"), "{}", f.at);
    // The preset's findings point at the preset line.
    let f = lint_config(&nginx_load(two).expect("loads"));
    let slow = f
        .iter()
        .find(|f| f.code == "eject-slow-two-peers")
        .expect("finding");
    assert!(slow.at.starts_with("t.conf:1:61"), "{}", slow.at);
    assert!(codes(PRESET_NGINX).iter().all(|c| !c.starts_with("eject-")));
}

#[test]
fn explain_says_what_the_preset_switched_on_and_what_was_written() {
    let c = nginx_load(PRESET_NGINX).expect("loads");
    let clock = Arc::new(ManualClock::at(1_000));
    let reg = Registry::build(&c, None, Arc::new(EventBus::default()), clock.clone());
    let doc = vigil_core::api::status(&reg, &*clock);
    let up = &doc.upstreams[0];
    let p = up.rules.health_preset.as_ref().expect("preset view");
    assert_eq!(p.written, ["max_ejected", "eject_slow"]);
    let text = vigil_core::api::explain_rules(up).join(" ");
    assert!(
        text.contains("health_preset recommended switched on passive_count after_header last_try, passive_recovery probe, passive_penalty base=5s max=1m jitter=10%, eject_stuck factor=3 min=25ms, retry_budget ratio=20% min=3/s, hedge after=p99 max=1; written beside it, and overriding it: max_ejected 34%, eject_slow factor=5 window=20s min_requests=10 min=10ms."),
        "{text}"
    );
    assert!(text.contains("p50 unknown (too few headers)"), "{text}");
    let json = serde_json::to_value(&doc).expect("json");
    assert_eq!(json["upstreams"][0]["rules"]["eject_stuck"]["min_ms"], 25);
}

#[test]
fn the_preset_switches_every_latency_rule_on() {
    let c = nginx_load(&up("health_preset recommended;")).expect("loads");
    let up = vigil_core::Upstream::new(
        c.upstreams[0].clone(),
        Arc::new(EventBus::default()),
        Arc::new(ManualClock::at(1_000)),
    );
    assert!(up.measures_latency());
    assert!(up.stuck_now(vigil_core::Timestamp(1_000)).is_some());
    assert!(up
        .peer_header_figure(0, vigil_core::Timestamp(1_000))
        .is_some());
}
