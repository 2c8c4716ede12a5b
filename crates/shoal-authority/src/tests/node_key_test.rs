//! `BindNodeKey`, `RevokeNode`, `ReadmitNode`: the owner key bound into every lifecycle record
//! (ADR 0006).

use std::sync::Arc;

use shoal_catalog::{Catalog, MergeOutcome};
use shoal_proto::LifecycleState::*;
use shoal_proto::TransitionReason::*;
use shoal_proto::{
    Generation, HealthStatus, NodeKey, SignatureError, SignedLifecycle, SigningKey,
    TransitionSource,
};

use super::*;
use crate::InvalidRequest;

fn key(seed: u8) -> SigningKey {
    SigningKey::from_seed([seed; 32])
}

fn public(k: &SigningKey) -> NodeKey {
    k.verifying_key().to_bytes()
}

fn bind(node_index: usize, k: &SigningKey) -> AuthorityCommand {
    AuthorityCommand::BindNodeKey {
        caller: node(node_index),
        key: public(k),
    }
}

fn revoke(caller: Caller, node_index: usize) -> AuthorityCommand {
    AuthorityCommand::RevokeNode {
        caller,
        node: node_id(node_index),
    }
}

fn current(h: &Harness, instance: &str) -> SignedLifecycle {
    h.state
        .binding(&h.fx.key, &inst(instance))
        .unwrap()
        .current()
        .clone()
}

#[test]
fn registrations_and_transitions_carry_the_bound_key_and_rebinding_it_emits_nothing() {
    let mut h = Harness::new();
    let k = key(1);
    assert_eq!(h.apply(bind(0, &k)).unwrap(), vec![]);
    assert_eq!(h.state.node_key(&node_id(0)), Some(public(&k)));

    let out = h.apply(h.register(0, "a")).unwrap();
    assert_eq!(out[0].record.owner_key, Some(public(&k)));
    let out = h
        .apply(h.transition(node(0), "a", 2, Ready, ReadinessPassed))
        .unwrap();
    assert_eq!(out[0].record.owner_key, Some(public(&k)));

    // The same key again (every agent start): nothing to re-issue, no revision consumed.
    let head = h.state.head_revision();
    assert_eq!(h.apply(bind(0, &k)).unwrap(), vec![]);
    assert_eq!(h.state.head_revision(), head);
}

#[test]
fn lease_expiry_carries_the_bound_key() {
    let mut h = Harness::new();
    let k = key(1);
    h.apply(bind(0, &k)).unwrap();
    h.apply(h.register(0, "a")).unwrap();
    h.apply(AuthorityCommand::NodeDown {
        node: node_id(0),
        at_ms: 0,
    })
    .unwrap();
    let out = h
        .apply(AuthorityCommand::ExpireLeases {
            now_ms: u64::from(LEASE_MS),
        })
        .unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].record.state, out[0].record.reason),
        (Expired, LeaseExpired)
    );
    assert_eq!(out[0].record.owner_key, Some(public(&k)));
}

