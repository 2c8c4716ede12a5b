//! Record generation shared by `benches/catalog.rs` and `examples/memory.rs`.
//!
//! A region-sized catalog: `n` READY instances spread over 2,000 services and 1,667 owner
//! nodes (the REQUIREMENTS budgets), each a lifecycle record with four labels, signed by the
//! fixture's region authority. Signing is the slow part (~20 µs per record), so callers
//! generate once per process.

use std::sync::Arc;

use shoal_catalog::testkit::Fixture;
use shoal_proto::{
    Generation, InstanceId, LifecycleRecord, LifecycleState, NodeId, Revision, ServiceKey,
    SignedLifecycle, TransitionReason, TransitionSource,
};

/// Services in the whole system (REQUIREMENTS).
pub const SERVICES: usize = 2_000;
/// Agents (owner nodes) in one region.
pub const NODES_PER_REGION: usize = 1_667;

/// `n` signed READY lifecycle records with revisions `1..=n` (gap-free).
pub fn region_records(fx: &Fixture, n: usize) -> Vec<Arc<SignedLifecycle>> {
    (0..n)
        .map(|i| {
            let service = i % SERVICES;
            let key = ServiceKey::new("prod", &format!("svc-{service}"), "http").expect("valid");
            let record = LifecycleRecord {
                key,
                instance: InstanceId::new(format!("svc-{service}-{i:06}-7f9c")).expect("valid"),
                generation: Generation(i as u64 + 1),
                region: fx.region.clone(),
                revision: Revision(i as u64 + 1),
                owner: NodeId::new(format!("node-{:04}", i % NODES_PER_REGION)).expect("valid"),
                owner_key: Some(fx.nodes[i % fx.nodes.len()].1.verifying_key().to_bytes()),
                endpoint: Fixture::spec(i as u32),
                state: LifecycleState::Ready,
                reason: TransitionReason::ReadinessPassed,
                source: TransitionSource::Orchestrator,
                lease_ms: 300_000,
                committed_at_ms: 1_700_000_000_000 + i as u64,
            };
            Arc::new(fx.authority.sign_lifecycle(record))
        })
        .collect()
}
