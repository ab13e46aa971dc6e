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
        !invalid_name(name.as_str().as_bytes(), client.underscores_in_headers)
    };
    if headers.keys().all(valid) {
        return;
    }
    let invalid: Vec<http::HeaderName> = headers.keys().filter(|n| !valid(n)).cloned().collect();
    for name in invalid {
        headers.remove(name);
    }
}

/// A byte's class in a header name, as `ngx_http_parse_header_line`
/// tells it (one table lookup a byte).
const NAME: u8 = 0;
/// `_`: a name byte, invalid unless `underscores_in_headers on`.
const UNDERSCORE: u8 = 1;
/// Any other byte above space but DEL: kept in the name, which is invalid.
const OTHER: u8 = 2;
/// Control bytes, space and DEL: nginx answers 400.
const BAD: u8 = 3;
const COLON: u8 = 4;
/// CR or LF: the line ends (a name alone on its line).
const EOL: u8 = 5;

static NAME_CLASS: [u8; 256] = {
    let mut t = [OTHER; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = if c.is_ascii_alphanumeric() || c == b'-' {
            NAME
        } else if c == b'_' {
            UNDERSCORE
        } else if c == b':' {
            COLON
        } else if c == b'\r' || c == b'\n' {
            EOL
        } else if c <= 0x20 || c == 0x7f {
            BAD
        } else {
            OTHER
        };
        b += 1;
    }
    t
};

/// Whether nginx calls a header name invalid (`r->invalid_header`): a byte
/// but letters, digits and `-`, or `_` without `underscores_in_headers on`.
pub(crate) fn invalid_name(name: &[u8], underscores: bool) -> bool {
    name.iter().any(|&b| match NAME_CLASS[usize::from(b)] {
        NAME => false,
        UNDERSCORE => !underscores,
        _ => true,
    })
}

/// `ngx_http_parse_header_line` on one whole line (through its LF): the
/// name, the value with nginx's trimming (spaces only), and whether the
/// name has a byte nginx calls invalid. `None` where nginx answers 400.
pub(crate) fn parse_header_line(line: &[u8], underscores: bool) -> Option<HeaderLine<'_>> {
    let mut invalid = false;
    let first = *line.first()?;
    match NAME_CLASS[usize::from(first)] {
        NAME => {}
        UNDERSCORE => invalid = !underscores,
        OTHER => invalid = true,
        _ => return None,
    }
    let mut colon = None;
    let mut i = 1;
    while let Some(&b) = line.get(i) {
        match NAME_CLASS[usize::from(b)] {
            NAME => {}
            UNDERSCORE => invalid |= !underscores,
            OTHER => invalid = true,
            COLON => {
                colon = Some(i);
                break;
            }
            EOL => break,
            _ => return None,
        }
        i += 1;
    }
    let Some(colon) = colon else {
        // A name alone on its line: a header with an empty value.
        let (name, rest) = line.split_at(i);
        return end_of_line(rest).then_some(HeaderLine {
            name,
            // Empty, where the line's end is (the value's place in the line).
            value: &rest[..0],
            invalid,
            has_colon: false,
        });
    };
    let mut value_start = colon + 1;
    while line.get(value_start) == Some(&b' ') {
        value_start += 1;
    }
    // The value runs to the line's CR or LF; a NUL before it is a 400.
    let rest = &line[value_start..];
    let stop = memchr::memchr3(b'\r', b'\n', 0, rest).unwrap_or(rest.len());
    if rest.get(stop) == Some(&0) {
        return None;
    }
    let value = &rest[..stop];
    let trimmed = value.iter().rposition(|&b| b != b' ').map_or(0, |p| p + 1);
    end_of_line(&rest[stop..]).then_some(HeaderLine {
        name: &line[..colon],
        value: &value[..trimmed],
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The loop over each byte this module had before its class table,
    /// kept as the reference the table must agree with.
    fn parse_header_line_bytewise(line: &[u8], underscores: bool) -> Option<HeaderLine<'_>> {
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

    /// Bytes a header line is made of, the ones the rules tell apart
    /// weighted up.
    fn line_bytes() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => prop::sample::select(b"aZ9-_: \t\r\n".to_vec()),
            1 => any::<u8>(),
            1 => Just(0u8),
        ];
        (prop::collection::vec(byte, 0..40), any::<bool>()).prop_map(|(mut v, lf)| {
            if lf {
                v.push(b'\n');
            }
            v
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn the_class_table_reads_a_line_as_the_bytewise_loop_did(
            line in line_bytes(),
            underscores in any::<bool>(),
        ) {
            prop_assert_eq!(
                parse_header_line(&line, underscores),
                parse_header_line_bytewise(&line, underscores)
            );
        }

        #[test]
        fn a_name_is_invalid_where_the_bytewise_rule_says(
            name in prop::collection::vec(any::<u8>(), 0..20),
            underscores in any::<bool>(),
        ) {
            let bytewise = !name.iter().all(|&b| {
                b.is_ascii_alphanumeric() || b == b'-' || (b == b'_' && underscores)
            });
            prop_assert_eq!(invalid_name(&name, underscores), bytewise);
        }
    }
}
