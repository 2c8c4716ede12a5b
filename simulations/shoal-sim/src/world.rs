//! The discrete-event engine: virtual clock, event queue, message routing, node faults.
//!
//! # Time
//! The engine clock is in **microseconds** (`now_us`); nodes see milliseconds
//! (`now_us / 1000`, plus their clock skew). Timer deadlines come back in the node's local
//! milliseconds and are converted to the global microsecond clock.
//!
//! # Order
//! Events are ordered by (time, sequence number); the sequence number is a global counter
//! incremented on every push, so ties break by insertion order and every run with the same
//! inputs processes the same events in the same order.
//!
//! # Driving from a scenario layer
//! ```
//! use shoal_sim::{rng::RngTree, testkit::PingNode, topology::Topology, world::World, net::NetConfig};
//! use std::sync::Arc;
//! let topo = Arc::new(Topology::uniform(1, 2, 3).unwrap());
//! let mut world = World::new(topo, NetConfig::default(), &RngTree::new(1));
//! world.start_all(|ctx| PingNode::new(ctx, Default::default()));
//! world.run_until(2_000_000); // 2 s virtual
//! // Call into a node at the current virtual time; its outputs are flushed afterwards.
//! let sent = world.with_node(0, |node, _now_ms| node.pings_sent()).unwrap();
//! assert!(sent > 0);
//! ```

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use rayon::prelude::*;

use crate::net::{CutId, DropReason, LinkFaults, NetConfig, NodeCounters, NodeSet};
use crate::node::{Channel, NodeCtx, SimNode, Transmit};
use crate::rng::{Purpose, RngTree, SimRng};
use crate::topology::Topology;

mod membership_faults;
mod parallel;

pub use parallel::{worker_index, MIN_WINDOW_EVENTS};

/// The most threads [`World::set_threads`] accepts.
pub const MAX_THREADS: usize = 8;
/// A stalled node's backlog is capped at this many events; the rest are dropped and counted.
pub const MAX_STALL_BACKLOG: usize = 1 << 16;
/// Width of one bucket of the engine's built-in time series, µs.
pub const SERIES_BUCKET_US: u64 = 1_000_000;

#[derive(Clone, Copy, Debug)]
enum EventKind {
    /// Message in flight; index into the in-flight slab.
    Deliver(u32),
    /// Node timer with its opaque token.
    Timer(u64),
    /// A stalled node wakes and drains its backlog.
    Wake,
}

#[derive(Clone, Copy, Debug)]
struct Event {
    at_us: u64,
    seq: u64,
    node: u32,
    /// Target's boot epoch when scheduled (timers of an old boot are dropped).
    epoch: u32,
    kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.at_us == other.at_us && self.seq == other.seq
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed so `BinaryHeap` (a max-heap) pops the earliest (time, seq).
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at_us, other.seq).cmp(&(self.at_us, self.seq))
    }
}

#[derive(Debug)]
struct InFlight {
    from: u32,
    from_epoch: u32,
    to_epoch: u32,
    channel: Channel,
    bytes: Vec<u8>,
}

/// Periodic CPU stall: the node processes nothing during the first `stall_us` of every
/// `period_us`, counted from `start_us`, until `until_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    /// When the first stall begins (global µs).
    pub start_us: u64,
    /// Length of each stall, µs (> 0, < period).
    pub stall_us: u64,
    /// Stall period, µs.
    pub period_us: u64,
    /// Stalls stop at this time (global µs); `u64::MAX` for never.
    pub until_us: u64,
}

impl Stall {
    /// If stalled at `now_us`, the time it wakes.
    fn wake_at(&self, now_us: u64) -> Option<u64> {
        if now_us < self.start_us || now_us >= self.until_us {
            return None;
        }
        let phase = (now_us - self.start_us) % self.period_us;
        (phase < self.stall_us).then(|| now_us + (self.stall_us - phase))
    }
}

#[derive(Debug, Default)]
struct Sched {
    stall: Option<Stall>,
    skew_ms: i64,
    backlog: VecDeque<Event>,
    wake_scheduled: bool,
}

/// Engine-wide statistics (deterministic; no wall time).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineStats {
    /// Events popped from the queue (including dropped ones).
    pub events: u64,
    /// Messages handed to nodes.
    pub deliveries: u64,
    /// Timers handed to nodes.
    pub timers_fired: u64,
    /// Timers dropped because the node restarted or crashed since arming them.
    pub stale_timers: u64,
    /// Events that waited in a stalled node's backlog.
    pub deferred_by_stall: u64,
    /// Largest queue length seen.
    pub max_queue_len: u64,
    /// Deliveries per [`SERIES_BUCKET_US`] bucket.
    pub deliveries_per_bucket: Vec<u64>,
    /// Drops per [`SERIES_BUCKET_US`] bucket.
    pub drops_per_bucket: Vec<u64>,
}

