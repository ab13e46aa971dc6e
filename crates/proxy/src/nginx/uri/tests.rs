//! The normaliser against what stock nginx 1.22 did with the same targets
//! (each expectation below was seen on nginx's `$uri` and on the URI it sent
//! upstream), and its invariants as properties.

use proptest::prelude::*;

use super::*;

fn norm(t: &str) -> Result<String, UriError> {
    RequestUri::parse(t, true, false).map(|u| String::from_utf8_lossy(u.path()).into_owned())
}

#[test]
fn dots_slashes_and_escapes_as_nginx() {
    let ok = |t: &str, want: &str| assert_eq!(norm(t), Ok(want.to_string()), "{t}");
    ok("/", "/");
    ok("/public/../secret/flag.txt", "/secret/flag.txt");
    ok("/public/%2e%2e/secret/flag.txt", "/secret/flag.txt");
    ok("/public/%2E%2E%2Fsecret/flag.txt", "/secret/flag.txt");
    ok("/public/x/..%2f..%2fy", "/y");
    ok("/static/a/../../etc/passwd", "/etc/passwd");
    ok("/static/a/../b/./c//d", "/static/b/c/d");
    ok("//admin/x", "/admin/x");
    ok("/%61dmin/x", "/admin/x");
    ok("/static/.", "/static/");
    ok("/static/..", "/");
    ok("/static/%2e%2e", "/");
    ok("/a/.b/..c/...", "/a/.b/..c/...");
    ok("/a/b/..?x/../y", "/a/");
    ok("/a/.?q", "/a/");
    ok("/a%2fb", "/a/b");
    ok("/a%2F%2Fb", "/a/b");
    ok("/%7e~", "/~~");
    ok("/a+b", "/a+b");
    ok("/a\\..\\b", "/a\\..\\b");
    ok("/a%23b%3Fc%25d", "/a#b?c%d");
    // A decoded `%` is data: "%252e" is the three bytes "%2e", not a dot.
    ok("/a/%252e%252e/b", "/a/%2e%2e/b");
    ok("/a#frag/../..", "/a");
}

#[test]
fn bad_targets_are_400_as_nginx() {
    let bad = |t: &str, e: UriError| assert_eq!(norm(t), Err(e), "{t}");
    bad("/static/../../etc/passwd", UriError::AboveRoot);
    bad("/..", UriError::AboveRoot);
    bad("/%2e%2e/x", UriError::AboveRoot);
    bad("/a%00b", UriError::Nul);
    bad("/static/%zz", UriError::BadEscape);
    bad("/static/a%4", UriError::BadEscape);
    bad("/a%", UriError::BadEscape);
    bad("*", UriError::NotAbsolutePath);
    bad("?x", UriError::NotAbsolutePath);
    bad("example.test:443", UriError::NotAbsolutePath);
    // The query is not decoded, so nothing in it is an error.
    assert_eq!(norm("/a?q=%zz&b=%00"), Ok("/a".into()));
}

#[test]
fn the_query_is_kept_apart_and_raw() {
    let u = RequestUri::parse("/a/./b?x=%2e&y#frag", true, false).expect("parse");
    assert_eq!(u.path(), b"/a/b");
    assert_eq!(u.args(), "x=%2e&y");
    assert!(
        !u.is_quoted(),
        "a % in the query does not make the path quoted"
    );
    assert_eq!(u.unparsed(), Some("/a/./b?x=%2e&y#frag"));
    let u = RequestUri::parse("/a?", true, false).expect("parse");
    assert_eq!((u.path(), u.args()), (&b"/a"[..], ""));
    assert!(RequestUri::parse("/%61", true, false)
        .expect("parse")
        .is_quoted());
}

#[test]
fn merge_slashes_off_keeps_them() {
    let u = RequestUri::parse("//a///b/../c", false, false).expect("parse");
    assert_eq!(u.path(), b"//a///c");
}

