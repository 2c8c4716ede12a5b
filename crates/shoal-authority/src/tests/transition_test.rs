//! `Transition`: ownership, generations, the lifecycle table.

use shoal_proto::LifecycleState::*;
use shoal_proto::TransitionReason::*;
use shoal_proto::{Generation, Revision, TransitionSource};

use super::*;
use crate::InvalidRequest;

#[test]
fn a_non_owner_node_is_refused() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    let refusal = h.refused(h.transition(node(1), "a-1", 1, Ready, ReadinessPassed));
    assert_eq!(
        refusal,
        Refusal::NotOwner {
            bound_to: node_id(0)
        }
    );
}

#[test]
fn an_orchestrator_outside_its_scope_is_refused_and_inside_it_may_drain() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(h.transition(node(0), "a-1", 1, Ready, ReadinessPassed))
        .unwrap();
    let refusal =
        h.refused(h.transition(orchestrator("staging"), "a-1", 1, Draining, DrainRequested));
    assert_eq!(refusal, Refusal::NotAllowed);
    let out = h
        .apply(h.transition(orchestrator("prod"), "a-1", 1, Draining, DrainRequested))
        .unwrap();
    let base = h.record("a-1", 0, 1);
    let src = TransitionSource::Orchestrator;
    assert_eq!(
        out,
        vec![h.signed(&base, Draining, DrainRequested, src, 3, 4)]
    );
}

#[test]
fn an_older_generation_is_refused_and_never_resurrects() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap(); // generation 1
    h.apply(h.transition(node(0), "a-1", 1, Ready, ReadinessPassed))
        .unwrap();
    h.apply(h.transition(node(0), "a-1", 1, Expired, Deregistered))
        .unwrap();
    h.apply(h.register(0, "a-1")).unwrap(); // generation 4, STARTING

    // A delayed READY and undrain from the old process arrive now.
    for (to, reason) in [
        (Ready, ReadinessPassed),
        (Ready, DrainCancelled),
        (Draining, DrainRequested),
    ] {
        let refusal = h.refused(h.transition(node(0), "a-1", 1, to, reason));
        assert_eq!(
            refusal,
            Refusal::StaleGeneration {
                requested: Generation(1),
                current: Generation(4)
            }
        );
    }
    let b = h.state.binding(&h.fx.key, &inst("a-1")).unwrap();
    assert_eq!(
        (b.generation(), b.state(), b.current().record.revision),
        (Generation(4), Starting, Revision(4))
    );
}

#[test]
fn a_generation_never_issued_is_refused() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    let refusal = h.refused(h.transition(node(0), "a-1", 9, Ready, ReadinessPassed));
    assert_eq!(
        refusal,
        Refusal::UnknownGeneration {
            requested: Generation(9),
            current: Generation(1)
        }
    );
}

#[test]
fn an_unknown_instance_is_refused() {
    let mut h = Harness::new();
    let refusal = h.refused(h.transition(node(0), "ghost", 1, Ready, ReadinessPassed));
    assert_eq!(refusal, Refusal::UnknownInstance);
}

#[test]
fn illegal_transitions_are_refused() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    // STARTING -> READY needs ReadinessPassed, not DrainCancelled.
    let refusal = h.refused(h.transition(node(0), "a-1", 1, Ready, DrainCancelled));
    assert_eq!(
        refusal,
        Refusal::IllegalTransition {
            from: Some(Starting),
            to: Ready,
            reason: DrainCancelled
        }
    );
    // Health-only reasons never move the lifecycle.
    let refusal = h.refused(h.transition(node(0), "a-1", 1, Draining, ReadinessFailed));
    assert_eq!(
        refusal,
        Refusal::IllegalTransition {
            from: Some(Starting),
            to: Draining,
            reason: ReadinessFailed
        }
    );
}

#[test]
fn a_retried_transition_reports_already_in_state() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(h.transition(node(0), "a-1", 1, Ready, ReadinessPassed))
        .unwrap();
    let refusal = h.refused(h.transition(node(0), "a-1", 1, Ready, ReadinessPassed));
    assert_eq!(refusal, Refusal::AlreadyInState(Ready));
}

#[test]
fn expired_is_terminal() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(h.transition(node(0), "a-1", 1, Expired, Deregistered))
        .unwrap();
    let refusal = h.refused(h.transition(node(0), "a-1", 1, Ready, ReadinessPassed));
    assert_eq!(refusal, Refusal::Expired);
    // A retried deregister is answered like any retry (the server then replies with the
    // committed EXPIRED record), not refused as a new transition out of EXPIRED.
    let refusal = h.refused(h.transition(node(0), "a-1", 1, Expired, Deregistered));
    assert_eq!(refusal, Refusal::AlreadyInState(Expired));
}

#[test]
fn lease_expired_is_reserved_for_the_authority() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    let refusal = h.refused(h.transition(node(0), "a-1", 1, Expired, LeaseExpired));
    assert_eq!(
        refusal,
        Refusal::InvalidRequest(InvalidRequest::ReservedReason(LeaseExpired))
    );
}
