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

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, DefaultHasher};
use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

use foca::{
    AccumulatingRuntime, Foca, Identity, Member, Message, NoCustomBroadcast, OwnedNotification,
    PeriodicParams, PostcardCodec, State, Timer,
};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use shoal_proto::envelope::{
    decode_header, MessageKind, DEFAULT_MAX_DATAGRAM_BYTES, HEADER_BYTES, MAGIC, PROTOCOL_VERSION,
};
use shoal_proto::{Generation, NodeId};

/// Holding at least 1 / `PARTITION_DOWN_DIVISOR` of the known members as down is taken as a
/// partition (not a lone isolated peer) when deciding whether to trust `TurnUndead`.
const PARTITION_DOWN_DIVISOR: usize = 5;

/// How long, ms, a partition verdict keeps `TurnUndead` from down members trusted.
const PARTITION_GRACE_MS: u64 = 120_000;

/// How long, ms, a piggybacked update is remembered as applied so that its repeats skip foca.
/// Repeats arrive within a few gossip rounds (`max_transmissions` sends per member that
/// learns it, every 200 ms); 10 s covers them with room to spare.
const APPLIED_UPDATES_WINDOW_MS: u64 = 10_000;

/// Bound on remembered applied updates (8-byte keys); the oldest are forgotten first.
const MAX_APPLIED_UPDATES: usize = 65_536;

/// Number of buckets the member set is hashed into for push-pull comparison
/// ([`Membership::member_buckets`]). A crash or a join changes one bucket, so peers exchange
/// about 1/32 of the member list to repair it, not all of it.
pub const MEMBER_BUCKETS: usize = 32;

/// How many times a degraded member postpones declaring one suspect down (each time by one
/// suspicion window) before it lets foca decide.
const MAX_DOWN_POSTPONES: u8 = 3;

/// foca identity: (node id, address, boot generation).
///
/// [`Identity::renew`] bumps `boot`; on an address conflict the higher boot generation wins
/// (ties broken by node id), so a restarted node is a new member and its old identity is declared
/// down, never kept beside it. Agents should persist `boot` and start every process with a
/// higher value than the last one they used.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MemberId {
    /// Stable node identifier (one agent per machine).
    pub node: NodeId,
    /// Address other members send SWIM datagrams to.
    pub addr: SocketAddr,
    /// Boot generation: bumped on every process start and on every automatic rejoin.
    pub boot: Generation,
}

impl MemberId {
    /// The identity used to announce to a seed we only know by address. foca accepts an
    /// `Announce` whose destination has the receiver's address, whatever the rest says.
    fn placeholder(addr: SocketAddr) -> Self {
        Self {
            node: NodeId::new("seed").expect("`seed` is a valid node id"),
            addr,
            boot: Generation(0),
        }
    }

    /// `true` when `self` should replace `other` for the same node or address.
    fn supersedes(&self, other: &Self) -> bool {
        (self.boot, &self.node, self.addr) > (other.boot, &other.node, other.addr)
    }
}

impl Identity for MemberId {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        (self.boot.0 < u64::MAX).then(|| Self {
            node: self.node.clone(),
            addr: self.addr,
            boot: self.boot.next(),
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.supersedes(adversary)
    }
}

/// Why a [`MembershipConfig`] was refused. Nothing was constructed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `probe_rtt_ms` must be non-zero and strictly below `probe_period_ms`.
    #[error("probe_rtt_ms ({rtt}) must be in 1..probe_period_ms ({period})")]
    ProbeTiming {
        /// Configured probe period, ms.
        period: u64,
        /// Configured probe rtt, ms.
        rtt: u64,
    },
    /// A field that must be non-zero is zero.
    #[error("{0} must not be zero")]
    Zero(&'static str),
    /// `max_packet_bytes` leaves no room for a SWIM packet after the envelope header.
    #[error("max_packet_bytes ({0}) must be in 256..=65507")]
    PacketSize(usize),
}

/// SWIM tuning. All durations are milliseconds of the driver's monotonic clock.
///
/// Use [`MembershipConfig::for_cluster_size`]; `docs/slo-budget.md` explains every value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipConfig {
    /// How often this member probes the next member of its shuffled round-robin list, ms. A probe
    /// that got no direct or indirect ack is turned into a suspicion at the *next* period.
    pub probe_period_ms: u64,
    /// How long to wait for a direct ack before asking `num_indirect_probes` members to probe, ms.
    /// Must be below `probe_period_ms`; the indirect cycle gets `probe_period_ms - probe_rtt_ms`.
    pub probe_rtt_ms: u64,
    /// Members asked to probe indirectly after a missed direct ack (also the fan-out of the
    /// gossip sent after refuting a suspicion).
    pub num_indirect_probes: usize,
    /// How long a suspect stays active before the member that suspected it declares it down, ms.
    /// This is the window a falsely suspected (stalled, lossy) member has to refute.
    pub suspect_to_down_after_ms: u64,
    /// How many times each membership update is piggybacked before it is dropped from the
    /// backlog. Higher values make it unlikelier that some member never hears of a death.
    pub max_transmissions: u8,
    /// Largest datagram produced or accepted, bytes, *including* the 4-byte shoal envelope header.
    pub max_packet_bytes: usize,
    /// Period of asking `periodic_announce_members` random members for more members, ms.
    pub periodic_announce_ms: u64,
    /// Members asked per periodic announce.
    pub periodic_announce_members: usize,
    /// Period of re-announcing to members considered down, ms, so that an isolated member that
    /// still sees some of us as alive learns it was declared down and rejoins.
    pub periodic_announce_to_down_ms: u64,
    /// Down members announced to per period.
    pub periodic_announce_to_down_members: usize,
    /// Period of pushing pending updates to `periodic_gossip_members` random members, ms. Only
    /// sent while there are updates; this is what spreads a down notice in O(log n) rounds.
    pub periodic_gossip_ms: u64,
    /// Gossip fan-out per period.
    pub periodic_gossip_members: usize,
    /// How long foca remembers a down identity, ms (stops the very same identity rejoining).
    pub remove_down_after_ms: u64,
    /// While this member has no active peer (not joined yet, or idle after isolation), it
    /// re-announces to its seeds every `join_retry_ms`.
    pub join_retry_ms: u64,
    /// Bound on datagrams waiting in [`Membership::poll_transmit`]; overflow is dropped and
    /// counted in [`MembershipCounters::transmit_overflow`].
    pub max_pending_transmits: usize,
    /// Bound on timers waiting in [`Membership::poll_timer`]; overflow is counted in
    /// [`MembershipCounters::timer_overflow`] (a dropped timer can stall a probe cycle).
    pub max_pending_timers: usize,
    /// Bound on events waiting in [`Membership::poll_event`]; overflow is counted.
    pub max_pending_events: usize,
    /// Bound on down nodes remembered for [`Membership::is_down`]; the longest-down is forgotten.
    pub max_tracked_down: usize,
    /// Bound on seed addresses kept by [`Membership::join`].
    pub max_seeds: usize,
}

