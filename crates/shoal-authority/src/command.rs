//! Commands: the entries of the authority's Raft log, and the context they are applied in.

use serde::{Deserialize, Serialize};
use shoal_proto::{
    EndpointSpec, Generation, InstanceId, LifecycleState, NodeId, NodeKey, ServiceKey,
    ServicePolicy, SignedGlobalPolicy, SigningKey, TransitionReason,
};

use crate::caller::Caller;

/// One authority command: the payload of one Raft log entry.
///
/// Times inside commands (`at_ms`, `now_ms`) are readings of the **proposing leader's monotonic
/// clock** in milliseconds, taken before proposing; the state machine never reads a clock
/// itself, so every replica (and the simulator) computes the same result from the same log.
/// Readings of two different leaders are not comparable; [`AuthorityCommand::LeaderTakeover`]
/// rebases the lease bookkeeping onto the new leader's clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthorityCommand {
    /// Admit `instance` of `key` as a new boot generation in STARTING, bound to a node.
    ///
    /// The generation is the Raft log index of this command. If the instance id is already
    /// bound, the new generation supersedes the old one (a restart, or a move by an
    /// orchestrator): agents replace the old generation's record with the new one.
    Register {
        /// Who asks.
        caller: Caller,
        /// Catalog key.
        key: ServiceKey,
        /// Stable instance id.
        instance: InstanceId,
        /// Node to bind to. `None` for a node caller (binds to itself); required for
        /// orchestrators and operators, who register on behalf of a node.
        on_node: Option<NodeId>,
        /// Address and routing metadata.
        endpoint: EndpointSpec,
        /// How long, in milliseconds, the owner node may stay down before the lease safety net
        /// expires the record: `MIN_LEASE_MS..=MAX_LEASE_MS`.
        lease_ms: u32,
    },
    /// Move the current generation of an instance to another lifecycle state: READY
    /// (`ReadinessPassed`), DRAINING (`DrainRequested`), back to READY (`DrainCancelled`), or
    /// EXPIRED (`Deregistered`). `LeaseExpired` is reserved for the authority.
    Transition {
        /// Who asks.
        caller: Caller,
        /// Catalog key.
        key: ServiceKey,
        /// Stable instance id.
        instance: InstanceId,
        /// The generation the caller believes is current. Anything else is refused, so a
        /// delayed request from an old process never touches its replacement.
        generation: Generation,
        /// Requested state.
        to: LifecycleState,
        /// Why; must match a row of `shoal_catalog::lifecycle::LEGAL_TRANSITIONS`.
        reason: TransitionReason,
    },
    /// The leader's mesh view declared `node` down at `at_ms` (leader monotonic ms). Starts the
    /// lease clock of every record the node owns. Emits nothing.
    NodeDown {
        /// The node.
        node: NodeId,
        /// When the mesh declared it down, leader monotonic ms.
        at_ms: u64,
    },
    /// The leader's mesh view sees `node` alive again: its lease clocks stop. Emits nothing.
    NodeUp {
        /// The node.
        node: NodeId,
    },
    /// The lease safety net: expire every non-expired record whose owner node has been down
    /// for at least the record's lease at `now_ms`, in one batch of at most
    /// [`crate::MAX_EXPIRE_BATCH`] records, each with its own revision. It is also the **lease
    /// checkpoint**: every down node's downtime so far is recorded in the state, so a later
    /// leader resumes it (the leader proposes one every `lease_checkpoint_ms` while nodes are
    /// down, like etcd's lease checkpoints, etcd-io/etcd#9888).
    ExpireLeases {
        /// Leader monotonic ms when the batch was proposed.
        now_ms: u64,
    },
    /// A new leader's first command: rebases every down node's lease clock onto this leader's
    /// clock (see [`crate::AuthorityState`]'s "Leases and leader changes"). Downtime already
    /// checkpointed is kept; `credit` adds what this leader's own clock measured since it
    /// applied the latest checkpoint, so leader churn does not extend leases.
    LeaderTakeover {
        /// The new leader's monotonic ms at takeover.
        now_ms: u64,
        /// Time elapsed on the proposer's clock since it applied checkpoint `checkpoint`;
        /// `None` (or a checkpoint that is not the latest when applied) credits nothing.
        credit: Option<LeaseCredit>,
    },
    /// Bind the calling node's health-signing key (node callers only: the node is the one the
    /// caller's certificate names, so nobody binds a key for another node). Every record the
    /// authority signs for the node's instances carries the bound key
    /// (`LifecycleRecord::owner_key`). A key different from the stored one (the node's data
    /// directory was replaced, or it had none yet) re-issues every live instance of the node
    /// bound to the new key (reason `NodeKeyChanged`); the same key again emits nothing.
    /// Refused for a revoked node, and for a key that was revoked.
    BindNodeKey {
        /// Who asks; must be [`Caller::Node`].
        caller: Caller,
        /// The node's ed25519 public key.
        key: NodeKey,
    },
    /// Revoke `node` (operators only): store "no key" for it, refuse its bindings, requests
    /// and registrations until it is readmitted, and expire every live instance it owns
    /// (reason `NodeRevoked`), so nothing signed by it verifies anywhere. Its last key stays
    /// refused for good: a readmitted node must present a new one.
    RevokeNode {
        /// Who asks; must be [`Caller::Operator`].
        caller: Caller,
        /// The node.
        node: NodeId,
    },
    /// Lift a revocation (operators only): `node` may bind a new key and register again.
    ReadmitNode {
        /// Who asks; must be [`Caller::Operator`].
        caller: Caller,
        /// The node.
        node: NodeId,
    },
    /// Store the global policy document (docs/adr/0013-global-policy-and-failover.md). The
    /// replica that proposes it has verified its signature against the global policy keys it
    /// trusts (the signature is the authorisation, whoever relays it); the state keeps it
    /// only when its version is above the held one, so replays and late older copies are
    /// refused and audited.
    PutGlobalPolicy {
        /// Who relayed it: an operator tool, or (when a replica pulled a newer document from
        /// another region's authority) the proposing replica's own node identity.
        caller: Caller,
        /// The signed document.
        signed: SignedGlobalPolicy,
    },
    /// Store (replace) the signed cross-region policy of `key`. Operators only.
    PutPolicy {
        /// Who asks.
        caller: Caller,
        /// Service the policy applies to.
        key: ServiceKey,
        /// The document.
        policy: ServicePolicy,
    },
}

