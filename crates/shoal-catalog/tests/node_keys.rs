//! Health verification against the owner key the authority binds into lifecycle records
//! (`docs/adr/0006-node-keys-in-lifecycle-records.md`): no node key is configured anywhere.

use std::sync::Arc;

use shoal_catalog::testkit::Fixture;
use shoal_catalog::view::AllAlive;
use shoal_catalog::{Catalog, MergeOutcome};
use shoal_proto::{
    HealthStatus, InstanceId, LifecycleState, SignatureError, SignedHealth, SignedLifecycle,
    SigningKey, TransitionReason,
};
use HealthStatus::{Failing, Passing};
use LifecycleState::{Expired, Ready};

fn key_of(k: &SigningKey) -> Option<[u8; 32]> {
    Some(k.verifying_key().to_bytes())
}

/// `instance` of node-0, READY, bound to `bound`.
fn ready(
    fx: &Fixture,
    instance: &str,
    gen: u64,
    rev: u64,
    bound: &SigningKey,
) -> Arc<SignedLifecycle> {
    ready_because(
        fx,
        instance,
        gen,
        rev,
        bound,
        TransitionReason::ReadinessPassed,
    )
}

fn ready_because(
    fx: &Fixture,
    instance: &str,
    gen: u64,
    rev: u64,
    bound: &SigningKey,
    reason: TransitionReason,
) -> Arc<SignedLifecycle> {
    Arc::new(fx.lifecycle_bound(&fx.key, instance, 0, gen, rev, Ready, reason, key_of(bound)))
}

fn revoked(fx: &Fixture, instance: &str, gen: u64, rev: u64) -> Arc<SignedLifecycle> {
    Arc::new(fx.lifecycle_bound(
        &fx.key,
        instance,
        0,
        gen,
        rev,
        Expired,
        TransitionReason::NodeRevoked,
        None,
    ))
}

fn failing(
    fx: &Fixture,
    signer: &SigningKey,
    instance: &str,
    gen: u64,
    seq: u64,
) -> Arc<SignedHealth> {
    Arc::new(fx.health_signed_by(signer, instance, 0, gen, 1, seq, Failing))
}

fn routable(c: &Catalog, fx: &Fixture) -> Vec<String> {
    c.routable(&fx.key, &AllAlive)
        .map(|e| e.lifecycle().record.instance.as_str().to_owned())
        .collect()
}

fn held_health(c: &Catalog, fx: &Fixture, instance: &str) -> Option<SignedHealth> {
    c.entry(&fx.key, &InstanceId::new(instance).unwrap())
        .and_then(|e| e.health().cloned())
}