fn bump(series: &mut Vec<u64>, now_us: u64) {
    let b = (now_us / SERIES_BUCKET_US) as usize;
    if series.len() <= b {
        series.resize(b + 1, 0);
    }
    series[b] += 1;
}

/// Deterministic hasher for the (from, to) stream-order table (splitmix64 finish). The table is
/// only looked up, never iterated, but a fixed hasher keeps even its memory layout seed-stable.
#[derive(Default, Clone, Copy)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 ^= x;
    }
    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

type PairMap = HashMap<u64, u64, BuildHasherDefault<PairHasher>>;

/// Everything except the nodes themselves, so routing can borrow it while a node is borrowed.
struct Core {
    now_us: u64,
    seq: u64,
    queue: BinaryHeap<Event>,
    /// Events of a parallel window not replayed yet (`world/parallel.rs`): the sequential
    /// engine's queue would hold them, so they count towards `max_queue_len`. 0 otherwise.
    window_pending: usize,
    inflight: Vec<Option<InFlight>>,
    free_slots: Vec<u32>,
    topo: Arc<Topology>,
    net: NetConfig,
    faults: LinkFaults,
    net_rng: SimRng,
    /// Latest scheduled stream delivery per (from << 32 | to), for per-pair ordering.
    stream_last: PairMap,
    stream_prune_at: usize,
    epochs: Vec<u32>,
    alive: Vec<bool>,
    counters: Vec<NodeCounters>,
    stats: EngineStats,
    /// Moved nodes and per-link datagram limits (`world/membership_faults.rs`).
    moved: membership_faults::Relocations,
}

impl Core {
    fn push(&mut self, at_us: u64, node: u32, epoch: u32, kind: EventKind) {
        self.seq += 1;
        self.queue.push(Event {
            at_us,
            seq: self.seq,
            node,
            epoch,
            kind,
        });
        let len = (self.queue.len() + self.window_pending) as u64;
        if len > self.stats.max_queue_len {
            self.stats.max_queue_len = len;
        }
    }

    fn drop_msg(&mut self, from: u32, reason: DropReason) {
        self.counters[from as usize].dropped.count(reason);
        bump(&mut self.stats.drops_per_bucket, self.now_us);
    }

    fn alloc(&mut self, f: InFlight) -> u32 {
        match self.free_slots.pop() {
            Some(i) => {
                self.inflight[i as usize] = Some(f);
                i
            }
            None => {
                self.inflight.push(Some(f));
                (self.inflight.len() - 1) as u32
            }
        }
    }

    fn take(&mut self, slot: u32) -> InFlight {
        self.free_slots.push(slot);
        self.inflight[slot as usize]
            .take()
            .expect("in-flight slot used twice")
    }

    /// Routes one transmit from node `from`. Every outcome is counted.
    fn send(&mut self, from: u32, t: Transmit) {
        let len = t.bytes.len();
        let c = &mut self.counters[from as usize];
        match t.channel {
            Channel::Datagram => {
                c.datagram_out.msgs += 1;
                c.datagram_out.bytes += len as u64;
            }
            Channel::Stream => {
                c.stream_out.msgs += 1;
                c.stream_out.bytes += len as u64;
            }
        }
        let Some(to) = self.route(t.to) else {
            return self.drop_msg(from, DropReason::UnknownAddr);
        };
        let limit = match t.channel {
            Channel::Datagram => self.net.max_datagram_bytes,
            Channel::Stream => self.net.max_stream_message_bytes,
        };
        if len > limit || (t.channel == Channel::Datagram && self.over_link_limit(from, to, len)) {
            return self.drop_msg(from, DropReason::Oversize);
        }
        if !self.faults.is_empty() && self.faults.blocked(from, to) {
            return self.drop_msg(from, DropReason::Partition);
        }
        let latency = *self.net.latency(self.topo.link_class(from, to));
        match t.channel {
            Channel::Datagram => {
                if self.net.loss.roll(&mut self.net_rng) {
                    return self.drop_msg(from, DropReason::Loss);
                }
                if self.net.dup.roll(&mut self.net_rng) {
                    self.counters[from as usize].duplicated += 1;
                    let at = self.now_us + latency.sample(&mut self.net_rng);
                    self.schedule_delivery(at, from, to, Channel::Datagram, t.bytes.clone());
                }
                let at = self.now_us + latency.sample(&mut self.net_rng);
                self.schedule_delivery(at, from, to, Channel::Datagram, t.bytes);
            }
            Channel::Stream => {
                // No connection can be opened to a node that is down.
                if !self.alive[to as usize] {
                    return self.drop_msg(from, DropReason::Crashed);
                }
                let at = self.now_us + latency.sample(&mut self.net_rng);
                let key = (u64::from(from) << 32) | u64::from(to);
                let last = self.stream_last.entry(key).or_insert(0);
                let at = at.max(*last);
                *last = at;
                self.schedule_delivery(at, from, to, Channel::Stream, t.bytes);
                self.maybe_prune_streams();
            }
        }
    }

