//! The session with etcd: connect, grant the lease and keep it alive, put
//! the member key, read the member list, watch the fleet's prefix, publish
//! this member's results. Any failure or an answer slower than
//! `etcd_timeout` ends the session: the member is degraded (probes every
//! target itself) until a new session has joined.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, EventType, GetOptions, Identity, PutOptions, TlsOptions,
    WatchOptions,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::state::{unix_ms, Outgoing, Shared};
use crate::trust::{Roster, Why};
use crate::wire::{self, Key, MemberValue, PassiveValue, ResultValue};
use crate::{FleetError, FleetOptions};

/// First wait before a new session after a failed one; doubles up to the TTL.
const RETRY_FIRST: Duration = Duration::from_millis(250);

/// The client's options: timeouts, TLS, user. Reads the TLS files now, so
/// that a bad path is an error at start.
pub(crate) fn connect_options(o: &FleetOptions) -> Result<ConnectOptions, FleetError> {
    let mut c = ConnectOptions::new()
        .with_connect_timeout(o.etcd_timeout)
        .with_timeout(o.etcd_timeout)
        .with_keep_alive(o.etcd_timeout, o.etcd_timeout);
    if let Some(t) = &o.tls {
        let read = |what: &'static str, path: &std::path::Path| {
            std::fs::read(path).map_err(|source| FleetError::File {
                what,
                path: path.to_path_buf(),
                source,
            })
        };
        let mut tls =
            TlsOptions::new().ca_certificate(Certificate::from_pem(read("etcd CA", &t.ca)?));
        if let (Some(cert), Some(key)) = (&t.cert, &t.key) {
            tls = tls.identity(Identity::from_pem(
                read("etcd client certificate", cert)?,
                read("etcd client key", key)?,
            ));
        }
        if let Some(d) = &t.domain {
            tls = tls.domain_name(d.clone());
        }
        c = c.with_tls(tls);
    }
    if let Some(u) = &o.user {
        c = c.with_user(u.name.clone(), u.password.clone());
    }
    Ok(c)
}

/// Sessions one after the other until `cancel`.
pub(crate) async fn run(
    shared: Arc<Shared>,
    connect: ConnectOptions,
    mut outbox: mpsc::Receiver<Outgoing>,
    cancel: CancellationToken,
) {
    let mut wait = RETRY_FIRST;
    loop {
        let mut session = Session {
            shared: &shared,
            client: None,
            lease: None,
        };
        let r = tokio::select! {
            r = session.run(&connect, &mut outbox, &cancel) => r,
            _ = cancel.cancelled() => Ok(()),
        };
        if cancel.is_cancelled() {
            session.leave().await;
            return;
        }
        let joined = shared.is_joined();
        let reason = match r {
            Err(e) => e.to_string(),
            Ok(()) => "the session ended".into(),
        };
        shared.degraded(&reason);
        // A session that had joined was healthy: retry soon.
        if joined {
            wait = RETRY_FIRST;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = cancel.cancelled() => return,
        }
        wait = (wait * 2).min(shared.opts.ttl);
        // Results queued while etcd was away are stale: the next probe
        // publishes afresh.
        while outbox.try_recv().is_ok() {}
    }
}

struct Session<'a> {
    shared: &'a Shared,
    client: Option<Client>,
    lease: Option<i64>,
}

