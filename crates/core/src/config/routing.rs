//! The rewrite module's part of the model: `rewrite`, `set` and `return`
//! in the order nginx runs them, `map` blocks, `error_page`, and where a
//! nested location sits.

use super::{Origin, Return};

/// What a location adds to routing beyond its match: its place in the
/// nesting and its rewrite-phase script.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocationRouting {
    /// Index (in the server's `locations`) of the location this one is
    /// nested in; None at the server level.
    pub parent: Option<usize>,
    /// `rewrite`, `set` and `return`, in file order (nginx's rewrite phase).
    pub script: Vec<RewriteStep>,
}

/// One directive of the rewrite phase.
#[derive(Clone, Debug, PartialEq)]
pub enum RewriteStep {
    /// `rewrite REGEX REPLACEMENT [FLAG]`.
    Rewrite(Rewrite),
    /// `set $name VALUE`.
    Set(SetVar),
    /// `return ...`: ends the script.
    Return(Return),
}

/// `rewrite REGEX REPLACEMENT [last|break|redirect|permanent]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Rewrite {
    /// The regular expression, as written (matched against `$uri`).
    pub regex: String,
    /// The replacement, with variables and captures, without the final `?`.
    pub replacement: String,
    /// The replacement ended in `?`: the request's arguments are dropped.
    pub drop_args: bool,
    /// What happens after a match.
    pub flag: RewriteFlag,
    /// Where the directive is.
    pub origin: Origin,
}

/// What a matching `rewrite` does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RewriteFlag {
    /// No flag: the script goes on.
    None,
    /// `last`: the script stops; in a location, the location is searched again.
    Last,
    /// `break`: the script stops; the location stays.
    Break,
    /// `redirect` (or a replacement starting with `http://`, `https://`,
    /// `$scheme`): 302 to the replacement.
    Redirect,
    /// `permanent`: 301 to the replacement.
    Permanent,
}

/// `set $name VALUE`.
#[derive(Clone, Debug, PartialEq)]
pub struct SetVar {
    /// The variable's name, without `$`.
    pub name: String,
    /// The value, with variables.
    pub value: String,
    /// Where the directive is.
    pub origin: Origin,
}

/// `map $source $variable { ... }` at the http level.
#[derive(Clone, Debug, PartialEq)]
pub struct MapBlock {
    /// The source value, with variables (`$http_host`).
    pub source: String,
    /// The variable it defines, without `$`.
    pub variable: String,
    /// `hostnames`: keys may be `.example.com` and `*.example.com` / `mail.*`.
    pub hostnames: bool,
    /// `default VALUE` (nginx's default: the empty string).
    pub default: Option<String>,
    /// The entries, in file order.
    pub entries: Vec<MapEntry>,
    /// Where the block is.
    pub origin: Origin,
}

/// One `KEY VALUE` line of a `map`.
#[derive(Clone, Debug, PartialEq)]
pub struct MapEntry {
    /// What the source is compared with.
    pub key: MapKey,
    /// The value, with variables (and the regex's captures).
    pub value: String,
    /// Where the line is.
    pub origin: Origin,
}

/// A `map` key.
#[derive(Clone, Debug, PartialEq)]
pub enum MapKey {
    /// A string, compared case-insensitively (`\` before a leading `~` is
    /// dropped, as nginx drops it).
    Exact(String),
    /// `~REGEX` (`caseless`: `~*REGEX`).
    Regex {
        /// The expression, without `~` / `~*`.
        pattern: String,
        /// `~*`.
        caseless: bool,
    },
}

/// `error_page CODE ... [=[RESPONSE]] URI|@name`.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorPage {
    /// The statuses it applies to (300..=599).
    pub codes: Vec<u16>,
    /// `=CODE`: the status of the answer; `=` alone: the status of what
    /// the URI answers (`Some(0)`); None: the original status.
    pub answer: Option<u16>,
    /// A URI (`/err`, with variables), a named location (`@name`), or a
    /// redirect URL (`http://...`).
    pub uri: String,
    /// Where the directive is.
    pub origin: Origin,
}

// === impl MapKey ===

/// The key as written in a `map` block.
impl std::fmt::Display for MapKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MapKey::Exact(k) => f.write_str(k),
            MapKey::Regex { pattern, caseless } => {
                write!(f, "~{}{pattern}", if *caseless { "*" } else { "" })
            }
        }
    }
}
