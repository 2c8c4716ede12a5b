//! Event tests for the catalog, in the openraft engine-test shape: build a state, feed one event
//! in, assert the exact outcome out (the `MergeOutcome`, the counters, the held records).
//!
//! Fixture conventions (see `shoal_catalog::testkit`): region `test`, service `prod/api/http`,
//! nodes `node-0..node-7`; `fx.lifecycle(instance, generation, revision, state)` is owned by
//! `node-0`; `fx.health(instance, owner, generation, owner_boot, seq, status)`.

use std::collections::BTreeSet;
use std::sync::Arc;

use shoal_catalog::testkit::Fixture;
use shoal_catalog::view::{self, AllAlive, EndpointState, Liveness};
use shoal_catalog::{Catalog, DeltaError, Gap, Keyring, MergeCounters, MergeOutcome, RegionHead};
use shoal_proto::{
    Generation, HealthSeq, HealthStatus, InstanceId, LifecycleState, NodeId, Region, Revision,
    ServiceKey, SignatureError, SignedHealth, SignedLifecycle, SigningKey,
};

use HealthStatus::{Failing, Passing};
use LifecycleState::{Draining, Expired, Ready, Starting};

fn life(
    fx: &Fixture,
    instance: &str,
    generation: u64,
    revision: u64,
    state: LifecycleState,
) -> Arc<SignedLifecycle> {
    Arc::new(fx.lifecycle(instance, generation, revision, state))
}

#[allow(clippy::too_many_arguments)]
fn health(
    fx: &Fixture,
    instance: &str,
    owner: usize,
    generation: u64,
    boot: u64,
    seq: u64,
    status: HealthStatus,
) -> Arc<SignedHealth> {
    Arc::new(fx.health(instance, owner, generation, boot, seq, status))
}

fn inst(s: &str) -> InstanceId {
    InstanceId::new(s).unwrap()
}

/// Applies records that must all be `Applied`.
fn seed(c: &mut Catalog, fx: &Fixture, records: &[Arc<SignedLifecycle>]) {
    for r in records {
        assert_eq!(
            c.apply_lifecycle(r.clone(), &fx.keyring),
            MergeOutcome::Applied
        );
    }
}

fn held_life(c: &Catalog, fx: &Fixture, instance: &str) -> SignedLifecycle {
    c.entry(&fx.key, &inst(instance))
        .expect("entry held")
        .lifecycle()
        .clone()
}

/// A liveness input with explicit down nodes and ejected instances.
#[derive(Default)]
struct Net {
    down: BTreeSet<NodeId>,
    ejected: BTreeSet<(InstanceId, Generation)>,
}

impl Liveness for Net {
    fn is_down(&self, node: &NodeId) -> bool {
        self.down.contains(node)
    }
    fn is_ejected(&self, instance: &InstanceId, generation: Generation) -> bool {
        self.ejected.contains(&(instance.clone(), generation))
    }
}

fn routable_ids(c: &Catalog, fx: &Fixture, live: &dyn Liveness) -> Vec<String> {
    c.routable(&fx.key, live)
        .map(|e| e.lifecycle().record.instance.to_string())
        .collect()
}

// ---- lifecycle merge outcomes ------------------------------------------------------------

#[test]
fn lifecycle_newer_record_is_applied() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    seed(&mut c, &fx, &[life(&fx, "a", 1, 1, Starting)]);
    let index = c.index();

    let out = c.apply_lifecycle(life(&fx, "a", 1, 2, Ready), &fx.keyring);

    assert_eq!(out, MergeOutcome::Applied);
    assert_eq!(held_life(&c, &fx, "a").record.state, Ready);
    assert_eq!(c.index(), index + 1, "an applied change bumps the index");
    assert_eq!(c.service(&fx.key).unwrap().modify_index, c.index());
    assert_eq!(c.region_head(&fx.region), Revision(2));
    assert_eq!(c.len(), 1);
}

#[test]
fn lifecycle_older_record_is_stale() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    seed(
        &mut c,
        &fx,
        &[life(&fx, "a", 1, 1, Starting), life(&fx, "a", 1, 2, Ready)],
    );
    let before = c.clone();

    let out = c.apply_lifecycle(life(&fx, "a", 1, 1, Starting), &fx.keyring);

    assert_eq!(out, MergeOutcome::Stale);
    assert_eq!(c, before);
    assert_eq!(c.index(), before.index(), "nothing changed, no index bump");
    assert_eq!(c.counters().stale, 1);
}

#[test]
fn lifecycle_identical_record_is_duplicate() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    let rec = life(&fx, "a", 1, 1, Starting);
    seed(&mut c, &fx, std::slice::from_ref(&rec));
    let before = c.clone();

    let out = c.apply_lifecycle(rec, &fx.keyring);

    assert_eq!(out, MergeOutcome::Duplicate);
    assert_eq!(c, before);
    assert_eq!(
        c.counters(),
        &MergeCounters {
            applied: 1,
            duplicate: 1,
            ..MergeCounters::default()
        }
    );
}

