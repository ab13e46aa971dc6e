//! This instance's membership: with the `fleet` feature, a running
//! [`vigil_fleet::Fleet`]; without it, nothing can be started and asking
//! for a fleet is an error naming the feature.

use std::sync::Arc;

use super::Settings;

/// Why a fleet setting is refused without the feature.
#[cfg(not(feature = "fleet"))]
const FEATURE_HINT: &str = "this vigil was built without fleet mode: rebuild it with the cargo feature `fleet` (cargo build -p vigil --features fleet; building it needs protoc)";

/// A running member of a fleet.
pub(crate) struct Member {
    #[cfg(feature = "fleet")]
    fleet: vigil_fleet::Fleet,
}

// === impl Member ===

impl Member {
    /// Join the fleet the settings name (in the background; until joined,
    /// every target is probed here). Must run inside a tokio runtime.
    #[cfg(feature = "fleet")]
    pub(crate) fn start(s: &Settings) -> anyhow::Result<Self> {
        let mut o = vigil_fleet::FleetOptions::new(
            s.etcd.clone(),
            s.name.clone().unwrap_or_else(|| "default".into()),
            s.member
                .clone()
                .unwrap_or_else(vigil_fleet::FleetOptions::default_member),
        );
        if let Some(t) = s.ttl {
            o.ttl = t;
        }
        if let Some(r) = s.replicas {
            o.replicas = r;
        }
        if let Some(t) = s.etcd_timeout {
            o.etcd_timeout = t;
        }
        if let Some(p) = &s.prefix {
            o.prefix = p.clone();
        }
        o.share_passive = s.share_passive;
        if let Some(ca) = &s.ca {
            o.tls = Some(vigil_fleet::EtcdTls {
                ca: ca.clone(),
                cert: s.cert.clone(),
                key: s.key.clone(),
                domain: s.domain.clone(),
            });
        } else if s.cert.is_some() || s.domain.is_some() {
            anyhow::bail!("fleet: an etcd client certificate or TLS name needs the CA of etcd's certificate (--fleet-etcd-ca, fleet.tls.ca)");
        }
        if let Some(name) = &s.user {
            o.user = Some(vigil_fleet::EtcdUser {
                name: name.clone(),
                password: password(s)?,
            });
        }
        let fleet = vigil_fleet::Fleet::start(o)?;
        Ok(Self { fleet })
    }

    /// Without the feature: refused.
    #[cfg(not(feature = "fleet"))]
    pub(crate) fn start(_: &Settings) -> anyhow::Result<Self> {
        anyhow::bail!("--fleet-etcd / [fleet]: {}", FEATURE_HINT)
    }

    /// The checker's hook.
    pub(crate) fn sharing(&self) -> Option<Arc<dyn vigil_checker::Sharing>> {
        #[cfg(feature = "fleet")]
        return Some(self.fleet.sharing());
        #[cfg(not(feature = "fleet"))]
        None
    }

    /// Remote results go to this checker.
    pub(crate) fn attach(&self, checker: &Arc<vigil_checker::Checker>) {
        #[cfg(feature = "fleet")]
        self.fleet.attach(checker);
        #[cfg(not(feature = "fleet"))]
        let _ = checker;
    }

    /// Wire the member to core's event bus: hear this instance's passive
    /// ejections (with `share_passive` the other members probe the peer at
    /// once, or halve its weight where it has no check), and publish the member's own state changes (joined,
    /// degraded, left) there as `fleet` events.
    pub(crate) fn wire_events(
        self: &Arc<Self>,
        events: &Arc<vigil_core::event::EventBus>,
        clock: &Arc<dyn vigil_core::Clock>,
    ) {
        #[cfg(feature = "fleet")]
        {
            self.fleet.publish_to(events.clone(), clock.clone());
            let me = Arc::downgrade(self);
            events.subscribe(move |e| {
                if let vigil_core::event::EventKind::Excluded { until, .. } = e.kind {
                    if let Some(m) = me.upgrade() {
                        m.fleet
                            .ejected(&e.upstream, &e.peer, until.millis_since(e.at));
                    }
                }
            });
        }
        #[cfg(not(feature = "fleet"))]
        let _ = (events, clock);
    }

    /// `GET /api/fleet`'s document.
    pub(crate) fn view_json(&self) -> serde_json::Value {
        #[cfg(feature = "fleet")]
        return serde_json::to_value(self.fleet.view()).unwrap_or_default();
        #[cfg(not(feature = "fleet"))]
        serde_json::Value::Null
    }

    /// Leave the fleet (revoke the lease).
    pub(crate) async fn leave(&self) {
        #[cfg(feature = "fleet")]
        self.fleet.leave().await;
    }
}

/// The etcd password: VIGIL_FLEET_ETCD_PASSWORD, else the first line of
/// the password file.
#[cfg(feature = "fleet")]
fn password(s: &Settings) -> anyhow::Result<String> {
    use anyhow::Context;
    if let Ok(p) = std::env::var("VIGIL_FLEET_ETCD_PASSWORD") {
        return Ok(p);
    }
    let Some(path) = &s.password_file else {
        anyhow::bail!("fleet: etcd user {:?} needs a password: set VIGIL_FLEET_ETCD_PASSWORD or --fleet-etcd-password-file", s.user.as_deref().unwrap_or(""));
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("fleet: reading the etcd password file {}", path.display()))?;
    Ok(text.lines().next().unwrap_or("").to_string())
}

#[cfg(test)]
mod tests {
    #[cfg(not(feature = "fleet"))]
    #[test]
    fn without_the_feature_a_fleet_is_refused_naming_it() {
        let s = super::Settings {
            etcd: vec!["http://127.0.0.1:2379".into()],
            ..super::Settings::default()
        };
        let e = match super::Member::start(&s) {
            Ok(_) => panic!("started without the feature"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("--fleet-etcd / [fleet]"), "{e}");
        assert!(e.contains("cargo feature `fleet`"), "{e}");
    }

    #[cfg(feature = "fleet")]
    #[test]
    fn a_client_certificate_without_a_ca_is_refused() {
        let s = super::Settings {
            etcd: vec!["https://127.0.0.1:2379".into()],
            cert: Some("c.pem".into()),
            key: Some("k.pem".into()),
            ..super::Settings::default()
        };
        let e = match super::Member::start(&s) {
            Ok(_) => panic!("started"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("needs the CA"), "{e}");
    }
}
