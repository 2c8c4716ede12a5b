//! The shoal layer of the simulator: real `shoal-mesh` cores as nodes, a region authority
//! model, a workload (services, rollouts, drains, process and node crashes), a traffic model
//! (every agent's app picks endpoints), and the oracle that turns it all into a report.
//!
//! # What is measured
//! * **Drain propagation**: from the authority's commit of a withdrawal (DRAINING) until each
//!   live agent applied it (the agent stops handing the endpoint out at that moment). Agents
//!   that were ever CPU-stalled are reported apart (`drain_propagation_stalled_agents_ms`), as
//!   their downs are, and so are agents a link fault cut off from the requesting agent when
//!   the withdrawal was committed (`drain_propagation_cut_off_agents_ms`: they get it after
//!   the heal): the check is over the others.
//! * **Hard-failure detection**: from a node's crash until each surviving agent's SWIM declared
//!   it down (every endpoint of that node stops being routable there at that moment).
//! * **Process failure**: from a process crash until each agent applied the owner's failing
//!   health record.
//! * **False downs**: live, current identities declared down while neither cut off nor stalled.
//! * **Late picks**: picks of an endpoint after it was withdrawn or died (the traffic timeline).
//! * **Convergence**: after `settle_ms`, the first time every live agent of a region holds the
//!   same heads and the same membership, and whether all routable sets agree at the end.
//!
//! # The authority model
//! Each region runs the shared `shoal-authority` rules ([`shoal_authority::AuthorityState`], the
//! same state machine the Raft-replicated authority applies): registration assigns the boot
//! generation from the log index, transitions are checked against the legal table and signed
//! with gap-free revisions after `commit_ms`. Writes are refused during configured outage
//! windows (requests are retried with jittered backoff), and each signed record is published at
//! the requesting agent and at one more agent of the region (the authority's own mesh member).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use rand::{Rng, RngExt};
use serde::Deserialize;
use shoal_authority::{ApplyContext, AuthorityCommand, AuthorityState, Caller};
use shoal_catalog::view::{self, Liveness};
use shoal_catalog::{Catalog, Keyring, Verifier};
use shoal_mesh::membership::MemberId;
use shoal_mesh::{Command, MembershipEvent, Mesh, MeshConfig, MeshEvent, MeshTimer};
use shoal_proto::{
    EndpointSpec, Generation, HealthStatus, InstanceId, LabelDimension, Labels, LifecycleState,
    NodeId, NodeKey, Region, Revision, ServiceKey, SignatureBytes, SignatureError, SignedHealth,
    SignedLifecycle, SigningKey, TransitionReason, VerifyingKey, Version, Zone,
};

use crate::node::{Channel, NodeCtx, SimNode, Transmit};
use crate::report::{Check, Distribution, Report};
use crate::rng::{Purpose, SimRng};
use crate::runner::Harness;
use crate::scenario::{CountDist, CrashKind, FaultAction, Scenario, TimedFault};
use crate::world::World;

mod fault_menu;
mod oracle;

/// `[shoal]`: settings of the shoal layer.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShoalSpec {
    /// Authority commit latency, ms.
    #[serde(default = "default_commit_ms")]
    pub commit_ms: u64,
    /// Authority unavailable in these windows (writes refused; agents retry with backoff);
    /// each window names one region's authority, or every region's if it names none.
    #[serde(default)]
    pub outages: Vec<Window>,
    /// Startup (STARTING -> READY) time of a new instance, ms.
    #[serde(default = "default_startup_ms")]
    pub startup_ms: u64,
    /// How long a drained instance keeps serving before it is deregistered, ms.
    #[serde(default = "default_drain_grace_ms")]
    pub drain_grace_ms: u64,
    /// Readiness probe period of owner agents, ms.
    #[serde(default = "default_probe_ms")]
    pub probe_period_ms: u64,
    /// Consecutive probe failures before the owner reports UNHEALTHY.
    #[serde(default = "default_probe_failures")]
    pub probe_failures: u32,
    /// Faults end here; from now on every region must converge.
    pub settle_ms: u64,
    /// Override of the anti-entropy period, ms.
    pub anti_entropy_ms: Option<u64>,
    /// Override of the SWIM suspicion window, ms.
    pub suspicion_ms: Option<u64>,
    /// Override of how long SWIM remembers a down member, ms (foca's `remove_down_after`,
    /// 24 h by default): lets a scenario split a region for longer than every membership
    /// timeout without simulating a day.
    pub remove_down_ms: Option<u64>,
    /// First boot joins through three seed addresses of the region, as the real agent does
    /// (`Command::Join`), instead of starting with the formed membership (the default, as
    /// after a long steady state). The catalog is still the region's initial one.
    #[serde(default)]
    pub join_on_first_boot: bool,
    /// Override of the membership's reconnect announces per tick (0 = off), for measuring.
    pub reconnect_per_tick: Option<usize>,
    /// Override of the membership's probe health (ADR 0010), for measuring.
    pub probe_health: Option<bool>,
    /// Override of dropping refuted `Down` updates (ADR 0010), for measuring.
    pub drop_refuted_downs: Option<bool>,
    /// Thresholds that turn into report checks.
    #[serde(default)]
    pub expect: Expectations,
}

fn default_commit_ms() -> u64 {
    10
}
fn default_startup_ms() -> u64 {
    2_000
}
fn default_drain_grace_ms() -> u64 {
    10_000
}
fn default_probe_ms() -> u64 {
    1_000
}
fn default_probe_failures() -> u32 {
    2
}

/// A time window `[from_ms, to_ms)`, optionally of one region.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Start, virtual ms.
    pub from_ms: u64,
    /// End, virtual ms.
    pub to_ms: u64,
    /// Only this region (default: every region).
    pub region: Option<String>,
}

/// Pass/fail thresholds for a scenario.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Expectations {
    /// Drain propagation p99 must not exceed this, ms.
    pub drain_p99_ms: Option<u64>,
    /// Hard-failure detection p99 must not exceed this, ms.
    pub detection_p99_ms: Option<u64>,
    /// At most this many false downs (live, not cut off, not stalled).
    pub max_false_downs: Option<u64>,
    /// Every region must converge (same heads, members and routable sets) by the end.
    #[serde(default)]
    pub converge: bool,
    /// Convergence after `settle_ms` must happen within this, ms.
    pub converge_within_ms: Option<u64>,
    /// No pick of a withdrawn or dead endpoint later than its own measured propagation.
    #[serde(default)]
    pub no_late_picks: bool,
    /// No live node may stay down in any agent's view longer than this, ms (and none at the
    /// end): a forged or mistaken down must heal (`shoal/fault_menu.rs`).
    pub max_live_down_spell_ms: Option<u64>,
}

// ---- verification cache + interning shared by all simulated agents ---------------------------

/// Verifies each distinct signed record once (real ed25519) and shares one copy of it between
/// all simulated agents. Equal content gives equal results, so this changes cost, not outcome.
#[derive(Debug, Default)]
pub struct SimKeys {
    keyring: Keyring,
    lifecycle: RefCell<HashMap<SignatureBytes, Arc<SignedLifecycle>>>,
    /// Verified health records with the owner key they verified against (the catalog picks
    /// the key from the lifecycle record, so a hit must match it too).
    health: RefCell<HashMap<SignatureBytes, (Arc<SignedHealth>, NodeKey)>>,
    lifecycle_encodings: RefCell<Encodings<SignedLifecycle>>,
    health_encodings: RefCell<Encodings<SignedHealth>>,
    lifecycle_bytes: RefCell<Serialized<SignedLifecycle>>,
    health_bytes: RefCell<Serialized<SignedHealth>>,
}

