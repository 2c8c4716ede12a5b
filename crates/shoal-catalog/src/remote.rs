//! Remote endpoint summaries kept **beside** the local catalog (never merged into it), for
//! cross-region failover (docs/adr/0013-global-policy-and-failover.md).
//!
//! - [`summarize`] is what region R's authority runs over the catalog its mesh member holds:
//!   the routable endpoints of one service (invariant 5's definition, with R's own SWIM view)
//!   as an unsigned [`RegionSummary`].
//! - [`RemoteSummaries`] is what region L's authority and agents hold: at most one signed
//!   summary per (remote region, service), verified against the remote region's keys, replaced
//!   only by a higher `(revision, generated_at_ms)`, never for L's own region and never built
//!   from L's observations, so a remote region's endpoints can only get *older* here, never
//!   healthier than their own region last said.
//!
//! No IO, no clock: times are inputs.

use std::collections::BTreeMap;
use std::sync::Arc;

use shoal_proto::summary::{SummaryEndpoint, MAX_SUMMARY_ENDPOINTS};
use shoal_proto::{Region, RegionSummary, ServiceKey, SignedSummary, TrustedKeys};

use crate::catalog::Catalog;
use crate::view::Liveness;

/// Most (region, service) summaries one holder keeps; past it new pairs are refused and
/// counted (2 remote regions x a few thousand failover-enabled services fit).
pub const MAX_REMOTE_SUMMARIES: usize = 16_384;

/// Builds the summary of `key` in `region` from `catalog`: routable endpoints in instance id
/// order, at most [`MAX_SUMMARY_ENDPOINTS`], with the region's contiguous revision head.
pub fn summarize(
    catalog: &Catalog,
    region: &Region,
    key: &ServiceKey,
    liveness: &dyn Liveness,
    generated_at_ms: u64,
) -> RegionSummary {
    let mut endpoints = Vec::new();
    let mut total: u32 = 0;
    for e in catalog.routable(key, liveness) {
        let life = &e.lifecycle().record;
        if &life.region != region {
            continue;
        }
        total = total.saturating_add(1);
        if endpoints.len() < MAX_SUMMARY_ENDPOINTS {
            endpoints.push(SummaryEndpoint {
                instance: life.instance.clone(),
                generation: life.generation,
                node: life.owner.clone(),
                endpoint: life.endpoint.clone(),
            });
        }
    }
    RegionSummary {
        region: region.clone(),
        key: key.clone(),
        revision: catalog.region_head(region),
        generated_at_ms,
        routable_total: total,
        endpoints,
    }
}

/// Why a summary was not kept. The held set is unchanged on every variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// A summary of our own region: local truth comes only from our own authority's records.
    #[error("summary of the local region {0} refused: local truth is never taken from a summary")]
    OwnRegion(Region),
    /// The signature does not verify against the region's keys (or the bound is broken).
    #[error("{0}")]
    Unverified(String),
    /// Not newer than the held one (a duplicate or a delayed older summary).
    #[error("not newer than the held summary")]
    NotNewer,
    /// [`MAX_REMOTE_SUMMARIES`] pairs are held already.
    #[error("remote summary capacity ({MAX_REMOTE_SUMMARIES}) exhausted")]
    Full,
    /// The held global policy does not let this region fail over to that one for that
    /// service (or no policy is held).
    #[error("no held global policy allows this failover")]
    NotAllowed,
}

impl OfferError {
    /// Short label for metrics.
    pub fn as_label(&self) -> &'static str {
        match self {
            Self::OwnRegion(_) => "own_region",
            Self::Unverified(_) => "unverified",
            Self::NotNewer => "not_newer",
            Self::Full => "full",
            Self::NotAllowed => "not_allowed",
        }
    }
}

/// One held summary.
#[derive(Debug, Clone)]
pub struct HeldSummary {
    /// The signed summary as received.
    pub signed: Arc<SignedSummary>,
    /// Holder-clock ms when it was accepted.
    pub received_at_ms: u64,
}

/// Signed summaries of remote regions, one per (region, service).
#[derive(Debug, Clone)]
pub struct RemoteSummaries {
    local: Region,
    held: BTreeMap<(Region, ServiceKey), HeldSummary>,
}

impl RemoteSummaries {
    /// An empty set for a holder in region `local`.
    pub fn new(local: Region) -> Self {
        Self {
            local,
            held: BTreeMap::new(),
        }
    }

    /// Offers a signed summary; kept when it verifies against `region_keys` (the summarised
    /// region's authority keys) and is newer than the one held. Returns whether the held
    /// summary changed.
    ///
    /// # Errors
    /// [`OfferError`]; nothing changes then.
    pub fn offer(
        &mut self,
        signed: Arc<SignedSummary>,
        region_keys: &TrustedKeys,
        now_ms: u64,
    ) -> Result<(), OfferError> {
        self.offer_checked(signed, now_ms, |s| s.verify(region_keys))
    }