    fn schedule_delivery(&mut self, at: u64, from: u32, to: u32, channel: Channel, bytes: Vec<u8>) {
        let f = InFlight {
            from,
            from_epoch: self.epochs[from as usize],
            to_epoch: self.epochs[to as usize],
            channel,
            bytes,
        };
        let slot = self.alloc(f);
        let epoch = self.epochs[to as usize];
        self.push(at, to, epoch, EventKind::Deliver(slot));
    }

    /// Pair entries whose last delivery is in the past constrain nothing; drop them when the
    /// table doubles so it stays proportional to pairs with traffic in flight.
    fn maybe_prune_streams(&mut self) {
        if self.stream_last.len() < self.stream_prune_at {
            return;
        }
        let now = self.now_us;
        self.stream_last.retain(|_, at| *at > now);
        self.stream_prune_at = (self.stream_last.len() * 2).max(4096);
    }

    fn local_ms(&self, skew_ms: i64) -> u64 {
        local_ms(self.now_us, skew_ms)
    }

    /// Counts one engine statistic.
    fn count(&mut self, stat: Stat) {
        match stat {
            Stat::TimerFired => self.stats.timers_fired += 1,
            Stat::StaleTimer => self.stats.stale_timers += 1,
            Stat::DeferredByStall => self.stats.deferred_by_stall += 1,
        }
    }

    /// A message of `len` bytes reached node `to`.
    fn delivered(&mut self, to: u32, channel: Channel, len: u64) {
        let c = &mut self.counters[to as usize];
        let flow = match channel {
            Channel::Datagram => &mut c.datagram_in,
            Channel::Stream => &mut c.stream_in,
        };
        flow.msgs += 1;
        flow.bytes += len;
        self.stats.deliveries += 1;
        bump(&mut self.stats.deliveries_per_bucket, self.now_us);
    }
}

/// A node's local clock at global time `now_us`, ms.
fn local_ms(now_us: u64, skew_ms: i64) -> u64 {
    ((now_us / 1000) as i64).saturating_add(skew_ms).max(0) as u64
}

/// The global time, µs, at which a timer a node armed for its local `deadline_ms` fires; a
/// deadline in the past fires now.
fn timer_at(now_us: u64, skew_ms: i64, deadline_ms: u64) -> u64 {
    let global_ms = (deadline_ms as i64).saturating_sub(skew_ms).max(0) as u64;
    global_ms.saturating_mul(1000).max(now_us)
}

/// Engine statistics that handling an event may count.
#[derive(Clone, Copy, Debug)]
enum Stat {
    TimerFired,
    StaleTimer,
    DeferredByStall,
}

/// What handling one node's event does to the engine besides the node itself.
///
/// The sequential engine ([`Direct`]) applies each call to [`Core`] at once. A parallel window
/// (`world/parallel.rs`) records the calls and applies them afterwards in the order the
/// sequential engine would have made them. While a node's event is handled only
/// [`Effects::core`] is read, and nothing handled in the same window changes what it reads
/// (liveness and epochs change only between windows, an in-flight slot belongs to one event).
trait Effects<N: SimNode> {
    /// The engine state handling reads: liveness, epochs, in-flight messages, addresses.
    fn core(&self) -> &Core;
    /// Virtual time of the event being handled, µs.
    fn now_us(&self) -> u64;
    /// The message in `slot` was handled or dropped; the slot is free again.
    fn free(&mut self, slot: u32);
    /// A message node `from` sent is dropped, counted against its sender.
    fn drop_msg(&mut self, from: u32, reason: DropReason);
    /// Queues an event for node `node` (always the node being handled).
    fn push(&mut self, at_us: u64, node: u32, epoch: u32, kind: EventKind);
    /// Routes one transmit of node `from`.
    fn send(&mut self, from: u32, t: Transmit);
    /// A message of `len` bytes reached node `to`.
    fn delivered(&mut self, to: u32, channel: Channel, len: u64);
    /// Counts one engine statistic.
    fn stat(&mut self, stat: Stat);
    /// Takes the notes `node` made while handling the input ([`SimNode::take_notes`]).
    fn notes(&mut self, node: &mut N);
}

