//! PCRE's meaning of each construct where it differs from the `regex`
//! crate's (or the crate has none), as a table; the same rows that a
//! location can carry are sent to a stock nginx in
//! crates/proxy/tests/it/regex.rs.

use super::*;

/// No match.
const NO: Option<&[Option<&[u8]>]> = None;

/// `(pattern, caseless, subject, the groups of the match or NO)`.
type Row = (
    &'static str,
    bool,
    &'static [u8],
    Option<&'static [Option<&'static [u8]>]>,
);

const TABLE: &[Row] = &[
    // `$` is the end or just before a final `\n` (no PCRE2_DOLLAR_ENDONLY):
    // the newline is not part of the match, and a group stops before it.
    (r"^/adm2$", false, b"/adm2", Some(&[Some(b"/adm2")])),
    (r"^/adm2$", false, b"/adm2\n", Some(&[Some(b"/adm2")])),
    (r"^/adm2$", false, b"/adm2\n\n", NO),
    (r"^/adm2$", false, b"/adm2\nx", NO),
    (r"^/adm2$", false, b"/adm2\r\n", NO),
    (r"^/adm2$", false, b"/adm2\r", NO),
    (r"^/(.*)$", false, b"/a\n", Some(&[Some(b"/a"), Some(b"a")])),
    (
        r"^/(.*)\n$",
        false,
        b"/a\n",
        Some(&[Some(b"/a\n"), Some(b"a")]),
    ),
    // `\z` is the very end; `\Z` is `$`'s end.
    (r"^/adm2\z", false, b"/adm2\n", NO),
    (r"^/adm2\z", false, b"/adm2", Some(&[Some(b"/adm2")])),
    (r"^/adm2\Z", false, b"/adm2\n", Some(&[Some(b"/adm2")])),
    (r"^/adm2\Z", false, b"/adm2\n\n", NO),
    // `^` is the start only; `(?m)` makes both anchors line anchors.
    (r"^b$", false, b"a\nb\nc", NO),
    (r"(?m)^b$", false, b"a\nb\nc", Some(&[Some(b"b")])),
    // `.` is any one byte but `\n`; `(?s)` takes `\n` too.
    (r"^/a.b$", false, b"/a\nb", NO),
    (r"^/a.b$", false, b"/a\rb", Some(&[Some(b"/a\rb")])),
    (r"(?s)^/a.b$", false, b"/a\nb", Some(&[Some(b"/a\nb")])),
    (r"^/.$", false, "/é".as_bytes(), NO),
    (
        r"^/..$",
        false,
        "/é".as_bytes(),
        Some(&[Some("/é".as_bytes())]),
    ),
    (r"^/a.b$", false, b"/a\xffb", Some(&[Some(b"/a\xffb")])),
    // `\d`, `\w`, `\s` and POSIX classes are ASCII; bytes >= 0x80 are none of them.
    (r"^/\w+$", false, "/é".as_bytes(), NO),
    (
        r"^/\W\W$",
        false,
        "/é".as_bytes(),
        Some(&[Some("/é".as_bytes())]),
    ),
    (r"^/\d$", false, "/\u{663}".as_bytes(), NO),
    (
        r"^/\d+$",
        false,
        b"/0123456789",
        Some(&[Some(b"/0123456789")]),
    ),
    (r"^/\s$", false, "/\u{a0}".as_bytes(), NO),
    (r"^/\s$", false, b"/\x0b", Some(&[Some(b"/\x0b")])),
    (r"^/[[:alpha:]]+$", false, "/é".as_bytes(), NO),
    (r"^/[[:alpha:]]+$", false, b"/aZ", Some(&[Some(b"/aZ")])),
    // Caseless (`~*`) folds ASCII letters only; `(?i)` / `(?-i)` inside.
    (r"^/CAFE$", true, b"/cafe", Some(&[Some(b"/cafe")])),
    (
        r"^/CAFÉ$",
        true,
        "/cafÉ".as_bytes(),
        Some(&[Some("/cafÉ".as_bytes())]),
    ),
    (r"^/CAFÉ$", true, "/café".as_bytes(), NO),
    (r"^/x[a-c]$", true, b"/XB", Some(&[Some(b"/XB")])),
    (r"^/(?i)cafe$", false, b"/CAFE", Some(&[Some(b"/CAFE")])),
    (r"^/(?-i)cafe$", true, b"/CAFE", NO),
    (r"^/cafe$", false, b"/CAFE", NO),
    // Groups are numbered by their `(`, named or not, in any name syntax;
    // a group that took no part is unset, a group that matched "" is "".
    (
        r"^/(?<a>x)(y)(?P<b>z)(?'c'w)$",
        false,
        b"/xyzw",
        Some(&[
            Some(b"/xyzw"),
            Some(b"x"),
            Some(b"y"),
            Some(b"z"),
            Some(b"w"),
        ]),
    ),
    (
        r"^/(a)?(b)$",
        false,
        b"/b",
        Some(&[Some(b"/b"), None, Some(b"b")]),
    ),
    (
        r"^/(a*)(b)$",
        false,
        b"/b",
        Some(&[Some(b"/b"), Some(b""), Some(b"b")]),
    ),
    (
        r"^/(?:a)(b)$",
        false,
        b"/ab",
        Some(&[Some(b"/ab"), Some(b"b")]),
    ),
    (
        r"^/(?|(a)|(b))(c)$",
        false,
        b"/bc",
        Some(&[Some(b"/bc"), Some(b"b"), Some(b"c")]),
    ),
    (
        r"^/(?:(a)|b)+$",
        false,
        b"/ab",
        Some(&[Some(b"/ab"), Some(b"a")]),
    ),
    // Look-ahead and look-behind.
    (r"^/(?!admin)", false, b"/admin/x", NO),
    (r"^/(?!admin)", false, b"/public", Some(&[Some(b"/")])),
    (r"^/(?=a)\w+", false, b"/ab", Some(&[Some(b"/ab")])),
    (r"(?<=\.)php$", false, b"/a.php", Some(&[Some(b"php")])),
    (r"(?<!\.)php$", false, b"/a.php", NO),
    // Backreferences, by number and by name.
    (
        r"^/(\w+)/\1$",
        false,
        b"/ab/ab",
        Some(&[Some(b"/ab/ab"), Some(b"ab")]),
    ),
    (r"^/(\w+)/\1$", false, b"/ab/ac", NO),
    (
        r"^/(?<n>\w+)/\k<n>$",
        false,
        b"/q/q",
        Some(&[Some(b"/q/q"), Some(b"q")]),
    ),
    (
        r"^/(\w+)/\g{-1}$",
        false,
        b"/q/q",
        Some(&[Some(b"/q/q"), Some(b"q")]),
    ),
    // Atomic groups and possessive quantifiers give nothing back.
    (r"^/(?>a+)a", false, b"/aaa", NO),
    (r"^/a++a", false, b"/aaa", NO),
    (r"^/a+a", false, b"/aaa", Some(&[Some(b"/aaa")])),
    // `\K` restarts the match; `\Q..\E` quotes.
    (r"^/x/\Kyz", false, b"/x/yz", Some(&[Some(b"yz")])),
    (r"^/\Q.a*\E$", false, b"/.a*", Some(&[Some(b"/.a*")])),
    (r"^/\Q.a*\E$", false, b"/xa", NO),
    // Conditionals and recursion.
    (
        r"^/(a)?(?(1)b|c)$",
        false,
        b"/ab",
        Some(&[Some(b"/ab"), Some(b"a")]),
    ),
    (r"^/(a)?(?(1)b|c)$", false, b"/c", Some(&[Some(b"/c")])),
    (r"^/(a)?(?(1)b|c)$", false, b"/ac", NO),
    (
        r"^/(\((?:[^()]|(?1))*\))$",
        false,
        b"/(a(b))",
        Some(&[Some(b"/(a(b))"), Some(b"(a(b))")]),
    ),
    (r"^/(\((?:[^()]|(?1))*\))$", false, b"/(a(b)", NO),
    // `\é` is `é` (an escaped non-alphanumeric is itself), `]` first in a class is literal.
    (
        r"^/\é$",
        false,
        "/é".as_bytes(),
        Some(&[Some("/é".as_bytes())]),
    ),
    (r"[]a]", false, b"]", Some(&[Some(b"]")])),
];

