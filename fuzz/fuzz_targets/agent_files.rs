//! The agent's data directory files: `node.key`, `boot`, `members.json`, the development
//! authority's state, and the snapshot file as `persist::load_snapshot` reads it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_agent::{keys, persist};
use shoal_authority::AuthorityState;

mod common;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    match sel % 4 {
        0 => {
            if let Some(seed) = keys::parse_node_key(bytes) {
                assert_eq!(keys::parse_node_key(keys::to_hex(&seed).as_bytes()), Some(seed));
            }
        }
        1 => {
            if let Some(n) = keys::parse_boot(bytes) {
                assert_eq!(keys::parse_boot(n.to_string().as_bytes()), Some(n));
            }
        }
        2 => {
            if let Ok(members) = persist::parse_members(bytes) {
                assert!(members.len() <= persist::MAX_PERSISTED_MEMBERS);
            }
        }
        _ => {
            if let Ok(state) = AuthorityState::decode(bytes) {
                let back = AuthorityState::decode(&state.encode()).expect("re-encoded state decodes");
                assert_eq!(back.encode(), state.encode());
            }
        }
    }
});
