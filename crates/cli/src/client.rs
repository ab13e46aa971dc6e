//! A small HTTP/1.1 client for the admin API (127.0.0.1:9901 by default).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// Default admin address.
pub(crate) const DEFAULT_ADMIN: &str = "127.0.0.1:9901";

/// One request to the admin API: status and JSON body.
pub(crate) async fn call(
    addr: SocketAddr,
    method: Method,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(StatusCode, serde_json::Value)> {
    let stream = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .with_context(|| format!("connecting to the admin API at {addr} timed out"))?
        .with_context(|| {
            format!("cannot reach the admin API at {addr} (is vigil running? see --admin)")
        })?;
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        tx.send_request(b.body(Full::new(Bytes::new()))?),
    )
    .await
    .context("the admin API did not answer within 10s")??;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    let v = serde_json::from_slice(&body).with_context(|| {
        format!("the admin API answered {status} with something that is not JSON")
    })?;
    Ok((status, v))
}

/// GET that must succeed; an API error becomes an error naming it.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<serde_json::Value> {
    get_with(addr, path, None).await
}

/// [`get`] with the bearer token, if any.
pub(crate) async fn get_with(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<serde_json::Value> {
    let (status, v) = call(addr, Method::GET, path, token).await?;
    if !status.is_success() {
        anyhow::bail!("{status}: {}", v["error"].as_str().unwrap_or("error"));
    }
    Ok(v)
}

/// Percent-encode a path segment or query value.
pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `HH:MM:SS` UTC of Unix milliseconds.
pub(crate) fn clock(ms: u64) -> String {
    let s = ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}
