//! The one deterministic in-memory network every cluster test of this crate runs on: the
//! SWIM-only `membership_cluster` tests drive [`shoal_mesh::Membership`] on it, the `mesh_*`
//! tests drive [`shoal_mesh::Mesh`] (through `support::Cluster`). quinn-proto's `Pair` and
//! raft-rs's `harness/src/network.rs` are the models: one network, faults named plainly.
//!
//! * a virtual clock in ms and a binary heap of events keyed by `(time_ms, seq)`, so ties break
//!   in insertion order and every run with the same seed is identical (no wall clock anywhere);
//! * each node is a [`Machine`] at an address of its own; after every input its outputs are
//!   drained in the order the core documents (transmits, then timers, then events), every
//!   armed timer becomes one event of the queue, fired by token;
//! * latency drawn per transmit from `latency_ms` (a fixed value when both ends are equal);
//!   seeded loss for datagrams only (streams are reliable, as QUIC's are);
//! * faults: [`Net::crash`] (nothing in, nothing out, its timers are dropped),
//!   [`Net::restart`] (a new process in the slot, older timers recognised as stale),
//!   [`Net::isolate`] / [`Net::heal`] (every packet to or from the node dropped),
//!   [`Net::cut_streams`] (stream messages dropped until a deadline, SWIM datagrams still flow);
//! * every transmit is logged ([`Sent`]: time, ends, channel, kind byte, length, hash, and the
//!   bytes of stream messages), every event too, so tests count what crossed the wire.
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::SocketAddr;

use shoal_catalog::Verifier;
use shoal_mesh::hash::{fnv1a, FNV_OFFSET};
use shoal_mesh::membership::{Membership, MembershipEvent, MembershipTimer};
use shoal_mesh::{Channel, Mesh, MeshEvent, TimerToken};

/// splitmix64 (Steele, Lea, Flood 2014): the harness's own seeded randomness.
pub struct TestRng(u64);

impl TestRng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `p` (draws nothing when `p` is 0).
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// Uniform in `lo..=hi` (draws nothing when they are equal).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if lo >= hi {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// What a node put out after one input, in the order it was drained.
pub struct Outputs<T, E> {
    pub transmits: Vec<(SocketAddr, Channel, Vec<u8>)>,
    pub timers: Vec<(u64, T)>,
    pub events: Vec<E>,
}

/// A sans-IO core the network can drive: the `Membership` alone, or the whole `Mesh`.
pub trait Machine {
    type Timer;
    type Event;
    /// One packet or stream message from `from`.
    fn deliver(&mut self, now: u64, from: SocketAddr, channel: Channel, bytes: &[u8]);
    /// A timer the machine armed came due.
    fn fire(&mut self, now: u64, timer: Self::Timer);
    /// Every output, drained in the core's documented order.
    fn drain(&mut self) -> Outputs<Self::Timer, Self::Event>;
}

impl Machine for Membership {
    type Timer = MembershipTimer;
    type Event = MembershipEvent;

    fn deliver(&mut self, now: u64, from: SocketAddr, channel: Channel, bytes: &[u8]) {
        assert_eq!(
            channel,
            Channel::Datagram,
            "SWIM alone sends datagrams only"
        );
        self.handle_datagram(now, from, bytes);
    }

    fn fire(&mut self, now: u64, timer: MembershipTimer) {
        self.handle_timer(now, timer);
    }

    fn drain(&mut self) -> Outputs<MembershipTimer, MembershipEvent> {
        let mut out = Outputs {
            transmits: Vec::new(),
            timers: Vec::new(),
            events: Vec::new(),
        };
        while let Some((to, bytes)) = self.poll_transmit() {
            out.transmits.push((to, Channel::Datagram, bytes));
        }
        while let Some(t) = self.poll_timer() {
            out.timers.push(t);
        }
        while let Some(e) = self.poll_event() {
            out.events.push(e);
        }
        out
    }
}

impl<V: Verifier> Machine for Mesh<V> {
    type Timer = TimerToken;
    type Event = MeshEvent;

    fn deliver(&mut self, now: u64, from: SocketAddr, channel: Channel, bytes: &[u8]) {
        match channel {
            Channel::Datagram => self.handle_datagram(now, from, bytes),
            Channel::Stream => self.handle_stream_message(now, from, bytes),
        }
    }

    fn fire(&mut self, now: u64, timer: TimerToken) {
        self.handle_timer(now, timer);
    }

    fn drain(&mut self) -> Outputs<TimerToken, MeshEvent> {
        let mut out = Outputs {
            transmits: Vec::new(),
            timers: Vec::new(),
            events: Vec::new(),
        };
        while let Some(t) = self.poll_transmit() {
            out.transmits.push((t.to, t.channel, t.bytes));
        }
        while let Some(t) = self.poll_armed() {
            out.timers.push(t);
        }
        while let Some(e) = self.poll_event() {
            out.events.push(e);
        }
        out
    }
}

