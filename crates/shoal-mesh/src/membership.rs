//! SWIM membership (hard-failure detection) as a sans-IO state machine around [`foca`].
//!
//! [`Membership`] owns one foca instance. It never reads a clock, never touches a socket and
//! never asks the OS for randomness: time arrives as `now_ms` (monotonic milliseconds chosen by
//! the driver), randomness comes from a caller-provided seed, and every output is data the
//! driver drains.
//!
//! # Driving it
//! Methods fall into four groups, in the style of `quinn-proto`'s `Connection`:
//!
//! * inputs: [`Membership::join`], [`Membership::handle_datagram`], [`Membership::handle_timer`],
//!   [`Membership::leave`];
//! * outputs, to drain after *every* input, in this order: [`Membership::poll_transmit`] until
//!   `None`, [`Membership::poll_timer`] until `None`, [`Membership::poll_event`] until `None`;
//! * getters: [`Membership::members`], [`Membership::is_down`], [`Membership::counters`],
//!   [`Membership::identity`];
//! * configuration: [`MembershipConfig::for_cluster_size`], [`MembershipConfig::detection_budget`].
//!
//! Timers are data: `poll_timer` yields `(deadline_ms, token)`; the driver hands the token back
//! through `handle_timer` at or after the deadline. A token that has become stale (its epoch has
//! passed) is a counted no-op, so drivers never need to cancel anything.
//! Every input takes `now_ms`, which must never decrease from one input to the next (asserted
//! in debug builds).
//!
//! # Identity and restarts
//! A member is a [`MemberId`]: node id, socket address and boot generation. Two identities
//! sharing an address conflict and the higher boot generation wins, so a restarted agent
//! (boot + 1) replaces its previous incarnation everywhere. On top of foca, this module also
//! keeps at most one active identity per [`NodeId`]: if a node shows up under a second address,
//! the identity with the lower `(boot, addr)` is declared down. Consumers therefore always see
//! `Down(old)` before or together with `Up(new)`, never both active.
//!
//! # What was changed relative to plain foca
//! foca trusts a `TurnUndead` message even when it comes from a member it considers down. A
//! member isolated for longer than the suspicion window considers everyone down; when the
//! partition heals, every healthy member that announces to it would then be told "you are down"
//! and would renew its own identity, flapping healthy nodes. [`Membership::handle_datagram`]
//! drops such a `TurnUndead` while this member still has active peers (counted in
//! [`MembershipCounters::ignored_turn_undead`]). The isolated side heals itself instead: its
//! pings are answered with `TurnUndead` by members it still sees as active, and once it is idle
//! it re-announces to its seeds every [`MembershipConfig::join_retry_ms`].
//!
//! # Where each part lives
//! This file holds [`Membership`]: construction, the inputs, the `poll_*` outputs, the getters
//! and the drain of foca's runtime into views and events. The rest is in `src/membership/`:
//! * `identity.rs`: [`MemberId`]; `config.rs`: [`MembershipConfig`], [`ConfigError`],
//!   [`DetectionBudget`]; `outputs.rs`: [`MembershipEvent`], [`MembershipCounters`];
//! * `timers.rs`: timer tokens and epochs, and Lifeguard local health;
//! * `partition.rs`: when to trust `TurnUndead`, and the rebuild after a rejoin;
//! * `repeat_filter.rs`: dropping repeated SWIM updates before foca (reread on foca upgrades);
//! * `buckets.rs`: member buckets and membership push-pull.
//!
//! The invariants cited in comments are numbered in `docs/invariants.md`.

mod accuser;
mod buckets;
mod config;
pub mod forge;
mod identity;
mod outputs;
mod partition;
mod reconnect;
mod repeat_filter;
mod timers;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::hash::BuildHasherDefault;
use std::net::SocketAddr;

