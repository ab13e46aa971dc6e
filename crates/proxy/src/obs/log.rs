//! The access log (`access_log PATH [FORMAT] [if=...]`): nginx's
//! `combined`, a `log_format` of the conf, or vigil's JSON lines with
//! every attempt. The line is written when the response body has been
//! sent (or dropped), so that `$body_bytes_sent` and `$request_time` are
//! nginx's; a file is opened once per path, at start and reload, and again
//! by [`reopen`] (SIGUSR1, for logrotate).

mod format;

use std::fs::{File, OpenOptions};
use std::io::{LineWriter, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::request::Parts;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use vigil_core::config::{AccessLog, LogEscape, LogFormat};
use vigil_net::clock::Tick;

use crate::nginx::vars::VarContext;
use crate::wire::payload::{BoxError, UpBody};
use format::{End, Format, Rendered};

/// An open log file, shared by every `access_log` of its path; its writer
/// is swapped for a new one when the file is reopened.
type Shared = Arc<Mutex<LineWriter<File>>>;

/// A log file by its path, while a generation holds it.
type Opened = (PathBuf, Weak<Mutex<LineWriter<File>>>);

/// Every access log file this process has open, for [`reopen`] (entries
/// whose generations are gone are pruned then).
static OPEN: Mutex<Vec<Opened>> = Mutex::new(Vec::new());

/// What [`reopen`] did.
#[derive(Debug, Default)]
pub struct Reopened {
    /// The files reopened.
    pub files: Vec<PathBuf>,
    /// The files that could not be opened again (they keep being written
    /// where they were), with why.
    pub failed: Vec<(PathBuf, std::io::Error)>,
}

/// Open every access log file again by its path, as nginx does on SIGUSR1
/// (`ngx_reopen_files`): after logrotate moved a file away, the lines go
/// to a new file of that name. A line is written whole to the old file or
/// to the new one. A file that cannot be opened keeps its old descriptor
/// (nginx keeps it too) and is reported.
pub fn reopen() -> Reopened {
    let mut out = Reopened::default();
    let mut open = OPEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    open.retain(|(_, w)| w.strong_count() > 0);
    for (path, file) in open.iter() {
        let Some(file) = file.upgrade() else { continue };
        match open_append(path) {
            Ok(f) => {
                let mut w = file
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                // The old writer holds whole lines only; dropping it closes the old file.
                let _ = w.flush();
                *w = LineWriter::new(f);
                out.files.push(path.clone());
            }
            Err(e) => out.failed.push((path.clone(), e)),
        }
    }
    out
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// One `access_log`: its file (shared by every log of that path), its
/// format and its `if=`.
pub(crate) struct AccessLogWriter {
    file: Shared,
    format: Compiled,
    condition: Option<Format>,
}

#[derive(Debug)]
enum Compiled {
    Json,
    Format(Format),
}

/// A line waiting for the end of its response.
pub(crate) struct Pending {
    file: Shared,
    line: Rendered,
    start: Tick,
}

/// A response body that writes its access log line when it ends, fails
/// or is dropped (the client went away).
struct Logged {
    inner: UpBody,
    pending: Option<Pending>,
    sent: u64,
}

/// The format and `if=` condition of `log` compiled as a writer compiles
/// them (no file opened): the error `vigil serve` would give (`vigil lint`).
pub(crate) fn check(log: &AccessLog, scope: &crate::nginx::vars::Scope) -> Result<(), String> {
    match &log.format {
        LogFormat::Json | LogFormat::Combined => {}
        LogFormat::Custom(f) => {
            Format::compile(&f.text, f.escape, scope)
                .map_err(|e| format!("log_format \"{}\" at {}: {e}", f.name, f.origin))?;
        }
    }
    if let Some(c) = &log.condition {
        Format::compile(c, LogEscape::None, scope)
            .map_err(|e| format!("access_log {} if={c}: {e}", log.path.display()))?;
    }
    Ok(())
}

// === impl AccessLogWriter ===

impl AccessLogWriter {
    /// Open (append, create) `log.path`, or share `open`'s file (the same
    /// path); compile its format. The error says what failed.
    pub(crate) fn open(
        log: &AccessLog,
        open: Option<&AccessLogWriter>,
        scope: &crate::nginx::vars::Scope,
    ) -> Result<Self, String> {
        let file = match open {
            Some(w) => w.file.clone(),
            None => {
                let f = open_append(&log.path)
                    .map_err(|e| format!("cannot open access log {}: {e}", log.path.display()))?;
                let file = Arc::new(Mutex::new(LineWriter::new(f)));
                let mut open = OPEN
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                open.retain(|(_, w)| w.strong_count() > 0);
                open.push((log.path.clone(), Arc::downgrade(&file)));
                file
            }
        };
        let format = match &log.format {
            LogFormat::Json => {
                crate::nginx::vars::RequestId::wanted();
                Compiled::Json
            }
            LogFormat::Combined => Compiled::Format(
                Format::compile(format::COMBINED, LogEscape::Default, scope)
                    .map_err(|e| format!("log format \"combined\": {e}"))?,
            ),
            LogFormat::Custom(f) => Compiled::Format(
                Format::compile(&f.text, f.escape, scope)
                    .map_err(|e| format!("log_format \"{}\" at {}: {e}", f.name, f.origin))?,
            ),
        };
        let condition = match &log.condition {
            Some(c) => Some(
                Format::compile(c, LogEscape::None, scope)
                    .map_err(|e| format!("access_log {} if={c}: {e}", log.path.display()))?,
            ),
            None => None,
        };
        Ok(Self {
            file,
            format,
            condition,
        })
    }

    /// The line of this request, if `if=` lets it be written.
    pub(crate) fn pending(&self, cx: &VarContext<'_>, parts: &Parts) -> Option<Pending> {
        if let Some(c) = &self.condition {
            if c.render(cx).is_false() {
                return None;
            }
        }
        let line = match &self.format {
            Compiled::Format(f) => f.render(cx),
            Compiled::Json => Rendered::of(json(cx, parts).into_bytes()),
        };
        let start = vigil_net::clock::coarse_tick()
            .minus(Duration::try_from_secs_f64(cx.request_time).unwrap_or_default());
        Some(Pending {
            file: self.file.clone(),
            line,
            start,
        })
    }

    /// `resp` with its body wrapped to write the line at its end.
    pub(crate) fn attach(
        &self,
        cx: &VarContext<'_>,
        parts: &Parts,
        resp: http::Response<UpBody>,
    ) -> http::Response<UpBody> {
        match self.pending(cx, parts) {
            Some(pending) => resp.map(|inner| {
                Logged {
                    inner,
                    pending: Some(pending),
                    sent: 0,
                }
                .boxed()
            }),
            None => resp,
        }
    }
}

impl std::fmt::Debug for AccessLogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLogWriter")
            .field("format", &self.format)
            .finish()
    }
}