#[test]
fn a_path_past_the_inline_room_normalises_the_same() {
    // 32 bytes stay inline; longer ones, and ".." across the boundary, spill.
    let seg = "/".to_string() + &"a".repeat(40);
    assert_eq!(norm(&format!("{seg}{seg}/../b")), Ok(format!("{seg}/b")));
    assert_eq!(norm(&format!("/x{seg}/%2e%2e/c?q")), Ok("/x/c".to_string()));
    let mut u = RequestUri::parse("/short", true, false).expect("parse");
    u.rewrite(seg.clone().into_bytes(), String::new());
    assert_eq!(u.path(), seg.as_bytes());
    assert_eq!(u.unparsed(), None, "a rewritten path is not the client's");
}

#[test]
fn absolute_form_without_a_path_is_slash() {
    let u = RequestUri::parse("?x", true, true).expect("parse");
    assert_eq!((u.path(), u.args(), u.unparsed()), (&b"/"[..], "x", None));
    let u = RequestUri::parse("", true, true).expect("parse");
    assert_eq!((u.path(), u.unparsed()), (&b"/"[..], Some("/")));
}

#[test]
fn decoded_bytes_are_kept_as_bytes() {
    let u = RequestUri::parse("/%C3%A9%FF%0a", true, false).expect("parse");
    assert_eq!(u.path(), b"/\xc3\xa9\xff\n");
}

#[test]
fn escape_uri_is_nginx_escape_uri() {
    let esc = |b: &[u8]| {
        let mut s = String::new();
        escape_uri(&mut s, b);
        s
    };
    // What nginx sent upstream for /static/%61%20b%3F%23%25%2B+\"{}|^\xe9.
    assert_eq!(
        esc(b"/a b?#%++\\\"{}|^\xe9"),
        "/a%20b%3F%23%25++%5C%22%7B%7D%7C%5E%E9"
    );
    assert_eq!(esc(b"/\xc3\xa9\xff\n<>`\x7f"), "/%C3%A9%FF%0A%3C%3E%60%7F");
    assert_eq!(
        esc(b"/-._~:@!$&'()*+,;=[]"),
        "/-._~:@!$&'()*+,;=[]",
        "unreserved, gen-delims but #?, sub-delims stay"
    );
}

/// Path-like targets: segments of dots, slashes, escapes and plain bytes.
fn target() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("/".to_string()),
        Just(".".to_string()),
        Just("..".to_string()),
        Just("%2e".to_string()),
        Just("%2F".to_string()),
        Just("%25".to_string()),
        Just("%3f".to_string()),
        Just("?".to_string()),
        "[a-z+~]{1,3}",
        "%[0-9a-fA-F]{2}",
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|v| format!("/{}", v.concat()))
}

/// The normalised path as a target again: escape what would not survive.
fn retarget(path: &[u8]) -> String {
    let mut s = String::new();
    escape_uri(&mut s, path);
    s
}

proptest! {
    #[test]
    fn normalising_twice_is_once(t in target()) {
        if let Ok(once) = RequestUri::parse(&t, true, false) {
            let again = RequestUri::parse(&retarget(once.path()), true, false);
            prop_assert_eq!(again.map(|u| u.path().to_vec()), Ok(once.path().to_vec()));
        }
    }

    #[test]
    fn no_dot_segments_or_double_slashes_remain(t in target()) {
        if let Ok(u) = RequestUri::parse(&t, true, false) {
            let p = u.path();
            prop_assert!(p.starts_with(b"/"));
            prop_assert!(!p.windows(2).any(|w| w == b"//"), "{:?}", u);
            prop_assert!(!p.windows(4).any(|w| w == b"/../"), "{:?}", u);
            prop_assert!(!p.windows(3).any(|w| w == b"/./"), "{:?}", u);
            prop_assert!(!p.ends_with(b"/..") && !p.ends_with(b"/."), "{:?}", u);
        }
    }

    #[test]
    fn any_str_is_judged_without_panicking(t in "\\PC{0,40}") {
        let _ = RequestUri::parse(&t, true, false);
        let _ = RequestUri::parse(&t, false, true);
    }
}
