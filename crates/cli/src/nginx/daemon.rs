//! `daemon on` (nginx's default): the command returns once the server
//! runs in the background, as nginx's does, so that init systems
//! (`Type=forking` with a pid file) and scripts (`nginx && curl ...`) see
//! it serve.
//!
//! vigil does not fork a multi-threaded process: it starts itself again
//! with the same arguments and [`CHILD`] set, in a new session, with
//! standard input and output on pipes to this process. Until the child
//! says it is ready, what it writes on standard error (a bind error, a
//! bad certificate) is copied to this process's; then this process exits
//! 0. If the child exits first, this process exits with its code.

use std::io::{BufRead as _, BufReader, Read as _};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitCode, Stdio};

/// Set in the background child's environment.
pub(crate) const CHILD: &str = "VIGIL_NGINX_DAEMON_CHILD";

/// The line the child writes on its standard output once it serves.
const READY: &str = "ready";

/// Whether this process is the background child of `daemon on`.
pub(crate) fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// Start the background child and wait until it serves or fails.
pub(crate) fn start(argv0: &std::ffi::OsStr, args: &[std::ffi::OsString]) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!(
                "nginx: [emerg] cannot find the vigil binary to start in the background: {e}"
            );
            return ExitCode::from(1);
        }
    };
    let mut child = match Command::new(exe)
        .arg0(argv0)
        .args(args)
        .env(CHILD, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nginx: [emerg] fork() failed ({})", super::errno_text(&e));
            return ExitCode::from(1);
        }
    };
    // Copy its standard error until it closes (ready, or gone).
    let relay = child.stderr.take().map(|err| {
        std::thread::spawn(move || {
            let mut err = err;
            let mut buf = [0u8; 4096];
            let mut out = std::io::stderr();
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let _ = std::io::Write::write_all(&mut out, &buf[..n]);
            }
        })
    });
    let ready = child.stdout.take().is_some_and(|out| {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .any(|l| l == READY)
    });
    if ready {
        // The child closed its standard error with its output.
        if let Some(r) = relay {
            let _ = r.join();
        }
        return ExitCode::SUCCESS;
    }
    let status = child.wait();
    if let Some(r) = relay {
        let _ = r.join();
    }
    match status {
        Ok(s) => ExitCode::from(s.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1)),
        Err(_) => ExitCode::from(1),
    }
}

/// In the child: leave the terminal's session (as nginx's `setsid()`).
pub(crate) fn detach() {
    let _ = rustix::process::setsid();
}

/// In the child, once it serves: tell the parent, then point standard
/// output and error at /dev/null (the parent exits; its pipes close).
pub(crate) fn ready() {
    use std::io::Write as _;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{READY}");
    let _ = out.flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
    }
}
