//! Deciding (pure, `&self`): which records a command would produce, and the rules that refuse
//! it — ownership, scopes, revocation, lease bounds and the lifecycle transition table. Nothing
//! here changes the state; `AuthorityState::execute` applies what these return.

use shoal_catalog::check_transition;
use shoal_proto::{
    EndpointSpec, Generation, InstanceId, LifecycleRecord, LifecycleState, NodeId, NodeKey,
    Revision, ServiceKey, ServicePolicy, TransitionReason, TransitionSource, VerifyingKey,
};

use super::{
    AuthorityState, Binding, Planned, MAX_BINDINGS, MAX_EXPIRE_BATCH, MAX_LEASE_MS, MAX_NODE_KEYS,
    MAX_POLICIES, MIN_LEASE_MS,
};
use crate::caller::{Caller, MAX_SCOPES};
use crate::refusal::{InvalidRequest, Refusal};

impl AuthorityState {
    /// Which node a key binding is for, if it may bind at all.
    pub(super) fn check_bind(&self, caller: &Caller, key: &NodeKey) -> Result<NodeId, Refusal> {
        let Caller::Node(node) = caller else {
            return Err(Refusal::NotAllowed);
        };
        if VerifyingKey::from_bytes(*key).is_err() {
            return Err(InvalidRequest::NodeKey.into());
        }
        match self.node_keys.get(node) {
            Some(n) if n.revoked || n.revoked_keys.contains(key) => {
                Err(Refusal::NodeRevoked { node: node.clone() })
            }
            Some(_) => Ok(node.clone()),
            None if self.node_keys.len() >= MAX_NODE_KEYS => Err(Refusal::CapacityExhausted {
                limit: MAX_NODE_KEYS as u64,
            }),
            None => Ok(node.clone()),
        }
    }

    pub(super) fn check_operator_node(
        &self,
        caller: &Caller,
        node: &NodeId,
    ) -> Result<(), Refusal> {
        if *caller != Caller::Operator {
            return Err(Refusal::NotAllowed);
        }
        if !self.node_keys.contains_key(node) && self.node_keys.len() >= MAX_NODE_KEYS {
            return Err(Refusal::CapacityExhausted {
                limit: MAX_NODE_KEYS as u64,
            });
        }
        Ok(())
    }

    /// Refuses anything on behalf of, or bound to, a revoked node.
    pub(super) fn check_not_revoked(&self, node: &NodeId) -> Result<(), Refusal> {
        if self.node_revoked(node) {
            return Err(Refusal::NodeRevoked { node: node.clone() });
        }
        Ok(())
    }

    /// One record per live instance of `node`: moved to `to` (`None`: the same state) for
    /// `reason`, bound to the node's key as stored now.
    pub(super) fn plan_for_node(
        &self,
        node: &NodeId,
        to: Option<LifecycleState>,
        reason: TransitionReason,
    ) -> Vec<Planned> {
        let owner_key = self.node_key(node);
        self.bindings()
            .filter(|(_, _, b)| b.node() == node && b.state() != LifecycleState::Expired)
            .map(|(_, _, b)| Planned {
                from: Some(b.state()),
                record: LifecycleRecord {
                    state: to.unwrap_or(b.state()),
                    reason,
                    source: TransitionSource::Authority,
                    owner_key,
                    ..b.current.record.clone()
                },
            })
            .collect()
    }

    // ---- deciding (pure, &self) ----------------------------------------------------------

    pub(super) fn plan_register(
        &self,
        req: RegisterRequest<'_>,
        generation: Generation,
    ) -> Result<Planned, Refusal> {
        let node = register_target(req.caller, &req.key, req.on_node)?;
        self.check_not_revoked(&node)?;
        if !(MIN_LEASE_MS..=MAX_LEASE_MS).contains(&req.lease_ms) {
            return Err(InvalidRequest::LeaseOutOfRange {
                lease_ms: req.lease_ms,
            }
            .into());
        }
        if req.endpoint.validate().is_err() {
            return Err(InvalidRequest::Weight {
                weight: req.endpoint.weight,
            }
            .into());
        }
        match self.binding(&req.key, &req.instance) {
            Some(b) => {
                let live_elsewhere = b.state() != LifecycleState::Expired && b.node() != &node;
                if live_elsewhere && matches!(req.caller, Caller::Node(_)) {
                    return Err(Refusal::NotOwner {
                        bound_to: b.node().clone(),
                    });
                }
                // Generations come from strictly increasing log indexes.
                debug_assert!(b.generation() < generation);
            }
            None if self.binding_count() >= MAX_BINDINGS => {
                return Err(Refusal::CapacityExhausted {
                    limit: MAX_BINDINGS as u64,
                })
            }
            None => {}
        }
        let (to, reason) = (LifecycleState::Starting, TransitionReason::Registered);
        check_transition(None, to, reason).map_err(illegal)?;
        Ok(Planned {
            from: None,
            record: LifecycleRecord {
                key: req.key,
                instance: req.instance,
                generation,
                region: self.region.clone(),
                revision: Revision(0),
                owner_key: self.node_key(&node),
                owner: node,
                endpoint: req.endpoint,
                state: to,
                reason,
                source: req.caller.source(),
                lease_ms: req.lease_ms,
                committed_at_ms: 0,
            },
        })
    }

