//! Fleet mode on `vigil serve` and `vigil check`: the `--fleet-*` flags and
//! the `[fleet]` table of a TOML configuration, merged (flags win) into the
//! options of the `vigil-fleet` crate, which this binary has only with the
//! cargo feature `fleet` (it needs `protoc` to build). Without the feature
//! a fleet setting is refused, naming the feature.

mod member;
mod render;
mod toml;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub(crate) use member::Member;
pub(crate) use render::render;

/// The `--fleet-*` flags of `serve` and `check`.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct FleetArgs {
    /// Join a fleet through these etcd endpoints (http:// or https://, comma separated): the
    /// fleet shares the probing (each target probed by --fleet-replicas members) and the results.
    #[arg(long, value_name = "URL[,URL]", value_delimiter = ',')]
    pub(crate) fleet_etcd: Vec<String>,
    /// The fleet's name; its keys live under PREFIX/NAME/ (default `default`).
    #[arg(long, value_name = "NAME")]
    pub(crate) fleet_name: Option<String>,
    /// This member's name, unique in the fleet (default HOSTNAME-PID).
    #[arg(long, value_name = "NAME")]
    pub(crate) fleet_member: Option<String>,
    /// Lease TTL, whole seconds, at least 2s (default 5s): a dead member's targets move after at most this.
    #[arg(long, value_name = "TIME", value_parser = crate::cmd::parse_duration)]
    pub(crate) fleet_ttl: Option<Duration>,
    /// Members probing each target (R, default 1).
    #[arg(long, value_name = "N")]
    pub(crate) fleet_replicas: Option<usize>,
    /// Longest one etcd call may take before this member calls etcd slow and probes every
    /// target itself (default 2s).
    #[arg(long, value_name = "TIME", value_parser = crate::cmd::parse_duration)]
    pub(crate) fleet_etcd_timeout: Option<Duration>,
    /// Root of the fleet's keys in etcd (default /vigil/fleet/).
    #[arg(long, value_name = "PREFIX")]
    pub(crate) fleet_prefix: Option<String>,
    /// CA certificate (PEM) of etcd's server certificate (https:// endpoints).
    #[arg(long, value_name = "PEM")]
    pub(crate) fleet_etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's --client-cert-auth.
    #[arg(long, value_name = "PEM", requires = "fleet_etcd_key")]
    pub(crate) fleet_etcd_cert: Option<PathBuf>,
    /// Client key (PEM) of --fleet-etcd-cert.
    #[arg(long, value_name = "PEM", requires = "fleet_etcd_cert")]
    pub(crate) fleet_etcd_key: Option<PathBuf>,
    /// Name to check etcd's certificate against (default: the endpoint's host).
    #[arg(long, value_name = "NAME")]
    pub(crate) fleet_etcd_domain: Option<String>,
    /// etcd user (password from VIGIL_FLEET_ETCD_PASSWORD or --fleet-etcd-password-file).
    #[arg(long, value_name = "NAME")]
    pub(crate) fleet_etcd_user: Option<String>,
    /// File holding the etcd user's password (its first line).
    #[arg(long, value_name = "PATH", requires = "fleet_etcd_user")]
    pub(crate) fleet_etcd_password_file: Option<PathBuf>,
    /// Share passive ejections: when this instance ejects a peer on its traffic, the other
    /// members probe that peer at once (they do not eject it blindly), or, where it has no
    /// check, halve its weight for the rest of this instance's exclusion.
    #[arg(long)]
    pub(crate) fleet_share_passive: bool,
}

/// The merged settings, before the feature's options are built.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Settings {
    pub(crate) etcd: Vec<String>,
    pub(crate) name: Option<String>,
    pub(crate) member: Option<String>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) replicas: Option<usize>,
    pub(crate) etcd_timeout: Option<Duration>,
    pub(crate) prefix: Option<String>,
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
    pub(crate) domain: Option<String>,
    pub(crate) user: Option<String>,
    pub(crate) password_file: Option<PathBuf>,
    pub(crate) share_passive: bool,
}

// === impl Settings ===

impl Settings {
    /// The `[fleet]` table of `config` (a `.toml` file; nothing for an
    /// nginx.conf), then the flags over it. `None`: no fleet asked for.
    pub(crate) fn gather(args: &FleetArgs, config: Option<&Path>) -> anyhow::Result<Option<Self>> {
        let mut s = match config.filter(|p| p.extension().is_some_and(|e| e == "toml")) {
            Some(p) => toml::read(p)?.unwrap_or_default(),
            None => Settings::default(),
        };
        if !args.fleet_etcd.is_empty() {
            s.etcd = args.fleet_etcd.clone();
        }
        let or = |a: &Option<String>, b: &mut Option<String>| {
            if a.is_some() {
                *b = a.clone();
            }
        };
        or(&args.fleet_name, &mut s.name);
        or(&args.fleet_member, &mut s.member);
        or(&args.fleet_prefix, &mut s.prefix);
        or(&args.fleet_etcd_domain, &mut s.domain);
        or(&args.fleet_etcd_user, &mut s.user);
        s.ttl = args.fleet_ttl.or(s.ttl);
        s.replicas = args.fleet_replicas.or(s.replicas);
        s.etcd_timeout = args.fleet_etcd_timeout.or(s.etcd_timeout);
        s.share_passive |= args.fleet_share_passive;
        for (a, b) in [
            (&args.fleet_etcd_ca, &mut s.ca),
            (&args.fleet_etcd_cert, &mut s.cert),
            (&args.fleet_etcd_key, &mut s.key),
            (&args.fleet_etcd_password_file, &mut s.password_file),
        ] {
            if a.is_some() {
                *b = a.clone();
            }
        }
        if s.etcd.is_empty() {
            if s != Settings::default() {
                anyhow::bail!("fleet settings are given but no etcd endpoint: set --fleet-etcd URL or fleet.etcd");
            }
            return Ok(None);
        }
        Ok(Some(s))
    }
}
