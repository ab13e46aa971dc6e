//! The header fields of an upstream request, built from the client's in
//! one pass rather than as a clone of its map edited field by field.
//!
//! The order is the one those map edits left, which is what backends have
//! always seen: `HeaderMap::remove` moves the map's last field into the
//! removed one's place, `insert` of a name already there keeps its place
//! and drops the name's other values, a new name goes last. The edits run
//! on a list of the fields (the map's operations, without hashing), and
//! the list is written as the upstream request's head
//! ([`crate::upstream::HeadOut`]).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;

use crate::upstream::{RequestFields, Values};
use crate::wire::hop::HopByHop;

/// The fields of the request on their way upstream.
pub(super) struct Fields<'a> {
    client: &'a HeaderMap,
    /// The client's request head, whose bytes hold its names' spelling.
    head: Option<&'a bytes::Bytes>,
    /// Borrowed names and values: 24 bytes a field, so the list of a
    /// browser's request stays under the allocator's thread cache.
    list: Vec<Field<'a>>,
    /// The values edits put, at `Value::Put`'s places.
    puts: SmallVec<[Option<HeaderValue>; 4]>,
}

#[derive(Clone, Copy)]
struct Field<'a> {
    name: &'a HeaderName,
    value: Value<'a>,
    /// The name as written (a `proxy_set_header`'s), for a put value.
    spelt: Option<&'a [u8]>,
}

/// A field's values: the client's (its first; `more`: it has others, read
/// from the client's map), or the `n` at `at` of those edits put.
#[derive(Clone, Copy)]
enum Value<'a> {
    Client { first: &'a HeaderValue, more: bool },
    Put { at: usize, n: usize },
}

// === impl Fields ===

impl<'a> Fields<'a> {
    /// The client's fields without the hop-by-hop ones (removed in the
    /// map's order, as `strip_hop_by_hop` removes them), with room for
    /// `extra` more.
    pub(super) fn without_hop_by_hop(
        client: &'a HeaderMap,
        head: Option<&'a bytes::Bytes>,
        extra: usize,
    ) -> Self {
        let mut list: Vec<Field<'a>> = Vec::with_capacity(client.keys_len() + extra);
        let mut last: Option<&HeaderName> = None;
        let mut connection = false;
        // The map yields a name's values one after another, with the
        // same name each time.
        for (name, value) in client {
            if last.is_some_and(|l| std::ptr::eq(l, name)) {
                if let Some(Field {
                    value: Value::Client { more, .. },
                    ..
                }) = list.last_mut()
                {
                    *more = true;
                }
                continue;
            }
            last = Some(name);
            connection |= name == header::CONNECTION;
            list.push(Field {
                name,
                value: Value::Client {
                    first: value,
                    more: false,
                },
                spelt: None,
            });
        }
        let mut fields = Self {
            client,
            head,
            list,
            puts: SmallVec::new(),
        };
        let hop = HopByHop::knowing(client, false, connection);
        for name in client.keys() {
            if hop.drops(name) {
                fields.remove(name);
            }
        }
        fields
    }

    fn position(&self, name: &HeaderName) -> Option<usize> {
        self.list.iter().position(|f| *f.name == *name)
    }

    /// `HeaderMap::remove`: the last field takes the removed one's place.
    pub(super) fn remove(&mut self, name: &HeaderName) {
        if let Some(i) = self.position(name) {
            self.list.swap_remove(i);
        }
    }

    /// `HeaderMap::insert`: in the name's place (its other values gone),
    /// else last.
    pub(super) fn insert(&mut self, name: &'a HeaderName, value: HeaderValue) {
        self.insert_as(name, None, value);
    }

    /// [`Fields::insert`] under the name spelt as `spelt`.
    pub(super) fn insert_spelt(
        &mut self,
        name: &'a HeaderName,
        spelt: &'a [u8],
        value: HeaderValue,
    ) {
        self.insert_as(name, Some(spelt), value);
    }

    fn insert_as(&mut self, name: &'a HeaderName, spelt: Option<&'a [u8]>, value: HeaderValue) {
        let put = Value::Put {
            at: self.puts.len(),
            n: 1,
        };
        self.puts.push(Some(value));
        match self.position(name) {
            Some(i) => {
                self.list[i].value = put;
                self.list[i].spelt = spelt;
            }
            None => self.list.push(Field {
                name,
                value: put,
                spelt,
            }),
        }
    }

