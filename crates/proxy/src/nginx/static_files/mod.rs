//! nginx's static files, for a location with no `proxy_pass` and no
//! `return` (and for a request no location takes, from the server's
//! `root`): the precontent phase's `try_files`, then the content phase's
//! index module (a URI ending in `/`), the static module (a file, the
//! 301 to a directory's `/`, 403/404/405), and the header filters a
//! file's answer goes through: not_modified (304/412), range (206/416),
//! `expires`. Transcribed from nginx 1.22's ngx_http_static_module.c,
//! ngx_http_index_module.c, ngx_http_core_module.c (try_files,
//! ngx_http_map_uri_to_path), ngx_http_not_modified_filter_module.c,
//! ngx_http_range_filter_module.c and ngx_http_headers_filter_module.c.
//!
//! What the answer does next (an internal redirect to a URI or a named
//! location, `error_page`, `add_header`, the access log) is the
//! handler's (`handler/files.rs`).

mod answer;
mod body;
mod path;
mod range;

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderName, Method, Response, StatusCode};
use vigil_core::config::{DocRoot, FileSettings, Location};

use crate::nginx::rewrite::Net;
use crate::nginx::router::{RouteError, Target};
use crate::nginx::status_page::error_page;
use crate::nginx::vars::{Scope, Template, VarContext};
use crate::wire::payload::UpBody;
use path::FileName;
use rustix::io::Errno;

pub(crate) use answer::expires;

/// The most internal redirects one request may take (nginx's
/// NGX_HTTP_MAX_URI_CHANGES + 1 for its `uri_changes`).
pub(crate) const MAX_REDIRECTS: usize = 11;

/// A location's (or a server's) static files, compiled.
pub(crate) struct Files {
    root: Root,
    index: Vec<Box<[u8]>>,
    try_files: Option<TryFiles>,
    settings: FileSettings,
    default_type: http::HeaderValue,
    /// `add_header`s of the location.
    pub(crate) add_headers: Vec<(HeaderName, Template, bool)>,
    /// The location's access log.
    pub(crate) access_log: Option<Arc<crate::obs::log::AccessLogWriter>>,
    /// The location's `error_page`s.
    pub(crate) error_pages: crate::nginx::error_page::ErrorPages,
    /// The location's `limit_req` / `limit_conn` (None: none; set by the
    /// routes' builder, which holds the zones).
    pub(crate) limits: Option<Box<crate::nginx::limit::Limits>>,
    /// The location's gzip settings.
    pub(crate) gzip: vigil_core::config::Gzip,
    /// The location's `client_max_body_size` (0: none): a request that
    /// says it sends more is 413, as nginx's find-config phase answers it.
    max_body: u64,
    /// The location's client-side timers (`keepalive_timeout`,
    /// `send_timeout`) for the connection; None for a server's own files.
    pub(crate) timers: Option<vigil_core::config::ProxySettings>,
}

/// `root` or `alias`, with variables.
enum Root {
    Root(Template),
    Alias {
        path: Template,
        location_len: Option<usize>,
    },
}

/// `try_files`: the files tried, then the fallback.
struct TryFiles {
    tries: Vec<Try>,
    last: Last,
}

struct Try {
    name: Template,
    /// Written with variables (an alias then strips the location's path).
    vars: bool,
    /// Written with a trailing `/`: must be a directory.
    dir: bool,
}

/// `try_files`' last argument.
enum Last {
    Code(u16),
    Named(String),
    Uri(Template),
}

/// What serving a request made.
pub(crate) enum Outcome {
    /// The answer (before `error_page`, `expires`, `add_header`, the log).
    Answer(Response<UpBody>),
    /// An internal redirect to this URI (path, arguments).
    Redirect(Vec<u8>, String),
    /// An internal redirect to a named location.
    Named(String),
}

// === impl Files ===

