//! Tombstones and garbage collection: the horizon, the floor, no revival.

use crate::support::*;

/// `a`: STARTING r1, READY r2, EXPIRED r3; `b`: STARTING r4.
pub(crate) fn with_tombstone(fx: &Fixture) -> (Catalog, Vec<Arc<SignedLifecycle>>) {
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
