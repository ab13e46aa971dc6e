//! One header line as `ngx_http_parse_header_line` reads it (names of
//! letters, digits and `-`; `_` only with `underscores_in_headers on`;
//! values trimmed of spaces, not tabs), the same name rule for headers
//! hyper already parsed (HTTP/2), and `ngx_atoof` for Content-Length.

use vigil_core::config::ClientSettings;

/// One header line as nginx parsed it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HeaderLine<'a> {
    pub(crate) name: &'a [u8],
    pub(crate) value: &'a [u8],
    /// A name byte nginx does not allow (`r->invalid_header`).
    pub(crate) invalid: bool,
    pub(crate) has_colon: bool,
}

/// Drop the headers whose names nginx calls invalid, where
/// `ignore_invalid_headers` is on: a name with `_` (unless
/// `underscores_in_headers on`) or any byte but letters, digits and `-`.
/// The gate already did this to HTTP/1 heads; this covers HTTP/2 requests
/// (and is a no-op otherwise, without allocating).
pub(crate) fn drop_invalid_headers(headers: &mut http::HeaderMap, client: &ClientSettings) {
    if !client.ignore_invalid_headers {
        return;
    }
    let valid = |name: &http::HeaderName| {
        name.as_str().bytes().all(|b| {
            b.is_ascii_alphanumeric() || b == b'-' || (b == b'_' && client.underscores_in_headers)
        })
    };
    if headers.keys().all(valid) {
        return;
    }
    let invalid: Vec<http::HeaderName> = headers.keys().filter(|n| !valid(n)).cloned().collect();
    for name in invalid {
        headers.remove(name);
    }
}

/// `ngx_http_parse_header_line` on one whole line (through its LF): the
/// name, the value with nginx's trimming (spaces only), and whether the
/// name has a byte nginx calls invalid. `None` where nginx answers 400.
pub(crate) fn parse_header_line(line: &[u8], underscores: bool) -> Option<HeaderLine<'_>> {
    let mut invalid = false;
    let mut name_end = None;
    let first = *line.first()?;
    let name_byte = |b: u8, invalid: &mut bool| -> bool {
        if b.is_ascii_alphanumeric() || b == b'-' {
            return true;
        }
        if b == b'_' {
            *invalid |= !underscores;
            return true;
        }
        if b <= 0x20 || b == 0x7f {
            return false;
        }
        *invalid = true;
        true
    };
    if first == b':' || !name_byte(first, &mut invalid) {
        return None;
    }
    let mut i = 1;
    while i < line.len() {
        let b = line[i];
        if b == b':' {
            name_end = Some(i);
            break;
        }
        if b == b'\r' || b == b'\n' {
            break;
        }
        if !name_byte(b, &mut invalid) {
            return None;
        }
        i += 1;
    }
    let Some(colon) = name_end else {
        // A name alone on its line: a header with an empty value.
        let name = &line[..i];
        return end_of_line(&line[i..]).then_some(HeaderLine {
            name,
            value: b"",
            invalid,
            has_colon: false,
        });
    };
    let mut j = colon + 1;
    while line.get(j) == Some(&b' ') {
        j += 1;
    }
    let value_start = j;
    let mut value_end = j;
    while j < line.len() {
        match line[j] {
            b'\r' | b'\n' => break,
            0 => return None,
            b' ' => {}
            _ => value_end = j + 1,
        }
        j += 1;
    }
    end_of_line(&line[j..]).then_some(HeaderLine {
        name: &line[..colon],
        value: &line[value_start..value_end],
        invalid,
        has_colon: true,
    })
}

/// nginx's `sw_almost_done`: any CRs, then LF.
fn end_of_line(rest: &[u8]) -> bool {
    match rest.split_last() {
        Some((b'\n', crs)) => crs.iter().all(|&b| b == b'\r'),
        _ => false,
    }
}

/// `ngx_atoof`: digits only, at least one, no overflow of `off_t`.
pub(super) fn atoof(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mut n: i64 = 0;
    for &b in v {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(i64::from(b - b'0'))?;
    }
    u64::try_from(n).ok()
}
