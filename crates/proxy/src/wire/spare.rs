//! A worker's spare header maps and extension sets (a leaf). A request's
//! map, its upstream request's and its response's, and a request's
//! extensions (where the rewrite phase leaves its captures), are built in the room of
//! ones whose messages are done (cleared, their allocations kept) rather
//! than allocated per message: on a worker's single thread, what one
//! request gives back is the next one's. Each thread has its own few
//! spares; a map that grew large is not kept.
//!
//! A request head is read into the buffer an earlier request of the
//! worker's came in ([`read_room`]): once that request is done nothing
//! holds the buffer's bytes, and the next head is copied in at its start,
//! where a buffer per head was two allocations as well. A connection
//! between requests holds none.
//!
//! A worker also writes its responses' heads one after another into one
//! buffer of its own ([`head_room`]): a head is written from it and the
//! buffer given back once it is sent, and when its room runs low it is
//! taken again from its start, where a buffer per head was two
//! allocations (its bytes and their shared count). The box of a response's
//! fields as they came (`crate::wire::raw_head`) is given back once they are
//! written ([`raw_fields`]).

use std::cell::RefCell;
use std::pin::Pin;
use std::thread::LocalKey;

use bytes::{Bytes, BytesMut};
use http::{Extensions, HeaderMap};

use crate::wire::raw_head::RawFields;

/// Spare maps kept per thread: what requests in flight on one worker give
/// back between two of its requests' takes.
const SPARES: usize = 16;

/// A map with room for more fields than this is dropped, not kept (a
/// request with hundreds of fields leaves no large map behind).
const KEPT_ROOM: usize = 64;

/// The room a worker's head buffer is made with, bytes: a few dozen
/// heads of the usual size, written one after another.
const HEAD_ROOM: usize = 4096;

/// Room left at the buffer's end under which a head starts a new round
/// (from the buffer's start if every head in it is written, else in a new
/// buffer).
const HEAD_ROOM_LOW: usize = 1024;

thread_local! {
    static MAPS: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
    static EXTENSIONS: RefCell<Vec<Extensions>> = const { RefCell::new(Vec::new()) };
    static HEADS: RefCell<Option<BytesMut>> = const { RefCell::new(None) };
    static READS: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    #[allow(clippy::vec_box, reason = "the boxes are what is kept: their allocations go on beside responses")]
    static RAWS: RefCell<Vec<Box<RawFields>>> = const { RefCell::new(Vec::new()) };
}

/// Read buffers kept per thread (a buffer is as large as the head that
/// came in it, up to `large_client_header_buffers`).
const READ_SPARES: usize = 8;

/// A spare of this thread's from `spares`, if it has one.
pub(crate) fn take<T: 'static>(spares: &'static LocalKey<RefCell<Vec<T>>>) -> Option<T> {
    spares.try_with(|s| s.borrow_mut().pop()).ok().flatten()
}

/// `item` (emptied) into this thread's `spares`, unless they are full.
/// (After this thread's spares are gone, at its exit, it is dropped.)
pub(crate) fn put<T: 'static>(spares: &'static LocalKey<RefCell<Vec<T>>>, item: T) {
    let _ = spares.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARES {
            s.push(item);
        }
    });
}

/// An empty map with room for at least `fields` fields: a spare of this
/// thread's, or a new one.
pub(crate) fn map(fields: usize) -> HeaderMap {
    match take(&MAPS) {
        Some(mut map) => {
            map.reserve(fields);
            map
        }
        None => HeaderMap::with_capacity(fields),
    }
}

/// Give `map`'s room back for a later message of this thread (its fields
/// are dropped now).
pub(crate) fn keep(mut map: HeaderMap) {
    let room = map.capacity();
    if room == 0 || room > KEPT_ROOM {
        return;
    }
    map.clear();
    put(&MAPS, map);
}

/// An empty extension set: a spare of this thread's (whose table is
/// allocated already), or a new one.
pub(crate) fn extensions() -> Extensions {
    take(&EXTENSIONS).unwrap_or_default()
}

/// Give `set`'s table back for a later request of this thread (its values
/// are dropped now). An empty set may have no table: it is not kept.
pub(crate) fn keep_extensions(mut set: Extensions) {
    if set.is_empty() {
        return;
    }
    set.clear();
    put(&EXTENSIONS, set);
}

