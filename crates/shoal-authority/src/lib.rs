//! # shoal-authority
//!
//! The per-region authority's rules as a pure, deterministic state machine: admission of
//! instances (binding a (service key, instance id) to a node with a boot generation), legal
//! lifecycle transitions, signing with the region key and gap-free region revisions, the lease
//! safety net for records of dead nodes, signed per-service policy, and the audit log.
//!
//! No IO, no clock, no tokio: the Raft state machine (openraft, later) and the simulator both
//! feed it committed [`AuthorityCommand`]s with an [`ApplyContext`] (log index, commit time,
//! region key) and get the same signed records out.
//!
//! - [`caller`]: who is asking ([`Caller`]) and what they may manage.
//! - [`command`]: the log entries ([`AuthorityCommand`]) and [`ApplyContext`].
//! - [`state`]: [`AuthorityState`] and its one mutator, [`AuthorityState::apply`]; the lease
//!   and leader-takeover rule is documented there.
//! - [`refusal`]: why a command was refused ([`Refusal`]).
//! - [`request`]: a wire request as a command or a query ([`route`]), shared by the replicated
//!   and the development authority.
//! - [`replay`]: at-most-once writes for a caller's retries ([`replay::ReplayCache`]).
//! - [`audit`]: the bounded audit log.
//!
//! ```
//! use shoal_authority::{ApplyContext, AuthorityCommand, AuthorityState, Caller};
//! use shoal_proto::{LifecycleState, NodeId, SigningKey, TransitionReason};
//!
//! let key = SigningKey::from_seed([7; 32]);
//! let mut state = AuthorityState::new("eu-west".parse().unwrap());
//! let node: NodeId = "node-1".parse().unwrap();
//! let ctx = |log_index| ApplyContext { log_index, committed_at_ms: 1_700_000_000_000, signing_key: &key };
//!
//! let out = state.apply(AuthorityCommand::Register {
//!     caller: Caller::Node(node.clone()),
//!     key: "prod/payments/http".parse().unwrap(),
//!     instance: "pay-7f9c".parse().unwrap(),
//!     on_node: None,
//!     endpoint: shoal_catalog::testkit::Fixture::spec(1),
//!     lease_ms: 300_000,
//! }, ctx(5)).unwrap();
//! let rec = &out[0].record;
//! assert_eq!((rec.state, rec.generation.0, rec.revision.0), (LifecycleState::Starting, 5, 1));
//! key.verifying_key().verify_lifecycle(&out[0]).unwrap();
//!
//! let out = state.apply(AuthorityCommand::Transition {
//!     caller: Caller::Node(node),
//!     key: rec.key.clone(),
//!     instance: rec.instance.clone(),
//!     generation: rec.generation,
//!     to: LifecycleState::Ready,
//!     reason: TransitionReason::ReadinessPassed,
//! }, ctx(6)).unwrap();
//! assert_eq!((out[0].record.state, out[0].record.revision.0), (LifecycleState::Ready, 2));
//! assert_eq!(state.audit().total(), 2);
//! ```

pub mod audit;
pub mod caller;
pub mod command;
pub mod refusal;
pub mod replay;
pub mod request;
pub mod state;

#[cfg(test)]
mod tests;

pub use audit::{AuditEntry, AuditLog, AuditOutcome, CommandSummary, DEFAULT_AUDIT_CAPACITY};
pub use caller::{Caller, CallerId, Scope, MAX_SCOPES};
pub use command::{ApplyContext, AuthorityCommand, LeaseCredit};
pub use refusal::{InvalidRequest, Refusal};
pub use replay::{Admission, ReplayCache};
pub use request::{route, Query, Routed, WriteAnswer, OPERATOR_PREFIX};
pub use state::{
    AuthorityState, Binding, Incarnation, NodeKeyState, StateError, MAX_BINDINGS, MAX_DOWN_NODES,
    MAX_EXPIRE_BATCH, MAX_LEASE_MS, MAX_NODE_KEYS, MAX_POLICIES, MAX_REVOKED_KEYS, MIN_LEASE_MS,
};
