//! nginx's error log for the nginx command line: every `error_log FILE
//! [LEVEL]` of the main context (or `-e`'s file, else standard error), in
//! nginx's line format
//!
//! ```text
//! 2026/12/07 23:10:00 [error] 4242#4243: message, key: value, key: value
//! ```
//!
//! vigil's tracing levels map to nginx's: ERROR → `error`, WARN → `warn`,
//! INFO → `notice` (vigil logs at INFO what nginx logs at notice: start,
//! reload, signals), DEBUG and TRACE → `debug`. A line goes to every log
//! whose level admits it. SIGUSR1 reopens the files by their paths
//! (logrotate); a reload that names other files swaps them in.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::reload;
use vigil_config::nginx::process::{Level, LogTarget};

/// Where one log writes, and from which level.
#[derive(Debug)]
struct Sink {
    level: Level,
    out: Out,
}

#[derive(Debug)]
enum Out {
    Stderr,
    File { path: PathBuf, file: File },
}

/// The error logs, shared by the tracing layer and the signal loop.
#[derive(Clone)]
pub(crate) struct ErrorLogs {
    sinks: Arc<RwLock<Vec<Sink>>>,
    filter: reload::Handle<LevelFilter, tracing_subscriber::Registry>,
}

/// The layer that writes events to [`ErrorLogs`].
struct Writer {
    sinks: Arc<RwLock<Vec<Sink>>>,
}

/// One log as the configuration gives it: a target (relative paths
/// against the prefix, nginx's rule) and a level.
pub(crate) type Spec = (LogTarget, Level);

/// Open every log of `specs`; an error names the file as nginx does
/// (`open() "/x/error.log" failed (13: Permission denied)`).
fn open_all(specs: &[Spec]) -> Result<Vec<Sink>, String> {
    specs
        .iter()
        .map(|(target, level)| {
            let out = match target {
                LogTarget::Stderr => Out::Stderr,
                LogTarget::File(path) => Out::File {
                    file: open(path)?,
                    path: path.clone(),
                },
            };
            Ok(Sink { level: *level, out })
        })
        .collect()
}

fn open(path: &Path) -> Result<File, String> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| super::os_failed("open()", path, &e))
}

/// The least severe level any sink writes, as tracing's filter.
fn filter_of(sinks: &[Sink]) -> LevelFilter {
    match sinks.iter().map(|s| s.level).max() {
        None => LevelFilter::OFF,
        Some(Level::Debug) => LevelFilter::TRACE,
        Some(Level::Info | Level::Notice) => LevelFilter::INFO,
        Some(Level::Warn) => LevelFilter::WARN,
        Some(_) => LevelFilter::ERROR,
    }
}

/// nginx's level of a tracing event.
fn level_of(l: &tracing::Level) -> Level {
    match *l {
        tracing::Level::ERROR => Level::Error,
        tracing::Level::WARN => Level::Warn,
        tracing::Level::INFO => Level::Notice,
        _ => Level::Debug,
    }
}

// === impl ErrorLogs ===

impl ErrorLogs {
    /// Open `specs` and make them the process's log. `VIGIL_LOG` (a
    /// tracing filter, as for `vigil serve`) narrows what is written.
    pub(crate) fn install(specs: &[Spec]) -> Result<Self, String> {
        let sinks = Arc::new(RwLock::new(open_all(specs)?));
        let initial = filter_of(&read(&sinks));
        let (filter, handle) = reload::Layer::new(initial);
        let env = std::env::var("VIGIL_LOG")
            .ok()
            .and_then(|v| tracing_subscriber::EnvFilter::try_new(v).ok());
        let writer = Writer {
            sinks: sinks.clone(),
        };
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(env)
            .with(writer)
            .try_init();
        Ok(Self {
            sinks,
            filter: handle,
        })
    }

    /// SIGUSR1: every file opened again by its path. A file that cannot be
    /// opened keeps being written where it was; its error is returned.
    pub(crate) fn reopen(&self) -> Vec<String> {
        let mut failed = Vec::new();
        let mut sinks = self.sinks.write().unwrap_or_else(|p| p.into_inner());
        for s in sinks.iter_mut() {
            if let Out::File { path, file } = &mut s.out {
                match open(path) {
                    Ok(f) => *file = f,
                    Err(e) => failed.push(e),
                }
            }
        }
        failed
    }

    /// A reload's logs: all opened, then swapped in; on an error the
    /// running logs stay.
    pub(crate) fn replace(&self, specs: &[Spec]) -> Result<(), String> {
        let new = open_all(specs)?;
        let filter = filter_of(&new);
        *self.sinks.write().unwrap_or_else(|p| p.into_inner()) = new;
        self.filter
            .modify(|f| *f = filter)
            .map_err(|e| format!("setting the error log's level: {e}"))
    }
}

fn read(sinks: &RwLock<Vec<Sink>>) -> std::sync::RwLockReadGuard<'_, Vec<Sink>> {
    sinks.read().unwrap_or_else(|p| p.into_inner())
}

// === impl Writer ===

impl<S: Subscriber> Layer<S> for Writer {
    fn on_event(&self, event: &Event<'_>, _cx: Context<'_, S>) {
        let level = level_of(event.metadata().level());
        let sinks = read(&self.sinks);
        if !sinks.iter().any(|s| s.level >= level) {
            return;
        }
        let line = format_line(level, event);
        for s in sinks.iter().filter(|s| s.level >= level) {
            // A log that cannot be written (a full disk, a closed stderr)
            // is not reported again: there is nowhere to report it.
            let _ = match &s.out {
                Out::Stderr => std::io::stderr().lock().write_all(line.as_bytes()),
                Out::File { file, .. } => (&*file).write_all(line.as_bytes()),
            };
        }
    }
}

/// `YYYY/MM/DD HH:MM:SS [level] PID#TID: message, key: value\n`.
fn format_line(level: Level, event: &Event<'_>) -> String {
    let mut line = String::with_capacity(160);
    let _ = vigil_proxy::write_error_log_time(&mut line, std::time::SystemTime::now());
    let _ = write!(
        line,
        " [{}] {}#{}: ",
        level.name(),
        std::process::id(),
        thread_number()
    );
    let mut fields = Fields {
        message: String::new(),
        rest: String::new(),
    };
    event.record(&mut fields);
    line.push_str(&fields.message);
    if fields.message.is_empty() {
        line.push_str(fields.rest.trim_start_matches(", "));
    } else {
        line.push_str(&fields.rest);
    }
    line.push('\n');
    line
}

/// A small number for the thread (nginx prints its worker's tid).
fn thread_number() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    ID.with(|id| *id)
}

struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, ", {}: {value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, ", {}: {value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracing_levels_map_to_nginx_levels() {
        assert_eq!(level_of(&tracing::Level::ERROR), Level::Error);
        assert_eq!(level_of(&tracing::Level::WARN), Level::Warn);
        assert_eq!(level_of(&tracing::Level::INFO), Level::Notice);
        assert_eq!(level_of(&tracing::Level::DEBUG), Level::Debug);
        let sink = |level| Sink {
            level,
            out: Out::Stderr,
        };
        assert_eq!(filter_of(&[sink(Level::Error)]), LevelFilter::ERROR);
        assert_eq!(filter_of(&[sink(Level::Crit)]), LevelFilter::ERROR);
        assert_eq!(
            filter_of(&[sink(Level::Error), sink(Level::Notice)]),
            LevelFilter::INFO
        );
        assert_eq!(filter_of(&[sink(Level::Debug)]), LevelFilter::TRACE);
        assert_eq!(filter_of(&[]), LevelFilter::OFF);
    }
}
