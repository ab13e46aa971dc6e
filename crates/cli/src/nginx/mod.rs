//! nginx's command line and process habits, for `vigil` standing in for
//! the nginx binary: `vigil -p PREFIX -c FILE ...`, `vigil nginx ...`, or
//! the binary installed (or linked) under the name `nginx`.
//!
//! - `-v`, `-V` (a configure line naming what vigil lacks, see
//!   [`version`]), `-h`;
//! - `-t`, `-T`, `-q`: test (and dump) the configuration, in nginx's words;
//! - `-s stop|quit|reopen|reload`: signal the process of the pid file;
//! - otherwise serve: `-p` (default `/usr/share/nginx/`) is the prefix
//!   relative paths resolve against (vigil serves from it as its working
//!   directory), `-c` (default `/etc/nginx/nginx.conf`) the file, `-g`
//!   directives read before it, `-e` the error log until the
//!   configuration names one; `pid`, `error_log`, `daemon`,
//!   `worker_processes`, `worker_rlimit_nofile`, `user` honoured as
//!   docs/nginx-cli.md says; SIGHUP reload, SIGQUIT graceful stop, SIGTERM
//!   and SIGINT fast stop, SIGUSR1 reopen of every log.

mod daemon;
mod errlog;
mod options;
mod pidfile;
mod version;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use vigil_config::nginx::process::{Level, LogTarget, Process, Workers};
use vigil_config::ConfigError;

use crate::cmd::serve::{self, Grace, Hooks, Launch};
use crate::load::{self, Kind};
use crate::stack;

/// Whether the command line is nginx's: the program is named `nginx`, or
/// its first argument is `nginx` or one of nginx's flags (`-V`, `-t`,
/// `-p`, ...; `-h` and `--help`/`--version` stay vigil's own).
pub(crate) fn wants(argv: &[OsString]) -> Option<usize> {
    let named_nginx = argv
        .first()
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n == "nginx");
    if named_nginx {
        return Some(1);
    }
    let first = argv.get(1)?.to_str()?;
    if first == "nginx" {
        return Some(2);
    }
    let nginx_flag = first.len() >= 2
        && first.starts_with('-')
        && !first.starts_with("--")
        && first[1..].starts_with(['v', 'V', 't', 'T', 'q', 's', 'p', 'c', 'e', 'g', '?']);
    nginx_flag.then_some(1)
}

/// Run nginx's command line: `argv[skip..]` are its arguments.
pub(crate) fn main(argv: &[OsString], skip: usize) -> ExitCode {
    let args = &argv[skip.min(argv.len())..];
    let o = match options::parse(args) {
        Ok(o) => o,
        Err(e) => return fail(&e),
    };
    if o.version {
        let mut text = version::version_line();
        text.push('\n');
        if o.help {
            text.push_str(&version::help());
        }
        if o.configure {
            text.push_str(&version::configure());
            text.push('\n');
        }
        say(&text);
        if !o.test {
            return ExitCode::SUCCESS;
        }
    }
    let paths = match Paths::of(&o) {
        Ok(p) => p,
        Err(e) => return fail(&format!("[emerg] {e}")),
    };
    let startup = StartupLog(paths.error_log.clone());
    let loader = load::Loader {
        path: paths.conf.clone(),
        kind: Kind::Nginx,
        globals: o.globals.clone().unwrap_or_default(),
        listen: None,
    };
    let loaded = loader.load().map_err(|e| nginx_words(&e));
    if o.test {
        return test(&o, &paths, &startup, loaded.map(|_| ()));
    }
    let loaded = match loaded {
        Ok(l) => l,
        Err(e) => return startup.failed(Level::Emerg, &e),
    };
    if let Some(signal) = o.signal {
        startup.log(Level::Notice, "signal process started");
        let pid = paths.pid_file(&loaded.process);
        return match pidfile::send(&pid, signal) {
            Ok(()) => ExitCode::SUCCESS,
            Err((level, e)) => startup.failed(level, &e),
        };
    }
    if loaded.process.daemon.unwrap_or(true) && !daemon::is_child() {
        return daemon::start(argv.first().map_or(OsStr::new("nginx"), |a| a), args);
    }
    match run(paths, loader, loaded) {
        Ok(code) => code,
        Err(e) => startup.failed(Level::Emerg, &format!("{e:#}")),
    }
}

/// nginx's log until the configuration's logs are open: `-e`'s target
/// (default standard error) at `notice`. A line goes there in the error
/// log's format; when that is not standard error, what is `warn` or worse
/// also goes to standard error as `nginx: [LEVEL] MESSAGE`
/// (`ngx_log_error_core`'s rule).
struct StartupLog(LogTarget);

