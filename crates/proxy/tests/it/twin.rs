//! Side by side: the same nginx.conf served by vigil (in process) and by a
//! stock nginx (a child process), each with its own set of recording
//! backends, so that a test sends the exact same bytes to both and compares
//! what the client and the backends saw.
//!
//! The conf is the inside of `http {}`; `{LISTEN}` is replaced by each
//! proxy's address and `{B0}`, `{B1}`, ... by the addresses of that proxy's
//! backends. Backends answer 200 with their index (`b0`, `b1`, ...) as body.

#![allow(dead_code)] // a shared fixture: not every test uses every part

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{start_proxy, Backend, Running, Seen};
pub(crate) use vigil_testkit::{free_addr, nginx_bin};

/// A stock nginx in the foreground with its pid, logs and temp paths in a
/// temporary directory.
pub(crate) struct Nginx {
    pub(crate) addr: SocketAddr,
    bin: PathBuf,
    dir: tempfile::TempDir,
    child: Child,
}

impl Nginx {
    /// Start nginx on `http_body` (the inside of `http {}`, `{LISTEN}`
    /// already replaced) and wait until it accepts on `addr`.
    pub(crate) async fn start(http_body: &str, addr: SocketAddr) -> Self {
        Self::start_bin(http_body, addr, nginx_bin()).await
    }

    /// As [`Nginx::start`], with `bin` run for nginx (and for its `-s
    /// stop`): a wrapper script that runs the stock nginx in a namespace.
    pub(crate) async fn start_bin(http_body: &str, addr: SocketAddr, bin: PathBuf) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().display();
        for sub in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        let conf = dir.path().join("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
                 events {{ worker_connections 256; }}\n\
                 http {{\n    access_log off;\n\
                 \x20   client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n\
                 \x20   fastcgi_temp_path {d}/fastcgi;\n    uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n\
                 {http_body}\n}}\n"
            ),
        )
        .expect("write nginx.conf");
        let child = Command::new(&bin)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .spawn()
            .expect("start nginx");
        let nginx = Self {
            addr,
            bin,
            dir,
            child,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "nginx did not start on {addr}: {}",
                nginx.error_log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        nginx
    }

    /// nginx's error log so far.
    pub(crate) fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("nginx.conf")
    }

    fn prefix(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let (prefix, conf) = (self.prefix().to_path_buf(), self.conf());
        vigil_testkit::stop_nginx(&self.bin, &prefix, &conf, &mut self.child);
    }
}

/// One proxy (vigil or nginx) and its backends.
pub(crate) struct Side {
    pub(crate) addr: SocketAddr,
    pub(crate) backends: Vec<Backend>,
}

/// The same conf under vigil and under nginx.
pub(crate) struct Twin {
    pub(crate) vigil: Side,
    pub(crate) nginx: Side,
    pub(crate) running: Running,
    pub(crate) stock: Nginx,
}

/// A response read off the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Raw {
    /// The status, 0 when the connection closed without one.
    pub(crate) status: u16,
    /// The header block as sent (without the status line).
    pub(crate) head: String,
    /// Everything after the header block.
    pub(crate) body: Vec<u8>,
}

async fn backends(n: usize) -> Vec<Backend> {
    let mut out = Vec::new();
    for i in 0..n {
        let name: &'static str = Box::leak(format!("b{i}").into_boxed_str());
        out.push(Backend::start(move |_| Response::new(Full::new(Bytes::from(name)))).await);
    }
    out
}

fn fill(conf: &str, listen: SocketAddr, backends: &[Backend]) -> String {
    with_backends(conf, backends).replace("{LISTEN}", &listen.to_string())
}

/// The conf with `{Bi}` filled in.
fn with_backends(conf: &str, backends: &[Backend]) -> String {
    let mut text = conf.to_string();
    // Highest index first, so `{B1}` is not taken for part of `{B10}`.
    for (i, b) in backends.iter().enumerate().rev() {
        text = text.replace(&format!("{{B{i}}}"), &b.addr.to_string());
    }
    text
}

impl Twin {
    /// Start `conf` (the inside of `http {}`) under both, with `n` backends each.
    pub(crate) async fn start(conf: &str, n: usize) -> Self {
        Self::start_with(conf, n, &[], &[]).await
    }

    /// As [`Twin::start`], with more placeholders filled per side (`("{R0}",
    /// addr)`): for backends a test runs itself, one for each side.
    pub(crate) async fn start_with(
        conf: &str,
        n: usize,
        vigil: &[(&str, SocketAddr)],
        nginx: &[(&str, SocketAddr)],
    ) -> Self {
        let text = |vars: &[(&str, SocketAddr)]| {
            vars.iter()
                .map(|(k, a)| (k.to_string(), a.to_string()))
                .collect::<Vec<_>>()
        };
        Self::start_texts(conf, n, &text(vigil), &text(nginx)).await
    }

