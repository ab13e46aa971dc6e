//! The fleet's settings, checked: where etcd is, who this member is, the
//! lease TTL, how many members probe each target, and etcd's TLS and
//! authentication.

use std::path::PathBuf;
use std::time::Duration;

use crate::FleetError;

/// Default lease TTL: a dead member's targets move after at most this.
pub const DEFAULT_TTL: Duration = Duration::from_secs(5);
/// etcd's floor for a lease TTL (shorter leases are granted this long).
pub const MIN_TTL: Duration = Duration::from_secs(2);
/// Default bound on one etcd call before the member calls etcd slow.
pub const DEFAULT_ETCD_TIMEOUT: Duration = Duration::from_secs(2);
/// Default root of the keys; the fleet's name follows.
pub const DEFAULT_PREFIX: &str = "/vigil/fleet/";

/// Everything the fleet needs.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    /// etcd endpoints, `http://HOST:PORT` or `https://HOST:PORT`.
    pub endpoints: Vec<String>,
    /// The fleet's name: its keys live under `PREFIX NAME /`.
    pub name: String,
    /// This member's name, unique in the fleet (default `HOSTNAME-PID`).
    pub member: String,
    /// Lease TTL (default 5s, at least 2s).
    pub ttl: Duration,
    /// Members probing each target (R, default 1).
    pub replicas: usize,
    /// Longest an etcd call may take before the member falls back to
    /// probing everything itself (default 2s).
    pub etcd_timeout: Duration,
    /// Root of the keys (default `/vigil/fleet/`).
    pub prefix: String,
    /// TLS to etcd (endpoints must be `https://`).
    pub tls: Option<EtcdTls>,
    /// etcd user and password.
    pub user: Option<EtcdUser>,
    /// Publish passive ejections; on hearing one, probe that peer at once.
    pub share_passive: bool,
}

/// TLS to etcd: the CA that signed etcd's certificate, and a client
/// certificate when etcd asks for one (`--client-cert-auth`).
#[derive(Clone, Debug, Default)]
pub struct EtcdTls {
    /// CA certificate (PEM) that signed etcd's certificate.
    pub ca: PathBuf,
    /// Client certificate (PEM), with `key`.
    pub cert: Option<PathBuf>,
    /// Client key (PEM), with `cert`.
    pub key: Option<PathBuf>,
    /// Name to check etcd's certificate against (default: the endpoint's host).
    pub domain: Option<String>,
}

/// etcd authentication (`etcdctl user add`).
#[derive(Clone)]
pub struct EtcdUser {
    /// User name.
    pub name: String,
    /// Password.
    pub password: String,
}

impl std::fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .field("password", &"(withheld)")
            .finish()
    }
}

// === impl FleetOptions ===

impl FleetOptions {
    /// Options with the defaults for `endpoints`, fleet `name` and `member`.
    pub fn new(endpoints: Vec<String>, name: impl Into<String>, member: impl Into<String>) -> Self {
        Self {
            endpoints,
            name: name.into(),
            member: member.into(),
            ttl: DEFAULT_TTL,
            replicas: 1,
            etcd_timeout: DEFAULT_ETCD_TIMEOUT,
            prefix: DEFAULT_PREFIX.into(),
            tls: None,
            user: None,
            share_passive: false,
        }
    }

    /// Check every setting; the error names the setting.
    pub fn validate(&self) -> Result<(), FleetError> {
        if self.endpoints.is_empty() {
            return Err(FleetError::invalid(
                "--fleet-etcd",
                "no etcd endpoint given",
            ));
        }
        for e in &self.endpoints {
            let tls = e.starts_with("https://");
            if !tls && !e.starts_with("http://") {
                return Err(FleetError::invalid(
                    "--fleet-etcd",
                    format!("\"{e}\" is not http://HOST:PORT or https://HOST:PORT"),
                ));
            }
            if tls != self.tls.is_some() {
                return Err(FleetError::invalid(
                    "--fleet-etcd",
                    if tls {
                        format!(
                            "\"{e}\" is https: give the CA of etcd's certificate (--fleet-etcd-ca)"
                        )
                    } else {
                        format!(
                            "\"{e}\" is plain http but etcd TLS settings are given: use https://"
                        )
                    },
                ));
            }
        }
        name_ok("--fleet-name", &self.name)?;
        name_ok("--fleet-member", &self.member)?;
        if self.ttl < MIN_TTL {
            return Err(FleetError::invalid(
                "fleet ttl",
                format!("{:?} is below etcd's minimum lease TTL of 2s", self.ttl),
            ));
        }
        if self.ttl.subsec_nanos() != 0 {
            return Err(FleetError::invalid(
                "fleet ttl",
                format!("{:?}: etcd leases are whole seconds", self.ttl),
            ));
        }
        if self.replicas == 0 {
            return Err(FleetError::invalid("fleet replicas", "must be at least 1"));
        }
        if self.etcd_timeout.is_zero() {
            return Err(FleetError::invalid(
                "fleet etcd_timeout",
                "must be more than 0",
            ));
        }
        if !self.prefix.starts_with('/') || !self.prefix.ends_with('/') {
            return Err(FleetError::invalid(
                "fleet prefix",
                format!("\"{}\" must start and end with /", self.prefix),
            ));
        }
        if let Some(t) = &self.tls {
            if t.cert.is_some() != t.key.is_some() {
                return Err(FleetError::invalid(
                    "--fleet-etcd-cert",
                    "a client certificate needs its key (--fleet-etcd-key) and the other way round",
                ));
            }
        }
        if let Some(u) = &self.user {
            if u.name.is_empty() {
                return Err(FleetError::invalid("--fleet-etcd-user", "empty user name"));
            }
        }
        Ok(())
    }

