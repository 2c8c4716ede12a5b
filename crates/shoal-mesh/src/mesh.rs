//! One agent's protocol core: SWIM membership + record dissemination + anti-entropy.
//!
//! # Shape (sans-IO, after `quinn-proto`)
//! * inputs: [`Mesh::handle_datagram`], [`Mesh::handle_stream_message`],
//!   [`Mesh::handle_timeout`] (or [`Mesh::handle_timer`]), [`Mesh::handle_command`] — each takes
//!   `now_ms` (monotonic milliseconds of the driver), which must never decrease from one input
//!   to the next (asserted in debug builds);
//! * outputs, drained after every input: [`Mesh::poll_transmit`] until `None`, then
//!   [`Mesh::poll_event`] until `None`;
//! * timers are the core's: it keeps every timer it arms (`src/mesh/timers.rs`); the driver asks [`Mesh::poll_timeout`] for the next deadline after
//!   every input and calls [`Mesh::handle_timeout`] once the clock reaches it. A driver that
//!   orders timers with other events in one queue of its own (the simulator) takes each armed
//!   timer once from [`Mesh::poll_armed`] instead and fires it by token with
//!   [`Mesh::handle_timer`];
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
//!
//! # Where each part lives
//! This file holds [`Mesh`]: its state, getters, the `handle_*` inputs, the `poll_*` outputs
//! and `after_input`, which runs after every input. The rest is in `src/mesh/`, one idea each:
//! * `config.rs`: [`MeshConfig`]; `io.rs`: [`Transmit`], [`Channel`], [`MeshTimer`],
//!   [`Command`], [`MeshEvent`], [`Refusal`]; `counters.rs`: [`MeshCounters`], [`Flow`];
//! * `timers.rs`: the timer table and [`TimerToken`];
//! * `coalesce.rs`: the outbox, withdrawal classification and the flush into eager pushes;
//! * `plumtree.rs`: eager/lazy peer sets, PRUNE, IHAVE, GRAFT;
//! * `delta.rs`: deltas and snapshots, the replies shared by GRAFT and anti-entropy;
//! * `anti_entropy.rs`: digests, bucket heads and the membership push-pull;
//! * `health.rs`: this node's signed health chain; `gc.rs`: the tombstone GC horizon.
//!
//! The invariants cited in comments are numbered in `docs/invariants.md`.

mod anti_entropy;
mod coalesce;
mod config;
mod counters;
mod delta;
mod gc;
mod health;
mod io;
mod plumtree;
mod timers;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use rand_chacha::rand_core::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_catalog::snapshot::Snapshot;
use shoal_catalog::view::Liveness;
use shoal_catalog::{Catalog, DeltaOutcome, MergeOutcome, Verifier};
use shoal_proto::envelope::{self, MessageKind};
use shoal_proto::{
    Generation, HealthSeq, InstanceId, NodeId, Region, Revision, SignedLifecycle, SigningKey, Zone,
};

use crate::membership::{IdleTimer, MemberId, Membership, MembershipEvent};
use crate::messages::StreamMessage;
use crate::record_codec;

use coalesce::Outgoing;
pub use config::MeshConfig;
pub use counters::{Flow, MeshCounters};
pub use io::{Channel, Command, MeshEvent, MeshTimer, Refusal, Transmit};
use timers::TimerTable;
pub use timers::TimerToken;