impl Session<'_> {
    /// One etcd call, bounded by `etcd_timeout`.
    async fn call<T>(
        &self,
        op: &'static str,
        f: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, FleetError> {
        let bound = self.shared.opts.etcd_timeout;
        match tokio::time::timeout(bound, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(FleetError::Etcd { op, source }),
            Err(_) => Err(FleetError::Slow {
                op,
                ms: bound.as_millis(),
            }),
        }
    }

    async fn run(
        &mut self,
        connect: &ConnectOptions,
        outbox: &mut mpsc::Receiver<Outgoing>,
        cancel: &CancellationToken,
    ) -> Result<(), FleetError> {
        let s = self.shared;
        let o = &s.opts;
        let client = self
            .call(
                "connect",
                Client::connect(o.endpoints.clone(), Some(connect.clone())),
            )
            .await?;
        self.client = Some(client.clone());
        let ttl = i64::try_from(o.ttl.as_secs()).unwrap_or(i64::MAX);
        let lease = self
            .call("lease grant", client.clone().lease_grant(ttl, None))
            .await?
            .id();
        self.lease = Some(lease);
        let me = MemberValue {
            joined_unix_ms: unix_ms(),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
        };
        let value = serde_json::to_vec(&me).unwrap_or_default();
        let member_key = wire::member_key(&s.root, s.me());
        self.call(
            "put member key",
            client
                .clone()
                .put(member_key, value, Some(PutOptions::new().with_lease(lease))),
        )
        .await?;
        let (mut keeper, mut alive) = self
            .call("lease keep-alive", client.clone().lease_keep_alive(lease))
            .await?;
        let members_prefix = format!("{}members/", s.root);
        let got = self
            .call(
                "get members",
                client
                    .clone()
                    .get(members_prefix, Some(GetOptions::new().with_prefix())),
            )
            .await?;
        let revision = got.header().map_or(0, |h| h.revision());
        // Only member keys with a lease count (crate::trust).
        let mut roster = Roster::default();
        for kv in got.kvs() {
            if let Some(Key::Member(m)) = wire::parse_key(&s.root, kv.key()) {
                if let Err(why) = roster.put(m, kv.lease()) {
                    s.ignore(kv.key(), why);
                }
            }
        }
        let mut watch = self
            .call(
                "watch",
                client.clone().watch(
                    s.root.clone(),
                    Some(
                        WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(revision + 1),
                    ),
                ),
            )
            .await?;
        if roster.lease_of(s.me()) != Some(lease) {
            return Err(FleetError::Lost(
                "our member key is not in the member list just read, under our lease".into(),
            ));
        }
        s.set_members(roster.names().to_vec());
        s.joined();
        // Keep-alives three times per TTL; no answer within etcd_timeout
        // of one sent means etcd is slow.
        let every = (o.ttl / 3).max(Duration::from_millis(500));
        let mut tick = tokio::time::interval_at(Instant::now() + every, every);
        let mut answered = Instant::now();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = tick.tick() => {
                    if answered.elapsed() > every + o.etcd_timeout {
                        return Err(FleetError::Slow { op: "lease keep-alive", ms: (every + o.etcd_timeout).as_millis() });
                    }
                    self.call("lease keep-alive", keeper.keep_alive()).await?;
                }
                m = alive.message() => match m {
                    Ok(Some(r)) if r.ttl() > 0 => answered = Instant::now(),
                    Ok(Some(_)) => return Err(FleetError::Lost("the lease expired".into())),
                    Ok(None) => return Err(FleetError::Lost("the keep-alive stream closed".into())),
                    Err(source) => return Err(FleetError::Etcd { op: "lease keep-alive", source }),
                },
                w = watch.message() => {
                    let resp = match w {
                        Ok(Some(r)) => r,
                        Ok(None) => return Err(FleetError::Lost("the watch stream closed".into())),
                        Err(source) => return Err(FleetError::Etcd { op: "watch", source }),
                    };
                    if resp.canceled() {
                        return Err(FleetError::Lost(format!("the watch was cancelled: {}", resp.cancel_reason())));
                    }
                    let mut changed = false;
                    for ev in resp.events() {
                        let Some(kv) = ev.kv() else { continue };
                        let put = ev.event_type() == EventType::Put;
                        changed |= self.heard(&mut roster, kv, put);
                    }
                    if changed {
                        if roster.lease_of(s.me()) != Some(lease) {
                            return Err(FleetError::Lost("our member key was deleted (lease expired?) or put again without our lease".into()));
                        }
                        tracing::info!(target: "vigil::fleet", members = roster.names().len(), "fleet: member list changed; targets re-assigned");
                        s.set_members(roster.names().to_vec());
                    }
                }
                out = outbox.recv() => {
                    let Some(out) = out else { return Ok(()) };
                    let (op, key, value) = match &out {
                        Outgoing::Result { target, value } => ("put result", wire::result_key(&s.root, s.me(), target), serde_json::to_vec(value)),
                        Outgoing::Passive { target, value } => ("put passive ejection", wire::passive_key(&s.root, s.me(), target), serde_json::to_vec(value)),
                    };
                    let value = value.unwrap_or_default();
                    self.call(op, client.clone().put(key, value, Some(PutOptions::new().with_lease(lease)))).await?;
                }
            }
        }
    }

    /// One key put or deleted under the prefix. A member key may change
    /// the roster (returns whether it did, or was ours); a result or
    /// ejection another member wrote goes to the shared state if it is
    /// believed ([`crate::trust`]), and is counted and logged once per key
    /// if not. The roster is the one of this watch response so far: etcd
    /// delivers a member's key before its results.
    fn heard(&self, roster: &mut Roster, kv: &etcd_client::KeyValue, put: bool) -> bool {
        let s = self.shared;
        let (lease, now) = (kv.lease(), unix_ms());
        match wire::parse_key(&s.root, kv.key()) {
            Some(Key::Member(m)) => {
                let before = roster.names().len();
                if !put {
                    roster.delete(m);
                } else if let Err(why) = roster.put(m, lease) {
                    s.ignore(kv.key(), why);
                }
                // One put or delete adds or takes out one name at most.
                // Puts that change nothing (a lease-less key put again and
                // again) log nothing more; our own key is checked always.
                return roster.names().len() != before || m == s.me();
            }
            // Our own (or written in our name): nothing to learn.
            Some(Key::Passive { member, .. } | Key::Result { member, .. }) if member == s.me() => {}
            Some(Key::Passive { member, target }) if put => {
                match serde_json::from_slice::<PassiveValue>(kv.value()) {
                    Ok(v) => match roster.check_ejection(member, lease, (v.at_unix_ms, now)) {
                        Ok(()) => s.remote_ejection(member, target, &v),
                        Err(why) => s.ignore(kv.key(), why),
                    },
                    Err(_) => s.ignore(kv.key(), Why::Unreadable),
                }
            }
            Some(Key::Result { member, target }) if put => {
                match serde_json::from_slice::<ResultValue>(kv.value()) {
                    Ok(v) => {
                        let o = &s.opts;
                        match roster.check_result(
                            member,
                            lease,
                            target,
                            o.replicas,
                            (v.at_unix_ms, now),
                            o.ttl,
                        ) {
                            Ok(()) => s.remote_result(member, target, v),
                            Err(why) => s.ignore(kv.key(), why),
                        }
                    }
                    Err(_) => s.ignore(kv.key(), Why::Unreadable),
                }
            }
            _ => {}
        }
        false
    }

    /// Revoke the lease (best effort, bounded): the member's keys go at
    /// once and the others take over its targets.
    async fn leave(&mut self) {
        let (Some(client), Some(lease)) = (self.client.clone(), self.lease) else {
            return;
        };
        let mut c = client;
        match self.call("lease revoke", c.lease_revoke(lease)).await {
            Ok(_) => self.shared.left(),
            Err(e) => {
                tracing::warn!(target: "vigil::fleet", error = %e, "fleet: could not revoke the lease; it expires after its TTL")
            }
        }
    }
}