/// The sequential engine: every effect applies to [`Core`] at once.
struct Direct<'a> {
    core: &'a mut Core,
}

impl<N: SimNode> Effects<N> for Direct<'_> {
    fn core(&self) -> &Core {
        self.core
    }
    fn now_us(&self) -> u64 {
        self.core.now_us
    }
    fn free(&mut self, slot: u32) {
        self.core.take(slot);
    }
    fn drop_msg(&mut self, from: u32, reason: DropReason) {
        self.core.drop_msg(from, reason);
    }
    fn push(&mut self, at_us: u64, node: u32, epoch: u32, kind: EventKind) {
        self.core.push(at_us, node, epoch, kind);
    }
    fn send(&mut self, from: u32, t: Transmit) {
        self.core.send(from, t);
    }
    fn delivered(&mut self, to: u32, channel: Channel, len: u64) {
        self.core.delivered(to, channel, len);
    }
    fn stat(&mut self, stat: Stat) {
        self.core.count(stat);
    }
    fn notes(&mut self, node: &mut N) {
        node.publish_notes();
    }
}

/// One popped event of node `ev.node`: a wake drains the backlog; anything else is checked,
/// then handled now or parked behind a stall.
fn pop_event<N: SimNode, E: Effects<N>>(
    fx: &mut E,
    node: &mut Option<Box<N>>,
    sched: &mut Sched,
    ev: Event,
) {
    if let EventKind::Wake = ev.kind {
        wake(fx, node, sched, ev.node);
    } else if still_valid(fx, &ev) {
        admit(fx, node, sched, ev);
    }
}

/// Is `ev` still meaningful? Drops (and counts) it if not.
fn still_valid<N: SimNode, E: Effects<N>>(fx: &mut E, ev: &Event) -> bool {
    let core = fx.core();
    let idx = ev.node as usize;
    match ev.kind {
        EventKind::Timer(_) => {
            let ok = core.alive[idx] && ev.epoch == core.epochs[idx];
            if !ok {
                fx.stat(Stat::StaleTimer);
            }
            ok
        }
        EventKind::Deliver(slot) => {
            let f = core.inflight[slot as usize].as_ref().expect("live slot");
            let ok = core.alive[idx]
                && match f.channel {
                    Channel::Datagram => true,
                    Channel::Stream => {
                        f.to_epoch == core.epochs[idx]
                            && f.from_epoch == core.epochs[f.from as usize]
                    }
                };
            if !ok {
                let from = f.from;
                fx.free(slot);
                fx.drop_msg(from, DropReason::Crashed);
            }
            ok
        }
        EventKind::Wake => true,
    }
}

/// Handles `ev` now, or parks it behind a stall / an existing backlog (keeps order).
fn admit<N: SimNode, E: Effects<N>>(
    fx: &mut E,
    node: &mut Option<Box<N>>,
    s: &mut Sched,
    ev: Event,
) {
    let now = fx.now_us();
    let stalled = s.stall.and_then(|st| st.wake_at(now));
    if stalled.is_none() && s.backlog.is_empty() {
        return handle(fx, node, s, ev);
    }
    if s.backlog.len() >= MAX_STALL_BACKLOG {
        if let EventKind::Deliver(slot) = ev.kind {
            let from = fx.core().inflight[slot as usize]
                .as_ref()
                .expect("live slot")
                .from;
            fx.free(slot);
            fx.drop_msg(from, DropReason::StallOverflow);
        }
        return;
    }
    s.backlog.push_back(ev);
    fx.stat(Stat::DeferredByStall);
    if !s.wake_scheduled {
        s.wake_scheduled = true;
        let at = stalled.unwrap_or(now);
        fx.push(at, ev.node, 0, EventKind::Wake);
    }
}

