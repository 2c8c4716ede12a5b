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
