//! A per-thread pseudo-random source for the request path (weighted picks, blocking-query
//! jitter): seeded once per thread from the OS, then no syscall per request.
//!
//! splitmix64 ([`Jitter`]): not cryptographic, and need not be; it spreads picks by weight and
//! watchers' wake-ups in time. Seeding every request from the OS cost one `getrandom` syscall
//! per pick and per blocking query (issue 19).

use std::cell::RefCell;

use crate::keys::Jitter;

thread_local! {
    static RNG: RefCell<Jitter> = RefCell::new(Jitter::new());
}

/// Next 64 random bits of this thread's generator.
pub(crate) fn next_u64() -> u64 {
    RNG.with(|r| r.borrow_mut().next_u64())
}

/// Uniform in `0..=max`, from this thread's generator.
pub(crate) fn upto(max: u64) -> u64 {
    RNG.with(|r| r.borrow_mut().upto(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_vary_and_stay_in_range() {
        let a: Vec<u64> = (0..64).map(|_| next_u64()).collect();
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert_eq!(distinct.len(), a.len(), "64 draws must not repeat");
        assert!((0..1000).all(|_| upto(7) <= 7));
        assert!(
            (0..1000).any(|_| upto(7) == 7),
            "the bound itself is reachable"
        );
        assert_eq!(upto(0), 0);
    }
}
