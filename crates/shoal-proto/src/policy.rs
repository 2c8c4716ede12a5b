//! Per-service cross-region policy documents, as stored and signed by a region authority.
//!
//! A policy says whether, and where, callers of a service may fail over to another region, and
//! with which limits. The authority stores one document per [`ServiceKey`] and signs it (see
//! [`crate::sign::SignedPolicy`]) so agents can verify it offline, like lifecycle records.
//!
//! Policy documents carry their **own** per-region revision counter ([`PolicyRecord::revision`]),
//! separate from the lifecycle revision chain: agents detect gaps in lifecycle revisions, and a
//! policy write must never look like a missing lifecycle record.

use serde::{Deserialize, Serialize};

use crate::ids::{Region, Revision, ServiceKey};

/// Most failover regions one policy may list (there are 3 regions today; room to grow).
pub const MAX_FAILOVER_REGIONS: usize = 16;

/// What cross-region callers may do against the failover target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FailoverMode {
    /// Only reads may be sent to another region (e.g. a single-writer database behind it).
    ReadOnly,
    /// Reads and writes may be sent to another region.
    Writable,
}

/// One service's cross-region policy. Failover happens only by explicit policy: the default
/// (no document, or an empty region list) is "never leave the local region".
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ServicePolicy {
    /// Regions callers may fail over to, in order of preference (first = most preferred). At
    /// most [`MAX_FAILOVER_REGIONS`], no duplicates. A shared document may list the region
    /// that stores it; callers in that region skip it.
    pub allowed_failover_regions: Vec<Region>,
    /// Read-only or writable failover.
    pub mode: FailoverMode,
    /// Cap on requests per second this region's callers send cross-region (`None`: no cap).
    pub max_cross_region_rps: Option<u32>,
    /// Past this snapshot age in seconds, agents may degrade or refuse answers for the service
    /// (`None`: serve the last-known set however old it is; fail-open).
    pub max_snapshot_age_s: Option<u32>,
}

/// Why a policy document was refused. Nothing is stored or signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum PolicyError {
    /// More than [`MAX_FAILOVER_REGIONS`] regions.
    #[error("at most {MAX_FAILOVER_REGIONS} failover regions are allowed, got {count}")]
    TooManyRegions {
        /// How many were offered.
        count: usize,
    },
    /// A region appears twice in the ordered list (its position would be ambiguous).
    #[error("failover region {0} appears more than once")]
    DuplicateRegion(Region),
}

impl ServicePolicy {
    /// Checks the bounds types cannot express.
    ///
    /// # Errors
    /// [`PolicyError::TooManyRegions`] or [`PolicyError::DuplicateRegion`].
    pub fn validate(&self) -> Result<(), PolicyError> {
        let regions = &self.allowed_failover_regions;
        if regions.len() > MAX_FAILOVER_REGIONS {
            return Err(PolicyError::TooManyRegions {
                count: regions.len(),
            });
        }
        for (i, r) in regions.iter().enumerate() {
            if regions[..i].contains(r) {
                return Err(PolicyError::DuplicateRegion(r.clone()));
            }
        }
        Ok(())
    }
}

/// A policy document as committed by a region authority: what [`crate::sign::SignedPolicy`]
/// signs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PolicyRecord {
    /// The service the policy applies to.
    pub key: ServiceKey,
    /// Region whose authority stored and signed it.
    pub region: Region,
    /// Per-region policy revision (gap-free over all services' policy writes, starting at 1;
    /// independent of the lifecycle revision). A higher revision replaces a lower one.
    pub revision: Revision,
    /// The document.
    pub policy: ServicePolicy,
    /// Authority wall-clock commit time in Unix milliseconds; informational only.
    pub committed_at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(s: &str) -> Region {
        Region::new(s).unwrap()
    }

    #[test]
    fn duplicates_and_overlong_lists_are_refused() {
        let mut p = ServicePolicy {
            allowed_failover_regions: vec![region("eu"), region("us"), region("eu")],
            mode: FailoverMode::ReadOnly,
            max_cross_region_rps: None,
            max_snapshot_age_s: Some(600),
        };
        assert_eq!(
            p.validate(),
            Err(PolicyError::DuplicateRegion(region("eu")))
        );
        p.allowed_failover_regions = (0..17).map(|i| region(&format!("r{i}"))).collect();
        assert_eq!(p.validate(), Err(PolicyError::TooManyRegions { count: 17 }));
        p.allowed_failover_regions.truncate(16);
        assert_eq!(p.validate(), Ok(()));
    }
}
