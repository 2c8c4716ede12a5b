//! Engine behaviour: determinism, network model, partitions, stalls, stream order, limits.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use shoal_sim::net::{Chance, Latency, NetConfig};
use shoal_sim::node::NodeCtx;
use shoal_sim::rng::RngTree;
use shoal_sim::runner::{run, Harness, RunConfig};
use shoal_sim::scenario::{FaultKind, Scenario, TimedFault};
use shoal_sim::testkit::{PingConfig, PingHarness, PingNode};
use shoal_sim::topology::Topology;
use shoal_sim::{Channel, SimNode, Transmit, World};

/// Records everything it receives; sends what the test queues.
#[derive(Default)]
struct Rec {
    got: Vec<(u64, SocketAddr, Channel, Vec<u8>)>,
    fired: Vec<(u64, u64)>,
    out: VecDeque<Transmit>,
    timers: VecDeque<(u64, u64)>,
}

impl SimNode for Rec {
    type Note = ();

    fn handle_datagram(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]) {
        self.got
            .push((now_ms, from, Channel::Datagram, bytes.to_vec()));
    }
    fn handle_stream_message(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]) {
        self.got
            .push((now_ms, from, Channel::Stream, bytes.to_vec()));
    }
    fn handle_timer(&mut self, now_ms: u64, token: u64) {
        self.fired.push((now_ms, token));
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }
    fn poll_timer(&mut self) -> Option<(u64, u64)> {
        self.timers.pop_front()
    }
}

fn world(n: u32, net: NetConfig) -> World<Rec> {
    let topo = Arc::new(Topology::uniform(1, 1, n).unwrap());
    let mut w = World::new(topo, net, &RngTree::new(42));
    w.start_all(|_| Rec::default());
    w
}

fn addr(w: &World<Rec>, i: u32) -> SocketAddr {
    w.topology().node(i).addr
}

fn send(w: &mut World<Rec>, from: u32, to: u32, channel: Channel, bytes: Vec<u8>) {
    let to = addr(w, to);
    w.with_node(from, |n, _| {
        n.out.push_back(Transmit { to, channel, bytes })
    })
    .unwrap();
}

fn received(w: &World<Rec>, i: u32) -> &[(u64, SocketAddr, Channel, Vec<u8>)] {
    &w.node(i).unwrap().got
}

const SMALL: &str = r#"
name = "det"
duration_ms = 20000
[[topology.regions]]
name = "a"
zones = ["x", "y"]
agents_per_zone = 10
[[topology.regions]]
name = "b"
zones = ["x"]
agents_per_zone = 10
[network]
loss_pct = 2.0
dup_pct = 1.0
[toy]
ping_interval_ms = 100
[[faults]]
at_ms = 5000
action = "crash"
nodes = { random = 3 }
[[faults]]
at_ms = 6000
action = "stall"
nodes = { random = 2 }
stall_ms = 50
period_ms = 200
[[faults]]
at_ms = 8000
action = "cut"
a = { region = "a" }
b = { region = "b" }
[[faults]]
at_ms = 12000
action = "restart"
nodes = { crashed = true }
[[faults]]
at_ms = 14000
action = "heal"
"#;

fn report_json(seed: u64) -> String {
    let s = Scenario::parse(SMALL).unwrap();
    let mut h = PingHarness {
        cfg: PingConfig::from(&s.toy),
    };
    run(
        &s,
        &mut h,
        &RunConfig {
            seed,
            progress: false,
            threads: 1,
            min_window_events: None,
        },
    )
    .unwrap()
    .report
    .to_json()
}

#[test]
fn same_seed_byte_identical_different_seed_differs() {
    let a = report_json(7);
    assert_eq!(a, report_json(7));
    assert_ne!(a, report_json(8));
    assert!(a.contains("\"stream_order_per_pair\""));
}

#[test]
fn loss_rate_matches_configuration() {
    let net = NetConfig {
        loss: Chance::from_pct(10.0),
        ..NetConfig::default()
    };
    let mut w = world(2, net);
    for _ in 0..20_000 {
        send(&mut w, 0, 1, Channel::Datagram, vec![1; 10]);
    }
    w.run_until(1_000_000);
    let c = w.counters(0);
    assert_eq!(c.datagram_out.msgs, 20_000);
    let lost = c.dropped.loss;
    assert!(
        (1_600..=2_400).contains(&lost),
        "lost {lost} of 20000 at 10%"
    );
    assert_eq!(received(&w, 1).len() as u64, 20_000 - lost);
    assert_eq!(w.counters(1).datagram_in.msgs, 20_000 - lost);
}