impl Files {
    /// Compile `settings` (a location's, or a server's with `loc` None).
    pub(crate) fn build(
        settings: &FileSettings,
        loc: Option<&Location>,
        origin: &vigil_core::config::Origin,
        logs: &mut std::collections::HashMap<
            std::path::PathBuf,
            Arc<crate::obs::log::AccessLogWriter>,
        >,
        scope: &Scope,
        error_pages: &[vigil_core::config::ErrorPage],
    ) -> Result<Self, RouteError> {
        let err = |message: String| RouteError {
            at: origin.to_string(),
            message,
        };
        let parse = |v: &str| Template::parse_with(v, scope).map_err(|e| err(e.to_string()));
        let root = match &settings.root {
            DocRoot::Root(p) => Root::Root(parse(&full_name(p))?),
            DocRoot::Alias { path, location_len } => Root::Alias {
                path: parse(&full_name(path))?,
                location_len: *location_len,
            },
        };
        let try_files = match settings.try_files.split_last() {
            None => None,
            Some((last, tries)) => Some(TryFiles {
                tries: tries
                    .iter()
                    .map(|t| {
                        let dir = t.ends_with('/');
                        let name = if dir { &t[..t.len() - 1] } else { &t[..] };
                        Ok(Try {
                            name: parse(name)?,
                            vars: name.contains('$'),
                            dir,
                        })
                    })
                    .collect::<Result<_, RouteError>>()?,
                last: if let Some(c) = last.strip_prefix('=') {
                    Last::Code(
                        c.parse()
                            .map_err(|_| err(format!("invalid code \"{last}\"")))?,
                    )
                } else if last.starts_with('@') {
                    Last::Named(last.clone())
                } else {
                    Last::Uri(parse(last)?)
                },
            }),
        };
        let default_type = http::HeaderValue::from_str(&settings.default_type).map_err(|_| {
            err(format!(
                "invalid default_type \"{}\"",
                settings.default_type
            ))
        })?;
        let (add_headers, access_log, gzip) = match loc {
            Some(l) => (
                crate::nginx::route::add_headers(l, &err, scope)?,
                crate::nginx::route::access_log(l, logs, scope, &err)?,
                l.proxy.gzip.clone(),
            ),
            None => (Vec::new(), None, Default::default()),
        };
        let timers = loc.map(|l| vigil_core::config::ProxySettings {
            client_keepalive_timeout: l.proxy.client_keepalive_timeout,
            client_send_timeout: l.proxy.client_send_timeout,
            ..Default::default()
        });
        Ok(Self {
            root,
            index: settings.index.iter().map(|i| i.as_bytes().into()).collect(),
            try_files,
            settings: settings.clone(),
            default_type,
            add_headers,
            access_log,
            error_pages: crate::nginx::error_page::ErrorPages::build(error_pages, false, scope)?,
            limits: None,
            gzip,
            max_body: loc.map_or(0, |l| l.proxy.client_max_body_size),
            timers,
        })
    }

    /// The location's `expires`.
    pub(crate) fn expires(&self) -> vigil_core::config::Expires {
        self.settings.expires
    }

    /// Serve the request as nginx's precontent and content phases do.
    pub(crate) fn serve(&self, parts: &Parts, target: &Target, net: Net) -> Outcome {
        let declared = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if self.max_body != 0 && declared.is_some_and(|n| n > self.max_body) {
            tracing::error!(
                "client intended to send too large body: {} bytes",
                declared.unwrap_or_default()
            );
            return Outcome::Answer(error_page(StatusCode::PAYLOAD_TOO_LARGE));
        }
        let cx = VarContext {
            parts,
            target: Some(target),
            client: net.client,
            local: net.local,
            proxy_host: "",
            attempts: &[],
            status: 0,
            request_time: 0.0,
        };
        let mut uri = target.uri.path().to_vec();
        let mut add_uri_to_alias = false;
        if let Some(t) = &self.try_files {
            if let Some(done) = self.try_files(t, &cx, &mut uri, &mut add_uri_to_alias) {
                return done;
            }
        }
        self.content(&cx, &uri, add_uri_to_alias)
    }

    /// ngx_http_map_uri_to_path: the file `uri` names here.
    fn file_name(&self, cx: &VarContext<'_>, uri: &[u8], add_uri_to_alias: bool) -> FileName {
        match &self.root {
            Root::Root(t) => FileName::join(t.expand(cx), uri),
            Root::Alias {
                path,
                location_len: Some(n),
            } => FileName::join(path.expand(cx), uri.get(*n..).unwrap_or_default()),
            Root::Alias {
                path,
                location_len: None,
            } => FileName::join(path.expand(cx), if add_uri_to_alias { uri } else { b"" }),
        }
    }

