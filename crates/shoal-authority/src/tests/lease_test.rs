//! `NodeDown` / `NodeUp` / `ExpireLeases`: the lease safety net.

use shoal_proto::LifecycleState::*;
use shoal_proto::TransitionReason::*;
use shoal_proto::{Revision, TransitionSource};

use super::*;
use crate::MAX_EXPIRE_BATCH;

fn down(n: usize, at_ms: u64) -> AuthorityCommand {
    AuthorityCommand::NodeDown {
        node: node_id(n),
        at_ms,
    }
}

fn expire(now_ms: u64) -> AuthorityCommand {
    AuthorityCommand::ExpireLeases { now_ms }
}

const T0: u64 = 10_000;
const LEASE: u64 = LEASE_MS as u64;

#[test]
fn records_expire_only_after_the_lease_in_one_batch_with_a_revision_each() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(h.register(0, "a-2")).unwrap();
    h.apply(h.register(1, "b-1")).unwrap();
    h.apply(h.transition(node(0), "a-2", 2, Ready, ReadinessPassed))
        .unwrap();

    assert_eq!(h.apply(down(0, T0)).unwrap(), vec![]); // index 5
    assert_eq!(h.state.down_since_ms(&node_id(0)), Some(T0));
    assert_eq!(h.state.next_lease_deadline_ms(), Some(T0 + LEASE));

    assert_eq!(h.apply(expire(T0 + LEASE - 1)).unwrap(), vec![]); // index 6
    assert_eq!(h.state.head_revision(), Revision(4));

    let out = h.apply(expire(T0 + LEASE)).unwrap(); // index 7
    let auth = TransitionSource::Authority;
    let a1 = h.record("a-1", 0, 1);
    let a2 = h.record("a-2", 0, 2);
    assert_eq!(
        out,
        vec![
            h.signed(&a1, Expired, LeaseExpired, auth, 5, 7),
            h.signed(&a2, Expired, LeaseExpired, auth, 6, 7),
        ]
    );
    let b1 = h.state.binding(&h.fx.key, &inst("b-1")).unwrap();
    assert_eq!(b1.state(), Starting);
    // node-0 owns nothing live any more: it is forgotten, and nothing else is due.
    assert_eq!(h.state.down_since_ms(&node_id(0)), None);
    assert_eq!(h.state.next_lease_deadline_ms(), None);
    assert_eq!(h.apply(expire(T0 + 10 * LEASE)).unwrap(), vec![]);
}

#[test]
fn a_node_back_up_stops_its_lease_clock() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(down(0, T0)).unwrap();
    h.apply(AuthorityCommand::NodeUp { node: node_id(0) })
        .unwrap();
    assert_eq!(h.state.down_since_ms(&node_id(0)), None);
    assert_eq!(h.apply(expire(T0 + 10 * LEASE)).unwrap(), vec![]);
}

#[test]
fn repeated_node_down_reports_do_not_restart_the_clock() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(down(0, T0)).unwrap();
    h.apply(down(0, T0 + 60_000)).unwrap();
    assert_eq!(h.state.down_since_ms(&node_id(0)), Some(T0));
    assert_eq!(h.apply(expire(T0 + LEASE)).unwrap().len(), 1);
}

#[test]
fn each_record_uses_its_own_lease() {
    let mut h = Harness::new();
    let mut short = h.register(0, "short");
    if let AuthorityCommand::Register { lease_ms, .. } = &mut short {
        *lease_ms = 5_000;
    }
    h.apply(short).unwrap();
    h.apply(h.register(0, "long")).unwrap();
    h.apply(down(0, T0)).unwrap();
    assert_eq!(h.state.next_lease_deadline_ms(), Some(T0 + 5_000));
    let out = h.apply(expire(T0 + 5_000)).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].record.instance, inst("short"));
    // The batch was also a checkpoint: the clock restarted there with 5 s carried, so long's
    // deadline is unchanged.
    assert_eq!(
        h.state.downtime_ms(&node_id(0), T0 + 5_000),
        Some(5_000),
        "long is still live"
    );
    assert_eq!(h.state.next_lease_deadline_ms(), Some(T0 + LEASE));
}

#[test]
fn an_expiry_batch_is_bounded_and_the_rest_follow_in_the_next() {
    let mut h = Harness::new();
    for i in 0..=MAX_EXPIRE_BATCH {
        h.apply(h.register(0, &format!("i-{i}"))).unwrap();
    }
    h.apply(down(0, T0)).unwrap();
    let first = h.apply(expire(T0 + LEASE)).unwrap();
    assert_eq!(first.len(), MAX_EXPIRE_BATCH);
    assert_eq!(h.state.next_lease_deadline_ms(), Some(T0 + LEASE));
    let second = h.apply(expire(T0 + LEASE)).unwrap();
    assert_eq!(second.len(), 1);
    let revisions: Vec<u64> = first
        .iter()
        .chain(&second)
        .map(|s| s.record.revision.0)
        .collect();
    let from = MAX_EXPIRE_BATCH as u64 + 2;
    assert_eq!(
        revisions,
        (from..from + MAX_EXPIRE_BATCH as u64 + 1).collect::<Vec<_>>()
    );
    assert_eq!(h.state.next_lease_deadline_ms(), None);
}