impl MembershipConfig {
    /// Tuned values for a region of `n` members (see `docs/slo-budget.md`).
    ///
    /// * probe period 500 ms, probe rtt 200 ms, 5 indirect probes;
    /// * suspicion `max(3 s, 1.6 s * log10(n))` (5.15 s at 1,667; foca's LAN default is
    ///   `4 s * log10(n)` = 12.9 s);
    /// * `max_transmissions = ceil(5 * log10(n + 1))` (17 at 1,667), so the chance that some
    ///   member never hears a down notice is about `n * e^-17`;
    /// * gossip every 200 ms to 3 members, announce every 5 s to 1 (membership anti-entropy:
    ///   the Feed reply repairs identities that rumour mongering missed, e.g. after a partition
    ///   heals and hundreds of members renew at once), announce to 2 down members
    ///   every 15 s, join retry every 1 s.
    pub fn for_cluster_size(n: usize) -> Self {
        let n = n.max(2) as f64;
        let suspicion_ms = (1_600.0 * n.log10()).max(3_000.0).round() as u64;
        let max_tx = (5.0 * (n + 1.0).log10()).ceil().clamp(6.0, 255.0) as u8;
        Self {
            probe_period_ms: 500,
            probe_rtt_ms: 200,
            num_indirect_probes: 5,
            suspect_to_down_after_ms: suspicion_ms,
            max_transmissions: max_tx,
            max_packet_bytes: DEFAULT_MAX_DATAGRAM_BYTES,
            periodic_announce_ms: 30_000,
            periodic_announce_members: 1,
            periodic_announce_to_down_ms: 15_000,
            periodic_announce_to_down_members: 2,
            periodic_gossip_ms: 200,
            periodic_gossip_members: 3,
            remove_down_after_ms: 24 * 3_600 * 1_000,
            join_retry_ms: 1_000,
            max_pending_transmits: 1_024,
            max_pending_timers: 8_192,
            max_pending_events: 8_192,
            max_tracked_down: 16_384,
            max_seeds: 64,
        }
    }

