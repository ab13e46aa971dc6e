//! The main context's process directives (`pid`, `error_log`, `daemon`,
//! `master_process`, `worker_processes`, `user`, `worker_rlimit_nofile`),
//! parsed as nginx's core and errlog modules parse them. `vigil serve`
//! ignores them (it logs to standard error and writes no pid file); the
//! nginx command line (`vigil -p ... -c ...`, or the binary named `nginx`)
//! honours them.

use std::path::PathBuf;

use super::syntax::{Arg, Directive, Span};
use super::{args, bad, no_block, on_off, unsupported};
use crate::ConfigError;

/// The process directives of one configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Process {
    /// `pid FILE;` (nginx's default: the compiled-in path).
    pub pid: Option<(PathBuf, Span)>,
    /// Every `error_log` of the main context, in order.
    pub error_logs: Vec<ErrorLog>,
    /// `daemon on|off;` (nginx's default: on).
    pub daemon: Option<bool>,
    /// `master_process on|off;` (nginx's default: on; vigil is one process
    /// either way).
    pub master_process: Option<bool>,
    /// `worker_processes N|auto;` (nginx's default: 1).
    pub worker_processes: Option<Workers>,
    /// `user USER [GROUP];`.
    pub user: Option<User>,
    /// `worker_rlimit_nofile N;`.
    pub worker_rlimit_nofile: Option<u64>,
}

/// One `error_log`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorLog {
    /// Where it writes.
    pub target: LogTarget,
    /// The least severe level written.
    pub level: Level,
    /// Where it was written.
    pub at: Span,
}

/// Where an error log writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogTarget {
    /// `stderr`.
    Stderr,
    /// A file, appended to (relative: to the prefix).
    File(PathBuf),
}

/// nginx's log levels, most severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `emerg`.
    Emerg,
    /// `alert`.
    Alert,
    /// `crit`.
    Crit,
    /// `error` (the default).
    Error,
    /// `warn`.
    Warn,
    /// `notice`.
    Notice,
    /// `info`.
    Info,
    /// `debug` (and nginx's `debug_*` masks).
    Debug,
}

/// `worker_processes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workers {
    /// A number.
    Count(usize),
    /// `auto`: one per core.
    Auto,
}

/// `user USER [GROUP]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// The user name.
    pub user: String,
    /// The group (nginx's default: the user's name as a group).
    pub group: Option<String>,
    /// Where it was written.
    pub at: Span,
}

// === impl Level ===

impl Level {
    /// Its name in nginx.conf and in the error log's `[level]`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Emerg => "emerg",
            Level::Alert => "alert",
            Level::Crit => "crit",
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Notice => "notice",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }

    /// The level named `s` (nginx's `debug_core` .. `debug_stream` masks
    /// are `debug`).
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "emerg" => Level::Emerg,
            "alert" => Level::Alert,
            "crit" => Level::Crit,
            "error" => Level::Error,
            "warn" => Level::Warn,
            "notice" => Level::Notice,
            "info" => Level::Info,
            "debug" | "debug_core" | "debug_alloc" | "debug_mutex" | "debug_event"
            | "debug_http" | "debug_mail" | "debug_stream" => Level::Debug,
            _ => return None,
        })
    }
}

// === impl Process ===

impl Process {
    /// Take `d` if it is a process directive; None otherwise.
    pub(crate) fn directive(&mut self, d: &Directive) -> Option<Result<(), ConfigError>> {
        let r = match d.name.as_str() {
            "pid" => once(d, self.pid.is_some())
                .and_then(|()| path(d))
                .map(|p| self.pid = Some((p, d.span.clone()))),
            "error_log" => error_log(d).map(|l| self.error_logs.push(l)),
            "daemon" => once(d, self.daemon.is_some())
                .and_then(|()| on_off(d))
                .map(|v| self.daemon = Some(v)),
            "master_process" => once(d, self.master_process.is_some())
                .and_then(|()| on_off(d))
                .map(|v| self.master_process = Some(v)),
            "worker_processes" => once(d, self.worker_processes.is_some())
                .and_then(|()| workers(d))
                .map(|w| self.worker_processes = Some(w)),
            "user" => once(d, self.user.is_some())
                .and_then(|()| user(d))
                .map(|u| self.user = Some(u)),
            "worker_rlimit_nofile" => once(d, self.worker_rlimit_nofile.is_some())
                .and_then(|()| args(d, 1, 1))
                .and_then(|a| {
                    a[0].value
                        .parse::<u64>()
                        .map_err(|_| bad(&a[0], d, "a number"))
                })
                .map(|n| self.worker_rlimit_nofile = Some(n)),
            _ => return None,
        };
        Some(r)
    }
}

/// nginx's `"NAME" directive is duplicate` for directives set once.
fn once(d: &Directive, seen: bool) -> Result<(), ConfigError> {
    no_block(d)?;
    if seen {
        return Err(ConfigError::invalid(
            &d.span,
            format!("\"{}\" directive is duplicate", d.name),
        ));
    }
    Ok(())
}

fn path(d: &Directive) -> Result<PathBuf, ConfigError> {
    let a = &args(d, 1, 1)?[0];
    nonempty(d, a).map(|()| PathBuf::from(&a.value))
}

