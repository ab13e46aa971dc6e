//! nginx's regular expressions (`location ~` / `~*`, `rewrite`, `map`
//! keys, `server_name ~`) on PCRE2 itself, compiled as nginx 1.22's
//! `ngx_regex_compile` compiles them: no UTF mode (byte-wise matching,
//! ASCII `\d` `\w` `\s` and POSIX classes, ASCII-only case folding),
//! `PCRE2_CASELESS` for `~*`, no other option. So every construct means
//! what it means to nginx: `$` also matches before a final `\n` (so
//! `location ~ ^/adm2$` takes `/adm2%0a`, as nginx does), `.` is any
//! byte but `\n`, groups are numbered by their `(` whatever their name
//! syntax, and look-around, backreferences, atomic groups, possessive
//! quantifiers, `\K`, `\Q..\E`, conditionals and recursion all work.
//!
//! Why PCRE2 and not the `regex` crate with the differing constructs
//! translated: the crate has no look-around, so `$` (end, or before a
//! final newline) can only be written `\n?\z`, which puts the newline into
//! the match and moves where a group may end; and real confs use `(?!..)`
//! and backreferences, which no translation gives. PCRE2 is what nginx
//! runs. The cost is a C dependency (pcre2-sys builds the bundled PCRE2
//! 10.46 with cc unless pkg-config finds the system's; Debian bookworm's
//! nginx links 10.42, whose only differences met in a conf are newer
//! syntax: 10.42 reads `x{,3}` and `x{ 2 }` as literal text and refuses
//! `(?<=a{1,3})`) and PCRE's backtracking, which nginx has
//! too: a match stops at PCRE2's default match limit (10,000,000 steps),
//! as nginx's does, and then fails; callers answer as nginx does (500 for
//! a location, a closed request for a `server_name`).
//!
//! Matching runs PCRE2's JIT code where the platform allows it (nginx's
//! `pcre_jit on`), at or below the `regex` crate's cost per location
//! (docs/performance.md, "Regular expressions"). PCRE2 guarantees the JIT
//! and the interpreter find the same matches; where the JIT gives up on a
//! subject (its 32 KiB stack or its own match limit), the interpreter —
//! nginx's default engine — decides. The match data (the group offsets)
//! comes from a pool per expression, one per thread, so matching from
//! many threads neither allocates nor contends.

use std::fmt;
use std::sync::{Arc, OnceLock};

use pcre2::bytes::{CaptureLocations, Regex as Pcre, RegexBuilder};
use regex_automata::util::pool::Pool;

/// A compiled expression: cheap to clone, matched from any thread.
#[derive(Clone)]
pub struct Regex(Arc<Compiled>);

/// The groups of a match as nginx numbers them: the whole match first,
/// then one per `(` of a capturing group in pattern order (named or not);
/// None for a group that took no part in the match. The subject's bytes,
/// as nginx's captures are: a decoded URI need not be UTF-8.
pub type Groups = Vec<Option<Vec<u8>>>;

/// A match PCRE2 could not finish (its match limit): nginx logs
/// `pcre2_match() failed` and answers with an error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("pcre2_match() failed: {code} ({reason}) using \"{pattern}\"")]
pub struct MatchError {
    code: i32,
    reason: String,
    pattern: String,
}

struct Compiled {
    source: String,
    caseless: bool,
    /// The JIT's code, or the interpreter where the JIT is not available.
    first: Pcre,
    /// Whether `first` runs the JIT's code.
    jit: bool,
    /// The interpreter, compiled the first time the JIT gives up.
    interpreter: OnceLock<Pcre>,
    /// Match data for `first`, one per thread.
    spare: Pool<CaptureLocations, NewLocations>,
}

type NewLocations = Box<dyn Fn() -> CaptureLocations + Send + Sync>;

/// Compile `pattern` as nginx would (`caseless`: `~*`, or a `server_name`
/// with an upper-case letter). The error is nginx's one line:
/// `pcre2_compile() failed: missing closing parenthesis in "a("`.
pub fn compile(pattern: &str, caseless: bool) -> Result<Regex, String> {
    let (first, jit) = match build(pattern, caseless, true) {
        Ok(re) => (re, true),
        Err(e) if matches!(e.kind(), pcre2::ErrorKind::Compile) => {
            return Err(compile_error(&e, pattern))
        }
        // No JIT here (no executable memory, an unsupported CPU).
        Err(_) => (
            build(pattern, caseless, false).map_err(|e| compile_error(&e, pattern))?,
            false,
        ),
    };
    let spare = {
        let re = first.clone();
        Pool::new(Box::new(move || re.capture_locations()) as NewLocations)
    };
    Ok(Regex(Arc::new(Compiled {
        source: pattern.to_string(),
        caseless,
        first,
        jit,
        interpreter: OnceLock::new(),
        spare,
    })))
}