#[test]
fn lifecycle_same_marker_different_content_is_a_conflict_and_the_held_record_stays() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    let held = life(&fx, "a", 1, 2, Ready);
    seed(&mut c, &fx, &[life(&fx, "a", 1, 1, Starting), held.clone()]);
    // Same (generation, revision), validly signed, different content: e.g. a second leader.
    let mut rival = held.record.clone();
    rival.state = Draining;
    let rival = Arc::new(fx.authority.sign_lifecycle(rival));

    let out = c.apply_lifecycle(rival, &fx.keyring);

    assert_eq!(out, MergeOutcome::Conflict);
    assert_eq!(&held_life(&c, &fx, "a"), &*held, "held record kept");
    assert_eq!(c.counters().conflict, 1);
    assert_eq!(out.as_label(), "conflict");
}

#[test]
fn lifecycle_signed_by_an_unknown_key_is_refused() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    let rogue = SigningKey::from_seed([0xee; 32]);
    let rec = rogue.sign_lifecycle(fx.lifecycle("a", 1, 1, Starting).record);

    let out = c.apply_lifecycle(Arc::new(rec), &fx.keyring);

    assert_eq!(
        out,
        MergeOutcome::BadSignature(SignatureError::UnknownKey(rogue.id()))
    );
    assert!(c.is_empty());
    assert_eq!(c.counters().bad_signature, 1);
    assert_eq!(
        c.region_head(&fx.region),
        Revision(0),
        "revision not observed"
    );
}

#[test]
fn lifecycle_signed_by_another_regions_authority_is_refused() {
    let fx = Fixture::new();
    let other_region = Region::new("other").unwrap();
    let other_authority = SigningKey::from_seed([0x42; 32]);
    let mut keyring = fx.keyring.clone();
    keyring.trust_authority(other_region.clone(), other_authority.verifying_key());
    let mut c = Catalog::new();

    // A record claiming region `test`, signed by region `other`'s (trusted) authority.
    let cross = other_authority.sign_lifecycle(fx.lifecycle("a", 1, 1, Starting).record);
    let out = c.apply_lifecycle(Arc::new(cross), &keyring);
    assert_eq!(
        out,
        MergeOutcome::BadSignature(SignatureError::UnknownKey(other_authority.id()))
    );

    // And `test`'s authority cannot sign for `other`.
    let mut rec = fx.lifecycle("b", 1, 1, Starting).record;
    rec.region = other_region;
    let out = c.apply_lifecycle(Arc::new(fx.authority.sign_lifecycle(rec)), &keyring);
    assert_eq!(
        out,
        MergeOutcome::BadSignature(SignatureError::UnknownKey(fx.authority.id()))
    );
    assert!(c.is_empty());
}

#[test]
fn lifecycle_tampered_after_signing_is_refused() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    let mut rec = fx.lifecycle("a", 1, 1, Ready);
    rec.record.endpoint.weight = 9_999; // attacker doubles its share of traffic

    let out = c.apply_lifecycle(Arc::new(rec), &fx.keyring);

    assert_eq!(out, MergeOutcome::BadSignature(SignatureError::Invalid));
    assert!(c.is_empty());
}

#[test]
fn empty_keyring_trusts_nothing() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    let out = c.apply_lifecycle(life(&fx, "a", 1, 1, Starting), &Keyring::new());
    assert!(matches!(
        out,
        MergeOutcome::BadSignature(SignatureError::UnknownKey(_))
    ));
}

