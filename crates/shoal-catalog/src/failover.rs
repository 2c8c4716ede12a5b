//! The failover tier of a pick, as a pure state machine (docs/adr/0013-global-policy-and-failover.md):
//! what an agent holds beside its catalog (the global policy, the remote summaries, the
//! per-service cross-region rate windows) and how it answers when its own region has no
//! routable endpoint. The tokio agent (`shoal-agent`'s `failover` module) wraps it in a
//! mutex and adds persistence and metrics; the simulator drives the same code for thousands
//! of agents. No IO, no clock: every time is an input.
//!
//! Pick order: zone, then region (from the local catalog, [`crate::view::pick`]), then
//! [`FailoverState::pick_remote`]: the policy's regions in order (the caller's own region
//! skipped), the first whose held summary has an endpoint; refused for write intent when the
//! policy is read-only, capped at `max_cross_region_rps` per agent and service (a one-second
//! window), and past `max_snapshot_age_s` served `degraded` or skipped as `on_stale` says. A
//! service without policy never leaves its region.
//!
//! **Threshold failover** (a policy with `overprovisioning_factor_pct`): even when the region
//! can answer, a pick spills to that same failover tier with Envoy's priority-load share,
//! `100 - min(100, factor_pct * routable / registered)` percent ([`LocalCapacity`],
//! [`FailoverState::spill_remote`]); a spill the failover tier refuses (read-only with write
//! intent, capped, too old, nothing there) is answered locally, so a spill never turns an
//! answerable pick into "no backend".

use std::collections::HashMap;
use std::sync::Arc;

use shoal_proto::summary::SummaryEndpoint;
use shoal_proto::{
    FailoverMode, Region, ServiceKey, SignedGlobalPolicy, SignedSummary, StaleAction, TrustedKeys,
};

use crate::catalog::Catalog;
use crate::remote::{OfferError, RemoteSummaries};
use crate::view::Liveness;

/// Most services whose cross-region request rate one agent tracks (older windows are reset).
pub const MAX_RATE_WINDOWS: usize = 8_192;

/// Which tier answered a pick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tier {
    /// An endpoint in the caller's zone.
    Zone,
    /// An endpoint in the caller's region, another zone.
    Region,
    /// An endpoint of another region, by policy.
    Failover(Region),
}

impl Tier {
    /// `zone`, `region` or `failover:<region>`.
    pub fn label(&self) -> String {
        match self {
            Self::Zone => "zone".into(),
            Self::Region => "region".into(),
            Self::Failover(r) => format!("failover:{r}"),
        }
    }
}

/// The tier of a local pick: `zone` when the endpoint is in the caller's zone, else `region`.
pub fn local_tier(endpoint_zone: &shoal_proto::Zone, my_zone: &shoal_proto::Zone) -> Tier {
    if endpoint_zone == my_zone {
        Tier::Zone
    } else {
        Tier::Region
    }
}

/// A failover answer.
#[derive(Debug, Clone)]
pub struct RemotePick {
    /// The region that answered.
    pub region: Region,
    /// The endpoint, as the remote region's authority summarised it.
    pub endpoint: SummaryEndpoint,
    /// Summary age at pick time, ms (holder clock minus the summary's `generated_at_ms`).
    pub age_ms: u64,
    /// Past `max_snapshot_age_s` with `on_stale = Degrade`.
    pub degraded: bool,
    /// The policy is read-only.
    pub read_only: bool,
    /// The remote region's revision head the summary reflects.
    pub summary_revision: u64,
}

/// Why no failover answer was given (the pick answers an explicit "no backend").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoFailover {
    /// No global policy lists the service (or it lists no other region): it never leaves its
    /// region.
    NoPolicy,
    /// The caller stated write intent and the policy is read-only.
    ReadOnly,
    /// `max_cross_region_rps` reached in this second.
    Capped {
        /// The cap.
        rps: u32,
    },
    /// Every allowed region's summary is older than `max_snapshot_age_s` and the policy
    /// refuses stale answers.
    TooOld,
    /// No allowed region has a routable endpoint in its last summary (or none was received).
    NoRemoteEndpoint,
}

impl NoFailover {
    /// Metric label.
    pub fn as_label(&self) -> &'static str {
        match self {
            Self::NoPolicy => "no_policy",
            Self::ReadOnly => "read_only",
            Self::Capped { .. } => "capped",
            Self::TooOld => "too_old",
            Self::NoRemoteEndpoint => "no_remote_endpoint",
        }
    }
}

