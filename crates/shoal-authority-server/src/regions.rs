//! Cross-region duties of a replica (docs/adr/0013-global-policy-and-failover.md):
//!
//! - **serving** this region's signed summaries to other regions' authorities
//!   (`RegionSummaries`), only for services whose global policy lists this region as a
//!   failover target, built by the embedded mesh member from its catalog;
//! - **pulling** every `pull_ms` the summaries this region's callers may fail over to, from
//!   each configured remote region, verified against that region's keys in the global policy,
//!   and kept beside the region's own truth (never proposed to Raft, never merged into a
//!   catalog, never upgraded: a remote region's endpoints only get older here when it is cut
//!   off), plus a newer global policy document when a remote authority holds one (verified
//!   against the policy keys, then proposed through Raft like an operator's push);
//! - **feeding** this region's agents (`FailoverFeed`): every held summary and the global
//!   policy when the agent's version is older.
//!
//! None of it is on a read or write path: agents answer picks from what they last pulled,
//! and no catalog write waits for another region.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use metrics::{counter, gauge};
use serde::Deserialize;
use shoal_catalog::remote::RemoteSummaries;
use shoal_proto::rpc::{AuthorityError, AuthorityOk, AuthorityRequestBody};
use shoal_proto::summary::MAX_SUMMARIES_PER_REPLY;
use shoal_proto::{Region, SignedGlobalPolicy, SignedSummary, SigningKey, TrustedKeys};
use shoal_runtime::config::{parse_public_keys, TlsSection};

use crate::client::AuthorityClient;
use crate::member::MemberHandle;
use crate::server::wall_ms;
use crate::storage::StateMachineStore;

/// `[failover]` of a replica's config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailoverConfig {
    /// Global policy public keys (hex, 32 bytes) whose signature makes a global policy
    /// document acceptable. Empty: global policy documents are refused.
    #[serde(default)]
    pub policy_keys: Vec<String>,
    /// Period of the summary pull from each remote region, ms.
    #[serde(default = "d_pull_ms")]
    pub pull_ms: u64,
    /// Timeout of one pull RPC, ms.
    #[serde(default = "d_pull_timeout_ms")]
    pub pull_timeout_ms: u64,
    /// Remote regions to pull from.
    #[serde(default)]
    pub remote_regions: Vec<RemoteRegion>,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        Self {
            policy_keys: Vec::new(),
            pull_ms: d_pull_ms(),
            pull_timeout_ms: d_pull_timeout_ms(),
            remote_regions: Vec::new(),
        }
    }
}

fn d_pull_ms() -> u64 {
    1_000
}
fn d_pull_timeout_ms() -> u64 {
    2_000
}

/// One remote region: its authority replicas, and the **gateway** certificate its CA issued
/// to this replica (node id `gateway-...`: the remote authority answers such callers only
/// with reads, see [`gateway_may`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteRegion {
    /// The region's name (must be listed in the global policy with its keys).
    pub region: Region,
    /// Its authority replicas' RPC addresses (`ip:port`).
    pub addresses: Vec<SocketAddr>,
    /// `tls = { ca, cert, key }`: the remote region's CA, and the gateway certificate that CA
    /// issued to this replica with its key (the shape of the `[tls]` section).
    pub tls: TlsSection,
    /// Local address the gateway transport binds (`ip:0` picks a port).
    pub listen: SocketAddr,
}

/// True when a caller with this node id may send `body`: `gateway-*` identities (other
/// regions' authorities holding a certificate from our CA) may only read.
pub fn gateway_may(node_id: &str, body: &AuthorityRequestBody) -> bool {
    !node_id.starts_with("gateway-")
        || matches!(
            body,
            AuthorityRequestBody::RegionSummaries { .. }
                | AuthorityRequestBody::GetGlobalPolicy
                | AuthorityRequestBody::Status
        )
}

/// A replica's cross-region state.
pub struct Regions {
    region: Region,
    cfg: FailoverConfig,
    policy_keys: TrustedKeys,
    signing_key: SigningKey,
    sm: StateMachineStore,
    member: Option<MemberHandle>,
    held: Mutex<RemoteSummaries>,
}

