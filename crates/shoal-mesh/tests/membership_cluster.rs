//! Cluster-level specification of `shoal_mesh::membership`, driven on the crate's one
//! deterministic in-memory network (`support::net`: a virtual clock, a binary heap of events
//! keyed by `(time_ms, seq)`, seeded loss and latency). No wall clock anywhere: every bound
//! below is computed from the config.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::ops::{Deref, DerefMut};

use shoal_mesh::membership::{MemberId, Membership, MembershipConfig, MembershipEvent};
use shoal_proto::{Generation, NodeId};
use support::net::{Net, TestRng};

/// One-way latency of every datagram, drawn uniformly per packet.
const LATENCY_MS: (u64, u64) = (1, 5);

/// SWIM members on the network. Faults: `kill`, `isolate` / `heal`, `restart`, seeded `loss`.
struct Cluster {
    net: Net<Membership>,
    config: MembershipConfig,
}

impl Deref for Cluster {
    type Target = Net<Membership>;
    fn deref(&self) -> &Self::Target {
        &self.net
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.net
    }
}

fn addr(i: usize) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::new(10, 0, (i / 250) as u8, (i % 250 + 1) as u8),
        7946,
    ))
}

fn node_id(i: usize) -> NodeId {
    NodeId::new(format!("node-{i:04}")).unwrap()
}

impl Cluster {
    /// `n` members, all joined through member 0, staggered by 10 ms.
    fn new(n: usize, seed: u64, loss: f64) -> Self {
        let config = MembershipConfig::for_cluster_size(n);
        let mut net = Net::new(seed, LATENCY_MS);
        net.loss = loss;
        net.max_datagram_bytes = config.max_packet_bytes;
        for i in 0..n {
            let id = MemberId {
                node: node_id(i),
                addr: addr(i),
                boot: Generation(1),
            };
            let m = Membership::new(id, config.clone(), seed.wrapping_add(i as u64));
            net.add(addr(i), m);
        }
        let mut c = Cluster { net, config };
        for i in 1..n {
            c.run_until(c.now + 10);
            c.with(i, |m, now| m.join(now, &[addr(0)]));
        }
        c
    }

    /// Runs in 100 ms steps until `done` holds or `limit` ms pass; returns the time it held.
    fn run_until_cond(&mut self, limit: u64, done: impl Fn(&Cluster) -> bool) -> Option<u64> {
        let end = self.now + limit;
        while self.now < end {
            if done(self) {
                return Some(self.now);
            }
            self.run_until(self.now + 100);
        }
        done(self).then_some(self.now)
    }

    /// [`Net::run_until`] (here too, so `c.run_until(c.now + ...)` borrows in two phases).
    fn run_until(&mut self, t: u64) {
        self.net.run_until(t);
    }

    fn converged(&self, expect: usize) -> bool {
        self.live()
            .all(|i| self.nodes[i].m.members().count() == expect)
    }

    fn kill(&mut self, i: usize) {
        self.crash(i);
    }

    /// Restarts slot `i` as a new process with `boot`, joining through member `seed`.
    fn restart_as(&mut self, i: usize, boot: u64, seed: usize) {
        let id = MemberId {
            node: node_id(i),
            addr: addr(i),
            boot: Generation(boot),
        };
        let rng_seed = self.rng().next_u64();
        let m = Membership::new(id, self.config.clone(), rng_seed);
        self.restart(i, m);
        self.with(i, |m, now| m.join(now, &[addr(seed)]));
    }

    /// `Down` events for `node` seen by each observer, first time only.
    fn first_down_of(&self, node: &NodeId, since: u64) -> BTreeMap<usize, u64> {
        let mut out = BTreeMap::new();
        for (t, obs, ev) in &self.events {
            if let MembershipEvent::Down(id) = ev {
                if &id.node == node && *t >= since {
                    out.entry(*obs).or_insert(*t);
                }
            }
        }
        out
    }

    /// Down events about nodes other than `except`, after `since`: false downs.
    fn false_downs(&self, except: &BTreeSet<NodeId>, since: u64) -> Vec<(u64, usize, MemberId)> {
        self.events
            .iter()
            .filter_map(|(t, obs, ev)| match ev {
                MembershipEvent::Down(id) if *t >= since && !except.contains(&id.node) => {
                    Some((*t, *obs, id.clone()))
                }
                _ => None,
            })
            .collect()
    }
}