/// One transmit that left a node.
#[derive(Debug, Clone)]
pub struct Sent {
    pub at: u64,
    pub from: usize,
    /// `None`: to an address no node listens on.
    pub to: Option<usize>,
    pub channel: Channel,
    /// The envelope's kind byte.
    pub kind: u8,
    pub len: usize,
    /// FNV-1a of the bytes (every transmit).
    pub hash: u64,
    /// The bytes, kept for stream messages only.
    pub bytes: Option<Vec<u8>>,
    /// Whether the network dropped it (loss, isolation, cut, crashed end).
    pub dropped: bool,
}

/// One node of the network.
pub struct Slot<M> {
    pub m: M,
    pub addr: SocketAddr,
    /// Crashed: takes no input, produces nothing; its pending timers are dropped.
    pub crashed: bool,
    /// Bumped on crash and restart so older timers are recognised.
    life: u64,
    /// Every packet to or from this node is dropped while set.
    pub isolated: bool,
    /// Which side of a [`Net::split`] this node is on (0 when there is none): packets pass
    /// only between nodes on the same side.
    side: u8,
    /// Stream messages to and from this node are dropped until this time.
    cut_streams_until: u64,
}

enum Ev<T> {
    Deliver {
        to: usize,
        from: usize,
        channel: Channel,
        bytes: Vec<u8>,
    },
    Timer {
        node: usize,
        life: u64,
        token: T,
    },
}

/// The network and its nodes.
pub struct Net<M: Machine> {
    pub now: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    pending: BTreeMap<u64, Ev<M::Timer>>,
    pub nodes: Vec<Slot<M>>,
    by_addr: BTreeMap<SocketAddr, usize>,
    rng: TestRng,
    /// Datagram loss probability.
    pub loss: f64,
    /// One-way latency, drawn uniformly from this inclusive range per transmit.
    pub latency_ms: (u64, u64),
    /// Every datagram must fit in this many bytes (asserted as it is sent).
    pub max_datagram_bytes: usize,
    /// Largest datagram seen.
    pub max_datagram: usize,
    /// Every transmit, in order.
    pub sent: Vec<Sent>,
    /// Every event, as `(time_ms, node, event)`.
    pub events: Vec<(u64, usize, M::Event)>,
}

impl<M: Machine> Net<M> {
    /// An empty network whose loss and latency draw from `seed`.
    pub fn new(seed: u64, latency_ms: (u64, u64)) -> Self {
        Net {
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
            pending: BTreeMap::new(),
            nodes: Vec::new(),
            by_addr: BTreeMap::new(),
            rng: TestRng::new(seed),
            loss: 0.0,
            latency_ms,
            max_datagram_bytes: usize::MAX,
            max_datagram: 0,
            sent: Vec::new(),
            events: Vec::new(),
        }
    }

    /// The network's own randomness (for tests that need a seeded draw of their own).
    pub fn rng(&mut self) -> &mut TestRng {
        &mut self.rng
    }

