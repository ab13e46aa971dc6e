//! `vigil check --fleet-etcd`: checker-only members beside stock nginx, in
//! one fleet. Each member renders its own files for its own nginx; the
//! backends count who probes them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::support::{
    distinct, free_port, http_get, probed_at_least, wait_for, Backends, Etcd, Member, INTERVAL_MS,
};

/// A stock nginx in the foreground with everything under `dir`, stopped on drop.
struct Nginx {
    bin: PathBuf,
    dir: PathBuf,
    conf: PathBuf,
    child: Child,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        vigil_testkit::stop_nginx(&self.bin, &self.dir, &self.conf, &mut self.child);
    }
}

/// One member: `vigil check` rendering `dir/upstreams/u.conf` for its
/// nginx, which listens on `member.listen`.
struct CheckMember {
    member: Member,
    render: PathBuf,
    _nginx: Nginx,
}

impl CheckMember {
    fn start(dir: &Path, name: &str, fleet: &str, etcd: &str, b: &Backends) -> Self {
        let dir = dir.join(name);
        let render = dir.join("upstreams");
        for sub in ["upstreams", "body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            std::fs::create_dir_all(dir.join(sub)).expect("test step");
        }
        let servers: String = b
            .addrs
            .iter()
            .map(|a| format!("    server {a};\n"))
            .collect();
        let timeout_ms = INTERVAL_MS * 5 / 6;
        let src = dir.join("upstreams.src.conf");
        std::fs::write(
            &src,
            format!(
                "upstream u {{\n{servers}    check interval={INTERVAL_MS} rise=1 fall=2 timeout={timeout_ms} type=http;\n    check_http_send \"GET /health HTTP/1.0\\r\\n\\r\\n\";\n}}\n"
            ),
        )
        .expect("test step");
        let port = free_port().port();
        let d = dir.display();
        let conf = dir.join("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
                 events {{ worker_connections 128; }}\n\
                 http {{\n    access_log off;\n\
                 \x20   client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n\
                 \x20   fastcgi_temp_path {d}/fastcgi;\n    uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n\
                 \x20   include {d}/upstreams/*.conf;\n\
                 \x20   server {{\n        listen 127.0.0.1:{port};\n\
                 \x20       location / {{ proxy_pass http://u; proxy_next_upstream error timeout http_500; }}\n    }}\n}}\n"
            ),
        )
        .expect("test step");
        let bin = vigil_testkit::nginx_bin();
        let nginx = |tail: &str| format!("{} -p {d} -c {} {tail}", bin.display(), conf.display());
        let vigil = |extra: &[String]| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_vigil"));
            cmd.arg("check")
                .arg(format!("--upstreams={}", src.display()))
                .arg(format!("--render-dir={}", render.display()))
                .arg(format!("--nginx-conf={}", conf.display()))
                .arg(format!("--nginx-bin={}", bin.display()))
                .arg(format!("--nginx-test-cmd={}", nginx("-t -q")))
                .arg(format!("--nginx-reload-cmd={}", nginx("-s reload")))
                .args([
                    "--debounce=200ms",
                    "--max-delay=500ms",
                    "--reload-min-interval=200ms",
                    "--down-reload-min-interval=100ms",
                ])
                .args(extra)
                .env_remove("VIGIL_ADMIN_TOKEN")
                .env("VIGIL_LOG", "info");
            cmd
        };
        // The files nginx includes exist before it first starts.
        let ok = vigil(&["--once".into()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("vigil check --once");
        assert!(ok.success(), "{name}: vigil check --once");
        let child = Command::new(&bin)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf)
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .spawn()
            .expect("start nginx");
        let nginx = Nginx {
            bin: bin.clone(),
            dir: dir.clone(),
            conf: conf.clone(),
            child,
        };
        let listen = SocketAddr::from(([127, 0, 0, 1], port));
        let pid = dir.join("nginx.pid");
        wait_for(&format!("{name}'s nginx"), Duration::from_secs(10), || {
            pid.exists() && std::net::TcpStream::connect(listen).is_ok()
        });
        let admin = free_port();
        let log = dir.join("vigil.log");
        let child = vigil(&[
            format!("--admin-listen={admin}"),
            format!("--fleet-etcd={etcd}"),
            format!("--fleet-name={fleet}"),
            format!("--fleet-member={name}"),
            "--fleet-replicas=1".into(),
            "--fleet-ttl=2s".into(),
            "--fleet-etcd-timeout=500ms".into(),
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("test step"))
        .spawn()
        .expect("vigil check");
        let member = Member::started(b, name, listen, admin, log, child, |m| m.fleet().is_some());
        CheckMember {
            member,
            render,
            _nginx: nginx,
        }
    }

    /// The rendered server line of `addr`.
    fn rendered(&self, addr: SocketAddr) -> String {
        let text = std::fs::read_to_string(self.render.join("u.conf")).unwrap_or_default();
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("server {addr}")))
            .unwrap_or("")
            .to_string()
    }
}

#[test]
fn checker_only_members_beside_stock_nginx_share_the_probes_and_render_a_failure_down_everywhere() {
    let tmp = tempfile::tempdir().expect("test step");
    let etcd = Etcd::start();
    let b = Backends::start(8);
    let members: Vec<CheckMember> = ["c-m1", "c-m2"]
        .iter()
        .map(|n| CheckMember::start(tmp.path(), n, "c", &etcd.url(), &b))
        .collect();
    let plain: Vec<&Member> = members.iter().map(|m| &m.member).collect();
    wait_for(
        "both checkers to join and see each other",
        Duration::from_secs(30),
        || {
            plain
                .iter()
                .all(|m| m.state() == "joined" && m.members().len() == 2)
        },
    );
    // Each target probed by exactly R=1 member, its owner.
    b.clear_probes();
    probed_at_least(&b, 4, Duration::from_secs(30));
    let owners = plain[0].owners();
    for (i, addr) in b.addrs.iter().enumerate() {
        let seen = distinct(&b.probers(i));
        assert_eq!(
            seen,
            distinct(&owners[&addr.to_string()]),
            "{addr}: probed by its one owner only"
        );
    }
    // Both nginx serve from every backend.
    for m in &plain {
        for _ in 0..8 {
            let (status, _) = http_get(m.listen, "/").expect("answer");
            assert_eq!(status, 200, "{}'s nginx serves", m.name);
        }
    }
    // A backend fails: its owner's probes decide, and every member renders
    // it down for its own nginx, which stops sending it requests.
    let bad = b.addrs[3];
    let owner = owners[&bad.to_string()][0].clone();
    b.failing[3].store(true, Ordering::SeqCst);
    wait_for(
        "every member to render the failing backend down",
        Duration::from_secs(15),
        || members.iter().all(|m| m.rendered(bad).contains(" down;")),
    );
    for m in &members {
        eprintln!("{}: {}", m.member.name, m.rendered(bad));
    }
    wait_for(
        "every nginx to have reloaded with it down",
        Duration::from_secs(15),
        || {
            plain
                .iter()
                .all(|m| m.peer(bad)["nginx"]["given"] == "down")
        },
    );
    let before = b.traffic[3].load(Ordering::SeqCst);
    for m in &plain {
        for _ in 0..16 {
            let (status, _) = http_get(m.listen, "/").expect("answer");
            assert_eq!(status, 200, "{}'s nginx serves from the others", m.name);
        }
    }
    assert_eq!(
        b.traffic[3].load(Ordering::SeqCst),
        before,
        "no nginx sent the failing backend a request"
    );
    for m in plain.iter().filter(|m| m.name != owner) {
        let text = m.explain(bad);
        assert!(
            text.contains(&format!("probed by member {owner}")),
            "{}: explain names the member that probed: {text}",
            m.name
        );
    }
}
