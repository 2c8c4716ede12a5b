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

use std::collections::{BTreeMap, BTreeSet};

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

/// Pending timers by token (arming order) and by (deadline, token).
///
/// Bounded by the core: membership caps its own timers (`max_pending_timers`), each periodic
/// timer is re-armed once per firing, and an input arms at most one flush and one graft check.
#[derive(Debug, Default)]
pub(super) struct TimerTable {
    by_token: BTreeMap<u64, (u64, MeshTimer)>,
    by_deadline: BTreeSet<(u64, u64)>,
    /// The next token to hand out (tokens start at 1).
    next: u64,
    /// The last token [`TimerTable::next_armed`] handed out.
    armed_cursor: u64,
}

impl TimerTable {
    /// Files `timer` to fire at `at_ms`.
    pub(super) fn arm(&mut self, at_ms: u64, timer: MeshTimer) {
        self.next += 1;
        let token = self.next;
        self.by_token.insert(token, (at_ms, timer));
        self.by_deadline.insert((at_ms, token));
    }

    /// The earliest deadline, ms.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        self.by_deadline.first().map(|(at, _)| *at)
    }

    /// Removes the earliest timer due at `now_ms`.
    pub(super) fn pop_due(&mut self, now_ms: u64) -> Option<MeshTimer> {
        let &(at, token) = self.by_deadline.first()?;
        if at > now_ms {
            return None;
        }
        self.by_deadline.pop_first();
        let (_, timer) = self.by_token.remove(&token).expect("indexed both ways");
        Some(timer)
    }

    /// Removes the timer of `token`, if it is still pending.
    pub(super) fn take(&mut self, token: TimerToken) -> Option<MeshTimer> {
        let (at, timer) = self.by_token.remove(&token.0)?;
        self.by_deadline.remove(&(at, token.0));
        Some(timer)
    }

    /// The first timer armed after the last one this returned, still pending.
    pub(super) fn next_armed(&mut self) -> Option<(u64, TimerToken)> {
        let (&token, &(at, _)) = self.by_token.range(self.armed_cursor + 1..).next()?;
        self.armed_cursor = token;
        Some((at, TimerToken(token)))
    }

    /// Pending timers, in arming order: `(deadline_ms, timer)`.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &MeshTimer)> {
        self.by_token.values().map(|(at, t)| (*at, t))
    }

    pub(super) fn len(&self) -> usize {
        debug_assert_eq!(self.by_token.len(), self.by_deadline.len());
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
        assert_eq!(t.pop_due(10), Some(MeshTimer::Graft));
        assert_eq!(t.pop_due(10), Some(MeshTimer::Gc));
        assert_eq!(t.pop_due(19), None);
        assert_eq!(t.len(), 1);
        assert_eq!(t.pop_due(25), Some(MeshTimer::Flush));
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
        assert_eq!(t.pop_due(100), Some(MeshTimer::IHave), "deadline order");
        assert_eq!(t.take(c), None, "fired by deadline: its token is stale");
        assert_eq!(t.take(TimerToken::from_u64(99)), None);
        assert_eq!(
            t.take(TimerToken::from_u64(a.to_u64())),
            Some(MeshTimer::Flush)
        );
        assert_eq!(t.len(), 0);
    }
}
