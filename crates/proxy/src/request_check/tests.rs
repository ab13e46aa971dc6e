use super::*;

fn judge(head: &[u8]) -> Step {
    judge_with(head, HeadLimits::default())
}

fn judge_with(head: &[u8], limits: HeadLimits) -> Step {
    HeadScan::new(limits).feed(head)
}

fn status(head: &[u8]) -> Option<u16> {
    match judge(head) {
        Step::Refuse(s) => Some(s.as_u16()),
        Step::Done { .. } => None,
        Step::More => Some(0),
    }
}

#[test]
fn header_names_as_nginx_parses_them() {
    let p = parse_header_line;
    let h = p(b"X_Real_IP: 6.6.6.6\r\n", false).expect("parsed");
    assert!(h.invalid);
    assert_eq!((h.name, h.value), (&b"X_Real_IP"[..], &b"6.6.6.6"[..]));
    assert!(!p(b"X_Real_IP: 6.6.6.6\r\n", true).expect("parsed").invalid);
    assert!(p(b"X.Y: 1\r\n", true).expect("parsed").invalid);
    assert!(p(b"X@Y: 1\r\n", true).expect("parsed").invalid);
    assert!(p(b"X\xc3\xa9: 1\r\n", true).expect("parsed").invalid);
    assert!(
        !p(b"Content-Length:   5  \r\n", false)
            .expect("parsed")
            .invalid
    );
    assert_eq!(p(b"A:   5  \r\n", false).expect("parsed").value, b"5");
    assert_eq!(p(b"A: x  y \n", false).expect("parsed").value, b"x  y");
    assert_eq!(
        p(b"A:\tchunked\r\n", false).expect("parsed").value,
        b"\tchunked"
    );
    // 400s: space or control byte in the name, a leading colon, NUL, CR alone.
    for bad in [
        &b"Host : x\r\n"[..],
        b" folded\r\n",
        b": x\r\n",
        b"A\x01B: x\r\n",
        b"A: x\x00y\r\n",
        b"A: x\ry\r\n",
    ] {
        assert_eq!(p(bad, true), None, "{:?}", String::from_utf8_lossy(bad));
    }
    // A name alone on its line is a header with an empty value.
    let bare = p(b"Foo\r\n", false).expect("parsed");
    assert_eq!(
        (bare.name, bare.value, bare.has_colon),
        (&b"Foo"[..], &b""[..], false)
    );
}

#[test]
fn framing_rules_of_nginx_1_22() {
    let ok = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_eq!(status(ok), None);
    assert_eq!(status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"), Some(400));
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity, chunked\r\n\r\n"),
        Some(501)
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
        Some(501)
    );
    assert_eq!(status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), Some(400));
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tchunked\r\n\r\n"),
        Some(501)
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\n\r\n"),
        None
    );
    assert_eq!(
        status(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
        Some(400)
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n"),
        Some(400)
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n"),
        Some(400)
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n"),
        Some(400)
    );
    assert_eq!(status(b"GET / HTTP/1.1\r\n\r\n"), Some(400), "no Host");
    assert_eq!(status(b"GET / HTTP/1.0\r\n\r\n"), None);
    assert_eq!(
        status(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
        Some(400)
    );
    assert_eq!(status(b"get / HTTP/1.1\r\nHost: a\r\n\r\n"), Some(400));
    assert_eq!(status(b"GET / HTTP/2.0\r\nHost: a\r\n\r\n"), Some(505));
    assert_eq!(status(b"TRACE / HTTP/1.1\r\nHost: a\r\n\r\n"), Some(405));
    assert_eq!(
        status(b"GET / HTTP/1.1\r\nHost: a\r\n"),
        Some(0),
        "incomplete"
    );
    match judge(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello") {
        Step::Done { end, framing, .. } => {
            assert_eq!(framing, Framing::Length(5));
            assert_eq!(end, 47);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn invalid_lines_are_cut_and_bare_names_get_a_colon() {
    let head =
        b"GET / HTTP/1.1\r\nHost: a\r\nX_Real_IP: 6.6.6.6\r\nFoo\r\nX-Real-IP: 1.1.1.1\r\n\r\n";
    match judge(head) {
        Step::Done {
            rewritten: Some(h), ..
        } => assert_eq!(
            String::from_utf8_lossy(&h),
            "GET / HTTP/1.1\r\nHost: a\r\nFoo:\r\nX-Real-IP: 1.1.1.1\r\n\r\n"
        ),
        other => panic!("{other:?}"),
    }
    let keep = HeadLimits {
        ignore_invalid: false,
        ..HeadLimits::default()
    };
    match judge_with(b"GET / HTTP/1.1\r\nHost: a\r\nX_Y: 1\r\n\r\n", keep) {
        Step::Done { rewritten, .. } => assert_eq!(rewritten, None),
        other => panic!("{other:?}"),
    }
}

#[test]
fn line_limits_of_large_client_header_buffers() {
    let line = |n: usize| format!("X-Long: {}\r\n", "a".repeat(n - 10));
    let head = |lines: &[String]| {
        let mut h = String::from("GET / HTTP/1.1\r\nHost: a\r\n");
        for l in lines {
            h.push_str(l);
        }
        h.push_str("\r\n");
        h.into_bytes()
    };
    assert_eq!(
        status(&head(&[line(8192)])),
        None,
        "a line of 8k fits a buffer"
    );
    assert_eq!(status(&head(&[line(8193)])), Some(400));
    // Four large buffers: four lines of 8000 bytes fill them; a fifth does not fit.
    assert_eq!(status(&head(&vec![line(8000); 4])), None);
    assert_eq!(status(&head(&vec![line(8000); 5])), Some(400));
    let uri = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "u".repeat(9000));
    assert_eq!(status(uri.as_bytes()), Some(414));
    // Refused as soon as the line is too long, before its end arrives.
    let partial = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}", "a".repeat(9000));
    assert_eq!(status(partial.as_bytes()), Some(400));
}

#[test]
fn a_head_fed_byte_by_byte_is_judged_as_a_whole() {
    let heads: [&[u8]; 4] = [
        b"\r\nGET / HTTP/1.1\r\nHost: a\r\nX_Y: 1\r\nFoo\r\nContent-Length: 3\r\n\r\nabc",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"GET / HTTP/1.1\nHost: a\nX-A: 1\n\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
    ];
    for head in heads {
        let whole = judge(head);
        let mut scan = HeadScan::new(HeadLimits::default());
        let mut last = Step::More;
        for end in 1..=head.len() {
            last = scan.feed(&head[..end]);
            if last != Step::More {
                break;
            }
        }
        assert_eq!(last, whole, "{}", String::from_utf8_lossy(head));
    }
}
