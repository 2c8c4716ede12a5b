//! Cross-region failover for `pick` (docs/adr/0013-global-policy-and-failover.md).
//!
//! The agent holds, **beside** its catalog and never merged into it:
//! - the **global policy** document, verified against the `[failover] policy_keys` it holds as
//!   a root, persisted in the data dir (`global-policy.bin`) so a region cut off from the
//!   others, or an agent restarted while cut off, keeps its last policy;
//! - the **remote summaries** its authority pulled from other regions, each verified against
//!   the summarised region's keys as the global policy lists them, with its age.
//!
//! [`pull_loop`] refreshes both from the region authority every `pull_ms` (`FailoverFeed`; not
//! at all without `policy_keys`), asynchronously: no pick ever waits for it.
//! [`Failover::pick_remote`] is the failover tier of a pick, used only when the local region has no routable endpoint: the policy's regions in
//! order, refused for write intent when read-only, capped at `max_cross_region_rps` per agent
//! and service, and past `max_snapshot_age_s` degraded or refused as the policy says. A
//! service without policy never leaves its region. With a policy's
//! `overprovisioning_factor_pct`, [`Failover::spill_remote`] also sends Envoy's priority-load
//! share of the picks the region could answer to that tier (threshold failover); a spill the
//! tier refuses is answered locally.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::{counter, gauge};
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_catalog::failover::FailoverState;
use shoal_proto::rpc::{AuthorityOk, AuthorityRequestBody};
use shoal_proto::summary::SummaryEndpoint;
use shoal_proto::{FailoverMode, Region, ServiceKey, SignedGlobalPolicy, StaleAction, TrustedKeys};

use crate::state::Shared;

/// File in the data dir holding the last verified global policy (postcard).
pub const POLICY_FILE: &str = "global-policy.bin";

/// `[failover]` of the agent config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailoverConfig {
    /// Global policy public keys (hex, 32 bytes): the root that makes a global policy
    /// document acceptable. Empty: no policy is accepted, so nothing ever fails over.
    #[serde(default)]
    pub policy_keys: Vec<String>,
    /// Period of the failover feed pull from the region authority, ms. There is no pull
    /// while `policy_keys` is empty (nothing could be accepted from it).
    #[serde(default = "d_pull_ms")]
    pub pull_ms: u64,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        Self {
            policy_keys: Vec::new(),
            pull_ms: d_pull_ms(),
        }
    }
}

fn d_pull_ms() -> u64 {
    1_000
}

pub use shoal_catalog::failover::{
    local_tier, LocalCapacity, NoFailover, RemotePick, Spill, Tier, MAX_RATE_WINDOWS,
};

/// `error` and `detail` of the no-backend answer for `why`.
pub fn message(why: &NoFailover) -> (&'static str, String) {
    match why {
        NoFailover::NoPolicy => (
            "no backend",
            "no READY, healthy, non-ejected endpoint in this region, and no policy allows \
             failover for this service"
                .into(),
        ),
        NoFailover::ReadOnly => (
            "no backend: failover is read-only",
            "no endpoint in this region; the policy allows only read-only failover and the \
             caller stated write intent"
                .into(),
        ),
        NoFailover::Capped { rps } => (
            "no backend: failover capped",
            format!("no endpoint in this region; max_cross_region_rps ({rps}) reached"),
        ),
        NoFailover::TooOld => (
            "no backend: failover summaries too old",
            "no endpoint in this region; every allowed region's summary is older than \
             max_snapshot_age_s and the policy refuses stale answers"
                .into(),
        ),
        NoFailover::NoRemoteEndpoint => (
            "no backend",
            "no endpoint in this region nor in the policy's failover regions".into(),
        ),
    }
}

/// One service with failover as the xDS view serves it ([`Failover::xds_regions`]).
#[derive(Debug, Clone)]
pub struct XdsService {
    /// The service.
    pub key: ServiceKey,
    /// Its failover regions in policy order (the agent's own region skipped).
    pub regions: Vec<XdsRegion>,
    /// The policy's `overprovisioning_factor_pct` (`None`: all-or-nothing failover).
    pub overprovisioning_factor_pct: Option<u32>,
}