    /// Checks the invariants foca relies on.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.probe_rtt_ms == 0 || self.probe_rtt_ms >= self.probe_period_ms {
            return Err(ConfigError::ProbeTiming {
                period: self.probe_period_ms,
                rtt: self.probe_rtt_ms,
            });
        }
        let nonzero = [
            ("num_indirect_probes", self.num_indirect_probes as u64),
            ("suspect_to_down_after_ms", self.suspect_to_down_after_ms),
            ("max_transmissions", u64::from(self.max_transmissions)),
            ("periodic_announce_ms", self.periodic_announce_ms),
            (
                "periodic_announce_members",
                self.periodic_announce_members as u64,
            ),
            (
                "periodic_announce_to_down_ms",
                self.periodic_announce_to_down_ms,
            ),
            (
                "periodic_announce_to_down_members",
                self.periodic_announce_to_down_members as u64,
            ),
            ("periodic_gossip_ms", self.periodic_gossip_ms),
            (
                "periodic_gossip_members",
                self.periodic_gossip_members as u64,
            ),
            ("join_retry_ms", self.join_retry_ms),
            ("max_pending_transmits", self.max_pending_transmits as u64),
            ("max_pending_timers", self.max_pending_timers as u64),
            ("max_pending_events", self.max_pending_events as u64),
        ];
        if let Some((name, _)) = nonzero.iter().find(|(_, v)| *v == 0) {
            return Err(ConfigError::Zero(name));
        }
        if !(256..=65_507).contains(&self.max_packet_bytes) {
            return Err(ConfigError::PacketSize(self.max_packet_bytes));
        }
        Ok(())
    }

    fn to_foca(&self) -> Result<foca::Config, ConfigError> {
        self.validate()?;
        let nz = |v: usize| NonZeroUsize::new(v).expect("validated non-zero");
        let ms = Duration::from_millis;
        Ok(foca::Config {
            probe_period: ms(self.probe_period_ms),
            probe_rtt: ms(self.probe_rtt_ms),
            num_indirect_probes: nz(self.num_indirect_probes),
            max_transmissions: NonZeroU8::new(self.max_transmissions).expect("validated"),
            suspect_to_down_after: ms(self.suspect_to_down_after_ms),
            remove_down_after: Some(ms(self.remove_down_after_ms.max(1))),
            max_packet_size: nz(self.max_packet_bytes - HEADER_BYTES),
            notify_down_members: true,
            periodic_announce: Some(PeriodicParams {
                frequency: ms(self.periodic_announce_ms),
                num_members: nz(self.periodic_announce_members),
            }),
            periodic_announce_to_down_members: Some(PeriodicParams {
                frequency: ms(self.periodic_announce_to_down_ms),
                num_members: nz(self.periodic_announce_to_down_members),
            }),
            periodic_gossip: Some(PeriodicParams {
                frequency: ms(self.periodic_gossip_ms),
                num_members: nz(self.periodic_gossip_members),
            }),
        })
    }

    /// The detection budget implied by this config for a region of `n` members: an estimate of
    /// the p99.9 time from a member's death until *every* other member has declared it down,
    /// assuming no loss beyond a few percent. `docs/slo-budget.md` derives each term.
    pub fn detection_budget(&self, n: usize) -> DetectionBudget {
        let n = n.max(2) as f64;
        let period = self.probe_period_ms as f64;
        // n-1 members each probe one of n-1 targets per period in shuffled round-robin, so the
        // wait until somebody probes the dead member is ~Exp(mean = period): p99.9 = ln(1000) T.
        let first_probe_ms = (1_000f64.ln() * period).ceil() as u64;
        // foca turns a failed probe into a suspicion when the next probe period starts.
        let suspect_raise_ms = self.probe_period_ms;
        // Push gossip with fan-out f reaches everyone in about log_{f+1}(n) + ln(n)/f rounds;
        // +2 rounds of slack for loss and for the update competing for packet space.
        let f = self.periodic_gossip_members.max(1) as f64;
        let rounds = (n.ln() / (f + 1.0).ln() + n.ln() / f).ceil() + 2.0;
        let dissemination_ms = (rounds * self.periodic_gossip_ms as f64).ceil() as u64;
        DetectionBudget {
            first_probe_ms,
            suspect_raise_ms,
            suspicion_ms: self.suspect_to_down_after_ms,
            dissemination_ms,
            total_ms: first_probe_ms
                + suspect_raise_ms
                + self.suspect_to_down_after_ms
                + dissemination_ms,
        }
    }
}

impl Default for MembershipConfig {
    /// [`MembershipConfig::for_cluster_size`] for 1,667 members (one region of 5,000 agents).
    fn default() -> Self {
        Self::for_cluster_size(1_667)
    }
}

/// The terms of the hard-failure detection budget, ms. See [`MembershipConfig::detection_budget`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetectionBudget {
    /// Until the first member probes the dead one (p99.9 of ~Exp(probe period)).
    pub first_probe_ms: u64,
    /// From that probe until foca raises the suspicion (one probe period).
    pub suspect_raise_ms: u64,
    /// Suspicion window before the suspecting member declares the member down.
    pub suspicion_ms: u64,
    /// Until the down notice has reached every member by gossip.
    pub dissemination_ms: u64,
    /// Sum of the terms: the bound tests assert against.
    pub total_ms: u64,
}

/// What changed in this member's view of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipEvent {
    /// The member became active (alive or suspect) in our view.
    Up(MemberId),
    /// The member is no longer active: declared down, left, or replaced by a newer identity of
    /// the same node or address (then `Down(old)` comes before `Up(new)`).
    Down(MemberId),
    /// Our own identity was declared down; we renewed it (boot + 1) and are rejoining.
    Rejoined {
        /// The identity the cluster declared down.
        old: MemberId,
        /// The identity now in use.
        new: MemberId,
    },
    /// At least one active member knows our current identity (joined, or rejoined).
    Active,
    /// Every member we knew is down or gone; we re-announce to our seeds until we hear back.
    Idle,
    /// We left (or could not renew our identity); this instance no longer takes part.
    Defunct,
}

