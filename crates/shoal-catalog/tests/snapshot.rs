//! Snapshot encode/decode/install (invariant 7, docs/invariants.md: a torn, truncated or
//! checksum-failing snapshot is never loaded, and replacement is atomic).
//!
//! Every corruption test asserts the *specific* `SnapshotError`; the property test at the end
//! cuts and mutates a valid encoding at random positions and checks that decode never panics and
//! never returns anything but an error or (for a no-op mutation) the original.

use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use shoal_catalog::snapshot::{
    self, SNAPSHOT_FORMAT_VERSION, SNAPSHOT_HEADER_BYTES, SNAPSHOT_MAGIC,
};
use shoal_catalog::testkit::Fixture;
use shoal_catalog::view::AllAlive;
use shoal_catalog::{Catalog, Keyring, MergeOutcome, Snapshot, SnapshotError, SnapshotScope};
use shoal_proto::{
    HealthStatus, InstanceId, LifecycleState, Revision, ServiceKey, SignatureError, SignedLifecycle,
};

use LifecycleState::{Draining, Expired, Ready, Starting};

fn other_key() -> ServiceKey {
    "prod/billing/grpc".parse().unwrap()
}

/// Two services, a tombstone, health records, one collected instance. Gap-free.
fn catalog(fx: &Fixture) -> Catalog {
    let billing = other_key();
    let recs = [
        fx.lifecycle_for(&fx.key, "a", 0, 1, 1, Starting),
        fx.lifecycle_for(&fx.key, "a", 0, 1, 2, Ready),
        fx.lifecycle_for(&fx.key, "b", 1, 3, 3, Ready),
        fx.lifecycle_for(&billing, "x", 2, 4, 4, Ready),
        fx.lifecycle_for(&fx.key, "gone", 0, 5, 5, Starting),
        fx.lifecycle_for(&fx.key, "gone", 0, 5, 6, Expired),
        fx.lifecycle_for(&billing, "y", 2, 7, 7, Draining),
        fx.lifecycle_for(&fx.key, "dead", 0, 8, 8, Expired),
    ];
    let mut c = Catalog::new();
    for r in recs {
        assert_eq!(
            c.apply_lifecycle(Arc::new(r), &fx.keyring),
            MergeOutcome::Applied
        );
    }
    for h in [
        fx.health("a", 0, 1, 1, 1, HealthStatus::Passing),
        fx.health("b", 1, 3, 1, 1, HealthStatus::Failing),
    ] {
        assert_eq!(
            c.apply_health(Arc::new(h), &fx.keyring),
            MergeOutcome::Applied
        );
    }
    assert_eq!(
        c.collect_garbage(&fx.region, Revision(6)),
        1,
        "`gone` collected"
    );
    c
}

fn encoded(fx: &Fixture) -> (Snapshot, Vec<u8>) {
    let snap = Snapshot::of(&catalog(fx), SnapshotScope::Catalog, fx.region.clone());
    let bytes = snapshot::encode(&snap);
    (snap, bytes)
}

/// Rewrites the body and fixes length, count and checksum so only the intended fault remains.
fn reframe(body: &[u8], revision: u64, count: u32) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&SNAPSHOT_MAGIC);
    out.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&revision.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

// ---- round trips -------------------------------------------------------------------------

