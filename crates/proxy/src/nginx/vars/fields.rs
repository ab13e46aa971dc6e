//! The variables read from the request's fields and query, as nginx 1.22
//! finds them: `$http_NAME`, `$arg_NAME`, `$cookie_NAME`, and `$host` when
//! the host is not UTF-8. Values are the request's bytes.

use http::request::Parts;

use crate::nginx::vhost::Host;

/// `$http_NAME` (`name` with `-` for `_`, lower-case): the first line of
/// that field, but for the fields nginx 1.22 joins (`X-Forwarded-For`
/// with `, `, `Cookie` with `; `); HTTP/2's `:authority` stands for
/// `Host`, as nginx makes a `Host` of it. Appended to `out` as it came.
/// Whether the request has such a field (an access log writes `-` for
/// one it has not, nothing for an empty one).
pub(crate) fn header(p: &Parts, name: &str, out: &mut Vec<u8>) -> bool {
    let sep: &[u8] = match name {
        "cookie" => b"; ",
        "x-forwarded-for" => b", ",
        "host" if p.version == http::Version::HTTP_2 => {
            let v = match p.uri.authority() {
                Some(a) => a.as_str().as_bytes(),
                None => match p.headers.get(http::header::HOST) {
                    Some(v) => v.as_bytes(),
                    None => return false,
                },
            };
            out.extend_from_slice(v);
            return true;
        }
        _ => {
            let Some(v) = p.headers.get(name) else {
                return false;
            };
            out.extend_from_slice(v.as_bytes());
            return true;
        }
    };
    let mut found = false;
    for v in p.headers.get_all(name) {
        if found {
            out.extend_from_slice(sep);
        }
        out.extend_from_slice(v.as_bytes());
        found = true;
    }
    found
}

/// `$host` of a routed request: routing's validated host, which holds a
/// host that is not UTF-8 with U+FFFD in place of its bytes; then the
/// bytes are taken again from the field routing read, as nginx keeps them.
pub(crate) fn host(p: &Parts, validated: &Host, out: &mut Vec<u8>) {
    // An ASCII host (nearly every one) is looked at once, a word at a time.
    if validated.is_ascii() || !validated.contains('\u{FFFD}') {
        out.extend_from_slice(validated.as_bytes());
        return;
    }
    // An absolute-form target's host is ASCII (request_line_host); the
    // field is HTTP/2's `:authority`, else `Host`.
    let raw = match p.uri.authority() {
        Some(a) if p.version == http::Version::HTTP_2 => Some(a.as_str().as_bytes()),
        _ => p.headers.get(http::header::HOST).map(|v| v.as_bytes()),
    };
    match raw.and_then(crate::nginx::vhost::validate_host_bytes) {
        Some(h) => out.extend_from_slice(&h),
        None => out.extend_from_slice(validated.as_bytes()),
    }
}

/// `$arg_NAME` as `ngx_http_arg` finds it: the first `NAME=` (name
/// case-insensitive) at the start of the query or after `&`; a bare `NAME`
/// without `=` does not count.
pub(crate) fn arg<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        k.eq_ignore_ascii_case(name).then_some(v)
    })
}

/// `$cookie_NAME` as nginx 1.22's `ngx_http_parse_multi_header_lines`
/// finds it in the Cookie lines: pairs split at `;` or `,`, the name
/// matched case-insensitively, spaces allowed around `=`, the value up to
/// the next `;`.
pub(crate) fn cookie<'c>(lines: impl Iterator<Item = &'c [u8]>, name: &[u8]) -> Option<&'c [u8]> {
    for line in lines {
        let mut i = 0;
        while i < line.len() {
            let rest = &line[i..];
            if rest.len() >= name.len() && rest[..name.len()].eq_ignore_ascii_case(name) {
                let mut j = i + name.len();
                while line.get(j) == Some(&b' ') {
                    j += 1;
                }
                if line.get(j) == Some(&b'=') {
                    j += 1;
                    while line.get(j) == Some(&b' ') {
                        j += 1;
                    }
                    let end = line[j..]
                        .iter()
                        .position(|&b| b == b';')
                        .map_or(line.len(), |e| j + e);
                    return Some(&line[j..end]);
                }
            }
            // Skip to the next pair.
            while i < line.len() {
                let b = line[i];
                i += 1;
                if b == b';' || b == b',' {
                    break;
                }
            }
            while line.get(i) == Some(&b' ') {
                i += 1;
            }
        }
    }
    None
}
