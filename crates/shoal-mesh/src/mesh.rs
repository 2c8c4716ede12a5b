//! One agent's protocol core: SWIM membership + record dissemination + anti-entropy.
//!
//! # Shape (sans-IO, after `quinn-proto`)
//! * inputs: [`Mesh::handle_datagram`], [`Mesh::handle_stream_message`], [`Mesh::handle_timer`],
//!   [`Mesh::handle_command`] — each takes `now_ms` (monotonic milliseconds of the driver);
//! * outputs, drained after every input in this order: [`Mesh::poll_transmit`] until `None`,
//!   [`Mesh::poll_timer`] until `None`, [`Mesh::poll_event`] until `None`;
//! * getters: [`Mesh::catalog`], [`Mesh::membership`], [`Mesh::liveness`], [`Mesh::counters`].
//!
//! # Record dissemination (Plumtree, Leitão et al., SRDS 2007)
//! Records travel on streams, never on SWIM piggyback. Every member keeps an *eager* and a
//! *lazy* peer set drawn from the SWIM membership. A record new to us is pushed in full to the
//! eager peers (coalesced for [`MeshConfig::coalesce_ms`]; withdrawals — DRAINING, EXPIRED of
//! an endpoint that may be routable, failing health — only for
//! [`MeshConfig::urgent_coalesce_ms`]); a push that brought nothing new gets a PRUNE back,
//! moving that link to lazy, so the eager links converge to a spanning tree. Lazy peers get
//! periodic IHAVE announcements of per-origin heads; a member that hears of records it lacks
//! and does not receive them within [`MeshConfig::graft_timeout_ms`] GRAFTs the announcer: asks
//! for a delta and makes the link eager again.
//!
//! # Anti-entropy
//! Every [`MeshConfig::anti_entropy_interval_ms`] (jittered) a member sends a random peer a
//! digest: its region heads and one hash per bucket of owner heads. The peer answers with the
//! deltas the sender lacks, asks back for what it lacks itself, and exchanges owner heads only
//! for buckets whose hashes differ. This repairs lost pushes, partitions and revision gaps.
//! When a delta is impossible because the peer already collected tombstones above the asker's
//! head, the peer sends a full snapshot instead.
//!
//! # Derived liveness
//! [`Mesh::liveness`] reports a record's owner as down exactly when SWIM does; views built with
//! it drop every endpoint of a dead node at once, with nothing sent per instance.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_catalog::snapshot::{self, Snapshot, SnapshotScope};
use shoal_catalog::view::Liveness;
use shoal_catalog::{Catalog, DeltaError, MergeOutcome, OwnerHead, RegionHead, Verifier};
use shoal_proto::envelope::{self, MessageKind, MAX_STREAM_MESSAGE_BYTES};
use shoal_proto::{
    Generation, HealthRecord, HealthSeq, HealthStatus, InstanceId, LifecycleState, NodeId, Region,
    Revision, ServiceKey, SignedHealth, SignedLifecycle, SigningKey, TransitionReason, Zone,
};

use crate::membership::{
    fnv1a, MemberId, Membership, MembershipConfig, MembershipEvent, MembershipTimer, FNV_OFFSET,
};
use crate::messages::{
    AntiEntropy, DeltaBody, Graft, IHave, Prune, RecordPush, StreamMessage, DIGEST_BUCKETS,
    MAX_MEMBERS_PER_MESSAGE, MAX_RECORDS_PER_DELTA, MAX_RECORDS_PER_PUSH,
};
use crate::record_codec;

/// Tuning of dissemination and anti-entropy. Durations in ms of the driver's monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshConfig {
    /// SWIM tuning.
    pub membership: MembershipConfig,
    /// Eager (tree) links kept; new links start eager (Plumtree).
    pub eager_fanout: usize,
    /// Lazy links kept, for IHAVE announcements.
    pub lazy_fanout: usize,
    /// Eager links never pruned below this; lazy links are promoted to reach it.
    pub min_eager: usize,
    /// How long ordinary record changes are coalesced before an eager push. Withdrawals
    /// (DRAINING, EXPIRED, failing health) are never delayed.
    pub coalesce_ms: u64,
    /// Coalescing window for withdrawals (DRAINING, EXPIRED, failing health), per hop.
    pub urgent_coalesce_ms: u64,
    /// Period of IHAVE announcements to lazy peers.
    pub ihave_interval_ms: u64,
    /// How long to wait for an announced record before grafting.
    pub graft_timeout_ms: u64,
    /// Mean period of anti-entropy rounds (each jittered uniformly in [0.5, 1.5] x).
    pub anti_entropy_interval_ms: u64,
    /// Least time between two membership lists this member opens a push-pull with (answers to
    /// a peer's list are not limited): bounds push-pull bandwidth to about one list of the
    /// differing buckets per period while views differ.
    pub push_pull_min_interval_ms: u64,
    /// How long tombstones are kept before garbage collection.
    pub tombstone_retention_ms: u64,
    /// Period of the garbage-collection check.
    pub gc_interval_ms: u64,
    /// Largest stream message produced or accepted (snapshots included).
    pub max_stream_message_bytes: usize,
    /// Bound on transmits waiting in `poll_transmit`; overflow dropped and counted.
    pub max_pending_transmits: usize,
    /// Bound on events waiting in `poll_event`; overflow dropped and counted.
    pub max_pending_events: usize,
    /// Bound on records waiting to be eager-pushed; overflow dropped and counted (repaired by
    /// IHAVE/GRAFT and anti-entropy).
    pub max_outbox_records: usize,
    /// Emit [`MeshEvent::LifecycleApplied`] / [`MeshEvent::HealthApplied`] for every applied
    /// record (the simulator and the agent's watch use them).
    pub record_events: bool,
}

impl MeshConfig {
    /// Defaults for a region of `n` members.
    pub fn for_cluster_size(n: usize) -> Self {
        Self {
            membership: MembershipConfig::for_cluster_size(n),
            eager_fanout: 4,
            lazy_fanout: 6,
            min_eager: 3,
            coalesce_ms: 50,
            urgent_coalesce_ms: 5,
            ihave_interval_ms: 250,
            graft_timeout_ms: 400,
            anti_entropy_interval_ms: 2_000,
            push_pull_min_interval_ms: 5_000,
            tombstone_retention_ms: 10 * 60 * 1_000,
            gc_interval_ms: 10_000,
            max_stream_message_bytes: MAX_STREAM_MESSAGE_BYTES,
            max_pending_transmits: 65_536,
            max_pending_events: 262_144,
            max_outbox_records: 65_536,
            record_events: true,
        }
    }
}

/// Which channel a transmit uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// Unreliable datagram (SWIM), at most `membership.max_packet_bytes`.
    Datagram,
    /// Reliable, ordered per peer stream message, at most `max_stream_message_bytes`.
    Stream,
}