#[test]
fn catalog_snapshot_round_trips_and_installs_into_an_equal_catalog() {
    let fx = Fixture::new();
    let original = catalog(&fx);
    let snap = Snapshot::of(&original, SnapshotScope::Catalog, fx.region.clone());
    assert_eq!(snap.revision, Revision(8));
    assert_eq!(
        snap.lifecycle.len(),
        5,
        "tombstone `dead` kept, `gone` collected"
    );
    assert_eq!(snap.health.len(), 2);

    let bytes = snapshot::encode(&snap);
    assert_eq!(&bytes[..4], b"SHSN");
    let back = snapshot::decode(&bytes, &fx.keyring).unwrap();
    assert_eq!(back, snap);

    let mut fresh = Catalog::new();
    let out = fresh.install(&back, &fx.keyring);
    assert_eq!((out.applied, out.rejected), (7, 0));
    assert_eq!(fresh, original);
    assert_eq!(fresh.gc_floor(&fx.region), Revision(6));
    // and the GC floor came along: the collected instance cannot be revived afterwards
    let old = fx.lifecycle("gone", 5, 5, Starting);
    assert_eq!(
        fresh.apply_lifecycle(Arc::new(old), &fx.keyring),
        MergeOutcome::Stale
    );
}

#[test]
fn service_snapshot_holds_one_service_and_round_trips() {
    let fx = Fixture::new();
    let c = catalog(&fx);
    let scope = SnapshotScope::Service(other_key());
    let snap = Snapshot::of(&c, scope.clone(), fx.region.clone());
    assert_eq!(snap.lifecycle.len(), 2);
    assert!(snap.lifecycle.iter().all(|r| r.record.key == other_key()));
    assert!(snap.health.is_empty());

    let back = snapshot::decode(&snapshot::encode(&snap), &fx.keyring).unwrap();
    assert_eq!(back, snap);
    assert!(back.scope.contains(&other_key()));
    assert!(!back.scope.contains(&fx.key));
}

#[test]
fn service_snapshot_with_a_record_outside_its_scope_is_inconsistent() {
    let fx = Fixture::new();
    let c = catalog(&fx);
    let mut snap = Snapshot::of(&c, SnapshotScope::Service(other_key()), fx.region.clone());
    snap.lifecycle
        .push(Arc::new(fx.lifecycle("intruder", 20, 20, Ready)));
    let err = snapshot::decode(&snapshot::encode(&snap), &fx.keyring).unwrap_err();
    assert!(
        matches!(&err, SnapshotError::Inconsistent(m) if m.contains("outside the snapshot scope")),
        "{err:?}"
    );
}

// ---- install -----------------------------------------------------------------------------

#[test]
fn install_replaces_the_scope_and_keeps_newer_local_records() {
    let fx = Fixture::new();
    // The snapshot writer's catalog, complete to r8.
    let writer = catalog(&fx);
    let snap = Snapshot::of(
        &writer,
        SnapshotScope::Service(fx.key.clone()),
        fx.region.clone(),
    );

    // The local catalog: has `gone` as READY (the writer collected it since), has `a` only as
    // STARTING (the writer has READY), and has a newer `c` the writer has not seen (r9).
    let mut local = Catalog::new();
    for r in [
        fx.lifecycle("a", 1, 1, Starting),
        fx.lifecycle("gone", 5, 5, Starting),
        fx.lifecycle("c", 9, 9, Ready),
    ] {
        assert_eq!(
            local.apply_lifecycle(Arc::new(r), &fx.keyring),
            shoal_catalog::MergeOutcome::Applied
        );
    }
    let billing_before = local.service(&other_key()).cloned();

    let out = local.install(&snap, &fx.keyring);
    assert_eq!(out.rejected, 0);

    let held: Vec<(String, LifecycleState)> = local
        .service(&fx.key)
        .unwrap()
        .instances
        .iter()
        .map(|(i, e)| (i.to_string(), e.lifecycle().record.state))
        .collect();
    let s = |n: &str, st| (n.to_string(), st);
    assert_eq!(
        held,
        vec![
            s("a", Ready),
            s("b", Ready),
            s("c", Ready),
            s("dead", Expired)
        ],
        "`gone` dropped (collected by the writer), `c` kept (newer than the snapshot)"
    );
    assert_eq!(
        local.service(&other_key()).cloned(),
        billing_before,
        "out of scope"
    );
    let routable: Vec<String> = local
        .routable(&fx.key, &AllAlive)
        .map(|e| e.lifecycle().record.instance.to_string())
        .collect();
    assert_eq!(
        routable,
        ["a", "c"],
        "b's health (failing) came with the snapshot"
    );
}

