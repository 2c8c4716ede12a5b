//! The core's timer table (after `quinn-proto`): the core keeps every timer it armed; a driver
//! only asks when the next one is due and hands time back.
//!
//! Two ways to drive it, over the same table:
//! * **by deadline** (the agent and the authority member): [`Mesh::poll_timeout`] is the
//!   earliest deadline; at that time call [`Mesh::handle_timeout`], which fires every due timer,
//!   earliest deadline first and, for equal deadlines, in the order they were armed;
//! * **by token** (the simulator, whose one event queue orders every node's timers together with
//!   message deliveries by (time, sequence)): [`Mesh::poll_armed`] yields each newly armed timer
//!   once, as `(deadline_ms, token)`, in arming order, and [`Mesh::handle_timer`] fires one token.
//!   This keeps one engine event per timer, so the simulator's order of events across nodes, and
//!   so its reports, are those of a driver that schedules every timer on its own
//!   (`docs/adr/0021-core-owned-timers.md`).
//!
//! A token names one arming. Once its timer fired (either way) the token is stale and handing it
//! back is a no-op; so is a token of a timer the core itself no longer wants (a flush whose
//! window moved earlier fires and finds nothing to do).
//!
//! [`Mesh::poll_timeout`]: super::Mesh::poll_timeout
//! [`Mesh::handle_timeout`]: super::Mesh::handle_timeout
//! [`Mesh::poll_armed`]: super::Mesh::poll_armed
//! [`Mesh::handle_timer`]: super::Mesh::handle_timer

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::BuildHasherDefault;

use crate::hash::U64Hasher;

use super::MeshTimer;

/// One arming of a core timer, handed out by [`Mesh::poll_armed`](super::Mesh::poll_armed) and
/// taken back by [`Mesh::handle_timer`](super::Mesh::handle_timer). Opaque; tokens of one
/// [`Mesh`](super::Mesh) are never reused, and [`TimerToken::to_u64`] /
/// [`TimerToken::from_u64`] round-trip it through a driver's own event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimerToken(u64);

impl TimerToken {
    /// The token as a number (for a driver's event queue).
    #[must_use]
    pub fn to_u64(self) -> u64 {
        self.0
    }

    /// A token from [`TimerToken::to_u64`]. A number that never was a token of this core is
    /// simply stale: [`Mesh::handle_timer`](super::Mesh::handle_timer) ignores it.
    #[must_use]
    pub fn from_u64(n: u64) -> Self {
        Self(n)
    }
}

/// Pending timers by token, and their `(deadline, token)` in a min-heap.
///
/// Every input of the simulator's 5,001 agents arms or fires timers here, so both sides are
/// cheap: a hash map of tokens (the core's own sequential numbers, hashed by one multiply:
/// seedless, so no OS randomness) and a binary heap with lazy deletion, instead of two
/// `BTreeMap`s (`take` alone was 10 % of the samples of `reference/small/crash`, with
/// callees). A timer taken by token leaves the map at once and its heap entry stays until it
/// reaches the top, where it is dropped: the top of the heap is always a pending timer, so
/// [`TimerTable::next_deadline`] needs no `&mut`. Tokens order equal deadlines, so timers fire in the same order as before.
///
/// A token-driven table (the simulator's) keeps no heap: its driver orders the timers, so
/// after the first [`TimerTable::next_armed`] the heap is dropped and no longer kept, and the
/// deadline-side methods, which such a driver does not call, find the earliest pending timer
/// by a pass over the map instead (same answers). `TimerTable::take`, which kept the heap, was
/// 1.7 % of the samples of a 45 s cut of `reference/rollout` (session 13).
///
/// Bounded by the core: membership caps its own timers (`max_pending_timers`), each periodic
/// timer is re-armed once per firing, and an input arms at most one flush and one graft check.
/// Taken entries waiting in the heap are bounded too: past twice the pending count (plus a
/// little) the heap is rebuilt from the map.
#[derive(Debug, Default)]
pub(super) struct TimerTable {
    by_token: HashMap<u64, (u64, MeshTimer), BuildHasherDefault<U64Hasher>>,
    /// `(deadline, token)` of every pending timer, plus taken ones not yet at the top; empty
    /// and not kept once `token_driven`.
    by_deadline: BinaryHeap<Reverse<(u64, u64)>>,
    /// The next token to hand out (tokens start at 1).
    next: u64,
    /// The last token [`TimerTable::next_armed`] looked at.
    armed_cursor: u64,
    /// A driver took a token ([`TimerTable::next_armed`]): it orders the timers itself and
    /// holds their tokens, so none may be re-armed under a new token behind its back.
    token_driven: bool,
}

impl TimerTable {
    /// Files `timer` to fire at `at_ms`.
    pub(super) fn arm(&mut self, at_ms: u64, timer: MeshTimer) {
        self.next += 1;
        let token = self.next;
        self.by_token.insert(token, (at_ms, timer));
        if !self.token_driven {
            self.by_deadline.push(Reverse((at_ms, token)));
        }
    }

