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
}

impl OfferError {
    /// Short label for metrics.
    pub fn as_label(&self) -> &'static str {
        match self {
            Self::OwnRegion(_) => "own_region",
            Self::Unverified(_) => "unverified",
            Self::NotNewer => "not_newer",
            Self::Full => "full",
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
        signed.verify(region_keys).map_err(OfferError::Unverified)?;
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
