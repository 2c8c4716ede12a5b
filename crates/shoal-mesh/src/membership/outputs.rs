//! What membership reports to its driver: [`MembershipEvent`]s (changes of this member's view,
//! drained with `Membership::poll_event`) and [`MembershipCounters`] (counters and gauges for
//! metrics; every bounded queue's overflow is counted here, `docs/invariants.md` invariant 8).

use super::MemberId;

// Named by intra-doc links only.
#[cfg(doc)]
use super::Membership;

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
    /// Other foca calls that returned an error: `apply_many` (bootstrap, learned push-pull
    /// members, node-level conflicts, the rebuild after a rejoin), `announce`, `gossip` and
    /// `leave_cluster`. None is expected: these fail only on encoding errors or an update
    /// about ourselves, so a non-zero value points at an integration bug.
    pub foca_errors: u64,
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
    /// Of those, identities our down list still held but foca no longer did (a rebuild after a
    /// renewal did not carry them): a live member would otherwise stay down here for good.
    pub downs_relearned: u64,
    /// `TurnUndead` notices sent to members foca holds down that a peer's member list showed
    /// alive (contested downs, `membership/partition.rs`), at most one per member per 10 s.
    pub contested_down_notices: u64,
    /// Suspect-to-down decisions withheld because most of our own probes failed (we are the
    /// likely problem; `membership/accuser.rs`).
    pub downs_withheld: u64,
    /// Withheld suspect-to-down decisions dropped once our probes succeeded again (formed on
    /// evidence we no longer trust).
    pub downs_voided: u64,
    /// `TurnUndead` messages not acted on (no renewal) because most of our own probes failed.
    pub renewals_withheld: u64,
    /// Piggybacked `Down` updates dropped before foca: refuted (stale incarnation) accusations,
    /// or our own down while our probes fail.
    pub downs_dropped: u64,
    /// Address-book entries forgotten (or refused) because the book was full.
    pub known_evicted: u64,
    /// Announces sent by the reconnect tick to addresses of the book.
    pub reconnect_announces: u64,
    /// Gauge: members alive in our view.
    pub members_alive: u64,
    /// Gauge: members suspect in our view.
    pub members_suspect: u64,
    /// Gauge: down identities foca still remembers.
    pub members_down: u64,
    /// Gauge: membership updates waiting to be piggybacked.
    pub updates_backlog: u64,
}