#[test]
fn catalog_at_its_cap_refuses_new_keys_but_updates_known_ones() {
    let fx = Fixture::new();
    let mut c = Catalog::with_max_entries(1);
    seed(&mut c, &fx, &[life(&fx, "a", 1, 1, Starting)]);

    assert_eq!(
        c.apply_lifecycle(life(&fx, "b", 2, 2, Starting), &fx.keyring),
        MergeOutcome::Full
    );
    assert_eq!(
        c.apply_lifecycle(life(&fx, "a", 1, 3, Ready), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(c.len(), 1);
    assert_eq!(c.counters().full, 1);
}

// ---- health merge outcomes ---------------------------------------------------------------

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
    in_order.apply_lifecycle(life(&fx, "a", 1, 1, Ready), &fx.keyring);
    in_order.apply_health(health(&fx, "a", 0, 1, 1, 1, Failing), &fx.keyring);
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
    c.apply_health(health(&fx, "a", 0, 1, 1, 1, Failing), &fx.keyring);

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
    c.apply_health(health(&fx, "a", 0, 1, 1, 1, Passing), &fx.keyring);

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

// ---- tombstones and garbage collection ---------------------------------------------------

/// `a`: STARTING r1, READY r2, EXPIRED r3; `b`: STARTING r4.
fn with_tombstone(fx: &Fixture) -> (Catalog, Vec<Arc<SignedLifecycle>>) {
    let history = vec![
        life(fx, "a", 1, 1, Starting),
        life(fx, "a", 1, 2, Ready),
        life(fx, "a", 1, 3, Expired),
        life(fx, "b", 2, 4, Starting),
    ];
    let mut c = Catalog::new();
    seed(&mut c, fx, &history);
    (c, history)
}

#[test]
fn collect_garbage_drops_tombstones_up_to_the_horizon_and_raises_the_floor() {
    let fx = Fixture::new();
    let (mut c, _) = with_tombstone(&fx);
    assert_eq!(c.len(), 2);

    assert_eq!(
        c.collect_garbage(&fx.region, Revision(2)),
        0,
        "r3 is above r2"
    );
    assert_eq!(c.gc_floor(&fx.region), Revision(2));
    assert_eq!(c.collect_garbage(&fx.region, Revision(4)), 1);

    assert_eq!(c.len(), 1);
    assert!(c.entry(&fx.key, &inst("a")).is_none());
    assert_eq!(c.gc_floor(&fx.region), Revision(4));
    assert_eq!(c.counters().collected, 1);
    assert_eq!(c.collect_garbage(&fx.region, Revision(4)), 0, "idempotent");
}

#[test]
fn collect_garbage_never_passes_the_contiguous_head() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    // r1 a STARTING, r2 missing, r3 b EXPIRED (seen above a gap)
    seed(&mut c, &fx, &[life(&fx, "a", 1, 1, Starting)]);
    let mut b = fx.lifecycle("b", 2, 3, Expired).record;
    b.reason = shoal_proto::TransitionReason::Deregistered;
    seed(&mut c, &fx, &[Arc::new(fx.authority.sign_lifecycle(b))]);
    assert_eq!(
        c.region_gap(&fx.region),
        Some(Gap {
            epoch: 0,
            from: 2,
            to: 2
        })
    );

    assert_eq!(c.collect_garbage(&fx.region, Revision(100)), 0);
    assert_eq!(
        c.gc_floor(&fx.region),
        Revision(1),
        "clamped to the contiguous head"
    );
    assert!(c.entry(&fx.key, &inst("b")).is_some());
}

#[test]
fn a_collected_member_is_not_revived_by_an_old_record() {
    let fx = Fixture::new();
    let (mut c, history) = with_tombstone(&fx);
    // A peer that has not collected yet still holds the whole history.
    let peer = c.clone();
    assert_eq!(c.collect_garbage(&fx.region, Revision(4)), 1);

    for old in &history[..3] {
        assert_eq!(
            c.apply_lifecycle(old.clone(), &fx.keyring),
            MergeOutcome::Stale,
            "revision {} of a collected instance",
            old.record.revision
        );
    }
    assert!(c.entry(&fx.key, &inst("a")).is_none());

    // Anti-entropy with the peer that still has the tombstone does not bring it back either.
    let mut lagging = Catalog::new();
    seed(&mut lagging, &fx, &history[..2]); // knows `a` only as READY r2
    let out = c.merge_catalog(&lagging, &fx.keyring);
    assert_eq!((out.applied, out.rejected), (0, 0));
    let out = c.merge_catalog(&peer, &fx.keyring);
    assert_eq!((out.applied, out.rejected), (0, 0));
    assert!(c.entry(&fx.key, &inst("a")).is_none());
    assert!(routable_ids(&c, &fx, &AllAlive).is_empty());

    // A new generation of the same instance id is a new admission and is accepted.
    assert_eq!(
        c.apply_lifecycle(life(&fx, "a", 3, 5, Starting), &fx.keyring),
        MergeOutcome::Applied
    );
}

// ---- deltas and heads --------------------------------------------------------------------

/// Five instances `i0..i4` at revisions 1..=5, then `i0` READY at 6 (superseding r1).
fn six_revisions(fx: &Fixture) -> Catalog {
    let mut c = Catalog::new();
    for r in 1..=5u64 {
        seed(
            &mut c,
            fx,
            &[life(fx, &format!("i{}", r - 1), r, r, Starting)],
        );
    }
    seed(&mut c, fx, &[life(fx, "i0", 1, 6, Ready)]);
    c
}

fn revisions(records: &[Arc<SignedLifecycle>]) -> Vec<u64> {
    records.iter().map(|r| r.record.revision.0).collect()
}

#[test]
fn lifecycle_delta_holds_every_current_record_above_the_asked_revision() {
    let fx = Fixture::new();
    let c = six_revisions(&fx);

    let d = c.lifecycle_delta(&fx.region, Revision(0), 100).unwrap();
    assert_eq!(
        revisions(&d.records),
        [2, 3, 4, 5, 6],
        "r1 was superseded by r6"
    );
    assert_eq!((d.from, d.complete_to), (Revision(0), Revision(6)));

    let d = c.lifecycle_delta(&fx.region, Revision(4), 100).unwrap();
    assert_eq!(revisions(&d.records), [5, 6]);
    assert_eq!(d.complete_to, Revision(6));

    let d = c.lifecycle_delta(&fx.region, Revision(6), 100).unwrap();
    assert!(d.records.is_empty());
    assert_eq!(d.complete_to, Revision(6));

    let unknown = Region::new("nowhere").unwrap();
    let d = c.lifecycle_delta(&unknown, Revision(3), 100).unwrap();
    assert!(d.records.is_empty());
    assert_eq!(
        d.complete_to,
        Revision(3),
        "claims nothing it does not have"
    );
}

#[test]
fn a_truncated_lifecycle_delta_claims_completeness_only_up_to_what_it_carries() {
    let fx = Fixture::new();
    let c = six_revisions(&fx);

    let d = c.lifecycle_delta(&fx.region, Revision(0), 2).unwrap();
    assert_eq!(revisions(&d.records), [2, 3]);
    assert_eq!(d.complete_to, Revision(3), "r4 is not carried");

    let d = c.lifecycle_delta(&fx.region, Revision(0), 0).unwrap();
    assert!(d.records.is_empty());
    assert_eq!(
        d.complete_to,
        Revision(1),
        "r1 is accounted for (superseded)"
    );

    // Paging with the claimed bound reaches the head and rebuilds the same catalog.
    let mut rx = Catalog::new();
    let mut since = Revision(0);
    loop {
        let d = c.lifecycle_delta(&fx.region, since, 2).unwrap();
        let out = rx.apply_lifecycle_delta(&d, &fx.keyring);
        assert_eq!(out.rejected, 0);
        if d.complete_to == since {
            break;
        }
        since = d.complete_to;
    }
    assert_eq!(rx.region_head(&fx.region), Revision(6));
    assert_eq!(rx, c);
}

#[test]
fn lifecycle_delta_below_the_gc_floor_is_compacted() {
    let fx = Fixture::new();
    let (mut c, _) = with_tombstone(&fx);
    c.collect_garbage(&fx.region, Revision(3));

    assert_eq!(
        c.lifecycle_delta(&fx.region, Revision(2), 100),
        Err(DeltaError::Compacted {
            since: Revision(2),
            gc_floor: Revision(3)
        })
    );
    let d = c.lifecycle_delta(&fx.region, Revision(3), 100).unwrap();
    assert_eq!(revisions(&d.records), [4]);
}

#[test]
fn applying_a_delta_closes_a_revision_gap() {
    let fx = Fixture::new();
    let c = six_revisions(&fx);
    let mut rx = Catalog::new();
    seed(&mut rx, &fx, &[life(&fx, "i1", 2, 2, Starting)]);
    seed(&mut rx, &fx, &[life(&fx, "i3", 4, 4, Starting)]);
    assert_eq!(
        rx.region_gap(&fx.region),
        Some(Gap {
            epoch: 0,
            from: 1,
            to: 1
        })
    );
    assert_eq!(rx.gaps().len(), 1);

    let d = c
        .lifecycle_delta(&fx.region, rx.region_head(&fx.region), 100)
        .unwrap();
    // r1 itself is not carried: it was superseded by r6. Only the sender's completeness claim
    // can account for it, so this is the claim (not the records) closing the gap.
    assert_eq!(revisions(&d.records), [2, 3, 4, 5, 6]);
    let out = rx.apply_lifecycle_delta(&d, &fx.keyring);

    assert_eq!((out.applied, out.ignored, out.rejected), (3, 2, 0));
    assert!(out.head_advanced);
    assert_eq!(rx.region_gap(&fx.region), None);
    assert_eq!(rx.region_head(&fx.region), Revision(6));
    assert!(rx.gaps().is_empty());
    assert_eq!(rx, c);
}

#[test]
fn a_gap_closed_by_the_delta_records_alone_does_not_count_as_the_claim_advancing() {
    let fx = Fixture::new();
    let c = six_revisions(&fx);
    let mut rx = Catalog::new();
    seed(&mut rx, &fx, &[life(&fx, "i0", 1, 1, Starting)]);
    seed(&mut rx, &fx, &[life(&fx, "i3", 4, 4, Starting)]);
    assert_eq!(
        rx.region_gap(&fx.region).map(|g| (g.from, g.to)),
        Some((2, 3))
    );

    let d = c.lifecycle_delta(&fx.region, Revision(1), 100).unwrap();
    let out = rx.apply_lifecycle_delta(&d, &fx.keyring);

    // `head_advanced` reports the completeness claim only; here every revision arrived as a
    // record, so the head moved by observation.
    assert!(!out.head_advanced);
    assert_eq!(rx.region_gap(&fx.region), None);
    assert_eq!(rx.region_head(&fx.region), Revision(6));
    assert_eq!(rx, c);
}

#[test]
fn a_delta_with_a_bad_record_does_not_advance_the_head() {
    let fx = Fixture::new();
    let c = six_revisions(&fx);
    let mut d = c.lifecycle_delta(&fx.region, Revision(0), 100).unwrap();
    let mut bad = (*d.records[1]).clone();
    bad.record.endpoint.weight += 1;
    d.records[1] = Arc::new(bad);

    let mut rx = Catalog::new();
    let out = rx.apply_lifecycle_delta(&d, &fx.keyring);

    assert_eq!(out.rejected, 1);
    assert!(!out.head_advanced);
    assert!(rx.region_head(&fx.region) < Revision(6));
}

#[test]
fn health_delta_follows_the_owner_into_a_new_boot() {
    let fx = Fixture::new();
    let mut tx = Catalog::new();
    seed(
        &mut tx,
        &fx,
        &[life(&fx, "a", 1, 1, Ready), life(&fx, "b", 2, 2, Ready)],
    );
    let boot1 = [
        health(&fx, "a", 0, 1, 1, 1, Passing),
        health(&fx, "b", 0, 2, 1, 2, Passing),
        health(&fx, "a", 0, 1, 1, 3, Failing),
    ];
    for h in &boot1 {
        assert_eq!(
            tx.apply_health(h.clone(), &fx.keyring),
            MergeOutcome::Applied
        );
    }
    let mut rx = tx.clone();
    let node0 = fx.nodes[0].0.clone();

    // The owner agent restarts (boot 2): its sequence starts again at 1.
    let reboot = health(&fx, "b", 0, 2, 2, 1, Failing);
    assert_eq!(
        tx.apply_health(reboot.clone(), &fx.keyring),
        MergeOutcome::Applied
    );

    let d = tx.health_delta(&node0, Generation(1), HealthSeq(3), 100);
    assert_eq!(d.boot, Generation(2));
    assert_eq!((d.from, d.complete_to), (HealthSeq(0), HealthSeq(1)));
    assert_eq!(d.records, vec![reboot]);

    let out = rx.apply_health_delta(&d, &fx.keyring);
    assert_eq!((out.applied, out.rejected), (1, 0));
    let head = &rx.heads().owners[0];
    assert_eq!((head.boot, head.contiguous), (Generation(2), HealthSeq(1)));
    assert_eq!(
        rx.entry(&fx.key, &inst("b"))
            .unwrap()
            .health()
            .unwrap()
            .record
            .status,
        Failing
    );
    assert_eq!(rx, tx);

    // A truncated health delta claims only what it carries.
    let d = tx.health_delta(&node0, Generation(0), HealthSeq(0), 0);
    assert_eq!((d.boot, d.complete_to), (Generation(2), HealthSeq(0)));
}

#[test]
fn health_delta_of_an_unknown_owner_is_empty() {
    let fx = Fixture::new();
    let c = Catalog::new();
    let d = c.health_delta(&fx.nodes[5].0, Generation(3), HealthSeq(7), 10);
    assert!(d.records.is_empty());
    assert_eq!(
        (d.boot, d.from, d.complete_to),
        (Generation(3), HealthSeq(7), HealthSeq(7))
    );
}

#[test]
fn heads_report_every_origin() {
    let fx = Fixture::new();
    let (mut c, _) = with_tombstone(&fx);
    c.apply_health(health(&fx, "b", 0, 2, 1, 1, Passing), &fx.keyring);
    c.collect_garbage(&fx.region, Revision(3));

    let heads = c.heads();
    assert_eq!(
        heads.regions,
        vec![RegionHead {
            region: fx.region.clone(),
            contiguous: Revision(4),
            max_seen: Revision(4),
            gc_floor: Revision(3),
            pending_hash: 0,
        }]
    );
    assert_eq!(heads.owners.len(), 1);
    assert_eq!(heads.owners[0].owner, fx.nodes[0].0);
}

// ---- views -------------------------------------------------------------------------------

#[test]
fn routable_means_ready_and_passing_and_owner_up_and_not_ejected() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    let specs: [(&str, usize, LifecycleState, Option<HealthStatus>); 7] = [
        ("ready", 0, Ready, None),
        ("passing", 0, Ready, Some(Passing)),
        ("failing", 0, Ready, Some(Failing)),
        ("starting", 0, Starting, Some(Passing)),
        ("draining", 0, Draining, Some(Passing)),
        ("owner-down", 1, Ready, Some(Passing)),
        ("ejected", 2, Ready, Some(Passing)),
    ];
    for (i, (name, owner, state, h)) in specs.iter().enumerate() {
        let g = i as u64 + 1;
        let rec = fx.lifecycle_for(&fx.key, name, *owner, g, g, *state);
        seed(&mut c, &fx, &[Arc::new(rec)]);
        if let Some(status) = h {
            c.apply_health(health(&fx, name, *owner, g, 1, g, *status), &fx.keyring);
        }
    }
    seed(&mut c, &fx, &[life(&fx, "expired", 99, 8, Expired)]);
    let mut net = Net::default();
    net.down.insert(fx.nodes[1].0.clone());
    net.ejected.insert((inst("ejected"), Generation(7)));

    let mut routable = routable_ids(&c, &fx, &net);
    routable.sort();
    assert_eq!(routable, ["passing", "ready"]);

    let view = c.view(&fx.key, &net);
    assert_eq!(view.catalog_index, c.index());
    assert_eq!(view.modify_index, c.service(&fx.key).unwrap().modify_index);
    let states: Vec<(String, EndpointState, bool)> = view
        .endpoints
        .iter()
        .map(|e| (e.instance.to_string(), e.state, e.routable))
        .collect();
    let expect = |s: &str, st, r| (s.to_string(), st, r);
    assert_eq!(
        states,
        vec![
            expect("draining", EndpointState::Draining, false),
            expect("ejected", EndpointState::Ready, false),
            expect("failing", EndpointState::Unhealthy, false),
            expect("owner-down", EndpointState::Unhealthy, false),
            expect("passing", EndpointState::Ready, true),
            expect("ready", EndpointState::Ready, true),
            expect("starting", EndpointState::Starting, false),
        ],
        "sorted by instance id, tombstone left out"
    );
    let ejected = view
        .endpoints
        .iter()
        .find(|e| e.instance == inst("ejected"))
        .unwrap();
    assert!(ejected.ejected && !ejected.owner_down);
    let down = view
        .endpoints
        .iter()
        .find(|e| e.instance == inst("owner-down"))
        .unwrap();
    assert!(down.owner_down && down.health == Some(Passing));

    // Everything alive: only the ejection and the lifecycle/health rules remain.
    assert_eq!(routable_ids(&c, &fx, &AllAlive).len(), 4);
    // A closure is a Liveness too (node down only).
    let node1_down = |n: &NodeId| *n == fx.nodes[1].0;
    assert_eq!(routable_ids(&c, &fx, &node1_down).len(), 3);
}

