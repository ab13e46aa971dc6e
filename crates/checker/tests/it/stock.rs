//! A stock nginx started by a test, in the foreground, with its pid file,
//! logs and temp paths in a test directory; and a plain client for it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
pub(crate) use vigil_testkit::{free_port, nginx_bin};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A stock nginx in the foreground with everything under `dir`.
pub(crate) struct Nginx {
    bin: PathBuf,
    dir: PathBuf,
    conf: PathBuf,
    child: Child,
    port: u16,
}

impl Nginx {
    pub(crate) fn write_conf(dir: &Path, port: u16) -> PathBuf {
        let d = dir.display();
        for sub in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            std::fs::create_dir_all(dir.join(sub)).expect("test step");
        }
        let conf = dir.join("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
                 events {{ worker_connections 128; }}\n\
                 http {{\n    access_log off;\n\
                 \x20   client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n\
                 \x20   fastcgi_temp_path {d}/fastcgi;\n    uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n\
                 \x20   upstream legacy {{ server 127.0.0.1:9; }}\n\
                 \x20   include {d}/upstreams/*.conf;\n\
                 \x20   server {{\n        listen 127.0.0.1:{port};\n\
                 \x20       location / {{\n            proxy_pass http://app;\n\
                 \x20           proxy_next_upstream error timeout;\n\
                 \x20           proxy_connect_timeout 1s;\n\
                 \x20           add_header X-Upstream $upstream_addr always;\n        }}\n    }}\n}}\n"
            ),
        )
        .expect("test step");
        conf
    }

    pub(crate) fn start(bin: &Path, dir: &Path, conf: &Path, port: u16) -> Self {
        let child = Command::new(bin)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(conf)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .spawn()
            .expect("start nginx");
        Self {
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            conf: conf.to_path_buf(),
            child,
            port,
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        vigil_testkit::stop_nginx(&self.bin, &self.dir, &self.conf, &mut self.child);
    }
}

/// One GET through nginx: status, `X-Upstream`, body.
pub(crate) async fn get(addr: SocketAddr) -> Option<(u16, String, String)> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n")
        .await
        .ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let upstream = head
        .lines()
        .find_map(|l| l.strip_prefix("X-Upstream: "))
        .unwrap_or("")
        .to_string();
    Some((status, upstream, body.to_string()))
}
