//! Virtual hosts as nginx 1.22 picks them: the request's host (request
//! line, `Host` header or HTTP/2 `:authority`) validated as
//! `ngx_http_validate_host` does, and the `server_name`s of the blocks that
//! share an address looked up as `ngx_http_find_virtual_server` does:
//! exact names, then the longest leading wildcard (`*.example.com`,
//! `.example.com`), then the longest trailing one (`www.example.*`), then
//! `~regex` names in config order, else the address's default server.

use std::collections::HashMap;
use std::sync::Arc;

use vigil_config::pattern::{self, Groups, MatchError, Regex};

/// The `server_name`s of the blocks on one address.
#[derive(Debug, Default)]
pub(crate) struct ServerNames {
    /// Exact names (and `""`), first block wins.
    exact: HashMap<String, usize>,
    /// Names taken for the exact table's conflict check (nginx puts the
    /// `example.com` of `.example.com` there too).
    taken: HashMap<String, ()>,
    /// `*.example.com` / `.example.com` by `example.com`; `true` when the
    /// bare name matches too (the `.example.com` form).
    head: HashMap<String, (usize, bool)>,
    /// `www.example.*` by `www.example`.
    tail: HashMap<String, usize>,
    /// `~regex` names, in config order.
    regex: Vec<NameRegex>,
}

/// A `~regex` server name.
#[derive(Debug)]
struct NameRegex {
    re: Regex,
    server: usize,
    /// Its named groups and their numbers; `groups`: whether it has any
    /// group (nginx then sets `$1`.. and the named ones from the host).
    names: Vec<(Arc<str>, usize)>,
    groups: bool,
}

/// What the `server_name` regex that picked a block captured of the host:
/// nginx sets `$1`.. and the regex's named groups from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NameCaptures<'a> {
    /// The groups, the whole host first.
    pub(crate) groups: Groups,
    /// The named groups and their numbers.
    pub(crate) names: &'a [(Arc<str>, usize)],
}

/// A `server_name` nginx refuses to start with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NameError(pub(crate) String);

// === impl ServerNames ===

impl ServerNames {
    /// Add block `server`'s `name` (in config order; a name an earlier
    /// block already has is ignored, as nginx warns "conflicting server
    /// name ... ignored").
    pub(crate) fn add(&mut self, name: &str, server: usize) -> Result<(), NameError> {
        let invalid = || NameError(format!("server name \"{name}\" is invalid"));
        if let Some(pattern) = name.strip_prefix('~') {
            if pattern.is_empty() {
                return Err(NameError(format!("empty regex in server name \"{name}\"")));
            }
            // ngx_http_core_server_name: caseless when the pattern has
            // an upper-case ASCII letter.
            let caseless = pattern.bytes().any(|b| b.is_ascii_uppercase());
            let re = pattern::compile(pattern, caseless).map_err(NameError)?;
            let names = re
                .capture_names()
                .enumerate()
                .filter_map(|(i, n)| n.map(|n| (Arc::from(n), i)))
                .collect();
            let groups = re.capture_names().count() > 1;
            self.regex.push(NameRegex {
                re,
                server,
                names,
                groups,
            });
            return Ok(());
        }
        if name.eq_ignore_ascii_case("$hostname") {
            return Err(NameError(
                "server_name $hostname is not supported by vigil; write the name".into(),
            ));
        }
        let bytes = name.as_bytes();
        // ngx_http_core_server_name's own checks.
        if (bytes.first() == Some(&b'*') && (bytes.len() < 3 || bytes[1] != b'.'))
            || (bytes.first() == Some(&b'.') && bytes.len() < 2)
        {
            return Err(invalid());
        }
        let name = name.to_ascii_lowercase();
        // ngx_hash_add_key(NGX_HASH_WILDCARD_KEY).
        let wildcard = || NameError(format!("invalid server name or wildcard \"{name}\""));
        if name.bytes().filter(|&b| b == b'*').count() > 1
            || name.contains("..")
            || name.contains('\0')
        {
            return Err(wildcard());
        }
        if let Some(base) = name.strip_prefix('.').filter(|_| name.len() > 1) {
            if self.taken.contains_key(base) {
                return Ok(());
            }
            self.taken.insert(base.to_string(), ());
            self.head.entry(base.to_string()).or_insert((server, true));
        } else if let Some(base) = name.strip_prefix("*.").filter(|_| name.len() > 2) {
            self.head.entry(base.to_string()).or_insert((server, false));
        } else if let Some(base) = name.strip_suffix(".*").filter(|_| name.len() > 2) {
            self.tail.entry(base.to_string()).or_insert(server);
        } else if name.contains('*') {
            return Err(wildcard());
        } else if !self.taken.contains_key(&name) {
            self.taken.insert(name.clone(), ());
            self.exact.insert(name, server);
        }
        Ok(())
    }

