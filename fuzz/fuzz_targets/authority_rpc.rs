//! Agent <-> authority RPC: requests (decoded by the authority from any region peer) and
//! replies (decoded by agents and the CLI). Round trip through the envelope.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_proto::envelope::{self, MessageKind, MAX_STREAM_MESSAGE_BYTES};
use shoal_proto::rpc::{AuthorityReply, AuthorityRequest};

fuzz_target!(|data: &[u8]| {
    let max = MAX_STREAM_MESSAGE_BYTES;
    if let Ok(r) = envelope::decode::<AuthorityRequest>(data, MessageKind::AuthorityRequest, max) {
        let again = envelope::encode(MessageKind::AuthorityRequest, &r, max).expect("fits");
        let back: AuthorityRequest =
            envelope::decode(&again, MessageKind::AuthorityRequest, max).expect("decodes");
        assert_eq!(back, r);
    }
    if let Ok(r) = envelope::decode::<AuthorityReply>(data, MessageKind::AuthorityReply, max) {
        let again = envelope::encode(MessageKind::AuthorityReply, &r, max).expect("fits");
        let back: AuthorityReply =
            envelope::decode(&again, MessageKind::AuthorityReply, max).expect("decodes");
        assert_eq!(back, r);
    }
});