#[test]
fn a_refused_snapshot_leaves_the_catalog_untouched() {
    let fx = Fixture::new();
    let (_, mut bytes) = encoded(&fx);
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    let mut local = Catalog::new();
    assert_eq!(
        local.apply_lifecycle(Arc::new(fx.lifecycle("z", 1, 1, Ready)), &fx.keyring),
        shoal_catalog::MergeOutcome::Applied
    );
    let before = local.clone();

    // The agent's load path: decode (and verify) fully, then install. Decode failed, so
    // nothing is installed, not even part of it.
    let result =
        snapshot::decode(&bytes, &fx.keyring).map(|snap| local.install(&snap, &fx.keyring));

    assert!(matches!(result, Err(SnapshotError::Checksum { .. })));
    assert_eq!(local, before);
    assert_eq!(local.index(), before.index());
}

// ---- corruption, each with its specific error --------------------------------------------

#[test]
fn truncated_inside_the_header() {
    let fx = Fixture::new();
    let (_, bytes) = encoded(&fx);
    for cut in [0, 1, 4, SNAPSHOT_HEADER_BYTES - 1] {
        assert_eq!(
            snapshot::decode(&bytes[..cut], &fx.keyring),
            Err(SnapshotError::Truncated {
                have: cut as u64,
                need: SNAPSHOT_HEADER_BYTES as u64
            })
        );
    }
}

#[test]
fn truncated_inside_the_body() {
    let fx = Fixture::new();
    let (_, bytes) = encoded(&fx);
    let need = bytes.len() as u64;
    for cut in [
        SNAPSHOT_HEADER_BYTES,
        SNAPSHOT_HEADER_BYTES + 1,
        bytes.len() / 2,
        bytes.len() - 1,
    ] {
        assert_eq!(
            snapshot::decode(&bytes[..cut], &fx.keyring),
            Err(SnapshotError::Truncated {
                have: cut as u64,
                need
            })
        );
    }
}

#[test]
fn nul_padded_is_trailing() {
    let fx = Fixture::new();
    let (_, mut bytes) = encoded(&fx);
    bytes.extend_from_slice(&[0u8; 4096]);
    assert_eq!(
        snapshot::decode(&bytes, &fx.keyring),
        Err(SnapshotError::Trailing(4096))
    );
}

#[test]
fn torn_write_over_an_older_snapshot_is_refused() {
    // A crash while overwriting an old snapshot in place: new bytes up to the tear, old after.
    let fx = Fixture::new();
    let (_, new) = encoded(&fx);
    let mut old_catalog = Catalog::new();
    assert_eq!(
        old_catalog.apply_lifecycle(Arc::new(fx.lifecycle("a", 1, 1, Starting)), &fx.keyring),
        shoal_catalog::MergeOutcome::Applied
    );
    let old = snapshot::encode(&Snapshot::of(
        &old_catalog,
        SnapshotScope::Catalog,
        fx.region.clone(),
    ));
    assert!(old.len() < new.len());
    // Old file longer than the tear point but shorter than the new file: truncated.
    let tear = old.len() - 10;
    let mut torn = new[..tear].to_vec();
    torn.extend_from_slice(&old[tear..]);
    assert_eq!(
        snapshot::decode(&torn, &fx.keyring),
        Err(SnapshotError::Truncated {
            have: old.len() as u64,
            need: new.len() as u64
        })
    );
    // Same length, torn mid-body (the tail of the old file is other bytes): checksum.
    let mut torn = new.clone();
    let mid = new.len() / 2;
    for (i, b) in torn[mid..].iter_mut().enumerate() {
        *b = old[i % old.len()];
    }
    assert_ne!(torn, new);
    assert!(matches!(
        snapshot::decode(&torn, &fx.keyring),
        Err(SnapshotError::Checksum { .. })
    ));
    // The new header over an old, shorter body region left as zeros (pre-allocated file).
    let mut torn = new[..mid].to_vec();
    torn.resize(new.len(), 0);
    assert!(matches!(
        snapshot::decode(&torn, &fx.keyring),
        Err(SnapshotError::Checksum { .. })
    ));
}

