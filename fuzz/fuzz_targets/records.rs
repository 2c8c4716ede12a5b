//! Signed lifecycle, health and policy records as they arrive inside pushes, deltas and
//! snapshots: decode, round trip, verify against fixed trusted keys (a bad signature must be an
//! error, never a panic).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_catalog::Verifier;
use shoal_proto::{
    HealthRecord, LifecycleRecord, PolicyRecord, SignedHealth, SignedLifecycle, SignedPolicy,
    SigningKey,
};

mod common;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    let keys = common::keyring();
    // Health verifies against the node key a lifecycle record binds (ADR 0006).
    let node_key = SigningKey::from_seed(common::NODE_SEED).verifying_key();
    match sel % 6 {
        0 => {
            if let Ok(r) = postcard::from_bytes::<SignedLifecycle>(bytes) {
                common::round_trip(&r);
                let _ = keys.verify_lifecycle(&r);
            }
        }
        1 => {
            if let Ok(r) = postcard::from_bytes::<SignedHealth>(bytes) {
                common::round_trip(&r);
                let _ = keys.verify_health(&r, &node_key);
            }
        }
        2 => {
            if let Ok(r) = postcard::from_bytes::<SignedPolicy>(bytes) {
                common::round_trip(&r);
                let k = SigningKey::from_seed(common::AUTHORITY_SEED).verifying_key();
                let _ = k.verify_policy(&r);
            }
        }
        3 => {
            // A well-formed record signed by the trusted key must verify after a round trip.
            if let Ok(r) = postcard::from_bytes::<LifecycleRecord>(bytes) {
                common::round_trip(&r);
                let key = SigningKey::from_seed(common::AUTHORITY_SEED);
                let signed = key.sign_lifecycle(r);
                let wire = postcard::to_allocvec(&signed).unwrap();
                let back: SignedLifecycle = postcard::from_bytes(&wire).unwrap();
                if back.record.region == common::region() {
                    keys.verify_lifecycle(&back).expect("own signature verifies");
                }
            }
        }
        4 => {
            if let Ok(r) = postcard::from_bytes::<HealthRecord>(bytes) {
                common::round_trip(&r);
                let key = SigningKey::from_seed(common::NODE_SEED);
                let signed = key.sign_health(r);
                common::round_trip(&signed);
                keys.verify_health(&signed, &node_key)
                    .expect("own signature verifies");
            }
        }
        _ => {
            if let Ok(r) = postcard::from_bytes::<PolicyRecord>(bytes) {
                common::round_trip(&r);
            }
        }
    }
});
