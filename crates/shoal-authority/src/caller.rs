//! Who is asking: the authenticated identity a command is proposed on behalf of.
//!
//! The state machine does not authenticate anyone. The RPC layer maps the peer's mTLS
//! certificate (workload identity) to a [`Caller`] *before* proposing the command to Raft, so
//! every replica applies the same, already-authenticated identity. The state machine then
//! decides what that identity may do (authorisation), deterministically.

use serde::{Deserialize, Serialize};
use shoal_proto::{Name, NodeId, ServiceKey, TransitionSource};

/// Most scope entries one orchestrator identity may carry (bounds the command size and the cost
/// of a scope check).
pub const MAX_SCOPES: usize = 256;

/// One thing an orchestrator identity is allowed to manage.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scope {
    /// Every service key in this namespace (e.g. all of `staging`).
    Namespace(Name),
    /// Exactly this service key.
    Service(ServiceKey),
}

impl Scope {
    /// True when `key` falls inside this scope.
    pub fn covers(&self, key: &ServiceKey) -> bool {
        match self {
            Self::Namespace(ns) => &key.namespace == ns,
            Self::Service(k) => k == key,
        }
    }
}

/// The authenticated identity behind a command.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Caller {
    /// A node agent (identity from its node certificate). May register instances on itself and
    /// change only instances bound to itself, for any service key (the agent vouches for the
    /// local workload's identity before forwarding).
    Node(NodeId),
    /// An orchestrator controller (e.g. a Kubernetes controller). May register instances on a
    /// node it names, move an instance id to another node, and change instances of the service
    /// keys its scope covers, on any node.
    Orchestrator {
        /// The controller's identity name, for the audit log.
        name: Name,
        /// What it may manage; at most [`MAX_SCOPES`] entries, empty = nothing.
        scope: Vec<Scope>,
    },
    /// A human operator (break-glass / admin CLI). May do anything, including writing service
    /// policy, which no other identity may.
    Operator,
}

impl Caller {
    /// True when this caller may manage instances of `key` regardless of which node they are
    /// bound to (orchestrators inside their scope, operators always). Node callers are checked
    /// per binding instead, so this is `false` for them.
    pub fn manages_service(&self, key: &ServiceKey) -> bool {
        match self {
            Self::Node(_) => false,
            Self::Orchestrator { scope, .. } => scope.iter().any(|s| s.covers(key)),
            Self::Operator => true,
        }
    }

    /// The `source` field written into records this caller causes. Operator actions are
    /// performed by the authority on the operator's behalf, hence
    /// [`TransitionSource::Authority`] (the audit log names the operator).
    pub fn source(&self) -> TransitionSource {
        match self {
            Self::Node(_) => TransitionSource::OwnerAgent,
            Self::Orchestrator { .. } => TransitionSource::Orchestrator,
            Self::Operator => TransitionSource::Authority,
        }
    }

    /// The compact identity stored in the audit log (without the orchestrator's scope list).
    pub fn id(&self) -> CallerId {
        match self {
            Self::Node(n) => CallerId::Node(n.clone()),
            Self::Orchestrator { name, .. } => CallerId::Orchestrator(name.clone()),
            Self::Operator => CallerId::Operator,
        }
    }
}

/// Who an audit entry is attributed to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CallerId {
    /// A node agent.
    Node(NodeId),
    /// An orchestrator controller, by name.
    Orchestrator(Name),
    /// A human operator.
    Operator,
    /// The authority itself: mesh-observed liveness, the lease safety net, leader takeover.
    Authority,
}
