//! Random command sequences: revisions stay gap-free and monotonic, every emitted record
//! verifies with the region key, and a catalog built from all emitted records accepts each one
//! (no conflicts) and ends up holding exactly the authority's bindings.

use std::sync::Arc;

use proptest::prelude::*;
use shoal_catalog::testkit::Fixture;
use shoal_catalog::{Catalog, MergeOutcome, Verifier};
use shoal_proto::{
    FailoverMode, Generation, LifecycleState, Region, Revision, ServicePolicy, TransitionReason,
};

use super::*;

const STATES: [LifecycleState; 4] = [
    LifecycleState::Starting,
    LifecycleState::Ready,
    LifecycleState::Draining,
    LifecycleState::Expired,
];

const REASONS: [TransitionReason; 9] = [
    TransitionReason::Registered,
    TransitionReason::ReadinessPassed,
    TransitionReason::DrainRequested,
    TransitionReason::DrainCancelled,
    TransitionReason::Deregistered,
    TransitionReason::LeaseExpired,
    TransitionReason::ReadinessFailed,
    TransitionReason::ReadinessRecovered,
    TransitionReason::LivenessFailed,
];

#[derive(Debug, Clone)]
enum GenPick {
    Current,
    Older,
    Newer,
}

#[derive(Debug, Clone)]
enum Op {
    Register {
        caller: u8,
        key: u8,
        inst: u8,
        on_node: Option<u8>,
        lease_s: u8,
    },
    Transition {
        caller: u8,
        key: u8,
        inst: u8,
        gen: GenPick,
        to: u8,
        reason: u8,
    },
    Ready {
        key: u8,
        inst: u8,
    },
    NodeDown {
        node: u8,
        back_ms: u32,
    },
    NodeUp {
        node: u8,
    },
    Expire,
    Advance {
        ms: u32,
    },
    Takeover {
        forward: bool,
        jump_ms: u32,
    },
    PutPolicy {
        caller: u8,
        key: u8,
        regions: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let gen = prop_oneof![
        Just(GenPick::Current),
        Just(GenPick::Older),
        Just(GenPick::Newer)
    ];
    prop_oneof![
        4 => (0..7u8, 0..2u8, 0..4u8, proptest::option::of(0..4u8), 1..6u8).prop_map(
            |(caller, key, inst, on_node, lease_s)| Op::Register { caller, key, inst, on_node, lease_s }
        ),
        4 => (0..7u8, 0..2u8, 0..4u8, gen, 0..4u8, 0..9u8).prop_map(
            |(caller, key, inst, gen, to, reason)| Op::Transition { caller, key, inst, gen, to, reason }
        ),
        2 => (0..2u8, 0..4u8).prop_map(|(key, inst)| Op::Ready { key, inst }),
        2 => (0..4u8, 0..3_000u32).prop_map(|(node, back_ms)| Op::NodeDown { node, back_ms }),
        1 => (0..4u8).prop_map(|node| Op::NodeUp { node }),
        2 => Just(Op::Expire),
        3 => (0..4_000u32).prop_map(|ms| Op::Advance { ms }),
        1 => (any::<bool>(), 0..20_000u32).prop_map(|(forward, jump_ms)| Op::Takeover { forward, jump_ms }),
        1 => (0..7u8, 0..2u8, 0..3u8).prop_map(|(caller, key, regions)| Op::PutPolicy { caller, key, regions }),
    ]
}

fn caller(i: u8) -> Caller {
    match i {
        0..=3 => node(i as usize),
        4 => orchestrator("prod"),
        5 => orchestrator("staging"),
        _ => Caller::Operator,
    }
}

fn key(fx: &Fixture, i: u8) -> ServiceKey {
    if i == 0 {
        fx.key.clone()
    } else {
        other_key()
    }
}

/// Turns an op into a command, reading the state only to pick generations.
fn command(h: &Harness, now_ms: &mut u64, op: Op) -> Option<AuthorityCommand> {
    let current = |k: &ServiceKey, i: u8| {
        h.state
            .binding(k, &inst(&format!("i-{i}")))
            .map_or(Generation(1), |b| b.generation())
    };
    Some(match op {
        Op::Register {
            caller: c,
            key: k,
            inst: i,
            on_node,
            lease_s,
        } => AuthorityCommand::Register {
            caller: caller(c),
            key: key(&h.fx, k),
            instance: inst(&format!("i-{i}")),
            on_node: on_node.map(|n| node_id(n as usize)),
            endpoint: Fixture::spec(u32::from(i)),
            lease_ms: u32::from(lease_s) * 1_000,
        },
        Op::Transition {
            caller: c,
            key: k,
            inst: i,
            gen,
            to,
            reason,
        } => {
            let k = key(&h.fx, k);
            let cur = current(&k, i);
            let generation = match gen {
                GenPick::Current => cur,
                GenPick::Older => Generation(cur.0.saturating_sub(1)),
                GenPick::Newer => Generation(cur.0 + 1),
            };
            AuthorityCommand::Transition {
                caller: caller(c),
                key: k,
                instance: inst(&format!("i-{i}")),
                generation,
                to: STATES[to as usize],
                reason: REASONS[reason as usize],
            }
        }
        Op::Ready { key: k, inst: i } => {
            let k = key(&h.fx, k);
            let b = h.state.binding(&k, &inst(&format!("i-{i}")))?;
            AuthorityCommand::Transition {
                caller: Caller::Node(b.node().clone()),
                generation: b.generation(),
                key: k,
                instance: inst(&format!("i-{i}")),
                to: LifecycleState::Ready,
                reason: TransitionReason::ReadinessPassed,
            }
        }
        Op::NodeDown { node, back_ms } => AuthorityCommand::NodeDown {
            node: node_id(node as usize),
            at_ms: now_ms.saturating_sub(u64::from(back_ms)),
        },
        Op::NodeUp { node } => AuthorityCommand::NodeUp {
            node: node_id(node as usize),
        },
        Op::Expire => AuthorityCommand::ExpireLeases { now_ms: *now_ms },
        Op::Advance { ms } => {
            *now_ms += u64::from(ms);
            AuthorityCommand::ExpireLeases { now_ms: *now_ms }
        }
        Op::Takeover { forward, jump_ms } => {
            *now_ms = if forward {
                *now_ms + u64::from(jump_ms)
            } else {
                now_ms.saturating_sub(u64::from(jump_ms))
            };
            AuthorityCommand::LeaderTakeover {
                now_ms: *now_ms,
                credit: None,
            }
        }
        Op::PutPolicy {
            caller: c,
            key: k,
            regions,
        } => AuthorityCommand::PutPolicy {
            caller: caller(c),
            key: key(&h.fx, k),
            policy: ServicePolicy {
                allowed_failover_regions: ["us-east", "ap-south", "us-east"][..regions as usize]
                    .iter()
                    .map(|r| Region::new(*r).unwrap())
                    .collect(),
                mode: FailoverMode::ReadOnly,
                max_cross_region_rps: None,
                max_snapshot_age_s: None,
                on_stale: shoal_proto::StaleAction::Degrade,
                overprovisioning_factor_pct: None,
            },
        },
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_commands_keep_revisions_gap_free_and_records_mergeable(
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        let mut h = Harness::new();
        let mut catalog = Catalog::new();
        let verifying = h.fx.authority.verifying_key();
        let mut now_ms = 1_000_000u64;
        let mut applied = 0u64;
        let mut emitted = 0u64;
        for op in ops {
            let Some(cmd) = command(&h, &mut now_ms, op) else { continue };
            let head = h.state.head_revision();
            let result = h.apply(cmd);
            applied += 1;
            match result {
                Ok(records) => {
                    for (i, signed) in records.iter().enumerate() {
                        prop_assert_eq!(signed.record.revision, Revision(head.0 + 1 + i as u64));
                        prop_assert!(verifying.verify_lifecycle(signed).is_ok());
                        prop_assert!(h.fx.keyring.verify_lifecycle(signed).is_ok());
                        let outcome = catalog.apply_lifecycle(Arc::new(signed.clone()), &h.fx.keyring);
                        prop_assert_eq!(outcome, MergeOutcome::Applied);
                    }
                    emitted += records.len() as u64;
                    prop_assert_eq!(h.state.head_revision(), Revision(head.0 + records.len() as u64));
                }
                Err(_) => prop_assert_eq!(h.state.head_revision(), head),
            }
            prop_assert_eq!(h.state.audit().total(), applied);
        }
        prop_assert_eq!(h.state.head_revision(), Revision(emitted));
        prop_assert_eq!(catalog.counters().conflict, 0);
        prop_assert_eq!(catalog.region_head(&h.fx.region), h.state.head_revision());
        prop_assert!(catalog.region_gap(&h.fx.region).is_none());
        prop_assert_eq!(catalog.len(), h.state.binding_count());
        for (k, i, b) in h.state.bindings() {
            let entry = catalog.entry(k, i).expect("every binding is in the catalog");
            prop_assert_eq!(entry.lifecycle(), b.current());
        }
        for p in h.state.policies() {
            prop_assert!(verifying.verify_policy(p).is_ok());
        }
        h.state.check_invariants().unwrap();
        prop_assert_eq!(AuthorityState::decode(&h.state.encode()).unwrap(), h.state.clone());
    }
}
