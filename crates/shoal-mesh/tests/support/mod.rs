//! A small deterministic in-memory driver for `shoal_mesh::Mesh`, shared by the `mesh_*` tests.
//!
//! * N meshes at synthetic addresses `127.0.0.x:7946`, node ids `node-x`;
//! * a virtual clock in ms and a binary heap of events keyed by `(time_ms, seq)`, so ties break
//!   in insertion order and every run with the same seed is identical;
//! * a fixed latency for both channels; seeded loss for datagrams only (streams are reliable);
//! * faults, named plainly: [`Cluster::cut_streams`] (every stream message to or from a node is
//!   dropped until a deadline, SWIM datagrams still flow), [`Cluster::crash`] (the node stops:
//!   nothing in, nothing out, its timers are dropped);
//! * after every input the node's outputs are drained exactly as the `mesh` module docs say:
//!   `poll_transmit` until `None`, then `poll_armed` until `None`, then `poll_event` until `None`;
//!   every armed timer is one event of the harness's queue, fired by token.
//!
//! Every transmit is logged (time, sender, receiver, channel, kind byte, length, and the bytes of
//! stream messages) so tests can count what crossed the wire.
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;

use shoal_catalog::testkit::Fixture;
use shoal_catalog::Keyring;
use shoal_mesh::membership::MemberId;
use shoal_mesh::messages::StreamMessage;
use shoal_mesh::{Channel, Command, Mesh, MeshConfig, MeshEvent, Refusal, TimerToken};
use shoal_proto::envelope::MessageKind;
use shoal_proto::{Generation, LifecycleState, NodeId, SignedLifecycle, SigningKey, Zone};

/// Node keys are trusted for this many node ids up front, so late joiners verify everywhere.
pub const MAX_NODES: usize = 64;

/// Latency of both channels, one way.
pub const LATENCY_MS: u64 = 2;

/// splitmix64: the harness's own seeded randomness (datagram loss).
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

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// FNV-1a, for hashing the transmit log.
pub fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

pub fn addr(i: usize) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::new(127, 0, 0, i as u8 + 1),
        7946,
    ))
}

pub fn node_id(i: usize) -> NodeId {
    NodeId::new(format!("node-{i}")).expect("valid node id")
}

pub fn identity(i: usize) -> MemberId {
    MemberId {
        node: node_id(i),
        addr: addr(i),
        boot: Generation(1),
    }
}

/// The fixture's region, authority and `prod/api/http` key, with node keys for `node-0` up to
/// `node-{MAX_NODES - 1}` (the fixture's own scheme: seed `100 + i`). No node key is trusted
/// by configuration: the fixture's lifecycle records bind each owner's key.
pub fn fixture() -> Fixture {
    let mut f = Fixture::new();
    for i in f.nodes.len()..MAX_NODES {
        let key = SigningKey::from_seed([100 + i as u8; 32]);
        f.nodes.push((node_id(i), key));
    }
    f
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
    /// Hash of the bytes (every transmit).
    pub hash: u64,
    /// The bytes, kept for stream messages only.
    pub bytes: Option<Vec<u8>>,
    /// Whether the network dropped it (loss, cut, crashed receiver).
    pub dropped: bool,
}

impl Sent {
    /// Lifecycle records this stream message carries (pushes, deltas, snapshots).
    pub fn lifecycle_records(&self) -> usize {
        let Some(bytes) = &self.bytes else { return 0 };
        match StreamMessage::decode(bytes, usize::MAX).expect("we only log what meshes encode") {
            StreamMessage::Push(p) => p.lifecycle.len(),
            StreamMessage::Delta(d) => d.lifecycle.iter().map(|l| l.records.len()).sum(),
            StreamMessage::Snapshot(_) => 1,
            _ => 0,
        }
    }

    pub fn is(&self, kind: MessageKind) -> bool {
        self.kind == kind as u8
    }
}

enum Ev {
    Deliver {
        to: usize,
        from: usize,
        channel: Channel,
        bytes: Vec<u8>,
    },
    Timer {
        node: usize,
        life: u64,
        token: TimerToken,
    },
}

pub struct Node {
    pub mesh: Mesh<Keyring>,
    /// Crashed: takes no input, produces nothing; its pending timers are dropped.
    pub crashed: bool,
    /// Bumped on crash so older timers are recognised.
    life: u64,
    /// Streams to and from this node are dropped until this time.
    cut_until: u64,
}

/// The harness.
pub struct Cluster {
    pub now: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    pending: BTreeMap<u64, Ev>,
    pub nodes: Vec<Node>,
    pub fixture: Fixture,
    pub config: MeshConfig,
    rng: TestRng,
    seed: u64,
    /// Datagram loss probability.
    pub loss: f64,
    next_revision: u64,
    /// Every transmit, in order.
    pub sent: Vec<Sent>,
    /// Every event, as `(time_ms, node, event)`.
    pub events: Vec<(u64, usize, MeshEvent)>,
    /// Largest datagram seen.
    pub max_datagram: usize,
}