impl StartupLog {
    fn log(&self, level: Level, message: &str) {
        let mut line = String::new();
        let _ = vigil_proxy::write_error_log_time(&mut line, std::time::SystemTime::now());
        let pid = std::process::id();
        line.push_str(&format!(" [{}] {pid}#{pid}: {message}\n", level.name()));
        match &self.0 {
            LogTarget::Stderr => say(&line),
            LogTarget::File(path) => {
                use std::io::Write as _;
                let _ = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(path)
                    .and_then(|mut f| f.write_all(line.as_bytes()));
                if level <= Level::Warn {
                    say(&format!("nginx: [{}] {message}\n", level.name()));
                }
            }
        }
    }

    /// Log `message` at `level` and exit 1.
    fn failed(&self, level: Level, message: &str) -> ExitCode {
        self.log(level, message);
        ExitCode::from(1)
    }
}

/// nginx's paths for this run.
#[derive(Clone, Debug)]
struct Paths {
    /// `-p`, absolute, with a trailing `/`.
    prefix: PathBuf,
    /// `-c`, absolute.
    conf: PathBuf,
    /// `-e`, or the compiled-in default.
    error_log: LogTarget,
}

impl Paths {
    fn of(o: &options::Options) -> Result<Paths, String> {
        let cwd =
            std::env::current_dir().map_err(|e| format!("getcwd() failed ({})", errno_text(&e)))?;
        let mut prefix = cwd.join(o.prefix.as_deref().unwrap_or(Path::new(version::PREFIX)));
        // nginx appends the slash it needs.
        prefix.push("");
        let conf = prefix.join(o.conf.as_deref().unwrap_or(Path::new(version::CONF_PATH)));
        let error_log = match o.error_log.as_deref() {
            Some(p) if p == Path::new("stderr") => LogTarget::Stderr,
            Some(p) => LogTarget::File(prefix.join(p)),
            None if version::ERROR_LOG_PATH == "stderr" => LogTarget::Stderr,
            None => LogTarget::File(prefix.join(version::ERROR_LOG_PATH)),
        };
        Ok(Paths {
            prefix,
            conf,
            error_log,
        })
    }

    fn pid_file(&self, p: &Process) -> PathBuf {
        self.prefix.join(
            p.pid
                .as_ref()
                .map_or(Path::new(version::PID_PATH), |(path, _)| path),
        )
    }

    /// The error logs of `p` (relative files against the prefix), else
    /// `-e`'s at `error`.
    fn error_logs(&self, p: &Process) -> Vec<errlog::Spec> {
        if p.error_logs.is_empty() {
            return vec![(self.error_log.clone(), Level::Error)];
        }
        p.error_logs
            .iter()
            .map(|l| match &l.target {
                LogTarget::File(f) => (LogTarget::File(self.prefix.join(f)), l.level),
                LogTarget::Stderr => (LogTarget::Stderr, l.level),
            })
            .collect()
    }
}

/// `-t` / `-T`.
fn test(
    o: &options::Options,
    paths: &Paths,
    startup: &StartupLog,
    loaded: Result<(), String>,
) -> ExitCode {
    let conf = paths.conf.display();
    if let Err(e) = loaded {
        startup.log(Level::Emerg, &e);
        return fail(&format!("configuration file {conf} test failed"));
    }
    if !o.quiet {
        say(&format!(
            "nginx: the configuration file {conf} syntax is ok\nnginx: configuration file {conf} test is successful\n"
        ));
    }
    if o.dump {
        if let Err(e) = dump(&paths.conf) {
            return startup.failed(Level::Emerg, &e);
        }
    }
    ExitCode::SUCCESS
}

/// `-T`: every file of the configuration, as nginx prints them.
fn dump(conf: &Path) -> Result<(), String> {
    use std::io::Write as _;
    let directives = vigil_config::nginx::syntax::parse_file(conf)
        .map_err(|e| config_words(&ConfigError::from(e)))?;
    let mut files: Vec<PathBuf> = vec![conf.to_path_buf()];
    fn walk(ds: &[vigil_config::nginx::syntax::Directive], files: &mut Vec<PathBuf>) {
        for d in ds {
            if !files.iter().any(|f| *f == *d.span.file) {
                files.push((*d.span.file).clone());
            }
            if let Some(b) = &d.block {
                walk(b, files);
            }
        }
    }
    walk(&directives, &mut files);
    let mut out = std::io::stdout().lock();
    for f in files {
        let text = std::fs::read(&f).map_err(|e| os_failed("open()", &f, &e))?;
        let r = writeln!(out, "# configuration file {}:", f.display())
            .and_then(|()| out.write_all(&text))
            .and_then(|()| writeln!(out));
        if r.is_err() {
            break;
        }
    }
    Ok(())
}