#[test]
fn endpoint_state_names_round_trip() {
    for st in [
        EndpointState::Starting,
        EndpointState::Ready,
        EndpointState::Draining,
        EndpointState::Unhealthy,
        EndpointState::Expired,
    ] {
        assert_eq!(EndpointState::parse(st.as_str()), Some(st));
        assert_eq!(EndpointState::parse(&st.as_str().to_lowercase()), Some(st));
    }
    assert_eq!(EndpointState::parse("GONE"), None);
}

/// Builds a READY entry with a chosen region, zone and weight (signed by the region's key).
fn placed(
    authority: &SigningKey,
    fx: &Fixture,
    name: &str,
    region: &str,
    zone: &str,
    weight: u32,
    revision: u64,
) -> Arc<SignedLifecycle> {
    let mut rec = fx.lifecycle(name, revision, revision, Ready).record;
    rec.region = Region::new(region).unwrap();
    rec.endpoint.zone = shoal_proto::Zone::new(zone).unwrap();
    rec.endpoint.weight = weight;
    Arc::new(authority.sign_lifecycle(rec))
}

#[test]
fn pick_prefers_the_zone_then_the_region_and_never_crosses_regions_unasked() {
    let fx = Fixture::new();
    let far_key = SigningKey::from_seed([9; 32]);
    let mut keyring = fx.keyring.clone();
    keyring.trust_authority(Region::new("far").unwrap(), far_key.verifying_key());
    let a = &fx.authority;
    let mut c = Catalog::new();
    for rec in [
        placed(a, &fx, "z1-a", "test", "zone-1", 100, 1),
        placed(a, &fx, "z1-b", "test", "zone-1", 300, 2),
        placed(a, &fx, "z2-a", "test", "zone-2", 100, 3),
        placed(&far_key, &fx, "far-a", "far", "far-1", 100, 1),
    ] {
        assert_eq!(c.apply_lifecycle(rec, &keyring), MergeOutcome::Applied);
    }
    let me = (
        Region::new("test").unwrap(),
        shoal_proto::Zone::new("zone-1").unwrap(),
    );
    let pick = |exclude: &[&str], allow: bool, r: u64| -> Option<String> {
        let cands = c
            .routable(&fx.key, &AllAlive)
            .filter(|e| !exclude.contains(&e.lifecycle().record.instance.as_str()));
        view::pick(cands, &me.0, &me.1, allow, r).map(|e| e.lifecycle().record.instance.to_string())
    };

    // Same zone first, weighted 100:300 in instance-id order.
    assert_eq!(pick(&[], false, 0).as_deref(), Some("z1-a"));
    assert_eq!(pick(&[], false, 99).as_deref(), Some("z1-a"));
    assert_eq!(pick(&[], false, 100).as_deref(), Some("z1-b"));
    assert_eq!(pick(&[], false, 399).as_deref(), Some("z1-b"));
    assert_eq!(
        pick(&[], false, 400).as_deref(),
        Some("z1-a"),
        "r wraps modulo 400"
    );
    let share_b = (0..4_000u64)
        .filter(|r| pick(&[], false, *r).as_deref() == Some("z1-b"))
        .count();
    assert_eq!(share_b, 3_000);
    // Then the same region.
    assert_eq!(pick(&["z1-a", "z1-b"], false, 7).as_deref(), Some("z2-a"));
    // Never another region without policy: "no backend".
    assert_eq!(pick(&["z1-a", "z1-b", "z2-a"], false, 7), None);
    assert_eq!(
        pick(&["z1-a", "z1-b", "z2-a"], true, 7).as_deref(),
        Some("far-a")
    );
    // Allowing other regions does not make them preferred.
    assert_eq!(pick(&["z1-a", "z1-b"], true, 7).as_deref(), Some("z2-a"));
    assert_eq!(view::pick(std::iter::empty(), &me.0, &me.1, true, 1), None);
}