impl Cluster {
    /// `n` meshes, not yet connected.
    pub fn new(n: usize, seed: u64, config: MeshConfig) -> Self {
        assert!(n <= MAX_NODES);
        let fixture = fixture();
        let mut c = Cluster {
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
            pending: BTreeMap::new(),
            nodes: Vec::new(),
            fixture,
            config,
            rng: TestRng::new(seed),
            seed,
            loss: 0.0,
            next_revision: 0,
            sent: Vec::new(),
            events: Vec::new(),
            max_datagram: 0,
        };
        for _ in 0..n {
            c.add_node();
        }
        c
    }

    /// `n` meshes bootstrapped as one formed region (`Mesh::bootstrap` with every other
    /// member), then run for `warm_up_ms` so the eager links settle.
    pub fn formed(n: usize, seed: u64, config: MeshConfig, warm_up_ms: u64) -> Self {
        let mut c = Self::new(n, seed, config);
        let members: Vec<MemberId> = (0..n).map(identity).collect();
        for i in 0..n {
            let others = members.iter().filter(|m| m.addr != addr(i)).cloned();
            c.bootstrap(i, others.collect());
        }
        c.run_for(warm_up_ms);
        c
    }

    /// Seeds node `i`'s membership with `members` ([`Mesh::bootstrap`]) at the current time.
    pub fn bootstrap(&mut self, i: usize, members: Vec<MemberId>) {
        let now = self.now;
        self.nodes[i].mesh.bootstrap(now, members);
        self.drain(i);
    }

