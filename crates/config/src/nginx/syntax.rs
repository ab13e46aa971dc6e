//! Tokenizer and parser for nginx's configuration file grammar.
//!
//! This is a port of the state machine in nginx's `ngx_conf_read_token`
//! (`src/core/ngx_conf_file.c`) plus the block handling of `ngx_conf_parse`
//! and the expansion of `include` from `ngx_conf_include`. It knows nothing
//! about individual directives except `include`; checking what a directive
//! means, how many arguments it takes or whether it needs a block is left to
//! the caller. Behaviour was checked against `nginx -t` (nginx 1.22.1):
//!
//! * Space, tab, CR and LF separate tokens. `#` starts a comment only at the
//!   start of a token (`a#b` is the single word `a#b`); a comment may sit
//!   between the arguments of a directive.
//! * `;` ends a directive and `{` opens a block, also directly after a word
//!   (`location /x{`). `}` closes a block; `}` inside a word does not
//!   (`a}` is a word), and `{` only opens a block when it is not quoted and
//!   not directly after `$` (so `${var}` stays one word). A `{` in an
//!   unquoted regex such as `^/a{1,3}$` therefore ends the word and opens a
//!   block, exactly as in nginx; real configs quote such regexes.
//! * A token starting with `"` or `'` is a quoted string and may span lines.
//!   After its closing quote the next character must be whitespace, `;`, `{`
//!   or `)`; anything else is `unexpected "x"`. A `)` right after a quote
//!   starts a new word (nginx's `if ($a = "b")` support), so `"b")x` yields
//!   the words `b` and `)x`. A quote inside a word is an ordinary character.
//! * A backslash, quoted or not, stops the next character from ending the
//!   token. The token is then unescaped as nginx does: `\"`, `\'` and `\\`
//!   become the character, `\t`, `\r` and `\n` become TAB, CR and LF, and
//!   any other `\x` is kept as the two characters (so unquoted `a\;b` is the
//!   word `a\;b` and `a\ b` is the word `a\ b`).
//! * Errors use nginx's messages (`unexpected ";"`, `unexpected "}"`,
//!   `unexpected end of file, expecting ";" or "}"`,
//!   `unexpected end of file, expecting "}"`,
//!   `directive "include" is not terminated by ";"`,
//!   `invalid number of arguments in "include" directive`). One deliberate
//!   difference: a quoted string still open at end of file is reported as
//!   `unterminated quoted string` at its opening quote, where nginx says
//!   `unexpected end of file, expecting ";" or "}"`.
//!
//! Limits (nginx has other or no limits here): a token longer than 64 KiB
//! (nginx: 4 KiB), block nesting deeper than 64 and `include` nesting deeper
//! than 32 levels or an include cycle are errors, never a panic or a stack
//! overflow. Files must be UTF-8 (nginx takes any bytes); invalid UTF-8 is a
//! parse error at the first bad byte. A byte order mark is not skipped (nginx
//! does not skip it either). Columns count characters, starting at 1.
//!
//! `include` resolves relative patterns against the *prefix* directory, as
//! nginx resolves them against its configuration prefix (the directory of
//! the `-c` file), not against the directory of the including file. A pattern
//! containing `*`, `?` or `[` is expanded in sorted path order, where `*` and
//! `?` match neither `/` nor a leading `.` (as glob(3) does), and may match
//! nothing; any other pattern must name a readable file.
//!
//! An `include` of a file named `mime.types` that does not exist takes
//! nginx's own copy, built in (so a conf written for /etc/nginx loads from
//! anywhere).
//!
//! Files are read with [`crate::read::read_regular_file`]: regular
//! files only (an `include` of a device, FIFO, socket or directory is an
//! error at the `include`), at most 16 MiB each. [`parse_str_with`] takes
//! the included files from memory instead ([`Includes::Memory`]), so that
//! text from anywhere (a fuzzer) can be parsed without touching the disk.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Longest accepted token, in bytes.
const MAX_TOKEN_LEN: usize = 64 * 1024;
/// nginx 1.22's `mime.types` (Debian's copy), included where an
/// `include mime.types` names a file that does not exist.
const MIME_TYPES: &str = include_str!("mime.types");
/// Deepest accepted nesting of blocks (across included files).
const MAX_BLOCK_DEPTH: usize = 64;
/// Deepest accepted nesting of `include` directives.
const MAX_INCLUDE_DEPTH: usize = 32;