/// Serve until stopped.
fn run(paths: Paths, loader: load::Loader, loaded: load::Loaded) -> anyhow::Result<ExitCode> {
    let child = daemon::is_child();
    if child {
        daemon::detach();
    }
    let logs = errlog::ErrorLogs::install(&paths.error_logs(&loaded.process))
        .map_err(anyhow::Error::msg)?;
    // Relative paths of the configuration (access logs, certificates,
    // `root`) resolve against the prefix, as nginx resolves them.
    if let Err(e) = std::env::set_current_dir(&paths.prefix) {
        tracing::warn!(
            "{}; relative paths resolve against {}",
            os_failed("chdir()", &paths.prefix, &e),
            std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_else(|_| "the working directory".into())
        );
    }
    // Honoured here, or said by `warn_user`.
    const HONOURED: [&str; 7] = [
        "user",
        "pid",
        "error_log",
        "daemon",
        "worker_processes",
        "worker_rlimit_nofile",
        "master_process",
    ];
    for (name, at) in loaded
        .ignored
        .iter()
        .filter(|(n, _)| !HONOURED.contains(&n.as_str()))
    {
        tracing::info!(directive = %name, at = %at, "directive has no meaning for vigil and is ignored");
    }
    let process = &loaded.process;
    match process.worker_rlimit_nofile {
        Some(n) => {
            if let Err(e) = rlimit::Resource::NOFILE.set(n, n) {
                tracing::error!("setrlimit(RLIMIT_NOFILE, {n}) failed ({})", errno_text(&e));
            }
        }
        None => crate::raise_nofile_limit(),
    }
    if let Some(u) = &process.user {
        warn_user(u);
    }
    let threads = match process.worker_processes {
        Some(Workers::Count(n)) => n,
        Some(Workers::Auto) => std::thread::available_parallelism().map_or(1, |n| n.get()),
        // nginx's default: one worker process.
        None => 1,
    };
    let admin_listen = match std::env::var("VIGIL_ADMIN_LISTEN") {
        Ok(a) => Some(
            a.parse()
                .map_err(|e| anyhow::anyhow!("VIGIL_ADMIN_LISTEN=\"{a}\": {e}"))?,
        ),
        Err(_) => None,
    };
    let hooks = NginxHooks {
        pid: paths.pid_file(process),
        paths: paths.clone(),
        logs,
        child,
        wrote_pid: false,
    };
    let launch = Launch {
        grace: Grace {
            given: None,
            conf: loaded.config.shutdown_timeout,
        },
        loader,
        options: stack::Options {
            threads,
            spool_dir: std::env::temp_dir(),
            no_admin: admin_listen.is_none(),
            admin_listen,
            admin_token: std::env::var("VIGIL_ADMIN_TOKEN").ok(),
            admin_hosts: Vec::new(),
            no_dashboard: false,
            fleet: None,
        },
        hooks: Box::new(hooks),
    };
    serve::control_runtime()?.block_on(serve::serve(launch, loaded.config))
}

/// `user`: vigil is one process and does not change its user; as root
/// that is said at start (docs/nginx-cli.md), as another user nginx's
/// own warning.
fn warn_user(u: &vigil_config::nginx::process::User) {
    let at = format!("{}:{}", u.at.file.display(), u.at.line);
    if rustix::process::geteuid().is_root() {
        if u.user == "root" {
            return;
        }
        tracing::warn!(
            "the \"user\" directive is not applied by vigil: it runs as one process and keeps the user it was started as (root); start it as \"{}\" with the capability to bind low ports (docs/nginx-cli.md) in {at}",
            u.user
        );
    } else {
        tracing::warn!(
            "the \"user\" directive makes sense only if the master process runs with super-user privileges, ignored in {at}"
        );
    }
}

/// The pid file and the error logs around a running server.
struct NginxHooks {
    pid: PathBuf,
    paths: Paths,
    logs: errlog::ErrorLogs,
    child: bool,
    wrote_pid: bool,
}

impl Hooks for NginxHooks {
    fn ready(&mut self, _stack: &stack::Stack) -> anyhow::Result<()> {
        pidfile::write(&self.pid).map_err(anyhow::Error::msg)?;
        self.wrote_pid = true;
        if self.child {
            daemon::ready();
        }
        Ok(())
    }

