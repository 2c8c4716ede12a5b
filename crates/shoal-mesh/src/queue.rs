//! Output queues that give memory back after a burst.
//!
//! `VecDeque` keeps the capacity of its largest backlog for good. A burst is normal here: a
//! member seeded with its region's 1,666 peers (`Membership::bootstrap`) queues one event per
//! peer in the membership, in the mesh and in foca's runtime. At the simulator's 5,001 agents
//! the capacity those bursts left behind was ~3.2 GiB of `reference/partition`'s 8.1 GiB
//! (a jemalloc heap profile, 2026-12-02). One agent holds ~0.65 MiB of it.

use std::collections::VecDeque;

/// Capacity an emptied queue keeps: steady-state backlogs stay below it, so trimming happens
/// only after bursts (no reallocation churn on the common path).
pub(crate) const QUEUE_SPARE: usize = 256;

/// Pops the front of `q`; when `q` is empty (the caller has drained it) and holds more than
/// [`QUEUE_SPARE`] slots, gives the rest back to the allocator.
pub(crate) fn pop_trimmed<T>(q: &mut VecDeque<T>) -> Option<T> {
    let out = q.pop_front();
    if out.is_none() && q.capacity() > QUEUE_SPARE {
        q.shrink_to(QUEUE_SPARE);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drained_queue_gives_back_what_a_burst_grew_and_keeps_the_spare() {
        let mut q: VecDeque<u64> = (0..5_000).collect();
        let grown = q.capacity();
        assert!(grown >= 5_000);
        let mut popped = 0;
        while pop_trimmed(&mut q).is_some() {
            popped += 1;
        }
        assert_eq!(popped, 5_000);
        assert!(
            q.capacity() <= QUEUE_SPARE,
            "capacity {} kept",
            q.capacity()
        );
        // Small queues are left alone.
        let mut small: VecDeque<u64> = VecDeque::with_capacity(QUEUE_SPARE);
        small.push_back(1);
        let cap = small.capacity();
        assert_eq!(pop_trimmed(&mut small), Some(1));
        assert_eq!(pop_trimmed(&mut small), None);
        assert_eq!(small.capacity(), cap);
    }
}
