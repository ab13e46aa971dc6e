//! Tests for the nginx configuration parser.
//!
//! Comments marked "nginx -t" record what nginx 1.22.1 said about the same
//! input (values were checked by serving them with `return 200 ...`).

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

fn parse(src: &str) -> Result<Vec<Directive>, SyntaxError> {
    parse_str(
        src,
        Path::new("test.conf"),
        Path::new("/nonexistent-prefix"),
    )
}

fn ok(src: &str) -> Vec<Directive> {
    match parse(src) {
        Ok(directives) => directives,
        Err(err) => panic!("unexpected error for {src:?}: {err}"),
    }
}

/// Expects a parse error and returns (line, col, message).
fn parse_err(src: &str) -> (u32, u32, String) {
    match parse(src) {
        Err(SyntaxError::Parse { span, message }) => (span.line, span.col, message),
        other => panic!("expected a parse error for {src:?}, got {other:?}"),
    }
}

fn values(d: &Directive) -> Vec<&str> {
    d.args.iter().map(|a| a.value.as_str()).collect()
}

fn pos(span: &Span) -> (u32, u32) {
    (span.line, span.col)
}

fn block(d: &Directive) -> &[Directive] {
    match &d.block {
        Some(b) => b,
        None => panic!("directive {} has no block", d.name),
    }
}

const EOF_EXPECTING_SEMI: &str = "unexpected end of file, expecting \";\" or \"}\"";
const EOF_EXPECTING_BRACE: &str = "unexpected end of file, expecting \"}\"";

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("nginx-syntax-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn write(&self, rel: &str, content: impl AsRef<[u8]>) -> PathBuf {
        let path = self.0.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("create parent");
        }
        fs::write(&path, content).expect("write file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn parse_in(dir: &TempDir, main: &str) -> Result<Vec<Directive>, SyntaxError> {
    parse_file(&dir.path().join(main))
}

// ---------------------------------------------------------------- positions

#[test]
fn directive_and_arg_positions() {
    let d = ok("worker_processes 1;\n  error_log  logs/error.log info;");
    assert_eq!(d.len(), 2);
    assert_eq!(pos(&d[0].span), (1, 1));
    assert_eq!(pos(&d[0].args[0].span), (1, 18));
    assert_eq!(d[1].name, "error_log");
    assert_eq!(pos(&d[1].span), (2, 3));
    assert_eq!(pos(&d[1].args[0].span), (2, 14));
    assert_eq!(pos(&d[1].args[1].span), (2, 29));
    assert_eq!(d[1].span.file.as_path(), Path::new("test.conf"));
}

#[test]
fn positions_after_multiline_quoted_string() {
    let d = ok("a \"x\ny\" b;\nc;");
    assert_eq!(values(&d[0]), ["x\ny", "b"]);
    assert_eq!(
        pos(&d[0].args[0].span),
        (1, 3),
        "quoted arg starts at its quote"
    );
    assert_eq!(pos(&d[0].args[1].span), (2, 4));
    assert_eq!(pos(&d[1].span), (3, 1));
}

#[test]
fn positions_after_comments() {
    let d = ok("# top\n  a 1; # trailing ; { }\n# x\n\tb #mid ;\n 2;");
    assert_eq!(d.len(), 2);
    assert_eq!(pos(&d[0].span), (2, 3));
    assert_eq!(d[1].name, "b");
    assert_eq!(pos(&d[1].span), (4, 2), "a tab is one column");
    assert_eq!(values(&d[1]), ["2"], "a comment may sit between arguments");
    assert_eq!(pos(&d[1].args[0].span), (5, 2));
}

#[test]
fn columns_count_chars_and_crlf_is_whitespace() {
    let d = ok("é ü;\r\nb 2;\r\n");
    assert_eq!(d[0].name, "é");
    assert_eq!(pos(&d[0].args[0].span), (1, 3));
    assert_eq!(pos(&d[1].span), (2, 1));
    assert_eq!(pos(&d[1].args[0].span), (2, 3));
    assert_eq!(values(&d[1]), ["2"]);
}

#[test]
fn span_display() {
    let span = Span {
        file: Arc::new(PathBuf::from("conf/nginx.conf")),
        line: 12,
        col: 5,
    };
    assert_eq!(span.to_string(), "conf/nginx.conf:12:5");
}

// ------------------------------------------------------------------ escapes