/// The caller's region's capacity for one service: what the spill decision of a threshold
/// policy reads (Envoy's priority health, by endpoint count, not weight).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LocalCapacity {
    /// Routable endpoints of the service in the caller's region (READY, health passing, owner
    /// up, not ejected): what a local pick may answer.
    pub routable: u32,
    /// Registered endpoints of the service in the caller's region: every non-expired one
    /// (STARTING, READY, DRAINING, whatever its health or owner), the xDS assignment's
    /// endpoints of that region.
    pub registered: u32,
}

impl LocalCapacity {
    /// Counts `key`'s endpoints of `region` in `catalog` as `liveness` sees them.
    pub fn of(
        catalog: &Catalog,
        key: &ServiceKey,
        region: &Region,
        liveness: &dyn Liveness,
    ) -> Self {
        let mut c = Self::default();
        for e in catalog
            .service(key)
            .into_iter()
            .flat_map(|s| s.instances.values())
        {
            let rec = &e.lifecycle().record;
            if &rec.region != region || rec.state == shoal_proto::LifecycleState::Expired {
                continue;
            }
            c.registered += 1;
            c.routable += u32::from(crate::view::is_routable(e, liveness));
        }
        c
    }

    /// Envoy's priority health of the region, integer percent:
    /// `min(100, factor_pct * routable / registered)` (floor), 0 with nothing registered.
    /// It is the share of picks the region keeps; the rest spills to the failover tier.
    pub fn local_share_pct(&self, factor_pct: u32) -> u32 {
        if self.registered == 0 {
            return 0;
        }
        let pct = u64::from(factor_pct) * u64::from(self.routable) / u64::from(self.registered);
        pct.min(100) as u32
    }

    /// Whether one pick spills: `r_spill % 100 >= local_share_pct(factor_pct)`. `r_spill` is a
    /// uniform random number of its own (not the one that chooses the endpoint, or the spill
    /// and the endpoint choice would be correlated).
    pub fn spills(&self, factor_pct: u32, r_spill: u64) -> bool {
        r_spill % 100 >= u64::from(self.local_share_pct(factor_pct))
    }
}

/// What [`FailoverState::spill_remote`] decided for a pick the region can answer.
#[derive(Debug, Clone)]
pub enum Spill {
    /// Answer locally: the policy sets no factor, or the draw kept the pick in the region.
    Local,
    /// The pick spilled and the failover tier answered.
    Remote(RemotePick),
    /// The pick spilled but the failover tier refused (why): answer locally.
    Refused(NoFailover),
}

/// Why a global policy document was not taken. The held one is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyRefused {
    /// Not above the held version (a replay or an older copy).
    #[error("global policy version {offered} is not above the held {held}")]
    NotNewer {
        /// Offered version.
        offered: u64,
        /// Held version.
        held: u64,
    },
    /// The signature or the document does not verify against the policy keys.
    #[error("{0}")]
    Unverified(String),
}

/// What one agent holds for failover: the global policy, the remote summaries beside its
/// catalog, and the cross-region rate windows.
#[derive(Debug, Clone)]
pub struct FailoverState {
    region: Region,
    policy: Option<Arc<SignedGlobalPolicy>>,
    remote: RemoteSummaries,
    /// Per service: (second, requests sent cross-region in it).
    windows: HashMap<ServiceKey, (u64, u32)>,
}

impl FailoverState {
    /// Empty state of an agent in `region`: no policy, so nothing fails over yet.
    pub fn new(region: Region) -> Self {
        Self {
            remote: RemoteSummaries::new(region.clone()),
            region,
            policy: None,
            windows: HashMap::new(),
        }
    }

    /// The held policy.
    pub fn policy(&self) -> Option<&Arc<SignedGlobalPolicy>> {
        self.policy.as_ref()
    }

    /// The held policy version (0: none).
    pub fn policy_version(&self) -> u64 {
        self.policy.as_ref().map_or(0, |p| p.policy.version)
    }

    /// The held remote summaries.
    pub fn remote(&self) -> &RemoteSummaries {
        &self.remote
    }

    /// Drops every held summary (an agent restart: summaries are kept in memory only), keeping
    /// the policy (persisted).
    pub fn forget_summaries(&mut self) {
        self.remote = RemoteSummaries::new(self.region.clone());
        self.windows.clear();
    }

