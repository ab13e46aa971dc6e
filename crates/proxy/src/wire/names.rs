//! The header names a worker met lately (a leaf), handed out again without
//! parsing or allocating them.
//!
//! `HeaderName::from_bytes` copies a name that is not one of the standard
//! ones (`Sec-Fetch-Mode`, `X-Request-Id`, ...) into an allocation of its
//! own, and the first clone of it (the upstream request's copy of the
//! client's field) makes a second one for the shared count. Browsers and
//! services send the same few such names on every request, so each worker
//! keeps the names it parsed in a small table (sets of four, by a hash of
//! a few of the name's bytes in lower case): a name found there is a clone of the one
//! parsed before (a count raised), and a name that is not takes the oldest
//! place of its set. The table is bounded and takes what comes, so names
//! sent once (a scanner's) only pass through it.

use std::cell::RefCell;

use http::header::{HeaderName, InvalidHeaderName};

/// Sets in a worker's table (a power of two), of [`WAYS`] names each: a
/// name is looked for in the set of its hash, and a name that is not
/// there takes the set's oldest place.
const SETS: usize = 32;
const WAYS: usize = 4;

/// Longer names are parsed each time, not kept.
const LONGEST: usize = 64;

struct Table {
    sets: [[Option<HeaderName>; WAYS]; SETS],
    /// Per set, the place the next name takes.
    next: [u8; SETS],
}

thread_local! {
    static TABLE: RefCell<Table> = const {
        RefCell::new(Table {
            sets: [const { [const { None }; WAYS] }; SETS],
            next: [0; SETS],
        })
    };
}

/// `HeaderName::from_bytes(raw)`: the same name, from this worker's table
/// where it is there.
pub(crate) fn header_name(raw: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    if raw.is_empty() || raw.len() > LONGEST {
        return HeaderName::from_bytes(raw);
    }
    let set = set_of(raw);
    let kept = TABLE.try_with(|t| {
        let t = t.borrow();
        t.sets[set]
            .iter()
            .flatten()
            .find(|name| same_name(name, raw))
            .cloned()
    });
    if let Ok(Some(name)) = kept {
        return Ok(name);
    }
    let name = HeaderName::from_bytes(raw)?;
    let _ = TABLE.try_with(|t| {
        let t = &mut *t.borrow_mut();
        let way = usize::from(t.next[set]) % WAYS;
        t.sets[set][way] = Some(name.clone());
        t.next[set] = ((way + 1) % WAYS) as u8;
    });
    Ok(name)
}

/// Each byte in lower case (`u8::to_ascii_lowercase` as a table, one load
/// a byte).
static LOWER: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = (b as u8).to_ascii_lowercase();
        b += 1;
    }
    t
};

/// FNV-1a over the name's length and five of its bytes in lower case (the
/// first two, the middle one, the last two): the names clients send
/// differ there (`sec-fetch-mode`, `sec-fetch-site`), and names that do
/// not share a set of four rather than push each other out.
fn set_of(raw: &[u8]) -> usize {
    let n = raw.len();
    let lower = |i: usize| raw.get(i).map_or(0, |&b| u32::from(LOWER[usize::from(b)]));
    let mut h: u32 = 0x811c_9dc5 ^ (n as u32);
    for i in [0, 1, n / 2, n.wrapping_sub(2), n.wrapping_sub(1)] {
        h = (h ^ lower(i)).wrapping_mul(0x0100_0193);
    }
    (h ^ (h >> 16)) as usize & (SETS - 1)
}

