//! The audit log: every command, accepted or refused, bounded.

use shoal_proto::LifecycleState::*;
use shoal_proto::TransitionReason::*;
use shoal_proto::{Generation, Revision};

use super::*;
use crate::{AuditEntry, AuditOutcome, CallerId, CommandSummary};

#[test]
fn accepted_and_refused_commands_are_both_audited() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(h.transition(node(1), "a-1", 1, Ready, ReadinessPassed))
        .unwrap_err();
    h.apply(AuthorityCommand::NodeDown {
        node: node_id(1),
        at_ms: 5,
    })
    .unwrap();

    let entries: Vec<&AuditEntry> = h.state.audit().entries().collect();
    assert_eq!(
        entries,
        vec![
            &AuditEntry {
                seq: 1,
                log_index: 1,
                committed_at_ms: BASE_MS + 1,
                caller: CallerId::Node(node_id(0)),
                on_behalf_of: None,
                command: CommandSummary::Register {
                    key: h.fx.key.clone(),
                    instance: inst("a-1"),
                    on_node: None,
                    address: shoal_catalog::testkit::Fixture::spec(7).address,
                    lease_ms: LEASE_MS,
                },
                outcome: AuditOutcome::Accepted {
                    records: 1,
                    policy_revision: None
                },
                revision: Revision(1),
            },
            &AuditEntry {
                seq: 2,
                log_index: 2,
                committed_at_ms: BASE_MS + 2,
                caller: CallerId::Node(node_id(1)),
                on_behalf_of: None,
                command: CommandSummary::Transition {
                    key: h.fx.key.clone(),
                    instance: inst("a-1"),
                    generation: Generation(1),
                    to: Ready,
                    reason: ReadinessPassed,
                },
                outcome: AuditOutcome::Refused(Refusal::NotOwner {
                    bound_to: node_id(0)
                }),
                revision: Revision(1),
            },
            &AuditEntry {
                seq: 3,
                log_index: 3,
                committed_at_ms: BASE_MS + 3,
                caller: CallerId::Authority,
                on_behalf_of: None,
                command: CommandSummary::NodeDown {
                    node: node_id(1),
                    at_ms: 5
                },
                outcome: AuditOutcome::Accepted {
                    records: 0,
                    policy_revision: None
                },
                revision: Revision(1),
            },
        ]
    );
}

#[test]
fn the_audit_log_keeps_only_the_last_entries_and_counts_all() {
    let mut h = Harness::new();
    h.state = AuthorityState::with_audit_capacity(h.fx.region.clone(), 3);
    for i in 0..5 {
        h.apply(h.register(0, &format!("a-{i}"))).unwrap();
    }
    let log = h.state.audit();
    assert_eq!(
        (log.len(), log.capacity(), log.total(), log.evicted()),
        (3, 3, 5, 2)
    );
    let seqs: Vec<u64> = log.entries().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![3, 4, 5]);
}

#[test]
fn the_default_capacity_is_ten_thousand() {
    let mut h = Harness::new();
    for i in 0..10_005u64 {
        h.apply(AuthorityCommand::NodeUp {
            node: node_id((i % 8) as usize),
        })
        .unwrap();
    }
    let log = h.state.audit();
    assert_eq!((log.len(), log.total()), (10_000, 10_005));
    assert_eq!(log.entries().next().unwrap().seq, 6);
}

#[test]
fn the_local_process_an_agent_forwarded_for_is_audited_and_survives_encoding() {
    use shoal_proto::rpc::LocalCaller;
    let mut h = Harness::new();
    let who = LocalCaller {
        uid: 1001,
        gid: 1001,
        pid: Some(4242),
        exe: Some("/usr/bin/web".into()),
    };
    h.index += 1;
    let ctx = ApplyContext {
        log_index: h.index,
        committed_at_ms: BASE_MS + h.index,
        signing_key: &h.fx.authority,
    };
    h.state
        .apply_on_behalf(h.register(0, "a-1"), ctx, Some(who.clone()))
        .unwrap();
    // A refused command names its caller too; a plain `apply` names nobody.
    h.index += 1;
    let ctx = ApplyContext {
        log_index: h.index,
        committed_at_ms: BASE_MS + h.index,
        signing_key: &h.fx.authority,
    };
    h.state
        .apply_on_behalf(
            h.transition(node(1), "a-1", 1, Ready, ReadinessPassed),
            ctx,
            Some(who.clone()),
        )
        .unwrap_err();
    h.apply(h.transition(node(0), "a-1", 1, Ready, ReadinessPassed))
        .unwrap();
    let got: Vec<Option<LocalCaller>> = h
        .state
        .audit()
        .entries()
        .map(|e| e.on_behalf_of.clone())
        .collect();
    assert_eq!(got, vec![Some(who.clone()), Some(who), None]);
    let decoded = crate::AuthorityState::decode(&h.state.encode()).unwrap();
    assert_eq!(decoded.audit(), h.state.audit());
}