/// The postcard encoding of each shared record any simulated agent sent, by the record's
/// address. The map holds the `Arc` too, so the address cannot be reused by another record.
type Serialized<T> = HashMap<*const T, (Arc<T>, Box<[u8]>)>;

fn append_serialized<T: serde::Serialize>(
    map: &mut Serialized<T>,
    record: &Arc<T>,
    out: &mut Vec<u8>,
) {
    let (_, bytes) = map.entry(Arc::as_ptr(record)).or_insert_with(|| {
        let bytes = postcard::to_allocvec(&**record).expect("plain data always serialises");
        (Arc::clone(record), bytes.into())
    });
    out.extend_from_slice(bytes);
}

/// How many leading bytes of an encoding key [`Encodings`]. Every signed record is longer (its
/// signature alone is 64 bytes, after the record), and the first 48 bytes already hold the
/// service key, instance and generation, so a bucket rarely holds more than one encoding.
const ENCODING_PREFIX: usize = 48;

/// Record encodings seen by any simulated agent, with their decoded (shared) record: a push
/// is decoded once per distinct record instead of once per receiving agent. Keyed by the
/// first [`ENCODING_PREFIX`] bytes; a bucket lists whole encodings.
type Encodings<T> = HashMap<[u8; ENCODING_PREFIX], Vec<(Box<[u8]>, Arc<T>)>>;

fn find_encoding<T>(map: &Encodings<T>, input: &[u8]) -> Option<(Arc<T>, usize)> {
    let prefix: &[u8; ENCODING_PREFIX] = input.get(..ENCODING_PREFIX)?.try_into().ok()?;
    map.get(prefix)?
        .iter()
        .find(|(enc, _)| input.starts_with(enc))
        .map(|(enc, rec)| (Arc::clone(rec), enc.len()))
}

fn add_encoding<T>(map: &mut Encodings<T>, encoding: &[u8], record: Arc<T>) {
    let Some(prefix) = encoding.get(..ENCODING_PREFIX) else {
        return;
    };
    let prefix: [u8; ENCODING_PREFIX] = prefix.try_into().expect("prefix length");
    let bucket = map.entry(prefix).or_default();
    if bucket.iter().all(|(enc, _)| **enc != *encoding) {
        bucket.push((encoding.into(), record));
    }
}

/// Cheap handle to [`SimKeys`], the verifier every simulated mesh uses.
#[derive(Debug, Clone)]
pub struct SharedKeys(Rc<SimKeys>);

impl Verifier for SharedKeys {
    fn verify_lifecycle(&self, signed: &SignedLifecycle) -> Result<(), SignatureError> {
        if let Some(c) = self.0.lifecycle.borrow().get(&signed.signature) {
            // The shared copy itself (most records are) needs no comparison.
            if std::ptr::eq(&**c, signed) || **c == *signed {
                return Ok(());
            }
        }
        self.0.keyring.verify_lifecycle(signed)?;
        self.0
            .lifecycle
            .borrow_mut()
            .insert(signed.signature, Arc::new(signed.clone()));
        Ok(())
    }

    fn verify_health(
        &self,
        signed: &SignedHealth,
        key: &VerifyingKey,
    ) -> Result<(), SignatureError> {
        if let Some((c, k)) = self.0.health.borrow().get(&signed.signature) {
            // The shared copy itself (most records are) needs no comparison.
            if (std::ptr::eq(&**c, signed) || **c == *signed) && *k == key.to_bytes() {
                return Ok(());
            }
        }
        key.verify_health(signed)?;
        self.0
            .health
            .borrow_mut()
            .insert(signed.signature, (Arc::new(signed.clone()), key.to_bytes()));
        Ok(())
    }

    fn intern_lifecycle(&self, record: Arc<SignedLifecycle>) -> Arc<SignedLifecycle> {
        match self.0.lifecycle.borrow().get(&record.signature) {
            Some(c) if Arc::ptr_eq(c, &record) || **c == *record => Arc::clone(c),
            _ => record,
        }
    }

    fn intern_health(&self, record: Arc<SignedHealth>) -> Arc<SignedHealth> {
        match self.0.health.borrow().get(&record.signature) {
            Some((c, _)) if Arc::ptr_eq(c, &record) || **c == *record => Arc::clone(c),
            _ => record,
        }
    }

    fn caches_encodings(&self) -> bool {
        true
    }

    fn encoded_lifecycle(&self, input: &[u8]) -> Option<(Arc<SignedLifecycle>, usize)> {
        find_encoding(&self.0.lifecycle_encodings.borrow(), input)
    }

    fn remember_lifecycle_encoding(&self, encoding: &[u8], record: &Arc<SignedLifecycle>) {
        let record = self.intern_lifecycle(Arc::clone(record));
        add_encoding(
            &mut self.0.lifecycle_encodings.borrow_mut(),
            encoding,
            record,
        );
    }

    fn encoded_health(&self, input: &[u8]) -> Option<(Arc<SignedHealth>, usize)> {
        find_encoding(&self.0.health_encodings.borrow(), input)
    }

    fn remember_health_encoding(&self, encoding: &[u8], record: &Arc<SignedHealth>) {
        let record = self.intern_health(Arc::clone(record));
        add_encoding(&mut self.0.health_encodings.borrow_mut(), encoding, record);
    }

    fn append_lifecycle_encoding(&self, record: &Arc<SignedLifecycle>, out: &mut Vec<u8>) -> bool {
        append_serialized(&mut self.0.lifecycle_bytes.borrow_mut(), record, out);
        true
    }

    fn append_health_encoding(&self, record: &Arc<SignedHealth>, out: &mut Vec<u8>) -> bool {
        append_serialized(&mut self.0.health_bytes.borrow_mut(), record, out);
        true
    }
}

// ---- the node ----------------------------------------------------------------------------------

/// One simulated agent: a real [`Mesh`] plus a timer-token table and an event tap.
pub struct ShoalNode {
    index: u32,
    mesh: Mesh<SharedKeys>,
    timers: TimerSlots,
    observer: Rc<RefCell<Observer>>,
}

/// Pending mesh timers by token. A token is a slot number (low 32 bits) and the slot's use
/// count (high 32 bits), so a slot is reused once its timer fired and a token that is no longer
/// pending finds nothing, as with a map from never-reused tokens. Cheaper than hashing: every
/// mesh timer is one insert and one take.
#[derive(Default)]
struct TimerSlots {
    slots: Vec<(u32, Option<MeshTimer>)>,
    free: Vec<u32>,
}

impl TimerSlots {
    fn insert(&mut self, timer: MeshTimer) -> u64 {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push((0, None));
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 pending timers")
            }
        };
        let (uses, t) = &mut self.slots[slot as usize];
        debug_assert!(t.is_none(), "a free slot is empty");
        *uses = uses.wrapping_add(1);
        *t = Some(timer);
        (u64::from(*uses) << 32) | u64::from(slot)
    }

    fn take(&mut self, token: u64) -> Option<MeshTimer> {
        let slot = token as u32;
        let (uses, t) = self.slots.get_mut(slot as usize)?;
        if u64::from(*uses) != token >> 32 {
            return None;
        }
        let timer = t.take()?;
        self.free.push(slot);
        Some(timer)
    }
}

impl ShoalNode {
    /// The mesh core.
    pub fn mesh(&self) -> &Mesh<SharedKeys> {
        &self.mesh
    }

    /// Runs a command and taps the resulting events.
    pub fn command(&mut self, now_ms: u64, cmd: Command) {
        self.mesh.handle_command(now_ms, cmd);
        self.tap(now_ms);
    }

    fn tap(&mut self, now_ms: u64) {
        let mut obs = self.observer.borrow_mut();
        while let Some(ev) = self.mesh.poll_event() {
            obs.on_event(self.index, now_ms, ev);
        }
    }
}

