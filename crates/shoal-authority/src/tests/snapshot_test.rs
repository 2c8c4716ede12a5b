//! The state is a Raft snapshot: it round-trips through postcard and is checked on decode.

use shoal_proto::LifecycleState::*;
use shoal_proto::TransitionReason::*;
use shoal_proto::{FailoverMode, ServicePolicy};

use super::*;
use crate::StateError;

fn busy() -> Harness {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(h.register(1, "b-1")).unwrap();
    h.apply(h.transition(node(0), "a-1", 1, Ready, ReadinessPassed))
        .unwrap();
    h.apply(h.transition(node(2), "a-1", 1, Draining, DrainRequested))
        .unwrap_err();
    h.apply(AuthorityCommand::NodeDown {
        node: node_id(1),
        at_ms: 7,
    })
    .unwrap();
    h.apply(AuthorityCommand::LeaderTakeover {
        now_ms: 70,
        credit: None,
    })
    .unwrap();
    h.apply(AuthorityCommand::PutPolicy {
        caller: Caller::Operator,
        key: h.fx.key.clone(),
        policy: ServicePolicy {
            allowed_failover_regions: vec!["us-east".parse().unwrap()],
            mode: FailoverMode::Writable,
            max_cross_region_rps: None,
            max_snapshot_age_s: Some(60),
            on_stale: shoal_proto::StaleAction::Degrade,
            overprovisioning_factor_pct: None,
        },
    })
    .unwrap();
    h
}

#[test]
fn the_state_round_trips_through_postcard() {
    let h = busy();
    let bytes = h.state.encode();
    let back = AuthorityState::decode(&bytes).unwrap();
    assert_eq!(back, h.state);
    back.check_invariants().unwrap();
}

#[test]
fn a_restored_state_continues_exactly_where_the_original_would() {
    let mut a = busy();
    let mut b = busy();
    b.state = AuthorityState::decode(&a.state.encode()).unwrap();
    let cmd = a.transition(node(0), "a-1", 1, Draining, DrainRequested);
    assert_eq!(a.apply(cmd.clone()), b.apply(cmd));
    assert_eq!(a.state, b.state);
}

#[test]
fn truncated_snapshots_are_refused() {
    let bytes = busy().state.encode();
    for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
        assert!(matches!(
            AuthorityState::decode(&bytes[..cut]),
            Err(StateError::Decode(_))
        ));
    }
}

#[test]
fn raising_the_floor_puts_every_new_revision_and_generation_above_it() {
    let mut h = busy();
    let before = h.state.clone();
    h.state.raise_floor(0, "c0".into()).unwrap();
    assert_eq!(
        h.state.next_revision(),
        before.next_revision(),
        "a low floor keeps counters"
    );
    let floor = 1_000;
    h.state.raise_floor(floor, "c1".into()).unwrap();
    let once = h.state.clone();
    h.state.raise_floor(floor, "c1".into()).unwrap();
    assert_eq!(
        once, h.state,
        "raising twice with the same floor is a no-op"
    );
    assert_eq!(h.state.incarnation().unwrap().cluster_id, "c1");
    let back = AuthorityState::decode(&h.state.encode()).unwrap();
    assert_eq!(back, h.state);
    let drained = h
        .apply(h.transition(node(0), "a-1", 1, Draining, DrainRequested))
        .unwrap();
    assert_eq!(drained[0].record.revision.0, floor + 1);
    let again = h.apply(h.register(0, "a-1")).unwrap();
    assert!(
        again[0].record.generation.0 > floor,
        "{:?}",
        again[0].record
    );
    assert!(again[0].record.revision.0 > floor + 1);
    h.state.check_invariants().unwrap();
    assert!(h.state.raise_floor(u64::MAX - 1, "c2".into()).is_err());
}
