//! The core's vocabulary with its driver (sans-IO, after `quinn-proto`): what goes in
//! ([`Command`]s) and what comes out ([`Transmit`]s on a [`Channel`], [`MeshEvent`]s,
//! [`Refusal`]s), and what the core's timers are for ([`MeshTimer`]).

use std::net::SocketAddr;
use std::sync::Arc;

use shoal_proto::{
    Generation, HealthStatus, InstanceId, ServiceKey, SignedHealth, SignedLifecycle,
    TransitionReason,
};

use crate::membership::{MembershipEvent, MembershipTimer};

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

/// What one of the core's timers is for. The core keeps its timers itself (see
/// [`Mesh::poll_timeout`](super::Mesh::poll_timeout)); this is what
/// [`Mesh::pending_timers`](super::Mesh::pending_timers) shows of them.
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
    /// Put addresses a previous process persisted (from
    /// [`Membership::known_addresses`](crate::membership::Membership::known_addresses)) back
    /// into the membership's address book, which keeps knocking on them with backoff.
    RestoreKnown {
        /// The persisted addresses.
        addresses: Vec<crate::membership::KnownAddress>,
    },
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

/// Why a command was refused, returned by [`Mesh::handle_command`](super::Mesh::handle_command)
/// (and counted in [`MeshCounters::refused`](super::MeshCounters::refused), once per refused
/// record).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a refused command changed nothing the caller asked for"]
pub enum Refusal {
    /// Health for an instance the catalog does not bind to this node (or another generation).
    NotOwnInstance {
        /// Key.
        key: ServiceKey,
        /// Instance.
        instance: InstanceId,
    },
    /// Published lifecycle records that did not merge (bad signature, conflict, over the
    /// catalog's cap...): each one's instance and the merge outcome's label. Every other
    /// record of the command was applied (or was a duplicate or stale, which is not refused).
    Publish {
        /// `(instance, MergeOutcome label)` per refused record, in command order; never empty.
        refused: Vec<(InstanceId, &'static str)>,
    },
    /// The health record this node signed did not merge (the merge outcome's label).
    Health {
        /// Instance.
        instance: InstanceId,
        /// The `MergeOutcome` label.
        outcome: &'static str,
    },
}

impl Refusal {
    /// A stable label for metrics: `not_own_instance`, `publish` or `health`.
    pub fn as_label(&self) -> &'static str {
        match self {
            Refusal::NotOwnInstance { .. } => "not_own_instance",
            Refusal::Publish { .. } => "publish",
            Refusal::Health { .. } => "health",
        }
    }
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
}
