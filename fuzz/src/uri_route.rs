//! `uri_route`: a request target and Host, as a client could send them,
//! through vigil's router (nginx's URI normaliser, location match and
//! virtual-host selection) over a fixed configuration, checking what must
//! hold for every request nginx would let through.
//!
//! Input: byte 0 picks the request's shape (bits 0-1: HTTP/1.0, 1.1, 2,
//! 1.1; bit 2: arrive on the wildcard listener; bit 3: send Host twice);
//! the rest is `TARGET` `\n` `HOST` (no `\n`: no Host).

use std::net::SocketAddr;
use std::sync::OnceLock;

use http::{HeaderMap, HeaderValue, Uri, Version};
use vigil_config::{literal_resolver, nginx, pattern};
use vigil_core::config::{Config, LocationMatch};
use vigil_proxy::route::{upstream_target, Refusal, Router};
use vigil_proxy::uri::{escape_uri, RequestUri};

/// Blocks on two addresses: exact, wildcard, regex and "" names, a
/// default_server, merge_slashes off on a named block, prefix, `^~` and
/// exact locations, auto-redirecting ones, proxy_pass with and without a
/// URI part, regex locations (one nested in a prefix one).
const CONF: &str = r#"http {
  upstream u { server 127.0.0.1:1; }
  server { listen 127.0.0.1:8080; server_name a.test *.wild.test;
    location / { proxy_pass http://u; }
    location /public/ { proxy_pass http://u;
      location ~ \.js$ { proxy_pass http://u; } }
    location ~ ^/re/([0-9]+)$ { proxy_pass http://u; }
    location ~* \.PHP$ { proxy_pass http://u; }
    location /static/ { proxy_pass http://u/files/; }
    location /api/ { proxy_pass http://u/v1; }
    location = /exact/ { proxy_pass http://u/e?x=1; }
    location ^~ /admin { proxy_pass http://u/; }
    location /plain/ { }
  }
  server { listen 127.0.0.1:8080 default_server; server_name b.test .dot.test www.tail.*;
    location /static/ { proxy_pass http://u/b/; }
  }
  server { listen 127.0.0.1:8080; server_name ~^re[0-9]+\.test$ ~Upper; merge_slashes off;
    location / { proxy_pass http://u/m/; }
  }
  server { listen 127.0.0.1:8080;
    location /empty/ { proxy_pass http://u; }
  }
  server { listen 9090;
    location / { proxy_pass http://u/w; }
  }
}"#;

struct Fixed {
    config: Config,
    router: Router,
}

fn fixed() -> &'static Fixed {
    static FIXED: OnceLock<Fixed> = OnceLock::new();
    FIXED.get_or_init(|| {
        let loaded = nginx::load_str(
            CONF,
            "uri_route.conf".as_ref(),
            ".".as_ref(),
            &literal_resolver,
        );
        let config = match loaded {
            Ok(l) => l.config,
            Err(e) => panic!("the fixed conf must load: {e}"),
        };
        let router = match Router::build(&config) {
            Ok(r) => r,
            Err(e) => panic!("the fixed conf must route: {e}"),
        };
        Fixed { config, router }
    })
}

/// The body of the `uri_route` target.
pub fn uri_route(data: &[u8]) {
    let Some((&shape, rest)) = data.split_first() else {
        return;
    };
    let version = match shape & 3 {
        0 => Version::HTTP_10,
        2 => Version::HTTP_2,
        _ => Version::HTTP_11,
    };
    let listener: SocketAddr = if shape & 4 == 0 {
        SocketAddr::from(([127, 0, 0, 1], 8080))
    } else {
        SocketAddr::from(([127, 0, 0, 2], 9090))
    };
    let (target, host) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let mut headers = HeaderMap::new();
    let uri = if version == Version::HTTP_2 {
        // As h2 builds it: :authority from the host, :path from the target;
        // bit 3 sends the host as a Host header instead.
        let mut b = Uri::builder();
        match host {
            Some(h) if shape & 8 == 0 => b = b.scheme("http").authority(h),
            Some(h) => match HeaderValue::from_bytes(h) {
                Ok(v) => {
                    headers.append(http::header::HOST, v);
                }
                Err(_) => return,
            },
            None => {}
        }
        match b.path_and_query(target).build() {
            Ok(u) => u,
            Err(_) => return, // h2 would refuse the stream
        }
    } else {
        if let Some(h) = host {
            let Ok(v) = HeaderValue::from_bytes(h) else {
                return; // hyper would refuse the header
            };
            if shape & 8 != 0 {
                headers.append(http::header::HOST, v.clone());
            }
            headers.append(http::header::HOST, v);
        }
        match Uri::try_from(target) {
            Ok(u) => u,
            Err(_) => return, // hyper answers 400 itself
        }
    };
    let f = fixed();
    let routed = match f.router.route(listener, version, &uri, &headers) {
        Ok(r) => r,
        Err(Refusal::UnknownListener) => panic!("{listener} is a listener of the conf"),
        Err(e @ (Refusal::RegexFailed | Refusal::ServerNameFailed)) => {
            panic!("this conf's regexes cannot reach PCRE's match limit: {e:?}")
        }
        Err(Refusal::Redirect { location, .. }) => {
            assert!(location.starts_with("http://"), "{location}");
            assert!(
                HeaderValue::from_str(&location).is_ok(),
                "Location {location:?}"
            );
            return;
        }
        Err(_) => return,
    };
    let server = &f.config.servers[routed.server];
    // None: a server-level `return` (this conf has none).
    let Some(li) = routed.location else {
        panic!("no server-level return in this conf: {routed:?}");
    };
    let location = &server.locations[li];
    let t = &routed.target;
    let path = t.uri.path();
    // The normalised path: absolute, no dot segments, and what the
    // location matched on.
    assert!(path.starts_with(b"/"), "{t:?}");
    assert!(!has_dot_segment(path), "dot segment left in {t:?}");
    // HTTP/1.x normalises with the address's default block's merge_slashes
    // (on in this conf); HTTP/2 with the chosen block's.
    let merged = version != Version::HTTP_2 || server.client.merge_slashes;
    if merged {
        assert!(!path.windows(2).any(|w| w == b"//"), "// left in {t:?}");
    }
    match location.matcher {
        // A regex location matched: its expression matches the path.
        LocationMatch::Regex | LocationMatch::RegexCaseless => {
            let caseless = location.matcher == LocationMatch::RegexCaseless;
            let re = match pattern::compile(&location.path, caseless) {
                Ok(re) => re,
                Err(e) => panic!("{e}"),
            };
            assert_eq!(
                re.is_match(path).ok(),
                Some(true),
                "{t:?} matched {}",
                location.path
            );
        }
        _ => assert!(
            path.starts_with(location.path.as_bytes()),
            "{t:?} matched {}",
            location.path
        ),
    }
    assert!(!path.contains(&0), "NUL in {t:?}");
    // Normalising is idempotent (the path re-escaped is a target again).
    let mut again = String::new();
    escape_uri(&mut again, path);
    let twice = RequestUri::parse(&again, merged, false).map(|u| u.path().to_vec());
    assert_eq!(twice.as_deref(), Ok(path), "normalising {t:?} again");
    // The host: validated, lower-case, without its port.
    assert!(
        !t.host.bytes().any(|b| b.is_ascii_uppercase() || b == b'/'),
        "{t:?}"
    );
    assert!(!t.host.contains(".."), "{t:?}");
    // What goes upstream is a URI hyper can send, and with a URI part in
    // proxy_pass it cannot climb out of that part.
    let up = upstream_target(location, &t.uri);
    assert!(up.parse::<Uri>().is_ok(), "upstream URI {up:?} for {t:?}");
    let pass = location.proxy.pass.as_ref().and_then(|p| p.uri.as_deref());
    if let Some(pass) = pass {
        assert!(up.starts_with(pass), "{up:?} for {t:?}");
        if let Ok(seen) = RequestUri::parse(&up, false, false) {
            assert!(!has_dot_segment(seen.path()), "{up:?} climbs, for {t:?}");
        }
    } else if let Some(raw) = t.uri.unparsed() {
        assert_eq!(up, raw, "without a URI part the target goes as sent");
    }
}

/// `/../` or `/./` inside, or `/..` or `/.` at the end.
fn has_dot_segment(p: &[u8]) -> bool {
    p.windows(4).any(|w| w == b"/../")
        || p.windows(3).any(|w| w == b"/./")
        || p.ends_with(b"/..")
        || p.ends_with(b"/.")
}
