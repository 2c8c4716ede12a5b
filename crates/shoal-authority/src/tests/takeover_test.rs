//! `LeaderTakeover`: a new leader grants a full lease of grace from its takeover.

use shoal_proto::LifecycleState::*;

use super::*;

const LEASE: u64 = LEASE_MS as u64;

fn down(n: usize, at_ms: u64) -> AuthorityCommand {
    AuthorityCommand::NodeDown {
        node: node_id(n),
        at_ms,
    }
}

fn expire(now_ms: u64) -> AuthorityCommand {
    AuthorityCommand::ExpireLeases { now_ms }
}

fn takeover(now_ms: u64) -> AuthorityCommand {
    AuthorityCommand::LeaderTakeover { now_ms }
}

#[test]
fn a_leader_whose_clock_is_ahead_does_not_expire_early() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(down(0, 1_000)).unwrap(); // old leader's clock
                                      // The new leader booted long before: its clock reads far more than 1_000 + lease.
    let t = 50 * LEASE;
    assert_eq!(h.apply(takeover(t)).unwrap(), vec![]);
    assert_eq!(h.state.down_since_ms(&node_id(0)), Some(t));
    assert_eq!(h.apply(expire(t)).unwrap(), vec![]);
    assert_eq!(h.apply(expire(t + LEASE - 1)).unwrap(), vec![]);
    let out = h.apply(expire(t + LEASE)).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].record.state, Expired);
}

#[test]
fn a_leader_whose_clock_is_behind_does_not_extend_dead_records() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    let old = 900 * LEASE;
    h.apply(down(0, old)).unwrap();
    // The new leader's clock reads 10_000: the node is expired one lease after the takeover,
    // not at old + lease (900 leases later on this clock).
    h.apply(takeover(10_000)).unwrap();
    assert_eq!(h.state.down_since_ms(&node_id(0)), Some(10_000));
    assert_eq!(h.state.next_lease_deadline_ms(), Some(10_000 + LEASE));
    assert_eq!(h.apply(expire(10_000 + LEASE)).unwrap().len(), 1);
}

#[test]
fn node_down_times_from_before_the_takeover_are_floored_at_it() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(takeover(100_000)).unwrap();
    // The new leader's mesh saw node-0 go down before it became leader.
    h.apply(down(0, 40_000)).unwrap();
    assert_eq!(h.state.down_since_ms(&node_id(0)), Some(100_000));
    assert_eq!(h.apply(expire(40_000 + LEASE)).unwrap(), vec![]);
    assert_eq!(h.apply(expire(100_000 + LEASE)).unwrap().len(), 1);
}

#[test]
fn repeated_takeovers_grant_one_lease_from_the_last() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(down(0, 0)).unwrap();
    h.apply(takeover(LEASE / 2)).unwrap();
    h.apply(takeover(LEASE)).unwrap();
    assert_eq!(h.apply(expire(LEASE + LEASE / 2)).unwrap(), vec![]);
    assert_eq!(h.apply(expire(2 * LEASE)).unwrap().len(), 1);
}
