//! `Register`: admission, binding, generations.

use shoal_catalog::testkit::Fixture;
use shoal_proto::LifecycleState::*;
use shoal_proto::TransitionReason::*;
use shoal_proto::{Generation, Revision, TransitionSource};

use super::*;
use crate::{InvalidRequest, MAX_LEASE_MS, MIN_LEASE_MS};

#[test]
fn happy_path_register_ready_drain_deregister_has_revisions_1_to_4() {
    let mut h = Harness::new();
    let base = h.record("a-1", 0, 1);
    let src = TransitionSource::OwnerAgent;

    let out = h.apply(h.register(0, "a-1")).unwrap();
    assert_eq!(out, vec![h.signed(&base, Starting, Registered, src, 1, 1)]);

    let out = h
        .apply(h.transition(node(0), "a-1", 1, Ready, ReadinessPassed))
        .unwrap();
    assert_eq!(
        out,
        vec![h.signed(&base, Ready, ReadinessPassed, src, 2, 2)]
    );

    let out = h
        .apply(h.transition(node(0), "a-1", 1, Draining, DrainRequested))
        .unwrap();
    assert_eq!(
        out,
        vec![h.signed(&base, Draining, DrainRequested, src, 3, 3)]
    );

    let out = h
        .apply(h.transition(node(0), "a-1", 1, Expired, Deregistered))
        .unwrap();
    assert_eq!(out, vec![h.signed(&base, Expired, Deregistered, src, 4, 4)]);

    assert_eq!(h.state.head_revision(), Revision(4));
    let b = h.state.binding(&h.fx.key, &inst("a-1")).unwrap();
    assert_eq!(
        (b.state(), b.generation(), b.node()),
        (Expired, Generation(1), &node_id(0))
    );
    assert_eq!(b.current(), &out[0]);
}

#[test]
fn undrain_returns_to_ready() {
    let mut h = Harness::new();
    let base = h.record("a-1", 0, 1);
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(h.transition(node(0), "a-1", 1, Ready, ReadinessPassed))
        .unwrap();
    h.apply(h.transition(node(0), "a-1", 1, Draining, DrainRequested))
        .unwrap();
    let out = h
        .apply(h.transition(node(0), "a-1", 1, Ready, DrainCancelled))
        .unwrap();
    let src = TransitionSource::OwnerAgent;
    assert_eq!(out, vec![h.signed(&base, Ready, DrainCancelled, src, 4, 4)]);
}

#[test]
fn re_register_is_a_new_generation_that_supersedes_the_old() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(h.transition(node(0), "a-1", 1, Ready, ReadinessPassed))
        .unwrap();

    // The process restarted: the agent registers the same instance id again at log index 3.
    let out = h.apply(h.register(0, "a-1")).unwrap();
    let base = h.record("a-1", 0, 3);
    let src = TransitionSource::OwnerAgent;
    assert_eq!(out, vec![h.signed(&base, Starting, Registered, src, 3, 3)]);
    assert!(out[0].record.order() > (Generation(1), Revision(2)));
    let b = h.state.binding(&h.fx.key, &inst("a-1")).unwrap();
    assert_eq!((b.generation(), b.state()), (Generation(3), Starting));
}

#[test]
fn a_node_cannot_register_on_another_node() {
    let mut h = Harness::new();
    let AuthorityCommand::Register {
        key,
        instance,
        endpoint,
        lease_ms,
        ..
    } = h.register(0, "a-1")
    else {
        unreachable!()
    };
    let cmd = AuthorityCommand::Register {
        caller: node(0),
        key,
        instance,
        on_node: Some(node_id(1)),
        endpoint,
        lease_ms,
    };
    assert_eq!(h.refused(cmd), Refusal::NotAllowed);
}

