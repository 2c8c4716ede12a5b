//! Deterministic fixtures for tests, benches and doctests: a region authority key, node keys,
//! and builders for signed records. Not for production use (keys come from fixed seeds).

use std::net::{Ipv4Addr, SocketAddr};

use shoal_proto::{
    EndpointSpec, Generation, HealthRecord, HealthSeq, HealthStatus, InstanceId, LabelDimension,
    Labels, LifecycleRecord, LifecycleState, NodeId, NodeKey, Region, Revision, ServiceKey,
    SignedHealth, SignedLifecycle, SigningKey, TransitionReason, TransitionSource, Version, Zone,
};

use crate::verify::Keyring;

/// A region `test` with one authority key and nodes `node-0..node-7`, each with a key.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// The region.
    pub region: Region,
    /// The authority key.
    pub authority: SigningKey,
    /// Node keys, `node-i` at index `i`.
    pub nodes: Vec<(NodeId, SigningKey)>,
    /// A keyring trusting the authority key (node keys come with the lifecycle records).
    pub keyring: Keyring,
    /// The service key records are built for: `prod/api/http`.
    pub key: ServiceKey,
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixture {
    /// Builds the fixture from fixed seeds.
    pub fn new() -> Self {
        let region = Region::new("test").expect("valid");
        let authority = SigningKey::from_seed([7; 32]);
        let mut keyring = Keyring::new();
        keyring.trust_authority(region.clone(), authority.verifying_key());
        let nodes: Vec<_> = (0..8u8)
            .map(|i| {
                let id = NodeId::new(format!("node-{i}")).expect("valid");
                let key = SigningKey::from_seed([100 + i; 32]);
                (id, key)
            })
            .collect();
        Self {
            region,
            authority,
            nodes,
            keyring,
            key: "prod/api/http".parse().expect("valid"),
        }
    }

    /// An endpoint spec with four labels, address derived from `n`.
    pub fn spec(n: u32) -> EndpointSpec {
        let ip = Ipv4Addr::from(0x0a00_0000 | (n & 0x00ff_ffff));
        EndpointSpec {
            address: SocketAddr::new(ip.into(), 8080),
            zone: Zone::new(format!("zone-{}", n % 3)).expect("valid"),
            version: Version::new("1.4.2").expect("valid"),
            weight: 100,
            labels: Labels::new(vec![
                (LabelDimension::Protocol, "http2".into()),
                (LabelDimension::Tier, "critical".into()),
                (LabelDimension::Track, "stable".into()),
                (LabelDimension::Arch, "arm64".into()),
            ])
            .expect("valid"),
        }
    }

    /// A signed lifecycle record of `prod/api/http` for `instance`, owned by `node-0`.
    pub fn lifecycle(
        &self,
        instance: &str,
        generation: u64,
        revision: u64,
        state: LifecycleState,
    ) -> SignedLifecycle {
        self.lifecycle_for(&self.key, instance, 0, generation, revision, state)
    }

    /// A signed lifecycle record with every knob; it binds `node-owner`'s fixture key.
    pub fn lifecycle_for(
        &self,
        key: &ServiceKey,
        instance: &str,
        owner: usize,
        generation: u64,
        revision: u64,
        state: LifecycleState,
    ) -> SignedLifecycle {
        let reason = match state {
            LifecycleState::Starting => TransitionReason::Registered,
            LifecycleState::Ready => TransitionReason::ReadinessPassed,
            LifecycleState::Draining => TransitionReason::DrainRequested,
            LifecycleState::Expired => TransitionReason::Deregistered,
        };
        let owner_key = Some(self.nodes[owner].1.verifying_key().to_bytes());
        self.lifecycle_bound(
            key, instance, owner, generation, revision, state, reason, owner_key,
        )
    }

    /// A signed lifecycle record binding `owner_key` (any key, or none) for `node-owner`,
    /// with an explicit reason: for key replacement and revocation tests.
    #[allow(clippy::too_many_arguments)]
    pub fn lifecycle_bound(
        &self,
        key: &ServiceKey,
        instance: &str,
        owner: usize,
        generation: u64,
        revision: u64,
        state: LifecycleState,
        reason: TransitionReason,
        owner_key: Option<NodeKey>,
    ) -> SignedLifecycle {
        self.authority.sign_lifecycle(LifecycleRecord {
            key: key.clone(),
            instance: InstanceId::new(instance).expect("valid"),
            generation: Generation(generation),
            region: self.region.clone(),
            revision: Revision(revision),
            owner: self.nodes[owner].0.clone(),
            owner_key,
            endpoint: Self::spec(generation as u32 * 7 + instance.len() as u32),
            state,
            reason,
            source: TransitionSource::Authority,
            lease_ms: 300_000,
            committed_at_ms: 1_700_000_000_000 + revision,
        })
    }

    /// A health record for `prod/api/http` of `node-owner` signed with `signer` (any key).
    #[allow(clippy::too_many_arguments)]
    pub fn health_signed_by(
        &self,
        signer: &SigningKey,
        instance: &str,
        owner: usize,
        generation: u64,
        boot: u64,
        seq: u64,
        status: HealthStatus,
    ) -> SignedHealth {
        let mut h = self.health(instance, owner, generation, boot, seq, status);
        h = signer.sign_health(h.record);
        h
    }

    /// A health record for `prod/api/http` signed by `node-owner`.
    pub fn health(
        &self,
        instance: &str,
        owner: usize,
        generation: u64,
        boot: u64,
        seq: u64,
        status: HealthStatus,
    ) -> SignedHealth {
        let reason = match status {
            HealthStatus::Passing => TransitionReason::ReadinessRecovered,
            HealthStatus::Failing => TransitionReason::ReadinessFailed,
        };
        self.nodes[owner].1.sign_health(HealthRecord {
            key: self.key.clone(),
            instance: InstanceId::new(instance).expect("valid"),
            generation: Generation(generation),
            owner: self.nodes[owner].0.clone(),
            owner_boot: Generation(boot),
            seq: HealthSeq(seq),
            status,
            reason,
        })
    }
}