#[test]
fn double_quoted_escapes() {
    // nginx -t + return 200: "q\"s\'b\\t\tr\rn\nx\xd" served as
    // q"s'b\t<TAB>r<CR>n<LF>x\xd.
    let d = ok(r#"a "\"" "\'" "\\" "\t" "\r" "\n" "\x" "\$" "a\\nb";"#);
    assert_eq!(
        values(&d[0]),
        ["\"", "'", "\\", "\t", "\r", "\n", "\\x", "\\$", "a\\nb"]
    );
    assert!(d[0].args.iter().all(|a| a.quoted));
}

#[test]
fn single_quoted_escapes() {
    // nginx -t + return 200: 'q\"s\'b\\t\tn\nx\x' served as q"s'b\t<TAB>n<LF>x\x.
    let d = ok(r#"a '\'' '\"' '\\' '\t' '\n' 'a\qb' 'say "hi"';"#);
    assert_eq!(
        values(&d[0]),
        ["'", "\"", "\\", "\t", "\n", "a\\qb", "say \"hi\""]
    );
}

#[test]
fn unquoted_escapes() {
    // nginx -t + return 200: a\"b\'c\\d\te\nf\xg\;h\ i\{j served as
    // a"b'c\d<TAB>e<LF>f\xg\;h\ i\{j: the same unescaping as in quotes, and
    // an escaped ; space or { does not end the word but keeps its backslash.
    let d = ok(r#"a a\"b a\'c c\\d d\te e\nf f\xg g\;h h\ i i\{j \k;"#);
    assert_eq!(
        values(&d[0]),
        ["a\"b", "a'c", "c\\d", "d\te", "e\nf", "f\\xg", "g\\;h", "h\\ i", "i\\{j", "\\k"]
    );
    assert!(d[0].args.iter().all(|a| !a.quoted));
}

#[test]
fn backslash_newline_continues_a_word() {
    // nginx -t: "worker_processes 1\<LF>;" reads one argument "1\<LF>".
    let d = ok("a b\\\nc;\nd;");
    assert_eq!(values(&d[0]), ["b\\\nc"]);
    assert_eq!(pos(&d[1].span), (3, 1));
}

#[test]
fn quotes_adjacent_to_semicolon_and_brace() {
    let d = ok(r#"a "b";c 'd'{e "f";}g"h";"#);
    assert_eq!(d.len(), 3);
    assert_eq!(values(&d[0]), ["b"]);
    assert_eq!(d[1].name, "c");
    assert_eq!(values(&d[1]), ["d"]);
    let inner = block(&d[1]);
    assert_eq!(inner[0].name, "e");
    assert_eq!(values(&inner[0]), ["f"]);
    // A quote inside a word is literal, so `g"h";` is the word `g"h"`.
    assert_eq!(d[2].name, "g\"h\"");
}

#[test]
fn empty_quoted_strings() {
    let d = ok(r#"a "" '';"#);
    assert_eq!(values(&d[0]), ["", ""]);
    assert!(d[0].args.iter().all(|a| a.quoted));
}

#[test]
fn paren_after_closing_quote_starts_a_word() {
    // nginx -t: `if ($uri = "/paren") {` works; `if ($uri = "/paren")x {`
    // fails with `invalid condition ")x"`, so `)` starts the word `)x`.
    let d = ok(r#"if ($a = "b") { return 200; } c "d")x;"#);
    assert_eq!(values(&d[0]), ["($a", "=", "b", ")"]);
    assert_eq!(block(&d[0])[0].name, "return");
    assert_eq!(values(&d[1]), ["d", ")x"]);
    assert!(!d[1].args[1].quoted);
}

#[test]
fn quote_inside_word_is_literal() {
    // nginx -t + return 200: a#b"c'd served as a#b"c'd.
    let d = ok(r#"a b"c d'e;"#);
    assert_eq!(values(&d[0]), ["b\"c", "d'e"]);
}

#[test]
fn hash_only_starts_a_comment_at_token_start() {
    // nginx -t: `a#b;` -> unknown directive "a#b".
    let d = ok("a#b c#d;\ne #f g;\nh;");
    assert_eq!(d[0].name, "a#b");
    assert_eq!(values(&d[0]), ["c#d"]);
    assert_eq!(d[1].name, "e");
    assert_eq!(values(&d[1]), ["h"], "the comment swallowed `f g;`");
}

#[test]
fn quoted_directive_name() {
    // nginx -t: `"worker_processes" 1;` is accepted.
    let d = ok(r#""worker_processes" 1;"#);
    assert_eq!(d[0].name, "worker_processes");
    assert_eq!(values(&d[0]), ["1"]);
}

#[test]
fn variable_braces_do_not_open_a_block() {
    // nginx -t + return 200: `set $v abc; return 200 ${v}x;` served "abcx".
    let d = ok("return 200 ${host}x ${{b}} a${b}c;");
    assert_eq!(values(&d[0]), ["200", "${host}x", "${{b}}", "a${b}c"]);
    // `{` right after `$name` (not right after `$`) opens a block.
    let d = ok("set $a{ b; } c x}y;");
    assert_eq!(values(&d[0]), ["$a"]);
    assert_eq!(block(&d[0])[0].name, "b");
    assert_eq!(values(&d[1]), ["x}y"], "`}}` inside a word is literal");
}

#[test]
fn brace_right_after_word_opens_block() {
    // nginx -t: `http{server{location /x{return 200;}}}` is accepted.
    let d = ok("location /x{return 200;}");
    assert_eq!(values(&d[0]), ["/x"]);
    assert_eq!(block(&d[0])[0].name, "return");
    assert_eq!(values(&block(&d[0])[0]), ["200"]);
}

#[test]
fn unquoted_regex_brace_opens_a_block() {
    // nginx -t on `location ~ ^/a{1,3}$ { return 200; }`: unknown directive
    // "1,3}$": the `{` ended the word `^/a` and opened a block.
    let (line, col, message) = parse_err("location ~ ^/a{1,3}$ { return 200; }");
    assert_eq!((line, col, message.as_str()), (1, 37, EOF_EXPECTING_BRACE));
    let d = ok("location ~ ^/a{1,3}$ { return 200; } }");
    assert_eq!(values(&d[0]), ["~", "^/a"]);
    let inner = block(&d[0]);
    assert_eq!(inner[0].name, "1,3}$");
    assert_eq!(block(&inner[0])[0].name, "return");
}

#[test]
fn quoted_regex_with_braces() {
    // nginx -t: `location ~ "^/a{1,3}$" { return 200; }` is accepted.
    let d = ok(r#"location ~ "^/a{1,3}$" { return 200; }"#);
    assert_eq!(values(&d[0]), ["~", "^/a{1,3}$"]);
    assert!(d[0].args[1].quoted);
    assert_eq!(block(&d[0])[0].name, "return");
}

// ----------------------------------------------------------------- structure

#[test]
fn nested_blocks() {
    let src = "http {\n  upstream u { server a:1; }\n  server {\n    listen 80;\n    location / { proxy_pass http://u; }\n    location /b {}\n  }\n}\n";
    let d = ok(src);
    assert_eq!(d.len(), 1);
    let http = block(&d[0]);
    assert_eq!(http.len(), 2);
    assert_eq!(http[0].name, "upstream");
    assert_eq!(values(&block(&http[0])[0]), ["a:1"]);
    let server = block(&http[1]);
    assert_eq!(server.len(), 3);
    assert_eq!(server[0].name, "listen");
    assert!(server[0].block.is_none());
    assert_eq!(pos(&server[1].span), (5, 5));
    assert_eq!(values(&block(&server[1])[0]), ["http://u"]);
    assert_eq!(block(&server[2]).len(), 0, "empty block is Some(empty)");
}

#[test]
fn empty_and_comment_only_files() {
    assert!(ok("").is_empty());
    assert!(ok(" \n\t\r\n").is_empty());
    assert!(ok("# just a comment").is_empty());
    assert!(ok("# a\n  # b ; { }\n#c\n").is_empty());
}

#[test]
fn conformance_harness_example() {
    let src = r#"worker_processes 1; error_log logs/error.log info; pid logs/nginx.pid;
events { worker_connections 1024; }
http {
    access_log off; client_body_temp_path tmp/client_body; proxy_temp_path tmp/proxy;
    upstream u1 { server 127.0.0.1:8001 weight=5 max_fails=2 fail_timeout=3s; server 127.0.0.1:8002 backup; }
    server {
        listen 127.0.0.1:8080;
        add_header X-Upstream-Addr $upstream_addr always;
        location / { proxy_pass http://u1; proxy_next_upstream error timeout http_503; proxy_next_upstream_tries 2; proxy_next_upstream_timeout 500ms; }
    }
}
"#;
    let d = ok(src);
    let names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["worker_processes", "error_log", "pid", "events", "http"]
    );
    assert_eq!(values(&d[1]), ["logs/error.log", "info"]);
    assert_eq!(values(&block(&d[3])[0]), ["1024"]);
    let http = block(&d[4]);
    assert_eq!(http.len(), 5);
    let upstream = &http[3];
    assert_eq!(values(upstream), ["u1"]);
    assert_eq!(
        values(&block(upstream)[0]),
        [
            "127.0.0.1:8001",
            "weight=5",
            "max_fails=2",
            "fail_timeout=3s"
        ]
    );
    assert_eq!(values(&block(upstream)[1]), ["127.0.0.1:8002", "backup"]);
    let server = block(&http[4]);
    assert_eq!(
        values(&server[1]),
        ["X-Upstream-Addr", "$upstream_addr", "always"]
    );
    assert_eq!(pos(&server[1].span), (8, 9));
    let location = block(&server[2]);
    assert_eq!(location.len(), 4);
    assert_eq!(values(&location[1]), ["error", "timeout", "http_503"]);
    assert_eq!(values(&location[3]), ["500ms"]);
}

#[test]
fn tengine_check_http_send_has_real_crlf() {
    let d = ok(r#"upstream u { check_http_send "HEAD /health HTTP/1.0\r\n\r\n"; }"#);
    let check = &block(&d[0])[0];
    assert_eq!(check.name, "check_http_send");
    assert_eq!(check.args[0].value, "HEAD /health HTTP/1.0\r\n\r\n");
}

// ------------------------------------------------------------------- errors

#[test]
fn semicolon_or_brace_without_name() {
    // nginx -t: unexpected ";" / unexpected "{".
    assert_eq!(parse_err(";"), (1, 1, "unexpected \";\"".to_string()));
    assert_eq!(parse_err("a;\n  {"), (2, 3, "unexpected \"{\"".to_string()));
    assert_eq!(parse_err("a { ; }"), (1, 5, "unexpected \";\"".to_string()));
}

#[test]
fn close_brace_with_args_pending() {
    // nginx -t: `pid a }` -> unexpected "}".
    assert_eq!(parse_err("a b }"), (1, 5, "unexpected \"}\"".to_string()));
    assert_eq!(
        parse_err("x { a\n}"),
        (2, 1, "unexpected \"}\"".to_string())
    );
}

#[test]
fn unbalanced_close_brace_at_top_level() {
    // nginx -t: `}` -> unexpected "}".
    assert_eq!(parse_err("a;\n}"), (2, 1, "unexpected \"}\"".to_string()));
    assert_eq!(parse_err("a { } }"), (1, 7, "unexpected \"}\"".to_string()));
}

#[test]
fn eof_after_directive_without_semicolon() {
    // nginx -t: `pid a` -> unexpected end of file, expecting ";" or "}".
    assert_eq!(parse_err("a b"), (1, 4, EOF_EXPECTING_SEMI.to_string()));
    assert_eq!(parse_err("a b\n"), (2, 1, EOF_EXPECTING_SEMI.to_string()));
    assert_eq!(parse_err("x { a"), (1, 6, EOF_EXPECTING_SEMI.to_string()));
}

#[test]
fn eof_inside_block() {
    // nginx -t: `http {` -> unexpected end of file, expecting "}".
    assert_eq!(
        parse_err("http {\n a;\n"),
        (3, 1, EOF_EXPECTING_BRACE.to_string())
    );
    assert_eq!(
        parse_err("a { b { } "),
        (1, 11, EOF_EXPECTING_BRACE.to_string())
    );
}

#[test]
fn unterminated_quoted_string() {
    // nginx -t says `unexpected end of file, expecting ";" or "}"` here; we
    // name the problem and point at the opening quote instead.
    let msg = "unterminated quoted string".to_string();
    assert_eq!(parse_err("a \"b\nc;"), (1, 3, msg.clone()));
    assert_eq!(parse_err("a\n  'b;"), (2, 3, msg.clone()));
    assert_eq!(parse_err("a \"b\\\""), (1, 3, msg));
}

#[test]
fn character_right_after_closing_quote() {
    // nginx -t: `"1"x;` -> unexpected "x"; `"1"}` -> unexpected "}";
    // `"1"#c` -> unexpected "#".
    assert_eq!(
        parse_err(r#"a "b"c;"#),
        (1, 6, "unexpected \"c\"".to_string())
    );
    assert_eq!(
        parse_err("a 'b''c';"),
        (1, 6, "unexpected \"'\"".to_string())
    );
    assert_eq!(
        parse_err(r#"x { a "b"}"#),
        (1, 10, "unexpected \"}\"".to_string())
    );
    assert_eq!(
        parse_err("a \"b\"#c\n;"),
        (1, 6, "unexpected \"#\"".to_string())
    );
}

#[test]
fn eof_right_after_closing_quote() {
    // nginx -t: `worker_processes "1")` -> unexpected end of file.
    assert_eq!(
        parse_err(r#"a "b""#),
        (1, 6, EOF_EXPECTING_SEMI.to_string())
    );
    assert_eq!(
        parse_err(r#"a "b")"#),
        (1, 7, EOF_EXPECTING_SEMI.to_string())
    );
}

#[test]
fn token_length_limit() {
    let max = "a".repeat(MAX_TOKEN_LEN);
    let d = ok(&format!("x {max};"));
    assert_eq!(d[0].args[0].value.len(), MAX_TOKEN_LEN);
    let d = ok(&format!("x \"{max}\";"));
    assert_eq!(d[0].args[0].value.len(), MAX_TOKEN_LEN);

    let long = "a".repeat(MAX_TOKEN_LEN + 1);
    assert_eq!(
        parse_err(&format!("x\n {long};")),
        (
            2,
            2,
            "too long parameter \"aaaaaaaaaa...\" started".to_string()
        )
    );
    assert_eq!(
        parse_err(&format!("x \"{long}")),
        (
            1,
            3,
            "too long parameter, probably missing terminating \"\"\" character".to_string()
        )
    );
    assert_eq!(
        parse_err(&format!("x '{long}'")),
        (
            1,
            3,
            "too long parameter, probably missing terminating \"'\" character".to_string()
        )
    );
}

#[test]
fn block_nesting_limit() {
    let nested = |n: usize| format!("{}{}", "a{".repeat(n), "}".repeat(n));
    let mut level = ok(&nested(MAX_BLOCK_DEPTH)).remove(0);
    for _ in 1..MAX_BLOCK_DEPTH {
        level = block(&level)[0].clone();
    }
    assert!(block(&level).is_empty());

    let message = format!("blocks nested deeper than {MAX_BLOCK_DEPTH} levels");
    let col = 2 * MAX_BLOCK_DEPTH as u32 + 1;
    assert_eq!(
        parse_err(&nested(MAX_BLOCK_DEPTH + 1)),
        (1, col, message.clone())
    );
    // Far deeper input is still an error, not a stack overflow.
    assert_eq!(parse_err(&"a{".repeat(200_000)), (1, col, message));
    assert_eq!(parse_err(&"{".repeat(200_000)).2, "unexpected \"{\"");
}

#[test]
fn include_argument_errors() {
    // nginx -t: invalid number of arguments in "include" directive;
    // directive "include" is not terminated by ";".
    let count = "invalid number of arguments in \"include\" directive".to_string();
    assert_eq!(parse_err("include;"), (1, 1, count.clone()));
    assert_eq!(parse_err("http {\n include a b;\n}"), (2, 2, count));
    assert_eq!(
        parse_err("include a { }"),
        (
            1,
            1,
            "directive \"include\" is not terminated by \";\"".to_string()
        )
    );
}

#[test]
fn invalid_utf8_is_a_parse_error_with_position() {
    let dir = TempDir::new();
    let path = dir.write("nginx.conf", b"a 1;\nb \xff;\n");
    match parse_file(&path) {
        Err(SyntaxError::Parse { span, message }) => {
            assert_eq!((span.line, span.col), (2, 3));
            assert_eq!(span.file.as_path(), path.as_path());
            assert_eq!(message, "invalid UTF-8 byte sequence");
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn missing_main_file_is_io_error_without_span() {
    let dir = TempDir::new();
    let path = dir.path().join("absent.conf");
    match parse_file(&path) {
        Err(err @ SyntaxError::Io { .. }) => {
            assert!(err.span().is_none());
            assert!(err.to_string().starts_with("cannot read \""), "{err}");
            let SyntaxError::Io {
                path: p, source, ..
            } = err
            else {
                unreachable!()
            };
            assert_eq!(p, path);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

#[test]
fn error_display_includes_span() {
    let err = parse(";").expect_err("must fail");
    assert_eq!(err.to_string(), "test.conf:1:1: unexpected \";\"");
    assert_eq!(err.span().map(pos), Some((1, 1)));
}

// ----------------------------------------------------------------- includes

#[test]
fn include_resolves_against_prefix_not_including_file() {
    let dir = TempDir::new();
    dir.write("nginx.conf", "a;\ninclude sub/inc.conf;\nz;\n");
    // Relative to the prefix (the main file's directory), like nginx.
    dir.write("sub/inc.conf", "b;\ninclude other.conf;\n");
    dir.write("other.conf", "from_prefix;\n");
    dir.write("sub/other.conf", "from_sub;\n");
    let d = parse_in(&dir, "nginx.conf").expect("parse");
    let names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "from_prefix", "z"]);
    assert_eq!(d[1].span.file.as_path(), dir.path().join("sub/inc.conf"));
    assert_eq!(pos(&d[1].span), (1, 1));
    assert_eq!(pos(&d[3].span), (3, 1));
}

#[test]
fn include_glob_is_sorted_and_skips_hidden_files() {
    let dir = TempDir::new();
    dir.write("nginx.conf", "http {\n  include conf.d/*.conf;\n}\n");
    dir.write("conf.d/b.conf", "b;");
    dir.write("conf.d/a.conf", "a;");
    dir.write("conf.d/c.conf", "c 1;\nc 2;");
    dir.write("conf.d/.hidden.conf", "hidden;");
    dir.write("conf.d/skip.txt", "skip;");
    dir.write("conf.d/deeper/d.conf", "deeper;");
    let d = parse_in(&dir, "nginx.conf").expect("parse");
    let http = block(&d[0]);
    let names: Vec<&str> = http.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "c"]);
    assert_eq!(values(&http[3]), ["2"]);
    assert_eq!(
        http[3].span.file.as_path(),
        dir.path().join("conf.d/c.conf")
    );
    assert_eq!(pos(&http[3].span), (2, 1));
}

#[test]
fn include_glob_with_no_match_is_fine() {
    // nginx -t: `include nomatch/*.conf;` is accepted.
    let dir = TempDir::new();
    dir.write(
        "nginx.conf",
        "a;\ninclude nomatch/*.conf;\ninclude x?.conf;\nb;",
    );
    let d = parse_in(&dir, "nginx.conf").expect("parse");
    assert_eq!(d.len(), 2);
}

#[test]
fn include_of_missing_plain_file_is_io_error_at_include() {
    // nginx -t: open() ".../missing.conf" failed (2: No such file or directory).
    let dir = TempDir::new();
    dir.write("nginx.conf", "a;\nhttp {\n    include missing.conf;\n}\n");
    match parse_in(&dir, "nginx.conf") {
        Err(err @ SyntaxError::Io { .. }) => {
            let span = err.span().cloned().expect("include span");
            assert_eq!(pos(&span), (3, 5));
            assert_eq!(span.file.as_path(), dir.path().join("nginx.conf"));
            assert!(err.to_string().starts_with(&format!("{span}: cannot read")));
            let SyntaxError::Io { path, .. } = err else {
                unreachable!()
            };
            assert_eq!(path, dir.path().join("missing.conf"));
        }
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

#[test]
fn include_cycle_is_detected() {
    let dir = TempDir::new();
    dir.write("nginx.conf", "include a.conf;\n");
    dir.write("a.conf", "a;\ninclude b.conf;\n");
    dir.write("b.conf", "b;\n  include a.conf;\n");
    match parse_in(&dir, "nginx.conf") {
        Err(SyntaxError::IncludeDepth { span, path }) => {
            assert_eq!(span.file.as_path(), dir.path().join("b.conf"));
            assert_eq!(pos(&span), (2, 3));
            assert_eq!(path, dir.path().join("a.conf"));
        }
        other => panic!("expected IncludeDepth, got {other:?}"),
    }

    dir.write("self.conf", "include self.conf;\n");
    match parse_in(&dir, "self.conf") {
        Err(err @ SyntaxError::IncludeDepth { .. }) => {
            let shown = err.to_string();
            assert!(
                shown.starts_with(&format!(
                    "{}:1:1: include of",
                    dir.path().join("self.conf").display()
                )),
                "{shown}"
            );
        }
        other => panic!("expected IncludeDepth, got {other:?}"),
    }
}

#[test]
fn include_depth_limit() {
    let dir = TempDir::new();
    for i in 1..=MAX_INCLUDE_DEPTH + 1 {
        dir.write(
            &format!("f{i}.conf"),
            format!("level{i};\ninclude f{}.conf;\n", i + 1),
        );
    }
    // f(MAX+1) would be the 33rd nested include; ending the chain at
    // f(MAX) by making it a leaf must parse.
    dir.write("ok.conf", "include f1.conf;");
    dir.write(&format!("f{MAX_INCLUDE_DEPTH}.conf"), "leaf;\n");
    let d = parse_in(&dir, "ok.conf").expect("32 levels are allowed");
    assert_eq!(d.len(), MAX_INCLUDE_DEPTH);
    assert_eq!(
        d[MAX_INCLUDE_DEPTH - 2].name,
        format!("level{}", MAX_INCLUDE_DEPTH - 1)
    );
    assert_eq!(d[MAX_INCLUDE_DEPTH - 1].name, "leaf");

    dir.write(
        &format!("f{MAX_INCLUDE_DEPTH}.conf"),
        format!("include f{}.conf;\n", MAX_INCLUDE_DEPTH + 1),
    );
    match parse_in(&dir, "ok.conf") {
        Err(SyntaxError::IncludeDepth { span, path }) => {
            assert_eq!(
                span.file.as_path(),
                dir.path().join(format!("f{MAX_INCLUDE_DEPTH}.conf"))
            );
            assert_eq!(
                path,
                dir.path().join(format!("f{}.conf", MAX_INCLUDE_DEPTH + 1))
            );
        }
        other => panic!("expected IncludeDepth, got {other:?}"),
    }
}

#[test]
fn include_inside_block_is_spliced_in_place() {
    let dir = TempDir::new();
    dir.write(
        "nginx.conf",
        "http {\n  a;\n  include mime.types;\n  server { include \"snippets/loc.conf\"; }\n  z;\n}\n",
    );
    dir.write("mime.types", "types {\n  text/html html htm;\n}\n");
    dir.write("snippets/loc.conf", "\n\n   location / { return 200; }\n");
    let d = parse_in(&dir, "nginx.conf").expect("parse");
    let http = block(&d[0]);
    let names: Vec<&str> = http.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["a", "types", "server", "z"]);
    let types = block(&http[1]);
    assert_eq!(types[0].name, "text/html");
    assert_eq!(values(&types[0]), ["html", "htm"]);
    assert_eq!(pos(&types[0].span), (2, 3));
    assert_eq!(types[0].span.file.as_path(), dir.path().join("mime.types"));
    let location = &block(&http[2])[0];
    assert_eq!(location.name, "location");
    assert_eq!(pos(&location.span), (3, 4));
    assert_eq!(
        location.span.file.as_path(),
        dir.path().join("snippets/loc.conf")
    );
    assert_eq!(pos(&http[3].span), (5, 3));
}

#[test]
fn included_file_must_be_balanced_on_its_own() {
    let dir = TempDir::new();
    dir.write("nginx.conf", "http {\n  include close.conf;\n");
    dir.write("close.conf", "a;\n}\n");
    match parse_in(&dir, "nginx.conf") {
        Err(SyntaxError::Parse { span, message }) => {
            assert_eq!(span.file.as_path(), dir.path().join("close.conf"));
            assert_eq!((pos(&span), message.as_str()), ((2, 1), "unexpected \"}\""));
        }
        other => panic!("expected a parse error, got {other:?}"),
    }

    dir.write("nginx.conf", "include open.conf;\n}\n");
    dir.write("open.conf", "http {\n");
    match parse_in(&dir, "nginx.conf") {
        Err(SyntaxError::Parse { span, message }) => {
            assert_eq!(span.file.as_path(), dir.path().join("open.conf"));
            assert_eq!(
                (pos(&span), message.as_str()),
                ((2, 1), EOF_EXPECTING_BRACE)
            );
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn block_nesting_limit_counts_across_includes() {
    let dir = TempDir::new();
    let depth = MAX_BLOCK_DEPTH - 1;
    dir.write(
        "nginx.conf",
        format!(
            "{}include inner.conf;{}",
            "a{".repeat(depth),
            "}".repeat(depth)
        ),
    );
    dir.write("inner.conf", "b { c; }");
    parse_in(&dir, "nginx.conf").expect("64 levels are allowed");
    dir.write("inner.conf", "b { c { } }");
    match parse_in(&dir, "nginx.conf") {
        Err(SyntaxError::Parse { span, message }) => {
            assert_eq!(span.file.as_path(), dir.path().join("inner.conf"));
            assert_eq!(pos(&span), (1, 5));
            assert!(message.starts_with("blocks nested deeper"), "{message}");
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn include_absolute_path_and_parse_str_prefix() {
    let dir = TempDir::new();
    let abs = dir.write("abs/x.conf", "x;");
    dir.write("rel.conf", "rel;");
    dir.write("g/1.conf", "g1;");
    let src = format!(
        "include {};\ninclude rel.conf;\ninclude '{}/g/*.conf';\n",
        abs.display(),
        dir.path().display()
    );
    let d = parse_str(&src, Path::new("virtual.conf"), dir.path()).expect("parse");
    let names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["x", "rel", "g1"]);
    assert_eq!(d[0].span.file.as_path(), abs.as_path());
}

#[test]
fn glob_metacharacters_in_prefix_are_literal() {
    let dir = TempDir::new();
    dir.write("we[ir]d/nginx.conf", "include conf.d/*.conf;");
    dir.write("we[ir]d/conf.d/a.conf", "a;");
    let d = parse_in(&dir, "we[ir]d/nginx.conf").expect("parse");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].name, "a");
}

#[test]
fn invalid_glob_pattern_is_a_parse_error() {
    let (line, col, message) = parse_err("x;\ninclude conf.d/[*.conf;");
    assert_eq!((line, col), (2, 1));
    assert!(message.starts_with("invalid include pattern"), "{message}");
}

// ------------------------------------------------------- randomized checks

/// xorshift64*: a small deterministic generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

#[test]
fn random_input_never_panics() {
    let alphabet = [
        'a', 'b', 'i', '$', '{', '}', ';', '"', '\'', '\\', '#', ' ', '\n', '\t', '\r', ')', 'é',
        'n', 't',
    ];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut oks, mut errs) = (0, 0);
    for _ in 0..5_000 {
        let len = rng.below(120);
        let src: String = (0..len).map(|_| rng.pick(&alphabet)).collect();
        match parse(&src) {
            Ok(_) => oks += 1,
            Err(err) => {
                let span = err.span().expect("parse errors have spans");
                let lines = src.matches('\n').count() as u32 + 1;
                assert!(span.line >= 1 && span.line <= lines, "{src:?}: {err}");
                errs += 1;
            }
        }
    }
    assert!(oks > 0 && errs > 0, "generator covers both outcomes");
}

#[derive(Debug, PartialEq)]
struct Shape {
    name: String,
    args: Vec<(String, bool)>,
    block: Option<Vec<Shape>>,
}

fn shape(directives: &[Directive]) -> Vec<Shape> {
    directives
        .iter()
        .map(|d| Shape {
            name: d.name.clone(),
            args: d.args.iter().map(|a| (a.value.clone(), a.quoted)).collect(),
            block: d.block.as_deref().map(shape),
        })
        .collect()
}

fn gen_shapes(rng: &mut Rng, depth: usize) -> Vec<Shape> {
    let quoted_chars = [
        'a', 'Z', ' ', '\t', '\n', '\r', ';', '{', '}', '#', '$', '"', '\'', '\\', 'é', '(', ')',
        'n', 't',
    ];
    let word_chars = ['a', 'b', '/', '.', '_', '#', '}', '$', '-', ':', '"', '\''];
    let names = ["a", "server", "location", "proxy_pass", "x_y"];
    (0..rng.below(4))
        .map(|_| {
            let args = (0..rng.below(4))
                .map(|_| {
                    if rng.below(2) == 0 {
                        let s = (0..rng.below(8)).map(|_| rng.pick(&quoted_chars)).collect();
                        (s, true)
                    } else {
                        let mut s = String::from(rng.pick(&['a', '/', '_']));
                        s.extend((0..rng.below(6)).map(|_| rng.pick(&word_chars)));
                        (s, false)
                    }
                })
                .collect();
            let block = (depth < 3 && rng.below(3) == 0).then(|| gen_shapes(rng, depth + 1));
            Shape {
                name: rng.pick(&names).to_string(),
                args,
                block,
            }
        })
        .collect()
}

fn render(rng: &mut Rng, shapes: &[Shape], out: &mut String) {
    let gaps = [" ", "\t", "\n", " # note ; { }\n "];
    for s in shapes {
        out.push_str(&s.name);
        for (value, quoted) in &s.args {
            out.push_str(rng.pick(&gaps));
            if !quoted {
                out.push_str(value);
                continue;
            }
            let q = rng.pick(&['"', '\'']);
            out.push(q);
            for ch in value.chars() {
                match ch {
                    '\\' => out.push_str("\\\\"),
                    c if c == q => {
                        out.push('\\');
                        out.push(c);
                    }
                    '\t' | '\n' | '\r' if rng.below(2) == 0 => {
                        out.push_str(match ch {
                            '\t' => "\\t",
                            '\n' => "\\n",
                            _ => "\\r",
                        });
                    }
                    c => out.push(c),
                }
            }
            out.push(q);
        }
        match &s.block {
            Some(inner) => {
                // A word ending in `$` would swallow an adjacent `{`.
                let last_is_word = s.args.last().is_some_and(|(_, quoted)| !quoted);
                out.push_str(if last_is_word {
                    " {"
                } else {
                    rng.pick(&["{", " {\n"])
                });
                render(rng, inner, out);
                out.push_str("}\n");
            }
            None => out.push_str(rng.pick(&[";", " ;\n", ";\n# c\n"])),
        }
    }
}

#[test]
fn random_trees_round_trip() {
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    for _ in 0..2_000 {
        let shapes = gen_shapes(&mut rng, 0);
        let mut src = String::new();
        render(&mut rng, &shapes, &mut src);
        match parse(&src) {
            Ok(d) => assert_eq!(shape(&d), shapes, "source: {src:?}"),
            Err(err) => panic!("{err} for source {src:?}"),
        }
    }
}
