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
use crate::sign::{KeyId, SignatureBytes, TrustedKeys, VerifyingKey};

/// Most failover regions one policy may list (there are 3 regions today; room to grow).
pub const MAX_FAILOVER_REGIONS: usize = 16;

/// Smallest [`ServicePolicy::overprovisioning_factor_pct`]: 100 (no overprovisioning: any
/// unhealthy share of the region spills). Below 100 a fully healthy region would spill, which
/// is not failover.
pub const MIN_OVERPROVISIONING_FACTOR_PCT: u32 = 100;
/// Largest [`ServicePolicy::overprovisioning_factor_pct`]: 10 000 (100x: spill only once
/// fewer than 1 % of the region's registered endpoints are routable).
pub const MAX_OVERPROVISIONING_FACTOR_PCT: u32 = 10_000;
/// Envoy's default overprovisioning factor, percent (what `shoal policy sign` suggests).
pub const ENVOY_DEFAULT_OVERPROVISIONING_FACTOR_PCT: u32 = 140;

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
    /// (`None`: serve the last-known set however old it is; fail-open). For a failover answer
    /// the age is that of the remote region's summary (see [`crate::summary`]).
    pub max_snapshot_age_s: Option<u32>,
    /// What an agent does with a failover answer older than `max_snapshot_age_s`.
    pub on_stale: StaleAction,
    /// Threshold failover (Envoy's priority levels with an overprovisioning factor, in percent;
    /// Envoy's default is 140:
    /// <https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/upstream/load_balancing/priority>).
    /// `None`: all-or-nothing, the region fails over only when it has no routable endpoint
    /// (Consul's prepared-query failover). `Some(f)`: a pick stays in the caller's region with
    /// probability `min(100, f * routable / registered) %` (integer percent, as Envoy's
    /// priority load; `registered` counts the region's non-expired endpoints of the service)
    /// and otherwise spills to the failover tier (the policy's regions in order); a spill the
    /// failover tier refuses is answered locally. Range
    /// [`MIN_OVERPROVISIONING_FACTOR_PCT`]..=[`MAX_OVERPROVISIONING_FACTOR_PCT`].
    pub overprovisioning_factor_pct: Option<u32>,
}

/// What to do with an answer older than [`ServicePolicy::max_snapshot_age_s`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StaleAction {
    /// Serve it, marked `degraded` (fail-open: the usual choice for internal services).
    Degrade,
    /// Do not serve it: skip that region (fail-closed).
    Refuse,
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
    /// `overprovisioning_factor_pct` outside
    /// [`MIN_OVERPROVISIONING_FACTOR_PCT`]..=[`MAX_OVERPROVISIONING_FACTOR_PCT`].
    #[error(
        "overprovisioning_factor_pct must be {MIN_OVERPROVISIONING_FACTOR_PCT}..={MAX_OVERPROVISIONING_FACTOR_PCT} \
         (percent; Envoy's default is {ENVOY_DEFAULT_OVERPROVISIONING_FACTOR_PCT}), got {0}"
    )]
    OverprovisioningFactor(u32),
}