fn converge(n: usize, seed: u64, loss: f64) -> Cluster {
    let mut c = Cluster::new(n, seed, loss);
    let at = c.run_until_cond(120_000, |c| c.converged(n - 1));
    assert!(at.is_some(), "{n} members did not converge (seed {seed})");
    c
}

#[test]
fn all_members_converge_through_one_seed() {
    let c = converge(80, 1, 0.01);
    for i in c.live() {
        let seen: Vec<_> = c.nodes[i].m.members().map(|m| m.node.clone()).collect();
        assert_eq!(seen.len(), 79);
        assert!(!seen.contains(&node_id(i)), "a member lists itself");
        assert_eq!(c.nodes[i].m.counters().rejected_foca, 0);
    }
}

/// Kill one member; every survivor declares it down within the configured budget, and nobody
/// else is declared down (1% loss).
fn kill_and_measure(n: usize, seed: u64, loss: f64) -> (Cluster, usize, u64, BTreeMap<usize, u64>) {
    let mut c = converge(n, seed, loss);
    c.run_until(c.now + 5_000);
    let victim = n / 2;
    let t0 = c.now;
    c.kill(victim);
    let budget = c.config.detection_budget(n);
    let victim_id = node_id(victim);
    let all_down = c.run_until_cond(3 * budget.total_ms, |c| {
        c.live().all(|i| c.nodes[i].m.is_down(&victim_id))
    });
    assert!(
        all_down.is_some(),
        "not every survivor saw the death (seed {seed})"
    );
    let downs = c.first_down_of(&victim_id, t0);
    assert_eq!(downs.len(), n - 1);
    let worst = downs.values().max().unwrap() - t0;
    assert!(
        worst <= budget.total_ms,
        "detection took {worst} ms > budget {budget:?} (seed {seed})"
    );
    let except = BTreeSet::from([victim_id]);
    assert_eq!(
        c.false_downs(&except, 0),
        vec![],
        "false downs (seed {seed})"
    );
    (c, victim, t0, downs)
}

#[test]
fn killed_member_is_declared_down_by_everyone_within_budget() {
    for seed in [11, 12, 13] {
        kill_and_measure(60, seed, 0.01);
    }
}

#[test]
fn restarted_member_replaces_its_old_identity() {
    let (mut c, victim, _, _) = kill_and_measure(60, 21, 0.01);
    let t1 = c.now;
    c.restart_as(victim, 2, 0);
    let new_id = c.nodes[victim].m.identity().clone();
    let up = c.run_until_cond(30_000, |c| {
        c.live()
            .filter(|&i| i != victim)
            .all(|i| c.nodes[i].m.members().any(|m| *m == new_id))
    });
    assert!(up.is_some(), "restarted member not seen by everyone");
    assert!(c.run_until_cond(60_000, |c| c.converged(59)).is_some());
    let except = BTreeSet::from([node_id(victim)]);
    assert_eq!(c.false_downs(&except, 0), vec![]);
    // Never old and new at once: per observer, the node's Up/Down events alternate.
    check_alternation(&c, &node_id(victim));
    assert!(c.now > t1);
}

/// Restart before anyone noticed the death: the new boot must displace the old identity
/// (`Down(old)` then `Up(new)`), never both active.
#[test]
fn fast_restart_renames_without_holding_both() {
    let mut c = converge(50, 31, 0.01);
    c.run_until(c.now + 2_000);
    let victim = 7;
    c.kill(victim);
    c.run_until(c.now + 300);
    c.restart_as(victim, 2, 0);
    let new_id = c.nodes[victim].m.identity().clone();
    let ok = c.run_until_cond(30_000, |c| {
        c.live()
            .filter(|&i| i != victim)
            .all(|i| c.nodes[i].m.members().any(|m| *m == new_id))
    });
    assert!(ok.is_some());
    check_alternation(&c, &node_id(victim));
    let except = BTreeSet::from([node_id(victim)]);
    assert_eq!(c.false_downs(&except, 0), vec![]);
}

