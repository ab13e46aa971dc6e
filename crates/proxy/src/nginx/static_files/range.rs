//! `Range` as ngx_http_range_filter_module reads it: the ranges of one
//! `bytes=` header (ngx_http_range_parse, byte for byte), `If-Range`, and
//! the multipart boundary.

use std::sync::atomic::{AtomicU64, Ordering};

/// One range, `start..end` (end exclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ByteRange {
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// What a `Range` header asks of a body of a known size.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ranges {
    /// These ranges (206).
    Some(Vec<ByteRange>),
    /// None can be served (416).
    NotSatisfiable,
    /// The whole body instead (200): a range starting at 0 of an empty
    /// body, more than `max_ranges`, or ranges adding up to more than the body.
    Whole,
}

/// ngx_http_range_parse on the value after `bytes=`, for a body of
/// `size` bytes, with at most `max` ranges.
pub(crate) fn parse(spec: &[u8], size: u64, max: u32) -> Ranges {
    // nginx reads up to the value's terminating NUL.
    let at = |i: usize| spec.get(i).copied().unwrap_or(0);
    let (cutoff, cutlim) = (i64::MAX as u64 / 10, i64::MAX as u64 % 10);
    let mut p = 0usize;
    let mut out = Vec::new();
    let mut total: u64 = 0;
    let mut left = max;
    loop {
        let (mut start, mut end) = (0u64, 0u64);
        let mut suffix = false;
        while at(p) == b' ' {
            p += 1;
        }
        let mut open_ended = false;
        if at(p) != b'-' {
            if !at(p).is_ascii_digit() {
                return Ranges::NotSatisfiable;
            }
            while at(p).is_ascii_digit() {
                let d = u64::from(at(p) - b'0');
                if start >= cutoff && (start > cutoff || d > cutlim) {
                    return Ranges::NotSatisfiable;
                }
                start = start * 10 + d;
                p += 1;
            }
            while at(p) == b' ' {
                p += 1;
            }
            if at(p) != b'-' {
                return Ranges::NotSatisfiable;
            }
            p += 1;
            while at(p) == b' ' {
                p += 1;
            }
            if at(p) == b',' || at(p) == 0 {
                end = size;
                open_ended = true;
            }
        } else {
            suffix = true;
            p += 1;
        }
        if !open_ended {
            if !at(p).is_ascii_digit() {
                return Ranges::NotSatisfiable;
            }
            while at(p).is_ascii_digit() {
                let d = u64::from(at(p) - b'0');
                if end >= cutoff && (end > cutoff || d > cutlim) {
                    return Ranges::NotSatisfiable;
                }
                end = end * 10 + d;
                p += 1;
            }
            while at(p) == b' ' {
                p += 1;
            }
            if at(p) != b',' && at(p) != 0 {
                return Ranges::NotSatisfiable;
            }
            if suffix {
                start = size.saturating_sub(end);
                // nginx: end = content_length - 1, then end++ below.
                end = size;
            } else if end >= size {
                end = size;
            } else {
                end += 1;
            }
        }
        if start < end {
            out.push(ByteRange { start, end });
            total = match total.checked_add(end - start) {
                Some(t) if t <= i64::MAX as u64 => t,
                _ => return Ranges::NotSatisfiable,
            };
            if left == 0 {
                return Ranges::Whole;
            }
            left -= 1;
        } else if start == 0 {
            return Ranges::Whole;
        }
        let c = at(p);
        p += 1;
        if c != b',' {
            break;
        }
    }
    if out.is_empty() {
        return Ranges::NotSatisfiable;
    }
    if total > size {
        return Ranges::Whole;
    }
    Ranges::Some(out)
}

/// The next multipart boundary (nginx's ngx_next_temp_number: a
/// process-wide counter, written as 20 digits).
pub(crate) fn boundary() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) + 1;
    format!("{n:020}")
}

#[cfg(test)]
mod tests {
    use super::{parse, ByteRange, Ranges};

    fn r(start: u64, end: u64) -> ByteRange {
        ByteRange { start, end }
    }

    #[test]
    fn single_forms() {
        let m = u32::MAX;
        assert_eq!(parse(b"0-4", 10, m), Ranges::Some(vec![r(0, 5)]));
        assert_eq!(parse(b"5-", 10, m), Ranges::Some(vec![r(5, 10)]));
        assert_eq!(parse(b"-3", 10, m), Ranges::Some(vec![r(7, 10)]));
        assert_eq!(parse(b"-30", 10, m), Ranges::Some(vec![r(0, 10)]));
        assert_eq!(parse(b"2-100", 10, m), Ranges::Some(vec![r(2, 10)]));
        assert_eq!(parse(b" 1 - 2 ", 10, m), Ranges::Some(vec![r(1, 3)]));
    }

    #[test]
    fn unsatisfiable_and_whole() {
        let m = u32::MAX;
        assert_eq!(parse(b"10-", 10, m), Ranges::NotSatisfiable);
        assert_eq!(parse(b"x", 10, m), Ranges::NotSatisfiable);
        assert_eq!(parse(b"5-3", 10, m), Ranges::NotSatisfiable);
        assert_eq!(parse(b"0-", 0, m), Ranges::Whole);
        assert_eq!(parse(b"-0", 10, m), Ranges::NotSatisfiable);
        assert_eq!(
            parse(b"0-5,3-9", 10, m),
            Ranges::Whole,
            "overlap past the size"
        );
        assert_eq!(parse(b"0-1,3-4", 10, 1), Ranges::Whole, "over max_ranges");
        assert_eq!(
            parse(b"0-1,3-4", 10, m),
            Ranges::Some(vec![r(0, 2), r(3, 5)])
        );
        assert_eq!(
            parse(b"99999999999999999999-", 10, m),
            Ranges::NotSatisfiable
        );
    }
}
