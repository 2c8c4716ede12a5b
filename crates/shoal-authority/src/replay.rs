//! At-most-once writes for a caller's retries: the answer of a committed write, kept by
//! `(caller, request_id)` for a while, so a retry of it is answered instead of applied again.
//!
//! An agent's authority client sends every attempt of one call with the same `request_id`
//! (`crates/shoal-agent/src/client.rs`). Without this, a replica that was stalled (`kill
//! -STOP`, a long GC-like pause, a slow disk) applies every attempt queued for it when it
//! resumes: one `register` became five boot generations, and the caller, told 503, was
//! holding none of them. With it, a replica applies the first attempt, answers a retry that
//! arrives while the first is still being committed with nothing (the first attempt's reply
//! carries the same `request_id`, so the caller takes it for the retry), and answers a later
//! retry with the first attempt's answer.
//!
//! The cache is per replica and in memory: a retry that reaches *another* replica (a new
//! leader after a failover) or the same one after a restart is applied again. Registration
//! then yields a newer boot generation, which supersedes the older one (ordering by
//! generation); a transition retried that way is answered by the `AlreadyInState` rule. The
//! same idea as Raft's client session table (Ongaro's thesis, section 6.3), without
//! replicating it: exactly-once across failovers would put every caller's session into the
//! replicated state.
//!
//! Keys include the caller's authenticated node id, so a caller can only replay (or evict,
//! by flooding the bounded table) answers to its own requests; flooding others' entries out
//! only returns them to the behaviour without the cache. Only successful answers are kept:
//! a refused or failed attempt is re-decided on retry.

use std::collections::{HashMap, VecDeque};

use shoal_proto::rpc::{AuthorityError, AuthorityOk};
use shoal_proto::NodeId;

/// Most requests remembered per replica (in flight and answered together).
pub const REPLAY_ENTRIES: usize = 4_096;

/// How long an answer is kept, ms: longer than an agent's whole retry budget
/// (`[authority] rpc_budget_ms`, 10 s by default, at most 60 s).
pub const REPLAY_TTL_MS: u64 = 120_000;

/// What to do with an arriving write request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// First seen: handle it, then call [`ReplayCache::finish`].
    Fresh,
    /// The same request is still being handled: drop this copy (its reply will answer both).
    InFlight,
    /// Already committed: answer with this, do not apply again.
    Replay(Box<AuthorityOk>),
}

#[derive(Debug)]
struct Slot {
    admitted_ms: u64,
    answer: Option<AuthorityOk>,
}

/// Recent write requests by `(caller, request_id)`, bounded by [`REPLAY_ENTRIES`] and
/// [`REPLAY_TTL_MS`]. Time is passed in (ms on any monotonic clock).
#[derive(Debug, Default)]
pub struct ReplayCache {
    slots: HashMap<(NodeId, u64), Slot>,
    /// Admission order, for eviction; may hold keys whose slot was removed or re-admitted
    /// (told apart by `admitted_ms`).
    order: VecDeque<((NodeId, u64), u64)>,
}

impl ReplayCache {
    /// Decides what to do with request `request_id` of `caller` arriving at `now_ms`.
    pub fn admit(&mut self, caller: &NodeId, request_id: u64, now_ms: u64) -> Admission {
        self.evict(now_ms);
        let key = (caller.clone(), request_id);
        if let Some(slot) = self.slots.get(&key) {
            return match &slot.answer {
                Some(ok) => Admission::Replay(Box::new(ok.clone())),
                None => Admission::InFlight,
            };
        }
        self.slots.insert(
            key.clone(),
            Slot {
                admitted_ms: now_ms,
                answer: None,
            },
        );
        self.order.push_back((key, now_ms));
        Admission::Fresh
    }

    /// Records the outcome of a [`Admission::Fresh`] request: a success is kept for replay,
    /// anything else forgotten (a retry is decided again).
    pub fn finish(
        &mut self,
        caller: &NodeId,
        request_id: u64,
        result: &Result<AuthorityOk, AuthorityError>,
    ) {
        let key = (caller.clone(), request_id);
        match result {
            Ok(ok) => {
                if let Some(slot) = self.slots.get_mut(&key) {
                    slot.answer = Some(ok.clone());
                }
            }
            Err(_) => {
                self.slots.remove(&key);
            }
        }
    }

    /// Requests remembered (in flight or answered).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn evict(&mut self, now_ms: u64) {
        while let Some((key, at)) = self.order.front() {
            let expired = now_ms.saturating_sub(*at) >= REPLAY_TTL_MS;
            if !expired && self.order.len() < REPLAY_ENTRIES {
                break;
            }
            let (key, at) = (key.clone(), *at);
            self.order.pop_front();
            if self.slots.get(&key).is_some_and(|s| s.admitted_ms == at) {
                self.slots.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: &str) -> NodeId {
        n.parse().unwrap()
    }

    fn committed() -> Result<AuthorityOk, AuthorityError> {
        Ok(AuthorityOk::Committed {
            records: Vec::new(),
        })
    }

    #[test]
    fn a_retry_of_a_committed_write_is_replayed_not_applied() {
        let mut c = ReplayCache::default();
        let a = node("node-a");
        assert_eq!(c.admit(&a, 7, 0), Admission::Fresh);
        assert_eq!(c.admit(&a, 7, 10), Admission::InFlight);
        c.finish(&a, 7, &committed());
        assert_eq!(
            c.admit(&a, 7, 20),
            Admission::Replay(Box::new(committed().unwrap()))
        );
        // Another caller's request with the same id is its own.
        assert_eq!(c.admit(&node("node-b"), 7, 30), Admission::Fresh);
    }

    #[test]
    fn a_failed_attempt_is_decided_again() {
        let mut c = ReplayCache::default();
        let a = node("node-a");
        assert_eq!(c.admit(&a, 1, 0), Admission::Fresh);
        c.finish(&a, 1, &Err(AuthorityError::NoQuorum));
        assert_eq!(c.admit(&a, 1, 5), Admission::Fresh);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn answers_expire_and_the_table_is_bounded() {
        let mut c = ReplayCache::default();
        let a = node("node-a");
        c.admit(&a, 1, 0);
        c.finish(&a, 1, &committed());
        assert!(matches!(
            c.admit(&a, 1, REPLAY_TTL_MS - 1),
            Admission::Replay(_)
        ));
        assert_eq!(c.admit(&a, 1, REPLAY_TTL_MS), Admission::Fresh);

        let mut c = ReplayCache::default();
        for id in 0..(3 * REPLAY_ENTRIES as u64) {
            c.admit(&a, id, 1_000);
            if id % 2 == 0 {
                c.finish(&a, id, &Err(AuthorityError::NoQuorum));
            }
        }
        assert!(c.len() <= REPLAY_ENTRIES);
        assert!(c.order.len() <= REPLAY_ENTRIES);
        // The newest are kept, the oldest evicted.
        let last = 3 * REPLAY_ENTRIES as u64 - 1;
        assert_eq!(c.admit(&a, last, 1_001), Admission::InFlight);
        assert_eq!(c.admit(&a, 1, 1_002), Admission::Fresh);
    }
}