#[test]
fn locality_tiers() {
    let r = |s: &str| Region::new(s).unwrap();
    let z = |s: &str| shoal_proto::Zone::new(s).unwrap();
    assert_eq!(view::locality_tier(&r("a"), &z("a1"), &r("a"), &z("a1")), 0);
    assert_eq!(view::locality_tier(&r("a"), &z("a2"), &r("a"), &z("a1")), 1);
    assert_eq!(view::locality_tier(&r("b"), &z("a1"), &r("a"), &z("a1")), 2);
}

// ---- the lifecycle transition table ------------------------------------------------------

#[test]
fn check_transition_accepts_exactly_the_table() {
    use shoal_catalog::check_transition;
    use shoal_proto::TransitionReason::{self, *};
    let states = [Starting, Ready, Draining, Expired];
    let reasons = [
        Registered,
        ReadinessPassed,
        DrainRequested,
        DrainCancelled,
        Deregistered,
        LeaseExpired,
        ReadinessFailed,
        ReadinessRecovered,
        LivenessFailed,
        NodeKeyChanged,
        NodeRevoked,
    ];
    // Written out independently of LEGAL_TRANSITIONS.
    let legal: Vec<(Option<LifecycleState>, LifecycleState, TransitionReason)> = vec![
        (None, Starting, Registered),
        (Some(Starting), Ready, ReadinessPassed),
        (Some(Starting), Draining, DrainRequested),
        (Some(Starting), Expired, Deregistered),
        (Some(Starting), Expired, LeaseExpired),
        (Some(Ready), Draining, DrainRequested),
        (Some(Ready), Expired, Deregistered),
        (Some(Ready), Expired, LeaseExpired),
        (Some(Draining), Ready, DrainCancelled),
        (Some(Draining), Expired, Deregistered),
        (Some(Draining), Expired, LeaseExpired),
        (Some(Starting), Starting, NodeKeyChanged),
        (Some(Ready), Ready, NodeKeyChanged),
        (Some(Draining), Draining, NodeKeyChanged),
        (Some(Starting), Expired, NodeRevoked),
        (Some(Ready), Expired, NodeRevoked),
        (Some(Draining), Expired, NodeRevoked),
    ];

    let mut accepted = 0;
    for from in std::iter::once(None).chain(states.iter().copied().map(Some)) {
        for to in states {
            for reason in reasons {
                let got = check_transition(from, to, reason);
                if legal.contains(&(from, to, reason)) {
                    assert_eq!(got, Ok(()), "{from:?} -> {to:?} ({reason:?})");
                    accepted += 1;
                } else {
                    let err = got.expect_err("must be illegal");
                    assert_eq!((err.from, err.to, err.reason), (from, to, reason));
                }
            }
        }
    }
    assert_eq!(accepted, legal.len());
    assert_eq!(
        shoal_catalog::lifecycle::LEGAL_TRANSITIONS.len(),
        legal.len()
    );
}

