use super::*;

fn parts(headers: &[(&str, &[u8])]) -> Parts {
    let mut b = http::Request::builder().uri("/a?b=1");
    for (n, v) in headers {
        b = b.header(*n, http::HeaderValue::from_bytes(v).expect("value"));
    }
    b.body(()).expect("request").into_parts().0
}

fn line(text: &str, escape: LogEscape, p: &Parts) -> String {
    let cx = VarContext {
        parts: p,
        target: None,
        client: "10.0.0.9:5555".parse().expect("addr"),
        local: "127.0.0.1:8080".parse().expect("addr"),
        proxy_host: "api",
        attempts: &[],
        status: 200,
        request_time: 0.0,
    };
    let end = End {
        // 2026-12-01 07:12:58 UTC
        now: std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_796_109_178_123),
        request_time: 1.2345,
        body_bytes_sent: 42,
    };
    let f = Format::compile(text, escape, &Scope::default()).expect("compile");
    let out = f.render(&cx).finish(&end);
    String::from_utf8(out).expect("utf8")
}

#[test]
fn combined_is_nginx_combined() {
    let p = parts(&[
        ("user-agent", b"curl/8 \"x\"\\ \xe9"),
        ("authorization", b"Basic YWxpY2U6c2VjcmV0"),
    ]);
    assert_eq!(
        line(COMBINED, LogEscape::Default, &p),
        "10.0.0.9 - alice [01/Dec/2026:07:12:58 +0000] \"GET /a?b=1 HTTP/1.1\" 200 42 \"-\" \"curl/8 \\x22x\\x22\\x5C \\xE9\"\n"
    );
}

#[test]
fn the_log_variables_and_escapes_are_nginx_s() {
    let p = parts(&[
        ("x-a", b"q\"\t\xff"),
        ("x-empty", b""),
        ("cookie", b"a=1"),
        ("Cookie", b"b=2"),
    ]);
    assert_eq!(
        line(
            "$time_iso8601|$msec|$request_time|${status}",
            LogEscape::Default,
            &p
        ),
        "2026-12-01T07:12:58+00:00|1796109178.123|1.234|200\n"
    );
    assert_eq!(
        line(
            "$http_x_a|$http_x_empty|$http_nope|$remote_user",
            LogEscape::Default,
            &p
        ),
        "q\\x22\\x09\\xFF||-|-\n"
    );
    assert_eq!(
        line("$http_cookie|$http_nope", LogEscape::Json, &p),
        "a=1; b=2|\n"
    );
    assert_eq!(
        line("$http_cookie|$http_nope", LogEscape::None, &p),
        "a=1; b=2|\n"
    );
    assert_eq!(line("$http_cookie", LogEscape::Default, &p), "a=1; b=2\n");
    assert_eq!(
        line("$upstream_addr $args $proxy_host", LogEscape::Default, &p),
        "- b=1 api\n"
    );
    let mut esc = Vec::new();
    escape_json(&mut esc, b"\x01\x1f\x08\x0c\r\"\\\xe9");
    assert_eq!(esc, b"\\u0001\\u001F\\b\\f\\r\\\"\\\\\xe9");
}

#[test]
fn unknown_variables_are_refused_when_compiled() {
    assert!(Format::compile("$nope", LogEscape::Default, &Scope::default()).is_err());
    assert!(Format::compile("$bytes_sent", LogEscape::Default, &Scope::default()).is_err());
    // A `map` or `set` variable of the conf is known to a log format.
    let mut scope = Scope::default();
    scope.declare("backend_group");
    assert!(Format::compile("$backend_group", LogEscape::Default, &scope).is_ok());
    assert!(Format::compile("$realip_remote_addr", LogEscape::Default, &scope).is_ok());
}

#[test]
fn remote_user_is_decoded_as_nginx_decodes_it() {
    let u = |v: &[u8]| remote_user(&parts(&[("authorization", v)]));
    assert_eq!(u(b"Basic YWxpY2U6c2VjcmV0").as_deref(), Some(&b"alice"[..]));
    assert_eq!(u(b"basic   YWxpY2U6").as_deref(), Some(&b"alice"[..]));
    assert_eq!(u(b"Basic OnNlY3JldA=="), None, "empty user");
    assert_eq!(u(b"Basic YWxpY2U="), None, "no colon");
    assert_eq!(u(b"Basic !!!!"), None);
    assert_eq!(u(b"Bearer YWxpY2U6c2VjcmV0"), None);
}

#[test]
fn a_log_is_checked_as_a_writer_compiles_it_without_opening_its_file() {
    use vigil_core::config::{AccessLog, LogFormat, LogFormatDef, Origin};
    let log = |format: LogFormat, condition: Option<&str>| AccessLog {
        path: "/nonexistent/dir/access.log".into(),
        format,
        condition: condition.map(str::to_string),
    };
    let scope = Scope::default();
    let def = |text: &str| {
        LogFormat::Custom(LogFormatDef {
            name: "x".into(),
            escape: LogEscape::Default,
            text: text.into(),
            origin: Origin::at("t.conf".into(), 2, 5),
        })
    };
    assert!(crate::obs::log::check(&log(LogFormat::Combined, None), &scope).is_ok());
    assert!(crate::obs::log::check(&log(def("$remote_addr $status"), None), &scope).is_ok());
    let e = crate::obs::log::check(&log(def("$remote_addr $request_length"), None), &scope)
        .expect_err("unknown");
    assert!(
        e.starts_with("log_format \"x\" at t.conf:2:5: ") && e.contains("$request_length"),
        "{e}"
    );
    let e = crate::obs::log::check(&log(LogFormat::Json, Some("$nope")), &scope).expect_err("if=");
    assert!(e.contains("if=$nope"), "{e}");
}