/// Plain counters, for metrics. Monotonic except the `members_*`, `updates_backlog` and
/// `pending_*` gauges, which are refreshed after every input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipCounters {
    /// Datagrams passed to `handle_datagram`.
    pub datagrams_in: u64,
    /// Datagrams handed out by `poll_transmit`.
    pub datagrams_out: u64,
    /// Bytes passed to `handle_datagram` (including envelope headers).
    pub bytes_in: u64,
    /// Bytes handed out by `poll_transmit` (including envelope headers).
    pub bytes_out: u64,
    /// Datagrams whose shoal envelope was bad (short, magic, version, size, or not `Swim`).
    pub rejected_decode: u64,
    /// Datagrams foca refused (undecodable body, from ourselves, malformed, too big).
    pub rejected_foca: u64,
    /// `TurnUndead` messages from members we consider down, ignored while we have active peers.
    pub ignored_turn_undead: u64,
    /// Datagrams whose claimed sender address differs from the transport source address.
    pub src_addr_mismatch: u64,
    /// Timers dropped because their epoch had passed (the normal fate of stale timers).
    pub stale_timers: u64,
    /// Timer deliveries foca reported as an error (e.g. an incomplete probe cycle).
    pub timer_errors: u64,
    /// Datagrams dropped because the transmit queue was full.
    pub transmit_overflow: u64,
    /// Timers dropped because the timer queue was full.
    pub timer_overflow: u64,
    /// Events dropped because the event queue was full.
    pub event_overflow: u64,
    /// Outgoing datagrams dropped for exceeding `max_packet_bytes` (should stay 0).
    pub oversize_dropped: u64,
    /// Seeds ignored by `join` (own address, duplicates past `max_seeds`).
    pub seeds_ignored: u64,
    /// Times our identity was renewed after being declared down.
    pub rejoins: u64,
    /// Times two identities of one node were active at once and the older was declared down.
    pub identity_conflicts: u64,
    /// Down nodes forgotten because `max_tracked_down` was reached.
    pub down_evicted: u64,
    /// Suspect-to-down decisions postponed because this member was degraded (its timers ran
    /// late): Lifeguard-style local health.
    pub downs_postponed: u64,
    /// Piggybacked SWIM updates dropped before foca because this member had applied the very
    /// same update moments before (see [`Membership::handle_datagram`]).
    pub updates_deduplicated: u64,
    /// Identities learned from a peer's member list (push-pull, [`Membership::learn_members`])
    /// that rumour mongering had not brought us.
    pub members_learned: u64,
    /// Gauge: members alive in our view.
    pub members_alive: u64,
    /// Gauge: members suspect in our view.
    pub members_suspect: u64,
    /// Gauge: down identities foca still remembers.
    pub members_down: u64,
    /// Gauge: membership updates waiting to be piggybacked.
    pub updates_backlog: u64,
}

/// A timer token. Opaque: hand it back to [`Membership::handle_timer`] at its deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipTimer(TimerKind);

