//! Catalog snapshots, as read from `catalog.snap` at boot and received from peers: header, CRC,
//! bodies, signatures. A decoded snapshot re-encodes and decodes to the same snapshot.
//!
//! Random mutations almost never keep the header's length and CRC right, so each input is also
//! decoded a second time behind a header rebuilt for it (magic, version, flags 0, the input's
//! revision and count fields, the true body length and CRC): the body decoder and the
//! signature checks then see every mutation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_catalog::snapshot::{self, SNAPSHOT_FORMAT_VERSION, SNAPSHOT_HEADER_BYTES, SNAPSHOT_MAGIC};

mod common;

fn check(bytes: &[u8]) {
    let keys = common::keyring();
    if let Ok(s) = snapshot::decode(bytes, keys) {
        let again = snapshot::encode(&s);
        let back = snapshot::decode(&again, keys).expect("a re-encoded snapshot decodes");
        assert_eq!(back, s);
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= SNAPSHOT_HEADER_BYTES {
        let body = &data[SNAPSHOT_HEADER_BYTES..];
        let mut fixed = Vec::with_capacity(data.len());
        fixed.extend_from_slice(&SNAPSHOT_MAGIC);
        fixed.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
        fixed.extend_from_slice(&0u16.to_le_bytes());
        fixed.extend_from_slice(&data[8..20]); // revision, record count
        fixed.extend_from_slice(&(body.len() as u64).to_le_bytes());
        fixed.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        fixed.extend_from_slice(body);
        check(&fixed);
    }
});