/// Bytes to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Destination listen address.
    pub to: SocketAddr,
    /// Channel.
    pub channel: Channel,
    /// The whole message, envelope included.
    pub bytes: Vec<u8>,
}

/// A timer token; hand it back to [`Mesh::handle_timer`] at its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeshTimer {
    /// A membership timer.
    Membership(MembershipTimer),
    /// Coalescing window end.
    Flush,
    /// IHAVE tick.
    IHave,
    /// Anti-entropy round.
    AntiEntropy,
    /// Graft check.
    Graft,
    /// Tombstone GC.
    Gc,
}

/// Things the driver may ask of the core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Join through these seed addresses (retried by membership until it hears back).
    Join {
        /// Seed listen addresses.
        seeds: Vec<SocketAddr>,
    },
    /// Leave gracefully.
    Leave,
    /// Inject authority-signed lifecycle records (from the authority, or relayed by the agent
    /// that requested the transition). Applied locally and pushed at once.
    Publish {
        /// The records.
        lifecycle: Vec<Arc<SignedLifecycle>>,
    },
    /// Sign and disseminate the health of an instance this node owns.
    ReportHealth {
        /// Service key.
        key: ServiceKey,
        /// Instance.
        instance: InstanceId,
        /// The generation the status is about.
        generation: Generation,
        /// Status.
        status: HealthStatus,
        /// Why.
        reason: TransitionReason,
    },
}

/// Why a command was refused (also counted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Health for an instance the catalog does not bind to this node (or another generation).
    NotOwnInstance {
        /// Key.
        key: ServiceKey,
        /// Instance.
        instance: InstanceId,
    },
    /// A published record did not merge (bad signature, conflict, stale...).
    Publish(String),
}

/// Something that happened, for the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeshEvent {
    /// Membership changed.
    Membership(MembershipEvent),
    /// A lifecycle record was applied to the catalog.
    LifecycleApplied(Arc<SignedLifecycle>),
    /// A health record was applied to the catalog.
    HealthApplied(Arc<SignedHealth>),
    /// A full snapshot was installed.
    SnapshotInstalled {
        /// Records installed.
        records: usize,
    },
    /// A command was refused.
    Refused(Refusal),
}

/// Messages and bytes of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flow {
    /// Messages.
    pub messages: u64,
    /// Bytes, envelope included.
    pub bytes: u64,
}

/// Plain counters for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeshCounters {
    /// Stream messages received, by [`MessageKind`] as index.
    pub stream_in: [Flow; 12],
    /// Stream messages sent, by kind.
    pub stream_out: [Flow; 12],
    /// Stream messages rejected (decode, limits), by reason label.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Anti-entropy rounds started.
    pub anti_entropy_rounds: u64,
    /// Membership lists sent in push-pull (openers and answers).
    pub push_pull_lists_sent: u64,
    /// Push-pull openers not sent because of [`MeshConfig::push_pull_min_interval_ms`].
    pub push_pull_limited: u64,
    /// Deltas sent / received.
    pub deltas_sent: u64,
    /// Deltas applied.
    pub deltas_received: u64,
    /// Revision or sequence gaps observed open after an input (counted once per opening).
    pub gaps_detected: u64,
    /// Grafts sent.
    pub grafts_sent: u64,
    /// Prunes sent.
    pub prunes_sent: u64,
    /// Full snapshots sent.
    pub snapshots_sent: u64,
    /// Full snapshots installed.
    pub snapshots_installed: u64,
    /// Full snapshots refused (corrupt, bad signature).
    pub snapshots_refused: u64,
    /// Records dropped because the outbox was full.
    pub outbox_overflow: u64,
    /// Transmits dropped because the queue was full.
    pub transmit_overflow: u64,
    /// Events dropped because the queue was full.
    pub event_overflow: u64,
    /// Messages that could not be encoded within the size limit.
    pub oversize: u64,
    /// Commands refused.
    pub refused: u64,
    /// Tombstones collected.
    pub tombstones_collected: u64,
}

struct Outgoing {
    lifecycle: Option<Arc<SignedLifecycle>>,
    health: Option<Arc<SignedHealth>>,
    from: Option<SocketAddr>,
}

/// Derived liveness from SWIM (+ nothing ejected: ejection is the agent's, per caller).
pub struct MeshLiveness<'a> {
    membership: &'a Membership,
}

impl Liveness for MeshLiveness<'_> {
    fn is_down(&self, node: &NodeId) -> bool {
        self.membership.is_down(node)
    }
    fn is_ejected(&self, _: &InstanceId, _: Generation) -> bool {
        false
    }
}

/// The protocol core of one agent. See the [module docs](self).
pub struct Mesh<V: Verifier> {
    config: MeshConfig,
    region: Region,
    zone: Zone,
    membership: Membership,
    catalog: Catalog,
    verifier: V,
    node_key: SigningKey,
    /// Our health chain: epoch = process boot generation, seq = last used.
    health_boot: Generation,
    health_seq: u64,
    rng: ChaCha8Rng,
    members: BTreeMap<NodeId, SocketAddr>,
    eager: BTreeSet<SocketAddr>,
    lazy: BTreeSet<SocketAddr>,
    outbox: Vec<Outgoing>,
    urgent: bool,
    /// When the armed flush timer fires, if any.
    flush_at: Option<u64>,
    /// A locally published withdrawal waits in the outbox: announce it to lazy peers too.
    announce_now: bool,
    /// Origins whose heads moved since the last IHAVE tick.
    dirty_regions: BTreeSet<Region>,
    dirty_owners: BTreeSet<NodeId>,
    /// Announced but missing: origin -> (announcer, graft deadline).
    missing_regions: BTreeMap<Region, (SocketAddr, u64, Revision)>,
    missing_owners: BTreeMap<NodeId, (SocketAddr, u64, (Generation, HealthSeq))>,
    graft_armed: bool,
    /// Joined and not yet asked anyone for what we missed.
    catch_up: bool,
    /// When we last opened a membership push-pull.
    push_pull_at: Option<u64>,
    /// (time, region heads) samples for the tombstone GC horizon.
    gc_samples: VecDeque<(u64, Vec<(Region, Revision)>)>,
    periodic_armed: bool,
    open_gaps: usize,
    gap_checked_at: u64,
    transmits: VecDeque<Transmit>,
    timers: VecDeque<(u64, MeshTimer)>,
    events: VecDeque<MeshEvent>,
    counters: MeshCounters,
}