/// One failover region of a service as the xDS view serves it ([`Failover::xds_regions`]).
#[derive(Debug, Clone)]
pub struct XdsRegion {
    /// The region, in the policy's order.
    pub region: Region,
    /// The policy is read-only.
    pub read_only: bool,
    /// The summary is past `max_snapshot_age_s` and the policy degrades.
    pub degraded: bool,
    /// The routable endpoints of the held summary.
    pub endpoints: Vec<SummaryEndpoint>,
}

/// The agent's failover state (see the module docs): the pure
/// [`FailoverState`] (one copy of the pick logic, shared with the simulator) under a mutex,
/// plus persistence and metrics.
pub struct Failover {
    region: Region,
    policy_keys: TrustedKeys,
    data_dir: PathBuf,
    inner: Mutex<FailoverState>,
}

impl std::fmt::Debug for Failover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failover")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Failover {
    /// Builds the state, loading the persisted policy from `data_dir` when it still verifies
    /// (a file that does not decode or verify is ignored, logged and counted).
    pub fn new(region: Region, policy_keys: TrustedKeys, data_dir: &Path) -> Self {
        let f = Self {
            region: region.clone(),
            policy_keys,
            data_dir: data_dir.to_path_buf(),
            inner: Mutex::new(FailoverState::new(region)),
        };
        let path = f.data_dir.join(POLICY_FILE);
        if let Ok(bytes) = crate::persist::read_state_file(&path) {
            let loaded = postcard::from_bytes::<SignedGlobalPolicy>(&bytes)
                .map_err(|e| e.to_string())
                .and_then(|p| {
                    let version = p.policy.version;
                    f.inner
                        .lock()
                        .expect("failover")
                        .offer_policy(Arc::new(p), &f.policy_keys)
                        .map(|()| version)
                        .map_err(|e| e.to_string())
                });
            match loaded {
                Ok(version) => tracing::info!(version, "persisted global policy loaded"),
                Err(e) => {
                    counter!("shoal_global_policy_rejected_total").increment(1);
                    tracing::error!(file = %path.display(), error = %e, "persisted global policy refused; ignored");
                }
            }
        }
        f
    }

    /// Whether the held global policy names `key` (a service that may fail over).
    pub fn has_policy(&self, key: &ServiceKey) -> bool {
        self.inner
            .lock()
            .expect("failover")
            .policy()
            .is_some_and(|p| p.policy.services.iter().any(|s| &s.key == key))
    }

    /// The held global policy version (0: none).
    pub fn policy_version(&self) -> u64 {
        self.inner.lock().expect("failover").policy_version()
    }

    /// Applies one failover feed: a newer policy (verified, persisted) and summaries
    /// (verified against their region's keys; only newer ones replace held ones). Returns
    /// (policy changed, summaries kept).
    pub fn apply_feed(
        &self,
        policy: Option<SignedGlobalPolicy>,
        summaries: Vec<shoal_proto::SignedSummary>,
        now_ms: u64,
    ) -> (bool, usize) {
        let mut inner = self.inner.lock().expect("failover");
        let held = inner.policy_version();
        let mut changed = false;
        if let Some(p) = policy.filter(|p| p.policy.version > held) {
            let p = Arc::new(p);
            match inner.offer_policy(Arc::clone(&p), &self.policy_keys) {
                Ok(()) => {
                    let bytes = postcard::to_allocvec(&*p).expect("plain data");
                    if let Err(e) =
                        crate::keys::write_atomic(&self.data_dir.join(POLICY_FILE), &bytes, 0o600)
                    {
                        tracing::warn!(error = %e, "persisting the global policy failed (kept in memory)");
                    }
                    tracing::info!(version = p.policy.version, "global policy applied");
                    changed = true;
                }
                Err(e) => {
                    counter!("shoal_global_policy_rejected_total").increment(1);
                    tracing::warn!(error = %e, "global policy from the authority refused");
                }
            }
        }
        if inner.policy().is_none() {
            return (changed, 0);
        }
        let mut kept = 0;
        for s in summaries {
            match inner.offer_summary(Arc::new(s), now_ms) {
                Ok(()) => kept += 1,
                Err(shoal_catalog::remote::OfferError::NotNewer) => {}
                Err(e) => {
                    counter!("shoal_remote_summaries_rejected_total", "reason" => e.as_label())
                        .increment(1);
                    tracing::warn!(error = %e, "remote summary refused");
                }
            }
        }
        gauge!("shoal_remote_summaries").set(inner.remote().len() as f64);
        (changed, kept)
    }

    /// The failover tier of a pick for `key` (call it only when the local region has no
    /// routable endpoint). `write` is the caller's stated write intent, `now_s` a monotonic
    /// second for the rate window, `r` a random number for the weighted choice.
    ///
    /// # Errors
    /// [`NoFailover`] saying why there is no answer (counted per reason).
    pub fn pick_remote(
        &self,
        key: &ServiceKey,
        write: bool,
        now_s: u64,
        r: u64,
    ) -> Result<RemotePick, NoFailover> {
        let res = self.pick_inner(key, write, now_s, r, wall_ms());
        match &res {
            Ok(p) => counter!("shoal_failover_picks_total", "region" => p.region.to_string())
                .increment(1),
            Err(e) => {
                counter!("shoal_failover_refused_total", "reason" => e.as_label()).increment(1)
            }
        }
        res
    }

    /// The held policy's `overprovisioning_factor_pct` for `key` (`None`: all-or-nothing, no
    /// [`LocalCapacity`] needed).
    pub fn overprovisioning_factor_pct(&self, key: &ServiceKey) -> Option<u32> {
        self.inner
            .lock()
            .expect("failover")
            .overprovisioning_factor_pct(key)
    }

    /// The threshold step of a pick the local region can answer: `Some` when it spilled to
    /// the failover tier and that tier answered (counted in `shoal_failover_picks_total` and
    /// `shoal_failover_spills_total{region}`), `None` to answer locally (no factor, the draw
    /// kept it local, or the tier refused: `shoal_failover_spill_refused_total{reason}`).
    /// `r` is the pick's random number for the weighted choice; the spill draw is its own.
    pub fn spill_remote(
        &self,
        key: &ServiceKey,
        capacity: LocalCapacity,
        write: bool,
        now_s: u64,
        r: u64,
    ) -> Option<RemotePick> {
        let r_spill = crate::keys::Jitter::new().next_u64();
        let res = self.spill_inner(key, capacity, write, now_s, r_spill, r, wall_ms());
        match res {
            Spill::Local => None,
            Spill::Remote(p) => {
                let region = p.region.to_string();
                counter!("shoal_failover_picks_total", "region" => region.clone()).increment(1);
                counter!("shoal_failover_spills_total", "region" => region).increment(1);
                Some(p)
            }
            Spill::Refused(why) => {
                counter!("shoal_failover_spill_refused_total", "reason" => why.as_label())
                    .increment(1);
                None
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn spill_inner(
        &self,
        key: &ServiceKey,
        capacity: LocalCapacity,
        write: bool,
        now_s: u64,
        r_spill: u64,
        r: u64,
        now_wall_ms: u64,
    ) -> Spill {
        self.inner.lock().expect("failover").spill_remote(
            key,
            capacity,
            write,
            now_s,
            now_wall_ms,
            r_spill,
            r,
        )
    }

    fn pick_inner(
        &self,
        key: &ServiceKey,
        write: bool,
        now_s: u64,
        r: u64,
        now_wall_ms: u64,
    ) -> Result<RemotePick, NoFailover> {
        self.inner
            .lock()
            .expect("failover")
            .pick_remote(key, write, now_s, now_wall_ms, r)
    }

    /// What the xDS view serves of failover (`crate::xds`): per service with a policy that
    /// allows another region, its regions in policy order with `read_only`, `degraded` and the
    /// endpoints of the held summary (none when no summary is held). A region whose summary is
    /// past `max_snapshot_age_s` under `on_stale = refuse` is left out, as in a pick; the
    /// per-agent `max_cross_region_rps` cap cannot apply to a client that balances itself.
    /// With the policy's `overprovisioning_factor_pct`, the xDS assignment lists the regions
    /// always and lets the client compute the spill (`shoal-xds`).
    pub fn xds_regions(&self) -> Vec<XdsService> {
        let inner = self.inner.lock().expect("failover");
        let Some(policy) = inner.policy().cloned() else {
            return Vec::new();
        };
        let now = wall_ms();
        let mut out = Vec::new();
        for gs in &policy.policy.services {
            let sp = &gs.policy;
            let read_only = sp.mode == FailoverMode::ReadOnly;
            let max_age_ms = sp.max_snapshot_age_s.map(|s| u64::from(s) * 1_000);
            let mut regions = Vec::new();
            for region in sp
                .allowed_failover_regions
                .iter()
                .filter(|r| **r != self.region)
            {
                let held = inner.remote().get(region, &gs.key);
                let stale = held.is_some_and(|h| {
                    let age = now.saturating_sub(h.signed.summary.generated_at_ms);
                    max_age_ms.is_some_and(|m| age > m)
                });
                if stale && sp.on_stale == StaleAction::Refuse {
                    continue;
                }
                regions.push(XdsRegion {
                    region: region.clone(),
                    read_only,
                    degraded: stale,
                    endpoints: held
                        .map(|h| h.signed.summary.endpoints.clone())
                        .unwrap_or_default(),
                });
            }
            if !regions.is_empty() {
                out.push(XdsService {
                    key: gs.key.clone(),
                    regions,
                    overprovisioning_factor_pct: sp.overprovisioning_factor_pct,
                });
            }
        }
        out
    }

    /// JSON of the held policy and summaries, for `/v1/failover`.
    pub fn status_json(&self) -> Value {
        let inner = self.inner.lock().expect("failover");
        let now = wall_ms();
        let summaries: Vec<Value> = inner
            .remote()
            .iter()
            .map(|h| {
                let s = &h.signed.summary;
                json!({
                    "region": s.region.to_string(),
                    "service": s.key.to_string(),
                    "revision": s.revision.0,
                    "generated_at_ms": s.generated_at_ms,
                    "age_ms": now.saturating_sub(s.generated_at_ms),
                    "routable_total": s.routable_total,
                    "endpoints": s.endpoints.iter().map(|e| e.endpoint.address.to_string()).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "region": self.region.to_string(),
            "policy_version": inner.policy_version(),
            "services_with_policy": inner.policy().map_or(0, |p| p.policy.services.len()),
            "summaries": summaries,
        })
    }
}

/// Splits `intent=read|write` off a pick's raw query (the rest goes to the ordinary parser).
///
/// # Errors
/// An intent other than `read` or `write`.
pub fn take_intent(raw: Option<String>) -> Result<(bool, Option<String>), String> {
    let Some(raw) = raw else {
        return Ok((false, None));
    };
    let mut write = false;
    let mut rest = Vec::new();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        match pair.strip_prefix("intent=") {
            Some("write") => write = true,
            Some("read") => write = false,
            Some(other) => return Err(format!("intent must be `read` or `write`, got `{other}`")),
            None => rest.push(pair),
        }
    }
    Ok((write, (!rest.is_empty()).then(|| rest.join("&"))))
}

/// Pulls the failover feed from the region authority every `pull_ms`, forever (a failed pull
/// keeps what is held: summaries only age).
///
/// Returns at once when `[failover] policy_keys` is empty: no policy can then verify, and
/// summaries are kept only for the services of a held policy, so every answer would be thrown
/// away. The pull cost an idle agent a request out and a reply in every second (2 of the 2.9
/// stream messages it sent per second at 50 agents, docs/benchmarks/peer-serf.md) and its
/// authority one of each per agent (issue 19).
pub async fn pull_loop(shared: Arc<Shared>) {
    if shared.cfg.raw.failover.policy_keys.is_empty() {
        return;
    }
    let period = Duration::from_millis(shared.cfg.raw.failover.pull_ms.max(100));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let version = shared.failover.policy_version();
        let body = AuthorityRequestBody::FailoverFeed {
            policy_version: version,
        };
        match crate::client::call(&shared, body).await {
            Ok(AuthorityOk::Summaries { summaries, policy }) => {
                let (changed, kept) =
                    shared
                        .failover
                        .apply_feed(policy, summaries, shared.now_ms());
                if changed || kept > 0 {
                    shared.bump_index();
                }
            }
            Ok(other) => tracing::debug!(?other, "unexpected failover feed answer"),
            Err(e) => {
                tracing::debug!(error = %e, "failover feed pull failed; keeping what is held")
            }
        }
    }
}

/// The JSON endpoint of a failover answer (the fields of a local pick's endpoint that a
/// summary carries, plus the summary's age and revision).
pub fn endpoint_json(p: &RemotePick) -> Value {
    let e = &p.endpoint;
    json!({
        "instance": e.instance.to_string(),
        "generation": e.generation.0,
        "region": p.region.to_string(),
        "zone": e.endpoint.zone.to_string(),
        "node": e.node.to_string(),
        "address": e.endpoint.address.to_string(),
        "version": e.endpoint.version.to_string(),
        "weight": e.endpoint.weight,
        "state": "READY",
        "routable": true,
        "summary_age_ms": p.age_ms,
        "summary_revision": p.summary_revision,
        "degraded": p.degraded,
    })
}

/// Fills a pick answer's body with a failover pick: `tier`, `read_only`, `endpoint`.
pub fn answer_json(body: &mut serde_json::Map<String, Value>, p: &RemotePick) {
    body.insert(
        "tier".into(),
        json!(Tier::Failover(p.region.clone()).label()),
    );
    body.insert("read_only".into(), json!(p.read_only));
    body.insert("endpoint".into(), endpoint_json(p));
}

/// `GET /v1/failover`: the held global policy version and remote summaries with their age.
pub async fn status(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    axum::Json(shared.failover.status_json()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::summary::SummaryEndpoint;
    use shoal_proto::{FailoverMode, StaleAction};
    use shoal_proto::{
        GlobalPolicy, GlobalServicePolicy, RegionKeys, RegionSummary, Revision, ServicePolicy,
        SigningKey,
    };

    fn region(s: &str) -> Region {
        Region::new(s).unwrap()
    }
    fn key() -> ServiceKey {
        "prod/web/http".parse().unwrap()
    }
    fn region_key(n: u8) -> SigningKey {
        SigningKey::from_seed([n; 32])
    }

    /// An agent of r1 holding a policy for prod/web/http: failover to r2 then r3.
    fn agent(policy: ServicePolicy) -> (Failover, SigningKey) {
        let pk = SigningKey::from_seed([42; 32]);
        let mut trusted = TrustedKeys::new();
        trusted.insert(pk.verifying_key());
        let regions = (1..=3)
            .map(|i| RegionKeys {
                region: region(&format!("r{i}")),
                authority_keys: vec![region_key(i).verifying_key().to_bytes()],
            })
            .collect();
        let doc = pk.sign_global_policy(GlobalPolicy {
            version: 1,
            issued_at_ms: 0,
            regions,
            services: vec![GlobalServicePolicy { key: key(), policy }],
        });
        let dir = tempfile::tempdir().unwrap();
        let f = Failover::new(region("r1"), trusted, dir.path());
        assert_eq!(f.apply_feed(Some(doc), Vec::new(), 0), (true, 0));
        assert!(dir.path().join(POLICY_FILE).exists(), "policy persisted");
        (f, pk)
    }

    fn policy(mode: FailoverMode, rps: Option<u32>, on_stale: StaleAction) -> ServicePolicy {
        ServicePolicy {
            allowed_failover_regions: vec![region("r1"), region("r2"), region("r3")],
            mode,
            max_cross_region_rps: rps,
            max_snapshot_age_s: Some(10),
            on_stale,
            overprovisioning_factor_pct: None,
        }
    }

    fn summary(r: u8, n_endpoints: u32, generated_at_ms: u64) -> shoal_proto::SignedSummary {
        let endpoints = (0..n_endpoints)
            .map(|i| SummaryEndpoint {
                instance: shoal_proto::InstanceId::new(format!("r{r}-{i}")).unwrap(),
                generation: shoal_proto::Generation(1),
                node: shoal_proto::NodeId::new(format!("r{r}-a1")).unwrap(),
                endpoint: shoal_catalog::testkit::Fixture::spec(i),
            })
            .collect();
        region_key(r).sign_summary(RegionSummary {
            region: region(&format!("r{r}")),
            key: key(),
            revision: Revision(generated_at_ms),
            generated_at_ms,
            routable_total: n_endpoints,
            endpoints,
        })
    }

    const NOW: u64 = 1_000_000;

    #[test]
    fn the_policy_order_decides_and_an_empty_region_is_skipped() {
        let (f, _) = agent(policy(FailoverMode::Writable, None, StaleAction::Degrade));
        let feed = vec![summary(2, 0, NOW), summary(3, 2, NOW)];
        assert_eq!(f.apply_feed(None, feed, 0), (false, 2));
        let p = f.pick_inner(&key(), true, 0, 7, NOW + 5).unwrap();
        assert_eq!(p.region, region("r3"), "r2 has no routable endpoint");
        assert!(!p.read_only && !p.degraded);
        assert_eq!(p.age_ms, 5);
        f.apply_feed(None, vec![summary(2, 1, NOW + 1)], 0);
        assert_eq!(
            f.pick_inner(&key(), false, 0, 7, NOW + 5).unwrap().region,
            region("r2")
        );
    }

    #[test]
    fn a_service_without_policy_never_leaves_and_write_intent_is_refused_when_read_only() {
        let (f, _) = agent(policy(FailoverMode::ReadOnly, None, StaleAction::Degrade));
        f.apply_feed(None, vec![summary(2, 1, NOW)], 0);
        let other: ServiceKey = "prod/other/http".parse().unwrap();
        assert_eq!(
            f.pick_inner(&other, false, 0, 1, NOW).unwrap_err(),
            NoFailover::NoPolicy
        );
        assert_eq!(
            f.pick_inner(&key(), true, 0, 1, NOW).unwrap_err(),
            NoFailover::ReadOnly
        );
        assert!(f.pick_inner(&key(), false, 0, 1, NOW).unwrap().read_only);
    }

    #[test]
    fn the_cross_region_rate_is_capped_per_second() {
        let (f, _) = agent(policy(
            FailoverMode::Writable,
            Some(2),
            StaleAction::Degrade,
        ));
        f.apply_feed(None, vec![summary(2, 1, NOW)], 0);
        assert!(f.pick_inner(&key(), false, 5, 1, NOW).is_ok());
        assert!(f.pick_inner(&key(), false, 5, 1, NOW).is_ok());
        assert_eq!(
            f.pick_inner(&key(), false, 5, 1, NOW).unwrap_err(),
            NoFailover::Capped { rps: 2 }
        );
        assert!(
            f.pick_inner(&key(), false, 6, 1, NOW).is_ok(),
            "a new second"
        );
    }

    #[test]
    fn past_the_maximum_age_degrade_serves_marked_and_refuse_skips() {
        let (f, _) = agent(policy(FailoverMode::Writable, None, StaleAction::Degrade));
        f.apply_feed(None, vec![summary(2, 1, NOW)], 0);
        let p = f.pick_inner(&key(), false, 0, 1, NOW + 11_000).unwrap();
        assert!(p.degraded);
        let (f, _) = agent(policy(FailoverMode::Writable, None, StaleAction::Refuse));
        f.apply_feed(
            None,
            vec![summary(2, 1, NOW), summary(3, 1, NOW + 9_000)],
            0,
        );
        let p = f.pick_inner(&key(), false, 0, 1, NOW + 11_000).unwrap();
        assert_eq!(p.region, region("r3"), "r2 too old, r3 still fresh");
        assert_eq!(
            f.pick_inner(&key(), false, 0, 1, NOW + 20_000).unwrap_err(),
            NoFailover::TooOld
        );
    }

    #[test]
    fn a_summary_not_signed_by_its_region_is_refused_and_an_older_one_never_replaces() {
        let (f, _) = agent(policy(FailoverMode::Writable, None, StaleAction::Degrade));
        let mut forged = summary(2, 1, NOW);
        forged = region_key(3).sign_summary(forged.summary);
        assert_eq!(f.apply_feed(None, vec![forged], 0), (false, 0));
        assert_eq!(
            f.pick_inner(&key(), false, 0, 1, NOW).unwrap_err(),
            NoFailover::NoRemoteEndpoint
        );
        f.apply_feed(None, vec![summary(2, 1, NOW + 10)], 0);
        assert_eq!(f.apply_feed(None, vec![summary(2, 0, NOW)], 0), (false, 0));
        assert!(f.pick_inner(&key(), false, 0, 1, NOW + 10).is_ok());
    }

    #[test]
    fn the_persisted_policy_is_loaded_at_start() {
        let pk = SigningKey::from_seed([42; 32]);
        let mut trusted = TrustedKeys::new();
        trusted.insert(pk.verifying_key());
        let dir = tempfile::tempdir().unwrap();
        let doc = pk.sign_global_policy(GlobalPolicy {
            version: 4,
            issued_at_ms: 0,
            regions: Vec::new(),
            services: Vec::new(),
        });
        std::fs::write(
            dir.path().join(POLICY_FILE),
            postcard::to_allocvec(&doc).unwrap(),
        )
        .unwrap();
        assert_eq!(
            Failover::new(region("r1"), trusted, dir.path()).policy_version(),
            4
        );
        let mut other = TrustedKeys::new();
        other.insert(SigningKey::from_seed([1; 32]).verifying_key());
        assert_eq!(
            Failover::new(region("r1"), other, dir.path()).policy_version(),
            0,
            "a file signed by an untrusted key is ignored"
        );
    }

    #[test]
    fn intent_is_split_off_the_query() {
        assert_eq!(take_intent(None), Ok((false, None)));
        assert_eq!(
            take_intent(Some("intent=write&zone=z1".into())),
            Ok((true, Some("zone=z1".into())))
        );
        assert_eq!(take_intent(Some("intent=read".into())), Ok((false, None)));
        assert!(take_intent(Some("intent=delete".into())).is_err());
    }

    #[test]
    fn xds_regions_follow_the_policy_order_and_leave_out_refused_stale_ones() {
        let (f, _) = agent(policy(FailoverMode::ReadOnly, None, StaleAction::Degrade));
        let now = wall_ms();
        // r2: fresh, one endpoint; r3: past max_snapshot_age_s (10 s), two endpoints.
        f.apply_feed(
            None,
            vec![summary(2, 1, now), summary(3, 2, now - 60_000)],
            0,
        );
        let got = f.xds_regions();
        assert_eq!(got.len(), 1, "one service has a policy");
        assert_eq!(got[0].key, key());
        assert_eq!(got[0].overprovisioning_factor_pct, None);
        let regions: Vec<(String, bool, bool, usize)> = got[0]
            .regions
            .iter()
            .map(|r| {
                (
                    r.region.to_string(),
                    r.read_only,
                    r.degraded,
                    r.endpoints.len(),
                )
            })
            .collect();
        assert_eq!(
            regions,
            vec![("r2".into(), true, false, 1), ("r3".into(), true, true, 2)],
            "the agent's own region r1 is skipped; r3 is served degraded"
        );
        let (f, _) = agent(policy(FailoverMode::Writable, None, StaleAction::Refuse));
        f.apply_feed(
            None,
            vec![summary(2, 1, now), summary(3, 2, now - 60_000)],
            0,
        );
        let got = f.xds_regions();
        let names: Vec<String> = got[0]
            .regions
            .iter()
            .map(|r| r.region.to_string())
            .collect();
        assert_eq!(names, vec!["r2"], "refuse: the stale region is not served");
        assert!(!got[0].regions[0].read_only);
    }

    #[test]
    fn a_threshold_policy_spills_its_share_and_answers_locally_when_refused() {
        let mut p = policy(FailoverMode::ReadOnly, None, StaleAction::Degrade);
        p.overprovisioning_factor_pct = Some(140);
        let (f, _) = agent(p);
        assert_eq!(f.overprovisioning_factor_pct(&key()), Some(140));
        assert_eq!(f.xds_regions()[0].overprovisioning_factor_pct, Some(140));
        f.apply_feed(None, vec![summary(2, 1, NOW)], 0);
        // 5 of 10 routable at 140 %: the region keeps 70 of every 100 draws.
        let c = LocalCapacity {
            routable: 5,
            registered: 10,
        };
        let spilled = (0..100u64)
            .filter(|&r| {
                matches!(
                    f.spill_inner(&key(), c, false, 0, r, 1, NOW),
                    Spill::Remote(ref p) if p.region == region("r2") && p.read_only
                )
            })
            .count();
        assert_eq!(spilled, 30);
        let refused = (0..100u64)
            .filter(|&r| {
                matches!(
                    f.spill_inner(&key(), c, true, 0, r, 1, NOW),
                    Spill::Refused(NoFailover::ReadOnly)
                )
            })
            .count();
        assert_eq!(
            refused, 30,
            "write intent: the spill is refused, never no backend"
        );
        let (plain, _) = agent(policy(FailoverMode::Writable, None, StaleAction::Degrade));
        plain.apply_feed(None, vec![summary(2, 1, NOW)], 0);
        assert!(
            (0..100u64).all(|r| plain.spill_remote(&key(), c, false, 0, r).is_none()),
            "no factor: all-or-nothing"
        );
    }

    #[test]
    fn a_persisted_policy_in_the_encoding_before_the_factor_is_refused_and_refetched() {
        // The bytes an agent built before `overprovisioning_factor_pct` existed persisted: the
        // same document without the field (one byte shorter per service at its end).
        let pk = SigningKey::from_seed([42; 32]);
        let mut trusted = TrustedKeys::new();
        trusted.insert(pk.verifying_key());
        let doc = pk.sign_global_policy(GlobalPolicy {
            version: 3,
            issued_at_ms: 0,
            regions: Vec::new(),
            services: vec![GlobalServicePolicy {
                key: key(),
                policy: policy(FailoverMode::Writable, None, StaleAction::Degrade),
            }],
        });
        let new_bytes = postcard::to_allocvec(&doc).unwrap();
        let mut old_bytes = new_bytes.clone();
        // The service policy ends with `on_stale` then the `None` tag of the new field, right
        // before the signer; drop that tag to get the old layout.
        let sig_len = postcard::to_allocvec(&(doc.signer, doc.signature))
            .unwrap()
            .len();
        let tag_at = new_bytes.len() - sig_len - 1;
        assert_eq!(old_bytes.remove(tag_at), 0, "the None tag of the new field");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(POLICY_FILE), &old_bytes).unwrap();
        let f = Failover::new(region("r1"), trusted, dir.path());
        assert_eq!(
            f.policy_version(),
            0,
            "the old file is refused, not misread"
        );
        // The feed pull asks with version 0, so the authority sends its document again.
        assert_eq!(f.apply_feed(Some(doc), Vec::new(), 0), (true, 0));
        assert_eq!(f.policy_version(), 3);
        assert_eq!(
            std::fs::read(dir.path().join(POLICY_FILE)).unwrap(),
            new_bytes,
            "re-persisted in the current encoding"
        );
    }
}
