//! A `server` name with several addresses, under vigil and under stock
//! nginx: nginx makes one peer per address. The name `multi` resolves to
//! 127.0.0.1, 127.0.0.2 and 127.0.0.3 (a backend on each, one port): for
//! nginx through a private /etc/hosts (nginx runs in a user and mount
//! namespace with a hosts file bound over /etc/hosts: getaddrinfo, as
//! nginx resolves at start), for vigil through an injected resolver giving
//! the same addresses in the same order.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use crate::support::{start_proxy_with, Backend, Running};
use crate::twin::{free_addr, nginx_bin, raw, Nginx};

const HOSTS: &str = "127.0.0.1 multi\n127.0.0.2 multi\n127.0.0.3 multi\n";

/// Whether this machine lets the test bind a file over /etc/hosts in a
/// private mount namespace (`unshare -m`, as root: in a user namespace of
/// its own, nginx's master could not switch its workers to `nobody`).
fn namespaces_work() -> bool {
    Command::new("sh")
        .args([
            "-c",
            "[ \"$(id -u)\" = 0 ] && unshare -m sh -c 'mount --bind /dev/null /etc/hosts'",
        ])
        .status()
        .is_ok_and(|s| s.success())
}

/// Three backends `a1`..`a3` on 127.0.0.{1,2,3} and one port, and `o` on 127.0.0.1.
async fn backends() -> (u16, Vec<Backend>) {
    for _ in 0..20 {
        let first = Backend::named_on("127.0.0.1:0".parse().expect("addr"), "a1")
            .await
            .expect("bind");
        let port = first.addr.port();
        let rest = [
            Backend::named_on(SocketAddr::from(([127, 0, 0, 2], port)), "a2").await,
            Backend::named_on(SocketAddr::from(([127, 0, 0, 3], port)), "a3").await,
        ];
        if let [Some(b), Some(c)] = rest {
            let other = Backend::named("o").await;
            return (port, vec![first, b, c, other]);
        }
    }
    panic!("no port free on 127.0.0.1, .2 and .3");
}

fn fill(conf: &str, port: u16, b: &[Backend]) -> String {
    conf.replace("{P}", &port.to_string())
        .replace("{O}", &b[3].addr.to_string())
}

struct Both {
    vigil: SocketAddr,
    nginx: SocketAddr,
    _running: Running,
    _stock: Nginx,
    _backends: Vec<Backend>,
    _dir: tempfile::TempDir,
}

/// `conf` under vigil and nginx, both in front of one set of backends (a
/// `hash ... consistent` ring hashes the server text, port included: the
/// two must see the same text).
async fn start(conf: &str) -> Both {
    let (port, backends) = backends().await;
    let conf = fill(conf, port, &backends);
    let resolve = |host: &str, port: u16| -> std::io::Result<Vec<SocketAddr>> {
        match host {
            "multi" => Ok((1..=3)
                .map(|i| SocketAddr::from(([127, 0, 0, i], port)))
                .collect()),
            _ => vigil_config::literal_resolver(host, port),
        }
    };
    let running = start_proxy_with(&format!("http {{\n{conf}\n}}"), &resolve).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, HOSTS).expect("write hosts");
    let wrapper: PathBuf = dir.path().join("nginx");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec unshare -m sh -c 'mount --bind \"$0\" /etc/hosts && exec \"$@\"' {} {} \"$@\"\n",
            hosts.display(),
            nginx_bin().display()
        ),
    )
    .expect("write wrapper");
    let chmod = Command::new("chmod")
        .arg("+x")
        .arg(&wrapper)
        .status()
        .expect("chmod");
    assert!(chmod.success());
    let naddr = free_addr();
    let stock = Nginx::start_bin(
        &conf.replace("{LISTEN}", &naddr.to_string()),
        naddr,
        wrapper,
    )
    .await;
    Both {
        vigil: running.addr,
        nginx: naddr,
        _running: running,
        _stock: stock,
        _backends: backends,
        _dir: dir,
    }
}

/// GET `path` on each side, one connection each: (body, `X-Addr`) per side.
async fn get(b: &Both, path: &str) -> ((String, String), (String, String)) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let v = raw(b.vigil, req.as_bytes()).await;
    let n = raw(b.nginx, req.as_bytes()).await;
    let seen = |r: &crate::twin::Raw| {
        assert_eq!(r.status, 200, "{r:?}");
        (
            String::from_utf8_lossy(&r.body).into_owned(),
            r.header("X-Addr"),
        )
    };
    (seen(&v), seen(&n))
}