impl std::fmt::Debug for Regions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Regions")
            .field("region", &self.region)
            .field("remote_regions", &self.cfg.remote_regions.len())
            .finish_non_exhaustive()
    }
}

impl Regions {
    /// Builds the state (no task started).
    ///
    /// # Errors
    /// A bad policy key.
    pub fn new(
        region: Region,
        cfg: FailoverConfig,
        signing_key: SigningKey,
        sm: StateMachineStore,
        member: Option<MemberHandle>,
    ) -> anyhow::Result<Self> {
        let policy_keys = parse_public_keys(&cfg.policy_keys).context("[failover] policy_keys")?;
        Ok(Self {
            held: Mutex::new(RemoteSummaries::new(region.clone())),
            region,
            cfg,
            policy_keys,
            signing_key,
            sm,
            member,
        })
    }

    /// Checks a global policy document's signature against the configured policy keys.
    ///
    /// # Errors
    /// [`AuthorityError::Invalid`] naming the failed check (counted, logged).
    pub fn verify_policy(&self, signed: &SignedGlobalPolicy) -> Result<(), AuthorityError> {
        signed.verify(&self.policy_keys).map_err(|e| {
            counter!("shoal_global_policy_rejected_total").increment(1);
            tracing::warn!(version = signed.policy.version, error = %e, "global policy refused");
            AuthorityError::Invalid(e)
        })
    }

    fn policy(&self) -> Option<SignedGlobalPolicy> {
        self.sm.with_state(|s| s.global_policy().cloned())
    }

    fn newer_policy(&self, than: u64) -> Option<SignedGlobalPolicy> {
        self.policy().filter(|p| p.policy.version > than)
    }

    /// Answers another region's `RegionSummaries`: signed summaries of the asked services
    /// that our global policy lets fail over to us, and our policy when newer.
    pub async fn serve_summaries(
        &self,
        keys: Vec<shoal_proto::ServiceKey>,
        policy_version: u64,
    ) -> AuthorityOk {
        let policy = self.policy();
        let allowed: Vec<_> = keys
            .into_iter()
            .take(MAX_SUMMARIES_PER_REPLY)
            .filter(|k| {
                policy.as_ref().is_some_and(|p| {
                    p.policy
                        .service(k)
                        .is_some_and(|s| s.allowed_failover_regions.contains(&self.region))
                })
            })
            .collect();
        let summaries = match (&self.member, allowed.is_empty()) {
            (Some(m), false) => m
                .summaries(allowed, wall_ms())
                .await
                .into_iter()
                .map(|s| self.signing_key.sign_summary(s))
                .collect(),
            _ => Vec::new(),
        };
        counter!("shoal_region_summaries_served_total").increment(summaries.len() as u64);
        AuthorityOk::Summaries {
            summaries,
            policy: policy.filter(|p| p.policy.version > policy_version),
        }
    }

    /// Answers an agent's `FailoverFeed`.
    pub fn feed(&self, policy_version: u64) -> AuthorityOk {
        let summaries = self
            .held
            .lock()
            .expect("remote summaries")
            .iter()
            .take(MAX_SUMMARIES_PER_REPLY)
            .map(|h| (*h.signed).clone())
            .collect();
        AuthorityOk::Summaries {
            summaries,
            policy: self.newer_policy(policy_version),
        }
    }

