//! A stream message fed to a fresh agent core, as the agent does with every stream message
//! from a verified peer: decode, verify, merge, answer. Bad input is counted, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let mut mesh = common::mesh();
    let from = "127.0.0.1:7001".parse().unwrap();
    mesh.handle_stream_message(1_000, from, data);
    common::drain(&mut mesh);
});
