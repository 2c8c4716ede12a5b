//! Property tests for the merge laws (invariants 1 and 2, docs/invariants.md).
//!
//! A random but *consistent* history is generated (one authority assigning gap-free revisions,
//! owners signing health with gap-free sequences), then delivered in random orders, with
//! duplicates, split across catalogs and merged in different groupings.

use std::sync::Arc;

use proptest::prelude::*;
use shoal_catalog::testkit::Fixture;
use shoal_catalog::view::AllAlive;
use shoal_catalog::Catalog;
use shoal_proto::{HealthStatus, LifecycleState};

#[derive(Debug, Clone)]
enum Rec {
    Life(Arc<shoal_proto::SignedLifecycle>),
    Health(Arc<shoal_proto::SignedHealth>),
}

/// Turns random ops into a consistent history of signed records.
fn history(fx: &Fixture, ops: &[(u8, u8)]) -> Vec<Rec> {
    let instances = ["a", "b", "c"];
    // (generation, owner, state) per instance
    let mut cur: [Option<(u64, usize, LifecycleState)>; 3] = [None; 3];
    let mut revision = 0u64;
    let mut generation = 0u64;
    let mut seq = [0u64; 8];
    let mut out = Vec::new();
    for &(i, op) in ops {
        let i = usize::from(i % 3);
        let name = instances[i];
        match (op % 4, cur[i]) {
            (0, _) => {
                generation += 1;
                revision += 1;
                let owner = usize::from(op / 4 % 3);
                cur[i] = Some((generation, owner, LifecycleState::Starting));
                out.push(Rec::Life(Arc::new(fx.lifecycle_for(
                    &fx.key,
                    name,
                    owner,
                    generation,
                    revision,
                    LifecycleState::Starting,
                ))));
            }
            (1, Some((g, owner, state))) => {
                let next = match state {
                    LifecycleState::Starting => LifecycleState::Ready,
                    LifecycleState::Ready => LifecycleState::Draining,
                    LifecycleState::Draining => LifecycleState::Expired,
                    LifecycleState::Expired => continue,
                };
                revision += 1;
                cur[i] = Some((g, owner, next));
                out.push(Rec::Life(Arc::new(
                    fx.lifecycle_for(&fx.key, name, owner, g, revision, next),
                )));
            }
            (2 | 3, Some((g, owner, _))) => {
                seq[owner] += 1;
                let status = if op % 4 == 2 {
                    HealthStatus::Passing
                } else {
                    HealthStatus::Failing
                };
                out.push(Rec::Health(Arc::new(
                    fx.health(name, owner, g, 1, seq[owner], status),
                )));
            }
            _ => {}
        }
    }
    out
}

fn build(fx: &Fixture, recs: &[Rec]) -> Catalog {
    let mut c = Catalog::new();
    for r in recs {
        apply(&mut c, fx, r);
    }
    c
}

/// Merges one record. The outcome differs with the order (a record is `Applied` or `Stale`
/// depending on what came first); these laws judge only the state the merges leave.
fn apply(c: &mut Catalog, fx: &Fixture, r: &Rec) {
    let _outcome = match r {
        Rec::Life(l) => c.apply_lifecycle(l.clone(), &fx.keyring),
        Rec::Health(h) => c.apply_health(h.clone(), &fx.keyring),
    };
}

fn ops() -> impl Strategy<Value = Vec<(u8, u8)>> {
    prop::collection::vec((any::<u8>(), any::<u8>()), 0..40)
}