/// Two different instances signed under one revision: the second is a conflict, not a second
/// truth, and deltas stay complete.
#[test]
fn a_revision_reused_for_another_instance_is_a_conflict() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    let a = fx.lifecycle("a", 1, 1, LifecycleState::Ready);
    let b = fx.lifecycle("b", 2, 1, LifecycleState::Ready);
    assert_eq!(
        c.apply_lifecycle(Arc::new(a), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        c.apply_lifecycle(Arc::new(b), &fx.keyring),
        MergeOutcome::Conflict
    );
    assert_eq!(c.counters().conflict, 1);
    let delta = c.lifecycle_delta(&fx.region, Revision(0), 100).unwrap();
    assert_eq!(delta.records.len(), 1);
    assert_eq!(delta.records[0].record.instance.as_str(), "a");
}

/// A revision the receiver can never get as a record (superseded before it saw it) is
/// accounted for through the sender's `also_seen`, so the receiver's gap closes (the
/// post-partition case). Without `also_seen` the gap at 2 would stay open for ever.
#[test]
fn also_seen_closes_a_gap_of_a_superseded_revision() {
    let fx = Fixture::new();
    // rev 1: b READY, rev 2: a STARTING, rev 3: c READY, rev 4: a READY (supersedes 2).
    let b1 = Arc::new(fx.lifecycle("b", 1, 1, Ready));
    let a2 = Arc::new(fx.lifecycle("a", 2, 2, Starting));
    let c3 = Arc::new(fx.lifecycle("c", 3, 3, Ready));
    let a4 = Arc::new(fx.lifecycle("a", 2, 4, Ready));
    // Q saw 2 and 4 only; P saw 1 and 3 only.
    let mut q = Catalog::new();
    q.apply_lifecycle(a2, &fx.keyring);
    q.apply_lifecycle(a4, &fx.keyring);
    let mut p = Catalog::new();
    p.apply_lifecycle(b1, &fx.keyring);
    p.apply_lifecycle(c3, &fx.keyring);
    assert_eq!(p.region_head(&fx.region), Revision(1));
    let d = q.lifecycle_delta(&fx.region, Revision(1), 100).unwrap();
    assert_eq!(d.records.len(), 1, "only a@4 is still held");
    assert_eq!(d.also_seen, vec![Revision(2), Revision(4)]);
    p.apply_lifecycle_delta(&d, &fx.keyring);
    assert_eq!(p.region_gap(&fx.region), None);
    assert_eq!(p.region_head(&fx.region), Revision(4));
    // The same delta without its also_seen leaves the gap at 2 open.
    let mut p2 = Catalog::new();
    p2.apply_lifecycle(Arc::new(fx.lifecycle("b", 1, 1, Ready)), &fx.keyring);
    p2.apply_lifecycle(Arc::new(fx.lifecycle("c", 3, 3, Ready)), &fx.keyring);
    let mut bare = d.clone();
    bare.also_seen.clear();
    p2.apply_lifecycle_delta(&bare, &fx.keyring);
    assert_eq!(
        p2.region_gap(&fx.region).map(|g| (g.from, g.to)),
        Some((2, 2))
    );
}