/// A stalled node wakes: it sleeps on if still inside a stall, else handles its backlog.
fn wake<N: SimNode, E: Effects<N>>(fx: &mut E, node: &mut Option<Box<N>>, s: &mut Sched, idx: u32) {
    let now = fx.now_us();
    s.wake_scheduled = false;
    if let Some(at) = s.stall.and_then(|st| st.wake_at(now)) {
        if !s.backlog.is_empty() {
            s.wake_scheduled = true;
            fx.push(at, idx, 0, EventKind::Wake);
        }
        return;
    }
    while let Some(ev) = s.backlog.pop_front() {
        if still_valid(fx, &ev) {
            handle(fx, node, s, ev);
        }
    }
}

/// Hands a validated event to its node, then flushes the node's outputs.
fn handle<N: SimNode, E: Effects<N>>(fx: &mut E, node: &mut Option<Box<N>>, s: &Sched, ev: Event) {
    let idx = ev.node;
    let now_ms = local_ms(fx.now_us(), s.skew_ms);
    let Some(node) = node.as_deref_mut() else {
        return;
    };
    match ev.kind {
        EventKind::Timer(token) => {
            fx.stat(Stat::TimerFired);
            node.handle_timer(now_ms, token);
        }
        EventKind::Deliver(slot) => {
            let core = fx.core();
            let f = core.inflight[slot as usize].as_ref().expect("live slot");
            let from_addr = core.addr_of(f.from);
            let (channel, len) = (f.channel, f.bytes.len() as u64);
            match channel {
                Channel::Datagram => node.handle_datagram(now_ms, from_addr, &f.bytes),
                Channel::Stream => node.handle_stream_message(now_ms, from_addr, &f.bytes),
            }
            fx.free(slot);
            fx.delivered(idx, channel, len);
        }
        EventKind::Wake => unreachable!("wake is handled by the engine"),
    }
    flush(fx, node, s, idx);
}

/// Drains node `idx`'s outputs: all transmits, then all timers, then its notes.
fn flush<N: SimNode, E: Effects<N>>(fx: &mut E, node: &mut N, s: &Sched, idx: u32) {
    while let Some(t) = node.poll_transmit() {
        fx.send(idx, t);
    }
    while let Some((deadline_ms, token)) = node.poll_timer() {
        let at = timer_at(fx.now_us(), s.skew_ms, deadline_ms);
        let epoch = fx.core().epochs[idx as usize];
        fx.push(at, idx, epoch, EventKind::Timer(token));
    }
    fx.notes(node);
}

/// The simulated world: a topology of nodes of type `N`, a network and a clock.
pub struct World<N> {
    /// Boxed so a parallel window moves a pointer, not the node, to a worker.
    nodes: Vec<Option<Box<N>>>,
    sched: Vec<Sched>,
    core: Core,
    rng: RngTree,
    /// Threads [`World::run_until`] may use (1: one event at a time).
    threads: usize,
    /// Parallel windows' reusable state (`world/parallel.rs`).
    windows: parallel::Windows,
}

impl<N: SimNode> World<N> {
    /// An empty world (no node started) over `topo`. The network RNG is the tree's
    /// [`Purpose::Network`] child.
    pub fn new(topo: Arc<Topology>, net: NetConfig, rng: &RngTree) -> Self {
        let n = topo.len();
        Self {
            nodes: (0..n).map(|_| None).collect(),
            sched: (0..n).map(|_| Sched::default()).collect(),
            core: Core {
                now_us: 0,
                seq: 0,
                queue: BinaryHeap::with_capacity(n * 8),
                window_pending: 0,
                inflight: Vec::new(),
                free_slots: Vec::new(),
                topo,
                net,
                faults: LinkFaults::default(),
                net_rng: rng.child(Purpose::Network, 0),
                stream_last: PairMap::default(),
                stream_prune_at: 4096,
                epochs: vec![0; n],
                alive: vec![false; n],
                counters: vec![NodeCounters::default(); n],
                stats: EngineStats::default(),
                moved: Default::default(),
            },
            rng: rng.clone(),
            threads: 1,
            windows: parallel::Windows::new(n),
        }
    }

    // ---- getters ----

    /// Current virtual time, µs.
    pub fn now_us(&self) -> u64 {
        self.core.now_us
    }

    /// Current virtual time, ms (global clock, no skew).
    pub fn now_ms(&self) -> u64 {
        self.core.now_us / 1000
    }

    /// The topology.
    pub fn topology(&self) -> &Arc<Topology> {
        &self.core.topo
    }

    /// Number of node slots.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True if the topology has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `idx`, if running.
    pub fn node(&self, idx: u32) -> Option<&N> {
        self.nodes[idx as usize].as_deref()
    }