/// Where the files named by `include` come from.
#[derive(Clone, Copy, Debug)]
pub enum Includes<'a> {
    /// The file system (regular files only; see the module doc).
    Disk,
    /// Only these files, keyed by path as `include` names them (a relative
    /// pattern joined to the prefix; `.` components do not count). A
    /// wildcard pattern matches these paths. The disk is never touched.
    Memory(&'a BTreeMap<PathBuf, String>),
}

/// Where something is in a config file (1-based line and column, column counts chars).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    /// The file, as it was named to the parser or resolved by `include`.
    pub file: Arc<PathBuf>,
    /// Line number, starting at 1.
    pub line: u32,
    /// Column in characters, starting at 1.
    pub col: u32,
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.col)
    }
}

/// One argument (a word or quoted string) after unescaping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arg {
    /// The unescaped text, without surrounding quotes.
    pub value: String,
    /// Whether the token was a quoted string (started with `"` or `'`).
    pub quoted: bool,
    /// Where the token starts (its opening quote, if quoted).
    pub span: Span,
}

/// One directive: `name arg...;` or `name arg... { ... }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directive {
    /// The directive name (its first token, unescaped).
    pub name: String,
    /// The arguments after the name.
    pub args: Vec<Arg>,
    /// The directives of its block, if it has one.
    pub block: Option<Vec<Directive>>,
    /// Where the name starts.
    pub span: Span,
}

/// An error reading or parsing a configuration.
#[derive(Debug, thiserror::Error)]
pub enum SyntaxError {
    /// I/O error reading a file; `span` is the `include` directive for
    /// included files and `None` for the main file.
    #[error("{}cannot read \"{}\": {source}", span_prefix(.span), .path.display())]
    Io {
        /// The file that could not be read.
        path: PathBuf,
        /// The `include` directive that named it, if any.
        span: Option<Span>,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A grammar error, with nginx's message where nginx has one.
    #[error("{span}: {message}")]
    Parse {
        /// Where the error was found.
        span: Span,
        /// What is wrong, e.g. `unexpected "}"`.
        message: String,
    },
    /// `include` nested deeper than 32 levels, or an include cycle.
    #[error(
        "{span}: include of \"{}\" nests deeper than {MAX_INCLUDE_DEPTH} levels or is recursive",
        .path.display()
    )]
    IncludeDepth {
        /// The `include` directive.
        span: Span,
        /// The file it would have included.
        path: PathBuf,
    },
}

impl SyntaxError {
    /// Where the error is, if it has a position.
    pub fn span(&self) -> Option<&Span> {
        match self {
            SyntaxError::Io { span, .. } => span.as_ref(),
            SyntaxError::Parse { span, .. } | SyntaxError::IncludeDepth { span, .. } => Some(span),
        }
    }
}

fn span_prefix(span: &Option<Span>) -> String {
    span.as_ref().map(|s| format!("{s}: ")).unwrap_or_default()
}

fn parse_error(span: Span, message: impl Into<String>) -> SyntaxError {
    SyntaxError::Parse {
        span,
        message: message.into(),
    }
}

/// Parse a file and expand `include` directives (in any block) in place.
///
/// Relative include patterns resolve against the directory containing
/// `path`, like nginx's configuration prefix when started with `-c path`.
pub fn parse_file(path: &Path) -> Result<Vec<Directive>, SyntaxError> {
    let prefix = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."));
    let src = read_source(path, None)?;
    parse_str(&src, path, prefix)
}

/// Parse text that claims to come from `file`; includes are resolved against
/// `prefix` (a directory) and read from disk.
pub fn parse_str(src: &str, file: &Path, prefix: &Path) -> Result<Vec<Directive>, SyntaxError> {
    parse_str_with(src, file, prefix, Includes::Disk)
}

/// [`parse_str`] with the included files taken from `includes`.
pub fn parse_str_with(
    src: &str,
    file: &Path,
    prefix: &Path,
    includes: Includes<'_>,
) -> Result<Vec<Directive>, SyntaxError> {
    let prefix = if prefix.as_os_str().is_empty() {
        Path::new(".")
    } else {
        prefix
    };
    let mut parser = Parser {
        prefix,
        includes,
        include_stack: vec![identity(includes, file)],
    };
    parser.parse_source(src, Arc::new(file.to_path_buf()), 0)
}

/// Reads a file as UTF-8; `span` is the including directive, if any.
fn read_source(path: &Path, span: Option<&Span>) -> Result<String, SyntaxError> {
    let bytes = crate::read::read_regular_file(path).map_err(|source| SyntaxError::Io {
        path: path.to_path_buf(),
        span: span.cloned(),
        source,
    })?;
    utf8_source(bytes, path)
}

