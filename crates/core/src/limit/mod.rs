//! nginx's request and connection limits (`ngx_http_limit_req_module`,
//! `ngx_http_limit_conn_module`, 1.22) as rules on keys: [`req`], the
//! leaky bucket in milli-requests, and [`conn`], the requests in flight a
//! key has. No clock of their own: `now` (core's milliseconds) is an
//! argument, so every rate is tested in simulated time.
//!
//! A zone holds as many keys as nginx's shared memory zone of the same
//! size would: nginx's slab allocator gives each key a slot of the next
//! power of two above its node (`limit_req`: 80 bytes + the key, 128
//! for an IPv4 or IPv6 `$binary_remote_addr`; `limit_conn`: 36 bytes +
//! the key, 64), out of pages of 4096 bytes that each cost 4120 of the
//! zone ([`zone_bytes`]). So a megabyte holds 8128 `limit_req` keys of up
//! to 48 bytes, about the 8 thousand nginx's documentation gives for
//! 64-bit platforms, and 16256 `limit_conn` keys of up to 28 bytes.
//!
//! Why not `governor` (a workspace dependency, used by the retry budget):
//! its GCRA keeps a theoretical arrival time in nanoseconds and admits by
//! it, so it answers differently from nginx's bucket, which keeps the
//! excess in milli-requests, drains `rate * ms / 1000` rounded down (the
//! fraction of a request lost whenever a request comes within a few
//! milliseconds) and advances `last` only when a whole millisecond went
//! by; nor has it nginx's `delay=` split of a burst, several limits where
//! the strictest delay wins and a rejected request charges no zone, nor an
//! LRU bounded by the zone's size.

pub mod conn;
pub mod req;

/// The bytes of a zone of `size` bytes that hold keys: its whole pages of
/// 4096 bytes, each costing 4096 plus its 24-byte descriptor in nginx's
/// slab pool.
pub fn zone_bytes(size: u64) -> usize {
    let pages = size / 4120;
    usize::try_from(pages.saturating_mul(4096)).unwrap_or(usize::MAX)
}

/// How many keys of `key_len` bytes a `limit_req` zone of `size` bytes
/// holds (for the docs and `vigil lint`).
pub fn keys_in(size: u64, key_len: usize) -> usize {
    zone_bytes(size) / req::slot(key_len)
}
