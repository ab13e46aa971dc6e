use super::fields::{arg, cookie};
use super::*;

fn cx_parts(uri: &str) -> Parts {
    let (p, _) = http::Request::builder()
        .uri(uri)
        .header("host", "Example.com:8080")
        .header("x-forwarded-for", "1.2.3.4")
        .header("x-req-id", "r1")
        .body(())
        .expect("request")
        .into_parts();
    p
}

fn cx(parts: &Parts) -> VarContext<'_> {
    VarContext {
        parts,
        target: None,
        client: "10.0.0.9:5555".parse().expect("addr"),
        local: "127.0.0.1:8080".parse().expect("addr"),
        proxy_host: "api",
        attempts: &[],
        status: 200,
        request_time: 0.0,
    }
}

/// The value of `text` for `cx`, as text (the values here are ASCII).
fn text(text: &str, scope: &Scope, cx: &VarContext<'_>) -> String {
    let v = Template::parse_with(text, scope).expect("parse").expand(cx);
    String::from_utf8(v).expect("ASCII")
}

#[test]
fn expands_the_common_variables() {
    let parts = cx_parts("/a/b?x=1&k=v");
    let cx = cx(&parts);
    let t = |s: &str| text(s, &Scope::default(), &cx);
    assert_eq!(t("$host"), "example.com");
    assert_eq!(t("$remote_addr:$remote_port"), "10.0.0.9:5555");
    assert_eq!(t("$proxy_add_x_forwarded_for"), "1.2.3.4, 10.0.0.9");
    assert_eq!(t("$request_uri|$uri|$args"), "/a/b?x=1&k=v|/a/b|x=1&k=v");
    assert_eq!(t("${arg_k}-$http_x_req_id"), "v-r1");
    assert_eq!(t("$proxy_host"), "api");
    assert_eq!(t("cost: 5$"), "cost: 5$");
    assert!(Template::parse("$nope").is_err());
    assert!(Template::parse("plain").expect("parse").is_literal());
}

#[test]
fn captures_set_variables_and_clock_variables_expand() {
    let mut parts = cx_parts("/a?x=1");
    parts.extensions.insert(RequestVars {
        captures: vec![Some(b"/a".to_vec()), Some(b"a".to_vec()), None],
        named: [(Arc::from("v"), b"set".to_vec())].into_iter().collect(),
    });
    let cx = cx(&parts);
    let mut scope = Scope::default();
    scope.declare("v");
    let t = |s: &str| text(s, &scope, &cx);
    assert_eq!(t("$1|$2|$3|$12"), "a|||a2");
    assert_eq!(t("[$v]$is_args$args"), "[set]?x=1");
    assert_eq!(t("$server_addr"), "127.0.0.1");
    assert!(Template::parse("$v").is_err(), "unknown without the scope");
}

/// A request whose fields hold bytes that are not UTF-8 (as the HTTP/1
/// reader takes them: obs-text is a field's).
fn raw_parts(fields: &[(&str, &[u8])]) -> Parts {
    let mut b = http::Request::builder().uri("/p?q=1");
    for (n, v) in fields {
        b = b.header(*n, HeaderValue::from_bytes(v).expect("a field value"));
    }
    b.body(()).expect("request").into_parts().0
}

#[test]
fn values_from_the_request_keep_their_bytes() {
    let mut parts = raw_parts(&[
        ("x-tag", b"caf\xc3\xa9"),
        ("x-bin", b"a\xffb"),
        ("x-hi", b"\x80"),
        ("x-forwarded-for", b"1.2.3.4\xff"),
        ("x-forwarded-for", b""),
        ("cookie", b"c=\xfe\xfd; d=1"),
    ]);
    parts.extensions.insert(RequestVars {
        captures: vec![Some(b"/\xff".to_vec()), Some(b"\xff\x01".to_vec())],
        named: [(Arc::from("v"), b"\xc0".to_vec())].into_iter().collect(),
    });
    let cx = cx(&parts);
    let mut scope = Scope::default();
    scope.declare("v");
    let t = |s: &str| Template::parse_with(s, &scope).expect("parse").expand(&cx);
    assert_eq!(t("$http_x_tag"), b"caf\xc3\xa9");
    assert_eq!(t("<$http_x_bin>"), b"<a\xffb>");
    assert_eq!(t("$http_x_hi"), b"\x80");
    assert_eq!(t("$proxy_add_x_forwarded_for"), b"1.2.3.4\xff, , 10.0.0.9");
    assert_eq!(t("$http_x_forwarded_for"), b"1.2.3.4\xff, ");
    assert_eq!(t("$cookie_c|$http_cookie"), b"\xfe\xfd|c=\xfe\xfd; d=1");
    assert_eq!(t("$1$v"), b"\xff\x01\xc0");
    assert_eq!(t("$http_x_bin").len(), 3, "no byte replaced by U+FFFD");
}