/// The text of `bytes`, or a parse error at the first byte that is not UTF-8.
fn utf8_source(bytes: Vec<u8>, path: &Path) -> Result<String, SyntaxError> {
    String::from_utf8(bytes).map_err(|err| {
        let valid = &err.as_bytes()[..err.utf8_error().valid_up_to()];
        // The prefix is valid UTF-8 by construction; lossy never replaces here.
        let (line, col) = end_position(&String::from_utf8_lossy(valid));
        let span = Span {
            file: Arc::new(path.to_path_buf()),
            line,
            col,
        };
        parse_error(span, "invalid UTF-8 byte sequence")
    })
}

/// The position just after `text`.
fn end_position(text: &str) -> (u32, u32) {
    let mut pos = (1u32, 1u32);
    for ch in text.chars() {
        pos = advance(pos, ch);
    }
    pos
}

fn advance((line, col): (u32, u32), ch: char) -> (u32, u32) {
    if ch == '\n' {
        (line.saturating_add(1), 1)
    } else {
        (line, col.saturating_add(1))
    }
}

/// A key identifying a file for include cycle detection.
fn identity(includes: Includes<'_>, path: &Path) -> PathBuf {
    match includes {
        Includes::Disk => fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        Includes::Memory(_) => lexical(path),
    }
}

/// `path` without `.` components (`./a//b.conf` → `a/b.conf`).
fn lexical(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect()
}

/// What one call of [`Lexer::next_statement`] found.
enum Statement {
    /// Words (name first, never empty) ended by `;` or, if `opens_block`, `{`.
    Directive { words: Vec<Arg>, opens_block: bool },
    /// A `}` with no words before it.
    BlockEnd { at: Span },
    /// End of input with no words pending.
    Eof { at: Span },
}

/// The tokenizer: a port of `ngx_conf_read_token`.
struct Lexer<'a> {
    chars: std::str::Chars<'a>,
    file: Arc<PathBuf>,
    pos: (u32, u32),
}

fn is_space(ch: char) -> bool {
    matches!(ch, ' ' | '\t' | '\r' | '\n')
}

impl<'a> Lexer<'a> {
    fn new(src: &'a str, file: Arc<PathBuf>) -> Self {
        Lexer {
            chars: src.chars(),
            file,
            pos: (1, 1),
        }
    }

    fn span(&self, (line, col): (u32, u32)) -> Span {
        Span {
            file: Arc::clone(&self.file),
            line,
            col,
        }
    }

    fn bump(&mut self) -> Option<char> {
        let ch = self.chars.next()?;
        self.pos = advance(self.pos, ch);
        Some(ch)
    }

