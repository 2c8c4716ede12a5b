//! Why a command was refused.
//!
//! A refusal is an *API* outcome, not a fault: it is deterministic (every replica refuses the
//! same command the same way), it is recorded in the audit log, and it leaves every other part
//! of the state untouched: no revision is consumed, no record is emitted, no binding changes.

use serde::{Deserialize, Serialize};
use shoal_proto::{Generation, LifecycleState, NodeId, PolicyError, TransitionReason};

/// Why the authority refused a command. Only the audit log (and the last applied log index)
/// changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The instance is bound to another node than the calling node's (or, on register, a live
    /// binding of that instance id belongs to another node).
    #[error("instance is bound to node {bound_to}, not to the caller")]
    NotOwner {
        /// The node the instance is bound to.
        bound_to: NodeId,
    },
    /// No instance with this (service key, instance id) was ever admitted here.
    #[error("unknown instance")]
    UnknownInstance,
    /// The request names an older generation than the current one: a delayed request from a
    /// replaced process. It must never touch (or resurrect) the replacement.
    #[error("generation {requested} is stale; current is {current}")]
    StaleGeneration {
        /// The generation the request named.
        requested: Generation,
        /// The current generation.
        current: Generation,
    },
    /// The request names a generation newer than any this authority issued for the instance.
    #[error("generation {requested} was never issued; current is {current}")]
    UnknownGeneration {
        /// The generation the request named.
        requested: Generation,
        /// The current generation.
        current: Generation,
    },
    /// The lifecycle table (`shoal_catalog::check_transition`) does not allow this transition.
    #[error("illegal transition {from:?} -> {to:?} ({reason:?})")]
    IllegalTransition {
        /// Current state (`None`: not registered).
        from: Option<LifecycleState>,
        /// Requested state.
        to: LifecycleState,
        /// Reason given.
        reason: TransitionReason,
    },
    /// The instance is already in the requested state (e.g. a retried drain whose first
    /// attempt committed). Nothing to do; the current record is what the caller wants.
    #[error("already {0:?}")]
    AlreadyInState(LifecycleState),
    /// The current generation is EXPIRED (terminal); only a new registration can bring the
    /// instance id back, as a new generation.
    #[error("the instance generation is expired")]
    Expired,
    /// The command is malformed or out of bounds.
    #[error("invalid request: {0}")]
    InvalidRequest(InvalidRequest),
    /// The caller's identity does not allow this command for this service key (orchestrator
    /// outside its scope, a node registering on another node, a non-operator writing policy).
    #[error("caller is not allowed to do this")]
    NotAllowed,
    /// The node was revoked by an operator (or the key presented is one that was revoked):
    /// nothing from it is admitted until it is readmitted with a new key.
    #[error("node {node} is revoked")]
    NodeRevoked {
        /// The node.
        node: NodeId,
    },
    /// A bound on the state would be exceeded (e.g. [`crate::MAX_BINDINGS`]). Counted in the
    /// audit log; nothing grows past its limit.
    #[error("capacity of {limit} exhausted")]
    CapacityExhausted {
        /// The limit that would be exceeded.
        limit: u64,
    },
}

/// The ways a command can be malformed. Part of [`Refusal::InvalidRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum InvalidRequest {
    /// The endpoint weight is outside `shoal_proto::record::MIN_WEIGHT..=MAX_WEIGHT`.
    #[error("endpoint weight {weight} is out of range")]
    Weight {
        /// The weight offered.
        weight: u32,
    },
    /// The lease is outside `MIN_LEASE_MS..=MAX_LEASE_MS`.
    #[error("lease of {lease_ms} ms is out of range")]
    LeaseOutOfRange {
        /// The lease offered.
        lease_ms: u32,
    },
    /// An orchestrator or operator registration did not name the node to bind to.
    #[error("register on behalf of a node must name the node")]
    MissingNode,
    /// The orchestrator identity carries more than [`crate::MAX_SCOPES`] scope entries.
    #[error("{count} scope entries exceed the limit")]
    TooManyScopes {
        /// How many were offered.
        count: usize,
    },
    /// The reason is reserved for the authority itself (`LeaseExpired`) or for registration.
    #[error("reason {0:?} cannot be requested")]
    ReservedReason(TransitionReason),
    /// The policy document is out of bounds.
    #[error(transparent)]
    Policy(PolicyError),
    /// The node key is not a valid ed25519 public key.
    #[error("node key is not a valid ed25519 public key")]
    NodeKey,
    /// A global policy document whose version is not above the held one (a replay, or an
    /// older document arriving late from another region).
    #[error("global policy version {offered} is not above the held version {held}")]
    GlobalPolicyVersion {
        /// Version offered.
        offered: u64,
        /// Version held.
        held: u64,
    },
    /// The global policy document is out of bounds.
    #[error("global policy: {0}")]
    GlobalPolicy(String),
    /// The log index did not increase: the driver applied an entry twice or out of order.
    #[error("log index {log_index} is not above the last applied {last_applied}")]
    LogIndexNotIncreasing {
        /// The index offered.
        log_index: u64,
        /// The last index applied.
        last_applied: u64,
    },
}

impl From<InvalidRequest> for Refusal {
    fn from(e: InvalidRequest) -> Self {
        Self::InvalidRequest(e)
    }
}