#[derive(Clone, Debug, PartialEq, Eq)]
enum TimerKind {
    Foca {
        epoch: u64,
        timer: Timer<MemberId>,
        /// When it was due (ms), to measure how late we handle it (local health).
        deadline_ms: u64,
        /// How many times a suspect-to-down was postponed because we were degraded.
        postponed: u8,
    },
    JoinRetry {
        seq: u64,
    },
}

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
    /// XOR of [`member_fingerprint`] over `active`, per [`member_bucket`] (kept in step with
    /// every insert and removal).
    member_buckets: [u64; MEMBER_BUCKETS],
    /// Nodes last seen going down, with the time they went down (ms).
    down: BTreeMap<NodeId, (MemberId, u64)>,
    /// Hashes of piggybacked updates applied in the last [`APPLIED_UPDATES_WINDOW_MS`], with
    /// their arrival order for expiry (fixed hasher: no OS randomness in the core).
    applied: HashSet<u64, BuildHasherDefault<DefaultHasher>>,
    applied_order: VecDeque<(u64, u64)>,
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
    /// Until when (ms) we consider ourselves degraded (timers handled late).
    degraded_until_ms: u64,
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
            member_buckets: [0; MEMBER_BUCKETS],
            applied: HashSet::default(),
            applied_order: VecDeque::new(),
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
            degraded_until_ms: 0,
            config,
        })
    }

    /// Announces to `seeds` (addresses only; our own address and entries past
    /// [`MembershipConfig::max_seeds`] are ignored and counted) and remembers them: while we
    /// have no active peer we re-announce every [`MembershipConfig::join_retry_ms`].
    /// A no-op after [`Membership::leave`].
    pub fn join(&mut self, now_ms: u64, seeds: &[SocketAddr]) {
        if self.defunct {
            return;
        }
        for seed in seeds {
            let usable = *seed != self.identity.addr
                && !self.seeds.contains(seed)
                && self.seeds.len() < self.config.max_seeds;
            if usable {
                self.seeds.push(*seed);
            } else {
                self.counters.seeds_ignored += 1;
            }
        }
        self.announce_to_seeds();
        self.arm_join_retry(now_ms);
        self.drain(now_ms);
    }

    /// Feeds one received datagram. `bytes` include the 4-byte shoal envelope header and must be
    /// a [`MessageKind::Swim`] message. Bad input is counted (`rejected_decode`,
    /// `rejected_foca`) and otherwise ignored; it never panics.
    pub fn handle_datagram(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]) {
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
        if header.message == Message::TurnUndead
            && self.is_untrusted_turn_undead(now_ms, &header.src)
        {
            self.counters.ignored_turn_undead += 1;
            return;
        }
        let filtered = self.drop_applied_updates(now_ms, &header, body, header_len);
        let body = filtered.as_deref().unwrap_or(body);
        if self.foca.handle_data(body, &mut self.runtime).is_err() {
            self.counters.rejected_foca += 1;
        }
        self.drain(now_ms);
    }

    /// Drops from a SWIM payload the piggybacked updates this member already applied in the
    /// last [`APPLIED_UPDATES_WINDOW_MS`]; `None` when nothing is dropped (pass `body` as is).
    ///
    /// SWIM dissemination is infection-style: every update reaches each member about
    /// `max_transmissions` times, and foca finds the member an update is about by a linear scan
    /// of its member list, so at 1,667 members the repeats cost most of a member's CPU when
    /// membership churns (a CPU-stalled peer is suspected and refutes every second). Applying an
    /// update twice is a no-op (a member's state only moves forward in (incarnation, state)
    /// order), so a repeat can be dropped before foca sees it. Only payloads foca would apply
    /// are filtered and remembered: addressed to our identity, from the identity we hold active.
    /// Updates about our own address are never dropped.
    fn drop_applied_updates(
        &mut self,
        now_ms: u64,
        header: &foca::Header<MemberId>,
        body: &[u8],
        header_len: usize,
    ) -> Option<Vec<u8>> {
        if header.message == Message::Broadcast || header.message == Message::Announce {
            return None;
        }
        let count = body.get(header_len..header_len + 2)?;
        let count = u16::from_be_bytes([count[0], count[1]]);
        // Most datagrams carry no update: compare identities only when there is something to drop.
        if count == 0
            || header.dst != self.identity
            || self.active.get(&header.src.node) != Some(&header.src)
        {
            return None;
        }
        // First find every update's bytes; a payload that does not decode goes to foca whole
        // (it refuses it) and nothing of it is remembered.
        let mut ranges = Vec::with_capacity(usize::from(count));
        let mut at = header_len + 2;
        for _ in 0..count {
            let (member, rest) = postcard::take_from_bytes::<RawMember<'_>>(&body[at..]).ok()?;
            let end = body.len() - rest.len();
            ranges.push((at, end, member.id.addr == self.identity.addr));
            at = end;
        }
        while let Some(&(t, key)) = self.applied_order.front() {
            let expired = t + APPLIED_UPDATES_WINDOW_MS <= now_ms;
            if !expired && self.applied_order.len() < MAX_APPLIED_UPDATES {
                break;
            }
            self.applied_order.pop_front();
            self.applied.remove(&key);
        }
        let mut kept = Vec::with_capacity(ranges.len());
        for (start, end, about_us) in ranges {
            if about_us {
                kept.push((start, end));
                continue;
            }
            let key = fnv1a(&body[start..end], FNV_OFFSET);
            if self.applied.insert(key) {
                self.applied_order.push_back((now_ms, key));
                kept.push((start, end));
            }
        }
        let dropped = usize::from(count) - kept.len();
        if dropped == 0 {
            return None;
        }
        self.counters.updates_deduplicated += dropped as u64;
        let mut out = Vec::with_capacity(body.len());
        out.extend_from_slice(&body[..header_len]);
        out.extend_from_slice(&(kept.len() as u16).to_be_bytes());
        for (start, end) in kept {
            out.extend_from_slice(&body[start..end]);
        }
        out.extend_from_slice(&body[at..]);
        Some(out)
    }

    /// Delivers a timer previously yielded by [`Membership::poll_timer`], at or after its
    /// deadline. Stale timers are counted in `stale_timers` and do nothing.
    pub fn handle_timer(&mut self, now_ms: u64, token: MembershipTimer) {
        match token.0 {
            TimerKind::Foca {
                epoch,
                timer,
                deadline_ms,
                postponed,
            } => {
                if epoch != self.timer_epoch && foca_token(&timer).is_some() {
                    self.counters.stale_timers += 1;
                    return;
                }
                // Lifeguard-style local health (Dadgar et al., "Lifeguard", DSN 2018): a timer
                // handled much later than due means this process was stalled (CPU starvation,
                // GC, swapping). Acks and refutations it has not processed yet may be queued,
                // so it must not declare anyone down on its own evidence right now.
                if now_ms.saturating_sub(deadline_ms) > self.config.probe_rtt_ms {
                    self.degraded_until_ms = now_ms + self.config.suspect_to_down_after_ms;
                }
                let degraded = now_ms < self.degraded_until_ms;
                if degraded
                    && postponed < MAX_DOWN_POSTPONES
                    && matches!(timer, Timer::ChangeSuspectToDown { .. })
                {
                    self.counters.downs_postponed += 1;
                    let at = now_ms + self.config.suspect_to_down_after_ms;
                    self.push_timer(
                        at,
                        TimerKind::Foca {
                            epoch,
                            timer,
                            deadline_ms: at,
                            postponed: postponed + 1,
                        },
                    );
                    self.drain(now_ms);
                    return;
                }
                if self.foca.handle_timer(timer, &mut self.runtime).is_err() {
                    self.counters.timer_errors += 1;
                }
            }
            TimerKind::JoinRetry { seq } => {
                if seq != self.join_seq {
                    self.counters.stale_timers += 1;
                    return;
                }
                self.join_armed = false;
                if !self.defunct && !self.connected {
                    self.announce_to_seeds();
                    self.arm_join_retry(now_ms);
                }
            }
        }
        self.drain(now_ms);
    }

    /// Seeds the member list directly with `members` as alive (no announce round trips), as if
    /// they had all been learned by gossip. For the simulator's initial state and for an agent
    /// restoring the last live members it persisted; the members still have to answer probes.
    /// Costs O(n^2) in foca (it keeps members in a list), once.
    pub fn bootstrap(&mut self, now_ms: u64, members: Vec<MemberId>) {
        if self.defunct {
            return;
        }
        let updates: Vec<Member<MemberId>> = members
            .into_iter()
            .filter(|m| m.addr != self.identity.addr)
            .map(Member::alive)
            .collect();
        let _ = self
            .foca
            .apply_many(updates.into_iter(), false, &mut self.runtime);
        self.drain(now_ms);
    }

    /// Leaves gracefully: tells a few members we are down and becomes defunct. Afterwards every
    /// input is still accepted but this member takes no part; restart with `boot + 1` to rejoin.
    pub fn leave(&mut self, now_ms: u64) {
        if self.defunct {
            return;
        }
        if self.foca.leave_cluster(&mut self.runtime).is_err() {
            self.counters.timer_errors += 1;
        }
        self.defunct = true;
        self.drain(now_ms);
    }

    /// Next datagram to send: `(destination, bytes)`, bytes including the envelope header and
    /// never longer than [`MembershipConfig::max_packet_bytes`].
    pub fn poll_transmit(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        let out = self.transmits.pop_front()?;
        self.counters.datagrams_out += 1;
        self.counters.bytes_out += out.1.len() as u64;
        Some(out)
    }

    /// Next timer to schedule: `(deadline_ms, token)`. Deliver with
    /// [`Membership::handle_timer`] at or after `deadline_ms`.
    pub fn poll_timer(&mut self) -> Option<(u64, MembershipTimer)> {
        self.timers.pop_front()
    }

    /// Next membership event, in the order they happened.
    pub fn poll_event(&mut self) -> Option<MembershipEvent> {
        self.events.pop_front()
    }

    /// Active members (alive or suspect) in our view, one identity per node, sorted by node id.
    /// Does not include ourselves.
    pub fn members(&self) -> impl Iterator<Item = &MemberId> {
        self.active.values()
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

    /// The member set hashed into [`MEMBER_BUCKETS`] buckets, for push-pull comparison with a
    /// peer: bucket `b` is the XOR of a 64-bit FNV-1a fingerprint of (node, address, boot) of
    /// every active member whose node id falls in bucket `b`, ourselves included, folded to 32
    /// bits (at most 5 bytes each on the wire; a false match needs a 2^-32 coincidence in a
    /// bucket that differs). Two members with the same view have equal buckets. O(1): the
    /// hashes are kept up to date on every change.
    pub fn member_buckets(&self) -> [u32; MEMBER_BUCKETS] {
        let mut full = self.member_buckets;
        full[member_bucket(&self.identity.node)] ^= member_fingerprint(&self.identity);
        full.map(|h| (h ^ (h >> 32)) as u32)
    }

    /// Our active identities (ourselves included) whose node ids fall in `buckets`, in node
    /// order: the list a push-pull exchange sends for the buckets that differed.
    pub fn members_in_buckets(&self, buckets: &[u16]) -> Vec<MemberId> {
        let wanted = |node: &NodeId| buckets.contains(&(member_bucket(node) as u16));
        let mut out: Vec<MemberId> = self
            .active
            .values()
            .filter(|m| wanted(&m.node))
            .cloned()
            .collect();
        if wanted(&self.identity.node) {
            let at = out.partition_point(|m| m.node < self.identity.node);
            out.insert(at, self.identity.clone());
        }
        out
    }

    /// Whether `theirs` (a peer's list for `buckets`, from [`Membership::members_in_buckets`])
    /// misses an identity we hold active, or holds an older one: then the peer should get our
    /// list back.
    pub fn peer_lacks(&self, buckets: &[u16], theirs: &[MemberId]) -> bool {
        let known: BTreeMap<&NodeId, Generation> =
            theirs.iter().map(|m| (&m.node, m.boot)).collect();
        self.members_in_buckets(buckets)
            .iter()
            .any(|m| known.get(&m.node).is_none_or(|boot| *boot < m.boot))
    }

    /// Push-pull (memberlist's periodic state exchange, Das et al.'s SWIM leaves it to
    /// rumour mongering): applies the identities of a peer's member list that are new to us as
    /// alive, so a member that missed the gossip of a join, a restart or a healed partition
    /// still learns it. An identity is skipped when it is ours, when we hold the same or a newer
    /// identity of its node active, or when we saw the same or a newer one go down (a list
    /// never brings a dead identity back). New identities then prove themselves by answering
    /// probes like any other. Nothing is re-gossiped: the next push-pull spreads it.
    /// Returns how many identities were applied.
    pub fn learn_members(&mut self, now_ms: u64, theirs: &[MemberId]) -> usize {
        if self.defunct {
            return 0;
        }
        let newer =
            |id: &MemberId, current: Option<&MemberId>| current.is_none_or(|c| id.boot > c.boot);
        let updates: Vec<Member<MemberId>> = theirs
            .iter()
            .filter(|id| id.node != self.identity.node && id.addr != self.identity.addr)
            .filter(|id| newer(id, self.active.get(&id.node)))
            .filter(|id| newer(id, self.down.get(&id.node).map(|(m, _)| m)))
            .cloned()
            .map(Member::alive)
            .collect();
        let n = updates.len();
        if n > 0 {
            self.counters.members_learned += n as u64;
            let _ = self
                .foca
                .apply_many(updates.into_iter(), false, &mut self.runtime);
            self.drain(now_ms);
        }
        n
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

    /// foca trusts `TurnUndead` even from a member it considers down; see the module docs.
    ///
    /// The guard protects healthy members from one member that was isolated alone: it considers
    /// everyone down, and would otherwise make every healthy member renew. It must not hold
    /// when *we* hold a large part of the cluster as down (a 50/50 partition healing): then
    /// both sides ignore each other for ever. Past `PARTITION_DOWN_FRACTION` of the known
    /// members down, a `TurnUndead` from a down member is trusted and we renew; the other side
    /// does the same, and both halves re-merge with new boot generations.
    ///
    /// The partition verdict is sticky for `PARTITION_GRACE_MS`: while the halves re-merge,
    /// the fraction of down members falls below the threshold long before every member has
    /// renewed, and a member that stopped trusting too early would stay down for the other
    /// half for ever.
    fn is_untrusted_turn_undead(&mut self, now_ms: u64, src: &MemberId) -> bool {
        let known = self.active.len() + self.down.len();
        if self.down.len() * PARTITION_DOWN_DIVISOR >= known.max(1) {
            self.partition_seen_ms = Some(now_ms);
        }
        let partitioned = self
            .partition_seen_ms
            .is_some_and(|t| now_ms.saturating_sub(t) <= PARTITION_GRACE_MS);
        self.foca.num_members() > 0
            && !partitioned
            && !self.foca.iter_members().any(|m| m.id() == src)
    }

    fn announce_to_seeds(&mut self) {
        for seed in self.seeds.clone() {
            // Only fails on encode errors, which a fixed-size identity cannot hit.
            let _ = self
                .foca
                .announce(MemberId::placeholder(seed), &mut self.runtime);
        }
    }

    fn arm_join_retry(&mut self, now_ms: u64) {
        if self.join_armed || self.seeds.is_empty() || self.defunct {
            return;
        }
        self.join_seq += 1;
        self.join_armed = true;
        let deadline = now_ms.saturating_add(self.config.join_retry_ms);
        self.push_timer(deadline, TimerKind::JoinRetry { seq: self.join_seq });
    }

    fn push_timer(&mut self, deadline_ms: u64, kind: TimerKind) {
        if self.timers.len() >= self.config.max_pending_timers {
            self.counters.timer_overflow += 1;
            return;
        }
        self.timers.push_back((deadline_ms, MembershipTimer(kind)));
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
        for _pass in 0..8 {
            self.drain_runtime(now_ms);
            if !self.declare_down.is_empty() {
                let downs: Vec<Member<MemberId>> =
                    self.declare_down.drain(..).map(Member::down).collect();
                let _ = self
                    .foca
                    .apply_many(downs.into_iter(), true, &mut self.runtime);
            }
            if self.runtime.backlog() == 0 {
                break;
            }
        }
        debug_assert_eq!(self.runtime.backlog(), 0, "runtime not drained");
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
            self.enqueue_datagram(to.addr, &data);
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
            };
            self.push_timer(deadline_ms, kind);
        }
        for notification in notifications {
            self.on_notification(now_ms, notification);
        }
    }

    /// foca renewed our identity after the cluster declared us down. Its state was formed
    /// while we were cut off (suspicions and downs of healthy members, queued for gossip), so
    /// we replace it with a fresh instance that keeps only our current active view, with no
    /// pending updates, and then announce the new identity.
    fn rebuild_after_rejoin(&mut self, new: &MemberId) {
        let mix = new.boot.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let rng = ChaCha8Rng::seed_from_u64(self.seed ^ mix);
        self.foca = Foca::new(new.clone(), self.foca_config.clone(), rng, PostcardCodec);
        // The fresh instance has applied nothing yet.
        self.applied.clear();
        self.applied_order.clear();
        self.timer_epoch += 1;
        self.last_foca_token = None;
        let view: Vec<Member<MemberId>> =
            self.active.values().cloned().map(Member::alive).collect();
        let _ = self
            .foca
            .apply_many(view.into_iter(), false, &mut self.runtime);
        // Remember who we held as down, without spreading it: foca's periodic announce to down
        // members then keeps knocking on the other half of a healed partition, which is how both
        // halves learn each other's renewed identities (a fresh instance that forgot them
        // would never talk across again).
        // Only a member that still sees a real part of the cluster (one side of a split: at
        // least half as many active as down) does this; a member that was isolated alone, or
        // nearly alone, sees almost everyone as down, and carrying that would make it tell
        // every healthy member "you are down" once they accept its renewed identity.
        let downs: Vec<Member<MemberId>> = if self.active.len() * 2 < self.down.len() {
            Vec::new()
        } else {
            self.down
                .values()
                .map(|(m, _)| Member::down(m.clone()))
                .collect()
        };
        let _ = self
            .foca
            .apply_many(downs.into_iter(), false, &mut self.runtime);
        let _ = self.foca.gossip(&mut self.runtime);
        self.announce_to_seeds();
    }

    fn enqueue_datagram(&mut self, to: SocketAddr, body: &[u8]) {
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
                if self.foca.iter_members().any(|m| m.id() == &new) {
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
        self.member_buckets[member_bucket(&id.node)] ^= member_fingerprint(&id);
        self.active.insert(id.node.clone(), id.clone());
        self.push_event(MembershipEvent::Up(id));
    }

    fn member_down(&mut self, now_ms: u64, id: &MemberId) {
        if self.active.get(&id.node) != Some(id) {
            return;
        }
        self.active.remove(&id.node);
        self.member_buckets[member_bucket(&id.node)] ^= member_fingerprint(id);
        if self.down.len() >= self.config.max_tracked_down {
            let oldest = self
                .down
                .iter()
                .min_by_key(|(node, (_, since))| (*since, (*node).clone()))
                .map(|(node, _)| node.clone());
            if let Some(node) = oldest {
                self.down.remove(&node);
                self.counters.down_evicted += 1;
            }
        }
        self.down.insert(id.node.clone(), (id.clone(), now_ms));
        self.push_event(MembershipEvent::Down(id.clone()));
    }
}