    /// Takes `policy` when its version is above the held one and it verifies against
    /// `policy_keys`; then drops summaries the new policy no longer allows.
    ///
    /// # Errors
    /// [`PolicyRefused`]; nothing changes then.
    pub fn offer_policy(
        &mut self,
        policy: Arc<SignedGlobalPolicy>,
        policy_keys: &TrustedKeys,
    ) -> Result<(), PolicyRefused> {
        let held = self.policy_version();
        if policy.policy.version <= held {
            return Err(PolicyRefused::NotNewer {
                offered: policy.policy.version,
                held,
            });
        }
        policy
            .verify(policy_keys)
            .map_err(PolicyRefused::Unverified)?;
        self.policy = Some(policy);
        self.retain_allowed();
        Ok(())
    }

    /// Offers one remote summary, verified against its region's keys as the held policy lists
    /// them, and kept only if the policy lets this region fail over to that one for that
    /// service.
    ///
    /// # Errors
    /// [`OfferError`] (`NotAllowed` when no policy is held or it does not allow the pair);
    /// nothing changes then.
    pub fn offer_summary(
        &mut self,
        signed: Arc<SignedSummary>,
        now_ms: u64,
    ) -> Result<(), OfferError> {
        self.offer_summary_with(signed, now_ms, |s, keys| s.verify(keys))
    }

    /// As [`Self::offer_summary`], with the signature check supplied by the caller (it gets
    /// the summary and the region's keys from the policy): the simulator verifies each
    /// distinct summary once and shares the result between its agents.
    ///
    /// # Errors
    /// As [`Self::offer_summary`].
    pub fn offer_summary_with(
        &mut self,
        signed: Arc<SignedSummary>,
        now_ms: u64,
        verify: impl FnOnce(&SignedSummary, &TrustedKeys) -> Result<(), String>,
    ) -> Result<(), OfferError> {
        let Some(policy) = self.policy.as_ref() else {
            return Err(OfferError::NotAllowed);
        };
        let s = &signed.summary;
        let allowed = policy
            .policy
            .service(&s.key)
            .is_some_and(|p| p.allowed_failover_regions.contains(&s.region));
        if !allowed && s.region != self.region {
            return Err(OfferError::NotAllowed);
        }
        // The keys are decoded only for a summary that would be kept (most offers are
        // repeats of the held one).
        self.remote.offer_checked(signed, now_ms, |s| {
            verify(s, &policy.policy.region_keys(&s.summary.region))
        })
    }

    fn retain_allowed(&mut self) {
        let Some(policy) = self.policy.clone() else {
            return;
        };
        let me = self.region.clone();
        self.remote.retain(|r, k| {
            r != &me
                && policy
                    .policy
                    .service(k)
                    .is_some_and(|p| p.allowed_failover_regions.contains(r))
        });
    }

    /// The held policy's `overprovisioning_factor_pct` for `key` (`None`: no policy, or
    /// all-or-nothing failover): whether a pick needs [`LocalCapacity`] at all.
    pub fn overprovisioning_factor_pct(&self, key: &ServiceKey) -> Option<u32> {
        self.policy
            .as_ref()?
            .policy
            .service(key)?
            .overprovisioning_factor_pct
    }

    /// The threshold step of a pick the caller's region can answer (`capacity.routable > 0`):
    /// with the policy's factor `f`, the pick spills with probability
    /// `1 - min(100, f * routable / registered) / 100` ([`LocalCapacity::spills`], drawn with
    /// `r_spill`) to [`Self::pick_remote`] (same tiers, caps and staleness rules, `r` for its
    /// weighted choice). A refused spill is [`Spill::Refused`]: the caller answers locally.
    /// Deterministic in its inputs.
    #[allow(clippy::too_many_arguments)]
    pub fn spill_remote(
        &mut self,
        key: &ServiceKey,
        capacity: LocalCapacity,
        write: bool,
        now_s: u64,
        now_ms: u64,
        r_spill: u64,
        r: u64,
    ) -> Spill {
        let Some(factor) = self.overprovisioning_factor_pct(key) else {
            return Spill::Local;
        };
        if !capacity.spills(factor, r_spill) {
            return Spill::Local;
        }
        match self.pick_remote(key, write, now_s, now_ms, r) {
            Ok(p) => Spill::Remote(p),
            Err(why) => Spill::Refused(why),
        }
    }

