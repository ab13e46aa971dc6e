//! A `server` name that resolves to several addresses is one peer per
//! address, as `ngx_http_upstream_init_round_robin` builds them: each with
//! the line's parameters, named by its address, `server` the written text;
//! `hash ... consistent` puts the points of the written text on the ring
//! (equal hashes kept once) and picks among the peers sharing it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use vigil_config::{nginx, toml, Resolver};
use vigil_core::api;
use vigil_core::config::{Config, ServerConfig};
use vigil_core::event::EventBus;
use vigil_core::{
    Clock, FailureClass, ManualClock, RequestFacts, RetryPolicy, SelectKey, TransportFailure,
    Upstream,
};

/// `multi` has three addresses (two IPv4, one IPv6), `one` has one; IP
/// literals are themselves.
fn resolver(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    let ips: &[&str] = match host {
        "multi" => &["10.0.0.1", "10.0.0.2", "::1"],
        "one" => &["10.0.0.9"],
        _ => return vigil_config::literal_resolver(host, port),
    };
    Ok(ips
        .iter()
        .map(|ip| SocketAddr::new(ip.parse().expect("ip"), port))
        .collect())
}

fn load_with(src: &str, resolve: Resolver<'_>) -> Config {
    nginx::load_str(src, Path::new("t.conf"), Path::new("."), resolve)
        .unwrap_or_else(|e| panic!("{e}"))
        .config
}

fn load(src: &str) -> Config {
    load_with(src, &resolver)
}

fn upstream_of(c: &Config, name: &str) -> Arc<Upstream> {
    let u = c
        .upstreams
        .iter()
        .find(|u| u.name == name)
        .expect("upstream")
        .clone();
    Arc::new(Upstream::new(
        u,
        Arc::new(EventBus::default()),
        Arc::new(ManualClock::at(1_000_000)),
    ))
}

fn addrs(servers: &[ServerConfig]) -> Vec<String> {
    servers.iter().map(|s| s.addr.to_string()).collect()
}