/// What firing an idle timer amounts to (`Mesh::idle_rearm`).
enum IdleMeshTimer {
    /// Arm this timer at this deadline (ms) instead.
    Rearm(u64, MeshTimer),
    /// Hand a membership timer to `Membership::settle_idle`.
    Settle,
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

/// What [`Mesh::restore`] restores from.
#[derive(Debug)]
pub enum Restore<'a> {
    /// A decoded, verified snapshot (`shoal_catalog::snapshot::decode`; the agent's persisted
    /// file): installed record by record into the core's catalog
    /// ([`Catalog::install`]), whose merge counters count it.
    Snapshot(&'a Snapshot),
    /// A whole catalog the driver kept in memory instead of its encoding (the simulator: each
    /// agent's last persisted catalog, or its region's steady state at first boot, shared
    /// copy-on-write). It replaces the core's catalog, with its merge counters zeroed, as a
    /// fresh process's are. The simulator cannot install snapshots instead without changing
    /// its reports (docs/adr/0021-core-owned-timers.md, "Restore").
    Catalog(Box<Catalog>),
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
    /// Timers armed during the current input, filed into `timers` (after membership's) at its
    /// end, so tokens follow the order the drivers used to see them in.
    armed_now: Vec<(u64, MeshTimer)>,
    timers: TimerTable,
    events: VecDeque<MeshEvent>,
    counters: MeshCounters,
    /// The `now_ms` of the latest input: time is an input and must never go backwards.
    last_now_ms: u64,
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
            armed_now: Vec::new(),
            timers: TimerTable::default(),
            events: VecDeque::new(),
            counters: MeshCounters::default(),
            last_now_ms: 0,
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

    /// Swaps catalog maps equal to `reference`'s for shared copies
    /// ([`Catalog::share_equal_maps`]): memory only, the contents do not change. Returns how
    /// many maps were swapped.
    pub fn share_catalog_maps(&mut self, reference: &Catalog) -> usize {
        self.catalog.share_equal_maps(reference)
    }

    /// The SWIM membership.
    pub fn membership(&self) -> &Membership {
        &self.membership
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
        self.advance_idle_timers(now_ms);
        self.observe_now(now_ms);
        self.membership.handle_datagram(now_ms, from, bytes);
        self.after_input(now_ms);
    }

    /// A stream message arrived from the peer listening at `from`. Bad input is counted in
    /// [`MeshCounters::rejected`] and ignored.
    pub fn handle_stream_message(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]) {
        self.advance_idle_timers(now_ms);
        self.observe_now(now_ms);
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

    /// The earliest deadline of the core's timers, monotonic ms; `None` when none is armed
    /// (never once the periodic timers run). Ask after every input: an input may arm an earlier
    /// timer. A deadline at or before the current time is due now.
    ///
    /// A timer whose firing would do nothing but re-arm itself or update foca's bookkeeping (a
    /// SWIM gossip round with no update to send while no suspicion is pending, an IHAVE tick
    /// with no changed head and no link to add, the indirect stage of an acked probe, a
    /// reconnect tick with nothing due) is not a deadline here: the core handles it at the next
    /// input instead, as firing it on time would have, so an idle agent wakes only for work
    /// (see [`Mesh::handle_timeout`]). A driver that takes tokens ([`Mesh::poll_armed`]) gets
    /// every timer.
    #[must_use = "the core does nothing at its deadline unless handle_timeout is called"]
    pub fn poll_timeout(&self) -> Option<u64> {
        if !self.parks_idle_timers() {
            return self.timers.next_deadline();
        }
        self.timers
            .next_deadline_skipping(|timer| self.idle_rearm(timer, 0).is_some())
    }

    /// Fires every timer due at `now_ms`: earliest deadline first, equal deadlines in the order
    /// they were armed, including timers a firing arms that are already due. Drain the outputs
    /// afterwards as after any input. Nothing is due: a no-op.
    ///
    /// An idle periodic timer (see [`Mesh::poll_timeout`]) that is due is not fired: it is
    /// re-armed one period after its own deadline, which is all its handler would have done, and
    /// it comes round again in deadline order if that is still due. Every other input first moves
    /// the idle timers that fell due before it the same way (`Mesh::advance_idle_timers`), so
    /// the next round keeps the phase it would have had with every idle round fired on time, and
    /// a round that finds work is not handled late (which local health would read as a stall).
    pub fn handle_timeout(&mut self, now_ms: u64) {
        self.observe_now(now_ms);
        let park = self.parks_idle_timers();
        while let Some((at, timer)) = self.timers.pop_due(now_ms) {
            if park {
                if let Some(idle) = self.idle_rearm(&timer, at) {
                    self.apply_idle(timer, idle);
                    continue;
                }
            }
            self.fire(now_ms, timer);
        }
        debug_assert!(
            self.poll_timeout().is_none_or(|at| at > now_ms),
            "a timer due at {now_ms} was left pending"
        );
    }

    /// The next timer armed since the last call, once each, in arming order:
    /// `(deadline_ms, token)`; fire it with [`Mesh::handle_timer`]. Only for a driver that
    /// orders timers in an event queue of its own (the simulator); drivers that use
    /// [`Mesh::poll_timeout`] never need it. Yields only timers still pending.
    #[must_use = "a token not taken here can only fire through handle_timeout"]
    pub fn poll_armed(&mut self) -> Option<(u64, TimerToken)> {
        self.timers.next_armed()
    }

    /// Fires the timer of `token` (from [`Mesh::poll_armed`]) now: the driver's queue decided it
    /// is due. A stale token (already fired, by token or by [`Mesh::handle_timeout`]) is a
    /// no-op.
    pub fn handle_timer(&mut self, now_ms: u64, token: TimerToken) {
        if let Some(timer) = self.timers.take(token) {
            self.fire(now_ms, timer);
        }
    }

    /// Pending timers in arming order, `(deadline_ms, what)`: for tests and status pages.
    pub fn pending_timers(&self) -> impl Iterator<Item = (u64, &MeshTimer)> {
        self.timers.iter()
    }

    /// How many timers are pending.
    pub fn timers_pending(&self) -> usize {
        self.timers.len()
    }

    fn fire(&mut self, now_ms: u64, timer: MeshTimer) {
        self.observe_now(now_ms);
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

    /// A command from the driver (contract C3, `docs/invariants.md`). Only
    /// [`Command::Publish`] and [`Command::ReportHealth`] can be refused; the outputs of the input are queued either way (a publish applies every
    /// record it can).
    ///
    /// # Errors
    /// [`Refusal`]: health for an instance this node does not own, or records that did not
    /// merge. Each refused record is also counted in [`MeshCounters::refused`].
    pub fn handle_command(&mut self, now_ms: u64, command: Command) -> Result<(), Refusal> {
        self.input(now_ms, |m| match command {
            Command::Join { seeds } => {
                m.join_seeds(now_ms, &seeds);
                Ok(())
            }
            Command::Leave => {
                m.membership.leave(now_ms);
                Ok(())
            }
            Command::RestoreKnown { addresses } => {
                m.membership.restore_known(now_ms, &addresses);
                Ok(())
            }
            Command::Publish { lifecycle } => m.publish(lifecycle),
            Command::ReportHealth {
                key,
                instance,
                generation,
                status,
                reason,
            } => m.report_health(key, instance, generation, status, reason),
        })
    }

    /// [`Command::Join`], which is never refused: join through these seed addresses.
    pub fn join(&mut self, now_ms: u64, seeds: &[SocketAddr]) {
        self.input(now_ms, |m| m.join_seeds(now_ms, seeds));
    }

    /// [`Command::Leave`], which is never refused: leave gracefully.
    pub fn leave(&mut self, now_ms: u64) {
        self.input(now_ms, |m| m.membership.leave(now_ms));
    }

    /// [`Command::RestoreKnown`], which is never refused.
    pub fn restore_known(&mut self, now_ms: u64, addresses: &[crate::membership::KnownAddress]) {
        self.input(now_ms, |m| m.membership.restore_known(now_ms, addresses));
    }

    /// One input: checks the clock, runs `f`, then everything that follows every input.
    fn input<R>(&mut self, now_ms: u64, f: impl FnOnce(&mut Self) -> R) -> R {
        self.advance_idle_timers(now_ms);
        self.observe_now(now_ms);
        let r = f(self);
        self.after_input(now_ms);
        r
    }

    fn join_seeds(&mut self, now_ms: u64, seeds: &[SocketAddr]) {
        self.membership.join(now_ms, seeds);
        self.arm_periodic(now_ms);
        self.catch_up = true;
    }

    fn publish(&mut self, lifecycle: Vec<Arc<SignedLifecycle>>) -> Result<(), Refusal> {
        let mut refused = Vec::new();
        for rec in lifecycle {
            let urgent = self.is_urgent_lifecycle(&rec);
            match self.catalog.apply_lifecycle(rec.clone(), &self.verifier) {
                MergeOutcome::Applied => {
                    self.announce_now |= urgent;
                    self.on_lifecycle_applied(rec, None, urgent);
                }
                MergeOutcome::Duplicate | MergeOutcome::Stale => {}
                other => {
                    self.counters.refused += 1;
                    refused.push((rec.record.instance.clone(), other.as_label()));
                }
            }
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(Refusal::Publish { refused })
        }
    }

    /// Restores what a previous process of this agent persisted, before it joins: the one way
    /// a driver puts a catalog into the core (contract C5, `docs/invariants.md`) (the agent at boot, the simulator at every
    /// (re)start). An input like any other (`now_ms` must not go backwards); it sends
    /// nothing and the gap accounting counts what the restored catalog lacks.
    ///
    /// Returns what installing a snapshot merged; restoring a [`Restore::Catalog`] merges
    /// nothing and returns the empty outcome.
    pub fn restore(&mut self, now_ms: u64, from: Restore<'_>) -> DeltaOutcome {
        self.input(now_ms, |m| match from {
            Restore::Snapshot(snap) => m.catalog.install(snap, &m.verifier),
            Restore::Catalog(catalog) => {
                m.catalog = *catalog;
                m.catalog.reset_counters();
                DeltaOutcome::default()
            }
        })
    }

    /// Seeds membership with `members` (see [`Membership::bootstrap`]) and arms the periodic
    /// timers.
    pub fn bootstrap(&mut self, now_ms: u64, members: Vec<MemberId>) {
        self.advance_idle_timers(now_ms);
        self.observe_now(now_ms);
        self.membership.bootstrap(now_ms, members);
        self.arm_periodic(now_ms);
        self.after_input(now_ms);
    }

    /// Arms the periodic timers without joining anyone (the simulator bootstraps membership
    /// directly). Idempotent.
    pub fn start(&mut self, now_ms: u64) {
        self.advance_idle_timers(now_ms);
        self.observe_now(now_ms);
        self.arm_periodic(now_ms);
        self.after_input(now_ms);
    }

    // ---- outputs ---------------------------------------------------------------------------

    /// Next thing to send.
    #[must_use = "a transmit not sent is lost"]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if let Some((to, bytes)) = self.membership.poll_transmit() {
            return Some(Transmit {
                to,
                channel: Channel::Datagram,
                bytes,
            });
        }
        crate::queue::pop_trimmed(&mut self.transmits)
    }

