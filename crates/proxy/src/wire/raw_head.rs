//! An upstream response's fields as they came: the head's bytes and where
//! each kept field is in them (a leaf).
//!
//! Most responses reach the client as the upstream sent them, less the
//! hop-by-hop fields and `proxy_hide_header`'s: nothing on the way reads
//! or edits a field (no `add_header`, no gzip, no `error_page`, no
//! `Location` to rewrite). For those the response reader does not build a
//! header map (a name, a checked value and a hash per field, dropped
//! again once written): it notes where the kept fields are, and the
//! client's head is written from those bytes. The fields are kept in the
//! order the map would have given them (a name's values together, at the
//! place of its first), each under the upstream's spelling of its name,
//! as nginx passes it (a map writes its names as nginx spells its own:
//! `wire::names::put_spelling`).
//!
//! The fields go from the upstream's reader to the client's writer beside
//! the response, boxed (the attempt's answer, then what the handler
//! returns: `handler::Handled`), not in its extension set, whose hashed
//! insert, lookup, removal and clearing cost some 350 instructions a
//! response more. They exist only for a route that passes fields as they
//! came (`Route::passes_fields_as_they_came`): nothing on such a route
//! replaces the response between the two (an `error_page` that does
//! drops them). A response for another client (hyper's writer) has them
//! put in its map ([`RawFields::fill`]).

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;

use crate::wire::hop::Common;

/// What the client head's writer does with a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `Content-Length`: the framing reads it.
    ContentLength,
    /// `Date`: the writer adds none of its own.
    Date,
    /// Written as it came (a common name, which the reader knows).
    Named(Common),
    /// Written as it came.
    Other,
}

/// One kept field: where its name and value are in the head (a name is
/// at most 1 KiB: see `upstream::head::raw_fields`).
#[derive(Clone, Copy, Debug)]
struct Field {
    name_at: u32,
    value_at: u32,
    value_len: u32,
    name_len: u16,
    kind: Kind,
}

impl Field {
    fn name(&self) -> (u32, u32) {
        (self.name_at, self.name_at + u32::from(self.name_len))
    }

    fn value(&self) -> (u32, u32) {
        (self.value_at, self.value_at + self.value_len)
    }
}

/// The kept fields of a response head, in the map's order.
#[derive(Clone, Debug)]
pub(crate) struct RawFields {
    head: Bytes,
    fields: SmallVec<[Field; 10]>,
    /// A name has more than one field (they are together: see
    /// [`RawFields::group`]).
    grouped: bool,
}

/// A field of [`RawFields`], as the writer reads it.
pub(crate) struct RawField<'a> {
    /// As the upstream spelt it.
    pub(crate) name: &'a [u8],
    pub(crate) value: &'a [u8],
    pub(crate) kind: Kind,
    /// Its name is not the one of the field before it.
    pub(crate) first_of_name: bool,
}

// === impl RawFields ===

impl RawFields {
    /// No fields yet, of the head `head`.
    pub(crate) fn new(head: Bytes) -> Self {
        Self {
            head,
            fields: SmallVec::new(),
            grouped: false,
        }
    }

    /// No fields yet, of the head `head`, in this value's room (its fields
    /// and head dropped).
    pub(crate) fn reset(&mut self, head: Bytes) {
        self.head = head;
        self.fields.clear();
        self.grouped = false;
    }

    /// Keep the field whose name (at most 1 KiB) and value are at these
    /// offsets of the head. True when a field of the same name (any case)
    /// is kept already.
    pub(crate) fn push(&mut self, name: (u32, u32), value: (u32, u32), kind: Kind) -> bool {
        let this = self.bytes(name);
        let again = self.fields.iter().any(|f| {
            u32::from(f.name_len) == name.1 - name.0
                && self.bytes(f.name()).eq_ignore_ascii_case(this)
        });
        self.fields.push(Field {
            name_at: name.0,
            value_at: value.0,
            value_len: value.1 - value.0,
            name_len: u16::try_from(name.1 - name.0).unwrap_or(u16::MAX),
            kind,
        });
        again
    }

    /// Put each name's fields together at the place of its first, as a
    /// header map yields them (after a [`RawFields::push`] said a name
    /// came again).
    pub(crate) fn group(&mut self) {
        let mut grouped: SmallVec<[Field; 10]> = SmallVec::with_capacity(self.fields.len());
        let mut taken: SmallVec<[bool; 24]> = SmallVec::from_elem(false, self.fields.len());
        for i in 0..self.fields.len() {
            if taken[i] {
                continue;
            }
            let name = self.bytes(self.fields[i].name());
            for j in i..self.fields.len() {
                if !taken[j] && self.bytes(self.fields[j].name()).eq_ignore_ascii_case(name) {
                    taken[j] = true;
                    grouped.push(self.fields[j]);
                }
            }
        }
        self.fields = grouped;
        self.grouped = true;
    }

    fn bytes(&self, (from, to): (u32, u32)) -> &[u8] {
        self.head
            .get(from as usize..to as usize)
            .unwrap_or_default()
    }

    /// The bytes the fields take on the wire (`name: value\r\n`).
    pub(crate) fn wire_len(&self) -> usize {
        self.fields
            .iter()
            .map(|f| usize::from(f.name_len) + f.value_len as usize + 4)
            .sum()
    }

    /// The fields, in the map's order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = RawField<'_>> {
        let mut before: Option<&[u8]> = None;
        self.fields.iter().map(move |f| {
            let name = self.bytes(f.name());
            let first_of_name =
                !self.grouped || !before.is_some_and(|b| b.eq_ignore_ascii_case(name));
            before = Some(name);
            RawField {
                name,
                value: self.bytes(f.value()),
                kind: f.kind,
                first_of_name,
            }
        })
    }

    /// Append the fields to `map` (for a response something goes on to
    /// read or edit): the map the reader would have built.
    pub(crate) fn fill(&self, map: &mut HeaderMap) {
        map.reserve(self.fields.len());
        for f in &self.fields {
            let (v0, v1) = (f.value_at as usize, (f.value_at + f.value_len) as usize);
            // The reader kept only names and values httparse allowed,
            // which are exactly those http allows.
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(self.bytes(f.name())),
                HeaderValue::from_maybe_shared(self.head.slice(v0..v1)),
            ) {
                map.append(name, value);
            }
        }
    }
}