#[test]
fn a_node_cannot_take_over_an_instance_live_on_another_node() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    assert_eq!(
        h.refused(h.register(1, "a-1")),
        Refusal::NotOwner {
            bound_to: node_id(0)
        }
    );
    // Once expired, the id is free: another node may register it as a new generation.
    h.apply(h.transition(node(0), "a-1", 1, Expired, Deregistered))
        .unwrap();
    let out = h.apply(h.register(1, "a-1")).unwrap();
    assert_eq!(out[0].record.owner, node_id(1));
    assert_eq!(out[0].record.generation, Generation(4));
}

#[test]
fn an_orchestrator_registers_on_a_named_node_inside_its_scope_only() {
    let mut h = Harness::new();
    let cmd = |caller: Caller, on_node| AuthorityCommand::Register {
        caller,
        key: Fixture::new().key,
        instance: inst("pod-1"),
        on_node,
        endpoint: Fixture::spec(7),
        lease_ms: LEASE_MS,
    };
    assert_eq!(
        h.refused(cmd(orchestrator("prod"), None)),
        Refusal::InvalidRequest(InvalidRequest::MissingNode)
    );
    assert_eq!(
        h.refused(cmd(orchestrator("staging"), Some(node_id(2)))),
        Refusal::NotAllowed
    );
    let out = h
        .apply(cmd(orchestrator("prod"), Some(node_id(2))))
        .unwrap();
    let base = h.record("pod-1", 2, 3);
    let src = TransitionSource::Orchestrator;
    assert_eq!(out, vec![h.signed(&base, Starting, Registered, src, 1, 3)]);

    // It may also move the live instance id to another node (a rescheduled pod).
    let out = h
        .apply(cmd(orchestrator("prod"), Some(node_id(3))))
        .unwrap();
    assert_eq!(
        (out[0].record.owner.clone(), out[0].record.generation),
        (node_id(3), Generation(4))
    );
}

#[test]
fn operators_register_on_a_named_node() {
    let mut h = Harness::new();
    let cmd = AuthorityCommand::Register {
        caller: Caller::Operator,
        key: other_key(),
        instance: inst("vm-1"),
        on_node: Some(node_id(4)),
        endpoint: Fixture::spec(7),
        lease_ms: LEASE_MS,
    };
    let out = h.apply(cmd).unwrap();
    assert_eq!(out[0].record.source, TransitionSource::Authority);
    assert_eq!(out[0].record.owner, node_id(4));
}

#[test]
fn out_of_range_leases_and_weights_are_refused_without_consuming_a_revision() {
    let mut h = Harness::new();
    for lease_ms in [0, MIN_LEASE_MS - 1, MAX_LEASE_MS + 1] {
        let mut cmd = h.register(0, "a-1");
        if let AuthorityCommand::Register { lease_ms: l, .. } = &mut cmd {
            *l = lease_ms;
        }
        assert_eq!(
            h.refused(cmd),
            Refusal::InvalidRequest(InvalidRequest::LeaseOutOfRange { lease_ms })
        );
    }
    let mut cmd = h.register(0, "a-1");
    if let AuthorityCommand::Register { endpoint, .. } = &mut cmd {
        endpoint.weight = 0;
    }
    assert_eq!(
        h.refused(cmd),
        Refusal::InvalidRequest(InvalidRequest::Weight { weight: 0 })
    );

    let out = h.apply(h.register(0, "a-1")).unwrap();
    assert_eq!(out[0].record.revision, Revision(1));
    assert_eq!(out[0].record.generation, Generation(5));
}

#[test]
fn a_log_index_that_does_not_increase_is_refused() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    let ctx = ApplyContext {
        log_index: 1,
        committed_at_ms: BASE_MS,
        signing_key: &h.fx.authority,
    };
    let refusal = h.state.apply(h.register(0, "a-2"), ctx).unwrap_err();
    assert_eq!(
        refusal,
        Refusal::InvalidRequest(InvalidRequest::LogIndexNotIncreasing {
            log_index: 1,
            last_applied: 1
        })
    );
    assert_eq!(h.state.head_revision(), Revision(1));
    assert!(h.state.binding(&h.fx.key, &inst("a-2")).is_none());
}
