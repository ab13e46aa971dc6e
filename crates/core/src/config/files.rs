//! Static files: what `root`, `alias`, `index`, `try_files`, `internal`,
//! `types`, `default_type`, `etag`, `if_modified_since`, `max_ranges`,
//! `expires` and `log_not_found` say for a location (nginx's
//! ngx_http_core_module, ngx_http_static_module, ngx_http_index_module,
//! ngx_http_not_modified_filter_module, ngx_http_range_filter_module and
//! the `expires` of ngx_http_headers_filter_module), after inheritance.

use std::collections::BTreeMap;
use std::sync::Arc;

/// The static-file settings of a location (or of a server, for a request
/// no location takes).
#[derive(Clone, Debug, PartialEq)]
pub struct FileSettings {
    /// `root PATH` or `alias PATH` (with variables), default `root html`
    /// (relative to the prefix, as nginx).
    pub root: DocRoot,
    /// `index FILE ...`, default `index.html`; the last may be an
    /// absolute URI.
    pub index: Vec<String>,
    /// `try_files FILE ... URI|=CODE` of this location (not inherited;
    /// empty: none).
    pub try_files: Vec<String>,
    /// `internal`: reachable by internal redirects only (not inherited).
    pub internal: bool,
    /// `types {}` in force: extension (lowercase) to MIME type; nginx's
    /// default is `text/html html; image/gif gif; image/jpeg jpg;`.
    pub types: Arc<BTreeMap<String, String>>,
    /// `default_type`, default `text/plain`.
    pub default_type: String,
    /// `etag`, default on.
    pub etag: bool,
    /// `if_modified_since`, default `exact`.
    pub if_modified_since: IfModifiedSince,
    /// `max_ranges N`, default none (no limit); 0 turns ranges off.
    pub max_ranges: Option<u32>,
    /// `expires`, default off.
    pub expires: Expires,
    /// `log_not_found`, default on: a missing file is logged at `error`.
    pub log_not_found: bool,
}

/// Where a location's files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DocRoot {
    /// `root PATH`: the URI is appended to PATH (a trailing `/` removed).
    Root(String),
    /// `alias PATH` in location `location_len` bytes long: the URI after
    /// the location's path is appended to PATH; in a regex location
    /// (`location_len` None) PATH is the whole file name.
    Alias {
        /// The path, with variables.
        path: String,
        /// The length of the (prefix) location's path; None in a regex location.
        location_len: Option<usize>,
    },
}

/// `if_modified_since off | exact | before`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IfModifiedSince {
    /// `If-Modified-Since` is ignored.
    Off,
    /// 304 when the date is the file's modification time exactly.
    Exact,
    /// 304 when the date is the file's modification time or later.
    Before,
}

/// `expires`: the `Expires` and `Cache-Control` a response gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expires {
    /// `expires off` (the default): nothing added.
    Off,
    /// `expires epoch`: `Expires: Thu, 01 Jan 1970 00:00:01 GMT`,
    /// `Cache-Control: no-cache`.
    Epoch,
    /// `expires max`: `Expires: Thu, 31 Dec 2037 23:55:55 GMT`,
    /// `Cache-Control: max-age=315360000`.
    Max,
    /// `expires [modified] TIME`: that many seconds after the request
    /// (after the file's modification time with `modified`); negative or
    /// zero makes `Cache-Control: no-cache`.
    After {
        /// Seconds (may be negative).
        seconds: i64,
        /// Counted from the file's modification time.
        modified: bool,
    },
    /// `expires @TIME`: the next time of day TIME (seconds after midnight).
    Daily(i64),
}

impl Default for FileSettings {
    fn default() -> Self {
        Self {
            root: DocRoot::Root("html".to_string()),
            index: vec!["index.html".to_string()],
            try_files: Vec::new(),
            internal: false,
            types: Arc::new(default_types()),
            default_type: "text/plain".to_string(),
            etag: true,
            if_modified_since: IfModifiedSince::Exact,
            max_ranges: None,
            expires: Expires::Off,
            log_not_found: true,
        }
    }
}

/// nginx's types when no `types {}` is in force (ngx_http_core_default_types).
pub fn default_types() -> BTreeMap<String, String> {
    [
        ("html", "text/html"),
        ("gif", "image/gif"),
        ("jpg", "image/jpeg"),
    ]
    .into_iter()
    .map(|(e, t)| (e.to_string(), t.to_string()))
    .collect()
}
