use super::*;

fn ri(from: &[&str], header: RealIpHeader, recursive: bool) -> RealIp {
    RealIp {
        from: from.iter().map(|c| Cidr::parse(c).expect("cidr")).collect(),
        header,
        recursive,
    }
}

fn headers(lines: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in lines {
        h.append(
            http::HeaderName::from_bytes(n.as_bytes()).expect("name"),
            v.parse().expect("value"),
        );
    }
    h
}

fn ip(ri: &RealIp, peer: &str, h: &[(&str, &str)]) -> String {
    let peer: SocketAddr = format!("{peer}:5000").parse().expect("peer");
    client(&RealIp::default(), ri, peer, &headers(h))
        .ip()
        .to_string()
}

#[test]
fn x_real_ip_from_a_trusted_peer_only() {
    let r = ri(&["10.0.0.0/8"], RealIpHeader::XRealIp, false);
    assert_eq!(ip(&r, "10.1.2.3", &[("x-real-ip", "1.2.3.4")]), "1.2.3.4");
    assert_eq!(ip(&r, "11.1.2.3", &[("x-real-ip", "1.2.3.4")]), "11.1.2.3");
    assert_eq!(ip(&r, "10.1.2.3", &[("x-real-ip", "junk")]), "10.1.2.3");
    assert_eq!(
        ip(&r, "10.1.2.3", &[("x-real-ip", "1.2.3.4:80")]),
        "1.2.3.4"
    );
    assert_eq!(ip(&r, "10.1.2.3", &[]), "10.1.2.3");
    let off = ri(&[], RealIpHeader::XRealIp, false);
    assert_eq!(
        ip(&off, "10.1.2.3", &[("x-real-ip", "1.2.3.4")]),
        "10.1.2.3"
    );
}

#[test]
fn x_forwarded_for_walks_back_through_trusted_addresses() {
    let xff = |rec| {
        ri(
            &["10.0.0.0/8", "192.168.0.0/16"],
            RealIpHeader::XForwardedFor,
            rec,
        )
    };
    let h = [("x-forwarded-for", "1.1.1.1, 192.168.0.9, 10.0.0.7")];
    assert_eq!(ip(&xff(false), "10.0.0.1", &h), "10.0.0.7");
    assert_eq!(ip(&xff(true), "10.0.0.1", &h), "1.1.1.1");
    let h = [("x-forwarded-for", "1.1.1.1, 2.2.2.2, 10.0.0.7")];
    assert_eq!(ip(&xff(true), "10.0.0.1", &h), "2.2.2.2");
    // Every line, the last first.
    let h = [
        ("x-forwarded-for", "3.3.3.3"),
        ("x-forwarded-for", "10.9.9.9 ,"),
    ];
    assert_eq!(ip(&xff(true), "10.0.0.1", &h), "3.3.3.3");
    assert_eq!(ip(&xff(false), "10.0.0.1", &h), "10.9.9.9");
    let h = [("x-forwarded-for", "bad, 10.0.0.7")];
    assert_eq!(ip(&xff(true), "10.0.0.1", &h), "10.0.0.7");
    let h = [("x-forwarded-for", "2001:db8::1")];
    assert_eq!(ip(&xff(false), "10.0.0.1", &h), "2001:db8::1");
}

#[test]
fn any_header_and_addresses_with_ports() {
    let r = ri(
        &["127.0.0.1"],
        RealIpHeader::Other("cf-connecting-ip".into()),
        false,
    );
    assert_eq!(
        ip(&r, "127.0.0.1", &[("CF-Connecting-IP", "5.6.7.8")]),
        "5.6.7.8"
    );
    assert_eq!(
        addr_port(b"[2001:db8::1]:443"),
        "[2001:db8::1]:443".parse().ok()
    );
    assert_eq!(addr_port(b"1.2.3.4:0"), None);
    assert_eq!(addr_port(b"[::1]"), None);
}

#[test]
fn the_server_s_settings_come_first() {
    let server = ri(&["127.0.0.1"], RealIpHeader::XForwardedFor, false);
    let location = ri(&["192.0.2.1"], RealIpHeader::XRealIp, false);
    let peer: SocketAddr = "127.0.0.1:5000".parse().expect("peer");
    let h = headers(&[("x-forwarded-for", "1.1.1.1"), ("x-real-ip", "2.2.2.2")]);
    assert_eq!(
        client(&server, &location, peer, &h).ip().to_string(),
        "1.1.1.1"
    );
    // The server's declined (untrusted peer): the location's apply.
    let location = ri(&["127.0.0.1"], RealIpHeader::XRealIp, false);
    let server = ri(&["192.0.2.1"], RealIpHeader::XForwardedFor, false);
    assert_eq!(
        client(&server, &location, peer, &h).ip().to_string(),
        "2.2.2.2"
    );
}