impl ServicePolicy {
    /// Checks the bounds types cannot express.
    ///
    /// # Errors
    /// [`PolicyError::TooManyRegions`], [`PolicyError::DuplicateRegion`] or
    /// [`PolicyError::OverprovisioningFactor`].
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
        if let Some(f) = self.overprovisioning_factor_pct {
            if !(MIN_OVERPROVISIONING_FACTOR_PCT..=MAX_OVERPROVISIONING_FACTOR_PCT).contains(&f) {
                return Err(PolicyError::OverprovisioningFactor(f));
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

/// Most regions a [`GlobalPolicy`] names (with their authority keys).
pub const MAX_REGIONS: usize = 16;
/// Most authority keys one region may have in a [`GlobalPolicy`] (two during a rotation).
pub const MAX_REGION_KEYS: usize = 4;
/// Most services a [`GlobalPolicy`] holds (2,000 services, a few ports each, with room).
pub const MAX_GLOBAL_SERVICES: usize = 8_192;

/// The **global policy**: written once by an operator, signed with the global policy key
/// (`shoal policy sign`), delivered to every region's authority and agents, verified offline
/// by each of them against the policy key they hold as a root (docs/adr/0013-global-policy-and-failover.md).
///
/// It carries what every region must agree on and nothing else: the per-service failover
/// policies, and the directory of regions with their authority keys, which is how an agent
/// of region L can verify a summary signed by region R's authority without any per-region
/// configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GlobalPolicy {
    /// Operator-chosen version; a document replaces another only with a higher version.
    pub version: u64,
    /// Wall-clock Unix ms when it was signed; informational only.
    pub issued_at_ms: u64,
    /// Regions and their authority keys, sorted by region, unique, at most [`MAX_REGIONS`].
    pub regions: Vec<RegionKeys>,
    /// Service policies, sorted by key, unique, at most [`MAX_GLOBAL_SERVICES`]. A service
    /// that is not listed never leaves its region.
    pub services: Vec<GlobalServicePolicy>,
}

/// One region's authority signing keys (public, 32 bytes each).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RegionKeys {
    /// The region.
    pub region: Region,
    /// Its authority keys, 1 to [`MAX_REGION_KEYS`].
    pub authority_keys: Vec<[u8; 32]>,
}

/// One service's entry in a [`GlobalPolicy`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GlobalServicePolicy {
    /// The service.
    pub key: ServiceKey,
    /// Its policy.
    pub policy: ServicePolicy,
}

/// A [`GlobalPolicy`] with the global policy key's signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SignedGlobalPolicy {
    /// The document.
    pub policy: GlobalPolicy,
    /// Which policy key signed it.
    pub signer: KeyId,
    /// Signature over `"shoal/global-policy/v1\0" || postcard(policy)`.
    pub signature: SignatureBytes,
}

/// Why a global policy document was refused. Nothing is stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobalPolicyError {
    /// A list is over its bound.
    #[error("{what}: at most {max}, got {count}")]
    TooMany {
        /// Which list.
        what: &'static str,
        /// Its bound.
        max: usize,
        /// How many were offered.
        count: usize,
    },
    /// Regions or services are not sorted and unique.
    #[error("{0} must be sorted and unique")]
    NotSorted(&'static str),
    /// A region has no key, or a key is not a valid ed25519 point.
    #[error("region {0}: authority keys missing or invalid")]
    BadRegionKey(Region),
    /// A service policy is invalid.
    #[error("service {key}: {error}")]
    Service {
        /// The service.
        key: ServiceKey,
        /// Why.
        error: PolicyError,
    },
}

impl GlobalPolicy {
    /// Checks bounds, order and every service policy.
    ///
    /// # Errors
    /// The first [`GlobalPolicyError`] found.
    pub fn validate(&self) -> Result<(), GlobalPolicyError> {
        let too_many = |what, max, count| GlobalPolicyError::TooMany { what, max, count };
        if self.regions.len() > MAX_REGIONS {
            return Err(too_many("regions", MAX_REGIONS, self.regions.len()));
        }
        if self.services.len() > MAX_GLOBAL_SERVICES {
            return Err(too_many(
                "services",
                MAX_GLOBAL_SERVICES,
                self.services.len(),
            ));
        }
        if !self.regions.windows(2).all(|w| w[0].region < w[1].region) {
            return Err(GlobalPolicyError::NotSorted("regions"));
        }
        if !self.services.windows(2).all(|w| w[0].key < w[1].key) {
            return Err(GlobalPolicyError::NotSorted("services"));
        }
        for r in &self.regions {
            let bad = r.authority_keys.is_empty()
                || r.authority_keys.len() > MAX_REGION_KEYS
                || r.authority_keys
                    .iter()
                    .any(|k| VerifyingKey::from_bytes(*k).is_err());
            if bad {
                return Err(GlobalPolicyError::BadRegionKey(r.region.clone()));
            }
        }
        for s in &self.services {
            s.policy
                .validate()
                .map_err(|error| GlobalPolicyError::Service {
                    key: s.key.clone(),
                    error,
                })?;
        }
        Ok(())
    }

    /// The policy of `key`, if the document lists it.
    pub fn service(&self, key: &ServiceKey) -> Option<&ServicePolicy> {
        self.services
            .binary_search_by(|s| s.key.cmp(key))
            .ok()
            .map(|i| &self.services[i].policy)
    }

