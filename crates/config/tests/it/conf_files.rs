//! Reading configuration files: only regular files, at most 16 MiB, for
//! the main file, every `include` (plain or wildcard) and a `vigil.toml`;
//! and includes taken from memory, which never touch the disk.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use vigil_config::nginx::syntax::{self, Includes};
use vigil_config::read::MAX_FILE_SIZE;
use vigil_config::{literal_resolver, nginx, toml};

fn load_err(path: &Path) -> String {
    match nginx::load_file(path, &literal_resolver) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

fn mkfifo(path: &Path) {
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("run mkfifo");
    assert!(st.success(), "mkfifo {}", path.display());
}

#[test]
fn an_include_of_a_device_is_refused_at_the_include() {
    // Issue item 10: this read /dev/zero until memory ran out.
    let dir = tempfile::tempdir().expect("tempdir");
    let main = dir.path().join("nginx.conf");
    std::fs::write(&main, "events { }\nhttp {\n  include /dev/zero;\n}\n").expect("write");
    assert_eq!(
        load_err(&main),
        format!(
            "{}:3:3: cannot read \"/dev/zero\": it is a character device, not a regular file (vigil reads configuration only from regular files)",
            main.display()
        )
    );
}

#[test]
fn fifos_sockets_and_directories_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    mkfifo(&d.join("fifo.conf"));
    let _sock = std::os::unix::net::UnixListener::bind(d.join("sock.conf")).expect("socket");
    std::fs::create_dir(d.join("dir.conf")).expect("dir");
    let main = d.join("nginx.conf");
    for (name, what) in [
        ("fifo.conf", "a FIFO"),
        ("sock.conf", "a socket"),
        ("dir.conf", "a directory"),
    ] {
        // Plain and wildcard includes, both; a FIFO must not block the read.
        for pattern in [name.to_string(), name.replace(".conf", "*")] {
            std::fs::write(&main, format!("http {{ include {pattern}; }}\n")).expect("write");
            let e = load_err(&main);
            assert!(
                e.starts_with(&format!("{}:1:8: cannot read ", main.display()))
                    && e.contains(&format!("it is {what}, not a regular file")),
                "{pattern}: {e}"
            );
        }
    }
    // The main file itself, and a vigil.toml.
    let e = load_err(&d.join("fifo.conf"));
    assert!(e.contains("it is a FIFO"), "{e}");
    let e = toml::load_file(&d.join("fifo.conf"), &literal_resolver)
        .expect_err("a FIFO")
        .to_string();
    assert!(e.contains("it is a FIFO"), "{e}");
    let e = toml::load_file(Path::new("/dev/zero"), &literal_resolver)
        .expect_err("a device")
        .to_string();
    assert_eq!(
        e,
        "cannot read /dev/zero: it is a character device, not a regular file (vigil reads configuration only from regular files)"
    );
}

#[test]
fn a_file_over_the_size_cap_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = dir.path().join("big.conf");
    // Sparse: no 16 MiB written.
    let f = std::fs::File::create(&big).expect("create");
    f.set_len(MAX_FILE_SIZE + 1).expect("set_len");
    let main = dir.path().join("nginx.conf");
    std::fs::write(&main, "http { include big.conf; }\n").expect("write");
    let e = load_err(&main);
    assert!(
        e.ends_with("larger than 16 MiB, vigil's limit for a configuration file"),
        "{e}"
    );
    let e = toml::load_file(&big, &literal_resolver)
        .expect_err("too big")
        .to_string();
    assert!(e.contains("larger than 16 MiB"), "{e}");
    // At the cap is fine (it is all NUL bytes: a parse error, not a size one).
    f.set_len(MAX_FILE_SIZE).expect("set_len");
    let e = load_err(&main);
    assert!(!e.contains("larger than"), "{e}");
}

#[test]
fn a_symlink_to_a_regular_file_is_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::write(d.join("real.conf"), "upstream a { server 127.0.0.1:1; }\n").expect("write");
    std::os::unix::fs::symlink(d.join("real.conf"), d.join("link.conf")).expect("symlink");
    let main = d.join("nginx.conf");
    std::fs::write(&main, "http { include link.conf; }\n").expect("write");
    let loaded = nginx::load_file(&main, &literal_resolver).expect("loads");
    assert_eq!(loaded.config.upstreams[0].name, "a");
}

#[test]
fn includes_from_memory_never_touch_the_disk() {
    let mut files = BTreeMap::new();
    files.insert(
        PathBuf::from("/conf/up/a.conf"),
        "upstream a { server 127.0.0.1:1; }".to_string(),
    );
    files.insert(
        PathBuf::from("/conf/up/b.conf"),
        "upstream b { server 127.0.0.1:2; }".to_string(),
    );
    files.insert(
        PathBuf::from("/conf/loop.conf"),
        "include loop.conf;".to_string(),
    );
    let load = |src: &str| {
        nginx::load_str_with(
            src,
            Path::new("/conf/nginx.conf"),
            Path::new("/conf"),
            &literal_resolver,
            Includes::Memory(&files),
        )
    };
    let loaded = load("http { include up/*.conf; include ./up/../up/a.conf; }");
    // `..` is not resolved in memory: that path is not there.
    let e = loaded.expect_err("no such file").to_string();
    assert!(
        e.contains("included files are read from memory here"),
        "{e}"
    );
    let loaded = load("http { include up/*.conf; }").expect("wildcard in memory");
    let names: Vec<&str> = loaded
        .config
        .upstreams
        .iter()
        .map(|u| u.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert!(load("http { include ./up/a.conf; }").is_ok());
    // A real file is not read.
    let e = load("http { include /etc/hostname; }").expect_err("not in memory");
    assert!(e.to_string().contains("read from memory"), "{e}");
    // Cycles are found as on disk.
    let e = syntax::parse_str_with(
        "include loop.conf;",
        Path::new("/conf/nginx.conf"),
        Path::new("/conf"),
        Includes::Memory(&files),
    )
    .expect_err("cycle");
    assert!(e.to_string().contains("is recursive"), "{e}");
}
