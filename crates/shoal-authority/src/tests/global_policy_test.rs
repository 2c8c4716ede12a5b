//! `PutGlobalPolicy`: the global policy document (ADR 0013) is kept only with a higher
//! version, audited either way, and carried by snapshots.

use shoal_proto::{
    FailoverMode, GlobalPolicy, GlobalServicePolicy, Region, RegionKeys, ServicePolicy,
    SignedGlobalPolicy, SigningKey, StaleAction,
};

use super::*;
use crate::{AuditOutcome, CommandSummary, InvalidRequest};

fn doc(version: u64) -> SignedGlobalPolicy {
    let policy_key = SigningKey::from_seed([42; 32]);
    let region = |s: &str| Region::new(s).unwrap();
    policy_key.sign_global_policy(GlobalPolicy {
        version,
        issued_at_ms: 1,
        regions: vec![RegionKeys {
            region: region("r2"),
            authority_keys: vec![SigningKey::from_seed([2; 32]).verifying_key().to_bytes()],
        }],
        services: vec![GlobalServicePolicy {
            key: "prod/web/http".parse().unwrap(),
            policy: ServicePolicy {
                allowed_failover_regions: vec![region("r2")],
                mode: FailoverMode::ReadOnly,
                max_cross_region_rps: Some(10),
                max_snapshot_age_s: Some(60),
                on_stale: StaleAction::Refuse,
                overprovisioning_factor_pct: None,
            },
        }],
    })
}

fn put(signed: SignedGlobalPolicy) -> AuthorityCommand {
    AuthorityCommand::PutGlobalPolicy {
        caller: Caller::Operator,
        signed,
    }
}

#[test]
fn a_higher_version_replaces_a_replay_or_older_one_is_refused_and_audited() {
    let mut h = Harness::new();
    assert_eq!(h.state.global_policy_version(), 0);
    assert_eq!(h.apply(put(doc(2))).unwrap(), vec![]);
    assert_eq!(h.state.global_policy(), Some(&doc(2)));

    for v in [2, 1] {
        assert_eq!(
            h.refused(put(doc(v))),
            Refusal::InvalidRequest(InvalidRequest::GlobalPolicyVersion {
                offered: v,
                held: 2
            })
        );
    }
    assert_eq!(h.state.global_policy_version(), 2, "unchanged by refusals");
    h.apply(put(doc(3))).unwrap();
    assert_eq!(h.state.global_policy_version(), 3);

    let entries: Vec<_> = h.state.audit().entries().collect();
    let n = entries.len();
    assert!(matches!(
        entries[n - 1].command,
        CommandSummary::PutGlobalPolicy { version: 3, .. }
    ));
    assert!(matches!(
        entries[n - 1].outcome,
        AuditOutcome::Accepted { .. }
    ));
    assert!(matches!(entries[n - 2].outcome, AuditOutcome::Refused(_)));
}

#[test]
fn an_invalid_document_is_refused_even_when_signed() {
    let mut h = Harness::new();
    let mut bad = doc(5);
    bad.policy.regions.push(bad.policy.regions[0].clone()); // not sorted and unique
    assert!(matches!(
        h.refused(put(bad)),
        Refusal::InvalidRequest(InvalidRequest::GlobalPolicy(_))
    ));
    assert_eq!(h.state.global_policy(), None);
}

#[test]
fn the_document_survives_a_snapshot_round_trip() {
    let mut h = Harness::new();
    h.apply(put(doc(7))).unwrap();
    let back = AuthorityState::decode(&h.state.encode()).unwrap();
    assert_eq!(back.global_policy(), Some(&doc(7)));
}
