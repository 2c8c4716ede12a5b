//! The authority replica's data directory: framed files (`vote.bin`, `purged.bin`,
//! `snapshot.bin`) and the record log `raft.log`, as `LogStore::open` and
//! `StoredSnapshot::read` parse them.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use shoal_authority_server::files;
use shoal_authority_server::storage::{self, StoredSnapshot};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    let path = Path::new("fuzz");
    match sel % 4 {
        0 => {
            if let Ok(payload) = files::unframe(path, bytes) {
                assert_eq!(files::frame(payload), bytes);
                let _ = StoredSnapshot::decode(path, payload);
            }
        }
        1 => {
            // Unframed payloads too, so the fuzzer need not find CRCs to reach the decoders.
            let _ = StoredSnapshot::decode(path, bytes);
            let _ = storage::decode_vote(path, bytes);
            let _ = storage::decode_log_id(path, bytes);
        }
        2 => {
            let floor = bytes.first().map(|b| u64::from(*b) % 4);
            if let Ok(log) = storage::parse_log(path, bytes, floor) {
                assert!(log.valid_len <= bytes.len() as u64);
            }
            let _ = storage::parse_log(path, bytes, None);
        }
        _ => {
            // Every record payload is an entry: frame the input as one record.
            let mut log = Vec::new();
            files::push_record(&mut log, bytes);
            files::push_record(&mut log, bytes);
            let _ = storage::parse_log(path, &log, None);
        }
    }
});