    /// The authority keys of `region` (empty when the region is not listed).
    pub fn region_keys(&self, region: &Region) -> TrustedKeys {
        let mut keys = TrustedKeys::new();
        if let Some(r) = self.regions.iter().find(|r| &r.region == region) {
            for k in &r.authority_keys {
                if let Ok(v) = VerifyingKey::from_bytes(*k) {
                    keys.insert(v);
                }
            }
        }
        keys
    }

    /// Services whose policy lets callers of `from` fail over to `to` (`from != to`), in key
    /// order: what region `from`'s authority asks region `to` to summarise.
    pub fn failover_services<'a>(
        &'a self,
        from: &'a Region,
        to: &'a Region,
    ) -> impl Iterator<Item = &'a ServiceKey> + 'a {
        self.services
            .iter()
            .filter(move |s| from != to && s.policy.allowed_failover_regions.contains(to))
            .map(|s| &s.key)
    }
}

impl SignedGlobalPolicy {
    /// Verifies the signature against `policy_keys` and validates the document.
    ///
    /// # Errors
    /// A message naming the failed check (unknown signer, bad signature, invalid document).
    pub fn verify(&self, policy_keys: &TrustedKeys) -> Result<(), String> {
        let key = policy_keys
            .get(self.signer)
            .ok_or_else(|| format!("global policy signed by an untrusted key {:?}", self.signer))?;
        key.verify_global_policy(self)
            .map_err(|e| format!("global policy signature: {e}"))?;
        self.policy
            .validate()
            .map_err(|e| format!("global policy invalid: {e}"))
    }
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
            on_stale: StaleAction::Degrade,
            overprovisioning_factor_pct: None,
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

    #[test]
    fn the_overprovisioning_factor_is_range_checked() {
        let mut p = ServicePolicy {
            allowed_failover_regions: vec![region("eu")],
            mode: FailoverMode::ReadOnly,
            max_cross_region_rps: None,
            max_snapshot_age_s: None,
            on_stale: StaleAction::Degrade,
            overprovisioning_factor_pct: Some(99),
        };
        assert_eq!(p.validate(), Err(PolicyError::OverprovisioningFactor(99)));
        let msg = p.validate().unwrap_err().to_string();
        assert!(
            msg.contains("100..=10000") && msg.contains("got 99"),
            "{msg}"
        );
        p.overprovisioning_factor_pct = Some(10_001);
        assert_eq!(
            p.validate(),
            Err(PolicyError::OverprovisioningFactor(10_001))
        );
        for ok in [100, ENVOY_DEFAULT_OVERPROVISIONING_FACTOR_PCT, 10_000] {
            p.overprovisioning_factor_pct = Some(ok);
            assert_eq!(p.validate(), Ok(()), "{ok}");
        }
    }
}

#[cfg(test)]
mod global_tests {
    use super::*;
    use crate::sign::SigningKey;

    fn region(s: &str) -> Region {
        Region::new(s).unwrap()
    }

    fn doc() -> GlobalPolicy {
        GlobalPolicy {
            version: 1,
            issued_at_ms: 0,
            regions: vec![
                RegionKeys {
                    region: region("r1"),
                    authority_keys: vec![SigningKey::from_seed([1; 32]).verifying_key().to_bytes()],
                },
                RegionKeys {
                    region: region("r2"),
                    authority_keys: vec![SigningKey::from_seed([2; 32]).verifying_key().to_bytes()],
                },
            ],
            services: vec![GlobalServicePolicy {
                key: "prod/web/http".parse().unwrap(),
                policy: ServicePolicy {
                    allowed_failover_regions: vec![region("r2"), region("r1")],
                    mode: FailoverMode::Writable,
                    max_cross_region_rps: None,
                    max_snapshot_age_s: None,
                    on_stale: StaleAction::Degrade,
                    overprovisioning_factor_pct: Some(140),
                },
            }],
        }
    }

