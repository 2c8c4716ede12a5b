//! SWIM datagrams (the envelope + foca's postcard codec + the membership layer's own
//! filtering) fed to a fresh agent core. Two datagrams per input (split at the first byte's
//! offset) so a second packet meets the state the first left.
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let cut = usize::from(cut).min(rest.len());
    let (a, b) = rest.split_at(cut);
    let mut mesh = common::mesh();
    let from = "127.0.0.1:7001".parse().unwrap();
    mesh.handle_datagram(1_000, from, a);
    common::drain(&mut mesh);
    mesh.handle_datagram(1_100, from, b);
    common::drain(&mut mesh);
    mesh.handle_datagram(1_200, from, rest);
    common::drain(&mut mesh);
});
