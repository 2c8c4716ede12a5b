//! Deltas and heads: what a delta carries, compaction, gaps, per-owner health deltas.

use crate::gc::with_tombstone;
use crate::support::*;

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
    assert_eq!(
        c.apply_health(health(&fx, "b", 0, 2, 1, 1, Passing), &fx.keyring),
        MergeOutcome::Applied
    );
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
    assert_eq!(q.apply_lifecycle(a2, &fx.keyring), MergeOutcome::Applied);
    assert_eq!(q.apply_lifecycle(a4, &fx.keyring), MergeOutcome::Applied);
    let mut p = Catalog::new();
    assert_eq!(p.apply_lifecycle(b1, &fx.keyring), MergeOutcome::Applied);
    assert_eq!(p.apply_lifecycle(c3, &fx.keyring), MergeOutcome::Applied);
    assert_eq!(p.region_head(&fx.region), Revision(1));
    let d = q.lifecycle_delta(&fx.region, Revision(1), 100).unwrap();
    assert_eq!(d.records.len(), 1, "only a@4 is still held");
    assert_eq!(d.also_seen, vec![Revision(2), Revision(4)]);
    p.apply_lifecycle_delta(&d, &fx.keyring);
    assert_eq!(p.region_gap(&fx.region), None);
    assert_eq!(p.region_head(&fx.region), Revision(4));
    // The same delta without its also_seen leaves the gap at 2 open.
    let mut p2 = Catalog::new();
    assert_eq!(
        p2.apply_lifecycle(Arc::new(fx.lifecycle("b", 1, 1, Ready)), &fx.keyring),
        MergeOutcome::Applied
    );
    assert_eq!(
        p2.apply_lifecycle(Arc::new(fx.lifecycle("c", 3, 3, Ready)), &fx.keyring),
        MergeOutcome::Applied
    );
    let mut bare = d.clone();
    bare.also_seen.clear();
    p2.apply_lifecycle_delta(&bare, &fx.keyring);
    assert_eq!(
        p2.region_gap(&fx.region).map(|g| (g.from, g.to)),
        Some((2, 2))
    );
}