use foca::{
    AccumulatingRuntime, Foca, Member, Message, NoCustomBroadcast, OwnedNotification,
    PostcardCodec, State,
};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shoal_proto::envelope::{decode_header, MessageKind, HEADER_BYTES, MAGIC, PROTOCOL_VERSION};
use shoal_proto::NodeId;

pub use buckets::MEMBER_BUCKETS;
use buckets::{member_bucket, member_fingerprint};
pub use config::{ConfigError, DetectionBudget, MembershipConfig};
pub use identity::MemberId;
pub use outputs::{MembershipCounters, MembershipEvent};
pub use reconnect::KnownAddress;
pub(crate) use timers::IdleTimer;
pub use timers::MembershipTimer;
use timers::{foca_token, TimerKind};

type Swim = Foca<MemberId, PostcardCodec, ChaCha8Rng, NoCustomBroadcast>;

/// The SWIM membership state machine of one agent. See the [module docs](self).
pub struct Membership {
    foca: Swim,
    /// Kept to rebuild foca after a rejoin (see [`Membership::rebuild_after_rejoin`]).
    foca_config: foca::Config,
    seed: u64,
    runtime: AccumulatingRuntime<MemberId>,
    config: MembershipConfig,
    identity: MemberId,
    seeds: Vec<SocketAddr>,
    /// Our view, one active identity per node.
    active: BTreeMap<NodeId, MemberId>,
    /// [`reconnect::addr_hash`] of every active member's address, sorted, one per member (kept
    /// in step with `active` by `activate` and `deactivate`): a new book entry whose
    /// address hashes to none of them has no active member, which spares the pass over every
    /// active member in the common case (4 bytes a member; a map of exact counts per address
    /// added 0.66 GiB peak RSS to a 90 s cut of the simulator's `reference/mass-restart`).
    active_addr_hashes: Vec<u32>,
    /// XOR of [`member_fingerprint`] over `active`, per [`member_bucket`] (kept in step with
    /// every insert and removal).
    member_buckets: [u64; MEMBER_BUCKETS],
    /// Nodes last seen going down, with the time they went down (ms).
    down: BTreeMap<NodeId, (MemberId, u64)>,
    /// Hashes of piggybacked updates applied in the last [`APPLIED_UPDATES_WINDOW_MS`], with
    /// their arrival order for expiry (fixed hasher: no OS randomness in the core).
    applied: HashSet<u64, BuildHasherDefault<crate::hash::U64Hasher>>,
    applied_order: VecDeque<(u64, u64)>,
    /// Hashes of the updates of the datagram in hand that the repeat filter let through: they
    /// join `applied` only once foca has taken the datagram (`handle_data` returned `Ok`).
    applied_pending: Vec<u64>,
    /// Identities to declare down in foca after the current drain (node-level conflicts).
    declare_down: Vec<MemberId>,
    transmits: VecDeque<(SocketAddr, Vec<u8>)>,
    timers: VecDeque<(u64, MembershipTimer)>,
    events: VecDeque<MembershipEvent>,
    counters: MembershipCounters,
    /// Bumped whenever foca starts using a new timer token; older foca timers are stale.
    timer_epoch: u64,
    last_foca_token: Option<u8>,
    join_seq: u64,
    join_armed: bool,
    /// foca is connected: it probes and gossips (between `Active` and `Idle`/`Rejoin`).
    connected: bool,
    defunct: bool,
    /// Last time (ms) we held a partition's worth of members as down.
    partition_seen_ms: Option<u64>,
    /// Identities foca holds down that a peer's member list showed alive, with when we last
    /// told them so (`partition.rs`: contested downs).
    contested: BTreeMap<NodeId, (MemberId, u64)>,
    /// Until when (ms) we consider ourselves degraded (timers handled late).
    degraded_until_ms: u64,
    /// The `now_ms` of the latest input: time is an input and must never go backwards.
    last_now_ms: u64,
    /// Outcomes of our own probes (`accuser.rs`).
    probe_health: accuser::ProbeHealth,
    /// Addresses to keep knocking on (`reconnect.rs`).
    book: reconnect::Book,
    reconnect_rng: ChaCha8Rng,
    reconnect_seq: u64,
    reconnect_armed: bool,
    /// Suspect-to-down timers armed and not yet handed back (fired, stale or postponed): while
    /// any is, periodic gossip is never idle (`timers.rs`, `idle_timer`).
    suspicions_pending: u32,
    /// Bumped whenever the address book or the active set changes: the key of `earliest_due`.
    book_version: u64,
    /// `(book_version, earliest next_try_ms of an address no active member holds)` as last
    /// computed (`reconnect.rs`, `refresh_earliest_due`); a copy of a pure function of the
    /// state, valid while the version matches.
    earliest_due: (Option<u64>, Option<u64>),
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("identity", &self.identity)
            .field("active", &self.active.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Membership {
    /// Creates a member that knows nobody yet; call [`Membership::join`] next.
    ///
    /// `seed` feeds the `ChaCha8Rng` foca uses for member selection: same seed and same inputs
    /// give the same outputs.
    ///
    /// # Panics
    /// When `config` fails [`MembershipConfig::validate`] (a programming error); use
    /// [`Membership::try_new`] to get the error instead.
    pub fn new(identity: MemberId, config: MembershipConfig, seed: u64) -> Self {
        Self::try_new(identity, config, seed).expect("invalid MembershipConfig")
    }

    /// Like [`Membership::new`], returning bad configuration as an error.
    ///
    /// # Errors
    /// [`ConfigError`] from [`MembershipConfig::validate`].
    pub fn try_new(
        identity: MemberId,
        config: MembershipConfig,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let foca_config = config.to_foca()?;
        let rng = ChaCha8Rng::seed_from_u64(seed);
        Ok(Self {
            foca: Foca::new(identity.clone(), foca_config.clone(), rng, PostcardCodec),
            foca_config,
            seed,
            runtime: AccumulatingRuntime::new(),
            identity,
            seeds: Vec::new(),
            active: BTreeMap::new(),
            active_addr_hashes: Vec::new(),
            member_buckets: [0; MEMBER_BUCKETS],
            applied: HashSet::default(),
            applied_order: VecDeque::new(),
            applied_pending: Vec::new(),
            down: BTreeMap::new(),
            declare_down: Vec::new(),
            transmits: VecDeque::new(),
            timers: VecDeque::new(),
            events: VecDeque::new(),
            counters: MembershipCounters::default(),
            timer_epoch: 0,
            last_foca_token: None,
            join_seq: 0,
            join_armed: false,
            connected: false,
            defunct: false,
            partition_seen_ms: None,
            contested: BTreeMap::new(),
            degraded_until_ms: 0,
            last_now_ms: 0,
            probe_health: accuser::ProbeHealth::default(),
            book: reconnect::Book::new(),
            reconnect_rng: reconnect::reconnect_rng(seed),
            reconnect_seq: 0,
            reconnect_armed: false,
            suspicions_pending: 0,
            book_version: 0,
            earliest_due: (None, None),
            config,
        })
    }

    /// Announces to `seeds` (addresses only; our own address and entries past
    /// [`MembershipConfig::max_seeds`] are ignored and counted) and remembers them: while we
    /// have no active peer we re-announce every [`MembershipConfig::join_retry_ms`].
    /// A no-op after [`Membership::leave`].
    pub fn join(&mut self, now_ms: u64, seeds: &[SocketAddr]) {
        self.observe_now(now_ms);
        if self.defunct {
            return;
        }
        for seed in seeds {
            let usable = *seed != self.identity.addr
                && !self.seeds.contains(seed)
                && self.seeds.len() < self.config.max_seeds;
            if usable {
                self.seeds.push(*seed);
                self.book_seed(now_ms, *seed);
            } else {
                self.counters.seeds_ignored += 1;
            }
        }
        self.announce_to_seeds();
        self.arm_join_retry(now_ms);
        self.arm_reconnect(now_ms);
        self.drain(now_ms);
    }

    /// Feeds one received datagram. `bytes` include the 4-byte shoal envelope header and must be
    /// a [`MessageKind::Swim`] message. Bad input is counted (`rejected_decode`,
    /// `rejected_foca`) and otherwise ignored; it never panics.
    pub fn handle_datagram(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]) {
        self.observe_now(now_ms);
        self.counters.datagrams_in += 1;
        self.counters.bytes_in += bytes.len() as u64;
        let body = match decode_header(bytes, self.config.max_packet_bytes) {
            Ok((MessageKind::Swim, body)) => body,
            _ => {
                self.counters.rejected_decode += 1;
                return;
            }
        };
        let (header, header_len) = match postcard::take_from_bytes::<foca::Header<MemberId>>(body) {
            Ok((header, rest)) => (header, body.len() - rest.len()),
            Err(_) => {
                self.counters.rejected_foca += 1;
                return;
            }
        };
        if header.src.addr != from {
            self.counters.src_addr_mismatch += 1;
        }
        self.observe_probe_answer(&header);
        if header.message == Message::TurnUndead {
            if self.is_untrusted_turn_undead(now_ms, &header.src) {
                self.counters.ignored_turn_undead += 1;
                return;
            }
            if self.withhold_renewal() {
                return;
            }
        }
        let filtered = self.drop_applied_updates(now_ms, &header, body, header_len);
        let body = filtered.as_deref().unwrap_or(body);
        let founded = self.drop_unfounded_downs(&header, body, header_len);
        let body = founded.as_deref().unwrap_or(body);
        if self.foca.handle_data(body, &mut self.runtime).is_ok() {
            // Before the drain: a rejoin it handles starts a fresh foca and forgets them.
            self.remember_applied(now_ms);
        } else {
            self.applied_pending.clear();
            self.counters.rejected_foca += 1;
        }
        self.drain(now_ms);
    }

    /// Seeds the member list directly with `members` as alive (no announce round trips), as if
    /// they had all been learned by gossip. For the simulator's initial state and for an agent
    /// restoring the last live members it persisted; the members still have to answer probes.
    /// Costs O(n^2) in foca (it keeps members in a list), once.
    pub fn bootstrap(&mut self, now_ms: u64, members: Vec<MemberId>) {
        self.observe_now(now_ms);
        if self.defunct {
            return;
        }
        let updates: Vec<Member<MemberId>> = members
            .into_iter()
            .filter(|m| m.addr != self.identity.addr)
            .map(Member::alive)
            .collect();
        if self
            .foca
            .apply_many(updates.into_iter(), false, &mut self.runtime)
            .is_err()
        {
            self.counters.foca_errors += 1;
        }
        self.drain(now_ms);
    }

    /// Leaves gracefully: tells a few members we are down and becomes defunct. Afterwards every
    /// input is still accepted but this member takes no part; restart with `boot + 1` to rejoin.
    pub fn leave(&mut self, now_ms: u64) {
        self.observe_now(now_ms);
        if self.defunct {
            return;
        }
        if self.foca.leave_cluster(&mut self.runtime).is_err() {
            self.counters.foca_errors += 1;
        }
        self.defunct = true;
        self.drain(now_ms);
    }

    /// Next datagram to send: `(destination, bytes)`, bytes including the envelope header and
    /// never longer than [`MembershipConfig::max_packet_bytes`].
    #[must_use = "a datagram not sent is lost"]
    pub fn poll_transmit(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        let out = crate::queue::pop_trimmed(&mut self.transmits)?;
        self.counters.datagrams_out += 1;
        self.counters.bytes_out += out.1.len() as u64;
        Some(out)
    }

    /// Next timer to schedule: `(deadline_ms, token)`. Deliver with
    /// [`Membership::handle_timer`] at or after `deadline_ms`.
    #[must_use = "a timer not handed back never fires"]
    pub fn poll_timer(&mut self) -> Option<(u64, MembershipTimer)> {
        crate::queue::pop_trimmed(&mut self.timers)
    }

    /// Next membership event, in the order they happened.
    #[must_use = "events are the caller's to handle"]
    pub fn poll_event(&mut self) -> Option<MembershipEvent> {
        crate::queue::pop_trimmed(&mut self.events)
    }

    /// Active members (alive or suspect) in our view, one identity per node, sorted by node id.
    /// Does not include ourselves.
    pub fn members(&self) -> impl Iterator<Item = &MemberId> {
        self.active.values()
    }

    /// The identity `node` is an active member under (alive or suspect), if it is one: the
    /// [`Membership::members`] entry for `node`, found in O(log members).
    pub fn member(&self, node: &NodeId) -> Option<&MemberId> {
        self.active.get(node)
    }

    /// Nodes foca currently suspects (a probe failed and the suspicion is not refuted yet). A
    /// suspect is still active in [`Membership::members`] until it is declared down. One pass
    /// over foca's member list: for operator views, not per request.
    pub fn suspects(&self) -> impl Iterator<Item = &NodeId> {
        self.foca
            .iter_membership_state()
            .filter(|m| matches!(m.state(), State::Suspect))
            .map(|m| &m.id().node)
    }

    /// Number of active members (alive or suspect), not counting ourselves.
    pub fn num_members(&self) -> usize {
        self.active.len()
    }

    /// `true` when `node` was an active member and currently is not (declared down, left, or its
    /// identity is down and no newer one is up). A node never seen is *not* down.
    pub fn is_down(&self, node: &NodeId) -> bool {
        // The down list is short; most lookups end there.
        self.down.contains_key(node) && !self.active.contains_key(node)
    }

    /// Nodes down now (as [`Membership::is_down`] answers), in node order.
    pub fn down_nodes(&self) -> impl Iterator<Item = &NodeId> {
        self.down.keys().filter(|n| !self.active.contains_key(*n))
    }

    /// The identity of `node` we last saw go down, and when (ms), if it is down now.
    pub fn down_identity(&self, node: &NodeId) -> Option<(&MemberId, u64)> {
        if self.active.contains_key(node) {
            return None;
        }
        self.down.get(node).map(|(m, t)| (m, *t))
    }

    /// Counters and gauges for metrics. The `members_*` and `updates_backlog` gauges are
    /// computed here, by one pass over the member list (O(members)), not on every input.
    pub fn counters(&self) -> MembershipCounters {
        let mut c = self.counters.clone();
        let (mut alive, mut suspect, mut down) = (0, 0, 0);
        for member in self.foca.iter_membership_state() {
            match member.state() {
                State::Alive => alive += 1,
                State::Suspect => suspect += 1,
                State::Down => down += 1,
            }
        }
        c.members_alive = alive;
        c.members_suspect = suspect;
        c.members_down = down;
        c.updates_backlog = self.foca.updates_backlog() as u64;
        c
    }

    /// Our current identity (its `boot` grows on every automatic rejoin).
    pub fn identity(&self) -> &MemberId {
        &self.identity
    }

    /// The configuration this member runs with.
    pub fn config(&self) -> &MembershipConfig {
        &self.config
    }

    fn announce_to_seeds(&mut self) {
        for seed in self.seeds.clone() {
            // Only fails on encode errors, which a fixed-size identity cannot hit.
            if self
                .foca
                .announce(MemberId::placeholder(seed), &mut self.runtime)
                .is_err()
            {
                self.counters.foca_errors += 1;
            }
        }
    }

    fn push_event(&mut self, event: MembershipEvent) {
        if self.events.len() >= self.config.max_pending_events {
            self.counters.event_overflow += 1;
            return;
        }
        self.events.push_back(event);
    }

    /// Moves everything foca produced into our bounded queues and views. Node-level conflicts
    /// found on the way are fed back to foca, which may produce more output: loop, bounded.
    fn drain(&mut self, now_ms: u64) {
        // Each pass may produce more foca output (node conflicts fed back, a rejoin rebuild);
        // a rebuild cannot trigger another one, so a few passes settle it.
        let mut drained = 0;
        for _pass in 0..8 {
            drained += self.runtime.backlog();
            self.drain_runtime(now_ms);
            if !self.declare_down.is_empty() {
                let downs: Vec<Member<MemberId>> =
                    self.declare_down.drain(..).map(Member::down).collect();
                if self
                    .foca
                    .apply_many(downs.into_iter(), true, &mut self.runtime)
                    .is_err()
                {
                    self.counters.foca_errors += 1;
                }
            }
            if self.runtime.backlog() == 0 {
                break;
            }
        }
        debug_assert_eq!(self.runtime.backlog(), 0, "runtime not drained");
        if drained > crate::queue::QUEUE_SPARE && self.runtime.backlog() == 0 {
            // foca's runtime keeps its queues' largest capacity and offers no way to trim them;
            // empty, it holds no state, so a burst's capacity goes back with a fresh one.
            self.runtime = AccumulatingRuntime::new();
        }
        // Invariant 8 (`docs/invariants.md`): every output queue within its cap.
        debug_assert!(
            self.transmits.len() <= self.config.max_pending_transmits,
            "transmit queue over its cap"
        );
        debug_assert!(
            self.timers.len() <= self.config.max_pending_timers,
            "timer queue over its cap"
        );
        debug_assert!(
            self.events.len() <= self.config.max_pending_events,
            "event queue over its cap"
        );
    }

    /// Checks the clock contract of every input: `now_ms` never decreases (timer deadlines,
    /// local health and the repeat filter's window all assume it).
    fn observe_now(&mut self, now_ms: u64) {
        debug_assert!(
            now_ms >= self.last_now_ms,
            "now_ms went backwards: {now_ms} after {}",
            self.last_now_ms
        );
        self.last_now_ms = now_ms;
    }

    fn drain_runtime(&mut self, now_ms: u64) {
        let mut notifications = Vec::new();
        while let Some(notification) = self.runtime.to_notify() {
            notifications.push(notification);
        }
        let rejoined = notifications
            .iter()
            .any(|n| matches!(n, OwnedNotification::Rejoin(_)));
        if rejoined {
            // Everything the old instance queued in this batch is dropped: its gossip would
            // spread the suspicions and downs it formed while cut off.
            while self.runtime.to_send().is_some() {}
            while self.runtime.to_schedule().is_some() {}
        }
        while let Some((to, data)) = self.runtime.to_send() {
            self.enqueue_datagram(now_ms, to.addr, &data);
        }
        while let Some((after, timer)) = self.runtime.to_schedule() {
            if let Some(token) = foca_token(&timer) {
                if self.last_foca_token.is_some_and(|last| last != token) {
                    self.timer_epoch += 1;
                }
                self.last_foca_token = Some(token);
            }
            let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
            let deadline_ms = now_ms.saturating_add(after_ms);
            let kind = TimerKind::Foca {
                epoch: self.timer_epoch,
                timer,
                deadline_ms,
                postponed: 0,
                withheld: false,
            };
            self.push_timer(deadline_ms, kind);
        }
        for notification in notifications {
            self.on_notification(now_ms, notification);
        }
    }

    fn enqueue_datagram(&mut self, now_ms: u64, to: SocketAddr, body: &[u8]) {
        let len = HEADER_BYTES + body.len();
        if len > self.config.max_packet_bytes {
            debug_assert!(false, "foca produced {len} bytes over the limit");
            self.counters.oversize_dropped += 1;
            return;
        }
        if self.transmits.len() >= self.config.max_pending_transmits {
            self.counters.transmit_overflow += 1;
            return;
        }
        self.observe_outgoing(now_ms, to, body);
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&MAGIC);
        out.push(PROTOCOL_VERSION);
        out.push(MessageKind::Swim as u8);
        out.extend_from_slice(body);
        self.transmits.push_back((to, out));
    }