fn check_alternation(c: &Cluster, node: &NodeId) {
    for obs in c.live().collect::<Vec<_>>() {
        let mut active: Option<MemberId> = None;
        for (_, o, ev) in &c.events {
            if *o != obs {
                continue;
            }
            match ev {
                MembershipEvent::Up(id) if &id.node == node => {
                    assert!(
                        active.is_none(),
                        "observer {obs}: {id:?} up while {active:?}"
                    );
                    active = Some(id.clone());
                }
                MembershipEvent::Down(id) if &id.node == node => {
                    assert_eq!(active.as_ref(), Some(id), "observer {obs}: unexpected down");
                    active = None;
                }
                _ => {}
            }
        }
    }
}

#[test]
fn malformed_datagrams_are_counted_and_ignored() {
    let mut c = converge(10, 41, 0.0);
    let target = 3;
    let before: Vec<_> = c.nodes[target].m.members().cloned().collect();
    let from = addr(9);
    let mut junk: Vec<Vec<u8>> = vec![
        vec![],
        vec![b'S'],
        b"XX\x01\x01hello".to_vec(),
        b"SH\x09\x01hello".to_vec(),
        b"SH\x01\xfehello".to_vec(),
        b"SH\x01\x02hello".to_vec(), // RecordPush: not ours
        vec![0u8; 5_000],
    ];
    let mut rng = TestRng::new(7);
    for len in [4usize, 5, 16, 200, 1_196] {
        let mut b = b"SH\x01\x01".to_vec();
        b.extend((4..len).map(|_| rng.next_u64() as u8));
        junk.push(b);
    }
    let decode_rejects = 7;
    for bytes in &junk {
        let now = c.now;
        c.nodes[target].m.handle_datagram(now, from, bytes);
    }
    let k = c.nodes[target].m.counters().clone();
    assert_eq!(k.rejected_decode, decode_rejects);
    assert_eq!(
        k.rejected_decode + k.rejected_foca,
        junk.len() as u64,
        "{k:?}"
    );
    c.drain(target);
    let after: Vec<_> = c.nodes[target].m.members().cloned().collect();
    assert_eq!(before, after);
    // And the cluster carries on.
    c.run_until(c.now + 10_000);
    assert!(c.converged(9));
}

/// A join retry that already fired is stale: handed back again it sends nothing, reports
/// nothing and only counts `stale_timers`, while its first delivery did announce to the seed.
/// (The foca-epoch staleness path is not exercised here.)
#[test]
fn a_join_retry_delivered_twice_is_a_noop_the_second_time() {
    let config = MembershipConfig::for_cluster_size(10);
    let mut m = Membership::new(
        MemberId {
            node: node_id(2),
            addr: addr(2),
            boot: Generation(1),
        },
        config.clone(),
        5,
    );
    m.join(0, &[addr(0)]);
    while m.poll_transmit().is_some() {}
    while m.poll_event().is_some() {}
    let mut retries = Vec::new();
    while let Some((at, t)) = m.poll_timer() {
        if format!("{t:?}").contains("JoinRetry") {
            retries.push((at, t));
        }
    }
    let [(at, retry)] = <[_; 1]>::try_from(retries).expect("one join retry armed");
    // Nobody answered: the first delivery announces to the seed again.
    m.handle_timer(at, retry.clone());
    let mut announced = 0;
    while let Some((to, _)) = m.poll_transmit() {
        assert_eq!(to, addr(0));
        announced += 1;
    }
    assert!(announced > 0, "a live join retry announces to the seed");
    assert_eq!(m.counters().stale_timers, 0);
    while m.poll_timer().is_some() {}
    while m.poll_event().is_some() {}
    // The same token again: stale.
    let before = m.counters();
    m.handle_timer(at + config.join_retry_ms, retry);
    assert!(m.poll_transmit().is_none(), "a stale retry sends nothing");
    assert!(m.poll_timer().is_none(), "a stale retry arms nothing");
    assert!(m.poll_event().is_none(), "a stale retry reports nothing");
    let mut after = m.counters();
    assert_eq!(after.stale_timers, before.stale_timers + 1);
    after.stale_timers = before.stale_timers;
    assert_eq!(after, before, "nothing else moved");
}

