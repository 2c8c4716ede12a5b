//! Health records in: ownership, conflicts, held-early health, generations and expiry.

use crate::support::*;

#[test]
fn health_from_the_owner_is_applied_and_newer_sequences_win() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    seed(
        &mut c,
        &fx,
        &[life(&fx, "a", 1, 1, Starting), life(&fx, "a", 1, 2, Ready)],
    );

    assert_eq!(
        c.apply_health(health(&fx, "a", 0, 1, 1, 1, Failing), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        c.apply_health(health(&fx, "a", 0, 1, 1, 2, Passing), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        c.apply_health(health(&fx, "a", 0, 1, 1, 1, Failing), &fx.keyring),
        MergeOutcome::Stale
    );
    assert_eq!(
        c.apply_health(health(&fx, "a", 0, 1, 1, 2, Passing), &fx.keyring),
        MergeOutcome::Duplicate
    );
    let h = c
        .entry(&fx.key, &inst("a"))
        .unwrap()
        .health()
        .unwrap()
        .clone();
    assert_eq!(h.record.status, Passing);
    assert_eq!(c.heads().owners[0].contiguous, HealthSeq(2));
}

#[test]
fn health_same_marker_different_status_is_a_conflict() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    seed(&mut c, &fx, &[life(&fx, "a", 1, 1, Ready)]);
    let held = health(&fx, "a", 0, 1, 1, 1, Passing);
    assert_eq!(
        c.apply_health(held.clone(), &fx.keyring),
        MergeOutcome::Applied
    );

    let out = c.apply_health(health(&fx, "a", 0, 1, 1, 1, Failing), &fx.keyring);

    assert_eq!(out, MergeOutcome::Conflict);
    assert_eq!(c.entry(&fx.key, &inst("a")).unwrap().health(), Some(&*held));
    assert_eq!(c.counters().conflict, 1);
}

#[test]
fn health_from_a_node_that_does_not_own_the_instance_is_refused() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    // "a" is owned by node-0; "z" by node-3 (so node-3's key is bound and known here).
    seed(
        &mut c,
        &fx,
        &[
            life(&fx, "a", 1, 1, Ready),
            Arc::new(fx.lifecycle_for(&fx.key, "z", 3, 2, 2, Ready)),
        ],
    );

    // node-3 signs (validly, with its own bound key) health for an instance it does not own.
    let out = c.apply_health(health(&fx, "a", 3, 1, 1, 1, Failing), &fx.keyring);
    assert_eq!(out, MergeOutcome::NotOwner);
    assert_eq!(c.counters().not_owner, 1);
    assert!(c.entry(&fx.key, &inst("a")).unwrap().health().is_none());

    // node-3 claiming to be node-0: its key is not one bound to node-0, so it never verifies;
    // it is held unverified, counted, and changes nothing.
    let mut forged = fx.health("a", 0, 1, 1, 1, Failing).record;
    forged.owner = fx.nodes[0].0.clone();
    let forged = fx.nodes[3].1.sign_health(forged);
    let out = c.apply_health(Arc::new(forged), &fx.keyring);
    assert_eq!(out, MergeOutcome::Unverified);
    assert_eq!(c.counters().unverified, 1);
    assert!(c.heads().owners.iter().all(|h| h.owner != fx.nodes[0].0));
    assert_eq!(routable_ids(&c, &fx, &AllAlive), ["a", "z"]);
}

#[test]
fn health_with_a_tampered_status_is_refused() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    seed(&mut c, &fx, &[life(&fx, "a", 1, 1, Ready)]);
    let mut h = fx.health("a", 0, 1, 1, 1, Passing);
    h.record.status = Failing;

    let out = c.apply_health(Arc::new(h), &fx.keyring);

    assert_eq!(out, MergeOutcome::BadSignature(SignatureError::Invalid));
    assert!(c.entry(&fx.key, &inst("a")).unwrap().health().is_none());
}