#[test]
fn a_name_of_three_addresses_is_three_peers_with_the_line_parameters() {
    let c = load(
        "http { upstream u { server multi:8080 weight=3 max_fails=2 fail_timeout=5s max_conns=7;
                             server one:81 backup; }
                server { listen 127.0.0.1:8000; location / { proxy_pass http://u; } } }",
    );
    let u = &c.upstreams[0];
    assert_eq!(
        addrs(&u.servers),
        [
            "10.0.0.1:8080",
            "10.0.0.2:8080",
            "[::1]:8080",
            "10.0.0.9:81"
        ]
    );
    for (i, s) in u.servers[..3].iter().enumerate() {
        assert_eq!(s.address, "multi:8080");
        assert_eq!((s.addr_nth, s.addr_count), (i as u32, 3));
        assert_eq!(
            (
                s.weight.get(),
                s.max_fails,
                s.fail_timeout.as_secs(),
                s.max_conns
            ),
            (3, 2, 5, 7)
        );
        assert!(!s.backup);
        // One line, one origin.
        assert_eq!(s.origin, u.servers[0].origin);
    }
    assert_eq!((u.servers[3].addr_count, u.servers[3].backup), (1, true));
    let up = upstream_of(&c, "u");
    let names: Vec<&str> = up.peers().iter().map(|p| &**p.name()).collect();
    assert_eq!(
        names,
        ["10.0.0.1:8080", "10.0.0.2:8080", "[::1]:8080", "one:81"]
    );
    let clock = ManualClock::at(1_000_000);
    let view = api::upstream_view(&up, &clock, clock.now());
    let shown: Vec<(&str, Option<&str>)> = view
        .peers
        .iter()
        .map(|p| (p.address.as_str(), p.server.as_deref()))
        .collect();
    assert_eq!(
        shown,
        [
            ("10.0.0.1:8080", Some("multi:8080")),
            ("10.0.0.2:8080", Some("multi:8080")),
            ("[::1]:8080", Some("multi:8080")),
            ("one:81", None),
        ]
    );
    // Every peer is found by its name (the admin API's selector).
    for n in names {
        assert_eq!(&**up.peer_by_name(n).expect("peer").name(), n);
    }
}

#[test]
fn the_implicit_upstream_of_proxy_pass_has_a_peer_per_address_too() {
    let c = load(
        "http { server { listen 127.0.0.1:8000; location / { proxy_pass http://multi:9000; } } }",
    );
    let u = c
        .upstreams
        .iter()
        .find(|u| u.name == "multi:9000")
        .expect("implicit");
    assert_eq!(
        addrs(&u.servers),
        ["10.0.0.1:9000", "10.0.0.2:9000", "[::1]:9000"]
    );
}

#[test]
fn toml_servers_resolve_to_a_peer_per_address() {
    let c = toml::load_str(
        "[upstream.u]\nserver = [{ address = \"multi:8080\", weight = 2 }]\n",
        Path::new("vigil.toml"),
        &resolver,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let u = &c.upstreams[0];
    assert_eq!(
        addrs(&u.servers),
        ["10.0.0.1:8080", "10.0.0.2:8080", "[::1]:8080"]
    );
    assert!(u.servers.iter().all(|s| s.weight.get() == 2));
    // Written back as the one line it was.
    let text = toml::to_toml_string(&c);
    assert_eq!(text.matches("multi:8080").count(), 1, "{text}");
}

/// Pick `n` times with `key`; the peer names in order.
fn picks(up: &Arc<Upstream>, key: impl Fn(usize) -> String, n: usize) -> Vec<String> {
    let clock = ManualClock::at(1_000_000);
    (0..n)
        .map(|i| {
            let k = key(i);
            let mut sel = up.begin(
                SelectKey::Hash(k.as_bytes()),
                RetryPolicy::default(),
                RequestFacts::default(),
                clock.now(),
            );
            let g = up.select(&mut sel, clock.now()).expect("a peer");
            g.peer().name().to_string()
        })
        .collect()
}

#[test]
fn round_robin_over_the_addresses_is_round_robin_over_lines_of_them() {
    // nginx builds the same peer array for both: one peer per address, in order.
    let by_name = load(
        "http { upstream u { server multi:8080 weight=2; server one:81; }
                server { listen 127.0.0.1:8000; location / { proxy_pass http://u; } } }",
    );
    let by_lines = load(
        "http { upstream u { server 10.0.0.1:8080 weight=2; server 10.0.0.2:8080 weight=2;
                             server [::1]:8080 weight=2; server 10.0.0.9:81; }
                server { listen 127.0.0.1:8000; location / { proxy_pass http://u; } } }",
    );
    let a = picks(&upstream_of(&by_name, "u"), |_| String::new(), 21);
    let b = picks(&upstream_of(&by_lines, "u"), |_| String::new(), 21);
    let b: Vec<String> = b
        .into_iter()
        .map(|n| {
            if n == "10.0.0.9:81" {
                "one:81".into()
            } else {
                n
            }
        })
        .collect();
    assert_eq!(a, b);
    assert_eq!(a.iter().filter(|n| *n == "10.0.0.2:8080").count(), 6);
}

#[test]
fn consistent_hash_puts_the_written_name_on_the_ring_once() {
    // The ring hashes `multi:8080` whatever it resolves to: the same keys
    // land on the name as when it has one address, and spread over its
    // addresses (smooth weighted round robin among the peers of the name,
    // ngx_http_upstream_get_chash_peer).
    let conf = "http { upstream u { hash $arg_k consistent; server multi:8080; server one:81; }
                server { listen 127.0.0.1:8000; location / { proxy_pass http://u; } } }";
    let single = |host: &str, port: u16| -> std::io::Result<Vec<SocketAddr>> {
        match host {
            "multi" => Ok(vec![SocketAddr::from(([10, 0, 0, 1], port))]),
            _ => resolver(host, port),
        }
    };
    let three = upstream_of(&load(conf), "u");
    let one = upstream_of(&load_with(conf, &single), "u");
    let key = |i: usize| format!("key{i}");
    let a = picks(&three, key, 400);
    let b = picks(&one, key, 400);
    let on_multi = |n: &String| n != "one:81";
    let mismatched: Vec<usize> = (0..400)
        .filter(|&i| on_multi(&a[i]) != on_multi(&b[i]))
        .collect();
    assert!(mismatched.is_empty(), "keys moved: {mismatched:?}");
    let multi: Vec<&String> = a.iter().filter(|n| on_multi(n)).collect();
    assert!(multi.len() > 100, "{}", multi.len());
    for addr in ["10.0.0.1:8080", "10.0.0.2:8080", "[::1]:8080"] {
        assert!(multi.iter().any(|n| *n == addr), "{addr} never picked");
    }
}

#[test]
fn a_reload_keeps_the_state_of_an_address_that_stays() {
    let conf = "http { upstream u { server multi:8080; server one:81; }
                server { listen 127.0.0.1:8000; location / { proxy_pass http://u; } } }";
    let clock = Arc::new(ManualClock::at(1_000_000));
    let events = Arc::new(EventBus::default());
    let cfg = load(conf).upstreams[0].clone();
    let old = Arc::new(Upstream::new(cfg, events.clone(), clock.clone()));
    // Fail 10.0.0.2:8080 once: max_fails=1 excludes it.
    let now = clock.now();
    for _ in 0..4 {
        let mut sel = old.begin(
            SelectKey::None,
            RetryPolicy::default(),
            RequestFacts::default(),
            now,
        );
        let g = old.select(&mut sel, now).expect("peer");
        if &**g.peer().name() == "10.0.0.2:8080" {
            let f = TransportFailure {
                class: FailureClass::Error,
                request_sent: true,
                cached_connection: false,
            };
            let _ = sel.on_failure(g, f, now);
            break;
        }
    }
    let fails = |up: &Upstream, name: &str| {
        let st = up.status(clock.now());
        let i = up.peer_by_name(name).expect("peer").id().0 as usize;
        st[i].passive.fails
    };
    assert_eq!(fails(&old, "10.0.0.2:8080"), 1);
    // The name now has two addresses: 10.0.0.2 stays, 10.0.0.1 and ::1 go, 10.0.0.3 comes.
    let two = |host: &str, port: u16| -> std::io::Result<Vec<SocketAddr>> {
        match host {
            "multi" => Ok(vec![
                SocketAddr::from(([10, 0, 0, 3], port)),
                SocketAddr::from(([10, 0, 0, 2], port)),
            ]),
            _ => resolver(host, port),
        }
    };
    let cfg = load_with(conf, &two).upstreams[0].clone();
    let new = Upstream::with_previous(cfg, Some(&old), events, clock.clone());
    let names: Vec<&str> = new.peers().iter().map(|p| &**p.name()).collect();
    assert_eq!(names, ["10.0.0.3:8080", "10.0.0.2:8080", "one:81"]);
    assert_eq!(fails(&new, "10.0.0.2:8080"), 1);
    assert_eq!(fails(&new, "10.0.0.3:8080"), 0);
}

#[test]
fn a_unix_server_is_a_peer_at_its_path() {
    let c = load(
        "http { upstream u { server unix:/run/app.sock weight=2 max_fails=3; server UNIX:/b; }
                server { listen 127.0.0.1:8000; location / { proxy_pass http://u; } } }",
    );
    let u = &c.upstreams[0];
    assert_eq!(
        u.servers[0].unix.as_deref(),
        Some(Path::new("/run/app.sock"))
    );
    assert_eq!(
        u.servers[0].peer_addr(),
        vigil_core::config::PeerAddr::Unix("/run/app.sock".into())
    );
    assert_eq!((u.servers[0].weight.get(), u.servers[0].max_fails), (2, 3));
    assert_eq!(u.servers[1].unix.as_deref(), Some(Path::new("/b")));
    let up = upstream_of(&c, "u");
    // Named as written; `$upstream_addr` is `unix:PATH`, as nginx prints it.
    assert_eq!(&**up.peers()[0].name(), "unix:/run/app.sock");
    assert_eq!(&**up.peers()[0].addr_text(), "unix:/run/app.sock");
    assert_eq!(&**up.peers()[1].addr_text(), "unix:/b");
    let t = toml::load_str(
        "[upstream.u]\nserver = [{ address = \"unix:/run/app.sock\" }]\n",
        Path::new("vigil.toml"),
        &resolver,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        t.upstreams[0].servers[0].unix.as_deref(),
        Some(Path::new("/run/app.sock"))
    );
}

#[test]
fn unix_addresses_nginx_refuses_are_refused_with_its_words() {
    let err = |server: &str| {
        let src = format!(
            "http {{ upstream u {{ server {server}; }}
               server {{ listen 127.0.0.1:8000; location / {{ proxy_pass http://u; }} }} }}"
        );
        match nginx::load_str(&src, Path::new("t.conf"), Path::new("."), &resolver) {
            Ok(_) => panic!("loads: {server}"),
            Err(e) => e.to_string(),
        }
    };
    // As nginx 1.22 `nginx -t` says them.
    assert_eq!(
        err("unix:"),
        "t.conf:1:28: no path in the unix domain socket in upstream \"unix:\""
    );
    let long = format!("unix:/{}", "x".repeat(107));
    assert!(
        err(&long).ends_with(&format!(
            "too long path in the unix domain socket in upstream \"{long}\""
        )),
        "{}",
        err(&long)
    );
    // 107 bytes fit (sun_path holds 108 with the NUL).
    let fits = format!("unix:/{}", "x".repeat(106));
    let src = format!(
        "http {{ upstream u {{ server {fits}; }}
           server {{ listen 127.0.0.1:8000; location / {{ proxy_pass http://u; }} }} }}"
    );
    assert!(nginx::load_str(&src, Path::new("t.conf"), Path::new("."), &resolver).is_ok());
    // Listeners on unix sockets stay refused.
    let listen = nginx::load_str(
        "http { server { listen unix:/tmp/l.sock; location / { proxy_pass http://127.0.0.1:1; } } }",
        Path::new("t.conf"),
        Path::new("."),
        &resolver,
    );
    assert!(listen.is_err());
}

fn try_load(conf: &str) -> Result<Config, String> {
    nginx::load_str(conf, Path::new("t.conf"), Path::new("."), &resolver)
        .map(|l| l.config)
        .map_err(|e| e.to_string())
}

#[test]
fn resolve_takes_the_http_resolver_written_after_the_upstream() {
    // nginx merges `resolver` / `resolver_timeout` from http{} at the end
    // of the block (ngx_http_upstream_init_round_robin).
    let c = try_load(
        "http { upstream u { zone z 64k; server multi:80 resolve weight=2; server one:81; }
                server { listen 127.0.0.1:8000; location / { proxy_pass http://u; } }
                resolver 10.0.0.53 [::1]:5353 valid=5s ipv6=off; resolver_timeout 7s; }",
    )
    .expect("loads");
    let u = &c.upstreams[0];
    let r = u.resolver.as_ref().expect("resolver merged");
    assert_eq!(
        r.servers,
        vec![
            "10.0.0.53:53".parse::<SocketAddr>().expect("addr"),
            "[::1]:5353".parse().expect("addr")
        ]
    );
    assert_eq!(r.valid, Some(std::time::Duration::from_secs(5)));
    assert!(r.ipv4 && !r.ipv6);
    assert_eq!(r.timeout, std::time::Duration::from_secs(7));
    // At load the name is resolved as every name is: one peer per address.
    let flags: Vec<(bool, u32)> = u
        .servers
        .iter()
        .map(|s| (s.resolve, s.weight.get()))
        .collect();
    assert_eq!(flags, vec![(true, 2), (true, 2), (true, 2), (false, 1)]);
    // The upstream's own resolver wins; its resolver_timeout too; default 30s.
    let c = try_load(
        "http { resolver 10.0.0.53; upstream u { zone z; resolver 10.0.0.54:54; server one:80 resolve; }
                upstream v { zone z; resolver_timeout 2s; server one:80 resolve; }
                upstream w { zone z; server 10.0.0.9:80 resolve; }
                server { listen 127.0.0.1:8000; location / { proxy_pass http://u; } } }",
    )
    .expect("loads");
    let r = |i: usize| c.upstreams[i].resolver.clone().expect("resolver");
    assert_eq!(
        r(0).servers,
        vec!["10.0.0.54:54".parse::<SocketAddr>().expect("addr")]
    );
    assert_eq!(r(0).timeout, std::time::Duration::from_secs(30));
    assert_eq!(
        r(1).servers,
        vec!["10.0.0.53:53".parse::<SocketAddr>().expect("addr")]
    );
    assert_eq!(r(1).timeout, std::time::Duration::from_secs(2));
    // An IP address with `resolve` is a fixed address, as in nginx.
    assert!(!c.upstreams[2].servers[0].resolve);
}

#[test]
fn resolve_needs_a_zone_and_a_resolver_with_nginx_texts() {
    let up = |body: &str| {
        format!(
            "http {{ upstream u {{ {body} }}\nserver {{ listen 127.0.0.1:8000; location / {{ proxy_pass http://u; }} }} }}"
        )
    };
    assert_eq!(
        try_load(&up("resolver 10.0.0.53; server one:80 resolve;")).expect_err("no zone"),
        "t.conf:1:41: resolving names at run time requires upstream \"u\" in t.conf:1 to be in shared memory"
    );
    assert_eq!(
        try_load(&up("zone z 64k; server one:80 resolve;")).expect_err("no resolver"),
        "t.conf:1:33: no resolver defined to resolve names at run time in upstream \"u\" in t.conf:1"
    );
    for (resolver, message) in [
        (
            "resolver 10.0.0.53 valid=x;",
            "t.conf:1:48: invalid parameter: valid=x",
        ),
        (
            "resolver 10.0.0.53 ipv4=yes;",
            "t.conf:1:48: invalid parameter: ipv4=yes",
        ),
        (
            "resolver 10.0.0.53 ipv4=off ipv6=off;",
            "t.conf:1:29: \"ipv4\" and \"ipv6\" cannot both be \"off\"",
        ),
        ("resolver valid=1s;", "t.conf:1:29: no name servers defined"),
        (
            "resolver 10.0.0.53; resolver 10.0.0.54;",
            "t.conf:1:49: \"resolver\" directive is duplicate",
        ),
    ] {
        assert_eq!(
            try_load(&up(&format!("zone z; {resolver} server one:80 resolve;")))
                .expect_err(resolver),
            message,
            "{resolver}"
        );
    }
    // `vigil lint` (lenient) reports the missing resolver, the rest kept.
    let files = std::collections::BTreeMap::new();
    let l = nginx::load_str_mode(
        &up("zone z; server multi:80 resolve;"),
        Path::new("t.conf"),
        Path::new("."),
        &resolver,
        nginx::syntax::Includes::Memory(&files),
        nginx::Mode::Lenient,
    )
    .expect("lenient");
    assert_eq!(l.refusals.len(), 1, "{:?}", l.refusals);
    assert!(
        l.refusals[0].to_string().contains("no resolver defined"),
        "{:?}",
        l.refusals
    );
    assert_eq!(l.config.upstreams[0].servers.len(), 3);
}