    /// As [`Self::offer`], with the signature check supplied by the caller (run only for a
    /// summary that would be kept): the simulator verifies each distinct summary once and
    /// shares the result between its agents.
    ///
    /// # Errors
    /// [`OfferError`]; nothing changes then.
    pub fn offer_checked(
        &mut self,
        signed: Arc<SignedSummary>,
        now_ms: u64,
        verify: impl FnOnce(&SignedSummary) -> Result<(), String>,
    ) -> Result<(), OfferError> {
        let s = &signed.summary;
        if s.region == self.local {
            return Err(OfferError::OwnRegion(s.region.clone()));
        }
        let pair = (s.region.clone(), s.key.clone());
        match self.held.get(&pair) {
            Some(h) if h.signed.summary.order() >= s.order() => return Err(OfferError::NotNewer),
            None if self.held.len() >= MAX_REMOTE_SUMMARIES => return Err(OfferError::Full),
            _ => {}
        }
        verify(&signed).map_err(OfferError::Unverified)?;
        self.held.insert(
            pair,
            HeldSummary {
                signed,
                received_at_ms: now_ms,
            },
        );
        Ok(())
    }

    /// The summary of `key` in `region`, if held.
    pub fn get(&self, region: &Region, key: &ServiceKey) -> Option<&HeldSummary> {
        self.held.get(&(region.clone(), key.clone()))
    }

    /// Every held summary, in (region, service) order.
    pub fn iter(&self) -> impl Iterator<Item = &HeldSummary> {
        self.held.values()
    }

    /// Drops the summaries `keep` says no (e.g. the policy no longer allows that failover).
    /// Returns how many were dropped.
    pub fn retain(&mut self, mut keep: impl FnMut(&Region, &ServiceKey) -> bool) -> usize {
        let before = self.held.len();
        self.held.retain(|(r, k), _| keep(r, k));
        before - self.held.len()
    }

    /// Number held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Fixture;
    use crate::view::AllAlive;
    use shoal_proto::{LifecycleState, SigningKey};

    fn keys_of(k: &SigningKey) -> TrustedKeys {
        let mut t = TrustedKeys::new();
        t.insert(k.verifying_key());
        t
    }

    /// A catalog of region `test` with a READY, a DRAINING and a STARTING instance.
    fn catalog(fx: &Fixture) -> Catalog {
        let mut c = Catalog::new();
        for (i, st) in [
            ("a", LifecycleState::Ready),
            ("b", LifecycleState::Draining),
            ("c", LifecycleState::Starting),
        ]
        .into_iter()
        .enumerate()
        {
            let rec = fx.lifecycle(st.0, 1, i as u64 + 1, st.1);
            let _ = c.apply_lifecycle(Arc::new(rec), &fx.keyring);
        }
        c
    }

    #[test]
    fn a_summary_carries_only_routable_endpoints_and_the_region_head() {
        let fx = Fixture::new();
        let s = summarize(&catalog(&fx), &fx.region, &fx.key, &AllAlive, 42);
        assert_eq!(s.routable_total, 1);
        assert_eq!(s.endpoints.len(), 1);
        assert_eq!(s.endpoints[0].instance.as_str(), "a");
        assert_eq!(s.revision.0, 3);
        assert_eq!(s.generated_at_ms, 42);
        let down = |_: &shoal_proto::NodeId| true;
        let none = summarize(&catalog(&fx), &fx.region, &fx.key, &down, 43);
        assert_eq!(
            none.routable_total, 0,
            "owner down in the region's own view"
        );
    }

    #[test]
    fn held_summaries_only_get_newer_and_never_for_the_local_region() {
        let fx = Fixture::new();
        let key = fx.authority.clone();
        let trusted = keys_of(&key);
        let local = Region::new("local").unwrap();
        let mut held = RemoteSummaries::new(local.clone());
        let s1 = summarize(&catalog(&fx), &fx.region, &fx.key, &AllAlive, 100);
        let mut s0 = s1.clone();
        s0.generated_at_ms = 50;
        assert_eq!(
            held.offer(Arc::new(key.sign_summary(s1.clone())), &trusted, 1),
            Ok(())
        );
        assert_eq!(
            held.offer(Arc::new(key.sign_summary(s0)), &trusted, 2),
            Err(OfferError::NotNewer),
            "an older summary never replaces a newer one"
        );
        assert_eq!(
            held.offer(Arc::new(key.sign_summary(s1.clone())), &trusted, 3),
            Err(OfferError::NotNewer),
            "a duplicate is not newer"
        );
        let mut own = s1.clone();
        own.region = local.clone();
        own.generated_at_ms = 200;
        assert!(matches!(
            held.offer(Arc::new(key.sign_summary(own)), &trusted, 4),
            Err(OfferError::OwnRegion(_))
        ));
        let mut forged = s1.clone();
        forged.generated_at_ms = 300;
        let other = SigningKey::from_seed([9; 32]);
        assert!(matches!(
            held.offer(Arc::new(other.sign_summary(forged.clone())), &trusted, 5),
            Err(OfferError::Unverified(_))
        ));
        let mut tampered = key.sign_summary(forged);
        tampered.summary.routable_total = 99;
        assert!(matches!(
            held.offer(Arc::new(tampered), &trusted, 6),
            Err(OfferError::Unverified(_))
        ));
        let h = held.get(&fx.region, &fx.key).expect("held");
        assert_eq!(h.signed.summary.generated_at_ms, 100);
        assert_eq!(h.received_at_ms, 1);
        let mut newer = s1;
        newer.generated_at_ms = 400;
        assert_eq!(
            held.offer(Arc::new(key.sign_summary(newer)), &trusted, 7),
            Ok(())
        );
        assert_eq!(held.retain(|_, _| false), 1);
        assert!(held.is_empty());
    }
}
