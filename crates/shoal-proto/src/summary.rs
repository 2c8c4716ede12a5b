//! Remote endpoint summaries: what one region tells the others about a service's routable
//! endpoints, for cross-region failover (docs/adr/0013-global-policy-and-failover.md).
//!
//! Region R's authority builds a [`RegionSummary`] from the catalog its embedded mesh member
//! holds (READY, health passing, owner not down in R's SWIM view), signs it with R's region
//! key, and hands it to the authorities of regions whose callers may fail over to R. Those
//! keep it **beside** their own catalog, never merged into it, with its age, and pass it on to
//! their agents, which verify it against R's keys from the [`crate::policy::GlobalPolicy`].

use serde::{Deserialize, Serialize};

use crate::ids::{Generation, InstanceId, NodeId, Region, Revision, ServiceKey};
use crate::record::EndpointSpec;
use crate::sign::{KeyId, SignatureBytes};

/// Most endpoints one summary carries (the lowest instance ids win; `routable_total` says
/// how many there were). A failover target needs candidates, not the whole fleet: 64 x ~120 B
/// keeps a summary under 8 KB.
pub const MAX_SUMMARY_ENDPOINTS: usize = 64;
/// Most summaries one reply carries (bounded well below the 4 MiB stream message limit).
pub const MAX_SUMMARIES_PER_REPLY: usize = 256;

/// One routable endpoint of a remote region.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SummaryEndpoint {
    /// Instance id.
    pub instance: InstanceId,
    /// Boot generation.
    pub generation: Generation,
    /// Owner node (in the remote region).
    pub node: NodeId,
    /// Address and metadata.
    pub endpoint: EndpointSpec,
}

/// The routable endpoints of one service in one region, as that region's authority saw them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RegionSummary {
    /// The region described (whose authority signs it).
    pub region: Region,
    /// The service.
    pub key: ServiceKey,
    /// The region's contiguous lifecycle revision head in the summarising member's catalog:
    /// with `generated_at_ms` the order of summaries (higher wins).
    pub revision: Revision,
    /// Wall-clock Unix ms when it was built (the age callers see is measured from it).
    pub generated_at_ms: u64,
    /// How many routable endpoints the region had (may exceed `endpoints.len()`).
    pub routable_total: u32,
    /// Up to [`MAX_SUMMARY_ENDPOINTS`] routable endpoints, in instance id order.
    pub endpoints: Vec<SummaryEndpoint>,
}

impl RegionSummary {
    /// The order of two summaries of one (region, service): `(revision, generated_at_ms)`.
    pub fn order(&self) -> (Revision, u64) {
        (self.revision, self.generated_at_ms)
    }
}

/// A [`RegionSummary`] with its region authority's signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SignedSummary {
    /// The summary.
    pub summary: RegionSummary,
    /// Which authority key signed it.
    pub signer: KeyId,
    /// Signature over `"shoal/summary/v1\0" || postcard(summary)`.
    pub signature: SignatureBytes,
}

impl SignedSummary {
    /// Verifies the signature against `region_keys` (the summarised region's authority keys,
    /// from the global policy) and the bound on endpoints.
    ///
    /// # Errors
    /// A message naming the failed check.
    pub fn verify(&self, region_keys: &crate::sign::TrustedKeys) -> Result<(), String> {
        let key = region_keys.get(self.signer).ok_or_else(|| {
            format!(
                "summary of {} signed by a key not listed for region {}",
                self.summary.key, self.summary.region
            )
        })?;
        key.verify_summary(self)
            .map_err(|e| format!("summary signature: {e}"))?;
        if self.summary.endpoints.len() > MAX_SUMMARY_ENDPOINTS {
            return Err(format!(
                "summary carries {} endpoints (at most {MAX_SUMMARY_ENDPOINTS})",
                self.summary.endpoints.len()
            ));
        }
        Ok(())
    }
}