#[test]
fn flipped_bit_in_the_body_fails_the_checksum() {
    let fx = Fixture::new();
    let (_, bytes) = encoded(&fx);
    for pos in [SNAPSHOT_HEADER_BYTES, bytes.len() / 2, bytes.len() - 1] {
        for bit in [0, 7] {
            let mut b = bytes.clone();
            b[pos] ^= 1 << bit;
            let err = snapshot::decode(&b, &fx.keyring).unwrap_err();
            assert!(
                matches!(err, SnapshotError::Checksum { header, body } if header != body),
                "pos {pos} bit {bit}: {err:?}"
            );
        }
    }
}

#[test]
fn header_fields_are_checked() {
    let fx = Fixture::new();
    let (_, bytes) = encoded(&fx);
    let with = |at: usize, patch: &[u8]| {
        let mut b = bytes.clone();
        b[at..at + patch.len()].copy_from_slice(patch);
        snapshot::decode(&b, &fx.keyring)
    };
    assert_eq!(with(0, b"SHSX"), Err(SnapshotError::BadMagic(*b"SHSX")));
    assert_eq!(with(0, b"\0\0\0\0"), Err(SnapshotError::BadMagic([0; 4])));
    assert_eq!(with(4, &2u16.to_le_bytes()), Err(SnapshotError::Version(2)));
    assert_eq!(with(4, &0u16.to_le_bytes()), Err(SnapshotError::Version(0)));
    assert_eq!(with(6, &1u16.to_le_bytes()), Err(SnapshotError::Flags(1)));
    // body length lies: longer, shorter, absurd
    let body_len = (bytes.len() - SNAPSHOT_HEADER_BYTES) as u64;
    assert!(matches!(
        with(20, &(body_len + 1).to_le_bytes()),
        Err(SnapshotError::Truncated { .. })
    ));
    assert_eq!(
        with(20, &(body_len - 3).to_le_bytes()),
        Err(SnapshotError::Trailing(3))
    );
    assert!(matches!(
        with(20, &u64::MAX.to_le_bytes()),
        Err(SnapshotError::TooLarge(_))
    ));
    assert!(matches!(
        with(16, &u32::MAX.to_le_bytes()),
        Err(SnapshotError::TooLarge(_))
    ));
    // the checksum field itself
    assert!(matches!(
        with(28, &[0, 0, 0, 0]),
        Err(SnapshotError::Checksum { header: 0, .. })
    ));
    // header fields outside the checksum that must agree with the body
    assert!(matches!(
        with(8, &9u64.to_le_bytes()),
        Err(SnapshotError::Inconsistent(_))
    ));
    assert!(matches!(
        with(16, &6u32.to_le_bytes()),
        Err(SnapshotError::Inconsistent(_))
    ));
}