    fn on_notification(&mut self, now_ms: u64, notification: OwnedNotification<MemberId>) {
        match notification {
            OwnedNotification::MemberUp(id) => self.member_up(now_ms, id),
            OwnedNotification::MemberDown(id) => self.member_down(now_ms, &id),
            OwnedNotification::Rename(old, new) => {
                self.member_down(now_ms, &old);
                if self.foca.active_member(&new).is_some() {
                    self.member_up(now_ms, new);
                }
            }
            OwnedNotification::Active => {
                self.connected = true;
                self.push_event(MembershipEvent::Active);
            }
            OwnedNotification::Idle => {
                self.connected = false;
                self.push_event(MembershipEvent::Idle);
                self.arm_join_retry(now_ms);
            }
            OwnedNotification::Defunct => {
                self.connected = false;
                self.defunct = true;
                self.push_event(MembershipEvent::Defunct);
            }
            OwnedNotification::Rejoin(new) => {
                self.connected = false;
                self.counters.rejoins += 1;
                let old = std::mem::replace(&mut self.identity, new.clone());
                self.rebuild_after_rejoin(&new);
                self.push_event(MembershipEvent::Rejoined { old, new });
                self.arm_join_retry(now_ms);
            }
        }
    }

    fn member_up(&mut self, now_ms: u64, id: MemberId) {
        if id.node == self.identity.node {
            // Someone else claims our node id: keep ourselves, declare the other down.
            self.counters.identity_conflicts += 1;
            if self.identity.supersedes(&id) {
                self.declare_down.push(id);
            }
            return;
        }
        match self.active.get(&id.node) {
            Some(current) if *current == id => {}
            Some(current) if id.supersedes(current) => {
                let old = current.clone();
                self.counters.identity_conflicts += 1;
                self.member_down(now_ms, &old);
                self.declare_down.push(old);
                self.insert_up(id);
            }
            Some(_) => {
                self.counters.identity_conflicts += 1;
                self.declare_down.push(id);
            }
            None => self.insert_up(id),
        }
    }

