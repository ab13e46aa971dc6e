//! The nginx.conf front end: reads a whole nginx.conf (with `include`s)
//! and builds the typed model from the directives vigil implements.
//!
//! Directives with no meaning for vigil (`events {}`, temp paths, ...)
//! are accepted and reported once as ignored; so are the main context's
//! process directives (`pid`, `error_log`, `daemon`, ...) for `vigil
//! serve`, which are also read into [`Loaded::process`] for the nginx
//! command line, which honours them. A directive that would change behaviour and that vigil does
//! not implement is an error, never silently dropped.
//!
//! Two modes share one code path ([`Mode`]). Every place that refuses a
//! directive (or one of its parameters) hands the error to
//! `Context::refuse`: in [`Mode::Strict`] (`vigil serve`, `vigil check`,
//! `vigil convert`) that returns it, so the first refusal stops the load
//! exactly where it always did; in [`Mode::Lenient`] (`vigil lint`) it is
//! recorded in [`Loaded::refusals`], the directive (or parameter, or
//! block) is skipped, and the rest of the file is still read into the
//! model. So the first lenient refusal is always the strict error, and a
//! file with no refusals gives the same model in both modes.

mod access;
mod files;
mod filters;
mod http;
mod limit;
mod log;
pub mod process;
mod rewrite;
mod sources;
mod spelling;
mod ssl;
pub mod syntax;
mod upstream;

use std::collections::BTreeMap;
use std::path::Path;

use crate::{ConfigError, Resolver};
use syntax::{Arg, Directive, Span};
use vigil_core::config::{Config, Origin};

pub use sources::{Placed, Placements, Sources};

/// How refusals are handled (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The first refusal is the error of the load (`vigil serve`).
    Strict,
    /// Every refusal is recorded and skipped; the rest is still modelled
    /// (`vigil lint`).
    Lenient,
}

/// A loaded nginx.conf.
#[derive(Debug)]
pub struct Loaded {
    /// The model. After a lenient load with refusals it is the model of
    /// what was understood: refused directives are left out (their
    /// settings keep the inherited values), a refused `listen` parameter
    /// is dropped from its listen, and blocks vigil cannot route (regex
    /// and named locations, nested locations) are kept as prefix
    /// locations whose path is their written text (`~ \.php$`), so that
    /// their traps are still found. Fit for lint, not for serving.
    pub config: Config,
    /// Directives accepted without effect: name and first place seen.
    pub ignored: Vec<(String, String)>,
    /// Every place of a directive accepted without effect, in file order.
    pub ignored_at: Vec<(String, Span)>,
    /// What `vigil serve` refuses, in file order (empty after a strict load).
    pub refusals: Vec<ConfigError>,
    /// Where the settings of the model were written.
    pub sources: Sources,
    /// The main context's process directives (`pid`, `error_log`, ...):
    /// honoured by the nginx command line, ignored by `vigil serve`.
    pub process: process::Process,
}

/// Read an nginx.conf file (includes resolve against its directory, as
/// nginx resolves them against the conf prefix).
pub fn load_file(path: &Path, resolve: Resolver<'_>) -> Result<Loaded, ConfigError> {
    let directives = syntax::parse_file(path)?;
    build(&directives, resolve)
}

/// [`load_file`] with nginx's `-g DIRECTIVES` (main-context directives
/// given on the command line, read before the file as nginx reads them;
/// their places are in the file `command line`).
pub fn load_file_with_globals(
    path: &Path,
    globals: &str,
    resolve: Resolver<'_>,
    mode: Mode,
) -> Result<Loaded, ConfigError> {
    let mut directives = globals_of(path, globals)?;
    directives.extend(syntax::parse_file(path)?);
    build_with(&directives, resolve, mode)
}

/// The directives of `-g`'s text (empty when there is none).
fn globals_of(path: &Path, globals: &str) -> Result<Vec<Directive>, ConfigError> {
    if globals.is_empty() {
        return Ok(Vec::new());
    }
    let prefix = path.parent().unwrap_or_else(|| Path::new("."));
    let directives = syntax::parse_str(globals, Path::new("command line"), prefix)?;
    // nginx: `-g` holds main-context directives without blocks.
    if let Some(b) = directives.iter().find(|d| d.block.is_some()) {
        return Err(ConfigError::invalid(
            &b.span,
            format!("directive \"{}\" has a block on the command line", b.name),
        ));
    }
    Ok(directives)
}

/// [`load_file`] in [`Mode::Lenient`]: an error only when the file cannot
/// be read or parsed; every refusal is in [`Loaded::refusals`].
pub fn lenient_file(path: &Path, resolve: Resolver<'_>) -> Result<Loaded, ConfigError> {
    let directives = syntax::parse_file(path)?;
    build_with(&directives, resolve, Mode::Lenient)
}