#[test]
fn duplication_adds_copies() {
    let net = NetConfig {
        dup: Chance::from_pct(100.0),
        ..NetConfig::default()
    };
    let mut w = world(2, net);
    send(&mut w, 0, 1, Channel::Datagram, vec![9]);
    send(&mut w, 0, 1, Channel::Stream, vec![8]);
    w.run_until(1_000_000);
    assert_eq!(
        received(&w, 1).len(),
        3,
        "datagram duplicated, stream never"
    );
    assert_eq!(w.counters(0).duplicated, 1);
}

#[test]
fn partition_drops_exactly_what_is_cut() {
    let mut w = world(6, NetConfig::default());
    w.cut(&[0, 1], &[2, 3]);
    w.cut_one_way(&[4], &[5]);
    for from in 0..6 {
        for to in 0..6 {
            if from != to {
                send(&mut w, from, to, Channel::Datagram, vec![from as u8]);
                send(&mut w, from, to, Channel::Stream, vec![from as u8]);
            }
        }
    }
    w.run_until(1_000_000);
    let blocked = |a: u32, b: u32| {
        ((a < 2 && (2..4).contains(&b)) || (b < 2 && (2..4).contains(&a))) || (a == 4 && b == 5)
    };
    let mut expect_drops = 0;
    for to in 0..6u32 {
        for from in 0..6u32 {
            if from == to {
                continue;
            }
            let n = received(&w, to)
                .iter()
                .filter(|m| m.1 == addr(&w, from))
                .count();
            let want = if blocked(from, to) { 0 } else { 2 };
            assert_eq!(n, want, "{from} -> {to}");
            expect_drops += 2 - want as u64;
        }
    }
    let total: u64 = (0..6).map(|i| w.counters(i).dropped.partition).sum();
    assert_eq!(total, expect_drops);
    // Heal restores everything.
    w.heal();
    send(&mut w, 0, 2, Channel::Datagram, vec![1]);
    w.run_until(2_000_000);
    assert_eq!(
        received(&w, 2)
            .iter()
            .filter(|m| m.1 == addr(&w, 0))
            .count(),
        1
    );
}

#[test]
fn isolate_and_isolate_except_and_recover() {
    let mut w = world(4, NetConfig::default());
    w.isolate(0);
    w.isolate_except(1, 2);
    for from in 0..4 {
        for to in 0..4 {
            if from != to {
                send(&mut w, from, to, Channel::Datagram, vec![]);
            }
        }
    }
    w.run_until(1_000_000);
    let got = |w: &World<Rec>, to: u32| -> Vec<u32> {
        received(w, to)
            .iter()
            .map(|m| w.topology().index_of(m.1).unwrap())
            .collect()
    };
    assert!(got(&w, 0).is_empty());
    assert_eq!(got(&w, 1), vec![2]);
    assert_eq!(got(&w, 2).len(), 2); // from 1 and 3
    assert!(got(&w, 2).contains(&1));
    assert_eq!(got(&w, 3).len(), 1); // only 2; 0 and 1 are cut off
    w.recover(0);
    w.recover(1);
    assert!(w.link_faults().is_empty());
    send(&mut w, 3, 0, Channel::Datagram, vec![]);
    w.run_until(2_000_000);
    assert_eq!(got(&w, 0), vec![3]);
}

#[test]
fn cpu_stall_delays_processing_in_order() {
    let mut w = world(2, NetConfig::default());
    w.run_until(1_000_000); // t = 1 s
    w.stall(1, 300, 1000, None); // stalled during [1.0, 1.3) s of every second
    w.with_node(1, |n, now| n.timers.push_back((now + 100, 77)))
        .unwrap();
    for i in 0..5u8 {
        send(&mut w, 0, 1, Channel::Stream, vec![i]);
        send(&mut w, 0, 1, Channel::Datagram, vec![100 + i]);
    }
    w.run_until(1_250_000);
    assert!(
        received(&w, 1).is_empty(),
        "nothing handled during the stall"
    );
    assert!(w.is_stalled(1));
    w.run_until(1_300_000);
    let got = received(&w, 1);
    assert_eq!(got.len(), 10);
    assert!(got.iter().all(|m| m.0 == 1300), "handled when it wakes");
    let streams: Vec<u8> = got
        .iter()
        .filter(|m| m.2 == Channel::Stream)
        .map(|m| m.3[0])
        .collect();
    assert_eq!(streams, vec![0, 1, 2, 3, 4]);
    assert_eq!(w.node(1).unwrap().fired, vec![(1300, 77)]);
    assert_eq!(w.stats().deferred_by_stall, 11);
    // Outside the stall window messages are handled on arrival.
    w.run_until(1_500_000);
    send(&mut w, 0, 1, Channel::Datagram, vec![1]);
    w.run_until(1_600_000);
    assert_eq!(received(&w, 1).last().unwrap().0, 1500);
}