#[test]
fn a_body_that_does_not_decode_is_malformed() {
    let fx = Fixture::new();
    let (snap, bytes) = encoded(&fx);
    let body = &bytes[SNAPSHOT_HEADER_BYTES..];
    // Checksum right, body cut short: postcard runs out of input.
    let short = reframe(&body[..body.len() / 2], 8, snap.record_count() as u32);
    assert!(matches!(
        snapshot::decode(&short, &fx.keyring),
        Err(SnapshotError::Malformed(_))
    ));
    // Checksum right, extra bytes after a complete body.
    let mut long = body.to_vec();
    long.push(0);
    let long = reframe(&long, 8, snap.record_count() as u32);
    assert!(matches!(
        snapshot::decode(&long, &fx.keyring),
        Err(SnapshotError::Malformed(m)) if m.contains("left after")
    ));
    // Checksum right, an identifier inside fails validation (instance id `a` -> `!`).
    let mut bad_id = snap.clone();
    let mut rec = (*bad_id.lifecycle[0]).clone();
    rec.record.instance = InstanceId::new("q").unwrap();
    bad_id.lifecycle[0] = Arc::new(rec);
    let mut raw = snapshot::encode(&bad_id)[SNAPSHOT_HEADER_BYTES..].to_vec();
    let at = raw
        .windows(2)
        .position(|w| w == [1, b'q'])
        .expect("id `q` encoded");
    raw[at + 1] = b'!';
    let framed = reframe(&raw, 8, snap.record_count() as u32);
    assert!(matches!(
        snapshot::decode(&framed, &fx.keyring),
        Err(SnapshotError::Malformed(_))
    ));
}

#[test]
fn bad_signatures_inside_are_refused_naming_the_record() {
    let fx = Fixture::new();
    let (snap, _) = encoded(&fx);

    // A tampered lifecycle record (re-encoded, so length and checksum are right).
    let mut tampered = snap.clone();
    let mut rec: SignedLifecycle = (*tampered.lifecycle[2]).clone();
    rec.record.endpoint.weight = 1;
    tampered.lifecycle[2] = Arc::new(rec);
    assert_eq!(
        snapshot::decode(&snapshot::encode(&tampered), &fx.keyring),
        Err(SnapshotError::BadSignature {
            index: 2,
            error: SignatureError::Invalid
        })
    );

    // A tampered health record: indices continue after the lifecycle records.
    let mut tampered = snap.clone();
    let mut h = (*tampered.health[1]).clone();
    h.record.status = HealthStatus::Passing;
    tampered.health[1] = Arc::new(h);
    assert_eq!(
        snapshot::decode(&snapshot::encode(&tampered), &fx.keyring),
        Err(SnapshotError::BadSignature {
            index: snap.lifecycle.len() + 1,
            error: SignatureError::Invalid
        })
    );

    // A verifier that trusts nothing refuses the first record.
    let bytes = snapshot::encode(&snap);
    assert_eq!(
        snapshot::decode(&bytes, &Keyring::new()),
        Err(SnapshotError::BadSignature {
            index: 0,
            error: SignatureError::UnknownKey(fx.authority.id())
        })
    );
}

#[test]
fn impossible_heads_are_inconsistent() {
    // Heads are unsigned. A GC floor above the contiguous head would, once installed, make the
    // catalog refuse every new registration at or below it as "collected".
    let fx = Fixture::new();
    let (snap, _) = encoded(&fx);
    let mut bad = snap.clone();
    bad.regions[0].gc_floor = Revision(1_000);
    let err = snapshot::decode(&snapshot::encode(&bad), &fx.keyring).unwrap_err();
    assert!(
        matches!(err, SnapshotError::Inconsistent(ref m) if m.contains("gc floor")),
        "{err:?}"
    );

    let mut bad = snap.clone();
    bad.regions[0].contiguous = Revision(bad.regions[0].max_seen.0 + 1);
    assert!(matches!(
        snapshot::decode(&snapshot::encode(&bad), &fx.keyring),
        Err(SnapshotError::Inconsistent(_))
    ));

    // Header and body agree on a revision that is not the home region's head.
    let mut bad = snap.clone();
    bad.revision = Revision(3);
    let err = snapshot::decode(&snapshot::encode(&bad), &fx.keyring).unwrap_err();
    assert!(
        matches!(err, SnapshotError::Inconsistent(ref m) if m.contains("home region")),
        "{err:?}"
    );
}

// ---- random cuts and mutations -----------------------------------------------------------

