//! A `log_format`, compiled once when the configuration loads: literal
//! bytes, the log module's own variables (`$time_local`, `$status`,
//! `$body_bytes_sent`, ...) and any other variable, escaped as
//! `ngx_http_log_module` escapes it (1.22).

use std::fmt::Write as _;
use std::time::SystemTime;

use http::request::Parts;
use vigil_core::config::vars::{scan, Piece, ScanError, Syntax};
use vigil_core::config::LogEscape;

use crate::conn::wallclock::{self, Wall};
use crate::nginx::vars::{fields, Scope, Template, Text, UnknownVariable, VarContext};

/// nginx's `combined`.
pub(crate) const COMBINED: &str = "$remote_addr - $remote_user [$time_local] \"$request\" $status $body_bytes_sent \"$http_referer\" \"$http_user_agent\"";

/// A compiled format.
#[derive(Debug, Clone)]
pub(crate) struct Format {
    ops: Vec<Op>,
    escape: LogEscape,
}

#[derive(Debug, Clone)]
enum Op {
    Lit(String),
    /// A request header (`$http_NAME`, the field's name: `-` for `_`),
    /// raw bytes: nginx 1.22 takes the first line, except Cookie and
    /// X-Forwarded-For, which it joins (`fields::header`).
    Header(String),
    RemoteUser,
    /// `$realip_remote_addr` / `$realip_remote_port`: the peer before realip.
    RealIpAddr,
    RealIpPort,
    Status,
    /// Known only when the response has been sent.
    Late(Late),
    Var(Template),
}

/// The values of the end of the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Late {
    TimeLocal,
    TimeIso8601,
    Msec,
    RequestTime,
    BodyBytesSent,
}

/// A line rendered but for its [`Late`] values.
#[derive(Debug)]
pub(crate) struct Rendered {
    chunks: Vec<Chunk>,
}

#[derive(Debug)]
enum Chunk {
    Bytes(Vec<u8>),
    Late(Late),
}

/// What the end of a response knows.
pub(crate) struct End {
    pub(crate) now: SystemTime,
    pub(crate) request_time: f64,
    pub(crate) body_bytes_sent: u64,
}

// === impl Format ===

impl Format {
    /// Compile `text`; the syntax was checked when the conf was read.
    /// `scope`: the conf's `set`, `map` and capture variables.
    pub(crate) fn compile(
        text: &str,
        escape: LogEscape,
        scope: &Scope,
    ) -> Result<Self, UnknownVariable> {
        let mut ops = Vec::new();
        let pieces = scan(text, Syntax::LogFormat).map_err(|e| match e {
            ScanError::Unclosed { name, .. } => UnknownVariable(name),
            ScanError::NoName(_) => UnknownVariable(String::new()),
        })?;
        for piece in pieces {
            ops.push(match piece {
                Piece::Text(t) => Op::Lit(t.to_string()),
                Piece::Name(name) => Op::of(name, scope)?,
                // (Not in a log format's syntax.)
                Piece::Capture(n) => Op::of(&n.to_string(), scope)?,
            });
        }
        Ok(Self { ops, escape })
    }

    /// The line for this request, but for its end values.
    pub(crate) fn render(&self, cx: &VarContext<'_>) -> Rendered {
        let mut chunks = Vec::new();
        let mut cur = Vec::new();
        // A variable's bytes before they are escaped into the line.
        let mut value = Vec::new();
        for op in &self.ops {
            value.clear();
            match op {
                Op::Lit(s) => cur.extend_from_slice(s.as_bytes()),
                Op::Status => {
                    let _ = write!(Text(&mut cur), "{:03}", cx.status);
                }
                Op::Late(l) => {
                    chunks.push(Chunk::Bytes(std::mem::take(&mut cur)));
                    chunks.push(Chunk::Late(*l));
                }
                Op::Header(name) => {
                    let found = fields::header(cx.parts, name, &mut value);
                    self.value(&mut cur, found.then_some(&value[..]));
                }
                Op::RemoteUser => self.value(&mut cur, remote_user(cx.parts).as_deref()),
                Op::RealIpAddr | Op::RealIpPort => {
                    let peer = cx
                        .parts
                        .extensions
                        .get::<crate::nginx::realip::Original>()
                        .map_or(cx.client, |o| o.0);
                    let _ = match op {
                        Op::RealIpAddr => write!(Text(&mut value), "{}", peer.ip()),
                        _ => write!(Text(&mut value), "{}", peer.port()),
                    };
                    self.value(&mut cur, Some(&value));
                }
                Op::Var(t) => {
                    t.write(cx, None, &mut value);
                    // vigil's variables do not say "not found": empty is taken for it.
                    self.value(&mut cur, (!value.is_empty()).then_some(&value[..]));
                }
            }
        }
        chunks.push(Chunk::Bytes(cur));
        Rendered { chunks }
    }