/// Read nginx.conf text said to come from `file`; includes resolve against `prefix`.
pub fn load_str(
    src: &str,
    file: &Path,
    prefix: &Path,
    resolve: Resolver<'_>,
) -> Result<Loaded, ConfigError> {
    load_str_with(src, file, prefix, resolve, syntax::Includes::Disk)
}

/// [`load_str`] with the included files taken from `includes`
/// ([`syntax::Includes::Memory`] never touches the disk).
pub fn load_str_with(
    src: &str,
    file: &Path,
    prefix: &Path,
    resolve: Resolver<'_>,
    includes: syntax::Includes<'_>,
) -> Result<Loaded, ConfigError> {
    load_str_mode(src, file, prefix, resolve, includes, Mode::Strict)
}

/// [`load_str_with`] in either mode.
pub fn load_str_mode(
    src: &str,
    file: &Path,
    prefix: &Path,
    resolve: Resolver<'_>,
    includes: syntax::Includes<'_>,
    mode: Mode,
) -> Result<Loaded, ConfigError> {
    let directives = syntax::parse_str_with(src, file, prefix, includes)?;
    build_with(&directives, resolve, mode)
}

/// Build the model from parsed directives ([`Mode::Strict`]).
pub fn build(directives: &[Directive], resolve: Resolver<'_>) -> Result<Loaded, ConfigError> {
    build_with(directives, resolve, Mode::Strict)
}

/// Build the model from parsed directives; in [`Mode::Lenient`] this
/// never fails.
pub fn build_with(
    directives: &[Directive],
    resolve: Resolver<'_>,
    mode: Mode,
) -> Result<Loaded, ConfigError> {
    let mut cx = Context {
        resolve,
        mode,
        refusals: Vec::new(),
        ignored: BTreeMap::new(),
        ignored_at: Vec::new(),
        config: Config::default(),
        listens: Default::default(),
        sources: Sources::default(),
        refused_upstreams: Vec::new(),
        limit_uses: Vec::new(),
    };
    let mut process = process::Process::default();
    // `upstream` and `server` blocks may also stand at the top level of a
    // file that holds only them (the checker's SRC file, a conf.d snippet).
    let mut http_blocks = Vec::new();
    let mut loose = Vec::new();
    for d in directives {
        match d.name.as_str() {
            "http" => match block(d) {
                Ok(b) if http_blocks.is_empty() => http_blocks.push(b),
                Ok(_) => {
                    // nginx: `"http" directive is duplicate` at the second one.
                    cx.refuse(ConfigError::invalid(
                        &d.span,
                        "\"http\" directive is duplicate",
                    ))?;
                }
                Err(e) => cx.refuse(e)?,
            },
            "upstream" | "server" => loose.push(d.clone()),
            "pid"
            | "error_log"
            | "daemon"
            | "master_process"
            | "worker_processes"
            | "user"
            | "worker_rlimit_nofile" => {
                if let Some(r) = process.directive(d) {
                    cx.keep(r)?;
                }
                cx.ignore(d);
            }
            "events"
            | "worker_cpu_affinity"
            | "worker_priority"
            | "timer_resolution"
            | "env"
            | "pcre_jit"
            | "thread_pool"
            | "lock_file"
            | "working_directory"
            | "worker_rlimit_core" => cx.ignore(d),
            "worker_shutdown_timeout" => {
                let r = shutdown_timeout(d, cx.config.shutdown_timeout.is_some());
                if let Some(t) = cx.keep(r)? {
                    cx.config.shutdown_timeout = Some(t);
                }
            }
            // Debian's nginx.conf includes modules-enabled/*.conf, where
            // each installed module package puts its `load_module`: vigil
            // has no dynamic modules, and what such a module adds
            // (`stream {}`, `geoip_country`, ...) is refused where it is
            // used, so loading one is accepted and ignored.
            "load_module" => match args(d, 1, 1) {
                Ok(_) => cx.ignore(d),
                Err(e) => cx.refuse(e)?,
            },
            "stream" | "mail" => {
                cx.refuse(unsupported(d, "vigil proxies HTTP only"))?;
            }
            _ => cx.refuse(unknown(d, "main"))?,
        }
    }
    let mut all: Vec<&Directive> = loose.iter().collect();
    if let Some(b) = http_blocks.first() {
        all.extend(b.iter());
    }
    http::http_block(&mut cx, &all)?;
    let ignored = cx
        .ignored
        .into_iter()
        .map(|(name, at)| (name, at.to_string()))
        .collect();
    Ok(Loaded {
        config: cx.config,
        ignored,
        ignored_at: cx.ignored_at,
        refusals: cx.refusals,
        sources: cx.sources,
        process,
    })
}