    /// Next event.
    #[must_use = "events are the driver's to handle"]
    pub fn poll_event(&mut self) -> Option<MeshEvent> {
        crate::queue::pop_trimmed(&mut self.events)
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

    /// If `timer`, due at `at`, is idle (firing it then would send nothing, draw nothing and
    /// change nothing an input sees), what firing it would have done: re-arm it one period on,
    /// or settle foca's bookkeeping. Idle are: an IHAVE tick with no changed head and no link
    /// to add or promote, and the membership timers of `Membership::idle_timer` (a gossip round
    /// with nothing to send, an indirect probe of a probe already acked, a reconnect tick with
    /// no address due).
    fn idle_rearm(&self, timer: &MeshTimer, at: u64) -> Option<IdleMeshTimer> {
        match timer {
            MeshTimer::Membership(t) => match self.membership.idle_timer(t)? {
                IdleTimer::Rearm(at, t) => Some(IdleMeshTimer::Rearm(at, MeshTimer::Membership(t))),
                IdleTimer::Settle => Some(IdleMeshTimer::Settle),
            },
            MeshTimer::IHave if self.ihave_idle() => Some(IdleMeshTimer::Rearm(
                at + self.config.ihave_interval_ms,
                MeshTimer::IHave,
            )),
            _ => None,
        }
    }

    /// Does what firing the idle `timer` would have done (see [`Mesh::idle_rearm`]).
    fn apply_idle(&mut self, timer: MeshTimer, idle: IdleMeshTimer) {
        self.counters.idle_timers_skipped += 1;
        match idle {
            IdleMeshTimer::Rearm(at, next) => self.timers.arm(at, next),
            IdleMeshTimer::Settle => {
                if let MeshTimer::Membership(t) = timer {
                    self.membership.settle_idle(t);
                }
            }
        }
    }

    /// Deadline-driven cores only: before an input at `now_ms`, re-arms the idle timers that fell
    /// due before it, earliest first, stopping at the first timer that is not idle (a driver
    /// running late fires that one first, in order, through [`Mesh::handle_timeout`]). Nothing
    /// changed since the previous input, so each of them would have found the same state had it
    /// fired on time: doing nothing but re-arming one period on is exact.
    fn advance_idle_timers(&mut self, now_ms: u64) {
        if !self.parks_idle_timers() {
            return;
        }
        while let Some((at, token, timer)) = self.timers.peek() {
            if at >= now_ms {
                break;
            }
            let Some(idle) = self.idle_rearm(timer, at) else {
                break;
            };
            let timer = self.timers.take(token).expect("peeked: pending");
            self.apply_idle(timer, idle);
        }
    }

    /// Idle timers are parked: configured so, and no driver has taken a token.
    fn parks_idle_timers(&self) -> bool {
        self.config.park_idle_timers && !self.timers.token_driven()
    }

    fn push_timer(&mut self, at: u64, timer: MeshTimer) {
        debug_assert!(
            at >= self.last_now_ms,
            "{timer:?} armed in the past: {at} < {}",
            self.last_now_ms
        );
        self.armed_now.push((at, timer));
    }

    /// Files the timers armed by this input: membership's first, then the mesh's own, each in
    /// arming order (the order the drivers' own queues used to receive them in).
    fn file_timers(&mut self) {
        while let Some((at, t)) = self.membership.poll_timer() {
            self.timers.arm(at, MeshTimer::Membership(t));
        }
        for (at, t) in self.armed_now.drain(..) {
            self.timers.arm(at, t);
        }
    }

    fn push_event(&mut self, event: MeshEvent) {
        if self.events.len() >= self.config.max_pending_events {
            self.counters.event_overflow += 1;
            return;
        }
        self.events.push_back(event);
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

    /// Checks the clock contract of every input: `now_ms` never decreases (contract C1,
    /// `docs/invariants.md`; quinn-proto's rule for `now`: the coalescing window, jitter and
    /// the GC horizon all assume it).
    fn observe_now(&mut self, now_ms: u64) {
        debug_assert!(
            now_ms >= self.last_now_ms,
            "now_ms went backwards: {now_ms} after {}",
            self.last_now_ms
        );
        self.last_now_ms = now_ms;
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
                MembershipEvent::Rejoined { .. } => {
                    // Every member drops its links to our old identity when it learns that
                    // it went down (same address): link again, with GRAFTs, or records reach
                    // us only through IHAVE repair (faults/forged-down: ~1.3 s, issue 15).
                    self.eager.clear();
                    self.lazy.clear();
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
        self.file_timers();
        if self.parks_idle_timers() {
            self.membership.refresh_earliest_due();
        }
        self.debug_check_after_input();
    }

    /// Postconditions of every input (debug builds only): the output queues and the outbox
    /// within their caps (invariant 8, `docs/invariants.md`), a link never both eager and lazy,
    /// and a waiting outbox always has a flush armed.
    fn debug_check_after_input(&self) {
        debug_assert!(
            self.transmits.len() <= self.config.max_pending_transmits,
            "transmit queue over its cap"
        );
        debug_assert!(
            self.events.len() <= self.config.max_pending_events,
            "event queue over its cap"
        );
        debug_assert!(
            self.outbox.len() <= self.config.max_outbox_records,
            "outbox over its cap"
        );
        debug_assert!(
            self.eager.is_disjoint(&self.lazy),
            "a peer is both eager and lazy"
        );
        debug_assert!(
            self.outbox.is_empty() || self.flush_at.is_some(),
            "records wait in the outbox with no flush armed"
        );
        debug_assert!(self.armed_now.is_empty(), "armed timers left unfiled");
        self.debug_check_timers();
    }

    /// The timer bookkeeping agrees with the timer table (contract C2, `docs/invariants.md`;
    /// debug builds only): each periodic
    /// timer pending exactly once while armed (never lost, never doubled), `graft_armed`
    /// exactly when one graft check is pending and always while announced records are missing,
    /// and the flush `flush_at` names pending.
    fn debug_check_timers(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let (mut ihave, mut ae, mut gc, mut graft) = (0, 0, 0, 0);
        let mut flush_pending = false;
        // Counts only: the unordered view skips the sort `iter` does for arming order.
        for (at, t) in self.timers.iter_unordered() {
            match t {
                MeshTimer::IHave => ihave += 1,
                MeshTimer::AntiEntropy => ae += 1,
                MeshTimer::Gc => gc += 1,
                MeshTimer::Graft => graft += 1,
                MeshTimer::Flush => flush_pending |= self.flush_at == Some(at),
                MeshTimer::Membership(_) => {}
            }
        }
        let periodic = usize::from(self.periodic_armed);
        assert_eq!(
            (ihave, ae, gc),
            (periodic, periodic, periodic),
            "periodic timers pending (IHAVE, anti-entropy, GC)"
        );
        assert_eq!(graft, usize::from(self.graft_armed), "graft checks pending");
        assert!(
            self.graft_armed || (self.missing_regions.is_empty() && self.missing_owners.is_empty()),
            "announced records are missing with no graft check armed"
        );
        assert!(
            self.flush_at.is_none() || flush_pending,
            "flush_at names no pending flush"
        );
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
}