    pub(super) fn plan_transition(
        &self,
        caller: &Caller,
        key: &ServiceKey,
        instance: &InstanceId,
        generation: Generation,
        to: LifecycleState,
        reason: TransitionReason,
    ) -> Result<Planned, Refusal> {
        check_scope_size(caller)?;
        if matches!(
            reason,
            TransitionReason::LeaseExpired
                | TransitionReason::NodeKeyChanged
                | TransitionReason::NodeRevoked
        ) {
            return Err(InvalidRequest::ReservedReason(reason).into());
        }
        let binding = self
            .binding(key, instance)
            .ok_or(Refusal::UnknownInstance)?;
        authorize_change(caller, key, binding)?;
        if let Caller::Node(me) = caller {
            self.check_not_revoked(me)?;
        }
        let current = binding.generation();
        if generation < current {
            return Err(Refusal::StaleGeneration {
                requested: generation,
                current,
            });
        }
        if generation > current {
            return Err(Refusal::UnknownGeneration {
                requested: generation,
                current,
            });
        }
        let from = binding.state();
        // First: a retried deregister (EXPIRED -> EXPIRED) is a retry like any other.
        if from == to {
            return Err(Refusal::AlreadyInState(to));
        }
        if from == LifecycleState::Expired {
            return Err(Refusal::Expired);
        }
        check_transition(Some(from), to, reason).map_err(illegal)?;
        Ok(Planned {
            from: Some(from),
            record: LifecycleRecord {
                state: to,
                reason,
                source: caller.source(),
                owner_key: self.node_key(binding.node()),
                ..binding.current.record.clone()
            },
        })
    }

    pub(super) fn plan_expiry(&self, now_ms: u64) -> Vec<Planned> {
        if self.down_nodes.is_empty() {
            return Vec::new();
        }
        let (to, reason) = (LifecycleState::Expired, TransitionReason::LeaseExpired);
        self.bindings()
            .filter(|(_, _, b)| b.state() != LifecycleState::Expired)
            .filter(|(_, _, b)| {
                self.downtime_ms(b.node(), now_ms)
                    .is_some_and(|down| down >= u64::from(b.lease_ms()))
            })
            .filter(|(_, _, b)| check_transition(Some(b.state()), to, reason).is_ok())
            .take(MAX_EXPIRE_BATCH)
            .map(|(_, _, b)| Planned {
                from: Some(b.state()),
                record: LifecycleRecord {
                    state: to,
                    reason,
                    source: TransitionSource::Authority,
                    owner_key: self.node_key(b.node()),
                    ..b.current.record.clone()
                },
            })
            .collect()
    }

    pub(super) fn check_policy(
        &self,
        caller: &Caller,
        key: &ServiceKey,
        policy: &ServicePolicy,
    ) -> Result<(), Refusal> {
        if *caller != Caller::Operator {
            return Err(Refusal::NotAllowed);
        }
        policy.validate().map_err(InvalidRequest::Policy)?;
        if !self.policies.contains_key(key) && self.policies.len() >= MAX_POLICIES {
            return Err(Refusal::CapacityExhausted {
                limit: MAX_POLICIES as u64,
            });
        }
        Ok(())
    }
}

/// The arguments of a registration, bundled.
pub(super) struct RegisterRequest<'a> {
    pub(super) caller: &'a Caller,
    pub(super) key: ServiceKey,
    pub(super) instance: InstanceId,
    pub(super) on_node: Option<NodeId>,
    pub(super) endpoint: EndpointSpec,
    pub(super) lease_ms: u32,
}

/// Which node a registration binds to, if the caller may register there at all.
pub(super) fn register_target(
    caller: &Caller,
    key: &ServiceKey,
    on_node: Option<NodeId>,
) -> Result<NodeId, Refusal> {
    check_scope_size(caller)?;
    match caller {
        Caller::Node(me) => match on_node {
            None => Ok(me.clone()),
            Some(n) if &n == me => Ok(n),
            Some(_) => Err(Refusal::NotAllowed),
        },
        Caller::Orchestrator { .. } | Caller::Operator => {
            if !caller.manages_service(key) {
                return Err(Refusal::NotAllowed);
            }
            on_node.ok_or(InvalidRequest::MissingNode.into())
        }
    }
}

/// May `caller` change the instance behind `binding`?
pub(super) fn authorize_change(
    caller: &Caller,
    key: &ServiceKey,
    binding: &Binding,
) -> Result<(), Refusal> {
    match caller {
        Caller::Node(me) if me == binding.node() => Ok(()),
        Caller::Node(_) => Err(Refusal::NotOwner {
            bound_to: binding.node().clone(),
        }),
        _ if caller.manages_service(key) => Ok(()),
        _ => Err(Refusal::NotAllowed),
    }
}

pub(super) fn check_scope_size(caller: &Caller) -> Result<(), Refusal> {
    match caller {
        Caller::Orchestrator { scope, .. } if scope.len() > MAX_SCOPES => {
            Err(InvalidRequest::TooManyScopes { count: scope.len() }.into())
        }
        _ => Ok(()),
    }
}

pub(super) fn illegal(e: shoal_catalog::IllegalTransition) -> Refusal {
    Refusal::IllegalTransition {
        from: e.from,
        to: e.to,
        reason: e.reason,
    }
}
