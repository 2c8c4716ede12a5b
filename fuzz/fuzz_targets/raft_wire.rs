//! Raft messages between authority replicas (`b"SR" | version | postcard(RaftWire)`): a decoded
//! message re-encodes to bytes that decode and re-encode to the same bytes. Each input is also
//! tried behind the right prefix, so mutations reach the body decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_authority_server::network::{decode_wire, encode_wire, RAFT_WIRE_PREFIX};

fn check(bytes: &[u8]) {
    if let Ok(m) = decode_wire(bytes) {
        let once = encode_wire(&m);
        let back = decode_wire(&once).expect("re-encoded wire message decodes");
        assert_eq!(encode_wire(&back), once);
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut prefixed = RAFT_WIRE_PREFIX.to_vec();
    prefixed.extend_from_slice(data);
    check(&prefixed);
});