/// The wire layout of `foca::Member<MemberId>` under foca's `PostcardCodec`, borrowed: finds
/// an update's length and address without allocating (the `membership` unit tests check it
/// against foca's own encoding).
#[derive(Deserialize)]
struct RawMember<'a> {
    #[serde(borrow)]
    id: RawMemberId<'a>,
    _incarnation: foca::Incarnation,
    /// `foca::State`, an enum: postcard writes its variant index as a varint.
    _state: u32,
}

/// The wire layout of [`MemberId`], borrowed.
#[derive(Deserialize)]
struct RawMemberId<'a> {
    _node: &'a str,
    addr: SocketAddr,
    _boot: u64,
}

/// Bucket of a node's identities in [`Membership::member_buckets`] (all identities of one node
/// share a bucket, so a restart changes one bucket).
fn member_bucket(node: &NodeId) -> usize {
    (fnv1a(node.as_str().as_bytes(), FNV_OFFSET) % MEMBER_BUCKETS as u64) as usize
}

/// 64-bit FNV-1a over (node, ip, port, boot).
fn member_fingerprint(id: &MemberId) -> u64 {
    let mut h = fnv1a(id.node.as_str().as_bytes(), FNV_OFFSET);
    h = match id.addr.ip() {
        std::net::IpAddr::V4(ip) => fnv1a(&ip.octets(), h),
        std::net::IpAddr::V6(ip) => fnv1a(&ip.octets(), h),
    };
    h = fnv1a(&id.addr.port().to_le_bytes(), h);
    fnv1a(&id.boot.0.to_le_bytes(), h)
}