    /// The precontent phase: the first file of `try_files` that exists
    /// becomes the URI (None: go on to the content phase), else its last
    /// argument answers.
    fn try_files(
        &self,
        t: &TryFiles,
        cx: &VarContext<'_>,
        uri: &mut Vec<u8>,
        add_uri_to_alias: &mut bool,
    ) -> Option<Outcome> {
        for tr in &t.tries {
            let mut name = tr.name.expand(cx);
            let alias_len = match &self.root {
                Root::Alias {
                    location_len: Some(n),
                    ..
                } => Some(*n),
                _ => None,
            };
            if let Some(n) = alias_len {
                if tr.vars && name.len() >= n && uri.len() >= n && name[..n] == uri[..n] {
                    name.drain(..n);
                }
            }
            let base = match &self.root {
                Root::Root(r) => r.expand(cx),
                Root::Alias { path, .. } => path.expand(cx),
            };
            let file = FileName::join(base, &name);
            if !file.is_safe() {
                tracing::error!(
                    "\"{}\" is outside the root, not tried{}",
                    file.display(),
                    who(cx)
                );
                continue;
            }
            let meta = match std::fs::metadata(file.path()) {
                Ok(m) => m,
                Err(e) => {
                    if !not_found(&e) {
                        tracing::error!(
                            "stat() \"{}\" failed {}{}",
                            file.display(),
                            errno(&e),
                            who(cx)
                        );
                    }
                    continue;
                }
            };
            if meta.is_dir() != tr.dir {
                continue;
            }
            match &self.root {
                Root::Root(_) => *uri = name,
                Root::Alias {
                    location_len: None, ..
                } => {
                    if !tr.dir {
                        *uri = name;
                        *add_uri_to_alias = true;
                    }
                }
                Root::Alias {
                    location_len: Some(n),
                    ..
                } => {
                    let mut u = uri.get(..*n).unwrap_or_default().to_vec();
                    u.extend_from_slice(&name);
                    *uri = u;
                }
            }
            return None;
        }
        Some(match &t.last {
            Last::Code(c) => Outcome::Answer(crate::nginx::status_page::code_page(
                StatusCode::from_u16(*c).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            )),
            Last::Named(n) => Outcome::Named(n.clone()),
            Last::Uri(u) => {
                let u = u.expand(cx);
                match u.iter().position(|&b| b == b'?') {
                    Some(q) => Outcome::Redirect(
                        u[..q].to_vec(),
                        String::from_utf8_lossy(&u[q + 1..]).into_owned(),
                    ),
                    None => Outcome::Redirect(
                        u,
                        cx.target
                            .map_or_else(String::new, |t| t.uri.args().to_string()),
                    ),
                }
            }
        })
    }

    /// The content phase: the index module, then the static module.
    fn content(&self, cx: &VarContext<'_>, uri: &[u8], add_uri_to_alias: bool) -> Outcome {
        let method = &cx.parts.method;
        if !matches!(*method, Method::GET | Method::HEAD | Method::POST) {
            return Outcome::Answer(error_page(StatusCode::METHOD_NOT_ALLOWED));
        }
        if uri.last() == Some(&b'/') || uri.is_empty() {
            return self.index(cx, uri, add_uri_to_alias);
        }
        Outcome::Answer(answer::file(self, cx, uri, add_uri_to_alias))
    }

    /// ngx_http_index_handler, then (no index found) the content phase's
    /// 403 for a directory.
    fn index(&self, cx: &VarContext<'_>, uri: &[u8], add_uri_to_alias: bool) -> Outcome {
        let args = || {
            cx.target
                .map_or_else(String::new, |t| t.uri.args().to_string())
        };
        let mut dir_tested = false;
        for name in &self.index {
            if name.first() == Some(&b'/') {
                return Outcome::Redirect(name.to_vec(), args());
            }
            let dir = self.file_name(cx, uri, add_uri_to_alias);
            let dir_len = dir.bytes.len();
            let file = FileName {
                bytes: [&dir.bytes[..], name].concat(),
                root_len: dir.root_len,
            };
            if !file.is_safe() {
                return Outcome::Answer(outside(&file, cx));
            }
            match std::fs::metadata(file.path()) {
                Ok(_) => {
                    let mut to = uri.to_vec();
                    to.extend_from_slice(name);
                    return Outcome::Redirect(to, args());
                }
                Err(e) => {
                    if is(&e, Errno::LOOP) || is(&e, Errno::MLINK) {
                        return Outcome::Answer(error_page(StatusCode::FORBIDDEN));
                    }
                    if matches!(
                        e.kind(),
                        io::ErrorKind::NotADirectory | io::ErrorKind::PermissionDenied
                    ) || is(&e, Errno::NAMETOOLONG)
                    {
                        return Outcome::Answer(self.index_error(&file, &e, cx));
                    }
                    if !dir_tested {
                        // The directory itself (without its last `/`).
                        let d = &file.bytes[..dir_len.saturating_sub(1).max(1)];
                        let d = std::path::Path::new(std::ffi::OsStr::from_bytes(d));
                        match std::fs::metadata(d) {
                            Ok(m) if m.is_dir() => {}
                            Ok(_) => {
                                tracing::error!(
                                    "\"{}\" is not a directory{}",
                                    d.display(),
                                    who(cx)
                                );
                                return Outcome::Answer(error_page(
                                    StatusCode::INTERNAL_SERVER_ERROR,
                                ));
                            }
                            Err(de) if de.kind() == io::ErrorKind::NotFound => {
                                return Outcome::Answer(self.index_error(&file, &de, cx));
                            }
                            Err(de) if de.kind() == io::ErrorKind::PermissionDenied => {}
                            Err(de) => {
                                tracing::error!(
                                    "stat() \"{}\" failed {}{}",
                                    d.display(),
                                    errno(&de),
                                    who(cx)
                                );
                                return Outcome::Answer(error_page(
                                    StatusCode::INTERNAL_SERVER_ERROR,
                                ));
                            }
                        }
                        dir_tested = true;
                    }
                    if e.kind() == io::ErrorKind::NotFound {
                        continue;
                    }
                    tracing::error!(
                        "stat() \"{}\" failed {}{}",
                        file.display(),
                        errno(&e),
                        who(cx)
                    );
                    return Outcome::Answer(error_page(StatusCode::INTERNAL_SERVER_ERROR));
                }
            }
        }
        let dir = self.file_name(cx, uri, add_uri_to_alias);
        tracing::error!(
            "directory index of \"{}\" is forbidden{}",
            dir.display(),
            who(cx)
        );
        Outcome::Answer(error_page(StatusCode::FORBIDDEN))
    }

