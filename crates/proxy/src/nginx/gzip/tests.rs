use super::*;

#[test]
fn accept_encoding_is_read_as_nginx_reads_it() {
    for (ae, ok) in [
        (&b"gzip"[..], true),
        (b"gzip, deflate", true),
        (b"deflate, gzip", true),
        (b"deflate,GZIP;q=0.5", true),
        (b"gzip;q=0", false),
        (b"gzip; q=0.000", false),
        (b"gzip;q=1.0", true),
        (b"gzip;q=2", false),
        (b"xgzip", false),
        (b"br", false),
        (b"gzipx", false),
        (b"identity, gzip ;q=0.1", true),
    ] {
        let r = ae.len() >= 4 && (ae.starts_with(b"gzip,") || accepts_gzip(ae));
        assert_eq!(r, ok, "{}", String::from_utf8_lossy(ae));
    }
}

#[test]
fn content_types_are_cut_only_before_charset() {
    let t = |types: &[&str], ct: &str| {
        let types: Vec<String> = types.iter().map(|s| s.to_string()).collect();
        type_listed(&types, Some(&HeaderValue::from_str(ct).expect("value")))
    };
    assert!(t(&[], "text/html"));
    assert!(t(&[], "Text/HTML; charset=utf-8"));
    assert!(!t(&[], "text/html; q=1"), "nginx keeps other parameters");
    assert!(!t(&[], "text/plain"));
    assert!(t(&["application/json"], "application/json;charset=UTF-8"));
    assert!(t(&["*"], "image/png"));
    assert!(!t(&[], ""));
}

#[test]
fn msie6_and_weak_etags() {
    assert!(msie6(b"Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.0)"));
    assert!(!msie6(
        b"Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1; SV1)"
    ));
    assert!(!msie6(
        b"Mozilla/4.0 (compatible; MSIE 7.0; Windows NT 5.1)"
    ));
    assert!(!msie6(b"Opera MSIE 5.0 x"));
    let mut h = HeaderMap::new();
    h.insert(header::ETAG, HeaderValue::from_static("\"abc\""));
    weak_etag(&mut h);
    assert_eq!(h[header::ETAG], "W/\"abc\"");
    weak_etag(&mut h);
    assert_eq!(h[header::ETAG], "W/\"abc\"");
    h.insert(header::ETAG, HeaderValue::from_static("abc"));
    weak_etag(&mut h);
    assert!(!h.contains_key(header::ETAG));
}
