//! Parallel windows: several nodes' events handled at once, with the same outcome, event for
//! event, as handling them one at a time.
//!
//! # Why it is exact
//! Conservative parallel discrete-event simulation with a fixed lookahead (Chandy and Misra,
//! "Distributed simulation: a case study in design and verification of distributed programs",
//! IEEE TSE 1979; Fujimoto, "Parallel and Distributed Simulation Systems", 2000, ch. 3). Every
//! message takes at least `L` = the smallest base latency of any link class, so an event at
//! `t >= t0` can only make events for *other* nodes at `t + L > t0 + L - 1`. The window
//! `[t0, t0 + L - 1]` (`t0` = the earliest queued event) therefore splits into independent
//! per-node runs: each node's events in the window, plus the timers and wakes it queues for
//! itself inside the window, depend only on that node and on engine state that nothing in the
//! window changes (liveness, epochs, in-flight messages, addresses).
//!
//! 1. **Pop** every event of the window, grouped by node in (time, seq) order.
//! 2. **Handle** each node's events on a worker thread (rayon), in the order the sequential
//!    engine would: a node's own in-window events (queued by its earlier handling) rank after
//!    every event that was queued before the window at the same time, and among themselves in
//!    the order they were queued, exactly as their global sequence numbers would rank them.
//!    Each handled event *records* its effects (sends, queued events, freed slots, drops,
//!    counters) and the node's notes ([`crate::SimNode::Note`]) instead of applying them.
//! 3. **Replay** on the engine's thread: a small queue re-pops the window's events in global
//!    (time, seq) order, giving in-window events their real sequence numbers as they are queued,
//!    and applies each event's recorded effects and notes in order. The network RNG, the
//!    sequence counter, per-pair stream order, the queue-length maximum and every counter see
//!    the same calls in the same order as the sequential engine's.
//!
//! Windows with few events run one event at a time ([`MIN_WINDOW_EVENTS`]).

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rayon::prelude::*;

use super::*;

/// A window with fewer events than this is handled one event at a time: below it, handing
/// runs to threads costs more than it saves.
pub const MIN_WINDOW_EVENTS: usize = 16;

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Which thread is handling nodes: `0..threads` for the worker threads, 0 also for any other
/// thread (the engine's own, which waits while the workers run). Node-side caches shared by
/// all nodes (the simulator's record interning) keep one shard per index, so two threads that
/// handle nodes at the same time never share one, and the first worker shares the engine
/// thread's (with 2 threads: 2 shards, not 3; each shard holds its own copy of every record it
/// saw, so fewer shards is less memory).
pub fn worker_index() -> usize {
    WORKER.with(Cell::get)
}

/// One recorded effect of handling an event (see [`Effects`]).
enum Effect {
    Send(Transmit),
    Push {
        at_us: u64,
        epoch: u32,
        kind: EventKind,
    },
    Free(u32),
    Drop {
        from: u32,
        reason: DropReason,
    },
    Delivered {
        channel: Channel,
        len: u64,
    },
    Stat(Stat),
}

/// One node's share of a window.
struct NodeRun<N: SimNode> {
    idx: u32,
    node: Option<Box<N>>,
    sched: Sched,
    /// Its events popped for this window, in (time, seq) order.
    popped: Vec<Event>,
    /// Events it queued for itself inside the window; `seq` is a local counter.
    later: BinaryHeap<Event>,
    effects: Vec<Effect>,
    notes: Vec<N::Note>,
    /// Per handled event, in order: (time, effects recorded, notes taken).
    marks: Vec<(u64, u32, u32)>,
}

/// Records effects instead of applying them; see the module docs.
struct Recorder<'a, N: SimNode> {
    core: &'a Core,
    now_us: u64,
    window_end_us: u64,
    local_seq: &'a mut u64,
    later: &'a mut BinaryHeap<Event>,
    effects: &'a mut Vec<Effect>,
    notes: &'a mut Vec<N::Note>,
}