    /// The block whose names `host` (validated, lower-case) matches, if
    /// any; an error when a regex could not finish its match (PCRE's match
    /// limit: nginx gives up on the request).
    pub(crate) fn find(&self, host: &str) -> Result<Option<usize>, MatchError> {
        Ok(self.lookup(host)?.map(|(s, _)| s))
    }

    /// [`ServerNames::find`], with what the regex that picked the block
    /// captured (when it has groups).
    pub(crate) fn lookup(
        &self,
        host: &str,
    ) -> Result<Option<(usize, Option<NameCaptures<'_>>)>, MatchError> {
        if let Some(&s) = self.exact.get(host) {
            return Ok(Some((s, None)));
        }
        if host.is_empty() {
            return Ok(None);
        }
        if let Some(s) = self.find_head(host) {
            return Ok(Some((s, None)));
        }
        // Longest "prefix.*" first: cut at each dot from the right.
        for (i, _) in host.rmatch_indices('.') {
            if let Some(&s) = self.tail.get(&host[..i]) {
                return Ok(Some((s, None)));
            }
        }
        for n in &self.regex {
            if !n.groups {
                if n.re.is_match(host.as_bytes())? {
                    return Ok(Some((n.server, None)));
                }
                continue;
            }
            if let Some(groups) = n.re.captures(host.as_bytes())? {
                let names = &n.names[..];
                return Ok(Some((n.server, Some(NameCaptures { groups, names }))));
            }
        }
        Ok(None)
    }

    /// Whether a regex name has groups: nginx then looks the host up even
    /// for the only block of an address, to set them.
    pub(crate) fn captures(&self) -> bool {
        self.regex.iter().any(|n| n.groups)
    }

    /// The longest leading wildcard: the whole host (`.example.com` form
    /// only), then the suffix after each dot from the left.
    fn find_head(&self, host: &str) -> Option<usize> {
        if self.head.is_empty() {
            return None;
        }
        if let Some(&(s, true)) = self.head.get(host) {
            return Some(s);
        }
        host.match_indices('.')
            .find_map(|(i, _)| self.head.get(&host[i + 1..]))
            .map(|&(s, _)| s)
    }
}

/// `ngx_http_validate_host`: the host lower-cased, without its port and
/// one trailing dot; None where nginx answers 400 (`/`, a control byte or
/// space, `..`, nothing left). `\` is allowed, as on every Unix nginx.
///
/// One pass over the bytes, each byte's class from a table, for what
/// nginx's loop checks of every byte (none refused, no two dots together)
/// and finds (the first `:` or `]`, the last dot, an upper-case letter);
/// then the host is copied once, and lower-cased only if it has to be.
pub(crate) fn validate_host(raw: &[u8]) -> Option<Host> {
    let (host, upper) = host_part(raw)?;
    Some(lowercase(host, upper))
}

/// [`validate_host`]'s host as bytes, for `$host` when the host is not
/// UTF-8 (which [`Host`] holds with U+FFFD): nginx keeps its bytes.
pub(crate) fn validate_host_bytes(raw: &[u8]) -> Option<Vec<u8>> {
    host_part(raw).map(|(host, _)| host.to_ascii_lowercase())
}

