//! Sharing equal maps between catalogs (simulator memory): nothing visible changes.

use crate::support::*;

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