    /// As [`Twin::start_with`], with any text per side (`("{LOG}", path)`).
    pub(crate) async fn start_texts(
        conf: &str,
        n: usize,
        vigil: &[(String, String)],
        nginx: &[(String, String)],
    ) -> Self {
        let each = |conf: &str, vars: &[(String, String)]| {
            vars.iter()
                .fold(conf.to_string(), |c, (k, a)| c.replace(k.as_str(), a))
        };
        let vb = backends(n).await;
        let vconf = each(conf, vigil);
        // start_proxy picks the listen address itself and fills `{LISTEN}`.
        let running = start_proxy(&format!("http {{\n{}\n}}", with_backends(&vconf, &vb))).await;
        let nb = backends(n).await;
        let naddr = free_addr();
        let stock = Nginx::start(&fill(&each(conf, nginx), naddr, &nb), naddr).await;
        Self {
            vigil: Side {
                addr: running.addr,
                backends: vb,
            },
            nginx: Side {
                addr: naddr,
                backends: nb,
            },
            running,
            stock,
        }
    }

    /// Send the same bytes to both; the responses (vigil's, nginx's).
    pub(crate) async fn send(&self, bytes: &[u8]) -> (Raw, Raw) {
        (
            raw(self.vigil.addr, bytes).await,
            raw(self.nginx.addr, bytes).await,
        )
    }

    /// What each side's backend `i` saw (vigil's, nginx's).
    pub(crate) fn seen(&self, i: usize) -> (Vec<Seen>, Vec<Seen>) {
        (
            self.vigil.backends[i].requests(),
            self.nginx.backends[i].requests(),
        )
    }

    /// The URIs every backend of each side saw, in backend order (vigil's, nginx's).
    pub(crate) fn uris(&self) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
        let of = |s: &Side| {
            s.backends
                .iter()
                .map(|b| b.requests().into_iter().map(|r| r.uri).collect())
                .collect()
        };
        (of(&self.vigil), of(&self.nginx))
    }
}

/// Write `bytes` on a fresh connection and read until the peer closes
/// (send `Connection: close`) or 5 s pass; the first response.
pub(crate) async fn raw(addr: SocketAddr, bytes: &[u8]) -> Raw {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write request");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    parse(&buf)
}

/// Split a response off the wire into status, head and body.
pub(crate) fn parse(buf: &[u8]) -> Raw {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(buf.len());
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let body = buf.get(end + 4..).unwrap_or_default().to_vec();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let head = head.split_once("\r\n").map_or("", |(_, h)| h).to_string();
    Raw { status, head, body }
}

impl Raw {
    /// A header's value (the first, case-insensitive), or "".
    pub(crate) fn header(&self, name: &str) -> String {
        self.head
            .lines()
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
            .unwrap_or_default()
    }
}

