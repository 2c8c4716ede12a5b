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
    AuthorityCommand::LeaderTakeover {
        now_ms,
        credit: None,
    }
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

/// Virtual-time model of leader churn (issue 14 item 2, etcd-io/etcd#9888): node-0 goes down
/// at real time 0; the leader proposes an `ExpireLeases` (expiry + checkpoint) every
/// `CHECKPOINT` ms, each committed and applied on every replica `COMMIT` ms later; the leader
/// dies every lease/3 (for up to three leases) and the next one takes over `ELECTION` ms
/// later with its own clock (wildly different offsets). Returns the real time at which the
/// record expired.
fn churn(with_credit: bool) -> u64 {
    const CHECKPOINT: u64 = 2_000;
    const COMMIT: u64 = 50;
    const ELECTION: u64 = 1_500;
    let offsets = [
        7_000_000,
        3,
        900_000_000,
        120_000,
        5,
        86_400_000,
        42,
        1_000_000,
        777,
        31_000,
    ];
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    let mut leader = 0usize;
    let clock = |l: usize, t: u64| offsets[l] + t;
    h.apply(takeover(clock(0, 0))).unwrap();
    h.apply(down(0, clock(0, 0))).unwrap();
    // (checkpoint counter, real time it was applied on the replicas).
    let mut applied: (u64, u64) = (h.state.lease_checkpoint(), 0);
    let mut t = 0u64;
    let mut next_death = LEASE / 3;
    let mut takeovers = 0;
    loop {
        t += CHECKPOINT;
        if takeovers < 9 && t + COMMIT > next_death {
            // The leader dies before this proposal commits; a new one takes over.
            let take_at = next_death + ELECTION;
            leader += 1;
            takeovers += 1;
            let credit = with_credit.then(|| crate::LeaseCredit {
                checkpoint: applied.0,
                elapsed_ms: take_at - applied.1,
            });
            h.apply(AuthorityCommand::LeaderTakeover {
                now_ms: clock(leader, take_at),
                credit,
            })
            .unwrap();
            applied = (h.state.lease_checkpoint(), take_at + COMMIT);
            t = take_at;
            next_death += LEASE / 3;
            continue;
        }
        let out = h.apply(expire(clock(leader, t))).unwrap();
        applied = (h.state.lease_checkpoint(), t + COMMIT);
        if !out.is_empty() {
            assert_eq!(out[0].record.state, Expired);
            assert!(
                takeovers >= 2,
                "churn happened during the lease: {takeovers}"
            );
            return t;
        }
        assert!(t < 10 * LEASE, "never expired");
    }
}

#[test]
fn leader_churn_every_third_of_a_lease_does_not_extend_expiry_past_lease_plus_grace() {
    let expired_at = churn(true);
    // Grace: one election (the deadline may fall while no leader exists) plus one checkpoint
    // interval (the cadence at which expiry is noticed) plus the commit latency each takeover
    // forgets (at most 9 of them).
    let grace = 1_500 + 2_000 + 9 * 50;
    assert!(expired_at >= LEASE, "expired early at {expired_at}");
    assert!(
        expired_at <= LEASE + grace,
        "expired at {expired_at} ms, lease {LEASE} + grace {grace}"
    );
    // Without the credit only checkpointed downtime survives a takeover: each forgets up to
    // a checkpoint interval plus the election, still bounded per takeover but growing with
    // their number. (Before checkpoints, each takeover restarted the whole lease.)
    let without = churn(false);
    assert!(without > expired_at && without <= LEASE + 9 * (2_000 + 1_500) + 2_000);
    eprintln!("lease {LEASE} ms: expired at {expired_at} ms with credit, {without} ms without");
}

#[test]
fn a_takeover_credits_only_the_latest_checkpoint_and_only_nodes_it_counted() {
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    h.apply(h.register(1, "b-1")).unwrap();
    h.apply(down(0, 1_000)).unwrap();
    h.apply(expire(11_000)).unwrap(); // checkpoint: node-0 down 10 s
    let cp = h.state.lease_checkpoint();
    h.apply(down(1, 12_000)).unwrap(); // after the checkpoint: not credited
    h.apply(AuthorityCommand::LeaderTakeover {
        now_ms: 500,
        credit: Some(crate::LeaseCredit {
            checkpoint: cp,
            elapsed_ms: 4_000,
        }),
    })
    .unwrap();
    assert_eq!(h.state.downtime_ms(&node_id(0), 500), Some(14_000));
    assert_eq!(h.state.downtime_ms(&node_id(1), 500), Some(0));
    // A stale credit (an older checkpoint) credits nothing.
    let stale = Some(crate::LeaseCredit {
        checkpoint: cp,
        elapsed_ms: 100_000,
    });
    h.apply(AuthorityCommand::LeaderTakeover {
        now_ms: 900,
        credit: stale,
    })
    .unwrap();
    assert_eq!(h.state.downtime_ms(&node_id(0), 900), Some(14_000));
    h.state.check_invariants().unwrap();
}