    /// `(deadline, token)` of the earliest pending timer: the heap's top, or a pass over the
    /// map when the heap is not kept.
    fn earliest(&self) -> Option<(u64, u64)> {
        if self.token_driven {
            self.by_token
                .iter()
                .map(|(token, (at, _))| (*at, *token))
                .min()
        } else {
            self.by_deadline.peek().map(|Reverse(top)| *top)
        }
    }

    /// The earliest deadline, ms.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        self.earliest().map(|(at, _)| at)
    }

    /// The earliest deadline of a pending timer for which `skip` is false, ms. Walks the
    /// heap's implicit tree best-first from the top, so it looks at the skipped timers (and at
    /// taken entries not yet dropped) that come before the answer and their children only.
    pub(super) fn next_deadline_skipping(&self, skip: impl Fn(&MeshTimer) -> bool) -> Option<u64> {
        if self.token_driven {
            return self
                .by_token
                .values()
                .filter(|(_, timer)| !skip(timer))
                .map(|(at, _)| *at)
                .min();
        }
        let heap = self.by_deadline.as_slice();
        let mut frontier: BinaryHeap<Reverse<((u64, u64), usize)>> = BinaryHeap::new();
        if let Some(Reverse(top)) = heap.first() {
            frontier.push(Reverse((*top, 0)));
        }
        while let Some(Reverse(((at, token), i))) = frontier.pop() {
            if let Some((_, timer)) = self.by_token.get(&token) {
                if !skip(timer) {
                    return Some(at);
                }
            }
            for child in [2 * i + 1, 2 * i + 2] {
                if let Some(Reverse(entry)) = heap.get(child) {
                    frontier.push(Reverse((*entry, child)));
                }
            }
        }
        None
    }

    /// The earliest pending timer: `(deadline, token, timer)`.
    pub(super) fn peek(&self) -> Option<(u64, TimerToken, &MeshTimer)> {
        let (at, token) = self.earliest()?;
        let (_, timer) = self.by_token.get(&token).expect("the top is pending");
        Some((at, TimerToken(token), timer))
    }

    /// Removes the earliest timer due at `now_ms`: `(deadline, timer)`.
    pub(super) fn pop_due(&mut self, now_ms: u64) -> Option<(u64, MeshTimer)> {
        let (at, token) = self.earliest()?;
        if at > now_ms {
            return None;
        }
        let (_, timer) = self.by_token.remove(&token).expect("the top is pending");
        if !self.token_driven {
            self.by_deadline.pop();
            self.drop_taken_top();
        }
        Some((at, timer))
    }

    /// Removes the timer of `token`, if it is still pending.
    pub(super) fn take(&mut self, token: TimerToken) -> Option<MeshTimer> {
        let (_, timer) = self.by_token.remove(&token.0)?;
        if self.token_driven {
            return Some(timer);
        }
        self.drop_taken_top();
        if self.by_deadline.len() > 2 * self.by_token.len() + 64 {
            self.by_deadline = self
                .by_token
                .iter()
                .map(|(token, (at, _))| Reverse((*at, *token)))
                .collect();
        }
        Some(timer)
    }

    /// Pops heap entries of timers no longer pending until the top is a pending one.
    fn drop_taken_top(&mut self) {
        while let Some(Reverse((_, token))) = self.by_deadline.peek() {
            if self.by_token.contains_key(token) {
                break;
            }
            self.by_deadline.pop();
        }
        debug_assert!(
            self.by_deadline.len() >= self.by_token.len(),
            "a pending timer is missing from the heap"
        );
    }

    /// The first timer armed after the last one this returned, still pending.
    pub(super) fn next_armed(&mut self) -> Option<(u64, TimerToken)> {
        if !self.token_driven {
            self.token_driven = true;
            self.by_deadline = BinaryHeap::new();
        }
        while self.armed_cursor < self.next {
            self.armed_cursor += 1;
            if let Some((at, _)) = self.by_token.get(&self.armed_cursor) {
                return Some((*at, TimerToken(self.armed_cursor)));
            }
        }
        None
    }

    /// Pending timers, in arming order: `(deadline_ms, timer)`. Sorts: for tests, debug
    /// checks and status pages, not for every input of a release build.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &MeshTimer)> {
        let mut pending: Vec<(&u64, &(u64, MeshTimer))> = self.by_token.iter().collect();
        pending.sort_unstable_by_key(|(token, _)| **token);
        pending.into_iter().map(|(_, (at, t))| (*at, t))
    }

    /// Pending timers in no particular order: for checks that only count them.
    pub(super) fn iter_unordered(&self) -> impl Iterator<Item = (u64, &MeshTimer)> {
        self.by_token.values().map(|(at, t)| (*at, t))
    }

    /// `true` once a driver has taken a token with [`TimerTable::next_armed`].
    pub(super) fn token_driven(&self) -> bool {
        self.token_driven
    }

    pub(super) fn len(&self) -> usize {
        self.by_token.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_timers_pop_by_deadline_then_arming_order_and_never_early() {
        let mut t = TimerTable::default();
        t.arm(20, MeshTimer::Flush);
        t.arm(10, MeshTimer::Graft);
        t.arm(10, MeshTimer::Gc);
        assert_eq!(t.next_deadline(), Some(10));
        assert_eq!(t.pop_due(9), None);
        assert_eq!(t.pop_due(10), Some((10, MeshTimer::Graft)));
        assert_eq!(t.pop_due(10), Some((10, MeshTimer::Gc)));
        assert_eq!(t.pop_due(19), None);
        assert_eq!(t.len(), 1);
        assert_eq!(t.pop_due(25), Some((20, MeshTimer::Flush)));
        assert_eq!(t.len(), 0);
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn tokens_come_out_once_in_arming_order_and_a_fired_token_is_stale() {
        let mut t = TimerTable::default();
        t.arm(30, MeshTimer::Flush);
        t.arm(10, MeshTimer::Gc);
        let (at_a, a) = t.next_armed().unwrap();
        let (at_b, b) = t.next_armed().unwrap();
        assert_eq!((at_a, at_b), (30, 10));
        assert_eq!(t.next_armed(), None, "each arming is handed out once");
        t.arm(5, MeshTimer::IHave);
        let (_, c) = t.next_armed().unwrap();
        assert_eq!(t.take(b), Some(MeshTimer::Gc));
        assert_eq!(t.take(b), None, "a fired token is stale");
        assert_eq!(
            t.pop_due(100),
            Some((5, MeshTimer::IHave)),
            "deadline order"
        );
        assert_eq!(t.take(c), None, "fired by deadline: its token is stale");
        assert_eq!(t.take(TimerToken::from_u64(99)), None);
        assert_eq!(
            t.take(TimerToken::from_u64(a.to_u64())),
            Some(MeshTimer::Flush)
        );
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_token_driven_table_answers_deadline_questions_like_a_heap() {
        let mut heap = TimerTable::default();
        let mut tokens = TimerTable::default();
        let _ = tokens.next_armed();
        let plan = [
            (30, MeshTimer::Flush),
            (10, MeshTimer::Gc),
            (10, MeshTimer::Graft),
            (5, MeshTimer::IHave),
            (50, MeshTimer::Flush),
        ];
        for (at, timer) in plan {
            heap.arm(at, timer.clone());
            tokens.arm(at, timer);
        }
        assert!(tokens.by_deadline.is_empty(), "no heap is kept");
        // The same token (the 4th arming) taken from both.
        assert_eq!(heap.take(TimerToken(4)), Some(MeshTimer::IHave));
        assert_eq!(tokens.take(TimerToken(4)), Some(MeshTimer::IHave));
        let skip_gc = |t: &MeshTimer| *t == MeshTimer::Gc;
        assert_eq!(tokens.next_deadline(), heap.next_deadline());
        assert_eq!(
            tokens.next_deadline_skipping(skip_gc),
            heap.next_deadline_skipping(skip_gc)
        );
        let peek = |t: &TimerTable| {
            t.peek()
                .map(|(at, token, timer)| (at, token, timer.clone()))
        };
        assert_eq!(peek(&tokens), peek(&heap));
        for now in [9, 10, 10, 29, 30, 100] {
            assert_eq!(tokens.pop_due(now), heap.pop_due(now), "at {now}");
            assert_eq!(tokens.next_deadline(), heap.next_deadline());
        }
        assert_eq!((tokens.len(), heap.len()), (0, 0));
    }

    #[test]
    fn timers_taken_below_the_earliest_leave_a_bounded_heap() {
        let mut t = TimerTable::default();
        // The earliest deadline stays pending, so taken timers queue below it in the heap.
        t.arm(1_000, MeshTimer::Gc);
        let _ = t.next_armed();
        let tokens: Vec<TimerToken> = (0..1_000)
            .map(|i| {
                t.arm(2_000 + i, MeshTimer::Flush);
                t.next_armed().expect("just armed").1
            })
            .collect();
        for token in tokens {
            assert_eq!(t.take(token), Some(MeshTimer::Flush));
            assert!(t.by_deadline.len() <= 2 * t.len() + 65, "heap bounded");
        }
        assert_eq!(t.len(), 1);
        assert_eq!(t.next_deadline(), Some(1_000));
        assert_eq!(t.pop_due(5_000), Some((1_000, MeshTimer::Gc)));
        assert_eq!(t.next_deadline(), None);
        assert_eq!(t.pop_due(5_000), None);
    }
}