#[test]
fn stream_is_ordered_per_pair_datagrams_are_not() {
    let net = NetConfig {
        latency: [Latency::uniform(1_000, 50_000); 3],
        ..NetConfig::default()
    };
    let mut w = world(3, net);
    for i in 0..200u32 {
        let b = i.to_le_bytes().to_vec();
        send(&mut w, 0, 1, Channel::Stream, b.clone());
        send(&mut w, 2, 1, Channel::Stream, b.clone());
        send(&mut w, 0, 1, Channel::Datagram, b);
        let t = w.now_us() + 100;
        w.run_until(t);
    }
    w.run_until(10_000_000);
    let seq = |from: u32, ch: Channel| -> Vec<u32> {
        received(&w, 1)
            .iter()
            .filter(|m| m.1 == addr(&w, from) && m.2 == ch)
            .map(|m| u32::from_le_bytes(m.3[..4].try_into().unwrap()))
            .collect()
    };
    let want: Vec<u32> = (0..200).collect();
    assert_eq!(seq(0, Channel::Stream), want);
    assert_eq!(seq(2, Channel::Stream), want);
    let dg = seq(0, Channel::Datagram);
    assert_eq!(dg.len(), 200);
    assert_ne!(dg, want, "jitter reorders datagrams");
}

#[test]
fn oversize_is_dropped_and_counted() {
    let net = NetConfig {
        max_datagram_bytes: 100,
        max_stream_message_bytes: 1000,
        ..NetConfig::default()
    };
    let mut w = world(2, net);
    send(&mut w, 0, 1, Channel::Datagram, vec![0; 100]);
    send(&mut w, 0, 1, Channel::Datagram, vec![0; 101]);
    send(&mut w, 0, 1, Channel::Stream, vec![0; 1000]);
    send(&mut w, 0, 1, Channel::Stream, vec![0; 1001]);
    w.run_until(1_000_000);
    assert_eq!(received(&w, 1).len(), 2);
    let c = w.counters(0);
    assert_eq!(c.dropped.oversize, 2);
    assert_eq!(c.datagram_out.msgs, 2);
    assert_eq!(c.datagram_out.bytes, 201);
}

#[test]
fn unknown_address_is_counted() {
    let mut w = world(2, NetConfig::default());
    let to: SocketAddr = "10.0.0.1:7000".parse().unwrap();
    w.with_node(0, |n, _| {
        n.out.push_back(Transmit {
            to,
            channel: Channel::Datagram,
            bytes: vec![],
        })
    });
    w.run_until(1_000_000);
    assert_eq!(w.counters(0).dropped.unknown_addr, 1);
}

#[test]
fn crash_drops_in_flight_and_old_timers() {
    let mut w = world(2, NetConfig::default());
    w.with_node(1, |n, now| n.timers.push_back((now + 10, 1)))
        .unwrap();
    send(&mut w, 0, 1, Channel::Stream, vec![1]);
    send(&mut w, 0, 1, Channel::Datagram, vec![2]);
    w.crash(1);
    assert!(w.node(1).is_none());
    w.run_until(100_000);
    assert_eq!(w.counters(0).dropped.crashed, 2);
    assert_eq!(w.stats().stale_timers, 1);
    // A stream message sent before a restart is dropped even if it arrives after it
    // (connection reset); a datagram is delivered to the new process.
    send(&mut w, 0, 1, Channel::Stream, vec![3]);
    send(&mut w, 0, 1, Channel::Datagram, vec![4]);
    let ctx = w.ctx_for(1);
    assert_eq!(ctx.epoch, 1);
    w.start(1, Rec::default());
    w.run_until(1_000_000);
    let got: Vec<u8> = received(&w, 1).iter().map(|m| m.3[0]).collect();
    assert_eq!(got, vec![4]);
    assert_eq!(w.counters(0).dropped.crashed, 3);
}

#[test]
fn clock_skew_offsets_local_time() {
    let mut w = world(1, NetConfig::default());
    w.run_until(10_000_000);
    w.set_clock_skew(0, -3_000);
    assert_eq!(w.local_ms(0), 7_000);
    // A timer for local 7,500 fires at global 10,500.
    w.with_node(0, |n, now| n.timers.push_back((now + 500, 5)))
        .unwrap();
    w.run_until(10_499_000);
    assert!(w.node(0).unwrap().fired.is_empty());
    w.run_until(10_500_000);
    assert_eq!(w.node(0).unwrap().fired, vec![(7_500, 5)]);
}

/// The ping harness, recording every fault the runner hands it.
struct Recording {
    ping: PingHarness,
    seen: Vec<(u64, FaultKind, Vec<u32>)>,
}

impl Harness for Recording {
    type Node = PingNode;
    fn make_node(&mut self, ctx: &NodeCtx) -> PingNode {
        self.ping.make_node(ctx)
    }
    fn on_fault(&mut self, world: &mut World<PingNode>, fault: &TimedFault, targets: &[u32]) {
        assert_eq!(world.now_ms(), fault.at_ms, "a step runs at its own time");
        self.seen.push((fault.at_ms, fault.kind, targets.to_vec()));
    }
}