fn fixture_and_bytes() -> &'static (Fixture, Snapshot, Vec<u8>) {
    static CELL: OnceLock<(Fixture, Snapshot, Vec<u8>)> = OnceLock::new();
    CELL.get_or_init(|| {
        let fx = Fixture::new();
        let (snap, bytes) = encoded(&fx);
        (fx, snap, bytes)
    })
}

#[derive(Debug, Clone)]
enum Damage {
    /// Keep the first `at` bytes (scaled to the length).
    Cut(u16),
    /// XOR one byte (a zero mask is a no-op).
    Xor(u16, u8),
    /// Overwrite a run of bytes with a value.
    Fill(u16, u8, u8),
    /// Insert bytes.
    Insert(u16, Vec<u8>),
    /// Remove a run of bytes.
    Remove(u16, u8),
    /// Keep the first part, then NUL-pad to the original length (a torn pre-allocated file).
    Zeros(u16),
}

fn scaled(at: u16, len: usize) -> usize {
    (usize::from(at) * len) / (usize::from(u16::MAX) + 1)
}

fn damage(bytes: &[u8], d: &Damage) -> Vec<u8> {
    let len = bytes.len();
    let mut b = bytes.to_vec();
    match d {
        Damage::Cut(at) => b.truncate(scaled(*at, len)),
        Damage::Xor(at, mask) => b[scaled(*at, len)] ^= mask,
        Damage::Fill(at, n, v) => {
            let s = scaled(*at, len);
            let e = (s + usize::from(*n)).min(len);
            b[s..e].fill(*v);
        }
        Damage::Insert(at, extra) => {
            let s = scaled(*at, len + 1);
            b.splice(s..s, extra.iter().copied());
        }
        Damage::Remove(at, n) => {
            let s = scaled(*at, len);
            let e = (s + usize::from(*n)).min(len);
            b.drain(s..e);
        }
        Damage::Zeros(at) => {
            let s = scaled(*at, len);
            b[s..].fill(0);
        }
    }
    b
}

fn damages() -> impl Strategy<Value = Damage> {
    prop_oneof![
        any::<u16>().prop_map(Damage::Cut),
        (any::<u16>(), any::<u8>()).prop_map(|(a, m)| Damage::Xor(a, m)),
        (any::<u16>(), 1u8..64, any::<u8>()).prop_map(|(a, n, v)| Damage::Fill(a, n, v)),
        (any::<u16>(), prop::collection::vec(any::<u8>(), 1..32))
            .prop_map(|(a, x)| Damage::Insert(a, x)),
        (any::<u16>(), 1u8..64).prop_map(|(a, n)| Damage::Remove(a, n)),
        any::<u16>().prop_map(Damage::Zeros),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        rng_seed: RngSeed::Fixed(0x5eed_5a4a),
        ..ProptestConfig::with_cases(256)
    })]

    /// Decode never panics; it errors, or (only when the damage changed nothing) returns the
    /// original snapshot. Never a partial one.
    #[test]
    fn damaged_snapshots_never_decode_to_something_else(ds in prop::collection::vec(damages(), 1..4)) {
        let (fx, snap, bytes) = fixture_and_bytes();
        let mut b = bytes.clone();
        for d in &ds {
            b = damage(&b, d);
        }
        match snapshot::decode(&b, &fx.keyring) {
            Ok(back) => {
                prop_assert_eq!(&b, bytes, "only unchanged bytes may decode");
                prop_assert_eq!(&back, snap);
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// Arbitrary bytes, with and without a valid-looking header, never panic.
    #[test]
    fn arbitrary_bytes_never_panic(
        body in prop::collection::vec(any::<u8>(), 0..512),
        framed in any::<bool>(),
        count in 0u32..16,
    ) {
        let (fx, _, _) = fixture_and_bytes();
        let b = if framed { reframe(&body, 0, count) } else { body };
        prop_assert!(snapshot::decode(&b, &fx.keyring).is_err());
    }
}