    /// The failover tier of a pick for `key` (call it when the local region has no
    /// routable endpoint, or through [`Self::spill_remote`]). `write` is the caller's stated write intent, `now_s` a monotonic
    /// second for the rate window, `now_ms` the holder clock the summaries' age is measured
    /// with (the agent's wall clock, against `generated_at_ms`), `r` a random number for the
    /// weighted choice.
    ///
    /// # Errors
    /// [`NoFailover`] saying why there is no answer; the rate window counts only answers.
    pub fn pick_remote(
        &mut self,
        key: &ServiceKey,
        write: bool,
        now_s: u64,
        now_ms: u64,
        r: u64,
    ) -> Result<RemotePick, NoFailover> {
        let policy = self.policy.clone().ok_or(NoFailover::NoPolicy)?;
        let sp = policy.policy.service(key).ok_or(NoFailover::NoPolicy)?;
        let targets: Vec<&Region> = sp
            .allowed_failover_regions
            .iter()
            .filter(|r| **r != self.region)
            .collect();
        if targets.is_empty() {
            return Err(NoFailover::NoPolicy);
        }
        let read_only = sp.mode == FailoverMode::ReadOnly;
        if write && read_only {
            return Err(NoFailover::ReadOnly);
        }
        let max_age_ms = sp.max_snapshot_age_s.map(|s| u64::from(s) * 1_000);
        let mut too_old = false;
        let mut chosen = None;
        for region in targets {
            let Some(held) = self.remote.get(region, key) else {
                continue;
            };
            let s = &held.signed.summary;
            let age_ms = now_ms.saturating_sub(s.generated_at_ms);
            let stale = max_age_ms.is_some_and(|m| age_ms > m);
            if stale && sp.on_stale == StaleAction::Refuse {
                too_old = true;
                continue;
            }
            let Some(endpoint) = weighted(&s.endpoints, r) else {
                continue;
            };
            chosen = Some(RemotePick {
                region: region.clone(),
                endpoint: endpoint.clone(),
                age_ms,
                degraded: stale,
                read_only,
                summary_revision: s.revision.0,
            });
            break;
        }
        let Some(pick) = chosen else {
            return Err(if too_old {
                NoFailover::TooOld
            } else {
                NoFailover::NoRemoteEndpoint
            });
        };
        if let Some(rps) = sp.max_cross_region_rps {
            if self.windows.len() >= MAX_RATE_WINDOWS && !self.windows.contains_key(key) {
                self.windows.retain(|_, (sec, _)| *sec == now_s);
            }
            let w = self.windows.entry(key.clone()).or_insert((now_s, 0));
            if w.0 != now_s {
                *w = (now_s, 0);
            }
            if w.1 >= rps {
                return Err(NoFailover::Capped { rps });
            }
            w.1 += 1;
        }
        Ok(pick)
    }
}