const SPREAD: &str = r#"
name = "spread"
duration_ms = 10000
[[topology.regions]]
name = "a"
zones = ["x", "y"]
agents_per_zone = 5
[[topology.regions]]
name = "b"
zones = ["x"]
agents_per_zone = 4
[[faults]]
at_ms = 1000
action = "restart"
nodes = { region = "a" }
spread_ms = 5000
[[faults]]
at_ms = 2000
action = "crash"
nodes = [10]
"#;

fn run_spread(seed: u64) -> (Vec<(u64, FaultKind, Vec<u32>)>, shoal_sim::report::Report) {
    let s = Scenario::parse(SPREAD).unwrap();
    let mut h = Recording {
        ping: PingHarness {
            cfg: PingConfig::from(&s.toy),
        },
        seen: Vec::new(),
    };
    let cfg = RunConfig {
        seed,
        progress: false,
        threads: 1,
        min_window_events: None,
    };
    let report = run(&s, &mut h, &cfg).unwrap().report;
    (h.seen, report)
}

#[test]
fn spread_restart_hits_each_target_once_evenly_in_seeded_order() {
    let (seen, report) = run_spread(3);
    // Region a (nodes 0..10) one by one, every 500 ms from 1,000 ms; the plain crash at
    // 2,000 ms comes before the step due at the same time.
    let restarts: Vec<&(u64, FaultKind, Vec<u32>)> =
        seen.iter().filter(|s| s.1 == FaultKind::Restart).collect();
    let times: Vec<u64> = restarts.iter().map(|s| s.0).collect();
    assert_eq!(times, (0..10).map(|k| 1000 + k * 500).collect::<Vec<_>>());
    let mut nodes: Vec<u32> = restarts.iter().map(|s| s.2[0]).collect();
    assert!(restarts.iter().all(|s| s.2.len() == 1));
    let order = nodes.clone();
    assert_ne!(order, (0..10).collect::<Vec<_>>(), "random order");
    nodes.sort_unstable();
    assert_eq!(nodes, (0..10).collect::<Vec<_>>(), "each node once");
    let crash = seen.iter().position(|s| s.1 == FaultKind::Crash).unwrap();
    assert_eq!(seen[crash], (2000, FaultKind::Crash, vec![10]));
    assert_eq!(seen[crash + 1].0, 2000);
    // The report lists the spread fault once, with all its targets in step order.
    assert_eq!(report.faults.len(), 2);
    assert_eq!(report.faults[0].at_ms, 1000);
    assert_eq!(report.faults[0].target_count, 10);
    assert_eq!(report.faults[0].targets_sample, order);
    // Same seed, same steps; another seed, another order.
    assert_eq!(run_spread(3).0, seen);
    assert_ne!(run_spread(4).0, seen);
}

/// `ping-small.toml` (every fault action: cuts, isolation, one-way and single links, crash,
/// restart, CPU stall, clock skew, network changes, recovery) ten times faster, with a 1 ms ping
/// period so most windows hold enough events to run in parallel.
fn dense_ping_report(threads: usize) -> String {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/ping-small.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let tenth = |line: &str, key: &str| -> Option<String> {
        let v: u64 = line.strip_prefix(key)?.trim().parse().ok()?;
        Some(format!("{key}{}", v / 10))
    };
    let text: Vec<String> = text
        .lines()
        .map(|l| {
            ["at_ms = ", "for_ms = ", "duration_ms = "]
                .iter()
                .find_map(|k| tenth(l, k))
                .unwrap_or_else(|| l.replace("ping_interval_ms = 200", "ping_interval_ms = 1"))
        })
        .collect();
    let s = Scenario::parse(&text.join("\n")).unwrap();
    assert_eq!((s.duration_ms, s.toy.ping_interval_ms), (6_000, 1));
    let mut h = PingHarness {
        cfg: PingConfig::from(&s.toy),
    };
    let cfg = RunConfig {
        seed: 7,
        progress: false,
        threads,
        min_window_events: Some(2),
    };
    run(&s, &mut h, &cfg).unwrap().report.to_json()
}

#[test]
fn parallel_windows_give_the_sequential_report() {
    let one = dense_ping_report(1);
    let v: serde_json::Value = serde_json::from_str(&one).unwrap();
    let deferred = v
        .pointer("/engine/deferred_by_stall")
        .and_then(|d| d.as_u64());
    assert!(
        deferred > Some(0),
        "the stall must defer events: {deferred:?}"
    );
    for threads in [2, 3] {
        assert_eq!(dense_ping_report(threads), one, "{threads} threads");
    }
}
