//! The access log: one line per request with the per-attempt upstream
//! fields (`$upstream_addr`, `$upstream_status`, `$upstream_response_time`)
//! and the request time; nginx's `combined` plus those fields, or JSON lines.

use std::fs::{File, OpenOptions};
use std::io::{LineWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use http::request::Parts;
use vigil_core::config::LogFormat;

use crate::vars::VarContext;

/// An open access log.
pub struct AccessLogWriter {
    out: Mutex<LineWriter<File>>,
    format: LogFormat,
}

impl AccessLogWriter {
    /// Open (append, create) `path`.
    pub fn open(path: &Path, format: LogFormat) -> std::io::Result<Self> {
        let f = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            out: Mutex::new(LineWriter::new(f)),
            format,
        })
    }

    pub(crate) fn write(&self, cx: &VarContext<'_>, parts: &Parts) {
        let line = match self.format {
            LogFormat::Combined => combined(cx, parts),
            LogFormat::Json => json(cx, parts),
        };
        if let Ok(mut out) = self.out.lock() {
            // A full disk must not take requests down with it.
            let _ = out.write_all(line.as_bytes());
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

fn join<T>(cx: &VarContext<'_>, f: impl Fn(&crate::handler::AttemptRecord) -> T) -> Vec<T> {
    cx.attempts.iter().map(f).collect()
}

fn combined(cx: &VarContext<'_>, parts: &Parts) -> String {
    let header = |n: &str| {
        parts
            .headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string()
    };
    let addrs = join(cx, |a| a.addr.to_string()).join(", ");
    let statuses = join(cx, |a| a.status.map_or("-".to_string(), |s| s.to_string())).join(", ");
    let times = join(cx, |a| format!("{:.3}", a.response_time)).join(", ");
    format!(
        "{} - - [{}] \"{} {} {:?}\" {} - \"{}\" \"{}\" upstream_addr=\"{}\" upstream_status=\"{}\" upstream_response_time=\"{}\" request_time={:.3}\n",
        cx.client.ip(),
        httpdate::fmt_http_date(std::time::SystemTime::now()),
        parts.method,
        parts.uri.path_and_query().map_or("/", |p| p.as_str()),
        parts.version,
        cx.status,
        header("referer"),
        header("user-agent"),
        if addrs.is_empty() { "-".into() } else { addrs },
        if statuses.is_empty() { "-".into() } else { statuses },
        if times.is_empty() { "-".into() } else { times },
        cx.request_time,
    )
}

fn json(cx: &VarContext<'_>, parts: &Parts) -> String {
    let v = serde_json::json!({
        "time": httpdate::fmt_http_date(std::time::SystemTime::now()),
        "remote_addr": cx.client.ip().to_string(),
        "method": parts.method.as_str(),
        "uri": parts.uri.path_and_query().map_or("/", |p| p.as_str()),
        "status": cx.status,
        "request_time": cx.request_time,
        "upstream_addr": join(cx, |a| a.addr.to_string()),
        "upstream_status": join(cx, |a| a.status),
        "upstream_response_time": join(cx, |a| a.response_time),
        "request_id": parts.extensions.get::<crate::vars::RequestId>().map(|r| r.0.as_str()),
    });
    format!("{v}\n")
}