    /// All slots in index order (`None` = crashed / never started).
    pub fn nodes(&self) -> impl Iterator<Item = (u32, Option<&N>)> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i as u32, n.as_deref()))
    }

    /// Whether node `idx` is running.
    pub fn is_alive(&self, idx: u32) -> bool {
        self.core.alive[idx as usize]
    }

    /// Node `idx`'s boot epoch (0 at first start).
    pub fn epoch(&self, idx: u32) -> u32 {
        self.core.epochs[idx as usize]
    }

    /// Whether node `idx` is inside a CPU stall right now.
    pub fn is_stalled(&self, idx: u32) -> bool {
        self.sched[idx as usize]
            .stall
            .and_then(|s| s.wake_at(self.core.now_us))
            .is_some()
    }

    /// Node `idx`'s clock skew, ms.
    pub fn clock_skew_ms(&self, idx: u32) -> i64 {
        self.sched[idx as usize].skew_ms
    }

    /// Node `idx`'s local clock now, ms.
    pub fn local_ms(&self, idx: u32) -> u64 {
        self.core.local_ms(self.sched[idx as usize].skew_ms)
    }

    /// Traffic counters of node `idx`.
    pub fn counters(&self, idx: u32) -> &NodeCounters {
        &self.core.counters[idx as usize]
    }

    /// All nodes' counters, by index.
    pub fn all_counters(&self) -> &[NodeCounters] {
        &self.core.counters
    }

    /// Windows [`World::run_until`] handled in parallel so far (0 on one thread). Not in any
    /// report: it depends on the thread count.
    pub fn parallel_windows(&self) -> u64 {
        self.windows.parallel
    }

    /// The worker threads' pool, for scenario layers that read nodes in parallel (`None` on
    /// one thread, or before the first parallel window).
    pub fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.windows.pool().filter(|_| self.threads > 1)
    }

    /// Events handled in parallel windows so far (see [`World::parallel_windows`]).
    pub fn parallel_events(&self) -> u64 {
        self.windows.parallel_events
    }

    /// Engine statistics.
    pub fn stats(&self) -> &EngineStats {
        &self.core.stats
    }

    /// Events waiting in the queue.
    pub fn queue_len(&self) -> usize {
        self.core.queue.len()
    }

    /// Time of the next queued event, µs.
    pub fn next_event_us(&self) -> Option<u64> {
        self.core.queue.peek().map(|e| e.at_us)
    }

    /// Link faults in force.
    pub fn link_faults(&self) -> &LinkFaults {
        &self.core.faults
    }

    /// The network configuration.
    pub fn net_config(&self) -> &NetConfig {
        &self.core.net
    }

    // ---- running ----

    /// Processes every event with time <= `until_us`, then sets the clock to `until_us` (if
    /// later). Returns the number of events processed.
    ///
    /// With [`World::set_threads`] above 1 the events are handled in parallel windows
    /// (`world/parallel.rs`); the outcome is the same, event for event, as handling them one
    /// by one.
    pub fn run_until(&mut self, until_us: u64) -> u64 {
        let before = self.core.stats.events;
        if self.threads > 1 {
            parallel::run_windows(self, until_us);
        }
        while self.core.queue.peek().is_some_and(|e| e.at_us <= until_us) {
            self.step();
        }
        self.core.now_us = self.core.now_us.max(until_us);
        self.core.stats.events - before
    }

    /// Handles nodes' events on this many threads in [`World::run_until`] (1, the default,
    /// handles one event at a time; at most [`MAX_THREADS`]). Any value gives the same run.
    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.clamp(1, MAX_THREADS);
    }

    /// Windows with fewer events than this run one event at a time (default
    /// [`parallel::MIN_WINDOW_EVENTS`]; at least 1). Changes speed only; tests lower it so
    /// that small scenarios go through parallel windows too.
    pub fn set_min_window_events(&mut self, events: usize) {
        self.windows.min_events = events.max(1);
    }

    /// Processes the next event, if any. Returns its time, µs.
    pub fn step(&mut self) -> Option<u64> {
        let ev = self.core.queue.pop()?;
        self.step_event(ev);
        Some(ev.at_us)
    }

    /// Processes `ev`, just taken off the queue.
    fn step_event(&mut self, ev: Event) {
        debug_assert!(ev.at_us >= self.core.now_us, "time went backwards");
        self.core.now_us = ev.at_us;
        self.core.stats.events += 1;
        let i = ev.node as usize;
        let mut fx = Direct {
            core: &mut self.core,
        };
        pop_event(&mut fx, &mut self.nodes[i], &mut self.sched[i], ev);
    }

    /// Drains node `idx`'s outputs: all transmits, then all timers, then its notes.
    fn flush(&mut self, idx: u32) {
        let i = idx as usize;
        let Some(node) = self.nodes[i].as_deref_mut() else {
            return;
        };
        let mut fx = Direct {
            core: &mut self.core,
        };
        flush(&mut fx, node, &self.sched[i], idx);
    }

    // ---- scenario entry points ----

    /// Calls `f(node, local_now_ms)` on running node `idx` at the current virtual time, then
    /// flushes the node's outputs. `None` if the node is not running. Bypasses CPU stalls
    /// (the caller decides whether a stalled node should see the call; see
    /// [`World::is_stalled`]).
    pub fn with_node<R>(&mut self, idx: u32, f: impl FnOnce(&mut N, u64) -> R) -> Option<R> {
        let now_ms = self.local_ms(idx);
        let node = self.nodes[idx as usize].as_deref_mut()?;
        let r = f(node, now_ms);
        self.flush(idx);
        Some(r)
    }

    /// Calls `f(idx, node)` on each running node of `nodes`, on the parallel windows' threads
    /// when there are several ([`World::set_threads`]), then flushes each node's outputs in
    /// the order of `nodes`, as calling [`World::with_node`] on each in turn would. Returns
    /// what `f` returned, in the order of `nodes` (`None` for a node not running). `f` must
    /// not depend on the order it runs in: it sees each node alone, and no engine state.
    pub fn par_map_nodes<R: Send>(
        &mut self,
        nodes: &[u32],
        f: impl Fn(u32, &mut N) -> R + Sync,
    ) -> Vec<Option<R>>
    where
        N: Sync,
    {
        let mut picked: Vec<(u32, Option<Box<N>>)> = nodes
            .iter()
            .map(|&i| (i, self.nodes[i as usize].take()))
            .collect();
        let run = |(i, node): &mut (u32, Option<Box<N>>)| node.as_deref_mut().map(|n| f(*i, n));
        let out: Vec<Option<R>> = match self.windows.pool() {
            Some(pool) if self.threads > 1 => {
                pool.install(|| picked.par_iter_mut().map(run).collect())
            }
            _ => picked.iter_mut().map(run).collect(),
        };
        for (i, node) in picked {
            self.nodes[i as usize] = node;
            self.flush(i);
        }
        out
    }

    /// Builds the context for starting node `idx` in its next boot epoch (the current one if
    /// the slot is down, the next one if it is running and about to be restarted).
    pub fn ctx_for(&self, idx: u32) -> NodeCtx {
        let info = *self.core.topo.node(idx);
        let epoch = self.core.epochs[idx as usize] + u32::from(self.core.alive[idx as usize]);
        NodeCtx {
            index: idx,
            epoch,
            addr: self.core.addr_of(idx),
            region: info.region,
            zone: info.zone,
            seed: self.rng.node_seed(idx, epoch),
            now_ms: self.now_ms(),
            topology: Arc::clone(&self.core.topo),
        }
    }

    /// Installs `node` in slot `idx` (which must not be running) and flushes its outputs (a
    /// node typically arms its first timers in its constructor).
    pub fn start(&mut self, idx: u32, node: N) {
        assert!(!self.core.alive[idx as usize], "node {idx} already running");
        self.nodes[idx as usize] = Some(Box::new(node));
        self.core.alive[idx as usize] = true;
        self.flush(idx);
    }

    /// Starts every not-running node from a factory, in index order.
    pub fn start_all(&mut self, mut factory: impl FnMut(&NodeCtx) -> N) {
        for idx in 0..self.nodes.len() as u32 {
            if !self.core.alive[idx as usize] {
                let ctx = self.ctx_for(idx);
                let node = factory(&ctx);
                self.start(idx, node);
            }
        }
    }

    /// The RNG tree this world was built with (for scenario layers deriving their own
    /// children).
    pub fn rng_tree(&self) -> &RngTree {
        &self.rng
    }

    /// Crash without leave: the node's state is dropped, its backlog and in-flight timers are
    /// discarded, stream messages to or from it in flight are dropped on arrival, datagrams in
    /// flight to it are dropped on arrival while it is down. Its boot epoch advances.
    /// No-op if not running.
    pub fn crash(&mut self, idx: u32) {
        let i = idx as usize;
        if !self.core.alive[i] {
            return;
        }
        self.nodes[i] = None;
        self.core.alive[i] = false;
        self.core.epochs[i] += 1;
        let backlog = std::mem::take(&mut self.sched[i].backlog);
        for ev in backlog {
            if let EventKind::Deliver(slot) = ev.kind {
                let from = self.core.take(slot).from;
                self.core.drop_msg(from, DropReason::Crashed);
            }
        }
        self.sched[i].stall = None;
    }

    /// Crashes `idx` if running, then starts `node` (built by the scenario for the new epoch,
    /// see [`World::ctx_for`]) in its place.
    pub fn restart(&mut self, idx: u32, node: N) {
        self.crash(idx);
        self.start(idx, node);
    }

    /// CPU stall node `idx`: it processes nothing for `stall_ms` of every `period_ms`,
    /// starting now, for `for_ms` (None = until [`World::unstall`]). Deliveries and timers that
    /// fall in a stall are queued and handled, in order, when it wakes.
    pub fn stall(&mut self, idx: u32, stall_ms: u64, period_ms: u64, for_ms: Option<u64>) {
        assert!(
            stall_ms > 0 && stall_ms < period_ms,
            "need 0 < stall_ms < period_ms"
        );
        let now = self.core.now_us;
        self.sched[idx as usize].stall = Some(Stall {
            start_us: now,
            stall_us: stall_ms * 1000,
            period_us: period_ms * 1000,
            until_us: for_ms.map_or(u64::MAX, |f| now + f * 1000),
        });
    }

    /// Ends node `idx`'s stall; any backlog is handled at once (in order).
    pub fn unstall(&mut self, idx: u32) {
        let s = &mut self.sched[idx as usize];
        s.stall = None;
        if !s.backlog.is_empty() && !s.wake_scheduled {
            s.wake_scheduled = true;
            let now = self.core.now_us;
            self.core.push(now, idx, 0, EventKind::Wake);
        }
    }

    /// Offsets node `idx`'s clock by `offset_ms` (local = global + offset). shoal's core uses
    /// only relative time, so this mostly tests robustness (e.g. timestamps compared across
    /// nodes). Timers already armed keep their global fire time.
    pub fn set_clock_skew(&mut self, idx: u32, offset_ms: i64) {
        self.sched[idx as usize].skew_ms = offset_ms;
    }

    /// Replaces the network configuration (e.g. loss rises mid-run).
    pub fn set_net_config(&mut self, net: NetConfig) {
        self.core.net = net;
    }

    // ---- link faults (raft-rs harness style) ----

    fn set_of(&self, nodes: &[u32]) -> NodeSet {
        NodeSet::of(self.len(), nodes)
    }

    /// Symmetric partition: nothing passes between `a` and `b` in either direction.
    pub fn cut(&mut self, a: &[u32], b: &[u32]) -> CutId {
        let (sa, sb) = (self.set_of(a), self.set_of(b));
        self.core
            .faults
            .add(vec![(sa.clone(), sb.clone()), (sb, sa)])
    }

    /// One-way partition: `from` -> `to` is blocked, `to` -> `from` still flows.
    pub fn cut_one_way(&mut self, from: &[u32], to: &[u32]) -> CutId {
        let pair = (self.set_of(from), self.set_of(to));
        self.core.faults.add(vec![pair])
    }

    /// Node `idx` can neither send to nor receive from anyone.
    pub fn isolate(&mut self, idx: u32) -> CutId {
        let me = self.set_of(&[idx]);
        let all = NodeSet::all(self.len());
        self.core
            .faults
            .add(vec![(me.clone(), all.clone()), (all, me)])
    }

    /// Node `idx` can talk only with `peer` (both directions).
    pub fn isolate_except(&mut self, idx: u32, peer: u32) -> CutId {
        let me = self.set_of(&[idx]);
        let mut others = NodeSet::all(self.len());
        others.remove(peer);
        others.remove(idx);
        self.core
            .faults
            .add(vec![(me.clone(), others.clone()), (others, me)])
    }

    /// Drops everything on the single directed link `from` -> `to`.
    pub fn drop_link(&mut self, from: u32, to: u32) -> CutId {
        self.cut_one_way(&[from], &[to])
    }

    /// Removes one link fault.
    pub fn heal_cut(&mut self, id: CutId) -> bool {
        self.core.faults.remove(id)
    }

    /// Removes every link fault.
    pub fn heal(&mut self) {
        self.core.faults.clear();
    }

    /// Node `idx` is whole again: all its links restored, its stall ended, its clock skew
    /// reset. (A crashed node comes back with [`World::restart`].)
    pub fn recover(&mut self, idx: u32) {
        self.core.faults.release(idx);
        self.unstall(idx);
        self.set_clock_skew(idx, 0);
    }
}