/// The host part of a valid `raw`, and whether it has an upper-case letter.
#[inline]
fn host_part(raw: &[u8]) -> Option<(&[u8], bool)> {
    const NONE: usize = usize::MAX;
    // The index just after the last dot (nginx's `dot_pos + 1`).
    let mut after_dot = NONE;
    let (mut colon, mut close) = (NONE, NONE);
    let mut upper = false;
    for (i, &ch) in raw.iter().enumerate() {
        match HOST_BYTES[usize::from(ch)] {
            Class::Plain => {}
            Class::Upper => upper = true,
            Class::Dot => {
                if after_dot == i {
                    return None;
                }
                after_dot = i + 1;
            }
            Class::Colon => colon = colon.min(i),
            Class::Close => close = close.min(i),
            Class::Bad => return None,
        }
    }
    // nginx's states: an IP literal (`[` first) ends after its first `]`,
    // a name at its first `:`; without either, the host is all of it.
    let mut host_len = if raw.first() == Some(&b'[') {
        close.saturating_add(1).min(raw.len())
    } else {
        colon.min(raw.len())
    };
    if after_dot == host_len {
        host_len -= 1;
    }
    let host = raw.get(..host_len).filter(|h| !h.is_empty())?;
    Some((host, upper))
}

/// What [`validate_host`] does with a byte.
#[derive(Clone, Copy)]
enum Class {
    Plain,
    Upper,
    Dot,
    Colon,
    Close,
    /// `/`, a control byte or space: 400.
    Bad,
}

const HOST_BYTES: [Class; 256] = {
    let mut t = [Class::Plain; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = match i as u8 {
            b'.' => Class::Dot,
            b':' => Class::Colon,
            b']' => Class::Close,
            b'/' => Class::Bad,
            c if c <= 0x20 || c == 0x7f => Class::Bad,
            b'A'..=b'Z' => Class::Upper,
            _ => Class::Plain,
        };
        i += 1;
    }
    t
};

/// A validated request host (`r->headers_in.server`): lower-case text,
/// inline when short (up to 24 bytes: `127.0.0.1`, `www.example.com`), as
/// nearly every host is.
pub(crate) type Host = compact_str::CompactString;

/// `raw` lower-cased (ASCII only; `upper`: it has an upper-case letter,
/// else it is copied as it is), invalid UTF-8 replaced.
fn lowercase(raw: &[u8], upper: bool) -> Host {
    // Valid UTF-8 (every host that routes) is copied as it is; the lossy
    // path walks the bytes in chunks. ASCII lower-casing keeps UTF-8 valid
    // or invalid as it was.
    let mut text = match std::str::from_utf8(raw) {
        Ok(text) => Host::new(text),
        Err(_) => Host::from_utf8_lossy(raw),
    };
    if upper {
        text.make_ascii_lowercase();
    }
    text
}

