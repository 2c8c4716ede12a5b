//! The driver's timer queue: the mesh core hands out `(deadline_ms, timer)` pairs
//! (`Mesh::poll_timer`) and expects each back at or after its deadline (`Mesh::handle_timer`).

use std::collections::BTreeMap;

use shoal_mesh::MeshTimer;

/// Pending mesh timers ordered by deadline, then by arrival (two timers with the same
/// deadline fire in the order the core armed them, as in the simulator).
///
/// Bounded by the core: it arms each periodic timer once per firing and at most one
/// flush / graft check per input, and a stale timer is a no-op when it fires.
#[derive(Debug, Default)]
pub struct TimerQueue {
    by_deadline: BTreeMap<(u64, u64), MeshTimer>,
    seq: u64,
}

impl TimerQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Files `timer` to fire at monotonic ms `at_ms`.
    pub fn push(&mut self, at_ms: u64, timer: MeshTimer) {
        self.seq += 1;
        self.by_deadline.insert((at_ms, self.seq), timer);
    }

    /// The earliest deadline, ms; `None` when nothing is armed.
    pub fn next_deadline(&self) -> Option<u64> {
        self.by_deadline.keys().next().map(|(at, _)| *at)
    }

    /// Removes and returns the earliest timer due at `now_ms`, if any.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<MeshTimer> {
        let entry = self.by_deadline.first_entry()?;
        if entry.key().0 > now_ms {
            return None;
        }
        Some(entry.remove())
    }

    /// Timers queued.
    pub fn len(&self) -> usize {
        self.by_deadline.len()
    }

    /// True when no timer is queued.
    pub fn is_empty(&self) -> bool {
        self.by_deadline.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_pop_by_deadline_then_arrival_and_never_early() {
        let mut q = TimerQueue::new();
        q.push(20, MeshTimer::Flush);
        q.push(10, MeshTimer::Graft);
        q.push(10, MeshTimer::Flush);
        assert_eq!(q.next_deadline(), Some(10));
        assert_eq!(q.pop_due(9), None);
        assert!(matches!(q.pop_due(10), Some(MeshTimer::Graft)));
        assert!(matches!(q.pop_due(10), Some(MeshTimer::Flush)));
        assert_eq!(q.pop_due(19), None);
        assert_eq!(q.len(), 1);
        assert!(matches!(q.pop_due(25), Some(MeshTimer::Flush)));
        assert!(q.is_empty());
        assert_eq!(q.next_deadline(), None);
    }
}