/// An empty buffer to read a request head into: one a done request of
/// this thread's gave back (its room is taken again from its start when
/// its bytes are copied in, `BytesMut::reserve`), or a new one.
pub(crate) fn read_room() -> BytesMut {
    take(&READS).unwrap_or_default()
}

/// Give back the (empty) rest of a read buffer whose request is done.
pub(crate) fn keep_read_room(room: BytesMut) {
    if !room.is_empty() {
        return;
    }
    let _ = READS.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < READ_SPARES {
            s.push(room);
        }
    });
}

/// A box for the fields of a response's head `head` as they came: one a
/// written response of this thread's gave back, or a new one.
pub(crate) fn raw_fields(head: Bytes) -> Box<RawFields> {
    match take(&RAWS) {
        Some(mut fields) => {
            fields.reset(head);
            fields
        }
        None => Box::new(RawFields::new(head)),
    }
}

/// Give back a box from [`raw_fields`] (its head is dropped now).
pub(crate) fn keep_raw_fields(mut fields: Box<RawFields>) {
    fields.reset(Bytes::new());
    put(&RAWS, fields);
}

/// An empty buffer to write a message head into: this thread's head
/// buffer, or a new one. Give it back with [`keep_head_room`] once the head
/// is written (or split off it).
pub(crate) fn head_room() -> BytesMut {
    let mut room = HEADS
        .try_with(|h| h.borrow_mut().take())
        .ok()
        .flatten()
        .unwrap_or_default();
    room.clear();
    if room.capacity() < HEAD_ROOM_LOW {
        // Takes the buffer from its start again if no head split off it
        // is still held (`BytesMut::reserve`), else makes a new one.
        room.reserve(HEAD_ROOM);
    }
    room
}

/// Give back a buffer from [`head_room`] once its head is written (or
/// what is left of it once the head is split off); a buffer that grew past
/// twice its usual room (a head of many fields) is not kept.
pub(crate) fn keep_head_room(room: BytesMut) {
    if room.capacity() > 2 * HEAD_ROOM {
        return;
    }
    let _ = HEADS.try_with(|h| *h.borrow_mut() = Some(room));
}