/// The host part of an absolute-form request target's authority, where it
/// has the grammar nginx's request-line parser accepts (`sw_host_start` to
/// `sw_port`): letters, digits, `.` and `-`, or an IP literal in brackets,
/// then `:` and digits. None (400) for anything else, such as `user@host`.
pub(crate) fn request_line_host(authority: &str) -> Option<&str> {
    let b = authority.as_bytes();
    let end = if b.first() == Some(&b'[') {
        let close = b.iter().position(|&c| c == b']')?;
        let literal_ok = b[1..close]
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || b":-._~!$&'()*+,;=".contains(&c));
        if !literal_ok {
            return None;
        }
        close + 1
    } else {
        b.iter()
            .position(|&c| !(c.is_ascii_alphanumeric() || c == b'.' || c == b'-'))
            .unwrap_or(b.len())
    };
    match &b[end..] {
        [] => {}
        [b':', port @ ..] if port.iter().all(u8::is_ascii_digit) => {}
        _ => return None,
    }
    authority.get(..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_validated_as_nginx() {
        let v = |h: &str| validate_host(h.as_bytes());
        // Each seen on stock nginx: $host for the accepted ones, 400 for None.
        assert_eq!(v("A.TEST.:8080").as_deref(), Some("a.test"));
        assert_eq!(v("[::1]:8080").as_deref(), Some("[::1]"));
        assert_eq!(v("[::1]").as_deref(), Some("[::1]"));
        assert_eq!(v("[::1").as_deref(), Some("[::1"));
        assert_eq!(v("a\\b").as_deref(), Some("a\\b"));
        assert_eq!(v("a:b:c").as_deref(), Some("a"));
        assert_eq!(
            v("a.:8.0").as_deref(),
            Some("a."),
            "the trailing dot test sees the last dot"
        );
        assert_eq!(v("*.wild.test").as_deref(), Some("*.wild.test"));
        assert_eq!(v("é.test").as_deref(), Some("é.test"));
        for bad in ["a/b", "a..b", "", ".", ":80", "a b", "a\x01b", "a\x7f"] {
            assert_eq!(v(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn hosts_short_and_long_read_the_same() {
        let short = "A".repeat(24);
        let long = "B".repeat(25);
        assert!(!validate_host(short.as_bytes()).is_some_and(|h| h.is_heap_allocated()));
        assert!(validate_host(long.as_bytes()).is_some_and(|h| h.is_heap_allocated()));
        assert_eq!(
            validate_host(short.as_bytes()).as_deref(),
            Some("a".repeat(24).as_str())
        );
        assert_eq!(
            validate_host(long.as_bytes()).as_deref(),
            Some("b".repeat(25).as_str())
        );
        assert_eq!(
            validate_host(b"\xffA.Test:80").as_deref(),
            Some("\u{fffd}a.test")
        );
        assert_eq!(Host::default().as_str(), "");
        assert_eq!(
            format!("{:?}", validate_host(b"A").unwrap_or_default()),
            "\"a\""
        );
    }

    proptest::proptest! {
        #[test]
        fn hosts_are_the_lowercase_lossy_text_of_their_bytes(
            raw in proptest::collection::vec(
                proptest::sample::select(&b"aZ09.-\xc3\xa9\xff\x80"[..]),
                0..48,
            ),
        ) {
            let host = lowercase(&raw, true);
            let lower = raw.to_ascii_lowercase();
            proptest::prop_assert_eq!(host.as_str(), String::from_utf8_lossy(&lower));
        }

        #[test]
        fn hosts_validate_as_nginx_reads_them_byte_by_byte(
            raw in proptest::collection::vec(
                proptest::sample::select(&b"aZ9.:[]/ \x01\x7f\\\xc3\xa9\xff"[..]),
                0..40,
            ),
        ) {
            proptest::prop_assert_eq!(validate_host(&raw), nginx_validate_host(&raw));
        }
    }

    /// `ngx_http_validate_host` transcribed as nginx writes it, one byte
    /// at a time, with the lower-casing after.
    #[allow(clippy::collapsible_match, reason = "nginx's switch, case by case")]
    fn nginx_validate_host(h: &[u8]) -> Option<Host> {
        let (usual, literal, rest) = (0, 1, 2);
        let mut state = usual;
        let mut dot_pos = h.len();
        let mut host_len = h.len();
        for (i, &ch) in h.iter().enumerate() {
            match ch {
                b'.' => {
                    if dot_pos == i.wrapping_sub(1) {
                        return None;
                    }
                    dot_pos = i;
                }
                b':' => {
                    if state == usual {
                        host_len = i;
                        state = rest;
                    }
                }
                b'[' => {
                    if i == 0 {
                        state = literal;
                    }
                }
                b']' => {
                    if state == literal {
                        host_len = i + 1;
                        state = rest;
                    }
                }
                b'/' => return None,
                c if c <= 0x20 || c == 0x7f => return None,
                _ => {}
            }
        }
        if dot_pos == host_len.wrapping_sub(1) {
            host_len -= 1;
        }
        if host_len == 0 {
            return None;
        }
        Some(lowercase(&h[..host_len], true))
    }

    #[test]
    fn request_line_hosts_have_nginx_grammar() {
        assert_eq!(request_line_host("a.test"), Some("a.test"));
        assert_eq!(request_line_host("A.TEST.:99"), Some("A.TEST."));
        assert_eq!(request_line_host("a.test:"), Some("a.test"));
        assert_eq!(request_line_host("[::1]:80"), Some("[::1]"));
        for bad in ["a_b", "u@a.test", "a.test:8x", "[::1", "[a b]"] {
            assert_eq!(request_line_host(bad), None, "{bad}");
        }
    }

    fn names(list: &[(&str, usize)]) -> ServerNames {
        let mut n = ServerNames::default();
        for &(name, s) in list {
            n.add(name, s).expect("valid name");
        }
        n
    }

    #[test]
    fn lookup_order_is_nginx_order() {
        let n = names(&[
            ("a.test", 1),
            ("*.wild.test", 2),
            ("*.a.wild.test", 3),
            (".dot.test", 4),
            ("www.tail.*", 5),
            ("www.tail.co.*", 6),
            ("~^re[0-9]+\\.test$", 7),
            ("~Upper", 8),
            ("", 9),
        ]);
        let f = |h: &str| n.find(h).expect("no regex fails");
        assert_eq!(f("a.test"), Some(1));
        assert_eq!(f("x.wild.test"), Some(2));
        assert_eq!(f("y.x.wild.test"), Some(2));
        assert_eq!(f("wild.test"), None, "*.x does not match x");
        assert_eq!(f("q.a.wild.test"), Some(3), "the longest wildcard wins");
        assert_eq!(f("a.wild.test"), Some(2));
        assert_eq!(f("dot.test"), Some(4), ".x matches x");
        assert_eq!(f("z.dot.test"), Some(4));
        assert_eq!(f("www.tail.com"), Some(5));
        assert_eq!(f("www.tail.co.uk"), Some(6));
        assert_eq!(f("www.tail"), None, "x.* needs something after the dot");
        assert_eq!(f("re12.test"), Some(7));
        assert_eq!(f("re12.testx"), None);
        assert_eq!(f("xxupperyy"), Some(8), "an upper-case pattern is caseless");
        assert_eq!(f(""), Some(9));
        assert_eq!(f("zzz"), None);
    }

    #[test]
    fn the_first_block_with_a_name_keeps_it() {
        let n = names(&[
            ("a.test", 1),
            ("A.Test", 2),
            ("example.com", 1),
            (".example.com", 2),
        ]);
        assert_eq!(n.find("a.test").expect("no regex fails"), Some(1));
        // nginx ignores ".example.com" whole when "example.com" came first.
        assert_eq!(n.find("www.example.com").expect("no regex fails"), None);
        let n = names(&[
            (".example.com", 1),
            ("example.com", 2),
            ("*.example.com", 2),
        ]);
        assert_eq!(n.find("example.com").expect("no regex fails"), Some(1));
        assert_eq!(n.find("www.example.com").expect("no regex fails"), Some(1));
    }

    #[test]
    fn invalid_names_are_refused_as_nginx() {
        for bad in [
            "*",
            "*.",
            "*foo",
            ".",
            "www.*.com",
            "a*",
            "a..b",
            "**.a",
            "~",
        ] {
            assert!(ServerNames::default().add(bad, 0).is_err(), "{bad}");
        }
        assert_eq!(
            ServerNames::default().add("~(unclosed", 0),
            Err(NameError(
                "pcre2_compile() failed: missing closing parenthesis in \"(unclosed\"".into()
            ))
        );
    }

    #[test]
    fn server_name_regexes_mean_what_pcre_means() {
        let n = names(&[
            ("~^re\\.test$", 1),
            ("~^(?!www\\.)[a-z]+\\.look\\.test$", 2),
            ("~^CI\\.test$", 3),
        ]);
        let f = |h: &str| n.find(h).expect("no regex fails");
        // A Host cannot carry a newline (validate_host refuses it); the
        // lookup itself reads `$` as nginx's PCRE does.
        assert_eq!(f("re.test\n"), Some(1), "`$` before a final newline");
        assert_eq!(f("re.test\n\n"), None);
        assert_eq!(f("api.look.test"), Some(2));
        assert_eq!(f("www.look.test"), None, "look-ahead");
        assert_eq!(
            f("ci.test"),
            Some(3),
            "an upper-case letter makes it caseless"
        );
        assert!(!n.captures(), "no regex here has a group");
        // A regex with groups hands them over with its names' numbers.
        let n = names(&[("x.test", 0), ("~^(www\\.)?(?<site>[a-z]+)\\.test$", 1)]);
        assert!(n.captures());
        let found = n.lookup("www.a.test").expect("no regex fails");
        let (server, caps) = found.expect("a block");
        let caps = caps.expect("groups");
        assert_eq!(server, 1);
        assert_eq!(
            caps.groups,
            [
                Some("www.a.test".into()),
                Some("www.".into()),
                Some("a".into())
            ]
        );
        assert_eq!(caps.names, [(Arc::from("site"), 2)]);
        assert_eq!(n.lookup("x.test").expect("no regex fails"), Some((0, None)));
        // A runaway match (PCRE's match limit): nginx gives up on the request.
        let n = names(&[("~^(a|aa)+$", 1)]);
        let host = format!("{}b", "a".repeat(40));
        assert_eq!(n.find(&host).map_err(|e| e.code()), Err(-47));
    }
}
