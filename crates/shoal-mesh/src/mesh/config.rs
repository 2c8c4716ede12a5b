//! [`MeshConfig`]: the tuning of dissemination, coalescing, anti-entropy and the output bounds
//! of one [`Mesh`](super::Mesh) (defaults for a region of `n` members in
//! [`MeshConfig::for_cluster_size`]; the budget behind them is in `docs/slo-budget.md`).

use shoal_proto::envelope::MAX_STREAM_MESSAGE_BYTES;

use crate::membership::MembershipConfig;

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
    /// Emit [`MeshEvent::LifecycleApplied`](super::MeshEvent::LifecycleApplied) /
    /// [`MeshEvent::HealthApplied`](super::MeshEvent::HealthApplied) for every applied record
    /// (the simulator and the agent's watch use them).
    pub record_events: bool,
    /// Deadline-driven cores ([`Mesh::poll_timeout`](super::Mesh::poll_timeout)) do not wake
    /// their driver for timers that would fire with nothing to do (a SWIM gossip round with no
    /// update, an IHAVE tick with no changed head, the indirect stage of an acked probe, a
    /// reconnect tick with nothing due); they handle them at the next input instead, with the
    /// same outputs as firing them on time (ADR 0021, addendum of issue 19 session 10). `false`
    /// fires every timer. Drivers that take tokens (the simulator) always get every timer.
    pub park_idle_timers: bool,
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
            park_idle_timers: true,
        }
    }
}
