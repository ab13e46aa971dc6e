//! The fields built from the client's against the map edits they replace
//! (the code that built them before: a clone of the client's map, edited).

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderValue};
use http::{HeaderName, Method, Request, Uri, Version};
use proptest::prelude::*;
use vigil_config::{literal_resolver, nginx};
use vigil_core::event::EventBus;
use vigil_core::registry::Registry;

use crate::nginx::route::{Route, Routes};
use crate::upstream::pool::Pool;
use crate::upstream::{HeadOut, RequestFields};
use crate::wire::hop::strip_hop_by_hop;

fn route(conf: &str) -> Arc<Route> {
    let config = nginx::load_str(conf, "t.conf".as_ref(), ".".as_ref(), &literal_resolver)
        .expect("conf")
        .config;
    let clock: Arc<dyn vigil_core::Clock> = Arc::new(vigil_net::SystemClock::new());
    let reg = Registry::build(&config, None, Arc::new(EventBus::default()), clock);
    let pools = reg
        .upstreams()
        .iter()
        .map(|u| (u.name().to_string(), Arc::new(Pool::new(u.config()))))
        .collect();
    let routes = Routes::build(&config, &reg, &pools).expect("routes");
    let uri: Uri = "/".parse().expect("uri");
    let mut h = HeaderMap::new();
    h.insert(header::HOST, HeaderValue::from_static("x.test"));
    let (answer, _) = routes
        .route(addr(), Version::HTTP_11, &uri, &h)
        .expect("routed");
    answer.proxy().expect("proxied").clone()
}

fn addr() -> SocketAddr {
    "127.0.0.1:8080".parse().expect("addr")
}

