//! FNV-1a 64-bit (Fowler, Noll, Vo): a small, fixed, seedless hash for the order-independent
//! bucket digests of anti-entropy and membership push-pull and for the repeat filter's keys
//! (no OS randomness in the core; the same bytes hash alike on every member). Public so the
//! simulator's report digests and the test harness hash with this one copy; not a
//! cryptographic hash and not for untrusted keys of a hash table.

/// FNV-1a 64-bit offset basis.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a 64-bit (Fowler, Noll, Vo) over `bytes`, continuing from `h`.
pub fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Hasher for tables keyed by a `u64` the core made itself or already hashed (timer tokens,
/// the repeat filter's FNV-1a keys): one multiply by 2^64 / phi (Fibonacci hashing) per word.
/// Seedless, so no OS randomness; like [`fnv1a`], not a defence against chosen collisions
/// (neither was the fixed-key SipHash it replaced), which can only slow a bounded table.
#[derive(Debug, Default)]
pub(crate) struct U64Hasher(u64);

impl std::hash::Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}