    /// Adds a fresh (empty, unconnected) mesh; returns its index.
    pub fn add_node(&mut self) -> usize {
        let i = self.nodes.len();
        assert!(i < MAX_NODES);
        let mesh = Mesh::new(
            identity(i),
            self.fixture.region.clone(),
            Zone::new(format!("zone-{}", i % 3)).expect("valid zone"),
            self.fixture.nodes[i].1.clone(),
            self.config.clone(),
            self.fixture.keyring.clone(),
            self.seed.wrapping_mul(1_000).wrapping_add(i as u64),
        );
        self.nodes.push(Node {
            mesh,
            crashed: false,
            life: 0,
            cut_until: 0,
        });
        i
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn mesh(&self, i: usize) -> &Mesh<Keyring> {
        &self.nodes[i].mesh
    }

    pub fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| !self.nodes[i].crashed)
    }

    // ---- records ------------------------------------------------------------------------

    /// A lifecycle record of `prod/api/http` for `instance` (generation 1) owned by
    /// `node-owner`, with the next region revision.
    pub fn record(
        &mut self,
        instance: &str,
        owner: usize,
        state: LifecycleState,
    ) -> Arc<SignedLifecycle> {
        self.next_revision += 1;
        let key = self.fixture.key.clone();
        Arc::new(
            self.fixture
                .lifecycle_for(&key, instance, owner, 1, self.next_revision, state),
        )
    }

    /// The last revision handed out by [`Cluster::record`].
    pub fn revision(&self) -> u64 {
        self.next_revision
    }

    // ---- inputs -------------------------------------------------------------------------

    pub fn command(&mut self, i: usize, cmd: Command) -> Result<(), Refusal> {
        assert!(!self.nodes[i].crashed);
        let now = self.now;
        let r = self.nodes[i].mesh.handle_command(now, cmd);
        self.drain(i);
        r
    }

    /// Node `i` joins through `seeds`.
    pub fn join(&mut self, i: usize, seeds: Vec<SocketAddr>) {
        assert!(!self.nodes[i].crashed);
        let now = self.now;
        self.nodes[i].mesh.join(now, &seeds);
        self.drain(i);
    }

    /// Publishes `records` at node `i` (as the authority injecting into that agent); every
    /// record must merge or be a duplicate or stale.
    pub fn publish(&mut self, i: usize, records: Vec<Arc<SignedLifecycle>>) {
        let r = self.command(i, Command::Publish { lifecycle: records });
        assert_eq!(r, Ok(()), "node {i} refused a publish");
    }

    /// Feeds raw stream bytes to node `i` as if from node `from`.
    pub fn inject_stream(&mut self, i: usize, from: usize, bytes: &[u8]) {
        let now = self.now;
        self.nodes[i]
            .mesh
            .handle_stream_message(now, addr(from), bytes);
        self.drain(i);
    }

    // ---- faults -------------------------------------------------------------------------

    /// Drops every stream message sent to or from `i` (or in flight) for the next `ms`.
    pub fn cut_streams(&mut self, i: usize, ms: u64) {
        self.nodes[i].cut_until = self.now + ms;
    }

    /// Crashes `i`: no leave, nothing in or out from now on.
    pub fn crash(&mut self, i: usize) {
        self.nodes[i].crashed = true;
        self.nodes[i].life += 1;
    }

    /// The node listening at `a`, if any.
    pub fn index_of(&self, a: SocketAddr) -> Option<usize> {
        let SocketAddr::V4(v4) = a else { return None };
        let j = usize::from(v4.ip().octets()[3]).checked_sub(1)?;
        (j < self.nodes.len() && addr(j) == a).then_some(j)
    }

    fn is_cut(&self, i: usize) -> bool {
        self.now < self.nodes[i].cut_until
    }

    // ---- the event loop -----------------------------------------------------------------

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq)));
        self.pending.insert(self.seq, ev);
    }

    /// Drains node `i`'s outputs in the documented order.
    fn drain(&mut self, i: usize) {
        let mut transmits = Vec::new();
        while let Some(t) = self.nodes[i].mesh.poll_transmit() {
            transmits.push(t);
        }
        let mut timers = Vec::new();
        while let Some(t) = self.nodes[i].mesh.poll_armed() {
            timers.push(t);
        }
        while let Some(e) = self.nodes[i].mesh.poll_event() {
            self.events.push((self.now, i, e));
        }
        for t in transmits {
            let to = self.index_of(t.to);
            let mut dropped = to.is_none();
            if t.channel == Channel::Datagram {
                self.max_datagram = self.max_datagram.max(t.bytes.len());
                dropped |= self.rng.chance(self.loss);
            } else {
                dropped |= self.is_cut(i) || to.is_some_and(|j| self.is_cut(j));
            }
            self.sent.push(Sent {
                at: self.now,
                from: i,
                to,
                channel: t.channel,
                kind: t.bytes.get(3).copied().unwrap_or(0),
                len: t.bytes.len(),
                hash: fnv1a(&t.bytes, FNV_OFFSET),
                bytes: (t.channel == Channel::Stream).then(|| t.bytes.clone()),
                dropped,
            });
            if let (Some(to), false) = (to, dropped) {
                self.push(
                    self.now + LATENCY_MS,
                    Ev::Deliver {
                        to,
                        from: i,
                        channel: t.channel,
                        bytes: t.bytes,
                    },
                );
            }
        }
        let life = self.nodes[i].life;
        for (at, token) in timers {
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

    /// Runs until `done` holds (checked every `step_ms`) or `deadline`; returns the time it first
    /// held.
    pub fn run_until_true(
        &mut self,
        deadline: u64,
        step_ms: u64,
        mut done: impl FnMut(&Cluster) -> bool,
    ) -> Option<u64> {
        loop {
            if done(self) {
                return Some(self.now);
            }
            if self.now >= deadline {
                return None;
            }
            self.run_until((self.now + step_ms).min(deadline));
        }
    }

    fn dispatch(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Deliver {
                to,
                from,
                channel,
                bytes,
            } => {
                if self.nodes[to].crashed {
                    return;
                }
                if channel == Channel::Stream && (self.is_cut(to) || self.is_cut(from)) {
                    return;
                }
                let mesh = &mut self.nodes[to].mesh;
                match channel {
                    Channel::Datagram => mesh.handle_datagram(now, addr(from), &bytes),
                    Channel::Stream => mesh.handle_stream_message(now, addr(from), &bytes),
                }
                self.drain(to);
            }
            Ev::Timer { node, life, token } => {
                if self.nodes[node].crashed || self.nodes[node].life != life {
                    return;
                }
                self.nodes[node].mesh.handle_timer(now, token);
                self.drain(node);
            }
        }
    }

    // ---- observations -------------------------------------------------------------------

    /// When node `i` applied the lifecycle record of `instance` at `revision`, if it did.
    pub fn applied_at(&self, i: usize, instance: &str, revision: u64) -> Option<u64> {
        self.events.iter().find_map(|(t, n, e)| match e {
            MeshEvent::LifecycleApplied(r)
                if *n == i
                    && r.record.instance.as_str() == instance
                    && r.record.revision.0 == revision =>
            {
                Some(*t)
            }
            _ => None,
        })
    }

    /// True when every live node holds `revision` of its region contiguously.
    pub fn all_have_revision(&self, revision: u64) -> bool {
        let region = &self.fixture.region;
        self.live()
            .all(|i| self.mesh(i).catalog().region_head(region).0 >= revision)
    }

    /// Sum of a counter over every node.
    pub fn total(&self, f: impl Fn(&Mesh<Keyring>) -> u64) -> u64 {
        self.nodes.iter().map(|n| f(&n.mesh)).sum()
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

/// `MeshConfig::for_cluster_size(n)` with `edit` applied.
pub fn config(n: usize, edit: impl FnOnce(&mut MeshConfig)) -> MeshConfig {
    let mut c = MeshConfig::for_cluster_size(n);
    edit(&mut c);
    c
}