/// The header edits of the former `build_request`, on a clone of the
/// client's map.
fn edited(
    route: &Route,
    parts: &http::request::Parts,
    len: &Option<u64>,
    upgrade: bool,
) -> HeaderMap {
    let mut headers = parts.headers.clone();
    strip_hop_by_hop(&mut headers, false);
    match HeaderValue::from_str(&route.proxy_host) {
        Ok(v) => {
            headers.insert(header::HOST, v);
        }
        Err(_) => {
            headers.remove(header::HOST);
        }
    }
    headers.remove(header::EXPECT);
    match len {
        Some(0) => {
            headers.remove(header::CONTENT_LENGTH);
        }
        Some(n) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(*n));
        }
        None => {}
    }
    if !route.set_headers.is_empty() {
        let cx = route.vars(parts, None, addr(), addr(), 0);
        for (name, _, tpl) in &route.set_headers {
            headers.remove(name);
            if let Some(t) = tpl {
                let v = t.expand(&cx);
                if !v.is_empty() {
                    if let Some(v) = crate::nginx::vars::field_value(v) {
                        headers.insert(name.clone(), v);
                    }
                }
            }
        }
    }
    let sets_connection = route
        .set_headers
        .iter()
        .any(|(n, _, _)| *n == header::CONNECTION);
    match upgrade {
        true if headers.contains_key(header::UPGRADE) => {}
        // The location's own Connection (`""`: none) stands.
        _ if sets_connection => {
            headers.remove(header::UPGRADE);
        }
        _ if route.pool.enabled() => {
            headers.remove(header::UPGRADE);
            headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        }
        _ => {
            headers.remove(header::UPGRADE);
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
    headers
}

fn parts(fields: &[(&str, &str)]) -> http::request::Parts {
    let mut req = Request::builder().uri("/p?a=1");
    for (n, v) in fields {
        req = req.header(*n, *v);
    }
    req.body(()).expect("request").into_parts().0
}

/// The fields as they go on the wire: (name, value) in order.
fn wire(h: &HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// Both ways, which must agree; the new one's fields.
fn both(
    route: &Route,
    parts: &http::request::Parts,
    len: Option<u64>,
    upgrade: bool,
) -> Vec<(String, String)> {
    let fields = || {
        super::super::outgoing::request_fields(
            route,
            parts,
            None,
            None,
            addr(),
            addr(),
            &len,
            upgrade,
        )
    };
    let new = fields().into_map(HeaderMap::new());
    let old = edited(route, parts, &len, upgrade);
    assert_eq!(wire(&new), wire(&old));
    // Built again in the room of the last request's map (an upstream
    // connection's), with fields of its own left in it: the same fields.
    let mut room = new.clone();
    room.append("x-left-over", http::HeaderValue::from_static("1"));
    let again = fields().into_map(room);
    assert_eq!(wire(&again), wire(&new));
    // The head vigil's client writes from the list, framed for each kind
    // of body: the bytes (and what the client keeps) the map gives.
    for method in [Method::GET, Method::POST] {
        for body in 0..3 {
            let mut list = fields();
            let mut by_list = b"left ".to_vec();
            let w_list = HeadOut::new(&mut by_list).write(&method, "/", &mut list, &a_body(body));
            let mut map = old.clone();
            let mut by_map = b"left ".to_vec();
            let w_map = HeadOut::new(&mut by_map).write(&method, "/", &mut map, &a_body(body));
            // (The list spells names as the conf wrote them; the map has
            // them lower case: `names_are_spelt_as_the_client_and_the_conf_wrote_them`.)
            assert_eq!(
                String::from_utf8_lossy(&by_list).to_ascii_lowercase(),
                String::from_utf8_lossy(&by_map).to_ascii_lowercase(),
                "{method} body {body}"
            );
            assert_eq!(w_list, w_map);
        }
    }
    wire(&new)
}

/// An empty body, one of a known length, one of an unknown length.
fn a_body(kind: u8) -> crate::wire::payload::UpBody {
    match kind {
        0 => crate::wire::payload::empty(),
        1 => crate::wire::payload::full("abc"),
        _ => {
            let chunks = vec![Ok::<_, crate::wire::payload::BoxError>(
                hyper::body::Frame::data(bytes::Bytes::from_static(b"abc")),
            )];
            http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(
                futures_util::stream::iter(chunks),
            ))
        }
    }
}

const SETS: &str = "upstream u { server 127.0.0.1:1; keepalive 4; }
    server { listen 127.0.0.1:8080; server_name x.test;
      location / { proxy_pass http://u; proxy_http_version 1.1;
        proxy_set_header X-Real-IP $remote_addr;
        proxy_set_header Accept \"\";
        proxy_set_header Connection \"\";
        proxy_set_header X-Uri $request_uri;
        proxy_set_header Accept-Encoding \"\";
        proxy_set_header X-Empty $http_x_none; } }";

fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[test]
fn fields_keep_the_order_the_map_edits_gave_them() {
    let r = route(SETS);
    let p = parts(&[
        ("user-agent", "ua"),
        ("accept", "*/*"),
        ("connection", "keep-alive, x-drop"),
        ("x-drop", "1"),
        ("host", "x.test"),
        ("te", "trailers"),
        ("x-keep", "k1"),
        ("x-keep", "k2"),
        ("accept-encoding", "gzip"),
        ("upgrade", "websocket"),
        ("x-last", "l"),
    ]);
    let got = both(&r, &p, Some(0), false);
    // Each removal moved the last field into its place: X-Real-IP, put
    // last, moved to Accept's when `proxy_set_header Accept ""` removed it.
    assert_eq!(
        got,
        kv(&[
            ("user-agent", "ua"),
            ("x-real-ip", "127.0.0.1"),
            ("x-last", "l"),
            ("x-keep", "k1"),
            ("x-keep", "k2"),
            ("host", "u"),
            ("x-uri", "/p?a=1"),
        ])
    );
}

#[test]
fn expect_is_answered_here_and_goes_upstream_only_when_a_location_sets_it() {
    let p = parts(&[("host", "x.test"), ("expect", "100-continue"), ("x-a", "a")]);
    let got = both(&route(SETS), &p, Some(5), false);
    assert!(!got.iter().any(|(n, _)| n == "expect"), "{got:?}");
    // nginx's default is `proxy_set_header Expect ""`, which a location's own replaces.
    let passes = route(
        "upstream u { server 127.0.0.1:1; }
         server { listen 127.0.0.1:8080; server_name x.test;
           location / { proxy_pass http://u; proxy_set_header Expect $http_expect; } }",
    );
    let got = both(&passes, &p, Some(5), false);
    assert!(
        got.contains(&("expect".to_string(), "100-continue".to_string())),
        "{got:?}"
    );
}

#[test]
fn an_empty_value_removes_and_a_length_is_put_in_place() {
    let r = route(SETS);
    let p = parts(&[
        ("content-length", "5"),
        ("accept", "a"),
        ("x-real-ip", "6.6.6.6"),
        ("x-real-ip", "7.7.7.7"),
        ("x-b", "b"),
    ]);
    let got = both(&r, &p, Some(5), false);
    assert_eq!(
        got,
        kv(&[
            ("content-length", "5"),
            ("x-real-ip", "127.0.0.1"),
            ("host", "u"),
            ("x-b", "b"),
            ("x-uri", "/p?a=1"),
        ])
    );
    // No pool: close; a streamed body: the client's length stays.
    let r = route(
        "upstream u { server 127.0.0.1:1; }
         server { listen 127.0.0.1:8080; server_name x.test; location / { proxy_pass http://u; } }",
    );
    assert_eq!(
        both(&r, &p, None, false),
        kv(&[
            ("content-length", "5"),
            ("accept", "a"),
            ("x-real-ip", "6.6.6.6"),
            ("x-real-ip", "7.7.7.7"),
            ("x-b", "b"),
            ("host", "u"),
            ("connection", "close"),
        ])
    );
}

#[test]
fn an_upgrade_the_location_sets_goes_and_one_it_does_not_is_dropped() {
    let r = route(
        "upstream u { server 127.0.0.1:1; }
         server { listen 127.0.0.1:8080; server_name x.test;
           location / { proxy_pass http://u; proxy_http_version 1.1;
             proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection \"upgrade\"; } }",
    );
    let p = parts(&[
        ("connection", "Upgrade"),
        ("upgrade", "websocket"),
        ("host", "x.test"),
    ]);
    assert_eq!(
        both(&r, &p, Some(0), true),
        kv(&[
            ("host", "u"),
            ("upgrade", "websocket"),
            ("connection", "upgrade"),
        ])
    );
    let r = route(SETS);
    assert_eq!(
        both(&r, &p, Some(0), true),
        kv(&[
            ("host", "u"),
            ("x-real-ip", "127.0.0.1"),
            ("x-uri", "/p?a=1"),
        ])
    );
}

#[test]
fn a_request_with_a_hundred_fields_keeps_them_all() {
    let r = route(SETS);
    let names: Vec<String> = (0..100).map(|i| format!("x-f{i}")).collect();
    let mut fields: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
    fields[3] = ("connection", "x-f7, x-f50");
    fields[60] = ("accept", "a");
    let p = parts(&fields);
    let got = both(&r, &p, Some(0), false);
    // 100 less connection, the two it names and accept; host, x-real-ip,
    // x-uri added (the location's `Connection ""` sends none, as nginx's).
    assert_eq!(got.len(), 100 - 4 + 3);
}

/// Names a client may send, hop-by-hop and set ones among them.
const NAMES: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "te",
    "upgrade",
    "accept",
    "accept-encoding",
    "x-real-ip",
    "content-length",
    "x-a",
    "x-b",
    "x-c",
    "user-agent",
    "proxy-connection",
    "x-te",
    "x-cl",
    "expect",
];
const CONNECTION: &[&str] = &["keep-alive", "close", "x-a", "X-B, upgrade", "te, x-c", ""];
/// Values of the fields framing reads (`proxy_set_header`s put the x- ones).
const TE: &[&str] = &["gzip", "chunked", "gzip, chunked", "Chunked", "", "x"];
const LENGTH: &[&str] = &["3", "4", "3, 3", "x", "", "03"];

fn arb_fields() -> impl Strategy<Value = Vec<(usize, usize)>> {
    proptest::collection::vec((0..NAMES.len(), 0..CONNECTION.len()), 0..40)
}

proptest! {
    #[test]
    fn any_request_gets_the_fields_the_map_edits_gave(
        fields in arb_fields(),
        len in proptest::option::of(0u64..3),
        upgrade: bool,
    ) {
        let pairs: Vec<(&str, String)> = fields
            .iter()
            .enumerate()
            .map(|(i, &(n, c))| {
                let v = match NAMES[n] {
                    "connection" => CONNECTION[c].to_owned(),
                    "x-te" => TE[c].to_owned(),
                    "x-cl" | "content-length" => LENGTH[c].to_owned(),
                    _ => format!("v{i}"),
                };
                (NAMES[n], v)
            })
            .collect();
        let borrowed: Vec<(&str, &str)> = pairs.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let p = parts(&borrowed);
        let r = route(SETS);
        both(&r, &p, len, upgrade);
        let plain = route(
            "upstream u { server 127.0.0.1:1; }
             server { listen 127.0.0.1:8080; server_name x.test; location / { proxy_pass http://u; } }",
        );
        both(&plain, &p, len, upgrade);
        // Framing fields a location puts (the client's Transfer-Encoding
        // is hop-by-hop).
        let framing = route(
            "upstream u { server 127.0.0.1:1; keepalive 2; }
             server { listen 127.0.0.1:8080; server_name x.test; location / { proxy_pass http://u;
               proxy_http_version 1.1;
               proxy_set_header Transfer-Encoding $http_x_te;
               proxy_set_header Content-Length $http_x_cl; } }",
        );
        both(&framing, &p, len, upgrade);
    }

    #[test]
    fn the_list_edits_as_the_map_does(
        fields in arb_fields(),
        edits in proptest::collection::vec((0u8..3, 0..EDITED.len(), 0u8..4), 0..12),
    ) {
        let pairs: Vec<(&str, String)> =
            fields.iter().enumerate().map(|(i, &(n, _))| (NAMES[n], format!("v{i}"))).collect();
        let borrowed: Vec<(&str, &str)> = pairs.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let p = parts(&borrowed);
        let mut list = super::Fields::without_hop_by_hop(&p.headers, None, 0);
        let mut map = p.headers.clone();
        strip_hop_by_hop(&mut map, false);
        for (op, n, v) in edits {
            let name = &EDITED[n];
            let value = HeaderValue::from(u16::from(v));
            match op {
                0 => {
                    list.remove(name);
                    map.remove(name);
                }
                1 => {
                    RequestFields::insert(&mut list, name, value.clone());
                    map.insert(name.clone(), value);
                }
                _ => {
                    RequestFields::append(&mut list, name, value.clone());
                    map.append(name.clone(), value);
                }
            }
            let mut by_list = Vec::new();
            list.each(|n, v| by_list.push((n.clone(), v.clone())));
            let by_map: Vec<_> = map.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
            prop_assert_eq!(&by_list, &by_map);
            for name in EDITED.iter() {
                let a: Vec<_> = list.values(name).collect();
                let b: Vec<_> = map.get_all(name).iter().collect();
                prop_assert_eq!(a, b);
            }
        }
    }
}

/// Names the edits of `the_list_edits_as_the_map_does` take, the
/// client's among them.
static EDITED: [HeaderName; 4] = [
    header::ACCEPT,
    header::USER_AGENT,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
];

#[test]
fn names_are_spelt_as_the_client_and_the_conf_wrote_them() {
    // A client's head, its values pieces of it (as the HTTP/1 reader makes them).
    let head = bytes::Bytes::from_static(
        b"GET / HTTP/1.1\r\nX-Weird-CASE:  a\r\nhost: h\r\nx-lower: b\r\nX-Empty:\r\nAccept: */*\r\n\r\n",
    );
    let value = |v: &str| {
        let at = head
            .windows(v.len())
            .position(|w| w == v.as_bytes())
            .expect("in the head");
        http::HeaderValue::from_maybe_shared(head.slice(at..at + v.len())).expect("value")
    };
    let mut p = parts(&[]);
    p.headers.append("x-weird-case", value("a"));
    p.headers.append("host", value("h"));
    p.headers.append("x-lower", value("b"));
    p.headers
        .append("x-empty", http::HeaderValue::from_static(""));
    p.headers.append("accept", value("*/*"));
    // A value that is not a piece of the head: its name lower case.
    p.headers
        .append("x-elsewhere", http::HeaderValue::from_static("c"));
    let route = route(
        "upstream u { server 127.0.0.1:1; }
         server { listen 127.0.0.1:8080; server_name x.test;
           location / { proxy_pass http://u;
             proxy_set_header X-Real-IP $remote_addr; proxy_set_header x-b b; } }",
    );
    // The names as the upstream request spells them, with `head` or without.
    let spelt = |head: Option<&bytes::Bytes>| {
        let list = super::super::outgoing::request_fields(
            &route,
            &p,
            head,
            None,
            addr(),
            addr(),
            &None,
            false,
        );
        let mut names = Vec::new();
        list.each_spelt(|n, _| names.push(String::from_utf8_lossy(n).into_owned()));
        names
    };
    let names = spelt(Some(&head));
    assert_eq!(
        names,
        [
            "X-Weird-CASE",
            // The client's Host, replaced in its place by nginx's `Host`.
            "Host",
            "x-lower",
            "x-empty",
            "Accept",
            "x-elsewhere",
            "X-Real-IP",
            "x-b",
            "Connection"
        ]
    );
    // Without a head (HTTP/2, whose names are lower case on the wire).
    let names = spelt(None);
    assert_eq!(names[0], "x-weird-case");
}
