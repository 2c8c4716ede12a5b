//! The test support of this crate: [`net`], the one in-memory network (virtual clock, seeded
//! loss and latency, faults, transmit log), and here [`Cluster`], N [`Mesh`]es on it for the
//! `mesh_*` tests.
//!
//! * N meshes at synthetic addresses `127.0.0.x:7946`, node ids `node-x`, a fixed latency of
//!   [`LATENCY_MS`] on both channels;
//! * after every input the node's outputs are drained exactly as the `mesh` module docs say:
//!   `poll_transmit` until `None`, then `poll_armed` until `None`, then `poll_event` until `None`
//!   ([`net::Machine`] for `Mesh`).
#![allow(dead_code)]

pub mod net;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use shoal_catalog::testkit::Fixture;
use shoal_catalog::Keyring;
use shoal_mesh::membership::MemberId;
use shoal_mesh::messages::StreamMessage;
use shoal_mesh::{Command, Mesh, MeshConfig, MeshEvent, Refusal};

pub use net::{Net, Sent};
use shoal_proto::envelope::MessageKind;
use shoal_proto::{Generation, LifecycleState, NodeId, SignedLifecycle, SigningKey, Zone};

/// Node keys are trusted for this many node ids up front, so late joiners verify everywhere.
pub const MAX_NODES: usize = 64;

/// Latency of both channels, one way.
pub const LATENCY_MS: u64 = 2;

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

/// Stream messages the log kept: what they decode to.
pub trait SentExt {
    /// Lifecycle records this stream message carries (pushes, deltas, snapshots).
    fn lifecycle_records(&self) -> usize;
    fn is(&self, kind: MessageKind) -> bool;
}

impl SentExt for Sent {
    fn lifecycle_records(&self) -> usize {
        let Some(bytes) = &self.bytes else { return 0 };
        match StreamMessage::decode(bytes, usize::MAX).expect("we only log what meshes encode") {
            StreamMessage::Push(p) => p.lifecycle.len(),
            StreamMessage::Delta(d) => d.lifecycle.iter().map(|l| l.records.len()).sum(),
            StreamMessage::Snapshot(_) => 1,
            _ => 0,
        }
    }

    fn is(&self, kind: MessageKind) -> bool {
        self.kind == kind as u8
    }
}

/// N meshes on the [`Net`], with the fixture that signs their records.
pub struct Cluster {
    pub net: Net<Mesh<Keyring>>,
    pub fixture: Fixture,
    pub config: MeshConfig,
    seed: u64,
    next_revision: u64,
}

impl Deref for Cluster {
    type Target = Net<Mesh<Keyring>>;
    fn deref(&self) -> &Self::Target {
        &self.net
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.net
    }
}

impl Cluster {
    /// `n` meshes, not yet connected.
    pub fn new(n: usize, seed: u64, config: MeshConfig) -> Self {
        assert!(n <= MAX_NODES);
        let mut c = Cluster {
            net: Net::new(seed, (LATENCY_MS, LATENCY_MS)),
            fixture: fixture(),
            config,
            seed,
            next_revision: 0,
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
        self.net.with(i, |m, now| m.bootstrap(now, members));
    }

    /// Adds a fresh (empty, unconnected) mesh; returns its index.
    pub fn add_node(&mut self) -> usize {
        let i = self.net.len();
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
        self.net.add(addr(i), mesh)
    }

    pub fn mesh(&self, i: usize) -> &Mesh<Keyring> {
        &self.net.nodes[i].m
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
        self.net.with(i, |m, now| m.handle_command(now, cmd))
    }

    /// Node `i` joins through `seeds`.
    pub fn join(&mut self, i: usize, seeds: Vec<SocketAddr>) {
        self.net.with(i, |m, now| m.join(now, &seeds));
    }

    /// Publishes `records` at node `i` (as the authority injecting into that agent); every
    /// record must merge or be a duplicate or stale.
    pub fn publish(&mut self, i: usize, records: Vec<Arc<SignedLifecycle>>) {
        let r = self.command(i, Command::Publish { lifecycle: records });
        assert_eq!(r, Ok(()), "node {i} refused a publish");
    }

    /// Feeds raw stream bytes to node `i` as if from node `from`.
    pub fn inject_stream(&mut self, i: usize, from: usize, bytes: &[u8]) {
        self.net
            .with(i, |m, now| m.handle_stream_message(now, addr(from), bytes));
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
        self.net.nodes.iter().map(|n| f(&n.m)).sum()
    }

    /// Runs until `done` holds (checked every `step_ms`) or `deadline`; returns the time it
    /// first held.
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
            let next = (self.now + step_ms).min(deadline);
            self.run_until(next);
        }
    }

    /// [`Net::run_until`] (a method here too, so `c.run_until(c.now + ...)` borrows in two
    /// phases rather than through `DerefMut` first).
    pub fn run_until(&mut self, t: u64) {
        self.net.run_until(t);
    }

    /// [`Net::run_for`].
    pub fn run_for(&mut self, ms: u64) {
        self.net.run_for(ms);
    }
}

/// `MeshConfig::for_cluster_size(n)` with `edit` applied.
pub fn config(n: usize, edit: impl FnOnce(&mut MeshConfig)) -> MeshConfig {
    let mut c = MeshConfig::for_cluster_size(n);
    edit(&mut c);
    c
}