    /// ngx_http_index_error.
    fn index_error(&self, file: &FileName, e: &io::Error, cx: &VarContext<'_>) -> Response<UpBody> {
        if e.kind() == io::ErrorKind::PermissionDenied {
            tracing::error!(
                "\"{}\" is forbidden {}{}",
                file.display(),
                errno(e),
                who(cx)
            );
            return error_page(StatusCode::FORBIDDEN);
        }
        if self.settings.log_not_found {
            tracing::error!(
                "\"{}\" is not found {}{}",
                file.display(),
                errno(e),
                who(cx)
            );
        }
        error_page(StatusCode::NOT_FOUND)
    }
}

/// An error nginx's try_files passes over in silence.
fn not_found(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.kind() == io::ErrorKind::NotADirectory
        || is(e, Errno::NAMETOOLONG)
}

/// Whether `e` is the system's error `n`.
fn is(e: &io::Error, n: Errno) -> bool {
    e.raw_os_error() == Some(n.raw_os_error())
}

/// nginx's `(2: No such file or directory)` of an error.
fn errno(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            let text = io::Error::from_raw_os_error(n).to_string();
            let text = text
                .strip_suffix(&format!(" (os error {n})"))
                .unwrap_or(&text)
                .to_string();
            format!("({n}: {text})")
        }
        None => format!("({e})"),
    }
}

/// The 404 of a name vigil does not open (see [`FileName::is_safe`]).
fn outside(file: &FileName, cx: &VarContext<'_>) -> Response<UpBody> {
    tracing::error!(
        "\"{}\" is outside the root (a NUL or `..` from the request), not opened{}",
        file.display(),
        who(cx)
    );
    error_page(StatusCode::NOT_FOUND)
}

/// What nginx appends to a request's error-log line: `, client: ADDR,
/// server: NAME, request: "LINE", host: "HOST"`.
fn who(cx: &VarContext<'_>) -> String {
    let p = cx.parts;
    let target = p.uri.path_and_query().map_or("/", |t| t.as_str());
    let (server, host) = cx
        .target
        .map_or(("", ""), |t| (&*t.server_name, t.host.as_str()));
    let mut out = format!(
        ", client: {}, server: {server}, request: \"{} {target} {:?}\"",
        cx.client.ip(),
        p.method,
        p.version
    );
    if !host.is_empty() {
        out.push_str(&format!(", host: \"{host}\""));
    }
    out
}

/// A root as nginx's ngx_conf_full_name makes it: relative to the
/// prefix, which vigil takes to be its working directory (a root with a
/// variable at its start is left as written, as nginx leaves it).
fn full_name(root: &str) -> String {
    // `root /` is "" (its slash removed), absolute in nginx.
    if root.is_empty() || root.starts_with('/') || root.starts_with('$') {
        return root.to_string();
    }
    match std::env::current_dir() {
        Ok(d) => {
            let d = d.to_string_lossy();
            let d = d.trim_end_matches('/');
            format!("{d}/{root}")
        }
        Err(_) => root.to_string(),
    }
}