fn merged(fx: &Fixture, a: &Catalog, b: &Catalog) -> Catalog {
    let mut out = a.clone();
    out.merge_catalog(b, &fx.keyring);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any delivery order, with duplicates, yields the same catalog.
    #[test]
    fn delivery_order_does_not_matter(ops in ops(), seed in any::<u64>()) {
        let fx = Fixture::new();
        let recs = history(&fx, &ops);
        let in_order = build(&fx, &recs);
        let mut shuffled = recs.clone();
        shuffled.extend(recs.iter().step_by(2).cloned()); // duplicates
        let mut rng = seed;
        for i in (1..shuffled.len()).rev() {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            shuffled.swap(i, (rng >> 33) as usize % (i + 1));
        }
        let any_order = build(&fx, &shuffled);
        prop_assert_eq!(&in_order, &any_order);
        prop_assert_eq!(in_order.counters().conflict, 0);
    }

    /// merge(a, b) == merge(b, a)
    #[test]
    fn merge_is_commutative(ops in ops(), split in prop::collection::vec(any::<bool>(), 40)) {
        let fx = Fixture::new();
        let recs = history(&fx, &ops);
        let (xa, xb): (Vec<_>, Vec<_>) = recs.iter().cloned().enumerate().partition(|(i, _)| split[i % 40]);
        let a = build(&fx, &xa.into_iter().map(|x| x.1).collect::<Vec<_>>());
        let b = build(&fx, &xb.into_iter().map(|x| x.1).collect::<Vec<_>>());
        prop_assert_eq!(merged(&fx, &a, &b), merged(&fx, &b, &a));
    }

    /// merge(merge(a, b), c) == merge(a, merge(b, c))
    #[test]
    fn merge_is_associative(ops in ops(), split in prop::collection::vec(0u8..3, 40)) {
        let fx = Fixture::new();
        let recs = history(&fx, &ops);
        let part = |k: u8| -> Vec<Rec> {
            recs.iter().enumerate().filter(|(i, _)| split[i % 40] == k).map(|x| x.1.clone()).collect()
        };
        let (a, b, c) = (build(&fx, &part(0)), build(&fx, &part(1)), build(&fx, &part(2)));
        let left = merged(&fx, &merged(&fx, &a, &b), &c);
        let right = merged(&fx, &a, &merged(&fx, &b, &c));
        prop_assert_eq!(&left, &right);
        // and the result equals applying everything to one catalog
        prop_assert_eq!(&left, &build(&fx, &recs));
    }

    /// merge(a, a) == a
    #[test]
    fn merge_is_idempotent(ops in ops()) {
        let fx = Fixture::new();
        let a = build(&fx, &history(&fx, &ops));
        prop_assert_eq!(&merged(&fx, &a, &a), &a);
    }

    /// Once a generation has been seen for an instance, no delivery order ever makes an older
    /// generation the held (or routable) one again.
    #[test]
    fn no_resurrection(ops in ops(), seed in any::<u64>()) {
        let fx = Fixture::new();
        let mut recs = history(&fx, &ops);
        let mut rng = seed;
        for i in (1..recs.len()).rev() {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            recs.swap(i, (rng >> 33) as usize % (i + 1));
        }
        let mut c = Catalog::new();
        let mut seen_gen = std::collections::BTreeMap::new();
        for r in &recs {
            apply(&mut c, &fx, r);
            if let Rec::Life(l) = r {
                let g = seen_gen.entry(l.record.instance.clone()).or_insert(l.record.generation);
                *g = (*g).max(l.record.generation);
            }
            for e in c.routable(&fx.key, &AllAlive) {
                let rec = &e.lifecycle().record;
                prop_assert_eq!(rec.generation, seen_gen[&rec.instance]);
            }
            for (_, inst, e) in c.entries() {
                prop_assert_eq!(e.lifecycle().record.generation, seen_gen[inst]);
                if let Some(h) = e.health() {
                    prop_assert_eq!(h.record.generation, e.lifecycle().record.generation);
                }
            }
        }
    }
}

// ---- with node key replacement (ADR 0006) -------------------------------------------------