/// Whether `raw` is `name` in any case. (`name` is valid and lower-case,
/// so `raw` lowers to it only if `HeaderName::from_bytes` would give it.)
fn same_name(name: &HeaderName, raw: &[u8]) -> bool {
    let kept = name.as_str().as_bytes();
    kept.len() == raw.len()
        && kept
            .iter()
            .zip(raw)
            .all(|(&k, &r)| k == LOWER[usize::from(r)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_name_met_again_is_the_one_parsed_before_in_any_case() {
        let first = header_name(b"Sec-Fetch-Mode").unwrap();
        let again = header_name(b"sec-fetch-MODE").unwrap();
        assert_eq!(first, "sec-fetch-mode");
        assert_eq!(again, first);
        let set = set_of(b"sec-fetch-mode");
        let kept = TABLE.with(|t| t.borrow().sets[set].iter().flatten().any(|n| *n == first));
        assert!(kept, "kept in its set");
    }

    #[test]
    fn a_set_keeps_its_last_four_names() {
        // Names of one set, found by trying.
        let of_set = |set: usize| {
            (0..)
                .map(|i| format!("x-{i}"))
                .filter(move |n| set_of(n.as_bytes()) == set)
        };
        let names: Vec<String> = of_set(3).take(WAYS + 1).collect();
        for n in &names {
            header_name(n.as_bytes()).unwrap();
        }
        TABLE.with(|t| {
            let t = t.borrow();
            let kept: Vec<&str> = t.sets[3].iter().flatten().map(HeaderName::as_str).collect();
            assert_eq!(kept.len(), WAYS);
            assert!(!kept.contains(&names[0].as_str()), "the oldest made room");
            for n in &names[1..] {
                assert!(kept.contains(&n.as_str()), "{n} kept");
            }
        });
    }

    #[test]
    fn invalid_and_long_names_are_refused_or_parsed_as_from_bytes_does() {
        assert!(header_name(b"").is_err());
        assert!(header_name(b"bad name").is_err());
        assert!(header_name(b"bad\xffname").is_err());
        let long = vec![b'x'; LONGEST + 1];
        assert_eq!(
            header_name(&long).unwrap(),
            HeaderName::from_bytes(&long).unwrap()
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        /// Names from a small alphabet (so slots are shared and met again,
        /// in other cases) come out as `HeaderName::from_bytes` makes them.
        #[test]
        fn every_name_is_what_from_bytes_makes_of_it(
            names in prop::collection::vec(
                prop::collection::vec(prop::sample::select(b"aAbB-_ :\x7f".to_vec()), 0..6),
                1..40,
            ),
        ) {
            for raw in names {
                let expected = HeaderName::from_bytes(&raw).map_err(|e| e.to_string());
                let got = header_name(&raw).map_err(|e| e.to_string());
                prop_assert_eq!(got, expected);
            }
        }
    }
}

/// The conf's spellings (`add_header X-IP ...`) of names a map holds,
/// where they differ from [`put_spelling`]'s own: nginx sends an
/// `add_header`'s name as written. Few (most confs write the words
/// capitalised, as `put_spelling` does), so a map's writer looks only
/// when [`CONF_SPELT`] says there are some.
static CONF_SPELLINGS: std::sync::RwLock<Vec<(String, String)>> =
    std::sync::RwLock::new(Vec::new());
static CONF_SPELT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The names a configuration writes (its `add_header`s), kept where they
/// are spelt otherwise than [`put_spelling`] would (the last built
/// configuration's: a reload replaces them).
pub(crate) fn set_conf_spellings<'n>(names: impl Iterator<Item = &'n str>) {
    let mut odd: Vec<(String, String)> = Vec::new();
    for n in names {
        let lower = n.to_ascii_lowercase();
        let mut ours = bytes::BytesMut::new();
        default_spelling(&mut ours, &lower);
        if ours[..] != *n.as_bytes() && !odd.iter().any(|(l, _)| *l == lower) {
            odd.push((lower, n.to_string()));
        }
    }
    let any = !odd.is_empty();
    *CONF_SPELLINGS.write().unwrap_or_else(|p| p.into_inner()) = odd;
    CONF_SPELT.store(any, std::sync::atomic::Ordering::Relaxed);
}

/// Write a name a header map holds (lower case) as nginx spells a name
/// it writes itself: each word capitalised (`Content-Type`,
/// `X-Frame-Options`), and the few it spells otherwise (`ETag`,
/// `WWW-Authenticate`, ...). A field that came from a peer or a client
/// keeps their spelling where vigil has it (the fields as they came); this
/// is for the others (an `add_header`'s, vigil's own).
pub(crate) fn put_spelling(dst: &mut bytes::BytesMut, lower: &str) {
    use std::sync::atomic::Ordering;
    if CONF_SPELT.load(Ordering::Relaxed) {
        let spelt = CONF_SPELLINGS.read().unwrap_or_else(|p| p.into_inner());
        if let Some((_, s)) = spelt.iter().find(|(l, _)| l == lower) {
            dst.extend_from_slice(s.as_bytes());
            return;
        }
    }
    default_spelling(dst, lower);
}

/// [`put_spelling`] without the conf's spellings.
fn default_spelling(dst: &mut bytes::BytesMut, lower: &str) {
    let special: Option<&[u8]> = match lower {
        "etag" => Some(b"ETag"),
        "www-authenticate" => Some(b"WWW-Authenticate"),
        "content-md5" => Some(b"Content-MD5"),
        "x-xss-protection" => Some(b"X-XSS-Protection"),
        "te" => Some(b"TE"),
        "dnt" => Some(b"DNT"),
        _ => None,
    };
    if let Some(s) = special {
        dst.extend_from_slice(s);
        return;
    }
    let at = dst.len();
    dst.extend_from_slice(lower.as_bytes());
    let mut up = true;
    for b in &mut dst[at..] {
        if up {
            b.make_ascii_uppercase();
        }
        up = *b == b'-';
    }
}

#[cfg(test)]
mod spelling_tests {
    #[test]
    fn names_are_spelt_as_nginx_spells_its_own() {
        let spelt = |n: &str| {
            let mut b = bytes::BytesMut::new();
            super::put_spelling(&mut b, n);
            String::from_utf8_lossy(&b).into_owned()
        };
        assert_eq!(spelt("content-type"), "Content-Type");
        assert_eq!(spelt("x-frame-options"), "X-Frame-Options");
        assert_eq!(spelt("location"), "Location");
        assert_eq!(spelt("etag"), "ETag");
        assert_eq!(spelt("www-authenticate"), "WWW-Authenticate");
        assert_eq!(spelt("x-"), "X-");
        // A conf's own spelling of an add_header name wins.
        super::set_conf_spellings(["X-IP", "X-Frame-Options", "x-lower"].into_iter());
        assert_eq!(spelt("x-ip"), "X-IP");
        assert_eq!(spelt("x-lower"), "x-lower");
        assert_eq!(spelt("x-frame-options"), "X-Frame-Options");
        super::set_conf_spellings(std::iter::empty());
        assert_eq!(spelt("x-ip"), "X-Ip");
    }
}
