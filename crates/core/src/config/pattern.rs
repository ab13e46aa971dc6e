//! nginx's PCRE regular expressions (locations, `rewrite`, `map`) on the
//! `regex` crate: the same expressions compile to the same matches, and
//! what the crate cannot do is refused with a clear message.
//!
//! Differences from PCRE (nginx 1.22 built with PCRE2, no UTF mode):
//! look-ahead / look-behind (`(?=` `(?!` `(?<=` `(?<!`), backreferences
//! (`\1`, `\k<name>`, `\g1`), atomic groups `(?>` and possessive
//! quantifiers (`a++`), recursion and conditionals are refused. Matching is
//! byte-wise with ASCII classes (`\w`, `\d`, `\s`, `[[:alpha:]]` and case
//! folding cover ASCII only), as nginx's PCRE without UTF. `(?'name'...)`
//! is accepted as `(?<name>...)`. The crate guarantees linear-time
//! matching: no expression can backtrack catastrophically.

use regex::bytes::{Regex, RegexBuilder};

/// Compile `pattern` as nginx would (`caseless`: `~*`). The error is one
/// line, naming what is not supported.
pub fn compile(pattern: &str, caseless: bool) -> Result<Regex, String> {
    let translated = translate(pattern)?;
    RegexBuilder::new(&translated)
        .case_insensitive(caseless)
        .unicode(false)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| {
            let text = e.to_string();
            let why = text
                .lines()
                .rev()
                .find_map(|l| l.trim().strip_prefix("error: "))
                .unwrap_or(text.lines().next().unwrap_or("invalid"))
                .to_string();
            format!("pcre_compile() failed: {why} in \"{pattern}\"")
        })
}

/// The names of the named groups of a compiled expression.
pub fn group_names(re: &Regex) -> impl Iterator<Item = &str> {
    re.capture_names().flatten()
}

/// PCRE syntax the crate lacks, refused by name; `(?'n'` rewritten.
fn translate(pattern: &str) -> Result<String, String> {
    let unsupported = |what: &str| {
        Err(format!(
            "{what} in \"{pattern}\" is PCRE syntax vigil's regex engine (the `regex` crate) does not support"
        ))
    };
    let b = pattern.as_bytes();
    let mut out = String::with_capacity(pattern.len());
    let mut i = 0;
    let mut in_class = false;
    while i < b.len() {
        let c = b[i];
        if c == b'\\' {
            let next = b.get(i + 1).copied();
            match next {
                Some(b'1'..=b'9') if !in_class => return unsupported("a backreference"),
                Some(b'k' | b'g') if !in_class => return unsupported("a backreference"),
                _ => {}
            }
            i += 1;
            match pattern.get(i..).and_then(|r| r.chars().next()) {
                // PCRE takes `\é` as `é`; the crate refuses the escape.
                Some(c) if !c.is_ascii() => out.push(c),
                Some(c) => {
                    out.push('\\');
                    out.push(c);
                }
                None => out.push('\\'),
            }
            i += pattern
                .get(i..)
                .and_then(|r| r.chars().next())
                .map_or(0, char::len_utf8);
            continue;
        }
        if in_class {
            if c == b']' {
                in_class = false;
            }
        } else if c == b'[' {
            in_class = true;
            // `[]...]` and `[^]...]`: a leading `]` is a literal.
            let mut j = i + 1;
            if b.get(j) == Some(&b'^') {
                j += 1;
            }
            if b.get(j) == Some(&b']') {
                out.push_str(&pattern[i..=j]);
                i = j + 1;
                continue;
            }
        } else if c == b'(' && b.get(i + 1) == Some(&b'?') {
            let rest = &pattern[i + 2..];
            if rest.starts_with('=') || rest.starts_with('!') {
                return unsupported("look-ahead");
            }
            if rest.starts_with("<=") || rest.starts_with("<!") {
                return unsupported("look-behind");
            }
            if rest.starts_with('>') {
                return unsupported("an atomic group");
            }
            if rest.starts_with('(') || rest.starts_with('R') || rest.starts_with('&') {
                return unsupported("a conditional or recursion");
            }
            if let Some(name) = rest.strip_prefix('\'') {
                if let Some(end) = name.find('\'') {
                    out.push_str("(?<");
                    out.push_str(&name[..end]);
                    out.push('>');
                    i += 2 + 1 + end + 1;
                    continue;
                }
            }
        } else if matches!(c, b'*' | b'+' | b'?' | b'}') && b.get(i + 1) == Some(&b'+') {
            return unsupported("a possessive quantifier");
        }
        let len = pattern[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&pattern[i..i + len]);
        i += len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcre_forms_compile_or_are_refused_by_name() {
        let m = |p: &str, ci: bool, s: &str| compile(p, ci).expect(p).is_match(s.as_bytes());
        assert!(m(r"\.php$", false, "/a.php"));
        assert!(!m(r"\.php$", false, "/a.PHP"));
        assert!(m(r"\.php$", true, "/a.PHP"));
        assert!(m(r"^/(?<id>\d+)/x", false, "/12/x"));
        assert!(m(r"^/(?P<id>\d+)/x", false, "/12/x"));
        assert!(m(r"^/(?'id'\d+)/x", false, "/12/x"));
        assert!(m(r"[]a]", false, "]"));
        assert!(m(r"^/a{1,3}$", false, "/aa"));
        assert!(
            m(r"^/\é$", false, "/é"),
            "an escaped multi-byte character is kept"
        );
        assert!(m(r"x\\", false, "x\\"));
        let names: Vec<_> = group_names(&compile(r"(?'id'\d+)", false).expect("re"))
            .map(str::to_string)
            .collect();
        assert_eq!(names, ["id"]);
        for (p, what) in [
            (r"^/(?!admin)", "look-ahead"),
            (r"(?<=x)y", "look-behind"),
            (r"(a)\1", "backreference"),
            (r"(?<n>a)\k<n>", "backreference"),
            (r"(?>a+)", "atomic group"),
            (r"a++", "possessive"),
        ] {
            let e = compile(p, false).expect_err(p);
            assert!(e.contains(what), "{p}: {e}");
        }
        let e = compile("a(", false).expect_err("unclosed");
        assert!(e.starts_with("pcre_compile() failed: "), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