    /// The value of a variable as `ngx_http_log_variable` (or its json /
    /// unescaped forms) writes it.
    fn value(&self, out: &mut Vec<u8>, v: Option<&[u8]>) {
        match (self.escape, v) {
            (LogEscape::Default, None) => out.push(b'-'),
            (_, None) => {}
            (LogEscape::Default, Some(v)) => escape_default(out, v),
            (LogEscape::Json, Some(v)) => escape_json(out, v),
            (LogEscape::None, Some(v)) => out.extend_from_slice(v),
        }
    }
}

impl Op {
    fn of(name: &str, scope: &Scope) -> Result<Self, UnknownVariable> {
        Ok(match name {
            "time_local" => Op::Late(Late::TimeLocal),
            "time_iso8601" => Op::Late(Late::TimeIso8601),
            "msec" => Op::Late(Late::Msec),
            "request_time" => Op::Late(Late::RequestTime),
            "body_bytes_sent" => Op::Late(Late::BodyBytesSent),
            "status" => Op::Status,
            "remote_user" => Op::RemoteUser,
            "realip_remote_addr" => Op::RealIpAddr,
            "realip_remote_port" => Op::RealIpPort,
            n if n.starts_with("http_") => {
                Op::Header(n[5..].to_ascii_lowercase().replace('_', "-"))
            }
            "bytes_sent" | "request_length" | "pipe" => {
                return Err(UnknownVariable(name.to_string()))
            }
            n => Op::Var(Template::parse_with(&format!("${{{n}}}"), scope)?),
        })
    }
}

// === impl Rendered ===

impl Rendered {
    /// A line known whole already.
    pub(crate) fn of(line: Vec<u8>) -> Self {
        Self {
            chunks: vec![Chunk::Bytes(line)],
        }
    }

    /// The whole line, with its newline.
    pub(crate) fn finish(self, end: &End) -> Vec<u8> {
        let mut out = Vec::new();
        for c in self.chunks {
            match c {
                Chunk::Bytes(b) => out.extend_from_slice(&b),
                Chunk::Late(l) => late(&mut out, l, end),
            }
        }
        out.push(b'\n');
        out
    }

    /// Whether it renders to nothing, "" or "0" (`if=`'s test).
    pub(crate) fn is_false(&self) -> bool {
        let mut all = Vec::new();
        for c in &self.chunks {
            match c {
                Chunk::Bytes(b) => all.extend_from_slice(b),
                Chunk::Late(_) => return false,
            }
        }
        all.is_empty() || all == b"0"
    }
}

fn late(out: &mut Vec<u8>, l: Late, end: &End) {
    let mut w = Text(out);
    let _ = match l {
        Late::TimeLocal => wallclock::write(&mut w, Wall::Local, end.now),
        Late::TimeIso8601 => wallclock::write(&mut w, Wall::Iso8601, end.now),
        Late::Msec => wallclock::write(&mut w, Wall::Msec, end.now),
        Late::RequestTime => {
            let ms = (end.request_time.max(0.0) * 1000.0) as u64;
            write!(w, "{}.{:03}", ms / 1000, ms % 1000)
        }
        Late::BodyBytesSent => write!(w, "{}", end.body_bytes_sent),
    };
}

/// `$remote_user`: the user of `Authorization: Basic`, as
/// `ngx_http_auth_basic_user` decodes it.
fn remote_user(p: &Parts) -> Option<Vec<u8>> {
    let v = p.headers.get(http::header::AUTHORIZATION)?.as_bytes();
    if v.len() < 6 || !v[..6].eq_ignore_ascii_case(b"Basic ") {
        return None;
    }
    let encoded = v[6..].iter().skip_while(|&&b| b == b' ');
    let decoded = decode_base64(&encoded.copied().collect::<Vec<u8>>())?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    (colon > 0).then(|| decoded[..colon].to_vec())
}

/// `ngx_decode_base64`: the standard alphabet up to the first `=`, padding
/// optional.
fn decode_base64(s: &[u8]) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const NGINX: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::RequireNone)
            .with_decode_allow_trailing_bits(true),
    );
    let end = s.iter().position(|&b| b == b'=').unwrap_or(s.len());
    if end == 0 {
        return None;
    }
    base64::Engine::decode(&NGINX, &s[..end]).ok()
}

/// `ngx_http_log_escape`: `"`, `\`, bytes below 0x20 and from 0x7f as `\xHH`.
pub(crate) fn escape_default(out: &mut Vec<u8>, v: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in v {
        if !(0x20..0x7f).contains(&b) || b == b'"' || b == b'\\' {
            out.extend_from_slice(&[b'\\', b'x', HEX[(b >> 4) as usize], HEX[(b & 0xf) as usize]]);
        } else {
            out.push(b);
        }
    }
}

/// `ngx_escape_json`.
pub(crate) fn escape_json(out: &mut Vec<u8>, v: &[u8]) {
    for &b in v {
        match b {
            b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            0..=0x1f => {
                let lo = b & 0xf;
                out.extend_from_slice(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    b'0' + (b >> 4),
                    if lo < 10 { b'0' + lo } else { b'A' + lo - 10 },
                ]);
            }
            _ => out.push(b),
        }
    }
}

#[cfg(test)]
mod tests;