    /// Offers pulled summaries of `region`; returns how many were kept.
    fn offer(&self, region: &Region, summaries: Vec<SignedSummary>, now_ms: u64) -> usize {
        let Some(policy) = self.policy() else {
            return 0;
        };
        let keys = policy.policy.region_keys(region);
        let mut held = self.held.lock().expect("remote summaries");
        let mut kept = 0;
        for s in summaries {
            if &s.summary.region != region {
                counter!("shoal_remote_summaries_rejected_total", "reason" => "wrong_region")
                    .increment(1);
                continue;
            }
            match held.offer(Arc::new(s), &keys, now_ms) {
                Ok(()) => kept += 1,
                Err(e) => {
                    counter!("shoal_remote_summaries_rejected_total", "reason" => e.as_label())
                        .increment(1);
                    if !matches!(e, shoal_catalog::remote::OfferError::NotNewer) {
                        tracing::warn!(%region, error = %e, "remote summary refused");
                    }
                }
            }
        }
        // Drop what the policy no longer allows.
        let me = self.region.clone();
        held.retain(|r, k| {
            policy
                .policy
                .service(k)
                .is_some_and(|p| p.allowed_failover_regions.contains(r) && r != &me)
        });
        gauge!("shoal_remote_summaries").set(held.len() as f64);
        kept
    }
}

/// Pulls from every remote region every `pull_ms`, forever. `propose` relays a newer global
/// policy document to Raft (followers' attempts answer `NotLeader` and are ignored).
pub async fn pull_loop<F, Fut>(regions: Arc<Regions>, propose: F)
where
    F: Fn(SignedGlobalPolicy) -> Fut,
    Fut: std::future::Future<Output = Result<AuthorityOk, AuthorityError>>,
{
    let mut clients = Vec::new();
    for r in &regions.cfg.remote_regions {
        match connect(r) {
            Ok(c) => clients.push((r.clone(), c)),
            Err(e) => {
                tracing::error!(region = %r.region, error = %e, "remote region unusable; not pulling from it");
            }
        }
    }
    if clients.is_empty() {
        return;
    }
    let origin = std::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(regions.cfg.pull_ms.max(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut turn = 0usize;
    loop {
        tick.tick().await;
        turn = turn.wrapping_add(1);
        for (remote, client) in &clients {
            let policy = regions.policy();
            let version = policy.as_ref().map_or(0, |p| p.policy.version);
            let keys: Vec<_> = policy
                .as_ref()
                .map(|p| {
                    p.policy
                        .failover_services(&regions.region, &remote.region)
                        .take(MAX_SUMMARIES_PER_REPLY)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            let to = remote.addresses[turn % remote.addresses.len()];
            let body = AuthorityRequestBody::RegionSummaries {
                keys,
                policy_version: version,
            };
            let timeout = Duration::from_millis(regions.cfg.pull_timeout_ms);
            let label = remote.region.to_string();
            match client.call(to, body, timeout).await {
                Ok(Ok(AuthorityOk::Summaries { summaries, policy })) => {
                    let bytes =
                        postcard::to_allocvec(&(&summaries, &policy)).map_or(0, |b| b.len() as u64);
                    counter!("shoal_cross_region_bytes_total", "region" => label.clone())
                        .increment(bytes);
                    counter!("shoal_region_pulls_total", "region" => label, "result" => "ok")
                        .increment(1);
                    if let Some(p) = policy {
                        if regions.verify_policy(&p).is_ok() && p.policy.version > version {
                            let v = p.policy.version;
                            match propose(p).await {
                                Ok(_) => {
                                    tracing::info!(version = v, from = %remote.region, "newer global policy relayed to raft")
                                }
                                Err(AuthorityError::NotLeader { .. }) => {}
                                Err(e) => tracing::debug!(error = %e, "global policy relay"),
                            }
                        }
                    }
                    let now = u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX);
                    regions.offer(&remote.region, summaries, now);
                }
                other => {
                    counter!("shoal_region_pulls_total", "region" => label, "result" => "failed")
                        .increment(1);
                    tracing::debug!(region = %remote.region, %to, result = ?other.map(|r| r.map(|_| ())), "summary pull failed");
                }
            }
        }
    }
}

fn connect(r: &RemoteRegion) -> anyhow::Result<AuthorityClient> {
    anyhow::ensure!(!r.addresses.is_empty(), "no addresses");
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let t = &r.tls;
    AuthorityClient::connect(r.listen, &read(&t.ca)?, &read(&t.cert)?, &read(&t.key)?)
}