/// Like [`history`], plus op 4: the owner node `op / 5 % 3` presents a new key; the authority
/// re-issues every live instance of that node (same generation and state, new revision,
/// reason `NodeKeyChanged`) bound to it. Health is always signed with the node's current key,
/// so records signed with a replaced key stay in the history and arrive in any order. A node
/// gets at most `MAX_KEYS_PER_NODE - 1` replacements: a catalog remembers that many keys per
/// node, and beyond it which old key is still known depends on arrival order (ADR 0006).
fn history_with_replacement(fx: &Fixture, ops: &[(u8, u8)]) -> Vec<Rec> {
    use shoal_proto::{SigningKey, TransitionReason};
    let instances = ["a", "b", "c"];
    let mut cur: [Option<(u64, usize, LifecycleState)>; 3] = [None; 3];
    let mut keys: Vec<SigningKey> = (0..3).map(|n| fx.nodes[n].1.clone()).collect();
    let mut replaced = 0u8;
    let mut replacements = [0usize; 3];
    let mut revision = 0u64;
    let mut generation = 0u64;
    let mut seq = [0u64; 8];
    let mut out = Vec::new();
    let reason_of = |state| match state {
        LifecycleState::Starting => TransitionReason::Registered,
        LifecycleState::Ready => TransitionReason::ReadinessPassed,
        LifecycleState::Draining => TransitionReason::DrainRequested,
        LifecycleState::Expired => TransitionReason::Deregistered,
    };
    for &(i, op) in ops {
        let i = usize::from(i % 3);
        let name = instances[i];
        let bound =
            |keys: &Vec<SigningKey>, owner: usize| Some(keys[owner].verifying_key().to_bytes());
        match (op % 5, cur[i]) {
            (0, _) => {
                generation += 1;
                revision += 1;
                let owner = usize::from(op / 5 % 3);
                cur[i] = Some((generation, owner, LifecycleState::Starting));
                out.push(Rec::Life(Arc::new(fx.lifecycle_bound(
                    &fx.key,
                    name,
                    owner,
                    generation,
                    revision,
                    LifecycleState::Starting,
                    TransitionReason::Registered,
                    bound(&keys, owner),
                ))));
            }
            (1, Some((g, owner, state))) => {
                let next = match state {
                    LifecycleState::Starting => LifecycleState::Ready,
                    LifecycleState::Ready => LifecycleState::Draining,
                    LifecycleState::Draining => LifecycleState::Expired,
                    LifecycleState::Expired => continue,
                };
                revision += 1;
                cur[i] = Some((g, owner, next));
                out.push(Rec::Life(Arc::new(fx.lifecycle_bound(
                    &fx.key,
                    name,
                    owner,
                    g,
                    revision,
                    next,
                    reason_of(next),
                    bound(&keys, owner),
                ))));
            }
            (2 | 3, Some((g, owner, _))) => {
                seq[owner] += 1;
                let status = if op % 5 == 2 {
                    HealthStatus::Passing
                } else {
                    HealthStatus::Failing
                };
                out.push(Rec::Health(Arc::new(fx.health_signed_by(
                    &keys[owner],
                    name,
                    owner,
                    g,
                    1,
                    seq[owner],
                    status,
                ))));
            }
            (4, _) => {
                let node = usize::from(op / 5 % 3);
                if replacements[node] + 1 >= shoal_catalog::catalog::MAX_KEYS_PER_NODE {
                    continue;
                }
                replacements[node] += 1;
                replaced = replaced.wrapping_add(1);
                keys[node] = SigningKey::from_seed([replaced; 32]);
                for (j, c) in cur.iter().enumerate() {
                    if let Some((g, owner, state)) = *c {
                        if owner == node && state != LifecycleState::Expired {
                            revision += 1;
                            out.push(Rec::Life(Arc::new(fx.lifecycle_bound(
                                &fx.key,
                                instances[j],
                                owner,
                                g,
                                revision,
                                state,
                                TransitionReason::NodeKeyChanged,
                                bound(&keys, owner),
                            ))));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    out
}

fn shuffle(recs: &mut [Rec], seed: u64) {
    let mut rng = seed;
    for i in (1..recs.len()).rev() {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        recs.swap(i, (rng >> 33) as usize % (i + 1));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// With node keys replaced mid-history (health signed by old and new keys in flight), any
    /// delivery order, with duplicates, yields the same catalog; and health signed by a
    /// replaced key is never the held one once the re-issue is held.
    #[test]
    fn delivery_order_does_not_matter_with_key_replacement(ops in ops(), seed in any::<u64>()) {
        let fx = Fixture::new();
        let recs = history_with_replacement(&fx, &ops);
        let in_order = build(&fx, &recs);
        let mut shuffled = recs.clone();
        shuffled.extend(recs.iter().step_by(2).cloned());
        shuffle(&mut shuffled, seed);
        let any_order = build(&fx, &shuffled);
        prop_assert_eq!(&in_order, &any_order);
        prop_assert_eq!(in_order.counters().conflict, 0);
        for (_, _, e) in any_order.entries() {
            if let Some(h) = e.health() {
                let bound = e.lifecycle().record.owner_key.expect("every record binds a key");
                prop_assert_eq!(&h.signer.0[..], &bound[..8]);
            }
        }
    }

    /// merge(merge(a, b), c) == merge(a, merge(b, c)) == applying everything, with
    /// replacements; and merge(a, b) == merge(b, a).
    #[test]
    fn merge_laws_hold_with_key_replacement(ops in ops(), split in prop::collection::vec(0u8..3, 40)) {
        let fx = Fixture::new();
        let recs = history_with_replacement(&fx, &ops);
        let part = |k: u8| -> Vec<Rec> {
            recs.iter().enumerate().filter(|(i, _)| split[i % 40] == k).map(|x| x.1.clone()).collect()
        };
        let (a, b, c) = (build(&fx, &part(0)), build(&fx, &part(1)), build(&fx, &part(2)));
        prop_assert_eq!(merged(&fx, &a, &b), merged(&fx, &b, &a));
        let left = merged(&fx, &merged(&fx, &a, &b), &c);
        let right = merged(&fx, &a, &merged(&fx, &b, &c));
        prop_assert_eq!(&left, &right);
        prop_assert_eq!(&left, &build(&fx, &recs));
        prop_assert_eq!(&merged(&fx, &a, &a), &a);
    }
}
