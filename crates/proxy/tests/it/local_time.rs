//! `$time_local` and `$time_iso8601` in the local time zone, as nginx
//! writes them: both started with `TZ=Asia/Shanghai` write `+0800`.
//!
//! The zone is the process's (read once, as nginx reads it at start), so
//! the test runs itself again in a child test process with `TZ` set.

use std::path::Path;
use std::process::Command;

use crate::support::eventually;
use crate::twin::Twin;

const CHILD: &str = "VIGIL_LOCAL_TIME_CHILD";

#[test]
fn time_local_follows_tz_as_nginx() {
    if std::env::var_os(CHILD).is_some() {
        return in_shanghai();
    }
    assert!(
        Path::new("/usr/share/zoneinfo/Asia/Shanghai").exists(),
        "the TZ database (Debian's tzdata) is needed"
    );
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "local_time::time_local_follows_tz_as_nginx",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("TZ", "Asia/Shanghai")
        .output()
        .expect("run the child test");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child test failed:\n{text}");
    assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
}

/// In the child (TZ=Asia/Shanghai for vigil in process and for the nginx it starts).
fn in_shanghai() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let conf = r#"
        log_format t '$time_local|$time_iso8601|$msec|$status';
        upstream u { server {B0}; }
        server { listen {LISTEN};
          access_log {LOG}/t.log t;
          location /c { access_log {LOG}/c.log combined; proxy_pass http://u; }
          location / { proxy_pass http://u; }
        }"#;
        let (vd, nd) = (
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
        );
        let side = |d: &Path| vec![("{LOG}".to_string(), d.display().to_string())];
        let t = Twin::start_texts(conf, 1, &side(vd.path()), &side(nd.path())).await;
        for target in ["/", "/c"] {
            let req = format!("GET {target} HTTP/1.1\r\nHost: h.test\r\nConnection: close\r\n\r\n");
            let (v, n) = t.send(req.as_bytes()).await;
            assert_eq!((v.status, n.status), (200, 200));
        }
        let read = |d: &Path, f: &str| std::fs::read_to_string(d.join(f)).unwrap_or_default();
        eventually("both lines", || {
            ["t.log", "c.log"]
                .iter()
                .all(|f| !read(vd.path(), f).is_empty() && !read(nd.path(), f).is_empty())
        })
        .await;
        let shanghai = jiff::tz::TimeZone::get("Asia/Shanghai").expect("Asia/Shanghai");
        // Each side's line against its own `$msec`, in Shanghai's time.
        let check = |who: &str, line: &str| {
            let f: Vec<&str> = line.trim().split('|').collect();
            assert_eq!(f.len(), 4, "{who}: {line:?}");
            let secs: i64 = f[2].split('.').next().unwrap_or("").parse().expect("msec");
            let at = jiff::Timestamp::from_second(secs)
                .expect("time")
                .to_zoned(shanghai.clone());
            let local = at.strftime("%d/%b/%Y:%H:%M:%S %z").to_string();
            let iso = at.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string();
            assert_eq!(
                (f[0], f[1], f[3]),
                (local.as_str(), iso.as_str(), "200"),
                "{who}"
            );
            assert!(
                f[0].ends_with(" +0800") && f[1].ends_with("+08:00"),
                "{who}: {line:?}"
            );
        };
        check("vigil", &read(vd.path(), "t.log"));
        check("nginx", &read(nd.path(), "t.log"));
        let bracket = |l: &str| l.split(['[', ']']).nth(1).unwrap_or("").to_string();
        let (vc, nc) = (read(vd.path(), "c.log"), read(nd.path(), "c.log"));
        assert!(bracket(&vc).ends_with(" +0800"), "{vc:?}");
        assert!(bracket(&nc).ends_with(" +0800"), "{nc:?}");
    });
}