#[tokio::test]
async fn the_twin_serves_one_conf_under_both() {
    let t = Twin::start(
        "upstream u { server {B0}; }
         server { listen {LISTEN}; location / { proxy_pass http://u; } }",
        1,
    )
    .await;
    let (v, n) = t
        .send(b"GET /x?y=1 HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!((v.status, n.status), (200, 200), "{v:?}\n{n:?}");
    assert_eq!(v.body, n.body);
    assert_eq!(
        t.uris(),
        (
            vec![vec!["/x?y=1".to_string()]],
            vec![vec!["/x?y=1".to_string()]]
        )
    );
}

/// What a TLS client saw: the handshake and the first response.
#[derive(Debug)]
pub(crate) struct TlsRaw {
    /// The served leaf certificate (DER).
    pub(crate) cert: Vec<u8>,
    /// The protocol ALPN chose.
    pub(crate) alpn: Option<String>,
    /// The TLS version, as rustls names it (`TLSv1_3`).
    pub(crate) version: String,
    /// The response to the bytes sent (status 0 when none were).
    pub(crate) raw: Raw,
}

/// A TLS handshake with `addr`, any certificate accepted: SNI `sni` (none
/// when None), ALPN `alpn`; then `bytes` written (when not empty) and the
/// response read until the peer closes or 5 s pass.
pub(crate) async fn tls_raw(
    addr: SocketAddr,
    sni: Option<&str>,
    alpn: &[&str],
    bytes: &[u8],
) -> TlsRaw {
    use tokio_rustls::rustls::pki_types::ServerName;
    let mut config = vigil_net::tls::client::ClientTls {
        verify: false,
        ca_file: None,
        client_auth: None,
    }
    .build()
    .expect("client config");
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    // An IP address as the name: rustls sends no SNI.
    let name = match sni {
        Some(n) => ServerName::try_from(n.to_string()).expect("server name"),
        None => ServerName::IpAddress(addr.ip().into()),
    };
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    let (_, conn) = tls.get_ref();
    let cert = conn.peer_certificates().expect("a certificate")[0].to_vec();
    let alpn = conn
        .alpn_protocol()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let version = format!("{:?}", conn.protocol_version().expect("version"));
    let mut buf = Vec::new();
    if !bytes.is_empty() {
        tls.write_all(bytes).await.expect("write request");
        let read = async {
            let mut chunk = [0u8; 4096];
            // Until EOF or an error (a close without close_notify).
            while let Ok(n) = tls.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    }
    TlsRaw {
        cert,
        alpn,
        version,
        raw: parse(&buf),
    }
}

impl Twin {
    /// [`tls_raw`] to both (vigil's, nginx's).
    pub(crate) async fn send_tls(
        &self,
        sni: Option<&str>,
        alpn: &[&str],
        bytes: &[u8],
    ) -> (TlsRaw, TlsRaw) {
        (
            tls_raw(self.vigil.addr, sni, alpn, bytes).await,
            tls_raw(self.nginx.addr, sni, alpn, bytes).await,
        )
    }
}

/// A test backend that answers on an address of its own.
pub(crate) trait Addressed {
    fn addr(&self) -> SocketAddr;
}

/// A twin whose two sides each have two backends of the test's own
/// (`{R0}`, `{R1}` in the conf) and an access log (`{LOG}`).
pub(crate) struct PerSide<B> {
    pub(crate) twin: Twin,
    pub(crate) vigil: [B; 2],
    pub(crate) nginx: [B; 2],
    dir: tempfile::TempDir,
}

impl<B: Addressed> PerSide<B> {
    /// Start `conf` (the inside of `http {}`) with `vigil`'s backends on
    /// vigil's side and `nginx`'s on nginx's.
    pub(crate) async fn start(conf: &str, vigil: [B; 2], nginx: [B; 2]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let side = |b: &[B; 2], name: &str| {
            vec![
                ("{R0}".to_string(), b[0].addr().to_string()),
                ("{R1}".to_string(), b[1].addr().to_string()),
                (
                    "{LOG}".to_string(),
                    dir.path().join(format!("{name}.log")).display().to_string(),
                ),
            ]
        };
        let twin = Twin::start_texts(conf, 0, &side(&vigil, "vigil"), &side(&nginx, "nginx")).await;
        Self {
            twin,
            vigil,
            nginx,
            dir,
        }
    }

    /// The lines of a side's access log (`"vigil"`, `"nginx"`), its
    /// backends' addresses written `R0`, `R1`.
    pub(crate) fn log(&self, side: &str) -> Vec<String> {
        let b = if side == "vigil" {
            &self.vigil
        } else {
            &self.nginx
        };
        std::fs::read_to_string(self.dir.path().join(format!("{side}.log")))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                l.replace(&b[0].addr().to_string(), "R0")
                    .replace(&b[1].addr().to_string(), "R1")
            })
            .collect()
    }

    /// The passive `fails` of vigil's peers of upstream `u`.
    pub(crate) fn fails(&self) -> Vec<u32> {
        let proxy = &self.twin.running.proxy;
        let u = proxy.current().registry.get("u").cloned().expect("u");
        u.status(proxy.clock().now())
            .iter()
            .map(|p| p.passive.fails)
            .collect()
    }

    /// Each side: its address, its backends and its name.
    pub(crate) fn sides(&self) -> [(SocketAddr, &[B; 2], &'static str); 2] {
        [
            (self.twin.vigil.addr, &self.vigil, "vigil"),
            (self.twin.nginx.addr, &self.nginx, "nginx"),
        ]
    }
}

#[tokio::test]
async fn an_http10_client_gets_nginxs_http11_status_line_and_its_connection_field() {
    let t = Twin::start(
        "upstream u { server {B0}; }
         server { listen {LISTEN}; keepalive_timeout 5s;
           location / { proxy_pass http://u; }
           location /r { return 200 \"r\\n\"; } }",
        1,
    )
    .await;
    // (status line, Connection) for each request, vigil's and nginx's.
    let first = |addr: SocketAddr, req: &'static [u8]| async move {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(req).await.expect("write");
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        let text = String::from_utf8_lossy(&got).into_owned();
        let line = text.lines().next().unwrap_or("").to_string();
        (line, parse(&got).header("connection"))
    };
    for req in [
        &b"GET / HTTP/1.0\r\nHost: a\r\n\r\n"[..],
        b"GET /r HTTP/1.0\r\nHost: a\r\n\r\n",
        b"GET /r HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n",
    ] {
        let v = first(t.vigil.addr, req).await;
        let n = first(t.nginx.addr, req).await;
        assert_eq!(v, n, "{}", String::from_utf8_lossy(req));
        assert!(v.0.starts_with("HTTP/1.1 200"), "{v:?}");
    }
}

/// A backend that records each request head as it came and answers
/// `response` (then closes).
pub(crate) async fn raw_backend(
    response: &'static [u8],
) -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let s = s.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf).await {
                        Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                s.lock()
                    .expect("seen")
                    .push(String::from_utf8_lossy(&got).into_owned());
                let _ = c.write_all(response).await;
            });
        }
    });
    (addr, seen)
}