    /// Adds `m` listening at `addr`; returns its index.
    pub fn add(&mut self, addr: SocketAddr, m: M) -> usize {
        let i = self.nodes.len();
        assert!(self.by_addr.insert(addr, i).is_none(), "{addr} taken");
        self.nodes.push(Slot {
            m,
            addr,
            crashed: false,
            life: 0,
            isolated: false,
            side: 0,
            cut_streams_until: 0,
        });
        i
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Indices of the nodes not crashed.
    pub fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| !self.nodes[i].crashed)
    }

    /// The node listening at `a`, if any.
    pub fn index_of(&self, a: SocketAddr) -> Option<usize> {
        self.by_addr.get(&a).copied()
    }

    /// Feeds node `i` one input through `f` at the current time, then drains it.
    pub fn with<R>(&mut self, i: usize, f: impl FnOnce(&mut M, u64) -> R) -> R {
        assert!(!self.nodes[i].crashed, "node {i} is crashed");
        let now = self.now;
        let r = f(&mut self.nodes[i].m, now);
        self.drain(i);
        r
    }

    // ---- faults -------------------------------------------------------------------------

    /// Crashes `i`: no leave, nothing in or out from now on.
    pub fn crash(&mut self, i: usize) {
        self.nodes[i].crashed = true;
        self.nodes[i].life += 1;
    }

    /// Puts a new process `m` in slot `i` (crashed or not): the old one's timers are stale.
    pub fn restart(&mut self, i: usize, m: M) {
        let slot = &mut self.nodes[i];
        slot.m = m;
        slot.crashed = false;
        slot.life += 1;
    }

    /// Drops every packet to or from `i` until [`Net::heal`].
    pub fn isolate(&mut self, i: usize) {
        self.nodes[i].isolated = true;
    }

    /// Cuts `minority` off from every other node (both sides keep talking among themselves)
    /// until [`Net::heal`].
    pub fn split(&mut self, minority: &[usize]) {
        for &i in minority {
            self.nodes[i].side = 1;
        }
    }

    /// Ends every isolation and split.
    pub fn heal(&mut self) {
        for n in &mut self.nodes {
            n.isolated = false;
            n.side = 0;
        }
    }

    /// Drops every stream message sent to or from `i` (or in flight) for the next `ms`.
    pub fn cut_streams(&mut self, i: usize, ms: u64) {
        self.nodes[i].cut_streams_until = self.now + ms;
    }

    /// Whether the link at node `i` carries `channel` now. A crashed sender's packets already
    /// in flight still arrive (`sender`); a crashed receiver takes nothing.
    fn passes(&self, i: usize, channel: Channel, sender: bool) -> bool {
        let n = &self.nodes[i];
        (sender || !n.crashed)
            && !n.isolated
            && (channel == Channel::Datagram || self.now >= n.cut_streams_until)
    }

    // ---- the event loop -----------------------------------------------------------------

    fn push(&mut self, at: u64, ev: Ev<M::Timer>) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq)));
        self.pending.insert(self.seq, ev);
    }

    /// Moves node `i`'s outputs into the network, the transmit log and the event log.
    pub fn drain(&mut self, i: usize) {
        let out = self.nodes[i].m.drain();
        for (to_addr, channel, bytes) in out.transmits {
            let to = self.index_of(to_addr);
            if channel == Channel::Datagram {
                assert!(
                    bytes.len() <= self.max_datagram_bytes,
                    "node {i} sent a {}-byte datagram",
                    bytes.len()
                );
                self.max_datagram = self.max_datagram.max(bytes.len());
            }
            let dropped = match to {
                None => true,
                Some(j) => {
                    !self.passes(i, channel, true)
                        || !self.passes(j, channel, false)
                        || self.nodes[i].side != self.nodes[j].side
                        || (channel == Channel::Datagram && self.rng.chance(self.loss))
                }
            };
            self.sent.push(Sent {
                at: self.now,
                from: i,
                to,
                channel,
                kind: bytes.get(3).copied().unwrap_or(0),
                len: bytes.len(),
                hash: fnv1a(&bytes, FNV_OFFSET),
                bytes: (channel == Channel::Stream).then(|| bytes.clone()),
                dropped,
            });
            if let (Some(to), false) = (to, dropped) {
                let (lo, hi) = self.latency_ms;
                let at = self.now + self.rng.range(lo, hi);
                self.push(
                    at,
                    Ev::Deliver {
                        to,
                        from: i,
                        channel,
                        bytes,
                    },
                );
            }
        }
        let life = self.nodes[i].life;
        for (at, token) in out.timers {
            let at = at.max(self.now);
            self.push(
                at,
                Ev::Timer {
                    node: i,
                    life,
                    token,
                },
            );
        }
        for e in out.events {
            self.events.push((self.now, i, e));
        }
    }

    /// Processes every event due at or before `t`, then sets the clock to `t`.
    pub fn run_until(&mut self, t: u64) {
        while let Some(&Reverse((at, seq))) = self.heap.peek() {
            if at > t {
                break;
            }
            self.heap.pop();
            self.now = at;
            let ev = self.pending.remove(&seq).expect("queued");
            self.dispatch(ev);
        }
        self.now = self.now.max(t);
    }

    pub fn run_for(&mut self, ms: u64) {
        self.run_until(self.now + ms);
    }

    fn dispatch(&mut self, ev: Ev<M::Timer>) {
        let now = self.now;
        match ev {
            Ev::Deliver {
                to,
                from,
                channel,
                bytes,
            } => {
                if !self.passes(to, channel, false)
                    || !self.passes(from, channel, true)
                    || self.nodes[to].side != self.nodes[from].side
                {
                    return;
                }
                let from = self.nodes[from].addr;
                self.nodes[to].m.deliver(now, from, channel, &bytes);
                self.drain(to);
            }
            Ev::Timer { node, life, token } => {
                let n = &self.nodes[node];
                if n.crashed || n.life != life {
                    return;
                }
                self.nodes[node].m.fire(now, token);
                self.drain(node);
            }
        }
    }

    /// Hash of the whole transmit log: times, endpoints, channels and bytes.
    pub fn transmit_hash(&self) -> u64 {
        self.sent.iter().fold(FNV_OFFSET, |h, s| {
            let h = fnv1a(&s.at.to_le_bytes(), h);
            let h = fnv1a(&(s.from as u64).to_le_bytes(), h);
            let h = fnv1a(&(s.to.map_or(u64::MAX, |t| t as u64)).to_le_bytes(), h);
            let h = fnv1a(&[s.channel as u8, u8::from(s.dropped)], h);
            fnv1a(&s.hash.to_le_bytes(), h)
        })
    }
}
