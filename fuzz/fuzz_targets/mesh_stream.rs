//! Mesh stream messages (push, IHAVE, GRAFT, PRUNE, anti-entropy, delta, snapshot request):
//! decode with the limits, re-encode, decode again to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_mesh::messages::StreamMessage;
use shoal_proto::envelope::MAX_STREAM_MESSAGE_BYTES;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = StreamMessage::decode(data, MAX_STREAM_MESSAGE_BYTES) {
        let again = m
            .encode(MAX_STREAM_MESSAGE_BYTES)
            .expect("a decoded message re-encodes within the limit");
        let back = StreamMessage::decode(&again, MAX_STREAM_MESSAGE_BYTES)
            .expect("a re-encoded message decodes");
        assert_eq!(back, m);
    }
});