#[test]
fn http_variables_take_the_lines_nginx_1_22_takes() {
    let parts = raw_parts(&[
        ("x-tag", b"one"),
        ("x-tag", b"two"),
        ("cookie", b"a=1"),
        ("cookie", b"b=2"),
        ("x-forwarded-for", b"1.1.1.1"),
        ("x-forwarded-for", b"2.2.2.2"),
        ("x-empty", b""),
    ]);
    let cx = cx(&parts);
    let t = |s: &str| text(s, &Scope::default(), &cx);
    assert_eq!(t("$http_x_tag"), "one", "the first line");
    assert_eq!(t("$http_cookie"), "a=1; b=2");
    assert_eq!(t("$http_x_forwarded_for"), "1.1.1.1, 2.2.2.2");
    assert_eq!(t("[$http_x_empty][$http_x_none]"), "[][]");
}

#[test]
fn a_field_value_carries_obs_text_but_no_control_byte() {
    for v in [&b"caf\xc3\xa9"[..], b"a\xffb", b"\x80", b"a\tb", b""] {
        let f = field_value(v.to_vec()).expect("a field");
        assert_eq!(f.as_bytes(), v);
    }
    for v in [
        &b"/a\r\nSet-Cookie: x"[..],
        b"a\x00b",
        b"\x01",
        b"a\x7f",
        b"\n",
    ] {
        assert!(field_value(v.to_vec()).is_none(), "{v:?}");
    }
    // Line breaks at the end (`add_header X "$v\n"`) end the line as
    // nginx's do: the value without them.
    for (v, sent) in [(&b"x:bar y:0\n"[..], &b"x:bar y:0"[..]), (b"a\r\n", b"a")] {
        assert_eq!(field_value(v.to_vec()).expect("a field").as_bytes(), sent);
    }
}

#[test]
fn args_and_cookies_are_found_as_nginx_finds_them() {
    assert_eq!(arg("a&a=2", "a"), Some("2"));
    assert_eq!(arg("xa=1&A=5", "a"), Some("5"));
    assert_eq!(arg("b=1", "a"), None);
    let c = |lines: &[&str], n: &str| {
        cookie(lines.iter().map(|l| l.as_bytes()), n.as_bytes())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(c(&["a=1; b=2"], "b").as_deref(), Some("2"));
    assert_eq!(c(&["xb=1; b = 4 ; c=5"], "b").as_deref(), Some("4 "));
    assert_eq!(c(&["a=1, b=7"], "b").as_deref(), Some("7"));
    assert_eq!(c(&["c=1", "B=9;d"], "b").as_deref(), Some("9"));
    assert_eq!(c(&["bb=1;b"], "b"), None);
    let id = RequestId::new().to_string();
    assert_eq!(id.len(), 32);
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(RequestId(0xab).to_string(), format!("{:0>32}", "ab"));
    assert_ne!(id, RequestId::new().to_string());
}

#[test]
fn a_template_reading_request_id_makes_requests_draw_one() {
    // The flag is the process's (other tests may have set it first);
    // what must hold is that after a template reads the id, every
    // request draws a fresh one.
    Template::parse("id=$request_id").unwrap();
    let (a, b) = (RequestId::draw(), RequestId::draw());
    assert!(a.is_some() && b.is_some());
    assert_ne!(a, b);
}

#[test]
fn realip_remote_addr_and_port_are_the_peer_before_realip() {
    let mut parts = cx_parts("/");
    // Without realip: the client itself.
    let t = |p: &Parts| {
        text(
            "$realip_remote_addr:$realip_remote_port $remote_addr:$remote_port",
            &Scope::default(),
            &cx(p),
        )
    };
    assert_eq!(t(&parts), "10.0.0.9:5555 10.0.0.9:5555");
    // realip replaced the client; the original peer stays readable.
    parts.extensions.insert(crate::nginx::realip::Original(
        "127.0.0.1:40000".parse().expect("addr"),
    ));
    assert_eq!(t(&parts), "127.0.0.1:40000 10.0.0.9:5555");
}