#[test]
fn graceful_leave_propagates_without_suspicion() {
    let mut c = converge(60, 51, 0.01);
    c.run_until(c.now + 2_000);
    let leaver = 17;
    let t0 = c.now;
    c.with(leaver, |m, now| m.leave(now));
    c.run_until(c.now + 50);
    c.kill(leaver);
    let id = node_id(leaver);
    let budget = c.config.detection_budget(60);
    let done = c.run_until_cond(budget.total_ms, |c| {
        c.live().all(|i| c.nodes[i].m.is_down(&id))
    });
    let took = done.expect("leave did not propagate") - t0;
    // A leave needs no probe and no suspicion window: dissemination only (+ one probe period
    // of slack for members the first gossip missed).
    assert!(
        took <= budget.dissemination_ms + budget.suspect_raise_ms + c.config.probe_period_ms * 4,
        "leave took {took} ms, budget {budget:?}"
    );
    let except = BTreeSet::from([id]);
    assert_eq!(c.false_downs(&except, 0), vec![]);
}

/// Cut one member off long enough for everyone to declare it down (and for it to declare many
/// others down), then heal: it must come back by itself under a new boot generation, and the
/// downs it formed while cut off must not spread to healthy members.
#[test]
fn partitioned_member_rejoins_by_itself_after_heal() {
    let n = 50;
    let mut c = converge(n, 61, 0.01);
    c.run_until(c.now + 2_000);
    let cut = 23;
    let t0 = c.now;
    c.isolate(cut);
    let id = node_id(cut);
    let budget = c.config.detection_budget(n);
    c.run_until(c.now + budget.total_ms + 20_000);
    assert!(c
        .live()
        .filter(|&i| i != cut)
        .all(|i| c.nodes[i].m.is_down(&id)));
    c.heal();
    let healed = c.run_until_cond(60_000, |c| c.converged(n - 1));
    assert!(healed.is_some(), "isolated member did not rejoin");
    let me = c.nodes[cut].m.identity().clone();
    assert!(
        me.boot > Generation(1),
        "rejoin must renew the boot generation"
    );
    for i in c.live().filter(|&i| i != cut) {
        assert!(c.nodes[i].m.members().any(|m| *m == me));
    }
    // Only the cut member's view may have seen downs; nobody else saw a healthy member down.
    let others: Vec<_> = c
        .false_downs(&BTreeSet::from([id]), t0)
        .into_iter()
        .filter(|(_, obs, _)| *obs != cut)
        .collect();
    assert_eq!(others, vec![], "healthy members declared down after heal");
    check_alternation(&c, &node_id(cut));
}

/// A third of the members cut off from the rest (`reference/partition`: zone a of a region
/// against zones b and c). The cut-off third fails two thirds of its probes, so probe health
/// (`membership/accuser.rs`) withholds many of its downs, and a member on its own side dies
/// during the split. After the heal every live member holds the dead one down within a few
/// suspicion windows (well inside a probe round, 30 s here), and the two sides re-merge
/// into one mesh.
#[test]
fn a_third_cut_off_heals_and_its_dead_member_is_declared_everywhere() {
    let n = 60;
    let mut c = converge(n, 83, 0.0);
    c.run_until(c.now + 2_000);
    let minority: Vec<usize> = (0..n).filter(|i| i % 3 == 0).collect();
    c.split(&minority);
    c.run_until(c.now + 20_000);
    let dead = 3;
    c.kill(dead);
    c.run_until(c.now + 120_000);
    let withholding = minority
        .iter()
        .filter(|&&i| i != dead && c.nodes[i].m.counters().downs_withheld > 0)
        .count();
    assert!(
        withholding * 2 > minority.len(),
        "only {withholding} cut-off members withheld a down: the split does not exercise probe health"
    );
    c.heal();
    let healed = c.now;
    let id = node_id(dead);
    let limit = 5 * c.config.suspect_to_down_after_ms + 5_000;
    assert!(limit < (n as u64 - 1) * c.config.probe_period_ms);
    let all_down = c.run_until_cond(limit, |c| c.live().all(|i| c.nodes[i].m.is_down(&id)));
    let holdouts: Vec<usize> = c.live().filter(|&i| !c.nodes[i].m.is_down(&id)).collect();
    assert!(
        all_down.is_some(),
        "{} ms after the heal, members {holdouts:?} do not hold the dead member down",
        c.now - healed
    );
    let whole = c.run_until_cond(60_000, |c| c.converged(n - 2));
    assert!(
        whole.is_some(),
        "the two sides did not re-merge after the heal"
    );
}

