//! Taking fields out of a header map with one pass over its names.
//!
//! `HeaderMap::remove` hashes the name and probes the table, whether the
//! field is there or not; most of the names a proxy strips (hop-by-hop
//! fields, `proxy_hide_header`'s defaults) are absent from most messages.
//! One look at the names a message has says which removals are worth
//! making: a response from nginx carries five or six fields, against the
//! eight names of the hidden list and seven hop-by-hop ones.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Remove the hop-by-hop fields (RFC 9110 §7.6.1): `Connection`, the
/// fields its tokens name, `Keep-Alive`, `Proxy-Connection`, `TE`,
/// `Trailer`, `Transfer-Encoding`, and `Upgrade` unless `keep_upgrade`.
///
/// The oracle the filters that build a map without them are tested
/// against (the proxy's readers never put them in).
#[cfg(test)]
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let mut doomed = Doomed::default();
    {
        let hop = HopByHop::of(headers, keep_upgrade);
        for name in headers.keys().filter(|name| hop.drops(name)) {
            doomed.push(name);
        }
    }
    doomed.remove_from(headers);
}

/// [`strip_hop_by_hop`] while a message's map is built, field by field
/// (the upstream head reader): the hop-by-hop fields never enter it, and
/// once the last field is in, [`HopFilter::finish`] takes out the fields a
/// `Connection` line named (seen only then: they may come before it).
pub(crate) struct HopFilter {
    keep_upgrade: bool,
    connection: smallvec::SmallVec<[HeaderValue; 1]>,
}

impl HopFilter {
    /// The filter of one message (`keep_upgrade` as for [`strip_hop_by_hop`]).
    pub(crate) fn new(keep_upgrade: bool) -> Self {
        Self {
            keep_upgrade,
            connection: smallvec::SmallVec::new(),
        }
    }

    /// Whether the field `name: value` stays out of the map.
    pub(crate) fn skips(&mut self, name: &HeaderName, value: &HeaderValue) -> bool {
        if *name == header::CONNECTION {
            self.connection.push(value.clone());
        }
        self.skips_name(name)
    }

    /// Whether a field named `name`, other than `Connection`, stays out of
    /// the map (as [`HopFilter::skips`] says, without its value).
    pub(crate) fn skips_name(&self, name: &HeaderName) -> bool {
        by_name(name, self.keep_upgrade).unwrap_or(false)
    }

    /// Take the fields the `Connection` lines named out of `headers`,
    /// keeping the others in their order (a rare message: the map is
    /// built again).
    pub(crate) fn finish(self, headers: &mut HeaderMap) {
        let named = Named::of_values(self.connection.iter());
        // A name with a rule of its own (a kept Upgrade) stays whatever a
        // token says; the others `skips` kept out already.
        let goes = |name: &HeaderName| {
            by_name(name, self.keep_upgrade).is_none()
                && named.names(name, || self.connection.iter())
        };
        if named.count == 0 || !headers.keys().any(goes) {
            return;
        }
        let mut kept = HeaderMap::with_capacity(headers.len());
        let mut last = None;
        for (name, value) in std::mem::take(headers) {
            // A name comes with its first value only (None for the rest).
            if let Some(n) = name {
                last = (!goes(&n)).then_some(n);
            }
            if let Some(n) = &last {
                kept.append(n.clone(), value);
            }
        }
        *headers = kept;
    }
}

/// Names to remove from a map, in the order they were found (a removal
/// moves the map's last field into the removed one's place, so the order
/// decides the fields' order after): on the stack while they are few.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Doomed {
    few: [Option<HeaderName>; 4],
    more: Vec<HeaderName>,
    count: usize,
}

#[cfg(test)]
impl Doomed {
    /// Remove `name` too.
    pub(crate) fn push(&mut self, name: &HeaderName) {
        match self.few.get_mut(self.count) {
            Some(slot) => *slot = Some(name.clone()),
            None => self.more.push(name.clone()),
        }
        self.count += 1;
    }

    /// Remove them, in order.
    pub(crate) fn remove_from(&mut self, headers: &mut HeaderMap) {
        for slot in self.few.iter_mut().take(self.count) {
            if let Some(name) = slot.take() {
                headers.remove(name);
            }
        }
        for name in self.more.drain(..) {
            headers.remove(name);
        }
        self.count = 0;
    }
}

/// Which fields of one message [`strip_hop_by_hop`] takes out, asked name
/// by name (for building a message without them).
pub(crate) struct HopByHop<'h> {
    headers: &'h HeaderMap,
    named: Named<'h>,
    keep_upgrade: bool,
}

impl<'h> HopByHop<'h> {
    /// The judge of `headers`' fields.
    #[cfg(test)]
    pub(crate) fn of(headers: &'h HeaderMap, keep_upgrade: bool) -> Self {
        Self {
            headers,
            named: Named::of(headers),
            keep_upgrade,
        }
    }