impl SimNode for ShoalNode {
    fn handle_datagram(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]) {
        self.mesh.handle_datagram(now_ms, from, bytes);
        self.tap(now_ms);
    }

    fn handle_stream_message(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]) {
        self.mesh.handle_stream_message(now_ms, from, bytes);
        self.tap(now_ms);
    }

    fn handle_timer(&mut self, now_ms: u64, token: u64) {
        if let Some(t) = self.timers.take(token) {
            self.mesh.handle_timer(now_ms, t);
            self.tap(now_ms);
        }
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        let t = self.mesh.poll_transmit()?;
        Some(Transmit {
            to: t.to,
            channel: match t.channel {
                shoal_mesh::Channel::Datagram => Channel::Datagram,
                shoal_mesh::Channel::Stream => Channel::Stream,
            },
            bytes: t.bytes,
        })
    }

    fn poll_timer(&mut self) -> Option<(u64, u64)> {
        let (at, t) = self.mesh.poll_timer()?;
        Some((at, self.timers.insert(t)))
    }
}

// ---- the observer --------------------------------------------------------------------------------

/// A withdrawal being timed: the first time each agent applied a record at or past `marker`.
#[derive(Debug)]
struct Tracked {
    marker: (Generation, Revision),
    region: u16,
    committed_ms: u64,
    seen_ms: Vec<u64>,
    /// Agents a link fault cut off from the requesting agent at commit time: they cannot
    /// apply the withdrawal before the heal, whatever the protocol, so their samples are
    /// reported apart (`drain_propagation_cut_off_agents_ms`).
    cut_off: BTreeSet<u32>,
}

/// `Death::seen_ms` of an agent that did not hold the dead identity as an active member when
/// it died: nothing to detect there (see [`ShoalHarness::mark_unaware`]).
const UNAWARE: u64 = u64::MAX - 1;

/// A death being timed: the first time each agent declared the node down.
#[derive(Debug)]
struct Death {
    at_ms: u64,
    boot: Generation,
    region: u16,
    seen_ms: Vec<u64>,
}

/// A process crash being timed: the first time each agent applied the failing health.
#[derive(Debug)]
struct ProcessDeath {
    at_ms: u64,
    generation: Generation,
    region: u16,
    seen_ms: Vec<u64>,
}

/// Collects what nodes report, keyed for cheap lookup.
#[derive(Debug, Default)]
pub struct Observer {
    nodes: usize,
    drains: HashMap<(ServiceKey, InstanceId), Tracked>,
    finished_drains: Vec<Tracked>,
    deaths: BTreeMap<u32, Death>,
    finished_deaths: Vec<Death>,
    process_deaths: HashMap<(ServiceKey, InstanceId), ProcessDeath>,
    finished_process: Vec<ProcessDeath>,
    /// Per node: current boot while running, `None` when crashed.
    boots: Vec<Option<Generation>>,
    /// Nodes cut off from (part of) the region, or stalled: their downs are not false.
    excused: BTreeSet<u32>,
    /// Nodes ever CPU-stalled: their drain applications are reported apart (a node asleep
    /// 800 ms of every second cannot apply anything within a second, whatever the protocol).
    stalled: BTreeSet<u32>,
    false_downs: u64,
    /// Distinct nodes falsely declared down.
    false_down_targets: BTreeSet<u32>,
    excused_downs: u64,
    /// (node, time) of every false down, for the report (first 32).
    false_down_samples: Vec<(u32, u32, u64)>,
    /// How long live nodes stay down in each view; forged rumours' subjects.
    spells: fault_menu::DownSpells,
}

fn node_index(id: &NodeId) -> Option<u32> {
    id.as_str().strip_prefix('n')?.parse().ok()
}

impl Observer {
    fn on_event(&mut self, node: u32, now_ms: u64, ev: MeshEvent) {
        match ev {
            MeshEvent::LifecycleApplied(rec) => self.on_lifecycle(node, now_ms, &rec),
            MeshEvent::HealthApplied(rec) => self.on_health(node, now_ms, &rec),
            MeshEvent::Membership(MembershipEvent::Down(m)) => self.on_down(node, now_ms, &m),
            MeshEvent::Membership(MembershipEvent::Up(m)) => self.on_up(node, now_ms, &m),
            _ => {}
        }
    }

    fn on_lifecycle(&mut self, node: u32, now_ms: u64, rec: &SignedLifecycle) {
        if self.drains.is_empty() {
            return;
        }
        let r = &rec.record;
        // Borrowed lookup: build the key only when something is tracked.
        if let Some(t) = self.drains.get_mut(&(r.key.clone(), r.instance.clone())) {
            if r.order() >= t.marker && t.seen_ms[node as usize] == u64::MAX {
                t.seen_ms[node as usize] = now_ms;
            }
        }
    }

    fn on_health(&mut self, node: u32, now_ms: u64, rec: &SignedHealth) {
        let r = &rec.record;
        if r.status != HealthStatus::Failing || self.process_deaths.is_empty() {
            return;
        }
        if let Some(p) = self
            .process_deaths
            .get_mut(&(r.key.clone(), r.instance.clone()))
        {
            if r.generation == p.generation && p.seen_ms[node as usize] == u64::MAX {
                p.seen_ms[node as usize] = now_ms;
            }
        }
    }

    fn on_down(&mut self, node: u32, now_ms: u64, m: &MemberId) {
        let Some(target) = node_index(&m.node) else {
            return;
        };
        if let Some(d) = self.deaths.get_mut(&target) {
            if d.boot == m.boot {
                if d.seen_ms[node as usize] == u64::MAX {
                    d.seen_ms[node as usize] = now_ms;
                }
                return;
            }
        }
        // The process that runs now started at `current`; it may have renewed its identity
        // since (boot + 1 per renewal), so any boot from `current` on is this live process.
        let current = self.boots.get(target as usize).copied().flatten();
        if current.is_some_and(|b| m.boot >= b) {
            self.spells.down(node, target, now_ms);
            if self.spells.forged_subjects.contains(&target) {
                self.spells.forged_subject_downs += 1;
            } else if self.excused.contains(&target) || self.excused.contains(&node) {
                self.excused_downs += 1;
            } else {
                self.false_downs += 1;
                self.false_down_targets.insert(target);
                if self.false_down_samples.len() < 32 {
                    self.false_down_samples.push((node, target, now_ms));
                }
            }
        }
    }
}

// ---- ground truth of the workload ---------------------------------------------------------------

#[derive(Debug, Clone)]
struct Instance {
    key: ServiceKey,
    id: InstanceId,
    generation: Generation,
    owner: u32,
    region: u16,
    spec: EndpointSpec,
    state: LifecycleState,
    process_alive: bool,
    /// When the endpoint stopped being a valid target (withdrawal commit or death), ms.
    bad_since: Option<u64>,
    /// Whether the owner agent already reported it failing.
    reported_failing: bool,
}

#[derive(Debug, Clone)]
enum Action {
    /// Ask the authority for a transition of instance `idx`.
    Request {
        idx: usize,
        to: LifecycleState,
        reason: TransitionReason,
        attempt: u32,
    },
    /// A committed record reaches the requesting agent and the authority's member.
    Publish {
        rec: Arc<SignedLifecycle>,
        at: Vec<u32>,
    },
    /// Register a replacement for instance `idx`.
    Replace { idx: usize },
    /// Drain `count` random READY instances (of one region if set).
    DrainRandom { count: u32, region: Option<u16> },
    /// Crash `count` random instance processes (of one region if set).
    CrashProcesses { count: u32, region: Option<u16> },
    /// Crash `count` random nodes (of one region if set).
    CrashNodes { count: u32, region: Option<u16> },
    /// The owner's probes notice the dead process of `idx`.
    ProbeFails { idx: usize },
}