#[test]
fn same_seed_same_history() {
    let a = kill_and_measure(30, 71, 0.02).3;
    let b = kill_and_measure(30, 71, 0.02).3;
    assert_eq!(a, b);
}

/// Measurement, not a gate: `cargo test --release -p shoal-mesh --test membership_cluster
/// -- --ignored --nocapture measure_detection`. Env: MEASURE_N (default 1667), MEASURE_KILLS
/// (default 20), MEASURE_LOSS (default 0.01), MEASURE_SEED.
#[test]
#[ignore]
fn measure_detection() {
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let n: usize = env("MEASURE_N", "1667").parse().unwrap();
    let kills: usize = env("MEASURE_KILLS", "20").parse().unwrap();
    let loss: f64 = env("MEASURE_LOSS", "0.01").parse().unwrap();
    let seed: u64 = env("MEASURE_SEED", "1").parse().unwrap();
    let mut c = Cluster::new(n, seed, loss);
    let at = c.run_until_cond(600_000, |c| c.converged(n - 1));
    println!("n={n} loss={loss} converged at {at:?} ms");
    c.run_until(c.now + 10_000);
    let t_start = c.now;
    let budget = c.config.detection_budget(n);
    println!("config {:?}\nbudget {budget:?}", c.config);
    let mut per_observer = Vec::new();
    let mut per_kill = Vec::new();
    let mut victims = BTreeSet::new();
    for k in 0..kills {
        let victim = 1 + (k * 7919) % (n - 1);
        let t0 = c.now;
        c.kill(victim);
        victims.insert(node_id(victim));
        let vid = node_id(victim);
        c.run_until_cond(60_000, |c| c.live().all(|i| c.nodes[i].m.is_down(&vid)));
        let downs = c.first_down_of(&vid, t0);
        let ds: Vec<u64> = downs.values().map(|t| t - t0).collect();
        let worst = *ds.iter().max().unwrap_or(&u64::MAX);
        println!(
            "kill {k}: victim {victim} observers {} last {worst} ms",
            ds.len()
        );
        per_kill.push(worst);
        per_observer.extend(ds);
        c.run_until(c.now + 5_000);
    }
    let q = |v: &mut Vec<u64>, p: f64| {
        v.sort();
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    };
    println!(
        "per observer: count {} p50 {} p99 {} max {}",
        per_observer.len(),
        q(&mut per_observer, 0.5),
        q(&mut per_observer, 0.99),
        q(&mut per_observer, 1.0)
    );
    println!(
        "per kill (last observer): count {} p50 {} p99 {} max {}",
        per_kill.len(),
        q(&mut per_kill, 0.5),
        q(&mut per_kill, 0.99),
        q(&mut per_kill, 1.0)
    );
    let fd = c.false_downs(&victims, t_start);
    println!("false downs: {}", fd.len());
    for (t, obs, id) in fd.iter().take(3) {
        println!("  false down at {t} by {obs}: {id:?}");
    }
    let sum = |f: &dyn Fn(&shoal_mesh::membership::MembershipCounters) -> u64| -> u64 {
        c.live().map(|i| f(&c.nodes[i].m.counters())).sum()
    };
    println!(
        "ignored_turn_undead {} timer_errors {} overflow t/ti/e {}/{}/{} identity_conflicts {}",
        sum(&|k| k.ignored_turn_undead),
        sum(&|k| k.timer_errors),
        sum(&|k| k.transmit_overflow),
        sum(&|k| k.timer_overflow),
        sum(&|k| k.event_overflow),
        sum(&|k| k.identity_conflicts)
    );
    let rej: u64 = c.live().map(|i| c.nodes[i].m.counters().rejoins).sum();
    println!("rejoins among survivors: {rej}");
}