    /// [`HopByHop::of`] for a caller that looked at the names already:
    /// without `Connection` no field is named, and there is none to look up.
    pub(crate) fn knowing(headers: &'h HeaderMap, keep_upgrade: bool, connection: bool) -> Self {
        Self {
            headers,
            named: if connection {
                Named::of(headers)
            } else {
                Named::NONE
            },
            keep_upgrade,
        }
    }

    /// Whether the field `name` goes.
    pub(crate) fn drops(&self, name: &HeaderName) -> bool {
        by_name(name, self.keep_upgrade).unwrap_or_else(|| {
            self.named
                .names(name, || self.headers.get_all(header::CONNECTION).iter())
        })
    }
}

/// The rule for a field by its name alone: whether it goes, for `Upgrade`
/// (unless `keep_upgrade`) and the hop-by-hop names; None for a field only
/// a `Connection` token can send away.
fn by_name(name: &HeaderName, keep_upgrade: bool) -> Option<bool> {
    if *name == header::UPGRADE {
        Some(!keep_upgrade)
    } else if is_hop_by_hop(name) {
        Some(true)
    } else {
        None
    }
}

/// The tokens of the `Connection` lines that name other fields than the
/// hop-by-hop ones (which go anyway) and `Upgrade` (which has its own
/// rule): none at all for the usual `keep-alive`, `close` or `upgrade`
/// but `close`, a field nobody sends, still counts.
struct Named<'h> {
    few: [&'h [u8]; 4],
    count: usize,
}

impl<'h> Named<'h> {
    const NONE: Self = Named {
        few: [b""; 4],
        count: 0,
    };

    fn of(headers: &'h HeaderMap) -> Self {
        Self::of_values(headers.get_all(header::CONNECTION).iter())
    }

    /// The tokens of these `Connection` values.
    fn of_values(values: impl Iterator<Item = &'h HeaderValue>) -> Self {
        Self::of_spelt(values.map(HeaderValue::as_bytes))
    }

    /// The tokens of `Connection` values of these bytes.
    fn of_spelt(values: impl Iterator<Item = &'h [u8]>) -> Self {
        let mut named = Self::NONE;
        for v in values {
            // The values servers send, told without splitting them.
            if v.eq_ignore_ascii_case(b"keep-alive") || v.eq_ignore_ascii_case(b"upgrade") {
                continue;
            }
            let Some(tokens) = tokens_in(v) else { continue };
            for t in tokens {
                if t.is_empty()
                    || t.eq_ignore_ascii_case(b"upgrade")
                    || HOP_BY_HOP
                        .iter()
                        .any(|h| t.eq_ignore_ascii_case(h.as_bytes()))
                {
                    continue;
                }
                if let Some(slot) = named.few.get_mut(named.count) {
                    *slot = t;
                }
                named.count += 1;
            }
        }
        named
    }

    /// Whether a token names `name` (past four tokens, the `Connection`
    /// lines, which `lines` gives, are read again).
    fn names<'v, I>(&self, name: &HeaderName, lines: impl FnOnce() -> I) -> bool
    where
        I: Iterator<Item = &'v HeaderValue>,
    {
        self.names_spelt(name.as_str().as_bytes(), || {
            lines().map(HeaderValue::as_bytes)
        })
    }

    /// [`Named::names`] for a name spelt `name` (any case), the lines'
    /// bytes given by `lines`.
    fn names_spelt<'v, I>(&self, name: &[u8], lines: impl FnOnce() -> I) -> bool
    where
        I: Iterator<Item = &'v [u8]>,
    {
        match self.count {
            0 => false,
            n if n <= self.few.len() => self.few[..n].iter().any(|t| t.eq_ignore_ascii_case(name)),
            _ => lines()
                .any(|v| tokens_in(v).is_some_and(|mut t| t.any(|t| t.eq_ignore_ascii_case(name)))),
        }
    }
}

/// Whether `Connection` values of these bytes name one of the fields
/// spelt `names` (any case, none of them hop-by-hop), which
/// [`HopFilter::finish`] would take out of a map holding them.
pub(crate) fn connection_names_any<'n>(
    values: &[&[u8]],
    mut names: impl Iterator<Item = &'n [u8]>,
) -> bool {
    let named = Named::of_spelt(values.iter().copied());
    named.count != 0 && names.any(|name| named.names_spelt(name, || values.iter().copied()))
}

/// The hop-by-hop names but `Upgrade`.
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
];