    fn insert_up(&mut self, id: MemberId) {
        self.down.remove(&id.node);
        self.contested.remove(&id.node);
        self.book_up(self.last_now_ms, &id);
        self.member_buckets[member_bucket(&id.node)] ^= member_fingerprint(&id);
        self.activate(id.clone());
        self.book_version += 1;
        debug_assert_eq!(
            self.member_buckets,
            self.computed_member_buckets(),
            "member buckets out of step with the active set after an Up"
        );
        self.push_event(MembershipEvent::Up(id));
    }

    fn member_down(&mut self, now_ms: u64, id: &MemberId) {
        if self.active.get(&id.node) != Some(id) {
            return;
        }
        self.deactivate(&id.node);
        self.book_version += 1;
        self.member_buckets[member_bucket(&id.node)] ^= member_fingerprint(id);
        if self.down.len() >= self.config.max_tracked_down && evict_oldest(&mut self.down) {
            self.counters.down_evicted += 1;
        }
        self.down.insert(id.node.clone(), (id.clone(), now_ms));
        self.book_down(now_ms, id);
        debug_assert_eq!(
            self.member_buckets,
            self.computed_member_buckets(),
            "member buckets out of step with the active set after a Down"
        );
        self.push_event(MembershipEvent::Down(id.clone()));
    }
}

/// Removes the entry with the oldest time (ties: the lowest node id) from a map of nodes to
/// `(identity, ms)`; `false` when it was empty. Bounds the down list and the contested downs.
pub(super) fn evict_oldest(map: &mut BTreeMap<NodeId, (MemberId, u64)>) -> bool {
    let oldest = map
        .iter()
        .min_by_key(|(node, (_, t))| (*t, (*node).clone()))
        .map(|(node, _)| node.clone());
    oldest.is_some_and(|node| map.remove(&node).is_some())
}