    /// How `f`'s name goes on the wire: a put value's as written, else
    /// the name's built-in spelling (`Host`, `Content-Length`, ...); a
    /// client's value's as the client spelt it (found in its head just
    /// before the value: `Name: value`), else lower case (an HTTP/2
    /// client's, which is lower case on the wire).
    fn spelling(&self, f: &Field<'a>) -> &'a [u8] {
        match f.value {
            Value::Put { .. } => f
                .spelt
                .unwrap_or_else(|| crate::upstream::put::spelling(f.name)),
            Value::Client { first, .. } => self
                .head
                .and_then(|h| client_spelling(h, f.name, first))
                .unwrap_or(f.name.as_str().as_bytes()),
        }
    }

    /// `HeaderMap::append`: after the name's values, else last. (The
    /// values a name has are kept side by side: those it had are copied
    /// after the last put one, unless they are the last already.)
    pub(super) fn append(&mut self, name: &'a HeaderName, value: HeaderValue) {
        let Some(i) = self.position(name) else {
            self.insert(name, value);
            return;
        };
        let end = self.puts.len();
        let put = match self.list[i].value {
            Value::Put { at, n } if at + n == end => Value::Put { at, n: n + 1 },
            Value::Put { at, n } => {
                for k in at..at + n {
                    let v = self.puts[k].take();
                    self.puts.push(v);
                }
                Value::Put { at: end, n: n + 1 }
            }
            Value::Client { .. } => {
                let had: SmallVec<[HeaderValue; 2]> =
                    self.client.get_all(name).iter().cloned().collect();
                let n = had.len();
                self.puts.extend(had.into_iter().map(Some));
                Value::Put { at: end, n: n + 1 }
            }
        };
        self.puts.push(Some(value));
        self.list[i].value = put;
    }

    /// Whether a field `name` is there.
    pub(super) fn contains(&self, name: &HeaderName) -> bool {
        self.position(name).is_some()
    }

    /// The header map, in the list's order, built in `room` (emptied): the
    /// oracle the head written from the list is tested against.
    #[cfg(test)]
    pub(super) fn into_map(mut self, mut room: HeaderMap) -> HeaderMap {
        // (A spare map is handed out empty.)
        if !room.is_empty() {
            room.clear();
        }
        room.reserve(self.list.len());
        let mut map = room;
        for f in self.list {
            match f.value {
                Value::Put { at, n } => {
                    for v in self.puts[at..at + n].iter_mut().filter_map(Option::take) {
                        map.append(f.name.clone(), v);
                    }
                }
                Value::Client { first, more: false } => {
                    map.append(f.name.clone(), first.clone());
                }
                Value::Client { more: true, .. } => {
                    for v in self.client.get_all(f.name) {
                        map.append(f.name, v.clone());
                    }
                }
            }
        }
        map
    }
}

/// The name of the field whose value is `value`, as it is spelt in
/// `head`: `value` is a piece of it (the HTTP/1 reader's), right after
/// `Name:` and optional blanks, on a line of its own. The line's shape is
/// checked (a `:` before the value, a line start before the name's
/// length), not the name's letters: the value came from that line, and
/// a per-byte comparison would cost some 150 instructions a field.
fn client_spelling<'h>(
    head: &'h bytes::Bytes,
    name: &HeaderName,
    value: &HeaderValue,
) -> Option<&'h [u8]> {
    let base = head.as_ptr() as usize;
    let at = (value.as_bytes().as_ptr() as usize).checked_sub(base)?;
    if value.is_empty() || at > head.len() {
        return None;
    }
    let before = head.get(..at)?;
    let mut end = before.len();
    while end > 0 && matches!(before[end - 1], b' ' | b'\t') {
        end -= 1;
    }
    let colon = end.checked_sub(1).filter(|&c| before[c] == b':')?;
    let start = colon.checked_sub(name.as_str().len())?;
    let line_start = start == 0 || before[start - 1] == b'\n';
    line_start.then(|| &before[start..colon])
}

impl RequestFields for Fields<'_> {
    fn values(&self, name: &HeaderName) -> Values<'_> {
        match self.position(name).map(|i| self.list[i].value) {
            None => Values::One(None),
            Some(Value::Client { first, more: false }) => Values::One(Some(first)),
            Some(Value::Client { more: true, .. }) => Values::Map(self.client.get_all(name).iter()),
            Some(Value::Put { at, n }) => Values::Put(self.puts[at..at + n].iter()),
        }
    }

    fn remove(&mut self, name: &HeaderName) {
        Fields::remove(self, name);
    }

    fn insert(&mut self, name: &'static HeaderName, value: HeaderValue) {
        Fields::insert(self, name, value);
    }

    fn append(&mut self, name: &'static HeaderName, value: HeaderValue) {
        Fields::append(self, name, value);
    }

    fn each_spelt(&self, mut f: impl FnMut(&[u8], &HeaderValue)) {
        for field in &self.list {
            let spelt = self.spelling(field);
            match field.value {
                Value::Client { first, more: false } => f(spelt, first),
                Value::Client { more: true, .. } => {
                    for v in self.client.get_all(field.name) {
                        f(spelt, v);
                    }
                }
                Value::Put { at, n } => {
                    for v in self.puts[at..at + n].iter().flatten() {
                        f(spelt, v);
                    }
                }
            }
        }
    }

    fn each(&self, mut f: impl FnMut(&HeaderName, &HeaderValue)) {
        for field in &self.list {
            match field.value {
                Value::Client { first, more: false } => f(field.name, first),
                Value::Client { more: true, .. } => {
                    for v in self.client.get_all(field.name) {
                        f(field.name, v);
                    }
                }
                Value::Put { at, n } => {
                    for v in self.puts[at..at + n].iter().flatten() {
                        f(field.name, v);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