/// One region's authority: the shared `shoal-authority` rules (the same state machine the
/// replicated authority runs under Raft), a log index standing in for Raft's, and the key.
struct RegionAuthority {
    key: SigningKey,
    state: AuthorityState,
    log_index: u64,
}

/// The shoal harness: drives `shoal-mesh` nodes through a scenario and measures it.
pub struct ShoalHarness {
    spec: ShoalSpec,
    mesh_config: Vec<MeshConfig>,
    keys: SharedKeys,
    node_keys: Vec<SigningKey>,
    authorities: Vec<RegionAuthority>,
    region_names: Vec<Region>,
    zone_names: Vec<Zone>,
    observer: Rc<RefCell<Observer>>,
    instances: Vec<Instance>,
    by_key: HashMap<(ServiceKey, InstanceId), usize>,
    services: Vec<ServiceKey>,
    service_instances: BTreeMap<ServiceKey, Vec<usize>>,
    initial: Vec<Catalog>,
    actions: BTreeMap<(u64, u64), Action>,
    action_seq: u64,
    rng: SimRng,
    traffic_rng: SimRng,
    picks_per_agent_per_s: f64,
    pick_credit: f64,
    next_traffic_ms: u64,
    next_sample_ms: u64,
    converged_at: BTreeMap<u16, u64>,
    // traffic timeline
    picks: u64,
    no_backend: u64,
    late_withdrawn_ms: Vec<u64>,
    late_dead_ms: Vec<u64>,
    /// Per instance (by index): the latest pick after it went bad, ms after it went bad.
    last_bad_pick: HashMap<usize, u64>,
    replaced: u64,
    refused_writes: u64,
    authority_refusals: u64,
    first_boot_ids: Vec<MemberId>,
    next_share_ms: u64,
    maps_shared: u64,
    /// Each agent's last persisted snapshot (only kept when the scenario restarts agents).
    persisted: Vec<Option<Catalog>>,
    next_persist_ms: u64,
    /// The membership fault menu's state (`shoal/fault_menu.rs`).
    menu: fault_menu::MenuState,
}

/// How often the traffic model runs, ms.
const TRAFFIC_TICK_MS: u64 = 100;
/// How often convergence is sampled after `settle_ms`, ms.
const SAMPLE_MS: u64 = 1_000;
/// How often an agent persists its catalog, ms (shoal-agent's `persist.interval_ms` default).
const PERSIST_MS: u64 = 10_000;
/// How often agents of a region are made to share equal catalog maps, ms.
const SHARE_MS: u64 = 1_000;

/// Memory only: every live agent of each region swaps its catalog maps that equal the first
/// live agent's for shared copies ([`Catalog::share_equal_maps`]). Contents never change, so
/// nothing observable does; without it a rollout leaves every agent with a private copy of
/// its region's catalog (~1,667 x 33,000 entries). Returns how many maps were swapped.
fn share_catalogs(world: &mut World<ShoalNode>, regions: u16) -> u64 {
    let mut swapped = 0;
    for r in 0..regions {
        let nodes: Vec<u32> = world.topology().region_nodes(r).collect();
        let Some(reference) = nodes
            .iter()
            .find_map(|&i| world.node(i).map(|n| n.mesh.catalog().clone()))
        else {
            continue;
        };
        for i in nodes {
            world.with_node(i, |n, _| {
                swapped += n.mesh.catalog_mut().share_equal_maps(&reference) as u64;
            });
        }
    }
    swapped
}

