//! Fixed keys (those of `shoal_catalog::testkit::Fixture`, so seeds built with it verify) and a
//! fresh mesh core shared by the targets.

#![allow(dead_code)]

use shoal_catalog::Keyring;
use shoal_mesh::{MemberId, Mesh, MeshConfig};
use shoal_proto::{Generation, NodeId, Region, SigningKey, Zone};


/// Seed of the region authority key the fuzzed verifiers trust (the fixture's).
pub const AUTHORITY_SEED: [u8; 32] = [7; 32];
/// Seed of the node key the fuzzed verifiers trust (the fixture's `node-0`).
pub const NODE_SEED: [u8; 32] = [100; 32];

pub fn region() -> Region {
    Region::new("test").unwrap()
}

/// The fixture's keyring, built once per process (building it derives nine ed25519 keys,
/// which would dominate a cheap decode).
pub fn keyring() -> &'static Keyring {
    static KEYS: std::sync::OnceLock<Keyring> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| shoal_catalog::testkit::Fixture::new().keyring)
}

/// A fresh agent core (node `n0` at 127.0.0.1:7000) trusting [`keyring`].
pub fn mesh() -> Mesh<Keyring> {
    let identity = MemberId {
        node: NodeId::new("node-7").unwrap(),
        addr: "127.0.0.1:7000".parse().unwrap(),
        boot: Generation(1),
    };
    let mut m = Mesh::new(
        identity,
        region(),
        Zone::new("z").unwrap(),
        SigningKey::from_seed([3; 32]),
        MeshConfig::for_cluster_size(8),
        keyring().clone(),
        42,
    );
    m.start(0);
    m
}

/// Drains every output of a mesh core (so the fuzzer also runs what an input triggers); the
/// timers it armed stay in the core, which keeps them itself.
pub fn drain(m: &mut Mesh<Keyring>) {
    while m.poll_transmit().is_some() {}
    while m.poll_event().is_some() {}
}

/// postcard round trip: what decoded must encode and decode to the same value.
pub fn round_trip<T>(value: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let bytes = postcard::to_allocvec(value).expect("decoded values encode");
    let back: T = postcard::from_bytes(&bytes).expect("re-encoded value decodes");
    assert_eq!(&back, value, "postcard round trip changed the value");
}