impl<N: SimNode> Effects<N> for Recorder<'_, N> {
    fn core(&self) -> &Core {
        self.core
    }
    fn now_us(&self) -> u64 {
        self.now_us
    }
    fn free(&mut self, slot: u32) {
        self.effects.push(Effect::Free(slot));
    }
    fn drop_msg(&mut self, from: u32, reason: DropReason) {
        self.effects.push(Effect::Drop { from, reason });
    }
    fn push(&mut self, at_us: u64, node: u32, epoch: u32, kind: EventKind) {
        debug_assert!(at_us >= self.now_us, "an event queued in the past");
        self.effects.push(Effect::Push { at_us, epoch, kind });
        if at_us <= self.window_end_us {
            *self.local_seq += 1;
            self.later.push(Event {
                at_us,
                seq: *self.local_seq,
                node,
                epoch,
                kind,
            });
        }
    }
    fn send(&mut self, _from: u32, t: Transmit) {
        self.effects.push(Effect::Send(t));
    }
    fn delivered(&mut self, _to: u32, channel: Channel, len: u64) {
        self.effects.push(Effect::Delivered { channel, len });
    }
    fn stat(&mut self, stat: Stat) {
        self.effects.push(Effect::Stat(stat));
    }
    fn notes(&mut self, node: &mut N) {
        node.take_notes(self.notes);
    }
}

impl<N: SimNode> NodeRun<N> {
    /// Step 2: handles this node's window in the sequential engine's order, recording.
    fn handle_all(&mut self, core: &Core, window_end_us: u64) {
        let mut next = 0;
        let mut local_seq = 0;
        loop {
            // An event queued before the window ranks before one queued inside it at the
            // same time (its global seq is smaller).
            let original = match (self.popped.get(next), self.later.peek()) {
                (Some(a), Some(b)) => a.at_us <= b.at_us,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            let ev = if original {
                next += 1;
                self.popped[next - 1]
            } else {
                self.later.pop().expect("peeked")
            };
            let (e0, n0) = (self.effects.len(), self.notes.len());
            let mut fx = Recorder::<N> {
                core,
                now_us: ev.at_us,
                window_end_us,
                local_seq: &mut local_seq,
                later: &mut self.later,
                effects: &mut self.effects,
                notes: &mut self.notes,
            };
            pop_event(&mut fx, &mut self.node, &mut self.sched, ev);
            let counts = (self.effects.len() - e0, self.notes.len() - n0);
            self.marks
                .push((ev.at_us, counts.0 as u32, counts.1 as u32));
        }
    }
}

/// Reusable state of parallel windows.
pub(super) struct Windows {
    /// Per node: its run's position in the current window, or `u32::MAX`.
    run_of: Vec<u32>,
    popped: Vec<Event>,
    pool: Option<rayon::ThreadPool>,
    /// Windows with fewer events run one event at a time.
    pub(super) min_events: usize,
    /// Windows handled in parallel so far (not part of any report: it depends on threads).
    pub(super) parallel: u64,
    /// Events popped for windows handled in parallel so far.
    pub(super) parallel_events: u64,
}

impl Windows {
    /// The worker pool, once a parallel window has built it.
    pub(super) fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool.as_ref()
    }

    pub(super) fn new(nodes: usize) -> Self {
        Self {
            run_of: vec![u32::MAX; nodes],
            popped: Vec::new(),
            pool: None,
            min_events: MIN_WINDOW_EVENTS,
            parallel: 0,
            parallel_events: 0,
        }
    }
}

