//! One request off the wire ([`AuthorityRequestBody`]) as the state machine sees it.
//!
//! The replicated authority (`shoal-authority-server`, `server/rpc.rs`) and the agent's
//! single-process development authority (`shoal-agent`, `dev_authority.rs`) both answer the same
//! requests. They share this module so they cannot drift: who the caller is
//! ([`Caller::of_certificate`]), which requests become a command and which are reads answered
//! outside the log ([`route`]), the stable code of a refusal ([`Refusal::code`]), and the answer
//! to a retried transition that already committed ([`AuthorityState::retry_answer`]).

use std::collections::BTreeSet;

use shoal_proto::rpc::{AuthorityRequestBody, MembersOp};
use shoal_proto::{InstanceId, NodeId, ServiceKey, SignedLifecycle};

use crate::{AuthorityCommand, AuthorityState, Caller, Refusal};

/// Prefix of the node ids whose certificates are operators' (`shoal authority cert --operator`).
pub const OPERATOR_PREFIX: &str = "operator-";

impl Caller {
    /// The caller a peer certificate naming `node` stands for: an operator when its id starts
    /// with [`OPERATOR_PREFIX`] or is listed in `operators` (the replica's configured operator
    /// ids), otherwise that node's agent.
    pub fn of_certificate(node: &NodeId, operators: &BTreeSet<String>) -> Self {
        let id = node.as_str();
        if id.starts_with(OPERATOR_PREFIX) || operators.contains(id) {
            Self::Operator
        } else {
            Self::Node(node.clone())
        }
    }
}

impl AuthorityCommand {
    /// The instance a transition names, kept before the command is consumed so a refused
    /// retry can be answered ([`AuthorityState::retry_answer`]); `None` for other commands.
    pub fn transition_target(&self) -> Option<(ServiceKey, InstanceId)> {
        match self {
            Self::Transition { key, instance, .. } => Some((key.clone(), instance.clone())),
            _ => None,
        }
    }
}

impl Refusal {
    /// Stable machine-readable code (the `code` of `AuthorityError::Refused` on the wire, and
    /// the `code` label of `shoal_authority_refusals_total`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotOwner { .. } => "not_owner",
            Self::UnknownInstance => "unknown_instance",
            Self::StaleGeneration { .. } => "stale_generation",
            Self::UnknownGeneration { .. } => "unknown_generation",
            Self::IllegalTransition { .. } => "illegal_transition",
            Self::AlreadyInState(_) => "already_in_state",
            Self::Expired => "expired",
            Self::InvalidRequest(_) => "invalid_request",
            Self::NotAllowed => "not_allowed",
            Self::CapacityExhausted { .. } => "capacity_exhausted",
            Self::NodeRevoked { .. } => "node_revoked",
        }
    }
}

/// What a request is: a command for the log, or something answered without one.
#[derive(Debug, Clone)]
pub enum Routed {
    /// A command to commit (the replicated authority proposes it through Raft; the development
    /// authority applies it at once).
    Write {
        /// The command, with the caller it was authorised as.
        cmd: AuthorityCommand,
        /// What a committed write answers.
        answer: WriteAnswer,
    },
    /// A request no command stands for.
    Query(Query),
}

/// What a committed write answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteAnswer {
    /// The records it signed (`AuthorityOk::Committed`).
    Records,
    /// The service's policy as now stored (`AuthorityOk::Policy`).
    Policy(ServiceKey),
    /// The held global policy (`AuthorityOk::GlobalPolicy`).
    GlobalPolicy,
}

/// A request answered without a command.
#[derive(Debug, Clone)]
pub enum Query {
    /// Leader, term, revision, members.
    Status,
    /// The replica set (a change goes through Raft membership, not the state machine).
    Members(MembersOp),
    /// One service's signed policy.
    GetPolicy(ServiceKey),
    /// The held global policy.
    GetGlobalPolicy,
    /// Another region's authority asking for summaries.
    RegionSummaries {
        /// Services wanted.
        keys: Vec<ServiceKey>,
        /// The asker's global policy version.
        policy_version: u64,
    },
    /// An agent asking for its failover feed.
    FailoverFeed {
        /// The agent's global policy version.
        policy_version: u64,
    },
}