impl<V: Verifier> Mesh<V> {
    /// Creates the core of one agent.
    ///
    /// * `identity`: SWIM identity (node id, listen address, boot generation — persisted by the
    ///   agent and bumped on every start);
    /// * `region`, `zone`: where this node is;
    /// * `node_key`: signs health records of instances bound to this node;
    /// * `verifier`: trusted authority and node keys;
    /// * `seed`: all randomness (SWIM member selection, peer sampling, jitter).
    pub fn new(
        identity: MemberId,
        region: Region,
        zone: Zone,
        node_key: SigningKey,
        config: MeshConfig,
        verifier: V,
        seed: u64,
    ) -> Self {
        let health_boot = identity.boot;
        Self {
            membership: Membership::new(identity, config.membership.clone(), seed),
            catalog: Catalog::new(),
            verifier,
            node_key,
            health_boot,
            health_seq: 0,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5348_4f41_4c5f_4d45),
            members: BTreeMap::new(),
            eager: BTreeSet::new(),
            lazy: BTreeSet::new(),
            outbox: Vec::new(),
            urgent: false,
            flush_at: None,
            announce_now: false,
            dirty_regions: BTreeSet::new(),
            dirty_owners: BTreeSet::new(),
            missing_regions: BTreeMap::new(),
            missing_owners: BTreeMap::new(),
            graft_armed: false,
            catch_up: false,
            push_pull_at: None,
            gc_samples: VecDeque::new(),
            periodic_armed: false,
            open_gaps: 0,
            gap_checked_at: u64::MAX,
            transmits: VecDeque::new(),
            timers: VecDeque::new(),
            events: VecDeque::new(),
            counters: MeshCounters::default(),
            region,
            zone,
            config,
        }
    }

    // ---- getters ---------------------------------------------------------------------------

    /// The catalog.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Mutable catalog access, for the driver to install a persisted snapshot at boot.
    pub fn catalog_mut(&mut self) -> &mut Catalog {
        &mut self.catalog
    }

    /// The SWIM membership.
    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// Mutable membership access (the simulator bootstraps large regions through it).
    pub fn membership_mut(&mut self) -> &mut Membership {
        &mut self.membership
    }

    /// Derived liveness for views.
    pub fn liveness(&self) -> MeshLiveness<'_> {
        MeshLiveness {
            membership: &self.membership,
        }
    }

    /// The verifier.
    pub fn verifier(&self) -> &V {
        &self.verifier
    }

    /// This node's region.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// This node's zone.
    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    /// Counters.
    pub fn counters(&self) -> &MeshCounters {
        &self.counters
    }

    /// The configuration.
    pub fn config(&self) -> &MeshConfig {
        &self.config
    }

    /// Current eager and lazy peer counts.
    pub fn peer_sets(&self) -> (usize, usize) {
        (self.eager.len(), self.lazy.len())
    }

    // ---- inputs ----------------------------------------------------------------------------

    /// A datagram arrived (SWIM). Bad input is counted by membership and ignored.
    pub fn handle_datagram(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]) {
        self.membership.handle_datagram(now_ms, from, bytes);
        self.after_input(now_ms);
    }

    /// A stream message arrived from the peer listening at `from`. Bad input is counted in
    /// [`MeshCounters::rejected`] and ignored.
    pub fn handle_stream_message(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]) {
        let decoded = match self.decode_cached(bytes) {
            Some(msg) => Ok(msg),
            None => StreamMessage::decode(bytes, self.config.max_stream_message_bytes),
        };
        match decoded {
            Ok(msg) => {
                let flow = &mut self.counters.stream_in[msg.kind() as usize];
                flow.messages += 1;
                flow.bytes += bytes.len() as u64;
                self.on_stream(now_ms, from, msg);
            }
            Err(e) => *self.counters.rejected.entry(e.as_label()).or_default() += 1,
        }
        self.after_input(now_ms);
    }

    /// Decodes a record push through the verifier's cache of record encodings, if it keeps
    /// one (see [`crate::record_codec`]); `None` means "decode it the ordinary way", which
    /// gives the same message or the same error.
    fn decode_cached(&self, bytes: &[u8]) -> Option<StreamMessage> {
        if !self.verifier.caches_encodings() {
            return None;
        }
        match envelope::decode_header(bytes, self.config.max_stream_message_bytes) {
            Ok((MessageKind::RecordPush, body)) => {
                record_codec::decode_push(body, &self.verifier).map(StreamMessage::Push)
            }
            _ => None,
        }
    }

    /// A timer fired.
    pub fn handle_timer(&mut self, now_ms: u64, timer: MeshTimer) {
        match timer {
            MeshTimer::Membership(t) => self.membership.handle_timer(now_ms, t),
            MeshTimer::Flush => {
                if self.flush_at.is_some_and(|at| at <= now_ms) {
                    self.flush_at = None;
                    self.flush(now_ms);
                }
            }
            MeshTimer::IHave => {
                self.send_ihave();
                self.refill_peers();
                self.promote_lazy();
                self.push_timer(now_ms + self.config.ihave_interval_ms, MeshTimer::IHave);
            }
            MeshTimer::AntiEntropy => {
                self.start_anti_entropy();
                let jittered = self.jitter(self.config.anti_entropy_interval_ms);
                self.push_timer(now_ms + jittered, MeshTimer::AntiEntropy);
            }
            MeshTimer::Graft => {
                self.graft_armed = false;
                self.check_grafts(now_ms);
            }
            MeshTimer::Gc => {
                self.collect_garbage(now_ms);
                self.push_timer(now_ms + self.config.gc_interval_ms, MeshTimer::Gc);
            }
        }
        self.after_input(now_ms);
    }

    /// A command from the driver.
    pub fn handle_command(&mut self, now_ms: u64, command: Command) {
        match command {
            Command::Join { seeds } => {
                self.membership.join(now_ms, &seeds);
                self.arm_periodic(now_ms);
                self.catch_up = true;
            }
            Command::Leave => self.membership.leave(now_ms),
            Command::Publish { lifecycle } => {
                for rec in lifecycle {
                    let urgent = self.is_urgent_lifecycle(&rec);
                    match self.catalog.apply_lifecycle(rec.clone(), &self.verifier) {
                        MergeOutcome::Applied => {
                            self.announce_now |= urgent;
                            self.on_lifecycle_applied(rec, None, urgent);
                        }
                        MergeOutcome::Duplicate | MergeOutcome::Stale => {}
                        other => self.refuse(Refusal::Publish(other.as_label().to_owned())),
                    }
                }
            }
            Command::ReportHealth {
                key,
                instance,
                generation,
                status,
                reason,
            } => self.report_health(key, instance, generation, status, reason),
        }
        self.after_input(now_ms);
    }

    /// Seeds membership with `members` (see [`Membership::bootstrap`]) and arms the periodic
    /// timers.
    pub fn bootstrap(&mut self, now_ms: u64, members: Vec<MemberId>) {
        self.membership.bootstrap(now_ms, members);
        self.arm_periodic(now_ms);
        self.after_input(now_ms);
    }

    /// Arms the periodic timers without joining anyone (the simulator bootstraps membership
    /// directly). Idempotent.
    pub fn start(&mut self, now_ms: u64) {
        self.arm_periodic(now_ms);
        self.after_input(now_ms);
    }

    // ---- outputs ---------------------------------------------------------------------------

    /// Next thing to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if let Some((to, bytes)) = self.membership.poll_transmit() {
            return Some(Transmit {
                to,
                channel: Channel::Datagram,
                bytes,
            });
        }
        self.transmits.pop_front()
    }

    /// Next timer to schedule: `(deadline_ms, token)`.
    pub fn poll_timer(&mut self) -> Option<(u64, MeshTimer)> {
        if let Some((at, t)) = self.membership.poll_timer() {
            return Some((at, MeshTimer::Membership(t)));
        }
        self.timers.pop_front()
    }

    /// Next event.
    pub fn poll_event(&mut self) -> Option<MeshEvent> {
        self.events.pop_front()
    }

    // ---- internals -------------------------------------------------------------------------

    fn arm_periodic(&mut self, now_ms: u64) {
        if self.periodic_armed {
            return;
        }
        self.periodic_armed = true;
        let ihave = self.jitter(self.config.ihave_interval_ms);
        let ae = self.jitter(self.config.anti_entropy_interval_ms);
        let gc = self.jitter(self.config.gc_interval_ms);
        self.push_timer(now_ms + ihave, MeshTimer::IHave);
        self.push_timer(now_ms + ae, MeshTimer::AntiEntropy);
        self.push_timer(now_ms + gc, MeshTimer::Gc);
    }

    /// Uniform in [0.5, 1.5] x `mean_ms`.
    fn jitter(&mut self, mean_ms: u64) -> u64 {
        let half = mean_ms / 2;
        half + self.rng.next_u64() % (mean_ms + 1)
    }

    fn push_timer(&mut self, at: u64, timer: MeshTimer) {
        self.timers.push_back((at, timer));
    }

    fn push_event(&mut self, event: MeshEvent) {
        if self.events.len() >= self.config.max_pending_events {
            self.counters.event_overflow += 1;
            return;
        }
        self.events.push_back(event);
    }

    fn refuse(&mut self, r: Refusal) {
        self.counters.refused += 1;
        self.push_event(MeshEvent::Refused(r));
    }

    fn send(&mut self, to: SocketAddr, msg: &StreamMessage) {
        let bytes = msg.encode(self.config.max_stream_message_bytes);
        self.send_encoded(to, msg.kind(), bytes);
    }

    /// [`Mesh::send`] of a message already encoded (`None`: it did not fit).
    fn send_encoded(&mut self, to: SocketAddr, kind: MessageKind, bytes: Option<Vec<u8>>) {
        let Some(bytes) = bytes else {
            self.counters.oversize += 1;
            return;
        };
        if self.transmits.len() >= self.config.max_pending_transmits {
            self.counters.transmit_overflow += 1;
            return;
        }
        let flow = &mut self.counters.stream_out[kind as usize];
        flow.messages += 1;
        flow.bytes += bytes.len() as u64;
        self.transmits.push_back(Transmit {
            to,
            channel: Channel::Stream,
            bytes,
        });
    }

    /// Runs after every input: membership events, urgent flushes, gap accounting.
    fn after_input(&mut self, now_ms: u64) {
        let mut up = false;
        while let Some(ev) = self.membership.poll_event() {
            match &ev {
                MembershipEvent::Up(m) => {
                    up = true;
                    if let Some(old) = self.members.insert(m.node.clone(), m.addr) {
                        if old != m.addr {
                            self.eager.remove(&old);
                            self.lazy.remove(&old);
                        }
                    }
                }
                MembershipEvent::Down(m) => {
                    if self.members.get(&m.node) == Some(&m.addr) {
                        self.members.remove(&m.node);
                    }
                    self.eager.remove(&m.addr);
                    self.lazy.remove(&m.addr);
                    self.refill_peers();
                }
                _ => {}
            }
            self.push_event(MeshEvent::Membership(ev));
        }
        // Links are drawn from the whole membership at the next IHAVE tick, so a burst of joins
        // does not bias every link towards the first members seen; only a member with no link
        // at all takes some at once, after every Up of this input is known (a bootstrap brings
        // the whole region in one input: linking at the first Up made its first-listed member
        // everyone's eager peer).
        if up && self.eager.is_empty() {
            self.refill_peers();
        }
        // A joining agent usually starts from a persisted snapshot that may be seconds or
        // minutes old: it asks its first member for what it missed at once, instead of after
        // the first anti-entropy period.
        if up && std::mem::take(&mut self.catch_up) {
            self.start_anti_entropy();
        }
        if !self.outbox.is_empty() {
            // Withdrawals wait at most `urgent_coalesce_ms` per hop (a few ms), ordinary
            // changes `coalesce_ms`: batching keeps a 10,000-endpoint rollout from turning into
            // one stream message per record per link, without ever holding a drain back.
            let window = if self.urgent {
                self.config.urgent_coalesce_ms
            } else {
                self.config.coalesce_ms
            };
            let at = now_ms + window;
            if self.flush_at.is_none_or(|armed| at < armed) {
                self.flush_at = Some(at);
                self.push_timer(at, MeshTimer::Flush);
            }
        }
        if self.catalog.index() != self.gap_checked_at {
            self.gap_checked_at = self.catalog.index();
            let gaps = self.catalog.open_gaps();
            if gaps > self.open_gaps {
                self.counters.gaps_detected += (gaps - self.open_gaps) as u64;
            }
            self.open_gaps = gaps;
        }
    }

    /// Keeps `eager + lazy` filled from the membership; new links start eager (Plumtree).
    fn refill_peers(&mut self) {
        let want = self.config.eager_fanout + self.config.lazy_fanout;
        let have = self.eager.len() + self.lazy.len();
        if have >= want || self.members.len() <= have {
            return;
        }
        let candidates: Vec<SocketAddr> = self
            .members
            .values()
            .filter(|a| !self.eager.contains(a) && !self.lazy.contains(a))
            .copied()
            .collect();
        let mut candidates = candidates;
        for _ in have..want {
            if candidates.is_empty() {
                break;
            }
            let i = (self.rng.next_u64() % candidates.len() as u64) as usize;
            let addr = candidates.swap_remove(i);
            if self.eager.len() < self.config.eager_fanout {
                // Links are symmetric (Plumtree over HyParView's symmetric active view): an
                // empty GRAFT asks the peer to push to us as well.
                self.eager.insert(addr);
                self.send(addr, &StreamMessage::Graft(Graft::default()));
            } else {
                self.lazy.insert(addr);
            }
        }
    }

    /// Keeps at least `min_eager` eager links by promoting lazy ones (with an empty GRAFT, so
    /// the peer pushes to us too).
    fn promote_lazy(&mut self) {
        while self.eager.len() < self.config.min_eager && !self.lazy.is_empty() {
            let i = (self.rng.next_u64() % self.lazy.len() as u64) as usize;
            let addr = *self.lazy.iter().nth(i).expect("non-empty");
            self.lazy.remove(&addr);
            self.eager.insert(addr);
            self.send(addr, &StreamMessage::Graft(Graft::default()));
        }
    }

    fn random_member(&mut self) -> Option<SocketAddr> {
        if self.members.is_empty() {
            return None;
        }
        let i = (self.rng.next_u64() % self.members.len() as u64) as usize;
        self.members.values().nth(i).copied()
    }

    /// Whether `rec` may withdraw an endpoint that is routable somewhere: DRAINING always;
    /// EXPIRED unless it is the lease net's (the owner node has been down for a whole lease,
    /// so derived liveness withdrew its endpoints long ago) or this catalog held the endpoint
    /// in a state that was not routable (STARTING, DRAINING: the usual DRAINING -> EXPIRED of a
    /// rollout). Only these skip the ordinary coalescing window. Call before merging `rec`.
    fn is_urgent_lifecycle(&self, rec: &SignedLifecycle) -> bool {
        let r = &rec.record;
        match r.state {
            LifecycleState::Draining => true,
            LifecycleState::Expired if r.reason == TransitionReason::LeaseExpired => false,
            LifecycleState::Expired => self
                .catalog
                .entry(&r.key, &r.instance)
                .is_none_or(|e| e.lifecycle().record.state == LifecycleState::Ready),
            _ => false,
        }
    }

    fn on_lifecycle_applied(
        &mut self,
        rec: Arc<SignedLifecycle>,
        from: Option<SocketAddr>,
        urgent: bool,
    ) {
        self.dirty_regions.insert(rec.record.region.clone());
        self.urgent |= urgent;
        if self.config.record_events {
            self.push_event(MeshEvent::LifecycleApplied(rec.clone()));
        }
        self.enqueue(Outgoing {
            lifecycle: Some(rec),
            health: None,
            from,
        });
    }

    fn on_health_applied(&mut self, rec: Arc<SignedHealth>, from: Option<SocketAddr>) {
        self.dirty_owners.insert(rec.record.owner.clone());
        self.urgent |= rec.record.status == HealthStatus::Failing;
        if self.config.record_events {
            self.push_event(MeshEvent::HealthApplied(rec.clone()));
        }
        self.enqueue(Outgoing {
            lifecycle: None,
            health: Some(rec),
            from,
        });
    }

    fn enqueue(&mut self, out: Outgoing) {
        if self.outbox.len() >= self.config.max_outbox_records {
            self.counters.outbox_overflow += 1;
            return;
        }
        self.outbox.push(out);
    }

    /// Eager-pushes the outbox to every eager peer (except where a record came from).
    fn flush(&mut self, _now_ms: u64) {
        self.urgent = false;
        if self.outbox.is_empty() {
            return;
        }
        if std::mem::take(&mut self.announce_now) {
            // A withdrawal published here (by the authority or our own health report) is also
            // announced to our lazy peers at once, so a member the eager tree misses grafts
            // after `graft_timeout_ms` instead of waiting for the IHAVE tick. Only the origin
            // does this: every forwarder doing it would multiply messages by the lazy fan-out.
            self.send_ihave();
        }
        let outbox = std::mem::take(&mut self.outbox);
        let peers: Vec<SocketAddr> = self.eager.iter().copied().collect();
        // Every peer that sent us none of these records gets the same pushes: encode them once.
        let mut to_all: Option<Vec<Option<Vec<u8>>>> = None;
        for peer in peers {
            let encoded = if outbox.iter().any(|o| o.from == Some(peer)) {
                self.encode_pushes(&outbox, Some(peer))
            } else {
                to_all
                    .get_or_insert_with(|| self.encode_pushes(&outbox, None))
                    .clone()
            };
            for bytes in encoded {
                self.send_encoded(peer, MessageKind::RecordPush, bytes);
            }
        }
    }

    /// The outbox as encoded pushes of at most [`MAX_RECORDS_PER_PUSH`] records each, leaving
    /// out the records that came from `peer` (`None`: an encoding that did not fit).
    fn encode_pushes(&self, outbox: &[Outgoing], peer: Option<SocketAddr>) -> Vec<Option<Vec<u8>>> {
        let max_bytes = self.config.max_stream_message_bytes;
        let mut out = Vec::new();
        let mut push = RecordPush::default();
        for o in outbox.iter().filter(|o| peer.is_none() || o.from != peer) {
            if let Some(l) = &o.lifecycle {
                push.lifecycle.push(l.clone());
            }
            if let Some(h) = &o.health {
                push.health.push(h.clone());
            }
            if push.lifecycle.len() + push.health.len() == MAX_RECORDS_PER_PUSH {
                out.push(self.encode_push(std::mem::take(&mut push), max_bytes));
            }
        }
        if !push.lifecycle.is_empty() || !push.health.is_empty() {
            out.push(self.encode_push(push, max_bytes));
        }
        out
    }

    /// One push, encoded through the verifier's record encodings where it keeps them (the
    /// same bytes either way).
    fn encode_push(&self, push: RecordPush, max_bytes: usize) -> Option<Vec<u8>> {
        if self.verifier.caches_encodings() {
            record_codec::encode_push(&push, &self.verifier, max_bytes)
        } else {
            StreamMessage::Push(push).encode(max_bytes)
        }
    }

    fn on_stream(&mut self, now_ms: u64, from: SocketAddr, msg: StreamMessage) {
        match msg {
            StreamMessage::Push(push) => self.on_push(from, push),
            StreamMessage::IHave(ihave) => self.on_ihave(now_ms, from, ihave),
            StreamMessage::Graft(graft) => self.on_graft(from, graft),
            StreamMessage::Prune(_) => {
                if self.eager.len() > self.config.min_eager && self.eager.remove(&from) {
                    self.lazy.insert(from);
                }
            }
            StreamMessage::AntiEntropy(ae) => self.on_anti_entropy(now_ms, from, ae),
            StreamMessage::Delta(delta) => self.on_delta(from, delta),
            StreamMessage::SnapshotRequest(_) => self.send_snapshot(from),
            StreamMessage::Snapshot(bytes) => self.on_snapshot(&bytes),
        }
    }

    fn on_push(&mut self, from: SocketAddr, push: RecordPush) {
        let mut new = false;
        for rec in push.lifecycle {
            let rec = self.verifier.intern_lifecycle(rec);
            let urgent = self.is_urgent_lifecycle(&rec);
            if self.catalog.apply_lifecycle(rec.clone(), &self.verifier) == MergeOutcome::Applied {
                new = true;
                self.on_lifecycle_applied(rec, Some(from), urgent);
            }
        }
        for rec in push.health {
            let rec = self.verifier.intern_health(rec);
            if self.catalog.apply_health(rec.clone(), &self.verifier) == MergeOutcome::Applied {
                new = true;
                self.on_health_applied(rec, Some(from));
            }
        }
        self.clear_satisfied_missing();
        if new {
            self.lazy.remove(&from);
            self.eager.insert(from);
        } else if !self.eager.contains(&from) || self.eager.len() > self.config.min_eager {
            // Plumtree: a redundant eager push prunes the link on both ends. Answered even when
            // the sender is no longer our eager peer (we declared it down, or our earlier PRUNE
            // was lost with a connection): otherwise it pushes to us for nothing forever.
            // With several origins, each prunes different edges of the same loops; keeping at
            // least `min_eager` links stops the tree from falling apart under churn.
            if self.eager.remove(&from) {
                self.lazy.insert(from);
            }
            self.counters.prunes_sent += 1;
            self.send(from, &StreamMessage::Prune(Prune {}));
        }
    }

    fn send_ihave(&mut self) {
        if self.dirty_regions.is_empty() && self.dirty_owners.is_empty() {
            return;
        }
        let heads = self.catalog.heads();
        let regions = std::mem::take(&mut self.dirty_regions);
        let owners = std::mem::take(&mut self.dirty_owners);
        let ihave = IHave {
            regions: heads
                .regions
                .iter()
                .filter(|h| regions.contains(&h.region))
                .map(|h| (h.region.clone(), h.max_seen))
                .collect(),
            owners: heads
                .owners
                .iter()
                .filter(|h| owners.contains(&h.owner))
                .map(|h| (h.owner.clone(), h.boot, h.contiguous))
                .collect(),
        };
        let msg = StreamMessage::IHave(ihave);
        let lazy: Vec<SocketAddr> = self.lazy.iter().copied().collect();
        for peer in lazy {
            self.send(peer, &msg);
        }
    }

    fn on_ihave(&mut self, now_ms: u64, from: SocketAddr, ihave: IHave) {
        let deadline = now_ms + self.config.graft_timeout_ms;
        for (region, rev) in ihave.regions {
            if self.catalog.region_head(&region) < rev {
                self.missing_regions
                    .entry(region)
                    .or_insert((from, deadline, rev));
            }
        }
        let heads: BTreeMap<NodeId, (Generation, HealthSeq)> = if ihave.owners.is_empty() {
            BTreeMap::new()
        } else {
            self.catalog
                .heads()
                .owners
                .into_iter()
                .map(|h| (h.owner, (h.boot, h.contiguous)))
                .collect()
        };
        for (owner, boot, seq) in ihave.owners {
            if heads.get(&owner).copied().unwrap_or_default() < (boot, seq) {
                self.missing_owners
                    .entry(owner)
                    .or_insert((from, deadline, (boot, seq)));
            }
        }
        if !self.graft_armed
            && (!self.missing_regions.is_empty() || !self.missing_owners.is_empty())
        {
            self.graft_armed = true;
            self.push_timer(deadline, MeshTimer::Graft);
        }
    }

    fn clear_satisfied_missing(&mut self) {
        if self.missing_regions.is_empty() && self.missing_owners.is_empty() {
            return;
        }
        let catalog = &self.catalog;
        self.missing_regions
            .retain(|region, (_, _, rev)| catalog.region_head(region) < *rev);
        if !self.missing_owners.is_empty() {
            let heads: BTreeMap<NodeId, (Generation, HealthSeq)> = catalog
                .heads()
                .owners
                .into_iter()
                .map(|h| (h.owner, (h.boot, h.contiguous)))
                .collect();
            self.missing_owners.retain(|owner, (_, _, want)| {
                heads.get(owner).copied().unwrap_or_default() < *want
            });
        }
    }

    fn check_grafts(&mut self, now_ms: u64) {
        self.clear_satisfied_missing();
        let heads = self.catalog.heads();
        let mut by_peer: BTreeMap<SocketAddr, Graft> = BTreeMap::new();
        let due_regions: Vec<Region> = self
            .missing_regions
            .iter()
            .filter(|(_, (_, at, _))| *at <= now_ms)
            .map(|(r, _)| r.clone())
            .collect();
        for region in due_regions {
            let (peer, _, _) = self.missing_regions.remove(&region).expect("listed");
            let head = heads
                .regions
                .iter()
                .find(|h| h.region == region)
                .cloned()
                .unwrap_or(RegionHead {
                    region,
                    contiguous: Revision(0),
                    max_seen: Revision(0),
                    gc_floor: Revision(0),
                    pending_hash: 0,
                });
            by_peer.entry(peer).or_default().regions.push(head);
        }
        let due_owners: Vec<NodeId> = self
            .missing_owners
            .iter()
            .filter(|(_, (_, at, _))| *at <= now_ms)
            .map(|(o, _)| o.clone())
            .collect();
        for owner in due_owners {
            let (peer, _, _) = self.missing_owners.remove(&owner).expect("listed");
            let head = heads
                .owners
                .iter()
                .find(|h| h.owner == owner)
                .cloned()
                .unwrap_or(OwnerHead {
                    owner,
                    boot: Generation(0),
                    contiguous: HealthSeq(0),
                    pending_hash: 0,
                });
            by_peer.entry(peer).or_default().owners.push(head);
        }
        for (peer, graft) in by_peer {
            self.lazy.remove(&peer);
            self.eager.insert(peer);
            self.counters.grafts_sent += 1;
            self.send(peer, &StreamMessage::Graft(graft));
        }
        let next = self
            .missing_regions
            .values()
            .map(|(_, at, _)| *at)
            .chain(self.missing_owners.values().map(|(_, at, _)| *at))
            .min();
        if let Some(at) = next {
            self.graft_armed = true;
            self.push_timer(at, MeshTimer::Graft);
        }
    }

    fn on_graft(&mut self, from: SocketAddr, graft: Graft) {
        self.lazy.remove(&from);
        self.eager.insert(from);
        let mut delta = DeltaBody::default();
        for h in &graft.regions {
            if !self.add_lifecycle_delta(&mut delta, &h.region, h.contiguous, from) {
                return;
            }
        }
        for h in &graft.owners {
            self.add_health_delta(&mut delta, h);
        }
        self.send_delta(from, delta);
    }

    /// Adds the region delta for a peer at `since`; on `Compacted` sends a snapshot instead and
    /// returns false.
    fn add_lifecycle_delta(
        &mut self,
        delta: &mut DeltaBody,
        region: &Region,
        since: Revision,
        peer: SocketAddr,
    ) -> bool {
        match self
            .catalog
            .lifecycle_delta(region, since, MAX_RECORDS_PER_DELTA)
        {
            Ok(d) if !d.records.is_empty() || d.complete_to > since => {
                delta.lifecycle.push(d);
                true
            }
            Ok(_) => true,
            Err(DeltaError::Compacted { .. }) => {
                self.send_snapshot(peer);
                false
            }
        }
    }

    fn add_health_delta(&mut self, delta: &mut DeltaBody, theirs: &OwnerHead) {
        let d = self.catalog.health_delta(
            &theirs.owner,
            theirs.boot,
            theirs.contiguous,
            MAX_RECORDS_PER_DELTA,
        );
        if !d.records.is_empty() || (d.boot, d.complete_to) > (theirs.boot, theirs.contiguous) {
            delta.health.push(d);
        }
    }

    fn send_delta(&mut self, to: SocketAddr, delta: DeltaBody) {
        if delta.lifecycle.is_empty() && delta.health.is_empty() {
            return;
        }
        self.counters.deltas_sent += 1;
        self.send(to, &StreamMessage::Delta(delta));
    }

    fn send_snapshot(&mut self, to: SocketAddr) {
        let snap = Snapshot::of(&self.catalog, SnapshotScope::Catalog, self.region.clone());
        let bytes = snapshot::encode(&snap);
        self.counters.snapshots_sent += 1;
        self.send(to, &StreamMessage::Snapshot(bytes));
    }

    fn on_snapshot(&mut self, bytes: &[u8]) {
        match snapshot::decode(bytes, &self.verifier) {
            Ok(snap) => {
                let out = self.catalog.install(&snap, &self.verifier);
                self.counters.snapshots_installed += 1;
                for rec in &snap.lifecycle {
                    self.dirty_regions.insert(rec.record.region.clone());
                }
                self.push_event(MeshEvent::SnapshotInstalled {
                    records: out.applied,
                });
            }
            Err(_) => self.counters.snapshots_refused += 1,
        }
    }

    fn on_delta(&mut self, from: SocketAddr, delta: DeltaBody) {
        self.counters.deltas_received += 1;
        for mut d in delta.lifecycle {
            d.records = d
                .records
                .into_iter()
                .map(|r| self.verifier.intern_lifecycle(r))
                .collect();
            let urgent: Vec<bool> = d
                .records
                .iter()
                .map(|r| self.is_urgent_lifecycle(r))
                .collect();
            let mut applied = Vec::new();
            let mut i = 0;
            self.catalog
                .apply_lifecycle_delta_observed(&d, &self.verifier, |rec, outcome| {
                    if *outcome == MergeOutcome::Applied {
                        applied.push((rec.clone(), urgent[i]));
                    }
                    i += 1;
                });
            for (rec, urgent) in applied {
                self.on_lifecycle_applied(rec, Some(from), urgent);
            }
        }
        for mut d in delta.health {
            d.records = d
                .records
                .into_iter()
                .map(|r| self.verifier.intern_health(r))
                .collect();
            let mut applied = Vec::new();
            self.catalog
                .apply_health_delta_observed(&d, &self.verifier, |rec, outcome| {
                    if *outcome == MergeOutcome::Applied {
                        applied.push(rec.clone());
                    }
                });
            for rec in applied {
                self.on_health_applied(rec, Some(from));
            }
        }
        self.clear_satisfied_missing();
    }

    fn start_anti_entropy(&mut self) {
        let Some(peer) = self.random_member() else {
            return;
        };
        self.counters.anti_entropy_rounds += 1;
        let msg = self.digest(true);
        self.send(peer, &msg);
    }

    fn digest(&self, reply: bool) -> StreamMessage {
        let heads = self.catalog.heads();
        StreamMessage::AntiEntropy(AntiEntropy::Digest {
            regions: heads.regions,
            buckets: bucket_hashes(&heads.owners).to_vec(),
            members: if reply {
                self.membership.member_buckets().to_vec()
            } else {
                Vec::new()
            },
            reply,
        })
    }

    fn on_anti_entropy(&mut self, now_ms: u64, from: SocketAddr, ae: AntiEntropy) {
        match ae {
            AntiEntropy::Digest {
                regions,
                buckets,
                members,
                reply,
            } => {
                self.on_digest(from, regions, &buckets, reply);
                if reply {
                    self.open_push_pull(now_ms, from, &members);
                }
            }
            AntiEntropy::BucketHeads {
                buckets,
                owners,
                reply,
            } => self.on_bucket_heads(from, &buckets, owners, reply),
            AntiEntropy::Members {
                buckets,
                members,
                reply,
            } => self.on_members(now_ms, from, &buckets, &members, reply),
        }
    }

    /// A peer's digest named its member buckets: when some differ from ours, send our list of
    /// those buckets (at most once per [`MeshConfig::push_pull_min_interval_ms`]); the peer
    /// learns what it lacks and answers with what we lack. SWIM spreads a join only by
    /// piggyback (`max_transmissions` sends) and probes; without this, a member that missed
    /// the rumour of a restart or of a healed partition could go minutes without it
    /// (memberlist runs a full state push-pull every 30 s for the same reason).
    fn open_push_pull(&mut self, now_ms: u64, to: SocketAddr, theirs: &[u32]) {
        let ours = self.membership.member_buckets();
        let differing: Vec<u16> = (0..ours.len())
            .filter(|&b| theirs.get(b).copied().unwrap_or(0) != ours[b])
            .map(|b| b as u16)
            .collect();
        if differing.is_empty() {
            return;
        }
        if self
            .push_pull_at
            .is_some_and(|at| now_ms < at + self.config.push_pull_min_interval_ms)
        {
            self.counters.push_pull_limited += 1;
            return;
        }
        self.push_pull_at = Some(now_ms);
        self.send_member_list(to, differing, true);
    }

    fn send_member_list(&mut self, to: SocketAddr, buckets: Vec<u16>, reply: bool) {
        let mut members = self.membership.members_in_buckets(&buckets);
        members.truncate(MAX_MEMBERS_PER_MESSAGE);
        self.counters.push_pull_lists_sent += 1;
        let msg = StreamMessage::AntiEntropy(AntiEntropy::Members {
            buckets,
            members,
            reply,
        });
        self.send(to, &msg);
    }

    fn on_members(
        &mut self,
        now_ms: u64,
        from: SocketAddr,
        buckets: &[u16],
        theirs: &[MemberId],
        reply: bool,
    ) {
        self.membership.learn_members(now_ms, theirs);
        if reply && self.membership.peer_lacks(buckets, theirs) {
            self.send_member_list(from, buckets.to_vec(), false);
        }
    }

    fn on_digest(
        &mut self,
        from: SocketAddr,
        theirs: Vec<RegionHead>,
        buckets: &[u64],
        reply: bool,
    ) {
        let ours = self.catalog.heads();
        let mut delta = DeltaBody::default();
        let mut want = false;
        for mine in &ours.regions {
            let their = theirs.iter().find(|h| h.region == mine.region);
            let (their_c, their_max, their_p) = their.map_or((Revision(0), Revision(0), 0), |h| {
                (h.contiguous, h.max_seen, h.pending_hash)
            });
            // Pending sets that differ mean each side may have accounted for revisions the
            // other has not (superseded ones included): exchange them too.
            let pending_differ = their_p != mine.pending_hash;
            let ahead = mine.contiguous > their_c
                || mine.max_seen > their_max
                || (pending_differ && mine.pending_hash != 0);
            if ahead && !self.add_lifecycle_delta(&mut delta, &mine.region, their_c, from) {
                return;
            }
            if their_c > mine.contiguous
                || their_max > mine.max_seen
                || (pending_differ && their_p != 0)
            {
                want = true;
            }
        }
        want |= theirs
            .iter()
            .any(|h| !ours.regions.iter().any(|m| m.region == h.region) && h.max_seen.0 > 0);
        self.send_delta(from, delta);
        if want && reply {
            let msg = self.digest(false);
            self.send(from, &msg);
        }
        if reply {
            let mine = bucket_hashes(&ours.owners);
            let differing: Vec<u16> = (0..DIGEST_BUCKETS)
                .filter(|&b| buckets.get(b).copied().unwrap_or(0) != mine[b])
                .map(|b| b as u16)
                .collect();
            if !differing.is_empty() {
                let owners = owners_in_buckets(&ours.owners, &differing);
                self.send(
                    from,
                    &StreamMessage::AntiEntropy(AntiEntropy::BucketHeads {
                        buckets: differing,
                        owners,
                        reply: true,
                    }),
                );
            }
        }
    }

    fn on_bucket_heads(
        &mut self,
        from: SocketAddr,
        buckets: &[u16],
        theirs: Vec<OwnerHead>,
        reply: bool,
    ) {
        let ours = self.catalog.heads();
        let mine = owners_in_buckets(&ours.owners, buckets);
        let mut delta = DeltaBody::default();
        let mut want = false;
        for m in &mine {
            let their = theirs.iter().find(|h| h.owner == m.owner);
            let their_head =
                their.map_or((Generation(0), HealthSeq(0)), |h| (h.boot, h.contiguous));
            let their_pending = their.map_or(0, |h| h.pending_hash);
            let pending_differ = m.boot == their_head.0 && m.pending_hash != their_pending;
            if (m.boot, m.contiguous) > their_head || (pending_differ && m.pending_hash != 0) {
                let h = their.cloned().unwrap_or(OwnerHead {
                    owner: m.owner.clone(),
                    boot: Generation(0),
                    contiguous: HealthSeq(0),
                    pending_hash: 0,
                });
                self.add_health_delta(&mut delta, &h);
            } else if their_head > (m.boot, m.contiguous) || (pending_differ && their_pending != 0)
            {
                want = true;
            }
        }
        want |= theirs
            .iter()
            .any(|h| !mine.iter().any(|m| m.owner == h.owner));
        self.send_delta(from, delta);
        if want && reply {
            self.send(
                from,
                &StreamMessage::AntiEntropy(AntiEntropy::BucketHeads {
                    buckets: buckets.to_vec(),
                    owners: mine,
                    reply: false,
                }),
            );
        }
    }

    fn report_health(
        &mut self,
        key: ServiceKey,
        instance: InstanceId,
        generation: Generation,
        status: HealthStatus,
        reason: TransitionReason,
    ) {
        let me = self.membership.identity().node.clone();
        let owned = self.catalog.entry(&key, &instance).is_some_and(|e| {
            let r = &e.lifecycle().record;
            r.owner == me && r.generation == generation
        });
        if !owned {
            self.refuse(Refusal::NotOwnInstance { key, instance });
            return;
        }
        self.health_seq += 1;
        let signed = Arc::new(self.node_key.sign_health(HealthRecord {
            key,
            instance,
            generation,
            owner: me,
            owner_boot: self.health_boot,
            seq: HealthSeq(self.health_seq),
            status,
            reason,
        }));
        match self.catalog.apply_health(signed.clone(), &self.verifier) {
            MergeOutcome::Applied => {
                self.announce_now |= signed.record.status == HealthStatus::Failing;
                self.on_health_applied(signed, None);
            }
            other => self.refuse(Refusal::Publish(other.as_label().to_owned())),
        }
    }

    fn collect_garbage(&mut self, now_ms: u64) {
        let heads: Vec<(Region, Revision)> = self
            .catalog
            .heads()
            .regions
            .into_iter()
            .map(|h| (h.region, h.contiguous))
            .collect();
        self.gc_samples.push_back((now_ms, heads));
        let cutoff = now_ms.saturating_sub(self.config.tombstone_retention_ms);
        let mut horizon = None;
        while self.gc_samples.front().is_some_and(|(t, _)| *t <= cutoff) {
            horizon = self.gc_samples.pop_front();
        }
        if let Some((t, heads)) = horizon {
            for (region, rev) in &heads {
                let n = self.catalog.collect_garbage(region, *rev);
                self.counters.tombstones_collected += n as u64;
            }
            // Keep the sample so the next round's horizon never moves backwards.
            self.gc_samples.push_front((t, heads));
        }
    }
}

