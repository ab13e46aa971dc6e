//! vigil's traffic rules in both front ends: `retry_budget` and `hedge`
//! inside `upstream {}` and the same keys in TOML; errors at their
//! positions, the `vigil convert` round trip, and the lint codes.

use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use vigil_config::convert::nginx_to_toml;
use vigil_config::{literal_resolver, nginx};
use vigil_core::config::{Hedge, HedgeAfter, RetryBudget};

use crate::support::{nginx_load, toml_load};
use vigil_config::lint::lint_config;

const NGINX: &str = "http {
  upstream api {
    server 127.0.0.1:8001;
    server 127.0.0.1:8002;
    retry_budget ratio=20% min=3/s;
    hedge after=50ms max=2;
  }
  upstream p { server 127.0.0.1:9001; server 127.0.0.1:9002; hedge after=p95; }
  server { listen 8080; location / { proxy_pass http://api; } location /p { proxy_pass http://p; } }
}";

const TOML: &str = r#"
[upstream.api]
retry_budget = { ratio = "20%", min = "3/s" }
hedge = { after = "50ms", max = 2 }
[[upstream.api.server]]
address = "127.0.0.1:8001"
[[upstream.api.server]]
address = "127.0.0.1:8002"
"#;

#[test]
fn both_front_ends_read_the_same_rules() {
    let c = nginx_load(NGINX).expect("nginx");
    let api = c.upstream("api").expect("api");
    let want_budget = Some(RetryBudget {
        ratio_percent: 20,
        min_per_sec: 3,
    });
    let want_hedge = Some(Hedge {
        after: HedgeAfter::Fixed(Duration::from_millis(50)),
        max: NonZeroU32::new(2).expect("2"),
    });
    assert_eq!(api.rules.retry_budget, want_budget);
    assert_eq!(api.rules.hedge, want_hedge);
    let p = c.upstream("p").expect("p");
    assert_eq!(
        p.rules.hedge,
        Some(Hedge {
            after: HedgeAfter::Percentile(95),
            max: NonZeroU32::MIN,
        })
    );
    let t = toml_load(TOML).expect("toml");
    let api = t.upstream("api").expect("api");
    assert_eq!(api.rules.retry_budget, want_budget);
    assert_eq!(api.rules.hedge, want_hedge);
    // Positions: the directive, and the TOML key.
    let at = api.rules.origins.hedge.to_string();
    assert!(at.starts_with("vigil.toml:4:"), "{at}");
    let c = nginx_load(NGINX).expect("nginx");
    assert_eq!(
        c.upstream("api")
            .expect("api")
            .rules
            .origins
            .retry_budget
            .to_string(),
        "t.conf:5:5"
    );
}

#[test]
fn convert_round_trips_the_rules() {
    let loaded = nginx::load_str(
        NGINX,
        Path::new("t.conf"),
        Path::new("."),
        &literal_resolver,
    )
    .expect("load");
    let text = nginx_to_toml(&loaded);
    assert!(
        text.contains("[upstream.api.retry_budget]\nratio = \"20%\"\nmin = \"3/s\"\n"),
        "{text}"
    );
    assert!(
        text.contains("[upstream.api.hedge]\nafter = \"50ms\"\nmax = 2\n"),
        "{text}"
    );
    assert!(
        text.contains("[upstream.p.hedge]\nafter = \"p95\"\n"),
        "{text}"
    );
    let back = toml_load(&text).expect("converted loads");
    assert_eq!(back, loaded.config);
}

#[test]
fn errors_name_the_line_and_what_was_expected() {
    let up = |body: &str| {
        format!("upstream u {{\n  server 127.0.0.1:1;\n  server 127.0.0.1:2;\n  {body}\n}}\n")
    };
    let cases: &[(String, &str)] = &[
        (
            up("retry_budget ratio=20%;"),
            "t.conf:4:3: invalid number of arguments in \"retry_budget\" directive",
        ),
        (
            up("retry_budget ratio=120% min=1/s;"),
            "t.conf:4:16: \"retry_budget\": invalid percentage \"120%\", expected 0% to 100%",
        ),
        (
            up("retry_budget ratio=20% min=3;"),
            "t.conf:4:26: \"retry_budget\": invalid rate \"3\", expected N/s (a whole number per second)",
        ),
        (
            up("retry_budget ratio=20% ratio=3%;"),
            "t.conf:4:26: invalid value \"ratio=3%\" in \"retry_budget\" directive, expected ratio=R% and min=N/s, each once",
        ),
        (
            up("hedge max=2;"),
            "t.conf:4:3: \"hedge\" needs after=T or after=pNN",
        ),
        (
            up("hedge after=0;"),
            "t.conf:4:9: \"hedge\": after= must be greater than 0",
        ),
        (
            up("hedge after=p100;"),
            "t.conf:4:9: \"hedge\": invalid percentile \"p100\", expected p1 to p99 (p95: the 95th)",
        ),
        (
            up("hedge after=50ms max=9;"),
            "t.conf:4:20: \"hedge\": invalid max=9, expected 1 to 8 hedges",
        ),
        (
            up("hedge after=50ms;\n  hedge after=60ms;"),
            "t.conf:5:3: \"hedge\" directive is duplicate (first at t.conf:4:3)",
        ),
    ];
    for (src, want) in cases {
        let src = format!("http {{ {src} }}");
        let got = match nginx_load(&src) {
            Ok(_) => panic!("loads but should not:\n{src}"),
            Err(e) => e.to_string(),
        };
        assert!(got.starts_with(want), "{src}\n got: {got}\nwant: {want}");
    }
    let toml_cases = [
        (
            "retry_budget = { ratio = \"20%\", min = \"fast\" }",
            "retry_budget.min",
        ),
        ("hedge = { after = \"soon\" }", "hedge.after"),
        ("hedge = { after = \"5ms\", max = 0 }", "hedge.max"),
    ];
    for (line, key) in toml_cases {
        let src = format!(
            "[upstream.u]\n{line}\n[[upstream.u.server]]\naddress = \"127.0.0.1:1\"\n[[upstream.u.server]]\naddress = \"127.0.0.1:2\"\n"
        );
        let got = match toml_load(&src) {
            Ok(_) => panic!("loads but should not:\n{src}"),
            Err(e) => e.to_string(),
        };
        // Validation errors name the field, as every TOML rule error does.
        assert!(
            got.starts_with(&format!("vigil.toml: upstream.u.{key}: ")),
            "{got}"
        );
    }
}

#[test]
fn lint_finds_hedges_that_do_nothing_and_budgets_that_allow_nothing() {
    let codes = |src: &str| -> Vec<&'static str> {
        lint_config(&nginx_load(src).expect("loads"))
            .into_iter()
            .map(|f| f.code)
            .filter(|c| c.starts_with("hedge") || c.starts_with("retry-budget"))
            .collect()
    };
    assert_eq!(
        codes("http { upstream u { server 127.0.0.1:1; hedge after=50ms; retry_budget ratio=0% min=0/s; }
               server { listen 80; location / { proxy_pass http://u; } } }"),
        vec!["hedge-single-server", "retry-budget-zero"]
    );
    assert_eq!(
        codes("http { upstream u { server 127.0.0.1:1; server 127.0.0.1:2; hedge after=50ms; }
               server { listen 80; location / { proxy_pass http://u; proxy_next_upstream error; }
                                   location /b { proxy_pass http://u; proxy_next_upstream_tries 1; } } }"),
        vec!["hedge-never-sent"]
    );
    assert_eq!(
        codes(
            "http { upstream u { server 127.0.0.1:1; server 127.0.0.1:2; hedge after=50ms; }
               server { listen 80; location / { proxy_pass http://u; } } }"
        ),
        vec!["hedge-without-budget"]
    );
    assert!(codes("http { upstream u { server 127.0.0.1:1; server 127.0.0.1:2; hedge after=50ms; retry_budget ratio=20% min=3/s; }
               server { listen 80; location / { proxy_pass http://u; } } }")
    .is_empty());
}