#[test]
fn health_before_its_lifecycle_is_held_then_applied_when_the_lifecycle_arrives() {
    let fx = Fixture::new();
    let mut c = Catalog::new();

    // No lifecycle record has bound node-0's key yet: held unverified.
    let out = c.apply_health(health(&fx, "a", 0, 1, 1, 1, Failing), &fx.keyring);
    assert_eq!(out, MergeOutcome::Unverified);
    assert!(c.is_empty(), "nothing admitted yet");
    assert_eq!(c.counters().unverified, 1);
    assert!(
        c.heads().owners.is_empty(),
        "an unverified record counts nowhere"
    );

    let out = c.apply_lifecycle(life(&fx, "a", 1, 1, Ready), &fx.keyring);
    assert_eq!(out, MergeOutcome::Applied);
    let e = c.entry(&fx.key, &inst("a")).unwrap();
    assert_eq!(e.health().unwrap().record.status, Failing);
    assert!(routable_ids(&c, &fx, &AllAlive).is_empty());

    // The same end state as in-order delivery.
    let mut in_order = Catalog::new();
    assert_eq!(
        in_order.apply_lifecycle(life(&fx, "a", 1, 1, Ready), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        in_order.apply_health(health(&fx, "a", 0, 1, 1, 1, Failing), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(c, in_order);
}

#[test]
fn health_for_a_newer_generation_waits_for_that_generations_lifecycle() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    seed(&mut c, &fx, &[life(&fx, "a", 1, 1, Ready)]);

    let out = c.apply_health(health(&fx, "a", 0, 2, 1, 1, Passing), &fx.keyring);
    assert_eq!(out, MergeOutcome::Unadmitted);
    assert!(c.entry(&fx.key, &inst("a")).unwrap().health().is_none());

    seed(&mut c, &fx, &[life(&fx, "a", 2, 2, Starting)]);
    let e = c.entry(&fx.key, &inst("a")).unwrap();
    assert_eq!(e.health().unwrap().record.generation, Generation(2));
}

#[test]
fn newer_generation_drops_the_old_generations_health() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    seed(&mut c, &fx, &[life(&fx, "a", 1, 1, Ready)]);
    assert_eq!(
        c.apply_health(health(&fx, "a", 0, 1, 1, 1, Failing), &fx.keyring),
        MergeOutcome::Applied
    );

    let out = c.apply_lifecycle(life(&fx, "a", 2, 2, Starting), &fx.keyring);

    assert_eq!(out, MergeOutcome::Applied);
    let e = c.entry(&fx.key, &inst("a")).unwrap();
    assert_eq!(e.lifecycle().record.generation, Generation(2));
    assert!(
        e.health().is_none(),
        "generation 1's health no longer applies"
    );
    // and a late health record of generation 1 is stale
    assert_eq!(
        c.apply_health(health(&fx, "a", 0, 1, 1, 2, Passing), &fx.keyring),
        MergeOutcome::Stale
    );
}

#[test]
fn delayed_older_generation_records_never_resurrect_a_replaced_endpoint() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    let g1_ready = life(&fx, "a", 1, 2, Ready);
    seed(
        &mut c,
        &fx,
        &[life(&fx, "a", 1, 1, Starting), g1_ready.clone()],
    );
    // The instance restarts: generation 2 is admitted and not yet ready.
    seed(&mut c, &fx, &[life(&fx, "a", 2, 3, Starting)]);
    assert!(routable_ids(&c, &fx, &AllAlive).is_empty());

    // Every delayed record of generation 1, even one with a higher revision, is stale.
    assert_eq!(
        c.apply_lifecycle(g1_ready, &fx.keyring),
        MergeOutcome::Stale
    );
    let late = life(&fx, "a", 1, 9, Ready);
    assert_eq!(c.apply_lifecycle(late, &fx.keyring), MergeOutcome::Stale);
    assert_eq!(
        c.apply_health(health(&fx, "a", 0, 1, 1, 5, Passing), &fx.keyring),
        MergeOutcome::Stale
    );
    assert!(routable_ids(&c, &fx, &AllAlive).is_empty());
    assert_eq!(held_life(&c, &fx, "a").record.generation, Generation(2));
}

#[test]
fn expiry_drops_health_and_later_health_of_that_generation_is_stale() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    seed(&mut c, &fx, &[life(&fx, "a", 1, 1, Ready)]);
    assert_eq!(
        c.apply_health(health(&fx, "a", 0, 1, 1, 1, Passing), &fx.keyring),
        MergeOutcome::Applied
    );

    seed(&mut c, &fx, &[life(&fx, "a", 1, 2, Expired)]);
    assert!(c.entry(&fx.key, &inst("a")).unwrap().health().is_none());
    assert_eq!(
        c.apply_health(health(&fx, "a", 0, 1, 1, 2, Passing), &fx.keyring),
        MergeOutcome::Stale
    );
    assert!(
        c.view(&fx.key, &AllAlive).endpoints.is_empty(),
        "tombstones are not shown"
    );
}

#[test]
fn health_held_early_is_claimed_by_no_head_and_applied_once_its_lifecycle_arrives() {
    // A health record arrives (twice) before its lifecycle record, from a node whose key
    // another record already bound: held as verified, counted in no head (so no delta
    // claims its seq), and applied, and counted, once its lifecycle record arrives.
    let fx = Fixture::new();
    let node0 = fx.nodes[0].0.clone();
    let early = health(&fx, "a", 0, 1, 1, 1, Passing);
    let mut tx = Catalog::new();
    seed(&mut tx, &fx, &[life(&fx, "b", 2, 2, Ready)]);
    for _ in 0..2 {
        assert_eq!(
            tx.apply_health(early.clone(), &fx.keyring),
            MergeOutcome::Unadmitted
        );
    }
    let d = tx.health_delta(&node0, Generation(1), HealthSeq(0), 100);
    assert_eq!(d.complete_to, HealthSeq(0), "the head claims nothing held");
    assert!(d.records.is_empty());

    assert_eq!(
        tx.apply_lifecycle(life(&fx, "a", 1, 1, Ready), &fx.keyring),
        MergeOutcome::Applied
    );
    assert!(tx.entry(&fx.key, &inst("a")).unwrap().health().is_some());
    let d = tx.health_delta(&node0, Generation(1), HealthSeq(0), 100);
    assert_eq!((d.complete_to, d.records), (HealthSeq(1), vec![early]));
}