/// Runs windows while the earliest event is at or before `until_us` (the caller finishes
/// whatever is left one event at a time). A network whose smallest latency is 0 has no
/// lookahead: nothing runs in parallel.
pub(super) fn run_windows<N: SimNode>(world: &mut World<N>, until_us: u64) {
    let lookahead_us = world
        .core
        .net
        .latency
        .iter()
        .map(|l| l.base_us)
        .min()
        .unwrap_or(0);
    if lookahead_us == 0 {
        return;
    }
    let threads = world.threads;
    if world
        .windows
        .pool
        .as_ref()
        .is_none_or(|p| p.current_num_threads() != threads)
    {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("shoal-sim-{i}"))
            .start_handler(|i| WORKER.with(|w| w.set(i)))
            .build()
            .expect("the simulator's worker threads start");
        world.windows.pool = Some(pool);
    }
    // The loop itself runs on one of the pool's threads, so a window's hand-off to the others
    // is a rayon split, not a round trip from outside the pool.
    let pool = world.windows.pool.take().expect("pool built");
    pool.install(|| {
        while let Some(t0) = world.core.queue.peek().map(|e| e.at_us) {
            if t0 > until_us {
                break;
            }
            let window_end_us = until_us.min(t0 + lookahead_us - 1);
            window(world, window_end_us);
        }
    });
    world.windows.pool = Some(pool);
}

/// One window: every event at or before `window_end_us`.
fn window<N: SimNode>(world: &mut World<N>, window_end_us: u64) {
    let mut popped = std::mem::take(&mut world.windows.popped);
    popped.clear();
    while world
        .core
        .queue
        .peek()
        .is_some_and(|e| e.at_us <= window_end_us)
    {
        popped.push(world.core.queue.pop().expect("peeked"));
    }
    if popped.len() < world.windows.min_events {
        one_at_a_time(world, &popped, window_end_us);
        world.windows.popped = popped;
        return;
    }

    world.windows.parallel += 1;
    world.windows.parallel_events += popped.len() as u64;

    // 1. Group by node.
    let mut runs: Vec<NodeRun<N>> = Vec::new();
    for ev in &popped {
        let i = ev.node as usize;
        let r = world.windows.run_of[i];
        if r != u32::MAX {
            runs[r as usize].popped.push(*ev);
            continue;
        }
        world.windows.run_of[i] = runs.len() as u32;
        runs.push(NodeRun {
            idx: ev.node,
            node: world.nodes[i].take(),
            sched: std::mem::take(&mut world.sched[i]),
            popped: vec![*ev],
            later: BinaryHeap::new(),
            effects: Vec::new(),
            notes: Vec::new(),
            marks: Vec::new(),
        });
    }

    // 2. Handle, recording.
    let core = &world.core;
    runs.par_iter_mut()
        .for_each(|run| run.handle_all(core, window_end_us));

    // 3. Replay in the sequential order.
    let mut cursors: Vec<Cursor<N>> = Vec::with_capacity(runs.len());
    for run in runs {
        let i = run.idx as usize;
        world.nodes[i] = run.node;
        world.sched[i] = run.sched;
        cursors.push(Cursor {
            idx: run.idx,
            effects: run.effects.into_iter(),
            notes: run.notes.into_iter(),
            marks: run.marks.into_iter(),
        });
    }
    let mut pending: BinaryHeap<Reverse<(u64, u64, u32)>> = popped
        .iter()
        .map(|ev| Reverse((ev.at_us, ev.seq, world.windows.run_of[ev.node as usize])))
        .collect();
    while let Some(Reverse((at_us, _seq, r))) = pending.pop() {
        let c = &mut cursors[r as usize];
        let (marked_us, effects, notes) = c.marks.next().expect("one mark per event");
        debug_assert_eq!(marked_us, at_us, "replay out of step with node {}", c.idx);
        world.core.now_us = at_us;
        world.core.stats.events += 1;
        for _ in 0..effects {
            let e = c.effects.next().expect("counted effect");
            apply(&mut world.core, &mut pending, c.idx, r, window_end_us, e);
        }
        if notes > 0 {
            let node = world.nodes[c.idx as usize]
                .as_mut()
                .expect("a node with notes is running");
            for _ in 0..notes {
                node.apply_note(c.notes.next().expect("counted note"));
            }
        }
    }
    for c in &cursors {
        debug_assert!(
            c.marks.len() == 0,
            "node {} handled more than replayed",
            c.idx
        );
        world.windows.run_of[c.idx as usize] = u32::MAX;
    }
    world.windows.popped = popped;
}

