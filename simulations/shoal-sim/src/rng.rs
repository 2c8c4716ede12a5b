//! The seeded RNG tree.
//!
//! One `--seed` feeds a root ChaCha20 generator, which produces a 256-bit key once. Every
//! consumer of randomness asks for a child by [`Purpose`] and index; the child's seed is read
//! from the ChaCha20 keystream at a fixed (stream, word position) derived from that pair, so
//! deriving children is order independent: adding a new purpose, drawing more numbers from the
//! network RNG, or creating node 17 before node 3 never shifts any other child's numbers.

use rand::{Rng, SeedableRng};
use rand_chacha::{ChaCha20Rng, ChaCha8Rng};

/// The generator handed to every consumer. ChaCha8 is fast and portable: the same seed yields
/// the same numbers on every platform.
pub type SimRng = ChaCha8Rng;

/// What a child RNG is used for. Each purpose is a separate ChaCha stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Purpose {
    /// Link latency, loss and duplication decisions.
    Network,
    /// Fault selection (e.g. `random = 3` in a fault target).
    Faults,
    /// Workload generation (services, rollouts, drains).
    Workload,
    /// Traffic generation (picks).
    Traffic,
    /// A node's own seed; the index is the node index, so a restart can use the same index
    /// with [`RngTree::node_seed`] and a boot generation mixed in.
    Node,
    /// Anything a later layer adds; pick a number not used elsewhere.
    Custom(u32),
}

impl Purpose {
    fn stream_id(self) -> u64 {
        match self {
            Purpose::Network => 1,
            Purpose::Faults => 2,
            Purpose::Workload => 3,
            Purpose::Traffic => 4,
            Purpose::Node => 5,
            Purpose::Custom(n) => (1 << 32) | u64::from(n),
        }
    }
}

/// Root of all randomness in one simulation run.
#[derive(Clone, Debug)]
pub struct RngTree {
    seed: u64,
    key: [u8; 32],
}

impl RngTree {
    /// Builds the tree for `seed` (the `--seed` value).
    pub fn new(seed: u64) -> Self {
        let mut root = ChaCha20Rng::seed_from_u64(seed);
        let mut key = [0u8; 32];
        root.fill_bytes(&mut key);
        Self { seed, key }
    }

    /// The `--seed` this tree was built from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// 32 bytes of seed for child (`purpose`, `index`).
    fn child_seed_bytes(&self, purpose: Purpose, index: u64) -> [u8; 32] {
        let mut stream = ChaCha20Rng::from_seed(self.key);
        stream.set_stream(purpose.stream_id());
        // 8 words of 32 bits = 32 bytes per index.
        stream.set_word_pos(u128::from(index) * 8);
        let mut seed = [0u8; 32];
        stream.fill_bytes(&mut seed);
        seed
    }

    /// A child generator for (`purpose`, `index`).
    pub fn child(&self, purpose: Purpose, index: u64) -> SimRng {
        SimRng::from_seed(self.child_seed_bytes(purpose, index))
    }

    /// A 64-bit seed for node `index` in boot `epoch` (0 for the first boot). Node
    /// implementations seed their own RNG from this; the core never reads an OS RNG.
    pub fn node_seed(&self, index: u32, epoch: u32) -> u64 {
        let bytes =
            self.child_seed_bytes(Purpose::Node, (u64::from(epoch) << 32) | u64::from(index));
        u64::from_le_bytes([
            bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_order_independent() {
        let t = RngTree::new(7);
        let mut a = t.child(Purpose::Network, 0);
        let _ = t.child(Purpose::Faults, 0).next_u64();
        let mut b = t.child(Purpose::Network, 0);
        assert_eq!(a.next_u64(), b.next_u64());
        assert_ne!(t.node_seed(1, 0), t.node_seed(2, 0));
        assert_ne!(t.node_seed(1, 0), t.node_seed(1, 1));
        assert_ne!(RngTree::new(8).node_seed(1, 0), t.node_seed(1, 0));
    }
}