fn nonempty(d: &Directive, a: &Arg) -> Result<(), ConfigError> {
    if a.value.is_empty() {
        return Err(bad(a, d, "a file name"));
    }
    Ok(())
}

/// `error_log FILE|stderr [LEVEL]` (nginx's `ngx_log_set_log`, without
/// `syslog:` and `memory:`, which vigil refuses).
pub(crate) fn error_log(d: &Directive) -> Result<ErrorLog, ConfigError> {
    let a = args(d, 1, 9)?;
    let target = match a[0].value.as_str() {
        "stderr" => LogTarget::Stderr,
        v if v.starts_with("syslog:") || v.starts_with("memory:") => {
            return Err(unsupported(
                d,
                "vigil writes its error log to a file or stderr, not to syslog or memory",
            ))
        }
        _ => {
            nonempty(d, &a[0])?;
            LogTarget::File(PathBuf::from(&a[0].value))
        }
    };
    let mut level = Level::Error;
    if let Some(l) = a.get(1) {
        level = Level::parse(&l.value).ok_or_else(|| {
            ConfigError::invalid(&l.span, format!("invalid log level \"{}\"", l.value))
        })?;
        // nginx takes several debug masks (`debug_http debug_event`), and
        // one plain level only.
        for m in &a[2..] {
            match Level::parse(&m.value) {
                Some(Level::Debug) if m.value != "debug" && l.value != "debug" => {}
                Some(_) => {
                    return Err(ConfigError::invalid(
                        &m.span,
                        format!("duplicate log level \"{}\"", m.value),
                    ))
                }
                None => {
                    return Err(ConfigError::invalid(
                        &m.span,
                        format!("invalid log level \"{}\"", m.value),
                    ))
                }
            }
        }
    }
    Ok(ErrorLog {
        target,
        level,
        at: d.span.clone(),
    })
}

fn workers(d: &Directive) -> Result<Workers, ConfigError> {
    let a = &args(d, 1, 1)?[0];
    if a.value == "auto" {
        return Ok(Workers::Auto);
    }
    match a.value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(Workers::Count(n)),
        // nginx accepts 0 (no worker: the master serves nothing); vigil
        // needs a worker to serve.
        Ok(_) => Err(bad(a, d, "a positive number or \"auto\"")),
        Err(_) => Err(ConfigError::invalid(
            &a.span,
            format!("invalid value \"{}\" in \"{}\" directive", a.value, d.name),
        )),
    }
}

fn user(d: &Directive) -> Result<User, ConfigError> {
    let a = args(d, 1, 2)?;
    Ok(User {
        user: a[0].value.clone(),
        group: a.get(1).map(|g| g.value.clone()),
        at: d.span.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nginx::syntax::parse_str;
    use std::path::Path;

    fn process(src: &str) -> Result<Process, ConfigError> {
        let d = parse_str(src, Path::new("t.conf"), Path::new("."))?;
        let mut p = Process::default();
        for d in &d {
            p.directive(d).expect("a process directive")?;
        }
        Ok(p)
    }

    fn err(src: &str) -> String {
        process(src).expect_err("refused").to_string()
    }

    #[test]
    fn the_process_directives_are_read_as_nginx_reads_them() {
        let p = process(
            "pid /run/x.pid; error_log logs/e.log warn; error_log stderr; daemon off; \
             master_process off; worker_processes auto; user www-data adm; worker_rlimit_nofile 4096;",
        )
        .expect("valid");
        assert_eq!(p.pid.map(|p| p.0), Some(PathBuf::from("/run/x.pid")));
        assert_eq!(p.error_logs.len(), 2);
        assert_eq!(p.error_logs[0].target, LogTarget::File("logs/e.log".into()));
        assert_eq!(p.error_logs[0].level, Level::Warn);
        assert_eq!(p.error_logs[1].target, LogTarget::Stderr);
        assert_eq!(p.error_logs[1].level, Level::Error);
        assert_eq!(p.daemon, Some(false));
        assert_eq!(p.master_process, Some(false));
        assert_eq!(p.worker_processes, Some(Workers::Auto));
        let u = p.user.expect("user");
        assert_eq!(
            (u.user.as_str(), u.group.as_deref()),
            ("www-data", Some("adm"))
        );
        assert_eq!(p.worker_rlimit_nofile, Some(4096));
        let p = process("error_log e.log debug_http debug_event; worker_processes 3;").expect("ok");
        assert_eq!(p.error_logs[0].level, Level::Debug);
        assert_eq!(p.worker_processes, Some(Workers::Count(3)));
    }

    #[test]
    fn bad_process_directives_are_refused_in_nginx_words() {
        assert!(err("pid a; pid b;").ends_with("\"pid\" directive is duplicate"));
        assert!(err("daemon maybe;").contains("invalid value \"maybe\""));
        assert!(err("error_log e.log loud;").ends_with("invalid log level \"loud\""));
        assert!(err("error_log e.log warn error;").ends_with("duplicate log level \"error\""));
        assert!(err("error_log syslog:server=1.2.3.4;").contains("not to syslog"));
        assert!(err("worker_processes many;").contains("invalid value \"many\""));
        assert!(err("worker_processes 0;").contains("a positive number"));
        assert!(err("worker_rlimit_nofile lots;").contains("invalid value \"lots\""));
        assert!(err("user;").contains("invalid number of arguments"));
    }
}