/// A small window, one event at a time: the popped events merged with what their handling
/// queues inside the window, in (time, seq) order.
fn one_at_a_time<N: SimNode>(world: &mut World<N>, popped: &[Event], window_end_us: u64) {
    let mut next = 0;
    loop {
        let queued = world
            .core
            .queue
            .peek()
            .filter(|e| e.at_us <= window_end_us)
            .map(|e| (e.at_us, e.seq));
        let ev = match (popped.get(next), queued) {
            (Some(a), Some(b)) if (b.0, b.1) < (a.at_us, a.seq) => {
                world.core.queue.pop().expect("peeked")
            }
            (Some(a), _) => {
                next += 1;
                *a
            }
            (None, Some(_)) => world.core.queue.pop().expect("peeked"),
            (None, None) => break,
        };
        // The sequential queue would still hold the rest of the popped events.
        world.core.window_pending = popped.len() - next;
        world.step_event(ev);
    }
    world.core.window_pending = 0;
}

/// A node's recorded window, consumed by the replay.
struct Cursor<N: SimNode> {
    idx: u32,
    effects: std::vec::IntoIter<Effect>,
    notes: std::vec::IntoIter<N::Note>,
    marks: std::vec::IntoIter<(u64, u32, u32)>,
}

/// Applies one recorded effect of node `idx` (run `r`) at `core.now_us`. An event queued
/// inside the window joins `pending` with its real sequence number: the node already handled
/// it, and the replay reaches it in its sequential place.
fn apply(
    core: &mut Core,
    pending: &mut BinaryHeap<Reverse<(u64, u64, u32)>>,
    idx: u32,
    r: u32,
    window_end_us: u64,
    e: Effect,
) {
    // The sequential queue would also hold the window's events not yet replayed.
    core.window_pending = pending.len();
    match e {
        Effect::Send(t) => core.send(idx, t),
        Effect::Push { at_us, epoch, kind } => {
            if at_us <= window_end_us {
                core.seq += 1;
                pending.push(Reverse((at_us, core.seq, r)));
                let len = (core.queue.len() + pending.len()) as u64;
                core.stats.max_queue_len = core.stats.max_queue_len.max(len);
            } else {
                core.push(at_us, idx, epoch, kind);
            }
        }
        Effect::Free(slot) => {
            core.take(slot);
        }
        Effect::Drop { from, reason } => core.drop_msg(from, reason),
        Effect::Delivered { channel, len } => core.delivered(idx, channel, len),
        Effect::Stat(s) => core.count(s),
    }
    core.window_pending = 0;
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use crate::net::{Chance, NetConfig};
    use crate::node::{Channel, SimNode, Transmit};
    use crate::rng::RngTree;
    use crate::testkit::{PingConfig, PingNode};
    use crate::topology::Topology;
    use crate::world::World;

    /// 60 toy nodes pinging every millisecond, with loss, duplication, a stalled node, a
    /// skewed clock and a crash; stats and every node's counters must not depend on threads.
    fn run(
        threads: usize,
    ) -> (
        crate::world::EngineStats,
        Vec<crate::net::NodeCounters>,
        u64,
    ) {
        let topo = Arc::new(Topology::uniform(2, 3, 10).unwrap());
        let net = NetConfig {
            loss: Chance::from_pct(1.0),
            dup: Chance::from_pct(0.5),
            ..NetConfig::default()
        };
        let mut w = World::new(topo, net, &RngTree::new(11));
        w.set_threads(threads);
        w.set_min_window_events(2);
        let cfg = PingConfig {
            interval_ms: 1,
            ..PingConfig::default()
        };
        w.start_all(|ctx| PingNode::new(ctx, cfg));
        w.stall(3, 30, 100, None);
        w.set_clock_skew(5, 250);
        w.run_until(500_000);
        w.crash(7);
        w.run_until(1_000_000);
        (
            w.stats().clone(),
            w.all_counters().to_vec(),
            w.parallel_windows(),
        )
    }

    #[test]
    fn threads_change_nothing_but_speed() {
        let (stats, counters, windows) = run(1);
        assert_eq!(windows, 0);
        assert!(stats.deferred_by_stall > 0, "the stall must defer events");
        for threads in [2, 4] {
            let (s, c, windows) = run(threads);
            assert!(
                windows > 100,
                "{threads} threads ran {windows} parallel windows"
            );
            assert_eq!(s, stats, "{threads} threads");
            assert_eq!(c, counters, "{threads} threads");
        }
    }

    /// Arms a timer for the next millisecond on every datagram (so timers armed before a
    /// window and inside it fall due at the same microsecond), a zero-delay timer now and
    /// then (due at once, inside the window), and sends one datagram per fired timer: a fixed
    /// population of 200 "particles". The order in which a node fires equal-time timers
    /// shows in its log and its traffic.
    struct TieNode {
        me: u32,
        peers: Vec<SocketAddr>,
        next_token: u64,
        timers: Vec<(u64, u64)>,
        out: Vec<Transmit>,
        log: Vec<(u64, u64)>,
    }

    impl SimNode for TieNode {
        type Note = ();
        fn handle_datagram(&mut self, now_ms: u64, _from: SocketAddr, bytes: &[u8]) {
            self.next_token += 1;
            let due = if bytes[0].is_multiple_of(4) {
                now_ms
            } else {
                now_ms + 1
            };
            self.timers.push((due, self.next_token));
        }
        fn handle_stream_message(&mut self, _now_ms: u64, _from: SocketAddr, _bytes: &[u8]) {}
        fn handle_timer(&mut self, now_ms: u64, token: u64) {
            self.log.push((now_ms, token));
            let to = self.peers[(token as usize + self.me as usize) % self.peers.len()];
            self.out.push(Transmit {
                to,
                channel: Channel::Datagram,
                bytes: vec![(token % 251) as u8, self.me as u8],
            });
        }
        fn poll_transmit(&mut self) -> Option<Transmit> {
            self.out.pop()
        }
        fn poll_timer(&mut self) -> Option<(u64, u64)> {
            self.timers.pop()
        }
    }

    fn tie_logs(threads: usize) -> (Vec<Vec<(u64, u64)>>, crate::world::EngineStats, u64) {
        let topo = Arc::new(Topology::uniform(1, 2, 20).unwrap());
        let peers: Vec<SocketAddr> = (0..topo.len() as u32).map(|i| topo.node(i).addr).collect();
        let mut w = World::new(topo, NetConfig::default(), &RngTree::new(5));
        w.set_threads(threads);
        w.set_min_window_events(2);
        w.start_all(|ctx| TieNode {
            me: ctx.index,
            peers: peers.clone(),
            next_token: u64::from(ctx.index) * 10_000_000,
            timers: (1..=5)
                .map(|k| (k, u64::from(ctx.index) * 10_000_000 + k))
                .collect(),
            out: Vec::new(),
            log: Vec::new(),
        });
        w.run_until(300_000);
        let logs = (0..w.len() as u32)
            .map(|i| w.node(i).map(|n| n.log.clone()).unwrap_or_default())
            .collect();
        (logs, w.stats().clone(), w.parallel_windows())
    }

    #[test]
    fn equal_time_events_keep_their_sequential_order() {
        let (logs, stats, _) = tie_logs(1);
        let ties = logs
            .iter()
            .map(|l| l.windows(2).filter(|p| p[0].0 == p[1].0).count())
            .sum::<usize>();
        assert!(
            ties > 100,
            "only {ties} equal-time firings: the test needs ties"
        );
        for threads in [2, 3] {
            let (l, s, windows) = tie_logs(threads);
            assert!(
                windows > 100,
                "{threads} threads ran {windows} parallel windows"
            );
            assert_eq!(s, stats, "{threads} threads");
            assert!(l == logs, "{threads} threads fired timers in another order");
        }
    }
}