#[test]
fn a_new_key_reissues_every_live_instance_of_that_node_only() {
    let mut h = Harness::new();
    let (old, new) = (key(1), key(2));
    h.apply(bind(0, &old)).unwrap();
    h.apply(bind(1, &key(9))).unwrap();
    h.apply(h.register(0, "a")).unwrap(); // gen 3
    h.apply(h.transition(node(0), "a", 3, Ready, ReadinessPassed))
        .unwrap();
    h.apply(h.register(0, "b")).unwrap(); // gen 5, STARTING
    h.apply(h.register(0, "gone")).unwrap(); // gen 6
    h.apply(h.transition(node(0), "gone", 6, Expired, Deregistered))
        .unwrap();
    h.apply(h.register(1, "c")).unwrap(); // node-1's
    let (a, b, c) = (current(&h, "a"), current(&h, "b"), current(&h, "c"));
    let head = h.state.head_revision().0;

    // node-0's data dir was replaced: it presents a new key.
    let out = h.apply(bind(0, &new)).unwrap();

    let idx = h.index;
    let reissue = |base: &SignedLifecycle, rev: u64| {
        h.fx.authority.sign_lifecycle(LifecycleRecord {
            reason: NodeKeyChanged,
            source: TransitionSource::Authority,
            owner_key: Some(public(&new)),
            revision: Revision(rev),
            committed_at_ms: BASE_MS + idx,
            ..base.record.clone()
        })
    };
    assert_eq!(out, vec![reissue(&a, head + 1), reissue(&b, head + 2)]);
    assert_eq!(
        (out[0].record.state, out[1].record.state),
        (Ready, Starting)
    );
    assert_eq!(out[0].record.generation, Generation(3), "same generation");
    assert_eq!(current(&h, "c"), c, "another node's instance is untouched");
    assert_eq!(current(&h, "gone").record.state, Expired);
    assert_eq!(current(&h, "gone").record.owner_key, Some(public(&old)));

    // Every agent verifies with the re-issue: the old key's health is superseded.
    let mut cat = Catalog::new();
    assert_eq!(
        cat.apply_lifecycle(Arc::new(a), &h.fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        cat.apply_lifecycle(Arc::new(out[0].clone()), &h.fx.keyring),
        MergeOutcome::Applied
    );
    let old_health = old.sign_health(h.fx.health("a", 0, 3, 1, 1, HealthStatus::Failing).record);
    assert_eq!(
        cat.apply_health(Arc::new(old_health), &h.fx.keyring),
        MergeOutcome::Stale
    );
    let new_health = new.sign_health(h.fx.health("a", 0, 3, 2, 1, HealthStatus::Failing).record);
    assert_eq!(
        cat.apply_health(Arc::new(new_health), &h.fx.keyring),
        MergeOutcome::Applied
    );
}

#[test]
fn records_registered_before_any_key_get_it_when_the_node_binds() {
    let mut h = Harness::new();
    let out = h.apply(h.register(0, "a")).unwrap();
    assert_eq!(out[0].record.owner_key, None, "bootstrap: no key yet");
    let k = key(1);
    let out = h.apply(bind(0, &k)).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(
        (
            out[0].record.state,
            out[0].record.reason,
            out[0].record.owner_key
        ),
        (Starting, NodeKeyChanged, Some(public(&k)))
    );
}

#[test]
fn only_a_node_binds_and_only_for_itself() {
    let mut h = Harness::new();
    let k0 = key(1);
    h.apply(bind(0, &k0)).unwrap();
    h.apply(h.register(0, "a")).unwrap();
    let a = current(&h, "a");

    // node-1 presents a key: the command has no target, so it binds node-1's key only.
    let out = h.apply(bind(1, &key(2))).unwrap();
    assert!(out.is_empty());
    assert_eq!(h.state.node_key(&node_id(0)), Some(public(&k0)));
    assert_eq!(h.state.node_key(&node_id(1)), Some(public(&key(2))));
    assert_eq!(current(&h, "a"), a);

    // Orchestrators and operators have no node key to bind.
    for caller in [orchestrator("prod"), Caller::Operator] {
        let r = h.refused(AuthorityCommand::BindNodeKey {
            caller,
            key: public(&key(3)),
        });
        assert_eq!(r, Refusal::NotAllowed);
    }
    // Bytes that are no curve point are refused.
    let mut bad = [0u8; 32];
    bad[31] = 0x80;
    bad[0] = 2;
    let r = h.refused(AuthorityCommand::BindNodeKey {
        caller: node(0),
        key: bad,
    });
    assert_eq!(r, Refusal::InvalidRequest(InvalidRequest::NodeKey));
}

#[test]
fn revocation_expires_the_nodes_instances_and_refuses_it_until_readmitted_with_a_new_key() {
    let mut h = Harness::new();
    let k = key(1);
    h.apply(bind(0, &k)).unwrap();
    h.apply(h.register(0, "a")).unwrap();
    h.apply(h.register(0, "b")).unwrap();
    h.apply(h.register(1, "c")).unwrap();

    assert_eq!(h.refused(revoke(node(0), 0)), Refusal::NotAllowed);
    assert_eq!(
        h.refused(revoke(orchestrator("prod"), 0)),
        Refusal::NotAllowed
    );

    let out = h.apply(revoke(Caller::Operator, 0)).unwrap();
    assert_eq!(out.len(), 2);
    for r in &out {
        assert_eq!(r.record.owner, node_id(0));
        assert_eq!(
            (r.record.state, r.record.reason, r.record.owner_key),
            (Expired, NodeRevoked, None)
        );
        assert_eq!(r.record.source, TransitionSource::Authority);
    }
    assert_eq!(current(&h, "c").record.state, Starting);
    assert!(h.state.node_revoked(&node_id(0)));
    assert_eq!(h.state.node_key(&node_id(0)), None);

    // Nothing from the revoked node is admitted.
    let revoked = Refusal::NodeRevoked { node: node_id(0) };
    assert_eq!(h.refused(bind(0, &k)), revoked);
    assert_eq!(h.refused(bind(0, &key(2))), revoked);
    assert_eq!(h.refused(h.register(0, "d")), revoked);

    // In every catalog, health signed by the revoked key stops verifying.
    let mut cat = Catalog::new();
    for r in &out {
        assert_eq!(
            cat.apply_lifecycle(Arc::new(r.clone()), &h.fx.keyring),
            MergeOutcome::Applied
        );
    }
    let mut earlier = current(&h, "c").record; // any record binding k for node-0
    earlier.owner = node_id(0);
    earlier.owner_key = Some(public(&k));
    earlier.revision = Revision(1);
    assert_eq!(
        cat.apply_lifecycle(
            Arc::new(h.fx.authority.sign_lifecycle(earlier)),
            &h.fx.keyring,
        ),
        MergeOutcome::Applied
    );
    let health = k.sign_health(h.fx.health("a", 0, 2, 1, 1, HealthStatus::Failing).record);
    assert_eq!(
        cat.apply_health(Arc::new(health), &h.fx.keyring),
        MergeOutcome::BadSignature(SignatureError::Revoked(k.id()))
    );

    // Readmitted: the revoked key stays refused; a new one binds.
    h.apply(AuthorityCommand::ReadmitNode {
        caller: Caller::Operator,
        node: node_id(0),
    })
    .unwrap();
    assert_eq!(h.refused(bind(0, &k)), revoked);
    h.apply(bind(0, &key(2))).unwrap();
    let out = h.apply(h.register(0, "d")).unwrap();
    assert_eq!(out[0].record.owner_key, Some(public(&key(2))));
}

#[test]
fn reserved_reasons_cannot_be_requested() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a")).unwrap();
    for reason in [NodeKeyChanged, NodeRevoked] {
        let to = if reason == NodeRevoked {
            Expired
        } else {
            Starting
        };
        let r = h.refused(h.transition(node(0), "a", 1, to, reason));
        assert_eq!(
            r,
            Refusal::InvalidRequest(InvalidRequest::ReservedReason(reason))
        );
    }
}

#[test]
fn node_keys_survive_a_snapshot_round_trip() {
    let mut h = Harness::new();
    h.apply(bind(0, &key(1))).unwrap();
    h.apply(revoke(Caller::Operator, 1)).unwrap();
    let back = AuthorityState::decode(&h.state.encode()).unwrap();
    assert_eq!(back, h.state);
    assert_eq!(back.node_key(&node_id(0)), Some(public(&key(1))));
    assert!(back.node_revoked(&node_id(1)));
}