/// The names of the named groups of a compiled expression, in group order.
pub fn group_names(re: &Regex) -> impl Iterator<Item = &str> {
    re.capture_names().flatten()
}

// === impl Regex ===

impl Regex {
    /// Whether the expression matches anywhere in `subject`.
    pub fn is_match(&self, subject: &[u8]) -> Result<bool, MatchError> {
        match self.0.first.is_match(subject) {
            Ok(found) => Ok(found),
            Err(e) => self.interpreted(e, |re| re.is_match(subject)),
        }
    }

    /// The groups of the first match in `subject`, None when it does not
    /// match.
    pub fn captures(&self, subject: &[u8]) -> Result<Option<Groups>, MatchError> {
        let mut locs = self.0.spare.get();
        match self.0.first.captures_read(&mut locs, subject) {
            Ok(found) => Ok(found.map(|_| groups(&locs, subject))),
            Err(e) => self.interpreted(e, |re| {
                let mut locs = re.capture_locations();
                Ok(re
                    .captures_read(&mut locs, subject)?
                    .map(|_| groups(&locs, subject)))
            }),
        }
    }

    /// Each group's name by its number (group 0 and unnamed ones: None).
    pub fn capture_names(&self) -> impl Iterator<Item = Option<&str>> {
        self.0.first.capture_names().iter().map(Option::as_deref)
    }

    /// The expression as written.
    pub fn as_str(&self) -> &str {
        &self.0.source
    }

    /// `run` on the interpreter when the JIT gave up with `e`; `e` itself
    /// when it was already the interpreter.
    fn interpreted<T>(
        &self,
        e: pcre2::Error,
        run: impl FnOnce(&Pcre) -> Result<T, pcre2::Error>,
    ) -> Result<T, MatchError> {
        if !self.0.jit {
            return Err(self.match_error(&e));
        }
        let re = match self.0.interpreter.get() {
            Some(re) => re,
            None => {
                let re = build(&self.0.source, self.0.caseless, false)
                    .map_err(|_| self.match_error(&e))?;
                self.0.interpreter.get_or_init(|| re)
            }
        };
        run(re).map_err(|e| self.match_error(&e))
    }

    fn match_error(&self, e: &pcre2::Error) -> MatchError {
        let text = e.to_string();
        MatchError {
            code: e.code(),
            reason: text
                .strip_prefix("PCRE2: error matching: ")
                .unwrap_or(&text)
                .to_string(),
            pattern: self.0.source.clone(),
        }
    }
}

impl fmt::Debug for Regex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Regex").field(&self.0.source).finish()
    }
}

// === impl MatchError ===

impl MatchError {
    /// PCRE2's error code (`PCRE2_ERROR_MATCHLIMIT` is -47).
    pub fn code(&self) -> i32 {
        self.code
    }
}

/// nginx's options: `PCRE2_CASELESS` or none (no UTF, no multiline).
fn build(pattern: &str, caseless: bool, jit: bool) -> Result<Pcre, pcre2::Error> {
    RegexBuilder::new()
        .caseless(caseless)
        .jit(jit)
        .build(pattern)
}

/// The groups of the match in `locs`, as bytes.
fn groups(locs: &CaptureLocations, subject: &[u8]) -> Groups {
    (0..locs.len())
        .map(|i| {
            let (start, end) = locs.get(i)?;
            subject.get(start..end).map(<[u8]>::to_vec)
        })
        .collect()
}

/// `ngx_regex_compile`'s message: PCRE2's reason, the expression, and
/// where in it PCRE2 stopped unless that is its end.
fn compile_error(e: &pcre2::Error, pattern: &str) -> String {
    let text = e.to_string();
    let at = e.offset().unwrap_or(pattern.len());
    let reason = text
        .strip_prefix(&format!("PCRE2: error compiling pattern at offset {at}: "))
        .unwrap_or(&text);
    match pattern.as_bytes().get(at..).filter(|rest| !rest.is_empty()) {
        None => format!("pcre2_compile() failed: {reason} in \"{pattern}\""),
        Some(rest) => format!(
            "pcre2_compile() failed: {reason} in \"{pattern}\" at \"{}\"",
            String::from_utf8_lossy(rest)
        ),
    }
}

#[cfg(test)]
mod tests;