#[test]
fn health_signed_by_the_bound_key_verifies_without_any_configured_node_key() {
    let fx = Fixture::new(); // its keyring trusts the authority key only
    let node0 = fx.nodes[0].1.clone();
    let mut c = Catalog::new();
    assert_eq!(
        c.apply_lifecycle(ready(&fx, "a", 1, 1, &node0), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(routable(&c, &fx), ["a"]);

    let out = c.apply_health(failing(&fx, &node0, "a", 1, 1), &fx.keyring);

    assert_eq!(out, MergeOutcome::Applied);
    assert!(routable(&c, &fx).is_empty(), "failing health withdraws it");
}

#[test]
fn health_signed_by_another_nodes_key_never_verifies() {
    let fx = Fixture::new();
    let (node0, node1) = (fx.nodes[0].1.clone(), fx.nodes[1].1.clone());
    let mut c = Catalog::new();
    assert_eq!(
        c.apply_lifecycle(ready(&fx, "a", 1, 1, &node0), &fx.keyring),
        MergeOutcome::Applied
    );
    // node-1's key is bound too (it owns "z"), so it is a known key, just not node-0's.
    assert_eq!(
        c.apply_lifecycle(
            Arc::new(fx.lifecycle_for(&fx.key, "z", 1, 2, 2, Ready)),
            &fx.keyring,
        ),
        MergeOutcome::Applied
    );

    // Claims node-0 as owner, signed by node-1.
    let out = c.apply_health(failing(&fx, &node1, "a", 1, 1), &fx.keyring);

    assert_eq!(out, MergeOutcome::Unverified);
    assert_eq!(held_health(&c, &fx, "a"), None);
    assert_eq!(routable(&c, &fx), ["a", "z"]);
    assert!(
        c.heads().owners.is_empty(),
        "an unverified record counts in no head"
    );

    // A genuine record with the very same marker is still applied: the forged one held
    // under that marker does not block it.
    let out = c.apply_health(failing(&fx, &node0, "a", 1, 1), &fx.keyring);
    assert_eq!(out, MergeOutcome::Applied);
    assert!(routable(&c, &fx) == ["z"]);
}

#[test]
fn health_signed_by_a_replaced_key_stops_verifying_once_the_reissue_arrives() {
    let fx = Fixture::new();
    let old = fx.nodes[0].1.clone();
    let new = SigningKey::from_seed([42; 32]);
    let mut c = Catalog::new();
    assert_eq!(
        c.apply_lifecycle(ready(&fx, "a", 1, 1, &old), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        c.apply_health(failing(&fx, &old, "a", 1, 1), &fx.keyring),
        MergeOutcome::Applied
    );
    assert!(routable(&c, &fx).is_empty());

    // The node's data dir was replaced: the authority re-issues "a" bound to the new key.
    let reissue = ready_because(&fx, "a", 1, 2, &new, TransitionReason::NodeKeyChanged);
    assert_eq!(
        c.apply_lifecycle(reissue, &fx.keyring),
        MergeOutcome::Applied
    );

    // Health of the old key is dropped with the re-issue, and newer old-key health is
    // superseded, never applied.
    assert_eq!(held_health(&c, &fx, "a"), None);
    assert_eq!(routable(&c, &fx), ["a"]);
    assert_eq!(
        c.apply_health(failing(&fx, &old, "a", 1, 2), &fx.keyring),
        MergeOutcome::Stale
    );
    assert_eq!(routable(&c, &fx), ["a"]);

    // The new key's health verifies.
    assert_eq!(
        c.apply_health(failing(&fx, &new, "a", 1, 3), &fx.keyring),
        MergeOutcome::Applied
    );
    assert!(routable(&c, &fx).is_empty());
}

#[test]
fn health_of_a_new_key_waits_for_the_reissue_of_its_instance() {
    let fx = Fixture::new();
    let old = fx.nodes[0].1.clone();
    let new = SigningKey::from_seed([42; 32]);
    let mut c = Catalog::new();
    assert_eq!(
        c.apply_lifecycle(ready(&fx, "a", 1, 1, &old), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        c.apply_lifecycle(ready(&fx, "b", 2, 2, &old), &fx.keyring),
        MergeOutcome::Applied
    );
    // The re-issue of "b" arrived first, so the new key is known; "a"'s is still on its way.
    assert_eq!(
        c.apply_lifecycle(
            ready_because(&fx, "b", 2, 3, &new, TransitionReason::NodeKeyChanged),
            &fx.keyring,
        ),
        MergeOutcome::Applied
    );

    let out = c.apply_health(failing(&fx, &new, "a", 1, 1), &fx.keyring);
    assert_eq!(
        out,
        MergeOutcome::Unadmitted,
        "held until the re-issue of a"
    );
    assert_eq!(routable(&c, &fx), ["a", "b"]);

    assert_eq!(
        c.apply_lifecycle(
            ready_because(&fx, "a", 1, 4, &new, TransitionReason::NodeKeyChanged),
            &fx.keyring,
        ),
        MergeOutcome::Applied
    );
    assert_eq!(routable(&c, &fx), ["b"], "applied from the hold");
}

#[test]
fn nothing_a_revoked_node_signed_verifies() {
    let fx = Fixture::new();
    let node0 = fx.nodes[0].1.clone();
    let mut c = Catalog::new();
    assert_eq!(
        c.apply_lifecycle(ready(&fx, "a", 1, 1, &node0), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        c.apply_lifecycle(ready(&fx, "b", 2, 2, &node0), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        c.apply_health(failing(&fx, &node0, "a", 1, 1), &fx.keyring),
        MergeOutcome::Applied
    );

    // The operator revoked node-0: the authority expired its instances; "a"'s EXPIRED
    // arrived here, "b"'s not yet.
    assert_eq!(
        c.apply_lifecycle(revoked(&fx, "a", 1, 3), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(held_health(&c, &fx, "a"), None);

    // Even for "b", still READY here, node-0's key no longer verifies anything.
    let out = c.apply_health(failing(&fx, &node0, "b", 2, 2), &fx.keyring);
    assert_eq!(
        out,
        MergeOutcome::BadSignature(SignatureError::Revoked(node0.id()))
    );
    assert_eq!(held_health(&c, &fx, "b"), None);
    assert_eq!(c.counters().bad_signature, 1);

    // And in the other order: the revocation arrives after health was held early.
    let mut d = Catalog::new();
    assert_eq!(
        d.apply_lifecycle(ready(&fx, "b", 2, 2, &node0), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        d.apply_health(
            Arc::new(fx.health_signed_by(&node0, "a", 0, 1, 1, 1, Passing)),
            &fx.keyring,
        ),
        MergeOutcome::Unadmitted,
        "health before its instance is admitted is held early"
    );
    assert_eq!(
        d.apply_lifecycle(revoked(&fx, "b", 2, 3), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        d.apply_lifecycle(ready(&fx, "a", 1, 1, &node0), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        held_health(&d, &fx, "a"),
        None,
        "held health of a revoked key is dropped"
    );
}
