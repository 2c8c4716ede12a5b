//! Specification tests, openraft style: one file per command, each feeding one command in and
//! asserting the exact records (or refusal) out.

mod audit_test;
mod global_policy_test;
mod lease_test;
mod node_key_test;
mod policy_test;
mod prop_test;
mod register_test;
mod snapshot_test;
mod takeover_test;
mod transition_test;

use shoal_catalog::testkit::Fixture;
use shoal_proto::{
    Generation, InstanceId, LifecycleRecord, LifecycleState, Name, NodeId, Revision, ServiceKey,
    SignedLifecycle, TransitionReason, TransitionSource,
};

use crate::{ApplyContext, AuthorityCommand, AuthorityState, Caller, Refusal, Scope};

/// Commit wall time of log index `i` in the harness: `BASE_MS + i`.
pub const BASE_MS: u64 = 1_700_000_000_000;
/// Lease used by [`Harness::register`].
pub const LEASE_MS: u32 = 300_000;

/// A state plus a log-index counter and the catalog fixture's keys.
pub struct Harness {
    pub fx: Fixture,
    pub state: AuthorityState,
    /// Log index of the last applied command.
    pub index: u64,
}

impl Harness {
    pub fn new() -> Self {
        let fx = Fixture::new();
        let state = AuthorityState::new(fx.region.clone());
        Self {
            fx,
            state,
            index: 0,
        }
    }

    /// Applies `cmd` at the next log index.
    pub fn apply(&mut self, cmd: AuthorityCommand) -> Result<Vec<SignedLifecycle>, Refusal> {
        self.index += 1;
        let ctx = ApplyContext {
            log_index: self.index,
            committed_at_ms: BASE_MS + self.index,
            signing_key: &self.fx.authority,
        };
        self.state.apply(cmd, ctx)
    }

    /// Like [`Harness::apply`], asserting the command was refused and nothing but the audit
    /// log and last applied index moved.
    pub fn refused(&mut self, cmd: AuthorityCommand) -> Refusal {
        let before = self.state.clone();
        let refusal = self.apply(cmd).expect_err("command must be refused");
        assert_eq!(self.state.head_revision(), before.head_revision());
        assert!(self.state.bindings().eq(before.bindings()));
        assert!(self.state.down_nodes().eq(before.down_nodes()));
        assert!(self.state.policies().eq(before.policies()));
        refusal
    }

    pub fn register(&self, node: usize, instance: &str) -> AuthorityCommand {
        AuthorityCommand::Register {
            caller: Caller::Node(node_id(node)),
            key: self.fx.key.clone(),
            instance: inst(instance),
            on_node: None,
            endpoint: Fixture::spec(7),
            lease_ms: LEASE_MS,
        }
    }

    pub fn transition(
        &self,
        caller: Caller,
        instance: &str,
        generation: u64,
        to: LifecycleState,
        reason: TransitionReason,
    ) -> AuthorityCommand {
        AuthorityCommand::Transition {
            caller,
            key: self.fx.key.clone(),
            instance: inst(instance),
            generation: Generation(generation),
            to,
            reason,
        }
    }

    /// The record the authority should emit for a registration by `node` at log index
    /// `generation`, before any transition.
    pub fn record(&self, instance: &str, node: usize, generation: u64) -> LifecycleRecord {
        LifecycleRecord {
            key: self.fx.key.clone(),
            instance: inst(instance),
            generation: Generation(generation),
            region: self.fx.region.clone(),
            revision: Revision(0),
            owner: node_id(node),
            owner_key: None,
            endpoint: Fixture::spec(7),
            state: LifecycleState::Starting,
            reason: TransitionReason::Registered,
            source: TransitionSource::OwnerAgent,
            lease_ms: LEASE_MS,
            committed_at_ms: 0,
        }
    }

    /// `base` moved to `state` for `reason`, at `revision`, committed at log index `index`,
    /// signed with the region key: exactly what `apply` must return.
    #[allow(clippy::too_many_arguments)]
    pub fn signed(
        &self,
        base: &LifecycleRecord,
        state: LifecycleState,
        reason: TransitionReason,
        source: TransitionSource,
        revision: u64,
        index: u64,
    ) -> SignedLifecycle {
        self.fx.authority.sign_lifecycle(LifecycleRecord {
            state,
            reason,
            source,
            revision: Revision(revision),
            committed_at_ms: BASE_MS + index,
            ..base.clone()
        })
    }
}

pub fn node_id(i: usize) -> NodeId {
    NodeId::new(format!("node-{i}")).expect("valid")
}

pub fn inst(s: &str) -> InstanceId {
    InstanceId::new(s).expect("valid")
}

pub fn node(i: usize) -> Caller {
    Caller::Node(node_id(i))
}

pub fn orchestrator(namespace: &str) -> Caller {
    Caller::Orchestrator {
        name: Name::new("k8s-controller").expect("valid"),
        scope: vec![Scope::Namespace(Name::new(namespace).expect("valid"))],
    }
}

pub fn other_key() -> ServiceKey {
    "staging/api/http".parse().expect("valid")
}
