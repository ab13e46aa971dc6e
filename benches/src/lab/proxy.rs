//! The proxy under test as a child process: `vigil serve` or a stock nginx,
//! on one nginx.conf rendered from a [`Site`], each in its own temporary
//! directory (conf, logs, nginx's temp paths), stopped on drop.

use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, Instant};

/// One upstream `u` and one server proxying `/` to it.
#[derive(Debug, Clone)]
pub struct Site {
    /// The proxy's listen address.
    pub listen: SocketAddr,
    /// The upstream's servers.
    pub servers: Vec<SocketAddr>,
    /// Parameters of every `server` line, e.g. `max_fails=1 fail_timeout=2s`.
    pub server_params: String,
    /// More directives inside `upstream u {}` (vigil-only ones go here;
    /// nginx is given the site without them).
    pub upstream_extra: String,
    /// Directives inside `location / {}` besides `proxy_pass`.
    pub location: String,
}

/// Which proxy a [`Proxy`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `vigil serve --nginx-conf`.
    Vigil,
    /// Stock nginx (`/usr/sbin/nginx` or the first `nginx` on PATH).
    Nginx,
}

/// A running proxy.
#[derive(Debug)]
pub struct Proxy {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Which one it is.
    pub kind: Kind,
    bin: PathBuf,
    dir: tempfile::TempDir,
    child: Child,
}

// === impl Site ===

impl Site {
    /// A site on `listen` over `servers`, with nginx's defaults everywhere.
    pub fn new(listen: SocketAddr, servers: Vec<SocketAddr>) -> Self {
        Self {
            listen,
            servers,
            server_params: String::new(),
            upstream_extra: String::new(),
            location: String::new(),
        }
    }

    /// The same site without `upstream_extra` (what stock nginx is given).
    pub fn stock(&self) -> Self {
        Self {
            upstream_extra: String::new(),
            ..self.clone()
        }
    }

    /// The whole nginx.conf, with paths under `dir`.
    pub fn render(&self, dir: &Path) -> String {
        let d = dir.display();
        let mut servers = String::new();
        for s in &self.servers {
            let _ = writeln!(servers, "        server {s} {};", self.server_params);
        }
        format!(
            "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n    access_log off;\n\
             \x20   client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n\
             \x20   fastcgi_temp_path {d}/fastcgi;\n    uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n\
             \x20   upstream u {{\n{servers}        {}\n    }}\n\
             \x20   server {{\n        listen {};\n        location / {{\n            proxy_pass http://u;\n            {}\n        }}\n    }}\n}}\n",
            self.upstream_extra, self.listen, self.location
        )
    }
}

// === impl Proxy ===

impl Proxy {
    /// `vigil serve` (binary `bin`, one worker thread, no admin API) on
    /// `site`, once it accepts connections.
    pub async fn vigil(bin: &Path, site: &Site) -> io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let conf = write_conf(dir.path(), site)?;
        let log = std::fs::File::create(dir.path().join("error.log"))?;
        let child = Command::new(bin)
            .args(["serve", "--no-admin", "--threads", "1", "--nginx-conf"])
            .arg(&conf)
            .env("VIGIL_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", bin.display())))?;
        Self::ready(Kind::Vigil, bin.to_path_buf(), dir, child, site.listen).await
    }

    /// Stock nginx (one worker, in the foreground) on `site` without its
    /// `upstream_extra`, once it accepts connections.
    pub async fn nginx(site: &Site) -> io::Result<Self> {
        let bin = vigil_testkit::find_nginx().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "stock nginx not found (PATH, /usr/sbin/nginx): apt-get install -y nginx",
            )
        })?;
        let dir = tempfile::tempdir()?;
        let conf = write_conf(dir.path(), &site.stock())?;
        let child = Command::new(&bin)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", bin.display())))?;
        Self::ready(Kind::Nginx, bin, dir, child, site.listen).await
    }

    async fn ready(
        kind: Kind,
        bin: PathBuf,
        dir: tempfile::TempDir,
        child: Child,
        addr: SocketAddr,
    ) -> io::Result<Self> {
        let mut p = Self {
            addr,
            kind,
            bin,
            dir,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let attempt = timeout(Duration::from_secs(1), TcpStream::connect(addr)).await;
            if matches!(attempt, Ok(Ok(_))) {
                return Ok(p);
            }
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(io::Error::other(format!(
                    "{kind:?} exited ({status}) before listening on {addr}: {}",
                    p.log()
                )));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{kind:?} did not listen on {addr} within 10s: {}", p.log()),
                ));
            }
            sleep(Duration::from_millis(20)).await;
        }
    }

    /// Its error log so far (nginx's error.log, vigil's stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// The conf it runs.
    pub fn conf(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nginx.conf")).unwrap_or_default()
    }
}

fn write_conf(dir: &Path, site: &Site) -> io::Result<PathBuf> {
    for sub in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, site.render(dir))?;
    Ok(conf)
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if self.kind == Kind::Nginx {
            let conf = self.dir.path().join("nginx.conf");
            vigil_testkit::stop_nginx(&self.bin, self.dir.path(), &conf, &mut self.child);
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
