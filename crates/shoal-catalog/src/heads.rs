//! Per-origin version heads and gap detection.
//!
//! Every origin numbers what it writes with a gap-free counter: the region authority its
//! revisions, each owner agent its health sequence (restarting at 1 with every agent boot, which
//! is the chain's `epoch`). A [`ChainHead`] remembers the highest `contiguous` number below which
//! nothing is missing, plus the numbers seen above it. Anything between is a **gap**.
//!
//! A number counts as seen when a record carrying it arrives (even a stale one), or when a peer
//! sends a delta that it declares complete for a range (`(from, to]`): records superseded inside
//! that range are accounted for by the newer records the delta carries.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// Most out-of-order numbers remembered above `contiguous`. Past it, further numbers are not
/// remembered (counted by the caller); anti-entropy repairs them later.
pub const MAX_PENDING: usize = 4_096;

/// What observing one number did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// The contiguous head moved forward (possibly by more than one, consuming pending ones).
    Advanced,
    /// Seen above a gap; remembered as pending.
    AboveGap,
    /// Already covered, or from an older epoch.
    Old,
    /// Above a gap and the pending set is full: not remembered.
    Overflow,
}

/// A range of missing numbers `from..=to` in `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    /// Epoch (agent boot generation; 0 for the authority).
    pub epoch: u64,
    /// First missing number.
    pub from: u64,
    /// Last missing number.
    pub to: u64,
}

/// Contiguity tracker for one origin. See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainHead {
    epoch: u64,
    contiguous: u64,
    pending: BTreeSet<u64>,
}

impl ChainHead {
    /// A head that has seen nothing (`epoch` 0, `contiguous` 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// A head restored from a snapshot: complete up to `contiguous` in `epoch`.
    pub fn at(epoch: u64, contiguous: u64) -> Self {
        Self {
            epoch,
            contiguous,
            pending: BTreeSet::new(),
        }
    }

    /// Current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Highest number below which nothing is missing.
    pub fn contiguous(&self) -> u64 {
        self.contiguous
    }

    /// Highest number seen at all (pending included).
    pub fn max_seen(&self) -> u64 {
        self.pending.last().copied().unwrap_or(self.contiguous)
    }

    /// An order-independent digest of the numbers seen above the contiguous head (0 when
    /// there are none), so two heads can be compared without shipping the numbers.
    pub fn pending_hash(&self) -> u64 {
        let mut h = 0u64;
        for p in &self.pending {
            // splitmix64 finaliser per number, summed: cheap and order-independent.
            let mut z = p.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            h = h.wrapping_add(z ^ (z >> 31)) | 1;
        }
        h
    }

    /// Numbers seen above the contiguous head, ascending.
    pub fn pending(&self) -> impl Iterator<Item = u64> + '_ {
        self.pending.iter().copied()
    }

    /// Joins another head of the same origin into this one: afterwards every number either head
    /// had accounted for is accounted for here. Only sound when the records behind `other` have
    /// been merged into the same catalog (see `Catalog::merge_catalog`).
    pub fn join(&mut self, other: &ChainHead) {
        if other.epoch < self.epoch {
            return;
        }
        let c = if other.epoch > self.epoch {
            0
        } else {
            self.contiguous
        };
        self.cover(other.epoch, c, other.contiguous);
        for p in other.pending() {
            self.observe(other.epoch, p);
        }
    }

    /// Records that number `seq` of `epoch` was seen.
    pub fn observe(&mut self, epoch: u64, seq: u64) -> Observed {
        if epoch < self.epoch {
            return Observed::Old;
        }
        if epoch > self.epoch {
            *self = Self::at(epoch, 0);
        }
        if seq <= self.contiguous {
            return Observed::Old;
        }
        if seq == self.contiguous + 1 {
            self.contiguous = seq;
            self.drain_pending();
            return Observed::Advanced;
        }
        if self.pending.len() >= MAX_PENDING && !self.pending.contains(&seq) {
            return Observed::Overflow;
        }
        self.pending.insert(seq);
        Observed::AboveGap
    }

    /// Applies a range that a peer declared complete: every number in `(from, to]` of `epoch`
    /// is accounted for. Only extends the head when `from <= contiguous` (otherwise the range
    /// leaves a hole below it) and the epoch matches (or is newer and `from == 0`).
    /// Returns true when the head moved.
    pub fn cover(&mut self, epoch: u64, from: u64, to: u64) -> bool {
        if epoch < self.epoch || to <= from {
            return false;
        }
        if epoch > self.epoch {
            if from != 0 {
                return false;
            }
            *self = Self::at(epoch, 0);
        }
        if from > self.contiguous || to <= self.contiguous {
            return false;
        }
        self.contiguous = to;
        self.drain_pending();
        true
    }

    /// The first missing range, if any number above a hole has been seen.
    pub fn gap(&self) -> Option<Gap> {
        let first_pending = *self.pending.first()?;
        debug_assert!(
            first_pending > self.contiguous + 1,
            "pending must be above a hole"
        );
        Some(Gap {
            epoch: self.epoch,
            from: self.contiguous + 1,
            to: first_pending - 1,
        })
    }

    fn drain_pending(&mut self) {
        while let Some(&first) = self.pending.first() {
            if first > self.contiguous + 1 {
                break;
            }
            self.pending.pop_first();
            self.contiguous = self.contiguous.max(first);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_advances() {
        let mut h = ChainHead::new();
        assert_eq!(h.observe(0, 1), Observed::Advanced);
        assert_eq!(h.observe(0, 2), Observed::Advanced);
        assert_eq!(h.contiguous(), 2);
        assert_eq!(h.gap(), None);
    }

    #[test]
    fn out_of_order_reports_a_gap_then_closes_it() {
        let mut h = ChainHead::new();
        h.observe(0, 1);
        assert_eq!(h.observe(0, 4), Observed::AboveGap);
        assert_eq!(h.observe(0, 5), Observed::AboveGap);
        assert_eq!(
            h.gap(),
            Some(Gap {
                epoch: 0,
                from: 2,
                to: 3
            })
        );
        h.observe(0, 3);
        assert_eq!(h.gap().unwrap().to, 2);
        assert_eq!(h.observe(0, 2), Observed::Advanced);
        assert_eq!(h.contiguous(), 5);
        assert_eq!(h.gap(), None);
    }

    #[test]
    fn cover_fills_a_hole_only_from_below() {
        let mut h = ChainHead::at(0, 10);
        h.observe(0, 20);
        assert!(
            !h.cover(0, 12, 15),
            "a range starting above the head leaves a hole"
        );
        assert!(h.cover(0, 8, 19));
        assert_eq!(h.contiguous(), 20);
    }

    #[test]
    fn a_new_epoch_restarts_the_chain() {
        let mut h = ChainHead::at(3, 50);
        assert_eq!(h.observe(2, 51), Observed::Old);
        assert_eq!(h.observe(4, 1), Observed::Advanced);
        assert_eq!((h.epoch(), h.contiguous()), (4, 1));
        let mut h = ChainHead::at(3, 50);
        assert_eq!(h.observe(4, 2), Observed::AboveGap);
        assert_eq!(h.gap().unwrap().from, 1);
    }

    #[test]
    fn pending_is_bounded() {
        let mut h = ChainHead::new();
        for i in 0..MAX_PENDING as u64 {
            assert_eq!(h.observe(0, 10 + i), Observed::AboveGap);
        }
        assert_eq!(h.observe(0, 1_000_000), Observed::Overflow);
    }
}