#[test]
fn each_construct_means_what_pcre_means() {
    let mut wrong = Vec::new();
    for &(pattern, caseless, subject, want) in TABLE {
        let re = match compile(pattern, caseless) {
            Ok(re) => re,
            Err(e) => {
                wrong.push(format!("{pattern}: {e}"));
                continue;
            }
        };
        let want: Option<Groups> = want.map(|g| g.iter().map(|s| s.map(<[u8]>::to_vec)).collect());
        // The groups of a match as nginx sets `$1`..: one per group of the
        // expression, the unset ones at the end included.
        let want = want.map(|mut g| {
            let count = re.capture_names().count();
            g.resize(count, None);
            g
        });
        let got = re.captures(subject);
        let matched = re.is_match(subject);
        if got.as_ref().ok() != Some(&want) || matched.as_ref().ok() != Some(&want.is_some()) {
            wrong.push(format!(
                "{pattern} (caseless {caseless}) on {:?}: {got:?} / {matched:?}, want {want:?}",
                String::from_utf8_lossy(subject)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn group_names_are_in_group_order_whatever_their_syntax() {
    let re = compile(r"^/(?<a>x)(y)(?P<b>z)(?'c'w)$", false).expect("compiles");
    let names: Vec<_> = re.capture_names().collect();
    assert_eq!(names, [None, Some("a"), None, Some("b"), Some("c")]);
    assert_eq!(group_names(&re).collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(re.as_str(), r"^/(?<a>x)(y)(?P<b>z)(?'c'w)$");
}

#[test]
fn compile_errors_read_as_nginx_writes_them() {
    // ngx_regex_compile: "at" and the rest of the pattern unless PCRE2
    // stopped at its end. The first three as `nginx -t` prints them.
    assert_eq!(
        compile("a(", false).expect_err("unclosed"),
        "pcre2_compile() failed: missing closing parenthesis in \"a(\""
    );
    assert_eq!(
        compile("a)b", false).expect_err("unopened"),
        "pcre2_compile() failed: unmatched closing parenthesis in \"a)b\" at \")b\""
    );
    assert_eq!(
        compile(r"(?<n>a)(?<n>b)", false).expect_err("the same name twice"),
        "pcre2_compile() failed: two named subpatterns have the same name \
         (PCRE2_DUPNAMES not set) in \"(?<n>a)(?<n>b)\" at \"b)\""
    );
    for bad in [r"a\", "*a", "(?<=a+)b", "[z-a]"] {
        let e = compile(bad, false).expect_err(bad);
        assert!(e.starts_with("pcre2_compile() failed: "), "{e}");
        assert!(e.contains(&format!("in \"{bad}\"")), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn where_the_jit_gives_up_the_interpreter_decides() {
    // `(a|b)*` keeps a frame per byte: the JIT's 32 KiB stack runs out
    // long before PCRE2's interpreter (nginx's default) stops.
    let mut subject = b"/".to_vec();
    subject.extend((0..8000).map(|i| if i % 2 == 0 { b'a' } else { b'b' }));
    let re = compile(r"^/(a|b)*$", false).expect("compiles");
    assert_eq!(re.is_match(&subject).ok(), Some(true));
    let groups = re.captures(&subject).expect("no error").expect("a match");
    assert_eq!(groups[1].as_deref(), Some(&b"b"[..]));
    subject.push(b'c');
    assert_eq!(re.is_match(&subject).ok(), Some(false));
}

#[test]
fn a_runaway_match_stops_at_pcres_match_limit() {
    // Exponential backtracking: PCRE2's default match limit
    // (10,000,000) ends it with an error, as in nginx.
    let mut subject = b"/".to_vec();
    subject.extend([b'a'; 40]);
    subject.push(b'b');
    let re = compile(r"^/(a|aa)+$", false).expect("compiles");
    let e = re.is_match(&subject).expect_err("match limit");
    assert_eq!(e.code(), -47, "{e}");
    assert_eq!(
        e.to_string(),
        "pcre2_match() failed: -47 (match limit exceeded) using \"^/(a|aa)+$\""
    );
    assert_eq!(re.captures(&subject).map_err(|e| e.code()), Err(-47));
    // The same expression on an ordinary subject.
    assert_eq!(re.is_match(b"/aaa").ok(), Some(true));
}

#[test]
fn one_expression_matches_from_many_threads() {
    fn shared<T: Send + Sync + Clone + 'static>() {}
    shared::<Regex>();
    let re = compile(r"^/u/(?<id>\d+)$", false).expect("compiles");
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let re = re.clone();
            std::thread::spawn(move || {
                (0..500)
                    .filter(|i| {
                        let uri = format!("/u/{}", i * 4 + t);
                        let groups = re.captures(uri.as_bytes()).ok().flatten();
                        groups.and_then(|g| g.get(1).cloned().flatten())
                            == Some((i * 4 + t).to_string().into_bytes())
                    })
                    .count()
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().ok(), Some(500));
    }
}

proptest::proptest! {
    /// `^P$` matches P and P followed by one `\n`, nothing else; `^P\z`
    /// P only (P plain text; subjects of its letters, `\n` and `\r`).
    #[test]
    fn dollar_is_the_end_or_before_a_final_newline(
        literal in "[ab/]{1,4}",
        subject in "[ab/\n\r]{0,7}",
    ) {
        let dollar = compile(&format!("^{literal}$"), false).expect("compiles");
        let end = compile(&format!("^{literal}\\z"), false).expect("compiles");
        let s = subject.as_bytes();
        let with_newline = format!("{literal}\n");
        proptest::prop_assert_eq!(
            dollar.is_match(s).ok(),
            Some(subject == literal || subject == with_newline)
        );
        proptest::prop_assert_eq!(end.is_match(s).ok(), Some(subject == literal));
        // The match itself never takes the newline.
        if let Ok(Some(g)) = dollar.captures(s) {
            proptest::prop_assert_eq!(g[0].as_deref(), Some(literal.as_bytes()));
        }
    }
}