    /// Reads the words of one directive up to its `;` or `{`, or a lone `}`,
    /// or the end of input. The flags mirror nginx's local variables.
    fn next_statement(&mut self) -> Result<Statement, SyntaxError> {
        let mut words: Vec<Arg> = Vec::new();
        let mut token = Token::default();
        let mut need_space = false; // just closed a quoted string
        let mut last_space = true; // between tokens
        let mut comment = false;
        let mut variable = false; // previous char was `$`
        let mut escaped = false; // previous char was `\`

        loop {
            let here = self.pos;
            let Some(ch) = self.bump() else {
                if words.is_empty() && last_space {
                    return Ok(Statement::Eof {
                        at: self.span(here),
                    });
                }
                if token.quote.is_some() {
                    return Err(parse_error(
                        self.span(token.start),
                        "unterminated quoted string",
                    ));
                }
                return Err(parse_error(
                    self.span(here),
                    "unexpected end of file, expecting \";\" or \"}\"",
                ));
            };

            if ch == '\n' {
                comment = false;
            }
            if comment {
                continue;
            }
            if escaped {
                escaped = false;
                self.push(&mut token, ch)?;
                continue;
            }

            if need_space {
                match ch {
                    c if is_space(c) => {
                        last_space = true;
                        need_space = false;
                        continue;
                    }
                    ';' | '{' => {
                        return Ok(Statement::Directive {
                            words,
                            opens_block: ch == '{',
                        })
                    }
                    // Falls through and starts a new word with `)`.
                    ')' => {
                        last_space = true;
                        need_space = false;
                    }
                    _ => return Err(parse_error(self.span(here), format!("unexpected \"{ch}\""))),
                }
            }

            if last_space {
                if is_space(ch) {
                    continue;
                }
                token = Token {
                    start: here,
                    ..Token::default()
                };
                last_space = false;
                match ch {
                    ';' | '{' => {
                        if words.is_empty() {
                            let message = format!("unexpected \"{ch}\"");
                            return Err(parse_error(self.span(here), message));
                        }
                        return Ok(Statement::Directive {
                            words,
                            opens_block: ch == '{',
                        });
                    }
                    '}' => {
                        if !words.is_empty() {
                            return Err(parse_error(self.span(here), "unexpected \"}\""));
                        }
                        return Ok(Statement::BlockEnd {
                            at: self.span(here),
                        });
                    }
                    '#' => {
                        comment = true;
                        last_space = true;
                    }
                    '"' | '\'' => token.quote = Some(ch),
                    _ => {
                        escaped = ch == '\\';
                        variable = ch == '$';
                        self.push(&mut token, ch)?;
                    }
                }
                continue;
            }

            // Inside a word or a quoted string.
            if ch == '{' && variable {
                self.push(&mut token, ch)?;
                continue;
            }
            variable = false;
            if ch == '\\' || ch == '$' {
                escaped = ch == '\\';
                variable = ch == '$';
                self.push(&mut token, ch)?;
                continue;
            }
            let ends = match token.quote {
                Some(q) => ch == q,
                None => is_space(ch) || ch == ';' || ch == '{',
            };
            if !ends {
                self.push(&mut token, ch)?;
                continue;
            }
            if token.quote.is_some() {
                need_space = true;
            } else {
                last_space = true;
            }
            let token = std::mem::take(&mut token);
            words.push(Arg {
                value: unescape(&token.raw),
                quoted: token.quote.is_some(),
                span: self.span(token.start),
            });
            if ch == ';' || ch == '{' {
                return Ok(Statement::Directive {
                    words,
                    opens_block: ch == '{',
                });
            }
        }
    }

    /// Appends a character to the token, enforcing the length limit.
    fn push(&self, token: &mut Token, ch: char) -> Result<(), SyntaxError> {
        if token.raw.len() + ch.len_utf8() > MAX_TOKEN_LEN {
            let message = match token.quote {
                Some(q) => {
                    format!("too long parameter, probably missing terminating \"{q}\" character")
                }
                None => {
                    let head: String = token.raw.chars().take(10).collect();
                    format!("too long parameter \"{head}...\" started")
                }
            };
            return Err(parse_error(self.span(token.start), message));
        }
        token.raw.push(ch);
        Ok(())
    }
}

/// A token being read: its raw text (without quotes), opening quote and start.
#[derive(Default)]
struct Token {
    raw: String,
    quote: Option<char>,
    start: (u32, u32),
}

/// nginx's unescaping of a finished token.
fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch == '\\' {
            let mapped = match chars.peek() {
                Some(&c @ ('"' | '\'' | '\\')) => Some(c),
                Some('t') => Some('\t'),
                Some('r') => Some('\r'),
                Some('n') => Some('\n'),
                _ => None,
            };
            if let Some(mapped) = mapped {
                chars.next();
                out.push(mapped);
                continue;
            }
        }
        out.push(ch);
    }
    out
}

/// Builds the directive tree and expands includes.
struct Parser<'p> {
    prefix: &'p Path,
    includes: Includes<'p>,
    /// Identities of the files being parsed, outermost first.
    include_stack: Vec<PathBuf>,
}