pub(crate) struct Context<'r> {
    pub(crate) resolve: Resolver<'r>,
    pub(crate) mode: Mode,
    /// Lenient mode: every refusal so far.
    pub(crate) refusals: Vec<ConfigError>,
    pub(crate) ignored: BTreeMap<String, Span>,
    pub(crate) ignored_at: Vec<(String, Span)>,
    pub(crate) config: Config,
    /// Every address listened on so far, for nginx's cross-server checks.
    pub(crate) listens: crate::validate::ListenBook,
    pub(crate) sources: Sources,
    /// Lenient mode: upstream blocks that were refused as a whole, so that
    /// `proxy_pass` to them is not taken for a host name.
    pub(crate) refused_upstreams: Vec<String>,
    /// The zones `limit_req` and `limit_conn` named so far (checked
    /// against the declared ones at the end of the http block).
    pub(crate) limit_uses: Vec<limit::Use>,
}

impl Context<'_> {
    pub(crate) fn ignore(&mut self, d: &Directive) {
        self.ignored
            .entry(d.name.clone())
            .or_insert_with(|| d.span.clone());
        self.ignored_at.push((d.name.clone(), d.span.clone()));
    }

    /// A refusal: the error itself in strict mode, recorded (and the
    /// caller skips what was refused) in lenient mode.
    pub(crate) fn refuse(&mut self, e: ConfigError) -> Result<(), ConfigError> {
        match self.mode {
            Mode::Strict => Err(e),
            Mode::Lenient => {
                self.refusals.push(e);
                Ok(())
            }
        }
    }

    /// `r`'s value, or None after refusing its error.
    pub(crate) fn keep<T>(&mut self, r: Result<T, ConfigError>) -> Result<Option<T>, ConfigError> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) => self.refuse(e).map(|()| None),
        }
    }
}

/// Where `span` is, as the model records it.
pub fn origin(span: &Span) -> Origin {
    Origin::at((*span.file).clone(), span.line, span.col)
}

pub(crate) fn block(d: &Directive) -> Result<&[Directive], ConfigError> {
    d.block.as_deref().ok_or_else(|| {
        ConfigError::invalid(
            &d.span,
            format!("directive \"{}\" has no opening \"{{\"", d.name),
        )
    })
}

pub(crate) fn no_block(d: &Directive) -> Result<(), ConfigError> {
    if d.block.is_some() {
        return Err(ConfigError::invalid(
            &d.span,
            format!("directive \"{}\" is not terminated by \";\"", d.name),
        ));
    }
    Ok(())
}

/// The directive's arguments, checked to be between `min` and `max` in number.
pub(crate) fn args(d: &Directive, min: usize, max: usize) -> Result<&[Arg], ConfigError> {
    no_block(d)?;
    if d.args.len() < min || d.args.len() > max {
        return Err(ConfigError::invalid(
            &d.span,
            format!("invalid number of arguments in \"{}\" directive", d.name),
        ));
    }
    Ok(&d.args)
}

pub(crate) fn one(d: &Directive) -> Result<&Arg, ConfigError> {
    Ok(&args(d, 1, 1)?[0])
}

pub(crate) fn bad(arg: &Arg, d: &Directive, expected: &str) -> ConfigError {
    ConfigError::invalid(
        &arg.span,
        format!(
            "invalid value \"{}\" in \"{}\" directive, expected {expected}",
            arg.value, d.name
        ),
    )
}

pub(crate) fn unknown(d: &Directive, context: &str) -> ConfigError {
    let guess = spelling::nearest(&d.name)
        .map(|n| format!("; did you mean \"{n}\"?"))
        .unwrap_or_default();
    ConfigError::invalid(
        &d.span,
        format!(
            "unknown or unsupported directive \"{}\" in {context} context (vigil refuses directives it does not implement rather than ignore them; to keep this conf on nginx, run `vigil check` beside it){guess}",
            d.name
        ),
    )
}

pub(crate) fn unsupported(d: &Directive, why: &str) -> ConfigError {
    ConfigError::invalid(
        &d.span,
        format!("directive \"{}\" is not supported: {why}", d.name),
    )
}

pub(crate) fn on_off(d: &Directive) -> Result<bool, ConfigError> {
    let a = one(d)?;
    match a.value.as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(bad(a, d, "\"on\" or \"off\"")),
    }
}

pub(crate) fn time(d: &Directive, a: &Arg) -> Result<std::time::Duration, ConfigError> {
    vigil_core::config::value::parse_time(&a.value)
        .map_err(|e| ConfigError::invalid(&a.span, format!("\"{}\": {e}", d.name)))
}

/// `worker_shutdown_timeout TIME;` (main context, once; nginx's msec slot).
fn shutdown_timeout(d: &Directive, seen: bool) -> Result<std::time::Duration, ConfigError> {
    no_block(d)?;
    if seen {
        return Err(ConfigError::invalid(
            &d.span,
            format!("\"{}\" directive is duplicate", d.name),
        ));
    }
    time(d, one(d)?)
}

pub(crate) fn number(d: &Directive, a: &Arg) -> Result<u32, ConfigError> {
    a.value
        .parse::<u32>()
        .map_err(|_| bad(a, d, "a non-negative integer"))
}
