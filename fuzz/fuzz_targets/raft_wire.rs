//! Raft messages between authority replicas (`b"SR" | version | postcard(RaftWire)`): a decoded
//! message re-encodes to bytes that decode and re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_authority_server::network::{decode_wire, encode_wire};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode_wire(data) {
        let once = encode_wire(&m);
        let back = decode_wire(&once).expect("re-encoded wire message decodes");
        assert_eq!(encode_wire(&back), once);
    }
});