const CONF: &str = "
    upstream rr { server multi:{P} weight=2; server {O}; }
    upstream ch { hash $arg_k consistent; server multi:{P}; server {O}; }
    upstream ip { hash $arg_k; server multi:{P}; server {O}; }
    server {
        listen {LISTEN};
        add_header X-Addr $upstream_addr always;
        location /rr { proxy_pass http://rr; }
        location /ch { proxy_pass http://ch; }
        location /h { proxy_pass http://ip; }
        location /implicit { proxy_pass http://multi:{P}; }
    }";

#[tokio::test]
async fn a_name_of_three_addresses_is_balanced_as_nginx_balances_it() {
    if !namespaces_work() {
        // CI (root) sets VIGIL_REQUIRE_NAMESPACES: there the test must run.
        assert!(
            std::env::var_os("VIGIL_REQUIRE_NAMESPACES").is_none(),
            "VIGIL_REQUIRE_NAMESPACES is set but `unshare -m` with a bind mount over /etc/hosts does not work here"
        );
        eprintln!("skipped: needs root and `unshare -m` to bind a hosts file over /etc/hosts");
        return;
    }
    let b = start(CONF).await;
    let mut got = (Vec::new(), Vec::new());
    let mut push = |(v, n): ((String, String), (String, String))| {
        got.0.push(v);
        got.1.push(n);
    };
    // Smooth weighted round robin over 3 peers of weight 2 and one of 1.
    for _ in 0..14 {
        push(get(&b, "/rr").await);
    }
    // The implicit upstream: plain round robin over the three.
    for _ in 0..6 {
        push(get(&b, "/implicit").await);
    }
    // Keys: the ring holds the written name once; the plain hash walks
    // the peers' weights.
    for i in 0..40 {
        push(get(&b, &format!("/ch?k=key{i}")).await);
        push(get(&b, &format!("/h?k=key{i}")).await);
    }
    assert_eq!(got.0, got.1, "vigil (left) and nginx (right) differ");
    let bodies: Vec<&str> = got.0.iter().map(|(b, _)| b.as_str()).collect();
    for name in ["a1", "a2", "a3", "o"] {
        assert!(bodies.contains(&name), "{name} never answered: {bodies:?}");
    }
    assert!(
        got.0.iter().any(|(_, a)| a.starts_with("127.0.0.3:")),
        "{:?}",
        got.0
    );
}

/// A backend on a unix-domain socket at `path` answering `u` and recording
/// what it saw (request line and headers in order).
struct UnixBackend {
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: tokio_util::sync::CancellationToken,
}

impl UnixBackend {
    fn start(path: &std::path::Path) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let listener = tokio::net::UnixListener::bind(path).expect("bind unix");
        // nginx's workers run as `nobody` when the test runs as root.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let (s, st) = (seen.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    r = listener.accept() => match r { Ok((x, _)) => x, Err(_) => continue },
                    _ = st.cancelled() => return,
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            // vigil speaks HTTP/1.1 upstream and orders
                            // headers its own way (semantics.md): the request
                            // and the header set are compared.
                            let mut headers: Vec<String> = req
                                .headers()
                                .iter()
                                .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap_or("?")))
                                .collect();
                            headers.sort();
                            let text =
                                format!("{} {}\n{}", req.method(), req.uri(), headers.join("\n"));
                            s.lock().expect("lock").push(text);
                            async {
                                Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                    http_body_util::Full::new(bytes::Bytes::from_static(b"u")),
                                ))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { seen, stop }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("lock").clone()
    }
}

impl Drop for UnixBackend {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A temp dir nginx's workers (`nobody`) can enter.
fn open_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

#[tokio::test]
async fn unix_socket_servers_are_served_as_nginx_serves_them() {
    let (vdir, ndir) = (open_dir(), open_dir());
    let vb = UnixBackend::start(&vdir.path().join("app.sock"));
    let nb = UnixBackend::start(&ndir.path().join("app.sock"));
    let vars = |d: &tempfile::TempDir| {
        vec![
            (
                "{SOCK}".to_string(),
                d.path().join("app.sock").display().to_string(),
            ),
            (
                "{MISSING}".to_string(),
                d.path().join("missing.sock").display().to_string(),
            ),
        ]
    };
    let t = crate::twin::Twin::start_texts(
        "upstream u { server unix:{SOCK}; }
         upstream m { server unix:{MISSING}; server {B0}; }
         upstream x { server unix:{MISSING}; }
         server {
             listen {LISTEN};
             add_header X-Addr $upstream_addr always;
             location / { proxy_pass http://u; }
             location /m { proxy_pass http://m; }
             location /x { proxy_pass http://x; }
         }",
        1,
        &vars(&vdir),
        &vars(&ndir),
    )
    .await;
    let same = |v: &crate::twin::Raw, n: &crate::twin::Raw| {
        let norm = |r: &crate::twin::Raw, dir: &tempfile::TempDir, b0: SocketAddr| {
            (
                r.status,
                r.header("X-Addr")
                    .replace(&dir.path().display().to_string(), "DIR")
                    .replace(&b0.to_string(), "B0"),
            )
        };
        (
            norm(v, &vdir, t.vigil.backends[0].addr),
            norm(n, &ndir, t.nginx.backends[0].addr),
        )
    };
    let req = |path: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: a.test\r\nX-Y: 1\r\nConnection: close\r\n\r\n")
    };
    // A unix server: the request and `$upstream_addr` as nginx has them.
    let (v, n) = t.send(req("/p?q=1").as_bytes()).await;
    let (sv, sn) = same(&v, &n);
    assert_eq!(sv, sn);
    assert_eq!(sv, (200, "unix:DIR/app.sock".to_string()));
    assert_eq!(
        (v.body.as_slice(), n.body.as_slice()),
        (&b"u"[..], &b"u"[..])
    );
    assert_eq!(vb.seen(), nb.seen());
    assert_eq!(vb.seen().len(), 1);
    // A path nobody listens on: nginx's connect() `error`, the next server
    // tried; then the failed one is out (max_fails=1) and not tried.
    for _ in 0..2 {
        let (v, n) = t.send(req("/m").as_bytes()).await;
        let (sv, sn) = same(&v, &n);
        assert_eq!(sv, sn);
        assert_eq!(v.body, n.body);
    }
    let (v, n) = t.send(req("/x").as_bytes()).await;
    let (sv, sn) = same(&v, &n);
    assert_eq!(sv, sn);
    assert_eq!(sv, (502, "unix:DIR/missing.sock".to_string()));
}
