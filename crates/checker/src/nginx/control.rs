//! Acting on nginx: the test and reload commands, and the proof that a
//! reload took effect.
//!
//! Verification: `nginx -s reload` (a SIGHUP) is fire-and-forget, and a
//! master that cannot apply the new configuration (a port it cannot bind,
//! a file it cannot open) logs the error and keeps its old workers. A
//! successful reload always starts new worker processes. So before the
//! reload vigil reads the master's pid from its pid file and lists its
//! worker processes (children in `/proc` whose title is `nginx: worker
//! process`); the reload is verified once a worker appears that was not
//! there before and every worker that was there before has stopped
//! accepting (retitled `worker process is shutting down`, which nginx does
//! as it closes its listening sockets) or exited. Not so within
//! `verify_timeout` → unverified.

use std::collections::HashSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use tokio::time::Instant;

use super::SyncError;

/// A boxed future of the actuator.
pub type NginxFuture<'a> = Pin<Box<dyn Future<Output = Result<(), SyncError>> + Send + 'a>>;

/// What the sync loop needs from nginx (a trait so that the loop can be
/// tested in simulated time).
pub trait Nginx: Send + Sync + 'static {
    /// Test the configuration (`nginx -t`).
    fn test(&self) -> NginxFuture<'_>;
    /// Reload and verify.
    fn reload(&self) -> NginxFuture<'_>;
}

/// A command: an argument vector, or a line for `/bin/sh -c`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandLine {
    /// Run directly.
    Argv(Vec<String>),
    /// Run with `/bin/sh -c`.
    Shell(String),
}

/// The real nginx.
#[derive(Clone, Debug)]
pub struct NginxControl {
    /// Default `BIN -t -c NGINX_CONF`.
    pub test: CommandLine,
    /// Default `BIN -s reload -c NGINX_CONF`.
    pub reload: CommandLine,
    /// The master's pid file, for verification (default: the `pid` of
    /// NGINX_CONF, else `/run/nginx.pid`).
    pub pid_file: PathBuf,
    /// How long a reload may take to show new workers (default 10s).
    pub verify_timeout: Duration,
    /// How long a command may run (default 60s).
    pub command_timeout: Duration,
}

// === impl CommandLine ===

impl std::fmt::Display for CommandLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommandLine::Argv(v) => f.write_str(&v.join(" ")),
            CommandLine::Shell(s) => f.write_str(s),
        }
    }
}

impl CommandLine {
    /// Run to completion within `timeout`: success and the combined output.
    pub async fn run(&self, timeout: Duration) -> Result<(bool, String), SyncError> {
        let mut cmd = match self {
            CommandLine::Argv(v) => {
                let Some((bin, args)) = v.split_first() else {
                    return Err(SyncError::Command {
                        command: String::new(),
                        message: "empty command".into(),
                    });
                };
                let mut c = Command::new(bin);
                c.args(args);
                c
            }
            CommandLine::Shell(s) => {
                let mut c = Command::new("/bin/sh");
                c.arg("-c").arg(s);
                c
            }
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let err = |message: String| SyncError::Command {
            command: self.to_string(),
            message,
        };
        let child = cmd.spawn().map_err(|e| err(e.to_string()))?;
        let out = tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .map_err(|_| err(format!("no exit within {timeout:?}")))?
            .map_err(|e| err(e.to_string()))?;
        let mut text = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !stdout.trim().is_empty() {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(stdout.trim());
        }
        Ok((out.status.success(), text))
    }
}

// === impl NginxControl ===

impl NginxControl {
    /// `BIN -t -c CONF`, `BIN -s reload -c CONF`, and the pid file named in
    /// CONF. A relative CONF is made absolute (nginx would read it against
    /// its compiled-in prefix).
    pub fn new(bin: &Path, conf: &Path) -> Self {
        let conf = &std::path::absolute(conf).unwrap_or_else(|_| conf.to_path_buf());
        let bin = bin.display().to_string();
        let conf_text = conf.display().to_string();
        Self {
            test: CommandLine::Argv(vec![
                bin.clone(),
                "-t".into(),
                "-c".into(),
                conf_text.clone(),
            ]),
            reload: CommandLine::Argv(vec![
                bin,
                "-s".into(),
                "reload".into(),
                "-c".into(),
                conf_text,
            ]),
            pid_file: pid_file_of(conf).unwrap_or_else(|| PathBuf::from("/run/nginx.pid")),
            verify_timeout: Duration::from_secs(10),
            command_timeout: Duration::from_secs(60),
        }
    }

    async fn run_test(&self) -> Result<(), SyncError> {
        let (ok, output) = self.test.run(self.command_timeout).await?;
        if ok {
            Ok(())
        } else {
            Err(SyncError::TestFailed {
                command: self.test.to_string(),
                output,
            })
        }
    }

    async fn run_reload(&self) -> Result<(), SyncError> {
        let master = read_pid(&self.pid_file);
        if let Some(m) = master {
            // A master still starting up has no workers yet, and may not
            // handle SIGHUP yet (its default action ends the process).
            let until = Instant::now() + self.verify_timeout;
            while workers(m).is_empty() {
                if Instant::now() >= until {
                    return Err(SyncError::ReloadUnverified(format!(
                        "nginx master {m} has no worker processes (still starting?); not reloading it"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let before: HashSet<u32> = master
            .map(workers)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let (ok, output) = self.reload.run(self.command_timeout).await?;
        if !ok {
            return Err(SyncError::ReloadFailed {
                command: self.reload.to_string(),
                output,
            });
        }
        let until = Instant::now() + self.verify_timeout;
        loop {
            if let Some(m) = read_pid(&self.pid_file) {
                // New workers run the new configuration; the old ones must
                // have stopped accepting (titled "is shutting down") or gone.
                let now = workers(m);
                if now.iter().any(|w| !before.contains(w))
                    && now.iter().all(|w| !before.contains(w))
                {
                    return Ok(());
                }
            }
            if Instant::now() >= until {
                return Err(SyncError::ReloadUnverified(match read_pid(&self.pid_file) {
                    Some(m) => format!(
                        "nginx master {m} did not replace its worker processes within {:?} (nginx keeps its old configuration when it cannot apply the new one: see its error log)",
                        self.verify_timeout
                    ),
                    None => format!(
                        "cannot read the nginx master pid from {} (is nginx running? set --nginx-pid-file)",
                        self.pid_file.display()
                    ),
                }));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Nginx for NginxControl {
    fn test(&self) -> NginxFuture<'_> {
        Box::pin(self.run_test())
    }

    fn reload(&self) -> NginxFuture<'_> {
        Box::pin(self.run_reload())
    }
}

/// The `pid` directive of an nginx.conf (relative paths against its
/// directory), if the file parses and has one.
pub fn pid_file_of(conf: &Path) -> Option<PathBuf> {
    let directives = vigil_config::nginx::syntax::parse_file(conf).ok()?;
    let d = directives.iter().find(|d| d.name == "pid")?;
    let p = PathBuf::from(&d.args.first()?.value);
    Some(if p.is_absolute() {
        p
    } else {
        conf.parent().unwrap_or(Path::new(".")).join(p)
    })
}

fn read_pid(path: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

/// Worker processes of `master` that accept connections (children titled
/// `nginx: worker process`, not `... is shutting down`).
pub fn workers(master: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if ppid != Some(master) {
            continue;
        }
        let title = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let title = String::from_utf8_lossy(&title);
        if title.contains("worker process") && !title.contains("shutting down") {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}