/// The names upstream servers send most, which a response reader picks
/// by their spelling (`upstream::head`) and a [`Names`] set answers for
/// with one bit. None of them is hop-by-hop but `Connection` and
/// `Transfer-Encoding`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Common {
    Server,
    Date,
    ContentType,
    ContentLength,
    Connection,
    LastModified,
    ETag,
    AcceptRanges,
    TransferEncoding,
    Location,
    CacheControl,
    Expires,
    Vary,
    ContentEncoding,
    SetCookie,
}

impl Common {
    const ALL: [Common; 15] = [
        Common::Server,
        Common::Date,
        Common::ContentType,
        Common::ContentLength,
        Common::Connection,
        Common::LastModified,
        Common::ETag,
        Common::AcceptRanges,
        Common::TransferEncoding,
        Common::Location,
        Common::CacheControl,
        Common::Expires,
        Common::Vary,
        Common::ContentEncoding,
        Common::SetCookie,
    ];

    /// Its field name.
    pub(crate) fn name(self) -> HeaderName {
        self.spelling().0
    }

    /// Its field name, lower-case.
    #[cfg(test)]
    pub(crate) fn lower(self) -> &'static str {
        self.spelling().1
    }

    fn spelling(self) -> (HeaderName, &'static str) {
        match self {
            Common::Server => (header::SERVER, "server"),
            Common::Date => (header::DATE, "date"),
            Common::ContentType => (header::CONTENT_TYPE, "content-type"),
            Common::ContentLength => (header::CONTENT_LENGTH, "content-length"),
            Common::Connection => (header::CONNECTION, "connection"),
            Common::LastModified => (header::LAST_MODIFIED, "last-modified"),
            Common::ETag => (header::ETAG, "etag"),
            Common::AcceptRanges => (header::ACCEPT_RANGES, "accept-ranges"),
            Common::TransferEncoding => (header::TRANSFER_ENCODING, "transfer-encoding"),
            Common::Location => (header::LOCATION, "location"),
            Common::CacheControl => (header::CACHE_CONTROL, "cache-control"),
            Common::Expires => (header::EXPIRES, "expires"),
            Common::Vary => (header::VARY, "vary"),
            Common::ContentEncoding => (header::CONTENT_ENCODING, "content-encoding"),
            Common::SetCookie => (header::SET_COOKIE, "set-cookie"),
        }
    }

    fn bit(self) -> u16 {
        1 << self as u16
    }
}

/// A set of field names asked "is this one of you?" once per field of a
/// message: the lengths of the names (a bit each, past 63 one for all)
/// answer most fields without a comparison, and a bit per [`Common`]
/// name answers those.
#[derive(Clone, Debug, Default)]
pub(crate) struct Names {
    names: Vec<HeaderName>,
    lengths: u64,
    common: u16,
}

impl Names {
    /// The set of `names`.
    pub(crate) fn new(names: Vec<HeaderName>) -> Self {
        let lengths = names.iter().fold(0, |m, n| m | length_bit(n));
        let common = Common::ALL
            .iter()
            .filter(|c| names.contains(&c.name()))
            .fold(0, |m, c| m | c.bit());
        Self {
            names,
            lengths,
            common,
        }
    }

    /// Whether `name` is one of them.
    pub(crate) fn contains(&self, name: &HeaderName) -> bool {
        self.lengths & length_bit(name) != 0 && self.names.contains(name)
    }

    /// Whether a name spelt `name` (any case) is one of them.
    pub(crate) fn contains_spelt(&self, name: &[u8]) -> bool {
        self.lengths & length_bit_of(name.len()) != 0
            && self
                .names
                .iter()
                .any(|n| n.as_str().as_bytes().eq_ignore_ascii_case(name))
    }

    /// Whether the common name `c` is one of them.
    pub(crate) fn has(&self, c: Common) -> bool {
        self.common & c.bit() != 0
    }
}

fn length_bit(n: &HeaderName) -> u64 {
    length_bit_of(n.as_str().len())
}

fn length_bit_of(len: usize) -> u64 {
    1u64 << len.min(63)
}

/// Whether `headers` has `Location` and `Refresh` fields.
pub(crate) fn redirectable(headers: &HeaderMap) -> Redirectable {
    let mut kept = Redirectable::default();
    headers.keys().for_each(|k| kept.note(k));
    kept
}

/// Whether a message has `Location` and `Refresh` fields.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Redirectable {
    pub(crate) location: bool,
    pub(crate) refresh: bool,
}

impl Redirectable {
    /// A field named `k` is there.
    fn note(&mut self, k: &HeaderName) {
        if k == header::LOCATION {
            self.location = true;
        } else if *k == REFRESH {
            self.refresh = true;
        }
    }
}

/// The hop-by-hop names http has no constant for.
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static REFRESH: HeaderName = HeaderName::from_static("refresh");

