//! Catalog snapshots, as read from `catalog.snap` at boot and received from peers: header, CRC,
//! bodies, signatures. A decoded snapshot re-encodes and decodes to the same snapshot.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_catalog::snapshot;

mod common;

fuzz_target!(|data: &[u8]| {
    let keys = common::keyring();
    if let Ok(s) = snapshot::decode(data, keys) {
        let again = snapshot::encode(&s);
        let back = snapshot::decode(&again, keys).expect("a re-encoded snapshot decodes");
        assert_eq!(back, s);
    }
});