/// The field names of a head, as spelt, sorted.
fn names_of(head: &str) -> Vec<String> {
    let mut n: Vec<String> = head
        .split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':').map(|(n, _)| n.to_string()))
        .collect();
    n.sort();
    n
}

#[tokio::test]
async fn header_names_keep_the_spelling_the_client_the_conf_and_the_upstream_wrote() {
    const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Upstream-Case: v\r\n\
        x-lower-up: w\r\nCache-Control: no-store\r\nETag: \"e\"\r\nConnection: close\r\n\r\nok";
    let (vb, vseen) = raw_backend(RESPONSE).await;
    let (nb, nseen) = raw_backend(RESPONSE).await;
    let t = Twin::start_with(
        "upstream u { server {R0}; }
         server { listen {LISTEN};
           location / { proxy_pass http://u;
             proxy_set_header X-Real-IP $remote_addr; proxy_set_header x-lower-set yes; }
           location /added/ { proxy_pass http://u; add_header X-Added yes; }
           location /keep/ { proxy_pass http://u; proxy_http_version 1.1;
             proxy_set_header Connection \"\"; } }",
        0,
        &[("{R0}", vb)],
        &[("{R0}", nb)],
    )
    .await;
    let req: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\nX-Weird-CASE: 1\r\nuser-agent: t\r\n\
        ACCEPT: */*\r\nConnection: close\r\n\r\n";
    let (v, n) = t.send(req).await;
    assert_eq!((v.status, n.status), (200, 200), "{v:?}\n{n:?}");
    // What the upstream got: the client's spelling, the conf's, nginx's
    // own `Host` and `Connection` (in nginx's order or not: sorted).
    let (vh, nh) = (
        vseen.lock().expect("seen")[0].clone(),
        nseen.lock().expect("seen")[0].clone(),
    );
    assert_eq!(names_of(&vh), names_of(&nh), "vigil:\n{vh}\nnginx:\n{nh}");
    assert!(names_of(&vh).contains(&"X-Weird-CASE".to_string()), "{vh}");
    // What the client got: the upstream's fields as it spelt them, and
    // nginx's own fields as nginx spells them (nginx's `Server` aside:
    // vigil sends none).
    let client_names = |head: &str| -> Vec<String> {
        names_of(&format!("HTTP/1.1 200 OK\r\n{head}"))
            .into_iter()
            .filter(|n| n != "Server")
            .collect()
    };
    assert_eq!(
        client_names(&v.head),
        client_names(&n.head),
        "vigil:\n{}\nnginx:\n{}",
        v.head,
        n.head
    );
    // A location that adds a field: the added one as written; the
    // upstream's (but `x-lower-up`, see docs/semantics.md) as they came.
    let (v, n) = t
        .send(b"GET /added/ HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await;
    let known = |head: &str| -> Vec<String> {
        client_names(head)
            .into_iter()
            .filter(|n| n != "x-lower-up" && n != "X-Lower-Up")
            .collect()
    };
    assert_eq!(
        known(&v.head),
        known(&n.head),
        "vigil:\n{}\nnginx:\n{}",
        v.head,
        n.head
    );
    assert!(
        known(&v.head).contains(&"X-Added".to_string()),
        "{}",
        v.head
    );
    // The keepalive recipe's `Connection ""`: no Connection upstream.
    let (v, n) = t
        .send(b"GET /keep/ HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!((v.status, n.status), (200, 200));
    let (vh, nh) = (
        vseen.lock().expect("seen")[2].clone(),
        nseen.lock().expect("seen")[2].clone(),
    );
    assert_eq!(names_of(&vh), names_of(&nh), "vigil:\n{vh}\nnginx:\n{nh}");
    assert!(
        !names_of(&vh)
            .iter()
            .any(|n| n.eq_ignore_ascii_case("connection")),
        "{vh}"
    );
}
