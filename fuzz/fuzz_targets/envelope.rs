//! The versioned envelope: header checks, then small bodies (identifiers) with a round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_proto::envelope::{self, MessageKind, HEADER_BYTES, MAX_STREAM_MESSAGE_BYTES};
use shoal_proto::{InstanceId, Labels, NodeId, Region, ServiceKey};

mod common;

fn body<T>(data: &[u8], kind: MessageKind)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = envelope::decode::<T>(data, kind, MAX_STREAM_MESSAGE_BYTES) {
        let again = envelope::encode(kind, &v, MAX_STREAM_MESSAGE_BYTES).expect("fits");
        let back: T = envelope::decode(&again, kind, MAX_STREAM_MESSAGE_BYTES).expect("decodes");
        assert_eq!(back, v);
    }
}

fuzz_target!(|data: &[u8]| {
    for max in [envelope::DEFAULT_MAX_DATAGRAM_BYTES, MAX_STREAM_MESSAGE_BYTES] {
        if let Ok((kind, rest)) = envelope::decode_header(data, max) {
            assert!(data.len() <= max);
            assert_eq!(rest.len() + HEADER_BYTES, data.len());
            assert_eq!(MessageKind::from_u8(kind as u8), Some(kind));
        }
    }
    let Some(&k) = data.get(3) else {
        return;
    };
    // The body type is chosen by the length, so any valid envelope reaches every decoder.
    let kind = MessageKind::from_u8(k).unwrap_or(MessageKind::Heads);
    match data.len() % 5 {
        0 => body::<ServiceKey>(data, kind),
        1 => body::<NodeId>(data, kind),
        2 => body::<Region>(data, kind),
        3 => body::<InstanceId>(data, kind),
        _ => body::<Labels>(data, kind),
    }
});
