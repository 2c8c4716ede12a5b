//! Shared fixtures and helpers of the catalog event tests.

#![allow(unused_imports)]

pub use std::collections::BTreeSet;
pub use std::sync::Arc;

pub use shoal_catalog::testkit::Fixture;
pub use shoal_catalog::view::{self, AllAlive, EndpointState, Liveness};
pub use shoal_catalog::{
    Catalog, DeltaError, Gap, Keyring, MergeCounters, MergeOutcome, RegionHead,
};
pub use shoal_proto::{
    Generation, HealthSeq, HealthStatus, InstanceId, LifecycleState, NodeId, Region, Revision,
    ServiceKey, SignatureError, SignedHealth, SignedLifecycle, SigningKey,
};

pub use HealthStatus::{Failing, Passing};
pub use LifecycleState::{Draining, Expired, Ready, Starting};

pub fn life(
    fx: &Fixture,
    instance: &str,
    generation: u64,
    revision: u64,
    state: LifecycleState,
) -> Arc<SignedLifecycle> {
    Arc::new(fx.lifecycle(instance, generation, revision, state))
}

#[allow(clippy::too_many_arguments)]
pub fn health(
    fx: &Fixture,
    instance: &str,
    owner: usize,
    generation: u64,
    boot: u64,
    seq: u64,
    status: HealthStatus,
) -> Arc<SignedHealth> {
    Arc::new(fx.health(instance, owner, generation, boot, seq, status))
}

pub fn inst(s: &str) -> InstanceId {
    InstanceId::new(s).unwrap()
}

/// Applies records that must all be `Applied`.
pub fn seed(c: &mut Catalog, fx: &Fixture, records: &[Arc<SignedLifecycle>]) {
    for r in records {
        assert_eq!(
            c.apply_lifecycle(r.clone(), &fx.keyring),
            MergeOutcome::Applied
        );
    }
}

pub fn held_life(c: &Catalog, fx: &Fixture, instance: &str) -> SignedLifecycle {
    c.entry(&fx.key, &inst(instance))
        .expect("entry held")
        .lifecycle()
        .clone()
}

/// A liveness input with explicit down nodes and ejected instances.
#[derive(Default)]
pub struct Net {
    pub down: BTreeSet<NodeId>,
    pub ejected: BTreeSet<(InstanceId, Generation)>,
}

impl Liveness for Net {
    fn is_down(&self, node: &NodeId) -> bool {
        self.down.contains(node)
    }
    fn is_ejected(&self, instance: &InstanceId, generation: Generation) -> bool {
        self.ejected.contains(&(instance.clone(), generation))
    }
}

pub fn routable_ids(c: &Catalog, fx: &Fixture, live: &dyn Liveness) -> Vec<String> {
    c.routable(&fx.key, live)
        .map(|e| e.lifecycle().record.instance.to_string())
        .collect()
}