/// A new leader's measurement of the time since the latest lease checkpoint, on its own
/// monotonic clock.
///
/// The proposer reads `checkpoint` ([`crate::AuthorityState::lease_checkpoint`]) from its
/// applied state and `elapsed_ms` = its clock now minus its clock when it applied that
/// checkpoint. Applying happens after the checkpoint was proposed, so `elapsed_ms` never
/// exceeds the real time since the checkpoint: crediting it never expires anything early.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseCredit {
    /// The checkpoint counter the measurement refers to.
    pub checkpoint: u64,
    /// Proposer-clock ms since it applied that checkpoint.
    pub elapsed_ms: u64,
}

/// What the Raft layer knows about the entry being applied, and the key to sign with.
#[derive(Clone, Copy, Debug)]
pub struct ApplyContext<'a> {
    /// Raft log index of the entry. Strictly increasing across applies; assigns generations
    /// (never a clock) so generations are monotonic per instance id on every replica.
    pub log_index: u64,
    /// Leader wall-clock time of the commit in Unix ms. Informational only: copied into
    /// `committed_at_ms` of emitted records (drain propagation is measured from it); never
    /// used for ordering or leases.
    pub committed_at_ms: u64,
    /// The region's authority key. Every replica signs with it: ed25519 signing is
    /// deterministic, so all replicas emit byte-identical records.
    pub signing_key: &'a SigningKey,
}
