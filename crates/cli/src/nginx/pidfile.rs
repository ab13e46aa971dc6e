//! The pid file: written once every listener is bound (nginx's order, and
//! what `nginx -s` and init systems wait for), removed at exit; and `-s`,
//! which reads it and signals that process.

use std::path::Path;

use vigil_config::nginx::process::Level;

use super::options::Signal;
use super::os_failed;

/// Write this process's pid to `path` (`"PID\n"`, as nginx).
pub(crate) fn write(path: &Path) -> Result<(), String> {
    std::fs::write(path, format!("{}\n", std::process::id()))
        .map_err(|e| os_failed("open()", path, &e))
}

/// Remove `path` if it still holds this process's pid (a newer process
/// may have taken the name).
pub(crate) fn remove(path: &Path) {
    let ours =
        std::fs::read_to_string(path).is_ok_and(|s| s.trim() == std::process::id().to_string());
    if ours {
        if let Err(e) = std::fs::remove_file(path) {
            tracing::error!("{}", os_failed("unlink()", path, &e));
        }
    }
}

/// `-s SIGNAL`: send it to the process named in `path`. The error is
/// nginx's message with its level (`open() ... failed` at `error`).
pub(crate) fn send(path: &Path, signal: Signal) -> Result<(), (Level, String)> {
    use rustix::process::{kill_process, Pid, Signal as S};
    let text =
        std::fs::read_to_string(path).map_err(|e| (Level::Error, os_failed("open()", path, &e)))?;
    let number = text.trim_end_matches(['\n', '\r']);
    let pid = number
        .parse::<i32>()
        .ok()
        .and_then(Pid::from_raw)
        .filter(|p| p.as_raw_nonzero().get() > 0)
        .ok_or_else(|| {
            (
                Level::Error,
                format!("invalid PID number \"{number}\" in \"{}\"", path.display()),
            )
        })?;
    let (sig, number) = match signal {
        Signal::Stop => (S::TERM, 15),
        Signal::Quit => (S::QUIT, 3),
        Signal::Reopen => (S::USR1, 10),
        Signal::Reload => (S::HUP, 1),
    };
    kill_process(pid, sig).map_err(|e| {
        let e = std::io::Error::from(e);
        (
            Level::Alert,
            format!(
                "kill({}, {number}) failed ({})",
                pid.as_raw_nonzero(),
                super::errno_text(&e)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_bad_pid_file_is_nginxs_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("none.pid");
        let e = send(&missing, Signal::Reload).expect_err("no file");
        assert_eq!(
            e,
            (
                Level::Error,
                format!(
                    "open() \"{}\" failed (2: No such file or directory)",
                    missing.display()
                )
            )
        );
        let bad = dir.path().join("bad.pid");
        std::fs::write(&bad, "12x\n").expect("write");
        let e = send(&bad, Signal::Reload).expect_err("bad number");
        assert_eq!(
            e,
            (
                Level::Error,
                format!("invalid PID number \"12x\" in \"{}\"", bad.display())
            )
        );
        let written = dir.path().join("ok.pid");
        write(&written).expect("written");
        assert_eq!(
            std::fs::read_to_string(&written).expect("read"),
            format!("{}\n", std::process::id())
        );
        remove(&written);
        assert!(!written.exists());
    }
}