/// Weighted choice among summary endpoints (`None` when empty).
fn weighted(endpoints: &[SummaryEndpoint], r: u64) -> Option<&SummaryEndpoint> {
    let total: u64 = endpoints.iter().map(|e| u64::from(e.endpoint.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut point = r % total;
    for e in endpoints {
        let w = u64::from(e.endpoint.weight);
        if point < w {
            return Some(e);
        }
        point -= w;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::summary::SummaryEndpoint;
    use shoal_proto::{
        Generation, GlobalPolicy, GlobalServicePolicy, InstanceId, NodeId, RegionKeys,
        RegionSummary, Revision, ServicePolicy, SigningKey,
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

    /// An agent of r1 whose policy lets prod/web/http fail over to r2 only, capped at 1 rps.
    fn state() -> FailoverState {
        state_with(Some(1), None)
    }

    /// As [`state`], with the cap and the overprovisioning factor given.
    fn state_with(cap: Option<u32>, factor_pct: Option<u32>) -> FailoverState {
        let pk = SigningKey::from_seed([42; 32]);
        let mut trusted = TrustedKeys::new();
        trusted.insert(pk.verifying_key());
        let doc = pk.sign_global_policy(GlobalPolicy {
            version: 1,
            issued_at_ms: 0,
            regions: (1..=3)
                .map(|i| RegionKeys {
                    region: region(&format!("r{i}")),
                    authority_keys: vec![region_key(i).verifying_key().to_bytes()],
                })
                .collect(),
            services: vec![GlobalServicePolicy {
                key: key(),
                policy: ServicePolicy {
                    allowed_failover_regions: vec![region("r2")],
                    mode: FailoverMode::ReadOnly,
                    max_cross_region_rps: cap,
                    max_snapshot_age_s: None,
                    on_stale: StaleAction::Degrade,
                    overprovisioning_factor_pct: factor_pct,
                },
            }],
        });
        let mut st = FailoverState::new(region("r1"));
        assert_eq!(
            st.pick_remote(&key(), false, 0, 0, 0).unwrap_err(),
            NoFailover::NoPolicy
        );
        let doc = Arc::new(doc);
        st.offer_policy(Arc::clone(&doc), &trusted).unwrap();
        assert!(matches!(
            st.offer_policy(doc, &trusted),
            Err(PolicyRefused::NotNewer { .. })
        ));
        st
    }

    fn summary(r: u8, at_ms: u64) -> Arc<SignedSummary> {
        Arc::new(region_key(r).sign_summary(RegionSummary {
            region: region(&format!("r{r}")),
            key: key(),
            revision: Revision(at_ms),
            generated_at_ms: at_ms,
            routable_total: 1,
            endpoints: vec![SummaryEndpoint {
                instance: InstanceId::new(format!("r{r}-0")).unwrap(),
                generation: Generation(1),
                node: NodeId::new(format!("r{r}-a")).unwrap(),
                endpoint: crate::testkit::Fixture::spec(0),
            }],
        }))
    }

    #[test]
    fn only_the_policy_regions_are_held_and_the_answer_is_capped_per_second() {
        let mut st = state();
        assert_eq!(
            st.offer_summary(summary(3, 10), 0),
            Err(OfferError::NotAllowed),
            "r3 is not in the policy"
        );
        assert!(matches!(
            st.offer_summary(summary(1, 10), 0),
            Err(OfferError::OwnRegion(_))
        ));
        assert_eq!(st.offer_summary(summary(2, 10), 0), Ok(()));
        assert_eq!(
            st.pick_remote(&key(), true, 0, 20, 0).unwrap_err(),
            NoFailover::ReadOnly
        );
        let p = st.pick_remote(&key(), false, 5, 20, 0).unwrap();
        assert_eq!((p.region.as_str(), p.age_ms, p.read_only), ("r2", 10, true));
        assert_eq!(
            st.pick_remote(&key(), false, 5, 20, 0).unwrap_err(),
            NoFailover::Capped { rps: 1 }
        );
        assert!(
            st.pick_remote(&key(), false, 6, 20, 0).is_ok(),
            "a new second"
        );
        st.forget_summaries();
        assert_eq!(
            st.pick_remote(&key(), false, 7, 20, 0).unwrap_err(),
            NoFailover::NoRemoteEndpoint
        );
        assert_eq!(st.policy_version(), 1, "the policy survives a restart");
    }

    #[test]
    fn the_local_share_is_envoys_integer_priority_health() {
        let cap = |routable, registered| LocalCapacity {
            routable,
            registered,
        };
        // (routable, registered, factor %) -> local share %.
        for (routable, registered, factor, share) in [
            (10, 10, 140, 100),
            (8, 10, 140, 100), // 112 % capped: still fully healthy
            (7, 10, 140, 98),
            (5, 10, 140, 70), // Envoy's example: 50 % healthy keeps 70 % of the traffic
            (3, 10, 140, 42),
            (1, 10, 140, 14),
            (0, 10, 140, 0),
            (0, 0, 140, 0),
            (1, 3, 100, 33), // floor, as Envoy's integer health
            (2, 3, 100, 66),
            (1, 100, 10_000, 100),
        ] {
            assert_eq!(
                cap(routable, registered).local_share_pct(factor),
                share,
                "{routable}/{registered} at {factor} %"
            );
        }
    }

    #[test]
    fn over_every_residue_the_spill_share_is_exactly_the_formula() {
        for (routable, registered, factor, spilled_per_100) in [
            (10u32, 10u32, 140u32, 0u64),
            (3, 10, 140, 58),
            (5, 10, 140, 30),
            (7, 10, 140, 2),
            (1, 3, 100, 67),
            (0, 5, 140, 100),
        ] {
            let c = LocalCapacity {
                routable,
                registered,
            };
            // 10,000 consecutive draws cover every residue mod 100 exactly 100 times.
            let base = 0x9E37_79B9_7F4A_7C15u64;
            let spills = (0..10_000u64)
                .filter(|i| c.spills(factor, base.wrapping_add(*i)))
                .count() as u64;
            assert_eq!(
                spills,
                spilled_per_100 * 100,
                "{routable}/{registered} at {factor} %"
            );
        }
    }

    #[test]
    fn a_spill_goes_to_the_failover_tier_and_a_refused_one_stays_local() {
        let c = LocalCapacity {
            routable: 3,
            registered: 10,
        };
        // No factor: all-or-nothing, never a spill.
        let mut st = state_with(None, None);
        st.offer_summary(summary(2, 10), 0).unwrap();
        assert_eq!(st.overprovisioning_factor_pct(&key()), None);
        assert!((0..100)
            .all(|r| matches!(st.spill_remote(&key(), c, false, 0, 20, r, r), Spill::Local)));
        // Factor 140, 3 of 10 routable: 58 of every 100 draws spill, all answered by r2.
        let mut st = state_with(None, Some(140));
        assert_eq!(st.overprovisioning_factor_pct(&key()), Some(140));
        let refused = (0..100)
            .filter(|&r| {
                matches!(
                    st.spill_remote(&key(), c, false, 0, 20, r, r),
                    Spill::Refused(NoFailover::NoRemoteEndpoint)
                )
            })
            .count();
        assert_eq!(
            refused, 58,
            "no summary held: every spill is refused (and answered locally)"
        );
        st.offer_summary(summary(2, 10), 0).unwrap();
        let (mut local, mut remote) = (0, 0);
        for r in 0..100 {
            match st.spill_remote(&key(), c, false, 0, 20, r, r) {
                Spill::Local => local += 1,
                Spill::Remote(p) => {
                    assert_eq!((p.region.as_str(), p.read_only), ("r2", true));
                    remote += 1;
                }
                Spill::Refused(why) => panic!("refused: {why:?}"),
            }
        }
        assert_eq!((local, remote), (42, 58));
        // Write intent against a read-only policy: every spill refused, the pick stays local.
        let refused = (0..100)
            .filter(|&r| {
                matches!(
                    st.spill_remote(&key(), c, true, 0, 20, r, r),
                    Spill::Refused(NoFailover::ReadOnly)
                )
            })
            .count();
        assert_eq!(refused, 58);
        // The cap counts spills like any failover answer: one per second here.
        let mut st = state_with(Some(1), Some(140));
        st.offer_summary(summary(2, 10), 0).unwrap();
        let outcomes: Vec<&str> = (0..100)
            .map(|r| match st.spill_remote(&key(), c, false, 7, 20, r, r) {
                Spill::Local => "local",
                Spill::Remote(_) => "remote",
                Spill::Refused(NoFailover::Capped { rps: 1 }) => "capped",
                Spill::Refused(other) => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(outcomes.iter().filter(|o| **o == "remote").count(), 1);
        assert_eq!(outcomes.iter().filter(|o| **o == "capped").count(), 57);
        // A fully healthy region never spills.
        let full = LocalCapacity {
            routable: 10,
            registered: 10,
        };
        assert!((0..100).all(|r| matches!(
            st.spill_remote(&key(), full, false, 8, 20, r, r),
            Spill::Local
        )));
    }

    #[test]
    fn local_capacity_counts_the_regions_non_expired_endpoints() {
        use crate::catalog::Catalog;
        use crate::testkit::Fixture;
        use crate::view::AllAlive;
        use shoal_proto::LifecycleState;
        let fx = Fixture::new();
        let mut c = Catalog::new();
        for (i, (id, st)) in [
            ("a", LifecycleState::Ready),
            ("b", LifecycleState::Ready),
            ("c", LifecycleState::Draining),
            ("d", LifecycleState::Starting),
            ("e", LifecycleState::Expired),
        ]
        .into_iter()
        .enumerate()
        {
            let rec = fx.lifecycle(id, 1, i as u64 + 1, st);
            let _ = c.apply_lifecycle(Arc::new(rec), &fx.keyring);
        }
        assert_eq!(
            LocalCapacity::of(&c, &fx.key, &fx.region, &AllAlive),
            LocalCapacity {
                routable: 2,
                registered: 4
            },
            "the tombstone is not registered; DRAINING and STARTING are, not routable"
        );
        let down = |_: &shoal_proto::NodeId| true;
        assert_eq!(
            LocalCapacity::of(&c, &fx.key, &fx.region, &down).routable,
            0,
            "owner down"
        );
        assert_eq!(
            LocalCapacity::of(&c, &fx.key, &region("elsewhere"), &AllAlive),
            LocalCapacity::default(),
            "another region's entries are not counted"
        );
    }
}
