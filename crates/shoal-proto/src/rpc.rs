//! Agent <-> region authority RPC, carried as stream messages of kind
//! [`MessageKind::AuthorityRequest`](crate::envelope::MessageKind::AuthorityRequest) /
//! [`MessageKind::AuthorityReply`](crate::envelope::MessageKind::AuthorityReply) over the same
//! mutual-TLS QUIC transport the mesh uses. The caller's identity is **not** in the request: the
//! authority takes it from the peer certificate (a node may only act for its own instances).
//!
//! Requests are idempotent by `(caller, request_id)` where it matters: a retried `Transition`
//! to the state the instance is already in is answered with the existing record.

use serde::{Deserialize, Serialize};

use crate::ids::{Generation, InstanceId, NodeId, Revision, ServiceKey};
use crate::policy::ServicePolicy;
use crate::record::{EndpointSpec, LifecycleState, TransitionReason};
use crate::sign::{SignedLifecycle, SignedPolicy};

/// One request from an agent (or an operator tool) to the authority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorityRequest {
    /// Chosen by the caller; echoed in the reply.
    pub request_id: u64,
    /// What is asked.
    pub body: AuthorityRequestBody,
}

/// What an agent may ask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthorityRequestBody {
    /// Admit an instance on the caller's node (or, for an orchestrator, on `on_node`) as a new
    /// boot generation in STARTING.
    Register {
        /// Catalog key.
        key: ServiceKey,
        /// Stable instance id.
        instance: InstanceId,
        /// Node to bind to; `None` binds to the calling node.
        on_node: Option<NodeId>,
        /// Address and metadata.
        endpoint: EndpointSpec,
        /// Lease in ms (how long the owner node may stay down before expiry).
        lease_ms: u32,
    },
    /// Move the named generation of an instance to `to` for `reason`.
    Transition {
        /// Catalog key.
        key: ServiceKey,
        /// Instance.
        instance: InstanceId,
        /// The generation the caller believes is current.
        generation: Generation,
        /// Requested state.
        to: LifecycleState,
        /// Why.
        reason: TransitionReason,
    },
    /// Read the signed policy of a service.
    GetPolicy {
        /// Catalog key.
        key: ServiceKey,
    },
    /// Store a policy (operators only).
    PutPolicy {
        /// Catalog key.
        key: ServiceKey,
        /// The document.
        policy: ServicePolicy,
    },
    /// Leader, term, revision, members.
    Status,
}

/// The authority's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorityReply {
    /// Echo of the request's id.
    pub request_id: u64,
    /// Outcome.
    pub result: Result<AuthorityOk, AuthorityError>,
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthorityOk {
    /// The write committed; these signed records resulted (inject them into the mesh).
    Committed {
        /// Signed lifecycle records, in revision order.
        records: Vec<SignedLifecycle>,
    },
    /// A policy read or write.
    Policy(Option<SignedPolicy>),
    /// Status of the replica that answered.
    Status(AuthorityStatus),
}

/// Replica status, for `shoal authority status` and agents' diagnostics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorityStatus {
    /// Node id of this replica.
    pub node: NodeId,
    /// Node id of the leader this replica knows, if any.
    pub leader: Option<NodeId>,
    /// Current Raft term.
    pub term: u64,
    /// Last applied Raft log index.
    pub applied_index: u64,
    /// Region revision head.
    pub revision: Revision,
    /// Voter node ids.
    pub members: Vec<NodeId>,
    /// Id of the cluster incarnation a restore started (`None`: never restored).
    pub cluster_id: Option<String>,
}

/// Why a request failed. The authority state is unchanged on every variant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AuthorityError {
    /// The region has no quorum: writes are refused (reads of the agent's cache keep working).
    #[error("no quorum: the region authority cannot commit writes")]
    NoQuorum,
    /// This replica is not the leader; retry at the leader (address as `ip:port` if known).
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        /// The leader's RPC address, if known.
        leader: Option<String>,
    },
    /// The rules refused the request (not owner, stale generation, illegal transition...).
    #[error("refused: {reason}")]
    Refused {
        /// Stable machine-readable code, e.g. `"stale_generation"`.
        code: String,
        /// Human-readable reason.
        reason: String,
    },
    /// The request was malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
}
