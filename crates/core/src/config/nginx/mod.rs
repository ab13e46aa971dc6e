//! The nginx.conf front end: reads a whole nginx.conf (with `include`s)
//! and builds the typed model from the directives vigil implements.
//!
//! Directives with no meaning for vigil (`worker_processes`, `pid`,
//! `events {}`, temp paths, ...) are accepted and reported once as
//! ignored. A directive that would change behaviour and that vigil does
//! not implement is an error, never silently dropped.

mod http;
pub mod syntax;
mod upstream;

use std::collections::BTreeMap;
use std::path::Path;

use super::{Config, ConfigError, Origin, Resolver};
use syntax::{Arg, Directive, Span};

/// A loaded nginx.conf.
#[derive(Debug)]
pub struct Loaded {
    /// The model.
    pub config: Config,
    /// Directives accepted without effect: name and first place seen.
    pub ignored: Vec<(String, String)>,
}

/// Read an nginx.conf file (includes resolve against its directory, as
/// nginx resolves them against the conf prefix).
pub fn load_file(path: &Path, resolve: Resolver<'_>) -> Result<Loaded, ConfigError> {
    let directives = syntax::parse_file(path)?;
    build(&directives, resolve)
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
    let directives = syntax::parse_str_with(src, file, prefix, includes)?;
    build(&directives, resolve)
}

/// Build the model from parsed directives.
pub fn build(directives: &[Directive], resolve: Resolver<'_>) -> Result<Loaded, ConfigError> {
    let mut cx = Context {
        resolve,
        ignored: BTreeMap::new(),
        config: Config::default(),
        listens: Default::default(),
    };
    // `upstream` and `server` blocks may also stand at the top level of a
    // file that holds only them (the checker's SRC file, a conf.d snippet).
    let mut http_blocks = Vec::new();
    let mut loose = Vec::new();
    for d in directives {
        match d.name.as_str() {
            "http" => http_blocks.push(block(d)?),
            "upstream" | "server" => loose.push(d.clone()),
            "events"
            | "worker_processes"
            | "pid"
            | "error_log"
            | "user"
            | "worker_rlimit_nofile"
            | "daemon"
            | "master_process"
            | "worker_cpu_affinity"
            | "worker_priority"
            | "worker_shutdown_timeout"
            | "timer_resolution"
            | "env"
            | "pcre_jit"
            | "thread_pool"
            | "lock_file"
            | "working_directory"
            | "worker_rlimit_core" => cx.ignore(d),
            "stream" | "mail" | "load_module" => {
                return Err(unsupported(d, "vigil proxies HTTP only"));
            }
            _ => return Err(unknown(d, "main")),
        }
    }
    if http_blocks.len() > 1 {
        return Err(ConfigError::invalid(
            &directives[1].span,
            "\"http\" directive is duplicate",
        ));
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
    })
}

pub(crate) struct Context<'r> {
    pub(crate) resolve: Resolver<'r>,
    pub(crate) ignored: BTreeMap<String, Span>,
    pub(crate) config: Config,
    /// Every address listened on so far, for nginx's cross-server checks.
    pub(crate) listens: super::validate::ListenBook,
}

impl Context<'_> {
    pub(crate) fn ignore(&mut self, d: &Directive) {
        self.ignored
            .entry(d.name.clone())
            .or_insert_with(|| d.span.clone());
    }
}

pub(crate) fn origin(span: &Span) -> Origin {
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
    ConfigError::invalid(
        &d.span,
        format!(
            "unknown or unsupported directive \"{}\" in {context} context (vigil refuses directives it does not implement rather than ignore them)",
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
    super::value::parse_time(&a.value)
        .map_err(|e| ConfigError::invalid(&a.span, format!("\"{}\": {e}", d.name)))
}

pub(crate) fn number(d: &Directive, a: &Arg) -> Result<u32, ConfigError> {
    a.value
        .parse::<u32>()
        .map_err(|_| bad(a, d, "a non-negative integer"))
}