impl Parser<'_> {
    fn parse_source(
        &mut self,
        src: &str,
        file: Arc<PathBuf>,
        depth: usize,
    ) -> Result<Vec<Directive>, SyntaxError> {
        let mut lexer = Lexer::new(src, file);
        self.parse_block(&mut lexer, depth, false)
    }

    /// Parses directives until the end of input (`in_block == false`) or the
    /// `}` closing the current block. `depth` is the number of open blocks.
    fn parse_block(
        &mut self,
        lexer: &mut Lexer<'_>,
        depth: usize,
        in_block: bool,
    ) -> Result<Vec<Directive>, SyntaxError> {
        let mut out = Vec::new();
        loop {
            let (words, opens_block) = match lexer.next_statement()? {
                Statement::Eof { at } if in_block => {
                    return Err(parse_error(at, "unexpected end of file, expecting \"}\""))
                }
                Statement::Eof { .. } => return Ok(out),
                Statement::BlockEnd { .. } if in_block => return Ok(out),
                Statement::BlockEnd { at } => return Err(parse_error(at, "unexpected \"}\"")),
                Statement::Directive { words, opens_block } => (words, opens_block),
            };
            let mut words = words.into_iter();
            let Some(name) = words.next() else {
                continue;
            };
            let args: Vec<Arg> = words.collect();

            if name.value == "include" {
                if opens_block {
                    let message = "directive \"include\" is not terminated by \";\"";
                    return Err(parse_error(name.span, message));
                }
                let [pattern] = args.as_slice() else {
                    let message = "invalid number of arguments in \"include\" directive";
                    return Err(parse_error(name.span, message));
                };
                out.extend(self.include(&pattern.value, &name.span, depth)?);
                continue;
            }

            let block = if opens_block {
                if depth >= MAX_BLOCK_DEPTH {
                    let message = format!("blocks nested deeper than {MAX_BLOCK_DEPTH} levels");
                    return Err(parse_error(name.span, message));
                }
                Some(self.parse_block(lexer, depth + 1, true)?)
            } else {
                None
            };
            out.push(Directive {
                name: name.value,
                args,
                block,
                span: name.span,
            });
        }
    }

    /// Expands `include pattern;` found at `span` inside `depth` open blocks.
    fn include(
        &mut self,
        pattern: &str,
        span: &Span,
        depth: usize,
    ) -> Result<Vec<Directive>, SyntaxError> {
        let files = if pattern.contains(['*', '?', '[']) {
            self.expand_glob(pattern, span)?
        } else {
            vec![self.prefix.join(pattern)]
        };
        let mut out = Vec::new();
        for path in files {
            out.extend(self.include_file(path, span, depth)?);
        }
        Ok(out)
    }

    /// Files matching a wildcard include pattern, sorted by path.
    fn expand_glob(&self, pattern: &str, span: &Span) -> Result<Vec<PathBuf>, SyntaxError> {
        let full = if Path::new(pattern).is_absolute() {
            pattern.to_string()
        } else {
            let Some(prefix) = self.prefix.to_str() else {
                let message = format!(
                    "cannot expand include pattern \"{pattern}\": prefix \"{}\" is not UTF-8",
                    self.prefix.display()
                );
                return Err(parse_error(span.clone(), message));
            };
            format!("{}/{pattern}", glob::Pattern::escape(prefix))
        };
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: true,
        };
        let invalid = |err: glob::PatternError| {
            let message = format!("invalid include pattern \"{pattern}\": {err}");
            parse_error(span.clone(), message)
        };
        if let Includes::Memory(files) = self.includes {
            // The keys are lexical paths: match them with a lexical pattern.
            let lexical_full = lexical(Path::new(&full));
            let glob =
                glob::Pattern::new(lexical_full.to_str().unwrap_or(&full)).map_err(invalid)?;
            return Ok(files
                .keys()
                .filter(|p| glob.matches_path_with(p, options))
                .cloned()
                .collect());
        }
        let entries = glob::glob_with(&full, options).map_err(invalid)?;
        let mut files = Vec::new();
        for entry in entries {
            files.push(entry.map_err(|err| SyntaxError::Io {
                path: err.path().to_path_buf(),
                span: Some(span.clone()),
                source: err.into(),
            })?);
        }
        files.sort();
        Ok(files)
    }

    fn include_file(
        &mut self,
        path: PathBuf,
        span: &Span,
        depth: usize,
    ) -> Result<Vec<Directive>, SyntaxError> {
        let id = identity(self.includes, &path);
        if self.include_stack.len() > MAX_INCLUDE_DEPTH || self.include_stack.contains(&id) {
            return Err(SyntaxError::IncludeDepth {
                span: span.clone(),
                path,
            });
        }
        let src = match self.includes {
            Includes::Disk => match read_source(&path, Some(span)) {
                Ok(src) => src,
                // nginx's own `mime.types` where the prefix has none.
                Err(SyntaxError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound
                        && path.file_name().is_some_and(|n| n == "mime.types") =>
                {
                    MIME_TYPES.to_string()
                }
                Err(e) => return Err(e),
            },
            Includes::Memory(files) => match files.get(&id) {
                Some(text) => text.clone(),
                None => {
                    return Err(SyntaxError::Io {
                        source: std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            "no such file (included files are read from memory here)",
                        ),
                        span: Some(span.clone()),
                        path,
                    })
                }
            },
        };
        self.include_stack.push(id);
        let result = self.parse_source(&src, Arc::new(path), depth);
        self.include_stack.pop();
        result
    }
}

#[cfg(test)]
mod tests;
