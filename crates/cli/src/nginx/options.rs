//! nginx's command line, parsed as `ngx_get_options` parses it: each
//! argument starts with `-` and holds one or more flags (`-tq`); a flag
//! that takes a value takes the rest of its argument (`-p/srv/`) or the
//! next one (`-p /srv/`).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;

/// What the command line asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Options {
    /// `-?`, `-h`.
    pub(crate) help: bool,
    /// `-v` (also set by `-V`, `-h`).
    pub(crate) version: bool,
    /// `-V`.
    pub(crate) configure: bool,
    /// `-t` (also set by `-T`).
    pub(crate) test: bool,
    /// `-T`.
    pub(crate) dump: bool,
    /// `-q`.
    pub(crate) quiet: bool,
    /// `-s SIGNAL`.
    pub(crate) signal: Option<Signal>,
    /// `-p PREFIX`.
    pub(crate) prefix: Option<PathBuf>,
    /// `-c FILE`.
    pub(crate) conf: Option<PathBuf>,
    /// `-e FILE|stderr`.
    pub(crate) error_log: Option<PathBuf>,
    /// `-g DIRECTIVES`.
    pub(crate) globals: Option<String>,
}

/// `-s`'s signals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// `stop`: SIGTERM.
    Stop,
    /// `quit`: SIGQUIT.
    Quit,
    /// `reopen`: SIGUSR1.
    Reopen,
    /// `reload`: SIGHUP.
    Reload,
}

/// Parse the arguments after the program name. The error is nginx's
/// message (printed after `nginx: `; nginx exits 1).
pub(crate) fn parse(args: &[OsString]) -> Result<Options, String> {
    let mut o = Options::default();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_bytes();
        let Some(flags) = arg.strip_prefix(b"-") else {
            return Err(format!("invalid option: \"{}\"", args[i].to_string_lossy()));
        };
        let mut j = 0;
        while j < flags.len() {
            let flag = flags[j];
            j += 1;
            match flag {
                b'?' | b'h' => {
                    o.version = true;
                    o.help = true;
                }
                b'v' => o.version = true,
                b'V' => {
                    o.version = true;
                    o.configure = true;
                }
                b't' => o.test = true,
                b'T' => {
                    o.test = true;
                    o.dump = true;
                }
                b'q' => o.quiet = true,
                b'p' | b'c' | b'e' | b'g' | b's' => {
                    let value = if j < flags.len() {
                        OsStr::from_bytes(&flags[j..]).to_os_string()
                    } else if let Some(next) = args.get(i + 1) {
                        i += 1;
                        next.clone()
                    } else {
                        return Err(format!(
                            "option \"-{}\" requires {}",
                            char::from(flag),
                            match flag {
                                b'p' => "directory name",
                                b'c' | b'e' => "file name",
                                _ => "parameter",
                            }
                        ));
                    };
                    match flag {
                        b'p' => o.prefix = Some(value.into()),
                        b'c' => o.conf = Some(value.into()),
                        b'e' => o.error_log = Some(value.into()),
                        b'g' => o.globals = Some(value.to_string_lossy().into_owned()),
                        _ => {
                            o.signal = Some(match value.as_bytes() {
                                b"stop" => Signal::Stop,
                                b"quit" => Signal::Quit,
                                b"reopen" => Signal::Reopen,
                                b"reload" => Signal::Reload,
                                _ => {
                                    return Err(format!(
                                        "invalid option: \"-s {}\"",
                                        value.to_string_lossy()
                                    ))
                                }
                            })
                        }
                    }
                    break;
                }
                other => {
                    return Err(format!(
                        "invalid option: \"{}\"",
                        String::from_utf8_lossy(&[other])
                    ))
                }
            }
        }
        i += 1;
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Options, String> {
        parse(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn flags_combine_and_values_come_attached_or_next_as_nginx_reads_them() {
        let o = p(&["-p", "/srv/t/", "-c", "nginx.conf", "-e", "error.log"]).expect("ok");
        assert_eq!(o.prefix, Some("/srv/t/".into()));
        assert_eq!(o.conf, Some("nginx.conf".into()));
        assert_eq!(o.error_log, Some("error.log".into()));
        let o = p(&["-tq", "-c/etc/x.conf", "-gdaemon off;"]).expect("ok");
        assert!(o.test && o.quiet && !o.dump);
        assert_eq!(o.conf, Some("/etc/x.conf".into()));
        assert_eq!(o.globals.as_deref(), Some("daemon off;"));
        let o = p(&["-T"]).expect("ok");
        assert!(o.test && o.dump);
        let o = p(&["-V"]).expect("ok");
        assert!(o.version && o.configure);
        let o = p(&["-sreload"]).expect("ok");
        assert_eq!(o.signal, Some(Signal::Reload));
        let o = p(&["-s", "reopen", "-p", "/x"]).expect("ok");
        assert_eq!(o.signal, Some(Signal::Reopen));
        // `-tc FILE`: the value flag takes the rest, here nothing, so the next.
        let o = p(&["-tc", "a.conf"]).expect("ok");
        assert!(o.test);
        assert_eq!(o.conf, Some("a.conf".into()));
        assert!(p(&["-h"]).expect("ok").help);
    }

    #[test]
    fn bad_arguments_get_nginx_messages() {
        assert_eq!(p(&["x"]), Err("invalid option: \"x\"".into()));
        assert_eq!(p(&["-x"]), Err("invalid option: \"x\"".into()));
        assert_eq!(
            p(&["-s", "restart"]),
            Err("invalid option: \"-s restart\"".into())
        );
        assert_eq!(
            p(&["-p"]),
            Err("option \"-p\" requires directory name".into())
        );
        assert_eq!(p(&["-c"]), Err("option \"-c\" requires file name".into()));
        assert_eq!(p(&["-g"]), Err("option \"-g\" requires parameter".into()));
        assert_eq!(p(&["-s"]), Err("option \"-s\" requires parameter".into()));
    }
}