/// FNV-1a 64-bit offset basis.
pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a 64-bit (Fowler, Noll, Vo) over `bytes`, continuing from `h`.
pub(crate) fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The foca token a timer carries, if any (`RemoveDown` carries none and is never stale).
fn foca_token(timer: &Timer<MemberId>) -> Option<u8> {
    match timer {
        Timer::ProbeRandomMember(t)
        | Timer::PeriodicAnnounce(t)
        | Timer::PeriodicAnnounceDown(t)
        | Timer::PeriodicGossip(t) => Some(*t),
        Timer::SendIndirectProbe { token, .. } | Timer::ChangeSuspectToDown { token, .. } => {
            Some(*token)
        }
        Timer::RemoveDown(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_member_reads_foca_encoded_updates_to_the_byte() {
        let id = MemberId {
            node: NodeId::new("node-17.zone-a").expect("valid"),
            addr: "[2001:db8::7]:7946".parse().expect("addr"),
            boot: Generation(300),
        };
        for member in [
            Member::alive(id.clone()),
            Member::new(id.clone(), 40_000, State::Suspect),
            Member::down(MemberId {
                addr: "10.1.2.3:7946".parse().expect("addr"),
                ..id.clone()
            }),
        ] {
            let mut bytes = Vec::new();
            foca::Codec::encode_member(&mut PostcardCodec, &member, &mut bytes).expect("encodes");
            bytes.extend_from_slice(&[0xAB, 0xCD]);
            let (raw, rest) = postcard::take_from_bytes::<RawMember<'_>>(&bytes).expect("reads");
            assert_eq!(rest, &[0xAB, 0xCD], "consumed exactly the update");
            assert_eq!(raw.id.addr, member.id().addr);
            assert_eq!(raw.id._node, member.id().node.as_str());
            assert_eq!(raw.id._boot, member.id().boot.0);
            assert_eq!(raw._incarnation, member.incarnation());
        }
    }
}