/// Sorts `body` from `caller` into a command or a query. Nothing is authorised here: the state
/// machine decides what `caller` may do when the command is applied.
pub fn route(caller: Caller, body: AuthorityRequestBody) -> Routed {
    use AuthorityRequestBody as B;
    let write = |cmd, answer| Routed::Write { cmd, answer };
    match body {
        B::Register {
            key,
            instance,
            on_node,
            endpoint,
            lease_ms,
        } => write(
            AuthorityCommand::Register {
                caller,
                key,
                instance,
                on_node,
                endpoint,
                lease_ms,
            },
            WriteAnswer::Records,
        ),
        B::Transition {
            key,
            instance,
            generation,
            to,
            reason,
        } => write(
            AuthorityCommand::Transition {
                caller,
                key,
                instance,
                generation,
                to,
                reason,
            },
            WriteAnswer::Records,
        ),
        B::PutPolicy { key, policy } => write(
            AuthorityCommand::PutPolicy {
                caller,
                key: key.clone(),
                policy,
            },
            WriteAnswer::Policy(key),
        ),
        B::BindNodeKey { key } => write(
            AuthorityCommand::BindNodeKey { caller, key },
            WriteAnswer::Records,
        ),
        B::RevokeNode { node } => write(
            AuthorityCommand::RevokeNode { caller, node },
            WriteAnswer::Records,
        ),
        B::ReadmitNode { node } => write(
            AuthorityCommand::ReadmitNode { caller, node },
            WriteAnswer::Records,
        ),
        B::PutGlobalPolicy { signed } => write(
            AuthorityCommand::PutGlobalPolicy { caller, signed },
            WriteAnswer::GlobalPolicy,
        ),
        B::Status => Routed::Query(Query::Status),
        B::Members(op) => Routed::Query(Query::Members(op)),
        B::GetPolicy { key } => Routed::Query(Query::GetPolicy(key)),
        B::GetGlobalPolicy => Routed::Query(Query::GetGlobalPolicy),
        B::RegionSummaries {
            keys,
            policy_version,
        } => Routed::Query(Query::RegionSummaries {
            keys,
            policy_version,
        }),
        B::FailoverFeed { policy_version } => Routed::Query(Query::FailoverFeed { policy_version }),
    }
}

impl AuthorityState {
    /// The answer to a transition of `target` (see [`AuthorityCommand::transition_target`])
    /// refused with [`Refusal::AlreadyInState`]: a retry of a write that already committed (its
    /// first answer was lost) gets the committed record, so the client learns its write took
    /// effect. For any other command the refusal stands (`target` is `None`).
    pub fn retry_answer(
        &self,
        target: Option<&(ServiceKey, InstanceId)>,
    ) -> Option<Vec<SignedLifecycle>> {
        let (key, instance) = target?;
        Some(
            self.binding(key, instance)
                .map(|b| vec![b.current().clone()])
                .unwrap_or_default(),
        )
    }

    /// `true` when `cmd` would change nothing and need not be committed: a node binding the
    /// key the authority already holds for it (every agent start sends one).
    pub fn is_noop(&self, cmd: &AuthorityCommand) -> bool {
        matches!(cmd, AuthorityCommand::BindNodeKey { caller: Caller::Node(n), key }
            if self.node_key(n) == Some(*key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(s: &str) -> NodeId {
        s.parse().unwrap()
    }

    #[test]
    fn operators_are_named_by_prefix_or_by_the_configured_list() {
        let listed: BTreeSet<String> = ["alice".to_owned()].into();
        assert_eq!(
            Caller::of_certificate(&node("operator-bob"), &BTreeSet::new()),
            Caller::Operator
        );
        assert_eq!(
            Caller::of_certificate(&node("alice"), &listed),
            Caller::Operator
        );
        assert_eq!(
            Caller::of_certificate(&node("node-1"), &listed),
            Caller::Node(node("node-1"))
        );
    }

    #[test]
    fn writes_carry_the_caller_and_reads_become_queries() {
        let key: ServiceKey = "prod/web/http".parse().unwrap();
        let caller = Caller::Node(node("node-1"));
        match route(
            caller.clone(),
            AuthorityRequestBody::RevokeNode { node: node("n2") },
        ) {
            Routed::Write {
                cmd: AuthorityCommand::RevokeNode { caller: c, node: n },
                answer: WriteAnswer::Records,
            } => assert_eq!((c, n), (caller.clone(), node("n2"))),
            other => panic!("a revoke is a write answering records: {other:?}"),
        }
        assert!(matches!(
            route(
                caller.clone(),
                AuthorityRequestBody::GetPolicy { key: key.clone() }
            ),
            Routed::Query(Query::GetPolicy(k)) if k == key
        ));
        assert!(matches!(
            route(caller, AuthorityRequestBody::Status),
            Routed::Query(Query::Status)
        ));
    }
}