fn bucket_of(owner: &NodeId) -> usize {
    (fnv1a(owner.as_str().as_bytes(), FNV_OFFSET) % DIGEST_BUCKETS as u64) as usize
}

/// One order-independent hash per bucket of owner heads (xor of per-head hashes).
fn bucket_hashes(owners: &[OwnerHead]) -> [u64; DIGEST_BUCKETS] {
    let mut out = [0u64; DIGEST_BUCKETS];
    for h in owners {
        let mut x = fnv1a(h.owner.as_str().as_bytes(), FNV_OFFSET);
        x = fnv1a(&h.boot.0.to_le_bytes(), x);
        x = fnv1a(&h.contiguous.0.to_le_bytes(), x);
        x = fnv1a(&h.pending_hash.to_le_bytes(), x);
        out[bucket_of(&h.owner)] ^= x;
    }
    out
}

fn owners_in_buckets(owners: &[OwnerHead], buckets: &[u16]) -> Vec<OwnerHead> {
    owners
        .iter()
        .filter(|h| buckets.contains(&(bucket_of(&h.owner) as u16)))
        .cloned()
        .collect()
}

// `stream_in`/`stream_out` are indexed by `MessageKind as usize`; the largest kind must fit.
const _: () = assert!((MessageKind::AuthorityReply as usize) < 12);