/// Whether a field spelt `name` (any case) is hop-by-hop, `Upgrade` too
/// unless `keep_upgrade` (what [`HopFilter::skips`] leaves out).
pub(crate) fn is_hop_by_hop_spelt(name: &[u8], keep_upgrade: bool) -> bool {
    let is = |h: &str| name.eq_ignore_ascii_case(h.as_bytes());
    HOP_BY_HOP.iter().any(|h| is(h)) || !keep_upgrade && is("upgrade")
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    // Names compared as names: a standard one with a custom one is one
    // comparison of their kinds.
    name == header::CONNECTION
        || name == header::TE
        || name == header::TRAILER
        || name == header::TRANSFER_ENCODING
        || *name == KEEP_ALIVE
        || *name == PROXY_CONNECTION
}

/// Whether `h` has a field `name`: for a map of a few names, by comparing
/// them (a standard name with another is one comparison of their kinds)
/// rather than hashing `name` to probe the table.
#[cfg(test)]
pub(crate) fn has_field(h: &HeaderMap, name: &HeaderName) -> bool {
    if h.keys_len() > 8 {
        return h.contains_key(name);
    }
    h.keys().any(|k| k == name)
}

pub(crate) use vigil_http1::tokens_in;

#[cfg(test)]
mod tests {
    use super::*;

    fn map(fields: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn names(h: &HeaderMap) -> Vec<&str> {
        h.keys().map(|k| k.as_str()).collect()
    }

    proptest::proptest! {
        #[test]
        fn tokens_are_the_trimmed_pieces_of_the_text(
            value in proptest::collection::vec(
                proptest::sample::select(&b" \t,aZ-\x7f\x80\xff\x0b\x0c"[..]),
                0..24,
            ),
        ) {
            let Ok(v) = HeaderValue::from_bytes(&value) else { return Ok(()) };
            let by_str: Option<Vec<&[u8]>> = v
                .to_str()
                .ok()
                .map(|s| s.split(',').map(str::trim).map(str::as_bytes).collect());
            let by_bytes: Option<Vec<&[u8]>> = tokens_in(v.as_bytes()).map(Iterator::collect);
            proptest::prop_assert_eq!(by_bytes, by_str);
        }
    }

    #[test]
    fn hop_by_hop_fields_and_the_ones_connection_names_go() {
        let mut h = map(&[
            ("server", "nginx"),
            ("connection", "keep-alive, X-Foo"),
            ("connection", "close"),
            ("x-foo", "1"),
            ("x-foo", "2"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("close", "a field named by a token"),
            ("x-bar", "kept"),
        ]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(names(&h), ["server", "x-bar"]);
        assert_eq!(h.get("x-bar").unwrap(), "kept");
    }

    #[test]
    fn more_named_fields_than_the_stack_holds_all_go() {
        let mut h = map(&[
            ("connection", "a, b, c"),
            ("connection", "d, e, keep-alive"),
            ("a", "1"),
            ("b", "1"),
            ("c", "1"),
            ("d", "1"),
            ("e", "1"),
            ("f", "kept"),
        ]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(names(&h), ["f"]);
    }

    #[test]
    fn upgrade_stays_when_asked_even_if_connection_names_it() {
        let mut h = map(&[("connection", "upgrade"), ("upgrade", "websocket")]);
        strip_hop_by_hop(&mut h, true);
        assert_eq!(names(&h), ["upgrade"]);
        let mut h = map(&[("connection", "upgrade"), ("upgrade", "websocket")]);
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty());
    }

    #[test]
    fn a_message_without_hop_by_hop_fields_is_left_alone() {
        let mut h = map(&[("host", "a"), ("x-upgrade", "no"), ("connection-x", "no")]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(names(&h), ["host", "x-upgrade", "connection-x"]);
    }

    /// Remove every field named in `names`, saying whether the fields
    /// `proxy_redirect` rewrites are among the others.
    fn remove_present(headers: &mut HeaderMap, names: &Names) -> Redirectable {
        let mut doomed = Doomed::default();
        let mut kept = Redirectable::default();
        for k in headers.keys() {
            if names.contains(k) {
                doomed.push(k);
            } else {
                kept.note(k);
            }
        }
        doomed.remove_from(headers);
        kept
    }

    #[test]
    fn a_map_without_the_hidden_fields_tells_its_location_and_refresh_as_removal_would() {
        let hidden = Names::new(vec![header::DATE, header::SERVER]);
        for fields in [
            &[("location", "/a"), ("etag", "e")][..],
            &[("refresh", "0; url=/b"), ("x-pad", "p")][..],
            &[("location", "/a"), ("refresh", "1")][..],
            &[("etag", "e")][..],
            &[][..],
        ] {
            let h = map(fields);
            let told = redirectable(&h);
            let removed = remove_present(&mut h.clone(), &hidden);
            assert_eq!(
                (told.location, told.refresh),
                (removed.location, removed.refresh),
                "{fields:?}"
            );
        }
    }
}