impl ShoalHarness {
    /// Builds the harness for `scenario` (which must have a `[shoal]` section).
    pub fn new(scenario: &Scenario, tree: &crate::rng::RngTree) -> anyhow::Result<Self> {
        let spec = scenario
            .shoal
            .clone()
            .ok_or_else(|| anyhow::anyhow!("scenario has no [shoal] section"))?;
        let topo = scenario.build_topology()?;
        let region_names: Vec<Region> = topo
            .region_names()
            .iter()
            .map(|r| Region::new(r.clone()))
            .collect::<Result<_, _>>()?;
        let zone_names: Vec<Zone> = topo
            .zone_names()
            .iter()
            .map(|(r, z)| Zone::new(format!("{}-{z}", topo.region_names()[*r as usize])))
            .collect::<Result<_, _>>()?;
        let mut keyring = Keyring::new();
        let authorities: Vec<RegionAuthority> = region_names
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut seed = [0xA0u8; 32];
                seed[..8].copy_from_slice(&(i as u64).to_le_bytes());
                let key = SigningKey::from_seed(seed);
                keyring.trust_authority(r.clone(), key.verifying_key());
                RegionAuthority {
                    key,
                    state: AuthorityState::new(r.clone()),
                    log_index: 0,
                }
            })
            .collect();
        let node_keys: Vec<SigningKey> = (0..topo.len() as u64)
            .map(|i| {
                let mut seed = [0x5Au8; 32];
                seed[..8].copy_from_slice(&i.to_le_bytes());
                // Not trusted anywhere: the authority binds each into its node's records.
                SigningKey::from_seed(seed)
            })
            .collect();
        let mesh_config = (0..region_names.len() as u16)
            .map(|r| {
                let n = topo.region_nodes(r).len();
                let mut c = MeshConfig::for_cluster_size(n);
                if let Some(ae) = spec.anti_entropy_ms {
                    c.anti_entropy_interval_ms = ae;
                }
                if let Some(s) = spec.suspicion_ms {
                    c.membership.suspect_to_down_after_ms = s;
                }
                if let Some(r) = spec.remove_down_ms {
                    c.membership.remove_down_after_ms = r;
                }
                if let Some(v) = spec.reconnect_per_tick {
                    c.membership.reconnect_per_tick = v;
                }
                if let Some(v) = spec.probe_health {
                    c.membership.probe_health = v;
                }
                if let Some(v) = spec.drop_refuted_downs {
                    c.membership.drop_refuted_downs = v;
                }
                c
            })
            .collect();
        let observer = Rc::new(RefCell::new(Observer {
            nodes: topo.len(),
            boots: vec![None; topo.len()],
            ..Observer::default()
        }));
        let mut h = Self {
            picks_per_agent_per_s: scenario
                .traffic
                .as_ref()
                .map_or(0.0, |t| t.picks_per_agent_per_s),
            spec,
            mesh_config,
            keys: SharedKeys(Rc::new(SimKeys {
                keyring,
                ..SimKeys::default()
            })),
            node_keys,
            authorities,
            region_names,
            zone_names,
            observer,
            instances: Vec::new(),
            by_key: HashMap::new(),
            services: Vec::new(),
            service_instances: BTreeMap::new(),
            initial: Vec::new(),
            actions: BTreeMap::new(),
            action_seq: 0,
            rng: tree.child(Purpose::Workload, 0),
            traffic_rng: tree.child(Purpose::Traffic, 0),
            pick_credit: 0.0,
            next_traffic_ms: TRAFFIC_TICK_MS,
            next_sample_ms: 0,
            converged_at: BTreeMap::new(),
            picks: 0,
            no_backend: 0,
            late_withdrawn_ms: Vec::new(),
            late_dead_ms: Vec::new(),
            last_bad_pick: HashMap::new(),
            replaced: 0,
            refused_writes: 0,
            authority_refusals: 0,
            first_boot_ids: Vec::new(),
            next_share_ms: SHARE_MS,
            maps_shared: 0,
            persisted: if scenario.faults.iter().any(|f| f.action.restarts()) {
                vec![None; topo.len()]
            } else {
                Vec::new()
            },
            next_persist_ms: PERSIST_MS,
            menu: fault_menu::MenuState::default(),
        };
        h.next_sample_ms = h.spec.settle_ms;
        h.populate(scenario, &topo);
        h.schedule_workload(scenario);
        Ok(h)
    }

    /// Registers the initial services as READY and builds each region's initial catalog.
    fn populate(&mut self, scenario: &Scenario, topo: &crate::topology::Topology) {
        let regions = self.region_names.len() as u16;
        let mut catalogs: Vec<Catalog> = (0..regions).map(|_| Catalog::new()).collect();
        let Some(services) = scenario.workload.as_ref().and_then(|w| w.services.as_ref()) else {
            self.initial = catalogs;
            return;
        };
        for s in 0..services.count {
            let key: ServiceKey = format!("prod/svc-{s}/http").parse().expect("valid key");
            let region = (s % u32::from(regions)) as u16;
            let n = draw_count(&services.instances, &mut self.rng);
            self.services.push(key.clone());
            for i in 0..n {
                let nodes = topo.region_nodes(region);
                let owner =
                    nodes.start + (self.rng.next_u64() % u64::from(nodes.end - nodes.start)) as u32;
                let id = InstanceId::new(format!("svc-{s}-{i}")).expect("valid id");
                let idx = self.add_instance(key.clone(), id, owner, region, topo);
                for (to, reason) in [
                    (LifecycleState::Starting, TransitionReason::Registered),
                    (LifecycleState::Ready, TransitionReason::ReadinessPassed),
                ] {
                    let rec = self.commit(idx, to, reason, 0).expect("initial admission");
                    catalogs[region as usize].apply_lifecycle(Arc::new(rec), &self.keys);
                }
            }
        }
        self.initial = catalogs;
    }

    fn add_instance(
        &mut self,
        key: ServiceKey,
        id: InstanceId,
        owner: u32,
        region: u16,
        topo: &crate::topology::Topology,
    ) -> usize {
        let zone = self.zone_names[topo.node(owner).zone as usize].clone();
        let n = self.instances.len() as u32;
        let spec = EndpointSpec {
            address: SocketAddr::from(([10, (n >> 16) as u8, (n >> 8) as u8, n as u8], 8080)),
            zone,
            version: Version::new("1.0.0").expect("valid"),
            weight: 100,
            labels: Labels::new(vec![(LabelDimension::Protocol, "http2".into())]).expect("valid"),
        };
        let idx = self.instances.len();
        self.instances.push(Instance {
            key: key.clone(),
            id: id.clone(),
            // Assigned by the authority at registration (its log index).
            generation: Generation(0),
            owner,
            region,
            spec,
            state: LifecycleState::Starting,
            process_alive: true,
            bad_since: None,
            reported_failing: false,
        });
        self.by_key.insert((key.clone(), id), idx);
        self.service_instances.entry(key).or_default().push(idx);
        idx
    }

    /// Runs one write through the region's authority rules, as the leader would after a Raft
    /// commit. `Starting` registers (a new generation = the log index); anything else is a
    /// transition of the instance's current generation. On success the instance's ground truth
    /// follows the signed record; a refusal is counted and changes nothing.
    fn commit(
        &mut self,
        idx: usize,
        to: LifecycleState,
        reason: TransitionReason,
        now_ms: u64,
    ) -> Option<SignedLifecycle> {
        let inst = &self.instances[idx];
        let caller = Caller::Node(node_id(inst.owner));
        if to == LifecycleState::Starting {
            self.bind_node_key(inst.region as usize, inst.owner, now_ms);
        }
        let inst = &self.instances[idx];
        let cmd = if to == LifecycleState::Starting {
            AuthorityCommand::Register {
                caller,
                key: inst.key.clone(),
                instance: inst.id.clone(),
                on_node: None,
                endpoint: inst.spec.clone(),
                lease_ms: 300_000,
            }
        } else {
            AuthorityCommand::Transition {
                caller,
                key: inst.key.clone(),
                instance: inst.id.clone(),
                generation: inst.generation,
                to,
                reason,
            }
        };
        let a = &mut self.authorities[inst.region as usize];
        a.log_index += 1;
        let ctx = ApplyContext {
            log_index: a.log_index,
            committed_at_ms: now_ms,
            signing_key: &a.key,
        };
        match a.state.apply(cmd, ctx) {
            Ok(mut records) if records.len() == 1 => {
                let rec = records.pop().expect("one record");
                let inst = &mut self.instances[idx];
                inst.generation = rec.record.generation;
                inst.state = rec.record.state;
                Some(rec)
            }
            Ok(_) | Err(_) => {
                self.authority_refusals += 1;
                None
            }
        }
    }

    /// As an agent does before its first registration: binds its node key at its region's
    /// authority (ADR 0006), so every record of its instances carries the key its health
    /// verifies against. A key already bound emits nothing and costs no log entry (the real
    /// replicated authority answers that from its state without proposing).
    fn bind_node_key(&mut self, region: usize, owner: u32, now_ms: u64) {
        let key = self.node_keys[owner as usize].verifying_key().to_bytes();
        let a = &mut self.authorities[region];
        let node = node_id(owner);
        if a.state.node_key(&node) == Some(key) {
            return;
        }
        a.log_index += 1;
        let ctx = ApplyContext {
            log_index: a.log_index,
            committed_at_ms: now_ms,
            signing_key: &a.key,
        };
        let cmd = AuthorityCommand::BindNodeKey {
            caller: Caller::Node(node),
            key,
        };
        if !matches!(a.state.apply(cmd, ctx), Ok(r) if r.is_empty()) {
            self.authority_refusals += 1;
        }
    }

    fn at(&mut self, ms: u64, action: Action) {
        self.action_seq += 1;
        self.actions.insert((ms, self.action_seq), action);
    }

    fn schedule_workload(&mut self, scenario: &Scenario) {
        let Some(w) = scenario.workload.as_ref() else {
            return;
        };
        if let Some(r) = &w.rollout {
            let region = self.region_of(r.region.as_deref());
            let mut victims: Vec<usize> = (0..self.instances.len())
                .filter(|&i| region.is_none_or(|r| self.instances[i].region == r))
                .collect();
            shuffle(&mut victims, &mut self.rng);
            victims.truncate(r.replacements as usize);
            let step = r.over_ms / u64::from(r.replacements.max(1));
            for (k, idx) in victims.into_iter().enumerate() {
                self.at(r.start_ms + k as u64 * step, Action::Replace { idx });
            }
        }
        for d in &w.drains {
            let region = self.region_of(d.region.as_deref());
            let count = d.instances;
            self.at(d.at_ms, Action::DrainRandom { count, region });
        }
        for c in &w.crashes {
            let (count, region) = (c.count, self.region_of(c.region.as_deref()));
            let a = match c.kind {
                CrashKind::Process => Action::CrashProcesses { count, region },
                CrashKind::Node => Action::CrashNodes { count, region },
            };
            self.at(c.at_ms, a);
        }
    }

    /// The index of a region named in the scenario (validated there), `None` for "any".
    fn region_of(&self, name: Option<&str>) -> Option<u16> {
        let name = name?;
        let i = self.region_names.iter().position(|r| r.as_str() == name);
        Some(i.expect("region names are validated with the scenario") as u16)
    }

    /// If `region`'s authority is down at `now_ms`, when it comes back.
    fn in_outage(&self, region: u16, now_ms: u64) -> Option<u64> {
        let name = self.region_names[region as usize].as_str();
        self.spec
            .outages
            .iter()
            .find(|w| {
                (w.from_ms..w.to_ms).contains(&now_ms)
                    && w.region.as_deref().is_none_or(|r| r == name)
            })
            .map(|w| w.to_ms)
    }

    fn run_action(&mut self, world: &mut World<ShoalNode>, now_ms: u64, action: Action) {
        match action {
            Action::Request {
                idx,
                to,
                reason,
                attempt,
            } => self.request(world, now_ms, idx, to, reason, attempt),
            Action::Publish { rec, at } => {
                for node in at {
                    if world.is_alive(node) {
                        let rec = Arc::clone(&rec);
                        world.with_node(node, |n, now| {
                            n.command(
                                now,
                                Command::Publish {
                                    lifecycle: vec![rec],
                                },
                            );
                        });
                    }
                }
            }
            Action::Replace { idx } => self.replace(world, now_ms, idx),
            Action::DrainRandom { count, region } => {
                let mut ready: Vec<usize> = (0..self.instances.len())
                    .filter(|&i| {
                        let inst = &self.instances[i];
                        region.is_none_or(|r| inst.region == r)
                            && inst.state == LifecycleState::Ready
                            && inst.process_alive
                            && world.is_alive(inst.owner)
                    })
                    .collect();
                shuffle(&mut ready, &mut self.rng);
                for idx in ready.into_iter().take(count as usize) {
                    self.at(
                        now_ms,
                        Action::Request {
                            idx,
                            to: LifecycleState::Draining,
                            reason: TransitionReason::DrainRequested,
                            attempt: 0,
                        },
                    );
                }
            }
            Action::CrashProcesses { count, region } => {
                let mut live: Vec<usize> = (0..self.instances.len())
                    .filter(|&i| {
                        let inst = &self.instances[i];
                        region.is_none_or(|r| inst.region == r)
                            && inst.state == LifecycleState::Ready
                            && inst.process_alive
                            && world.is_alive(inst.owner)
                    })
                    .collect();
                shuffle(&mut live, &mut self.rng);
                for idx in live.into_iter().take(count as usize) {
                    self.crash_process(now_ms, idx);
                }
            }
            Action::CrashNodes { count, region } => {
                let topo = world.topology();
                let mut live: Vec<u32> = (0..world.len() as u32)
                    .filter(|&i| {
                        world.is_alive(i) && region.is_none_or(|r| topo.node(i).region == r)
                    })
                    .collect();
                shuffle(&mut live, &mut self.rng);
                for node in live.into_iter().take(count as usize) {
                    world.crash(node);
                    self.on_node_crash(world, now_ms, node);
                }
            }
            Action::ProbeFails { idx } => {
                let inst = &mut self.instances[idx];
                if inst.reported_failing || !world.is_alive(inst.owner) {
                    return;
                }
                inst.reported_failing = true;
                let (owner, key, id, generation) = (
                    inst.owner,
                    inst.key.clone(),
                    inst.id.clone(),
                    inst.generation,
                );
                world.with_node(owner, |n, now| {
                    n.command(
                        now,
                        Command::ReportHealth {
                            key,
                            instance: id,
                            generation,
                            status: HealthStatus::Failing,
                            reason: TransitionReason::ReadinessFailed,
                        },
                    );
                });
            }
        }
    }

    fn request(
        &mut self,
        world: &mut World<ShoalNode>,
        now_ms: u64,
        idx: usize,
        to: LifecycleState,
        reason: TransitionReason,
        attempt: u32,
    ) {
        let inst = &self.instances[idx];
        if !world.is_alive(inst.owner) || inst.state == LifecycleState::Expired {
            return;
        }
        if let Some(until) = self.in_outage(inst.region, now_ms) {
            // No quorum: refused; the agent retries with exponential backoff and full jitter.
            self.refused_writes += 1;
            let cap = 1_000u64 << attempt.min(5);
            let retry = (now_ms + self.rng.next_u64() % cap.max(1)).max(until.min(now_ms + cap));
            self.at(
                retry,
                Action::Request {
                    idx,
                    to,
                    reason,
                    attempt: attempt + 1,
                },
            );
            return;
        }
        let commit_ms = now_ms + self.spec.commit_ms;
        let Some(rec) = self.commit(idx, to, reason, commit_ms) else {
            return;
        };
        let rec = Arc::new(rec);
        let owner = self.instances[idx].owner;
        let region = self.instances[idx].region;
        let inst = &mut self.instances[idx];
        match to {
            LifecycleState::Draining | LifecycleState::Expired => {
                if inst.bad_since.is_none() {
                    inst.bad_since = Some(commit_ms);
                }
                if to == LifecycleState::Draining {
                    let seen = vec![u64::MAX; self.observer.borrow().nodes];
                    let faults = world.link_faults();
                    let cut_off = if faults.is_empty() {
                        BTreeSet::new()
                    } else {
                        (0..world.len() as u32)
                            .filter(|&i| faults.blocked(owner, i))
                            .collect()
                    };
                    let tracked = Tracked {
                        marker: rec.record.order(),
                        region,
                        committed_ms: commit_ms,
                        seen_ms: seen,
                        cut_off,
                    };
                    let mut obs = self.observer.borrow_mut();
                    let key = (inst.key.clone(), inst.id.clone());
                    if let Some(old) = obs.drains.insert(key, tracked) {
                        obs.finished_drains.push(old);
                    }
                    drop(obs);
                    self.at(
                        commit_ms + self.spec.drain_grace_ms,
                        Action::Request {
                            idx,
                            to: LifecycleState::Expired,
                            reason: TransitionReason::Deregistered,
                            attempt: 0,
                        },
                    );
                }
            }
            LifecycleState::Starting => {
                self.at(
                    commit_ms + self.spec.startup_ms,
                    Action::Request {
                        idx,
                        to: LifecycleState::Ready,
                        reason: TransitionReason::ReadinessPassed,
                        attempt: 0,
                    },
                );
            }
            LifecycleState::Ready => {}
        }
        let nodes = world.topology().region_nodes(region);
        let member =
            nodes.start + (self.rng.next_u64() % u64::from(nodes.end - nodes.start)) as u32;
        self.at(
            commit_ms,
            Action::Publish {
                rec,
                at: vec![owner, member],
            },
        );
    }

    fn replace(&mut self, world: &mut World<ShoalNode>, now_ms: u64, idx: usize) {
        let old = self.instances[idx].clone();
        if old.state != LifecycleState::Ready {
            return;
        }
        self.replaced += 1;
        let topo = Arc::clone(world.topology());
        let nodes = topo.region_nodes(old.region);
        let owner = nodes.start + (self.rng.next_u64() % u64::from(nodes.end - nodes.start)) as u32;
        let id = InstanceId::new(format!("{}-r{}", old.id, self.replaced)).expect("valid id");
        let new = self.add_instance(old.key.clone(), id, owner, old.region, &topo);
        self.request(
            world,
            now_ms,
            new,
            LifecycleState::Starting,
            TransitionReason::Registered,
            0,
        );
        // The old instance is drained once its replacement is READY (k8s maxUnavailable = 0).
        let ready_at = now_ms + self.spec.commit_ms * 2 + self.spec.startup_ms;
        self.at(
            ready_at,
            Action::Request {
                idx,
                to: LifecycleState::Draining,
                reason: TransitionReason::DrainRequested,
                attempt: 0,
            },
        );
    }

    fn crash_process(&mut self, now_ms: u64, idx: usize) {
        let inst = &mut self.instances[idx];
        inst.process_alive = false;
        inst.bad_since.get_or_insert(now_ms);
        let seen = vec![u64::MAX; self.observer.borrow().nodes];
        self.observer.borrow_mut().process_deaths.insert(
            (inst.key.clone(), inst.id.clone()),
            ProcessDeath {
                at_ms: now_ms,
                generation: inst.generation,
                region: inst.region,
                seen_ms: seen,
            },
        );
        // The owner's readiness probe runs every period with jitter; `probe_failures`
        // consecutive failures mark the instance failing.
        let period = self.spec.probe_period_ms;
        let first = now_ms + self.rng.next_u64() % period.max(1);
        let at = first + period * u64::from(self.spec.probe_failures.saturating_sub(1));
        self.at(at, Action::ProbeFails { idx });
    }

    fn on_node_crash(&mut self, world: &World<ShoalNode>, now_ms: u64, node: u32) {
        let region = world.topology().node(node).region;
        let mut obs = self.observer.borrow_mut();
        let boot = obs.boots[node as usize].take().unwrap_or(Generation(0));
        let death = Death {
            at_ms: now_ms,
            boot,
            region,
            seen_ms: vec![u64::MAX; obs.nodes],
        };
        if let Some(old) = obs.deaths.insert(node, death) {
            obs.finished_deaths.push(old);
        }
        drop(obs);
        self.mark_unaware(world, node);
        for inst in self.instances.iter_mut().filter(|i| i.owner == node) {
            inst.bad_since.get_or_insert(now_ms);
            inst.process_alive = false;
        }
    }

    /// Right after `node`'s death was recorded: marks the agents of its region that do not
    /// hold the dead identity as an active member, so have nothing to detect. They held it
    /// down already (the far side of a partition), never learned it (an agent that restarted
    /// and has not heard of it yet), or are the node itself, restarted. Such agents are left
    /// out of the detection figures (counted in `detection_observers_unaware`), not counted
    /// as missing. O(agents x members) per death.
    fn mark_unaware(&self, world: &World<ShoalNode>, node: u32) {
        let mut obs = self.observer.borrow_mut();
        let Some(d) = obs.deaths.get_mut(&node) else {
            return;
        };
        let id = node_id(node);
        for i in world.topology().region_nodes(d.region) {
            let Some(n) = world.node(i) else { continue };
            let aware = i != node
                && n.mesh()
                    .membership()
                    .members()
                    .any(|m| m.node == id && m.boot == d.boot);
            if !aware && d.seen_ms[i as usize] == u64::MAX {
                d.seen_ms[i as usize] = UNAWARE;
            }
        }
    }

    fn traffic(&mut self, world: &World<ShoalNode>, now_ms: u64) {
        if self.picks_per_agent_per_s <= 0.0 || self.services.is_empty() {
            return;
        }
        self.pick_credit += self.picks_per_agent_per_s * TRAFFIC_TICK_MS as f64 / 1000.0;
        let rounds = self.pick_credit.floor() as u32;
        self.pick_credit -= f64::from(rounds);
        for _ in 0..rounds {
            for node in 0..world.len() as u32 {
                let Some(n) = world.node(node) else { continue };
                if world.is_stalled(node) {
                    continue;
                }
                self.pick_once(n, node, now_ms, world);
            }
        }
    }

    fn pick_once(&mut self, n: &ShoalNode, node: u32, now_ms: u64, world: &World<ShoalNode>) {
        let region = world.topology().node(node).region as usize;
        // Services are spread over regions round-robin (service s lives in region s % R);
        // an app picks uniformly among its own region's services.
        let regions = self.region_names.len();
        let in_region = self.services.len().saturating_sub(region).div_ceil(regions);
        if in_region == 0 {
            return;
        }
        let k = (self.traffic_rng.next_u64() % in_region as u64) as usize;
        let key = &self.services[k * regions + region];
        let mesh = n.mesh();
        let liveness = mesh.liveness();
        let r = self.traffic_rng.next_u64();
        let zone = &self.zone_names[world.topology().node(node).zone as usize];
        let picked = view::pick(
            mesh.catalog().routable(key, &liveness),
            mesh.region(),
            zone,
            false,
            r,
        );
        self.picks += 1;
        let Some(entry) = picked else {
            self.no_backend += 1;
            return;
        };
        let rec = &entry.lifecycle().record;
        let Some(&idx) = self.by_key.get(&(rec.key.clone(), rec.instance.clone())) else {
            return;
        };
        let inst = &self.instances[idx];
        if let Some(since) = inst.bad_since {
            if now_ms >= since {
                let late = now_ms - since;
                if inst.process_alive && inst.state != LifecycleState::Ready {
                    self.late_withdrawn_ms.push(late);
                } else {
                    self.late_dead_ms.push(late);
                }
                let e = self.last_bad_pick.entry(idx).or_insert(0);
                *e = (*e).max(late);
            }
        }
        let _ = liveness.is_down(&rec.owner);
    }
}