    /// Where this fleet's keys live: `PREFIX NAME /`.
    pub fn root(&self) -> String {
        format!("{}{}/", self.prefix, self.name)
    }

    /// The default member name: the host's name and this process's id.
    pub fn default_member() -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty() && name_ok("", h).is_ok())
            .unwrap_or_else(|| "vigil".into());
        format!("{host}-{}", std::process::id())
    }
}

/// Names go into etcd keys: letters, digits, `.`, `_`, `-`, at most 128.
pub(crate) fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn name_ok(what: &'static str, name: &str) -> Result<(), FleetError> {
    if is_name(name) {
        Ok(())
    } else {
        Err(FleetError::invalid(
            what,
            format!("\"{name}\": use 1 to 128 letters, digits, '.', '_' or '-'"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> FleetOptions {
        FleetOptions::new(vec!["http://127.0.0.1:2379".into()], "edge", "m1")
    }

    #[test]
    fn defaults_are_valid_and_keys_are_per_fleet_name() {
        let o = opts();
        o.validate().expect("test step");
        assert_eq!(o.root(), "/vigil/fleet/edge/");
        assert_eq!(o.ttl, Duration::from_secs(5));
        assert_eq!(o.replicas, 1);
    }

    #[test]
    fn bad_settings_are_named() {
        let cases: Vec<(FleetOptions, &str)> = vec![
            (
                FleetOptions {
                    endpoints: vec![],
                    ..opts()
                },
                "--fleet-etcd: no etcd endpoint",
            ),
            (
                FleetOptions {
                    endpoints: vec!["127.0.0.1:2379".into()],
                    ..opts()
                },
                "is not http://",
            ),
            (
                FleetOptions {
                    endpoints: vec!["https://e:2379".into()],
                    ..opts()
                },
                "give the CA of etcd's certificate",
            ),
            (
                FleetOptions {
                    tls: Some(EtcdTls::default()),
                    ..opts()
                },
                "use https://",
            ),
            (
                FleetOptions {
                    name: "a/b".into(),
                    ..opts()
                },
                "--fleet-name: \"a/b\"",
            ),
            (
                FleetOptions {
                    member: String::new(),
                    ..opts()
                },
                "--fleet-member",
            ),
            (
                FleetOptions {
                    ttl: Duration::from_secs(1),
                    ..opts()
                },
                "minimum lease TTL",
            ),
            (
                FleetOptions {
                    ttl: Duration::from_millis(2500),
                    ..opts()
                },
                "whole seconds",
            ),
            (
                FleetOptions {
                    replicas: 0,
                    ..opts()
                },
                "replicas: must be at least 1",
            ),
            (
                FleetOptions {
                    prefix: "vigil".into(),
                    ..opts()
                },
                "must start and end with /",
            ),
            (
                FleetOptions {
                    endpoints: vec!["https://e:2379".into()],
                    tls: Some(EtcdTls {
                        cert: Some("c.pem".into()),
                        ..EtcdTls::default()
                    }),
                    ..opts()
                },
                "needs its key",
            ),
        ];
        for (o, want) in cases {
            let e = o.validate().expect_err(want).to_string();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
    }

    #[test]
    fn the_password_is_not_in_debug_output() {
        let u = EtcdUser {
            name: "vigil".into(),
            password: "s3cret".into(),
        };
        assert!(!format!("{u:?}").contains("s3cret"));
    }

    #[test]
    fn the_default_member_name_is_a_valid_key_part() {
        name_ok("m", &FleetOptions::default_member()).expect("test step");
    }
}