/// How a new leader measures the time since the latest checkpoint in [`churn_with_doomed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Measure {
    /// The real time since the checkpoint was applied: a process alive since, or one
    /// restarted since that reads its host's monotonic clock (docs/adr/0024).
    Exact,
    /// At most `CAP` ms: a process restarted since, measuring only by wall clock, as every
    /// new leader of the real-process churn test is before ADR 0024.
    Capped,
}

/// Virtual-time model of leader churn in which leaders die before their takeover commits
/// (issue: "8 leader kills, 4 takeovers committed"): node-0 goes down at real time 0; a
/// leader whose takeover committed checkpoints every `CHECKPOINT` ms (applied `COMMIT` ms
/// later); every lease/10 it dies, and the next `DOOMED` leaders are each elected `ELECTION`
/// ms after the previous death and die `DOOMED_LIFE` ms later with nothing committed (their
/// takeover is lost); the one after them takes over with a credit measured as `measure` says.
/// Returns the real time at which the record expired.
fn churn_with_doomed(measure: Measure) -> u64 {
    const CHECKPOINT: u64 = 2_000;
    const COMMIT: u64 = 50;
    const ELECTION: u64 = 1_500;
    const DOOMED: u64 = 3;
    const DOOMED_LIFE: u64 = 1_000;
    // lease_checkpoint_ms + 4 x election_timeout_ms with the defaults (2 s, 1.5 s).
    const CAP: u64 = 8_000;
    let mut h = Harness::new();
    h.apply(h.register(0, "a-1")).unwrap();
    // Every leader's clock reads far from the others' (offset by its number of hours).
    let mut leader = 0u64;
    let clock = |l: u64, t: u64| l * 3_600_000 + t;
    h.apply(takeover(clock(0, 0))).unwrap();
    h.apply(down(0, clock(0, 0))).unwrap();
    let mut applied: (u64, u64) = (h.state.lease_checkpoint(), 0);
    let mut t = 0u64;
    let mut next_death = LEASE / 10;
    loop {
        t += CHECKPOINT;
        if t + COMMIT > next_death {
            let take_at = next_death + (DOOMED + 1) * ELECTION + DOOMED * DOOMED_LIFE;
            leader += DOOMED + 1;
            let real = take_at - applied.1;
            let elapsed_ms = match measure {
                Measure::Exact => real,
                Measure::Capped => real.min(CAP),
            };
            h.apply(AuthorityCommand::LeaderTakeover {
                now_ms: clock(leader, take_at),
                credit: Some(crate::LeaseCredit {
                    checkpoint: applied.0,
                    elapsed_ms,
                }),
            })
            .unwrap();
            applied = (h.state.lease_checkpoint(), take_at + COMMIT);
            t = take_at;
            next_death = take_at + LEASE / 10;
            continue;
        }
        let out = h.apply(expire(clock(leader, t))).unwrap();
        applied = (h.state.lease_checkpoint(), t + COMMIT);
        if !out.is_empty() {
            assert_eq!(out[0].record.state, Expired);
            return t;
        }
        assert!(t < 10 * LEASE, "never expired");
    }
}

#[test]
fn leaders_killed_before_their_takeover_commits_do_not_postpone_expiry() {
    // With the time measured, a leader that died before its takeover committed changed
    // nothing: the next takeover credits the whole gap. Grace: one such gap (the deadline
    // may fall in it: 4 elections and 3 doomed lives), one checkpoint interval, and the
    // commit latency each takeover forgets (at most 10 of them).
    let exact = churn_with_doomed(Measure::Exact);
    let grace = 4 * 1_500 + 3 * 1_000 + 2_000 + 10 * 50;
    assert!(exact >= LEASE, "expired early at {exact}");
    assert!(
        exact <= LEASE + grace,
        "expired at {exact} ms, lease {LEASE} + grace {grace}"
    );
    // A credit capped below the gap (a restarted leader before ADR 0024) forgets the rest
    // of every gap: expiry slips by a few seconds per churn episode, past the grace.
    let capped = churn_with_doomed(Measure::Capped);
    assert!(capped > LEASE + grace, "capped credit expired at {capped}");
    eprintln!(
        "lease {LEASE} ms, doomed leaders: expired at {exact} ms measured, {capped} ms capped"
    );
}