fn node_id(i: u32) -> NodeId {
    NodeId::new(format!("n{i}")).expect("valid node id")
}

const FNV: u64 = 0xcbf2_9ce4_8422_2325;
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn shuffle<T>(v: &mut [T], rng: &mut SimRng) {
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

fn draw_count(d: &CountDist, rng: &mut SimRng) -> u32 {
    match *d {
        CountDist::Fixed { n } => n,
        CountDist::Uniform { min, max } => rng.random_range(min..=max),
        CountDist::Tiered { ref tiers } => {
            // Pick the tier by its share (the last one takes rounding leftovers), then the count.
            let mut u = rng.random::<f64>() * 100.0;
            let tier = tiers
                .iter()
                .find(|t| {
                    u -= t.pct;
                    u < 0.0
                })
                .or(tiers.last())
                .expect("validated: at least one tier");
            rng.random_range(tier.min..=tier.max)
        }
        CountDist::Zipf { max, exponent } => {
            // Inverse-CDF sampling over 1..=max with weights k^-exponent.
            let total: f64 = (1..=max).map(|k| f64::from(k).powf(-exponent)).sum();
            let mut u = rng.random::<f64>() * total;
            for k in 1..=max {
                u -= f64::from(k).powf(-exponent);
                if u <= 0.0 {
                    return max + 1 - k;
                }
            }
            1
        }
    }
}

impl ShoalHarness {
    /// Three random seed addresses of `region` (not `me`), as an agent's configuration lists.
    fn seed_addrs(
        &mut self,
        topo: &crate::topology::Topology,
        region: u16,
        me: u32,
    ) -> Vec<SocketAddr> {
        let nodes = topo.region_nodes(region);
        (0..3)
            .map(|_| {
                nodes.start + (self.rng.next_u64() % u64::from(nodes.end - nodes.start)) as u32
            })
            .filter(|&i| i != me)
            .map(|i| topo.node(i).addr)
            .collect()
    }
}

impl Harness for ShoalHarness {
    type Node = ShoalNode;

    fn make_node(&mut self, ctx: &NodeCtx) -> ShoalNode {
        let topo = &ctx.topology;
        let region = topo.node(ctx.index).region;
        let boot = Generation(u64::from(ctx.epoch) + 1);
        let identity = MemberId {
            node: node_id(ctx.index),
            addr: ctx.addr,
            boot,
        };
        let mut mesh = Mesh::new(
            identity,
            self.region_names[region as usize].clone(),
            self.zone_names[ctx.zone as usize].clone(),
            self.node_keys[ctx.index as usize].clone(),
            self.mesh_config[region as usize].clone(),
            self.keys.clone(),
            ctx.seed,
        );
        let now = ctx.now_ms;
        if ctx.epoch == 0 {
            // First boot: the region is already formed (as after a long steady state). The
            // copy is O(1) and shares the tree until this agent changes an entry.
            *mesh.catalog_mut() = self.initial[region as usize].clone();
            mesh.catalog_mut().reset_counters();
            if self.first_boot_ids.is_empty() {
                // Built once and shared (ids are Arc-backed) by every node's membership.
                self.first_boot_ids = (0..topo.len() as u32)
                    .map(|i| MemberId {
                        node: node_id(i),
                        addr: topo.node(i).addr,
                        boot: Generation(1),
                    })
                    .collect();
            }
            if self.spec.join_on_first_boot {
                let seeds = self.seed_addrs(topo, region, ctx.index);
                mesh.handle_command(now, Command::Join { seeds });
            } else {
                let members: Vec<MemberId> = topo
                    .region_nodes(region)
                    .filter(|&i| i != ctx.index)
                    .map(|i| self.first_boot_ids[i as usize].clone())
                    .collect();
                mesh.bootstrap(now, members);
            }
        } else {
            // Restart: the agent loads its persisted snapshot (as shoal-agent does at boot),
            // the one its previous process wrote at the last persist tick (every PERSIST_MS,
            // up to that long before the crash); anti-entropy must bring everything since.
            // Then it auto-joins through three seeds of its region.
            self.try_torn_snapshot(ctx.index);
            let persisted = self
                .persisted
                .get_mut(ctx.index as usize)
                .and_then(Option::take);
            *mesh.catalog_mut() =
                persisted.unwrap_or_else(|| self.initial[region as usize].clone());
            mesh.catalog_mut().reset_counters();
            let seeds = self.seed_addrs(topo, region, ctx.index);
            mesh.handle_command(now, Command::Join { seeds });
        }
        self.observer.borrow_mut().boots[ctx.index as usize] = Some(boot);
        let mut node = ShoalNode {
            index: ctx.index,
            mesh,
            timers: TimerSlots::default(),
            observer: Rc::clone(&self.observer),
        };
        node.tap(now);
        node
    }

    fn next_wakeup_ms(&self) -> Option<u64> {
        let action = self.actions.keys().next().map(|(t, _)| *t);
        let traffic = (self.picks_per_agent_per_s > 0.0).then_some(self.next_traffic_ms);
        let sample =
            (self.converged_at.len() < self.region_names.len()).then_some(self.next_sample_ms);
        [action, traffic, sample].into_iter().flatten().min()
    }

    fn wake(&mut self, world: &mut World<ShoalNode>) {
        let now = world.now_ms();
        while let Some(entry) = self.actions.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let action = entry.remove();
            self.run_action(world, now, action);
        }
        if self.picks_per_agent_per_s > 0.0 && self.next_traffic_ms <= now {
            self.traffic(world, now);
            self.next_traffic_ms = now + TRAFFIC_TICK_MS;
        }
        if !self.persisted.is_empty() && self.next_persist_ms <= now {
            for (i, slot) in self.persisted.iter_mut().enumerate() {
                if let Some(n) = world.node(i as u32) {
                    *slot = Some(n.mesh.catalog().clone());
                }
            }
            self.next_persist_ms = now + PERSIST_MS;
        }
        if self.next_share_ms <= now {
            self.maps_shared += share_catalogs(world, self.region_names.len() as u16);
            self.next_share_ms = now + SHARE_MS;
        }
        if now >= self.spec.settle_ms && self.next_sample_ms <= now {
            self.sample_convergence(world, now);
            self.next_sample_ms = now + SAMPLE_MS;
        }
    }

    fn on_fault(&mut self, world: &mut World<ShoalNode>, fault: &TimedFault, targets: &[u32]) {
        let now = fault.at_ms;
        match &fault.action {
            FaultAction::Crash(_) => {
                for &t in targets {
                    self.on_node_crash(world, now, t);
                }
            }
            FaultAction::Restart(_) | FaultAction::RestartAtNewAddress(_) => {
                // make_node already recorded the new boot; the old identity's death is timed,
                // unless it was crashed before: crash + restart is one death, timed from the
                // crash.
                for &t in targets {
                    let region = world.topology().node(t).region;
                    let mut obs = self.observer.borrow_mut();
                    let boot = Generation(u64::from(world.epoch(t)));
                    if obs.deaths.get(&t).is_some_and(|d| d.boot == boot) {
                        continue;
                    }
                    let death = Death {
                        at_ms: now,
                        boot,
                        region,
                        seen_ms: vec![u64::MAX; obs.nodes],
                    };
                    if let Some(old) = obs.deaths.insert(t, death) {
                        obs.finished_deaths.push(old);
                    }
                }
            }
            FaultAction::Cut { .. }
            | FaultAction::CutOneWay { .. }
            | FaultAction::DropLink { .. }
            | FaultAction::Isolate(_)
            | FaultAction::IsolateExcept { .. }
            | FaultAction::Stall { .. } => {
                let mut obs = self.observer.borrow_mut();
                obs.excused.extend(targets.iter().copied());
                if matches!(fault.action, FaultAction::Stall { .. }) {
                    obs.stalled.extend(targets.iter().copied());
                }
            }
            FaultAction::Heal => {}
            FaultAction::Recover(_) | FaultAction::Unstall(_) => {}
            FaultAction::Skew { .. } | FaultAction::SetNetwork { .. } => {}
            // Applied (and recorded) by `node_fault`; a path MTU is not a cut.
            FaultAction::DuplicateId { .. }
            | FaultAction::InjectUpdate { .. }
            | FaultAction::CrashTornSnapshot(_)
            | FaultAction::LinkMaxDatagram { .. } => {}
        }
        if let FaultAction::Restart(_) | FaultAction::RestartAtNewAddress(_) = fault.action {
            for &t in targets {
                self.mark_unaware(world, t);
            }
        }
    }

    fn finish(
        &mut self,
        world: &World<ShoalNode>,
        report: &mut Report,
        samples: &mut BTreeMap<String, Vec<u64>>,
    ) {
        self.report(world, report, samples);
        self.menu_report(report);
    }

    fn node_fault(&mut self, world: &mut World<ShoalNode>, fault: &crate::runner::NodeFault) {
        self.apply_node_fault(world, fault);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::RngTree;
    use crate::scenario::Tier;

    #[test]
    fn a_timer_token_fires_once_and_a_reused_slot_gets_a_new_token() {
        let mut t = TimerSlots::default();
        let a = t.insert(MeshTimer::Flush);
        let b = t.insert(MeshTimer::Gc);
        assert_ne!(a, b);
        assert_eq!(t.take(a), Some(MeshTimer::Flush));
        assert_eq!(t.take(a), None, "fired already");
        let c = t.insert(MeshTimer::IHave);
        assert_ne!(c, a, "slot reused under a new token");
        assert_eq!(
            t.take(a),
            None,
            "the old token finds nothing in the reused slot"
        );
        assert_eq!(t.take(c), Some(MeshTimer::IHave));
        assert_eq!(t.take(b), Some(MeshTimer::Gc));
        assert_eq!(t.take(u64::MAX), None);
    }

    #[test]
    fn tiered_draws_stay_in_their_tiers_with_their_shares() {
        let d = CountDist::Tiered {
            tiers: vec![
                Tier {
                    pct: 1.0,
                    min: 1000,
                    max: 1500,
                },
                Tier {
                    pct: 99.0,
                    min: 10,
                    max: 66,
                },
            ],
        };
        let mut rng = RngTree::new(1).child(Purpose::Workload, 0);
        let draws: Vec<u32> = (0..100_000).map(|_| draw_count(&d, &mut rng)).collect();
        let big = draws.iter().filter(|&&n| n >= 1000).count();
        assert!(
            draws
                .iter()
                .all(|&n| (10..=66).contains(&n) || (1000..=1500).contains(&n)),
            "every draw falls in a tier"
        );
        assert!(
            (800..=1200).contains(&big),
            "{big} of 100,000 in the 1% tier"
        );
        let mean = draws.iter().map(|&n| f64::from(n)).sum::<f64>() / draws.len() as f64;
        assert!((mean - d.mean()).abs() < 2.0, "mean {mean} vs {}", d.mean());
    }
}