#[test]
fn share_equal_maps_swaps_only_equal_maps_and_changes_nothing_visible() {
    let fx = Fixture::new();
    let (a1, a2) = (life(&fx, "a", 1, 1, Ready), life(&fx, "b", 1, 2, Ready));
    let mut x = Catalog::new();
    let mut y = Catalog::new();
    seed(&mut x, &fx, &[a1.clone(), a2.clone()]);
    seed(&mut y, &fx, &[a1, a2]);
    let before = x.clone();
    assert!(!x.shares_entries_with(&y));
    // Equal instance map, revision index and node keys: all swapped; contents unchanged.
    assert_eq!(x.share_equal_maps(&y), 3);
    assert_eq!(x, before);
    assert_eq!(x.share_equal_maps(&y), 0, "already shared");
    // y moves on: nothing of x may change.
    seed(&mut y, &fx, &[life(&fx, "a", 1, 3, Draining)]);
    assert_eq!(x.share_equal_maps(&y), 0);
    assert_eq!(x, before);
    assert_eq!(held_life(&x, &fx, "a").record.state, Ready);
}

#[test]
fn share_equal_maps_matches_services_present_in_both_catalogs_only() {
    let fx = Fixture::new();
    let rec = |svc: &str, rev: u64, state| {
        let key: ServiceKey = format!("prod/{svc}/http").parse().unwrap();
        Arc::new(fx.lifecycle_for(&key, "i", 0, 1, rev, state))
    };
    let mut x = Catalog::new();
    let mut y = Catalog::new();
    // x: s1 s2 s3 s5; y: s0 s1 s3 s4 s5, with s5 different. Equal in both: s1 and s3.
    seed(
        &mut x,
        &fx,
        &[
            rec("s1", 1, Ready),
            rec("s2", 2, Ready),
            rec("s3", 3, Ready),
        ],
    );
    seed(&mut x, &fx, &[rec("s5", 5, Ready)]);
    seed(
        &mut y,
        &fx,
        &[
            rec("s0", 6, Ready),
            rec("s1", 1, Ready),
            rec("s3", 3, Ready),
        ],
    );
    seed(&mut y, &fx, &[rec("s4", 4, Ready), rec("s5", 7, Draining)]);
    let before = x.clone();
    // s1, s3 and the node keys (both learnt node-0's key at revision 1).
    assert_eq!(x.share_equal_maps(&y), 3);
    assert_eq!(x, before);
    assert_eq!(x.share_equal_maps(&y), 0, "already shared");
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

    tx.apply_lifecycle(life(&fx, "a", 1, 1, Ready), &fx.keyring);
    assert!(tx.entry(&fx.key, &inst("a")).unwrap().health().is_some());
    let d = tx.health_delta(&node0, Generation(1), HealthSeq(0), 100);
    assert_eq!((d.complete_to, d.records), (HealthSeq(1), vec![early]));
}
