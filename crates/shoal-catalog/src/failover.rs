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

use std::collections::HashMap;
use std::sync::Arc;

use shoal_proto::summary::SummaryEndpoint;
use shoal_proto::{
    FailoverMode, Region, ServiceKey, SignedGlobalPolicy, SignedSummary, StaleAction, TrustedKeys,
};

use crate::remote::{OfferError, RemoteSummaries};

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

    /// The failover tier of a pick for `key` (call it only when the local region has no
    /// routable endpoint). `write` is the caller's stated write intent, `now_s` a monotonic
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
                    max_cross_region_rps: Some(1),
                    max_snapshot_age_s: None,
                    on_stale: StaleAction::Degrade,
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
}
