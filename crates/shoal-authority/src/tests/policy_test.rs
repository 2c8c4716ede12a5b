//! `PutPolicy`: signed per-service policy documents.

use shoal_proto::{
    FailoverMode, PolicyError, PolicyRecord, Region, Revision, ServicePolicy, SignatureError,
};

use super::*;
use crate::{AuditOutcome, InvalidRequest};

fn policy(regions: &[&str]) -> ServicePolicy {
    ServicePolicy {
        allowed_failover_regions: regions.iter().map(|r| Region::new(*r).unwrap()).collect(),
        mode: FailoverMode::ReadOnly,
        max_cross_region_rps: Some(500),
        max_snapshot_age_s: Some(900),
        on_stale: shoal_proto::StaleAction::Degrade,
        overprovisioning_factor_pct: None,
    }
}

fn put(caller: Caller, key: ServiceKey, policy: ServicePolicy) -> AuthorityCommand {
    AuthorityCommand::PutPolicy {
        caller,
        key,
        policy,
    }
}

#[test]
fn an_operator_puts_a_policy_that_is_signed_and_verifies() {
    let mut h = Harness::new();
    let doc = policy(&["us-east", "ap-south"]);
    assert_eq!(
        h.apply(put(Caller::Operator, h.fx.key.clone(), doc.clone()))
            .unwrap(),
        vec![]
    );

    let signed = h.state.policy(&h.fx.key).unwrap();
    let expected = h.fx.authority.sign_policy(PolicyRecord {
        key: h.fx.key.clone(),
        region: h.fx.region.clone(),
        revision: Revision(1),
        policy: doc,
        committed_at_ms: BASE_MS + 1,
    });
    assert_eq!(signed, &expected);
    h.fx.authority
        .verifying_key()
        .verify_policy(signed)
        .unwrap();
    assert_eq!(
        h.state.audit().last().unwrap().outcome,
        AuditOutcome::Accepted {
            records: 0,
            policy_revision: Some(Revision(1))
        }
    );

    // Tampering breaks the signature; another key is not the signer.
    let mut forged = signed.clone();
    forged.record.policy.mode = FailoverMode::Writable;
    assert_eq!(
        h.fx.authority.verifying_key().verify_policy(&forged),
        Err(SignatureError::Invalid)
    );
    let other = shoal_proto::SigningKey::from_seed([9; 32]).verifying_key();
    assert!(matches!(
        other.verify_policy(signed),
        Err(SignatureError::WrongSigner(_))
    ));
}

#[test]
fn policy_revisions_are_their_own_chain_and_do_not_touch_lifecycle_revisions() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(put(
        Caller::Operator,
        h.fx.key.clone(),
        policy(&["us-east"]),
    ))
    .unwrap();
    h.apply(put(Caller::Operator, other_key(), policy(&[])))
        .unwrap();
    h.apply(put(
        Caller::Operator,
        h.fx.key.clone(),
        policy(&["ap-south"]),
    ))
    .unwrap();
    assert_eq!(h.state.head_revision(), Revision(1));
    assert_eq!(h.state.head_policy_revision(), Revision(3));
    let current = &h.state.policy(&h.fx.key).unwrap().record;
    assert_eq!(current.revision, Revision(3));
    assert_eq!(current.policy, policy(&["ap-south"]));
    let out = h
        .apply(h.transition(
            node(0),
            "a-1",
            1,
            shoal_proto::LifecycleState::Ready,
            shoal_proto::TransitionReason::ReadinessPassed,
        ))
        .unwrap();
    assert_eq!(out[0].record.revision, Revision(2));
}

#[test]
fn only_operators_write_policy() {
    let mut h = Harness::new();
    for caller in [node(0), orchestrator("prod")] {
        assert_eq!(
            h.refused(put(caller, h.fx.key.clone(), policy(&[]))),
            Refusal::NotAllowed
        );
    }
    assert!(h.state.policy(&h.fx.key).is_none());
}

#[test]
fn invalid_policies_are_refused() {
    let mut h = Harness::new();
    let refusal = h.refused(put(
        Caller::Operator,
        h.fx.key.clone(),
        policy(&["eu", "eu"]),
    ));
    assert_eq!(
        refusal,
        Refusal::InvalidRequest(InvalidRequest::Policy(PolicyError::DuplicateRegion(
            Region::new("eu").unwrap()
        )))
    );
    assert_eq!(h.state.head_policy_revision(), Revision(0));
}