    #[test]
    fn a_signed_document_verifies_only_against_its_key_and_unchanged() {
        let k = SigningKey::from_seed([9; 32]);
        let mut trusted = TrustedKeys::new();
        trusted.insert(k.verifying_key());
        let signed = k.sign_global_policy(doc());
        assert_eq!(signed.verify(&trusted), Ok(()));
        let mut other = TrustedKeys::new();
        other.insert(SigningKey::from_seed([8; 32]).verifying_key());
        assert!(signed.verify(&other).unwrap_err().contains("untrusted"));
        let mut tampered = signed.clone();
        tampered.policy.version = 2;
        assert!(tampered.verify(&trusted).unwrap_err().contains("signature"));
    }

    #[test]
    fn lookups_and_failover_targets() {
        let d = doc();
        assert_eq!(d.validate(), Ok(()));
        let key: ServiceKey = "prod/web/http".parse().unwrap();
        assert!(d.service(&key).is_some());
        assert!(d.service(&"prod/other/http".parse().unwrap()).is_none());
        assert_eq!(d.region_keys(&region("r2")).len(), 1);
        assert!(d.region_keys(&region("r9")).is_empty());
        let (r1, r2) = (region("r1"), region("r2"));
        assert_eq!(d.failover_services(&r1, &r2).count(), 1);
        assert_eq!(d.failover_services(&r2, &r2).count(), 0, "never to oneself");
        let mut unsorted = d.clone();
        unsorted.regions.reverse();
        assert_eq!(
            unsorted.validate(),
            Err(GlobalPolicyError::NotSorted("regions"))
        );
    }

    /// The encoding before `overprovisioning_factor_pct` existed (postcard is not
    /// self-describing: the field is not optional on the wire).
    mod old {
        use super::*;
        #[derive(Serialize)]
        pub struct ServicePolicy {
            pub allowed_failover_regions: Vec<Region>,
            pub mode: FailoverMode,
            pub max_cross_region_rps: Option<u32>,
            pub max_snapshot_age_s: Option<u32>,
            pub on_stale: StaleAction,
        }
        #[derive(Serialize)]
        pub struct GlobalServicePolicy {
            pub key: ServiceKey,
            pub policy: ServicePolicy,
        }
        #[derive(Serialize)]
        pub struct GlobalPolicy {
            pub version: u64,
            pub issued_at_ms: u64,
            pub regions: Vec<RegionKeys>,
            pub services: Vec<GlobalServicePolicy>,
        }
        #[derive(Serialize)]
        pub struct SignedGlobalPolicy {
            pub policy: GlobalPolicy,
            pub signer: KeyId,
            pub signature: SignatureBytes,
        }
    }

    #[test]
    fn a_document_signed_before_the_factor_existed_is_refused() {
        let k = SigningKey::from_seed([9; 32]);
        let mut trusted = TrustedKeys::new();
        trusted.insert(k.verifying_key());
        let new = k.sign_global_policy(doc());
        let s = &new.policy.services[0];
        let old = old::SignedGlobalPolicy {
            policy: old::GlobalPolicy {
                version: 1,
                issued_at_ms: 0,
                regions: new.policy.regions.clone(),
                services: vec![old::GlobalServicePolicy {
                    key: s.key.clone(),
                    policy: old::ServicePolicy {
                        allowed_failover_regions: s.policy.allowed_failover_regions.clone(),
                        mode: s.policy.mode,
                        max_cross_region_rps: s.policy.max_cross_region_rps,
                        max_snapshot_age_s: s.policy.max_snapshot_age_s,
                        on_stale: s.policy.on_stale,
                    },
                }],
            },
            signer: new.signer,
            signature: new.signature,
        };
        let bytes = postcard::to_allocvec(&old).unwrap();
        // Either it does not decode, or what it decodes to does not verify: never taken.
        match postcard::from_bytes::<SignedGlobalPolicy>(&bytes) {
            Err(_) => {}
            Ok(p) => assert!(p.verify(&trusted).is_err()),
        }
        assert!(
            postcard::from_bytes::<SignedGlobalPolicy>(&bytes).is_err(),
            "this old document does not even decode"
        );
        let round = postcard::to_allocvec(&new).unwrap();
        let back: SignedGlobalPolicy = postcard::from_bytes(&round).unwrap();
        assert_eq!(back.verify(&trusted), Ok(()));
        assert_eq!(
            back.policy.services[0].policy.overprovisioning_factor_pct,
            Some(140)
        );
    }
}
