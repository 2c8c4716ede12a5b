//! Lifecycle records in: applied, stale, duplicate, conflict, refused signatures, the cap.

use crate::support::*;

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
fn an_applied_record_tells_the_state_it_replaced() {
    let fx = Fixture::new();
    let mut c = Catalog::new();

    let first = c.apply_lifecycle_replacing(life(&fx, "a", 1, 1, Starting), &fx.keyring);
    assert_eq!(first, (MergeOutcome::Applied, None), "nothing was held");
    let ready = c.apply_lifecycle_replacing(life(&fx, "a", 1, 2, Ready), &fx.keyring);
    assert_eq!(ready, (MergeOutcome::Applied, Some(Starting)));
    let expired = life(&fx, "a", 1, 3, Expired);
    let out = c.apply_lifecycle_replacing(expired.clone(), &fx.keyring);
    assert_eq!(out, (MergeOutcome::Applied, Some(Ready)));
    // Not applied: nothing is told, whatever is held.
    let again = c.apply_lifecycle_replacing(expired, &fx.keyring);
    assert_eq!(again, (MergeOutcome::Duplicate, None));
    let stale = c.apply_lifecycle_replacing(life(&fx, "a", 1, 2, Ready), &fx.keyring);
    assert_eq!(stale, (MergeOutcome::Stale, None));
    assert_eq!(c.counters().applied, 3, "counted like apply_lifecycle");
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