/// `Box::pin(make())`, with the box allocated before `make` runs, so that
/// the optimizer can build the value in the box (it does in the release
/// build, not in a debug one). A request's future is kilobytes, and
/// `Box::pin` builds it on the stack and copies all of it, every cache
/// line, where the state a future starts in is a few hundred bytes.
#[inline(always)]
pub(crate) fn boxed<T>(make: impl FnOnce() -> T) -> Pin<Box<T>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_given_back_is_handed_out_again_empty_with_its_room() {
        let mut given = map(4);
        for i in 0..10 {
            given.append(
                http::header::HeaderName::from_bytes(format!("x-{i}").as_bytes()).unwrap(),
                http::HeaderValue::from_static("v"),
            );
        }
        let room = given.capacity();
        keep(given);
        let taken = map(2);
        assert!(taken.is_empty());
        assert_eq!(taken.capacity(), room);
    }

    #[test]
    fn a_large_map_is_not_kept_and_the_spares_are_bounded() {
        // Drain what this test thread may hold.
        while MAPS.with(|m| m.borrow_mut().pop()).is_some() {}
        keep(HeaderMap::with_capacity(KEPT_ROOM * 4));
        assert_eq!(MAPS.with(|m| m.borrow().len()), 0);
        keep(HeaderMap::new());
        assert_eq!(MAPS.with(|m| m.borrow().len()), 0, "a map with no room");
        for _ in 0..SPARES * 2 {
            keep(HeaderMap::with_capacity(8));
        }
        assert_eq!(MAPS.with(|m| m.borrow().len()), SPARES);
    }

    #[test]
    fn heads_are_written_one_after_another_and_the_room_is_taken_again_once_they_are_sent() {
        let _ = HEADS.with(|h| h.borrow_mut().take());
        let mut room = head_room();
        let start = room.as_ptr();
        room.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
        let first = room.split().freeze();
        keep_head_room(room);
        let mut room = head_room();
        room.extend_from_slice(b"HTTP/1.1 404 Not Found\r\n\r\n");
        assert_eq!(
            room.as_ptr(),
            start.wrapping_add(first.len()),
            "the next head follows the first in the same buffer"
        );
        let second = room.split().freeze();
        assert_eq!(
            &first[..],
            b"HTTP/1.1 200 OK\r\n\r\n",
            "a head held is not written over"
        );
        keep_head_room(room);
        // Near the buffer's end with a head still held: a new buffer.
        let mut room = head_room();
        room.resize(room.capacity() - HEAD_ROOM_LOW + 1, b'x');
        let filler = room.split().freeze();
        keep_head_room(room);
        let room = head_room();
        assert!(room.capacity() >= HEAD_ROOM);
        let elsewhere = room.as_ptr();
        assert!(elsewhere < start || elsewhere > start.wrapping_add(HEAD_ROOM));
        keep_head_room(room);
        assert_eq!(&second[..], b"HTTP/1.1 404 Not Found\r\n\r\n");
        drop((first, second, filler));
        // All sent: the next round starts at the start of the new buffer,
        // which nothing holds.
        let mut room = head_room();
        room.resize(room.capacity() - HEAD_ROOM_LOW + 1, b'y');
        drop(room.split());
        keep_head_room(room);
        let room = head_room();
        assert_eq!(
            room.as_ptr(),
            elsewhere,
            "the buffer is taken again from its start"
        );
    }

    #[test]
    fn a_read_buffer_given_back_empty_is_read_into_again_from_its_start() {
        while READS.with(|r| r.borrow_mut().pop()).is_some() {}
        let mut buf = read_room();
        buf.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        let start = buf.as_ptr();
        let head = buf.split_to(buf.len()).freeze();
        keep_read_room(buf);
        drop(head);
        let mut again = read_room();
        again.extend_from_slice(b"GET /b HTTP/1.1\r\n\r\n");
        assert_eq!(again.as_ptr(), start, "the same buffer, from its start");
        assert_eq!(&again[..], b"GET /b HTTP/1.1\r\n\r\n");
        // One still holding bytes is not kept; the spares are bounded.
        keep_read_room(again);
        assert_eq!(READS.with(|r| r.borrow().len()), 0);
        for _ in 0..READ_SPARES * 2 {
            keep_read_room(BytesMut::new());
        }
        assert_eq!(READS.with(|r| r.borrow().len()), READ_SPARES);
    }

    #[test]
    fn a_read_buffer_whose_bytes_are_held_is_not_written_over() {
        while READS.with(|r| r.borrow_mut().pop()).is_some() {}
        let mut buf = read_room();
        buf.extend_from_slice(b"first head");
        let held = buf.split_to(buf.len()).freeze();
        keep_read_room(buf);
        let mut next = read_room();
        next.extend_from_slice(b"second head, longer");
        assert_eq!(&held[..], b"first head");
        assert_eq!(&next[..], b"second head, longer");
    }

    #[test]
    fn a_raw_fields_box_given_back_is_handed_out_again_for_the_next_head() {
        while RAWS.with(|r| r.borrow_mut().pop()).is_some() {}
        let head = Bytes::from_static(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n");
        let mut fields = raw_fields(head.clone());
        fields.push((17, 18), (20, 21), crate::wire::raw_head::Kind::Other);
        assert_eq!(fields.iter().count(), 1);
        let room: *const RawFields = &*fields;
        keep_raw_fields(fields);
        let again = raw_fields(Bytes::from_static(b"HTTP/1.1 204 No Content\r\n\r\n"));
        assert!(std::ptr::eq(&*again, room), "the box given back");
        assert_eq!(again.iter().count(), 0, "with no fields of the last head");
    }

    #[test]
    fn an_extension_set_given_back_is_handed_out_again_empty() {
        while EXTENSIONS.with(|e| e.borrow_mut().pop()).is_some() {}
        keep_extensions(Extensions::new());
        assert_eq!(EXTENSIONS.with(|e| e.borrow().len()), 0, "no table to keep");
        let mut set = extensions();
        set.insert(7u32);
        keep_extensions(set);
        let taken = extensions();
        assert!(taken.is_empty());
        assert_eq!(EXTENSIONS.with(|e| e.borrow().len()), 0);
    }
}