    fn reloaded(&mut self, process: &Process) {
        if let Err(e) = self.logs.replace(&self.paths.error_logs(process)) {
            tracing::error!("{e}; the error logs stay as they were");
        }
        let pid = self.paths.pid_file(process);
        if pid != self.pid {
            match pidfile::write(&pid) {
                Ok(()) => {
                    pidfile::remove(&self.pid);
                    self.pid = pid;
                }
                Err(e) => tracing::error!("{e}"),
            }
        }
    }

    fn reopen(&mut self) {
        for e in self.logs.reopen() {
            tracing::error!("{e}; the error log is still written where it was");
        }
    }

    fn stopped(&mut self) {
        if self.wrote_pid {
            pidfile::remove(&self.pid);
        }
        tracing::info!("exit");
    }
}

/// `nginx: MESSAGE` on standard error, exit 1.
fn fail(message: &str) -> ExitCode {
    say(&format!("nginx: {message}\n"));
    ExitCode::from(1)
}

fn say(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// `errno: text`, as nginx prints an OS error (`2: No such file or directory`).
pub(crate) fn errno_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text).to_string();
    match e.raw_os_error() {
        Some(n) => format!("{n}: {text}"),
        None => text,
    }
}

/// `CALL "PATH" failed (ERRNO: TEXT)`, nginx's words for a failed call.
pub(crate) fn os_failed(call: &str, path: &Path, e: &std::io::Error) -> String {
    format!("{call} \"{}\" failed ({})", path.display(), errno_text(e))
}

/// A configuration error in nginx's form: `MESSAGE in FILE:LINE`.
fn nginx_words(e: &anyhow::Error) -> String {
    match e.downcast_ref::<ConfigError>() {
        Some(c) => config_words(c),
        None => format!("{e:#}"),
    }
}

fn config_words(e: &ConfigError) -> String {
    use vigil_config::nginx::syntax::SyntaxError;
    let place = |file: &Path, line: u32| format!("{}:{line}", file.display());
    match e {
        ConfigError::Io { path, source } => os_failed("open()", path, source),
        ConfigError::Syntax(SyntaxError::Io { path, span, source }) => {
            let open = os_failed("open()", path, source);
            match span {
                Some(s) => format!("{open} in {}", place(&s.file, s.line)),
                None => open,
            }
        }
        ConfigError::Syntax(SyntaxError::Parse { span, message }) => {
            format!("{message} in {}", place(&span.file, span.line))
        }
        ConfigError::Invalid { at, message } => {
            // `FILE:LINE:COL` → `FILE:LINE`.
            let mut parts = at.rsplitn(3, ':');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(col), Some(line), Some(file))
                    if col.parse::<u32>().is_ok() && line.parse::<u32>().is_ok() =>
                {
                    format!("{message} in {file}:{line}")
                }
                _ => e.to_string(),
            }
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn nginxs_command_line_is_told_from_vigils() {
        assert_eq!(wants(&argv(&["/usr/sbin/nginx", "-t"])), Some(1));
        assert_eq!(wants(&argv(&["nginx"])), Some(1));
        assert_eq!(wants(&argv(&["vigil", "nginx", "-t"])), Some(2));
        assert_eq!(wants(&argv(&["vigil", "-V"])), Some(1));
        assert_eq!(
            wants(&argv(&["vigil", "-p", "/x/", "-c", "a.conf"])),
            Some(1)
        );
        assert_eq!(wants(&argv(&["vigil", "-tq"])), Some(1));
        assert_eq!(wants(&argv(&["vigil", "serve", "--nginx-conf", "x"])), None);
        assert_eq!(wants(&argv(&["vigil", "--version"])), None);
        assert_eq!(wants(&argv(&["vigil", "-h"])), None);
        assert_eq!(wants(&argv(&["vigil"])), None);
    }

    #[test]
    fn configuration_errors_read_as_nginxs() {
        let e = ConfigError::Invalid {
            at: "/etc/nginx/nginx.conf:12:5".into(),
            message: "unknown directive \"foo\"".into(),
        };
        assert_eq!(
            config_words(&e),
            "unknown directive \"foo\" in /etc/nginx/nginx.conf:12"
        );
        let e = ConfigError::Io {
            path: "/nope.conf".into(),
            source: std::io::Error::from_raw_os_error(2),
        };
        assert_eq!(
            config_words(&e),
            "open() \"/nope.conf\" failed (2: No such file or directory)"
        );
    }
}
