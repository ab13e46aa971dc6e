//! The `[fleet]` table of a vigil TOML file. Core reads the rest of the
//! file and leaves this table to the binary; here it is read on its own,
//! every key checked, errors with file:line:col.
//!
//! ```toml
//! [fleet]
//! etcd = ["http://10.0.0.5:2379", "http://10.0.0.6:2379"]
//! name = "edge"            # keys under /vigil/fleet/edge/
//! member = "edge-a"        # default HOSTNAME-PID
//! ttl = "5s"
//! replicas = 1
//! etcd_timeout = "2s"
//! prefix = "/vigil/fleet/"
//! user = "vigil"
//! password_file = "/etc/vigil/etcd.pass"
//! share_passive = true   # others probe a peer this one ejects
//! [fleet.tls]
//! ca = "/etc/vigil/etcd-ca.pem"
//! cert = "/etc/vigil/etcd-client.pem"
//! key = "/etc/vigil/etcd-client.key"
//! domain = "etcd.internal"
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use toml::Spanned;

use super::Settings;

#[derive(Deserialize)]
struct Top {
    #[serde(default)]
    fleet: Option<RawFleet>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFleet {
    #[serde(default)]
    etcd: Option<OneOrMany>,
    name: Option<String>,
    member: Option<String>,
    ttl: Option<Spanned<String>>,
    replicas: Option<usize>,
    etcd_timeout: Option<Spanned<String>>,
    prefix: Option<String>,
    user: Option<String>,
    password_file: Option<PathBuf>,
    share_passive: Option<bool>,
    tls: Option<RawTls>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    domain: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// The `[fleet]` table of `path`, if any.
pub(super) fn read(path: &Path) -> anyhow::Result<Option<Settings>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text, path)
}

fn parse(text: &str, path: &Path) -> anyhow::Result<Option<Settings>> {
    let top: Top = ::toml::from_str(text).map_err(|e| {
        let at = e
            .span()
            .map(|s| line_col(text, s.start))
            .unwrap_or_default();
        anyhow::anyhow!("{}{at}: {}", path.display(), e.message())
    })?;
    let Some(f) = top.fleet else {
        return Ok(None);
    };
    let time = |v: &Option<Spanned<String>>, key: &str| -> anyhow::Result<Option<Duration>> {
        let Some(v) = v else { return Ok(None) };
        crate::cmd::parse_duration(v.get_ref())
            .map(Some)
            .map_err(|e| {
                anyhow::anyhow!(
                    "{}{}: fleet.{key}: {e}",
                    path.display(),
                    line_col(text, v.span().start)
                )
            })
    };
    let tls = f.tls.unwrap_or(RawTls {
        ca: None,
        cert: None,
        key: None,
        domain: None,
    });
    Ok(Some(Settings {
        etcd: match f.etcd {
            Some(OneOrMany::One(s)) => vec![s],
            Some(OneOrMany::Many(v)) => v,
            None => Vec::new(),
        },
        name: f.name,
        member: f.member,
        ttl: time(&f.ttl, "ttl")?,
        replicas: f.replicas,
        etcd_timeout: time(&f.etcd_timeout, "etcd_timeout")?,
        prefix: f.prefix,
        ca: tls.ca,
        cert: tls.cert,
        key: tls.key,
        domain: tls.domain,
        user: f.user,
        password_file: f.password_file,
        share_passive: f.share_passive.unwrap_or(false),
    }))
}

/// `:LINE:COL` (1-based) of a byte offset.
fn line_col(text: &str, at: usize) -> String {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!(":{line}:{col}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_read_with_every_key() {
        let s = parse(
            "[upstream.a]\n[fleet]\netcd = \"http://127.0.0.1:2379\"\nname = \"edge\"\nttl = \"3s\"\nreplicas = 2\n[fleet.tls]\nca = \"ca.pem\"\n",
            Path::new("v.toml"),
        )
        .expect("test step")
        .expect("test step");
        assert_eq!(s.etcd, vec!["http://127.0.0.1:2379"]);
        assert_eq!(s.name.as_deref(), Some("edge"));
        assert_eq!(s.ttl, Some(Duration::from_secs(3)));
        assert_eq!(s.replicas, Some(2));
        assert_eq!(s.ca, Some(PathBuf::from("ca.pem")));
        assert_eq!(
            parse("[upstream.a]\n", Path::new("v.toml")).expect("test step"),
            None
        );
    }

    #[test]
    fn errors_carry_file_line_and_column() {
        let e = parse("[fleet]\netcd = []\nttl = \"soon\"\n", Path::new("v.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("v.toml:3:7: fleet.ttl:"), "{e}");
        let e = parse("[fleet]\netcd = []\nshare = true\n", Path::new("v.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("v.toml:3:1: unknown field `share`"), "{e}");
    }
}