// === impl Pending ===

impl Pending {
    /// Write the line with `sent` body bytes.
    pub(crate) fn write(self, sent: u64) {
        let end = End {
            now: SystemTime::now(),
            request_time: vigil_net::clock::coarse_tick()
                .since(self.start)
                .as_secs_f64(),
            body_bytes_sent: sent,
        };
        let line = self.line.finish(&end);
        if let Ok(mut out) = self.file.lock() {
            // A full disk must not take requests down with it.
            let _ = out.write_all(&line);
        }
    }
}

// === impl Logged ===

impl Logged {
    fn done(&mut self) {
        if let Some(p) = self.pending.take() {
            p.write(self.sent);
        }
    }
}

impl Body for Logged {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    self.sent += d.len() as u64;
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.done(),
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        self.done();
    }
}

fn json(cx: &VarContext<'_>, parts: &Parts) -> String {
    let join = |f: &dyn Fn(&crate::handler::record::AttemptRecord) -> serde_json::Value| {
        cx.attempts.iter().map(f).collect::<Vec<_>>()
    };
    let v = serde_json::json!({
        "time": httpdate::fmt_http_date(SystemTime::now()),
        "remote_addr": cx.client.ip().to_string(),
        "method": parts.method.as_str(),
        "uri": parts.uri.path_and_query().map_or("/", |p| p.as_str()),
        "status": cx.status,
        "request_time": cx.request_time,
        "upstream_addr": join(&|a| a.addr.to_string().into()),
        "upstream_status": join(&|a| a.status.into()),
        "upstream_response_time": join(&|a| a.response_time.into()),
        "request_id": parts.extensions.get::<crate::nginx::vars::RequestId>().map(|r| r.to_string()),
    });
    v.to_string()
}
