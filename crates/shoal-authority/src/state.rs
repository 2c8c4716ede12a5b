//! The authority's replicated state and its one mutator, [`AuthorityState::apply`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shoal_catalog::check_transition;
use shoal_proto::rpc::LocalCaller;
use shoal_proto::{
    Generation, InstanceId, LifecycleRecord, LifecycleState, NodeId, NodeKey, PolicyRecord, Region,
    Revision, ServiceKey, ServicePolicy, SignedLifecycle, SignedPolicy, TransitionReason,
};

use crate::audit::{AuditEntry, AuditLog, AuditOutcome, DEFAULT_AUDIT_CAPACITY};
use crate::command::{ApplyContext, AuthorityCommand};
use crate::refusal::{InvalidRequest, Refusal};

mod audit_summary;
mod global_policy;
mod leases;
mod plan;
mod snapshot;

use audit_summary::{caller_id, summary};
use plan::RegisterRequest;

/// Shortest lease a registration may ask for, in ms. Shorter leases would let a brief mesh
/// hiccup expire healthy records (the mesh needs seconds to declare a node down and up again).
pub const MIN_LEASE_MS: u32 = 1_000;
/// Longest lease a registration may ask for, in ms (one day): an abandoned record must go away
/// eventually.
pub const MAX_LEASE_MS: u32 = 86_400_000;
/// Most bindings (live and expired tombstones) one region holds: a region plans for ~33,000
/// endpoints, the whole system for 100,000. Past it new instance ids are refused.
pub const MAX_BINDINGS: usize = 250_000;
/// Most records one [`AuthorityCommand::ExpireLeases`] expires; the rest wait for the next
/// batch (the driver proposes again while [`AuthorityState::next_lease_deadline_ms`] is due).
pub const MAX_EXPIRE_BATCH: usize = 4_096;
/// Most nodes tracked as down at once (a region has ~1,667 nodes).
pub const MAX_DOWN_NODES: usize = 65_536;
/// Most service policy documents one region stores (2,000 services, a few ports each).
pub const MAX_POLICIES: usize = 65_536;
/// Most nodes whose key (or revocation) one region stores (a region has ~1,667 nodes).
pub const MAX_NODE_KEYS: usize = 65_536;
/// Most revoked keys remembered per node (refused if presented again).
pub const MAX_REVOKED_KEYS: usize = 4;

/// What the authority holds about one node's health-signing key (ADR 0006).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeKeyState {
    /// The key bound into every record the node owns; `None` before the node presented one
    /// and while it is revoked.
    pub key: Option<NodeKey>,
    /// Revoked by an operator: bindings, registrations and requests from the node are refused.
    pub revoked: bool,
    /// Keys that were bound when the node was revoked (newest last, at most
    /// [`MAX_REVOKED_KEYS`]): refused for good, so a readmitted node needs a new key.
    pub revoked_keys: Vec<NodeKey>,
}

/// What the authority holds for one (service key, instance id): the current generation's
/// signed lifecycle record, whose `owner` is the node the instance is bound to.
///
/// Expired bindings are kept as tombstones: they still refuse stale generations by number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    current: SignedLifecycle,
}

impl Binding {
    /// The node the instance is bound to; only its agent may change it (besides orchestrators
    /// and operators).
    pub fn node(&self) -> &NodeId {
        &self.current.record.owner
    }

    /// The current boot generation (the log index of its registration).
    pub fn generation(&self) -> Generation {
        self.current.record.generation
    }

    /// The current lifecycle state.
    pub fn state(&self) -> LifecycleState {
        self.current.record.state
    }

    /// The lease in ms.
    pub fn lease_ms(&self) -> u32 {
        self.current.record.lease_ms
    }

    /// The last signed record of the current generation (what agents should hold).
    pub fn current(&self) -> &SignedLifecycle {
        &self.current
    }
}

/// A record the authority decided to emit, before it gets a revision and a signature.
struct Planned {
    /// State of this generation before the transition (`None` for a registration).
    from: Option<LifecycleState>,
    record: LifecycleRecord,
}

/// The internal-consistency check on a decoded or live state failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The bytes are not a postcard-encoded [`AuthorityState`].
    #[error("snapshot does not decode: {0}")]
    Decode(String),
    /// The state decodes but breaks an invariant; it must not be installed.
    #[error("snapshot breaks an invariant: {0}")]
    Invariant(&'static str),
}

/// The per-region authority's state: the deterministic core that the Raft state machine and
/// the simulator both run.
///
/// # Shape
/// - `region`, and the **next revision** (gap-free across every emitted lifecycle record,
///   starting at 1; refusals and record-less commands consume none);
/// - one [`Binding`] per (service key, instance id);
/// - the **down nodes** with the time (leader monotonic ms) their lease clocks started;
/// - one signed policy document per service key, with its own gap-free policy revision;
/// - the [`AuditLog`] ring.
///
/// It is serde-serialisable (postcard) so it can be a Raft snapshot; see
/// [`AuthorityState::encode`] and [`AuthorityState::decode`].
///
/// # Determinism
/// [`AuthorityState::apply`] reads no clock, no RNG and does no IO. Generations come from the
/// Raft log index, times from the command, the signature from the key in the context (ed25519
/// is deterministic). Two replicas applying the same log emit byte-identical records.
///
/// # Leases and leader changes
/// A record's lease runs only while its owner node is down in the leader's mesh view
/// ([`AuthorityCommand::NodeDown`] starts it, [`AuthorityCommand::NodeUp`] stops it), and
/// [`AuthorityCommand::ExpireLeases`] at `now_ms` expires records whose node has been down for
/// `now_ms - down_since_ms >= lease_ms`. Renewal is implicit: nothing is written while nodes
/// are alive.
///
/// All those times are one leader's monotonic clock, and monotonic clocks of two machines are
/// not comparable (each counts from its own boot). So downtime is carried across leaders as a
/// **duration**, never as a time (docs/adr/0008-lease-checkpoints.md):
/// - every [`AuthorityCommand::ExpireLeases`] is also a **checkpoint**: each down node's
///   downtime so far (`carried + now - since`) is stored as its carried downtime and its lease
///   clock restarts at `now` (the leader proposes one every `lease_checkpoint_ms` while nodes
///   are down, as etcd checkpoints remaining lease time, etcd-io/etcd#9888);
/// - a new leader's first command, [`AuthorityCommand::LeaderTakeover`] at its own `now_ms`,
///   restarts every down node's lease clock at `now_ms`, keeps its carried downtime, and adds
///   the [`LeaseCredit`](crate::command::LeaseCredit): the time the new leader's own clock measured since it applied the
///   latest checkpoint (only for nodes that checkpoint counted). Later `NodeDown` times are
///   floored at `now_ms`.
///
/// - **never early**: carried downtime was measured on one clock each, and the credit runs
///   from the moment the new leader *applied* the checkpoint, which is after the old leader
///   proposed it; so the counted downtime never exceeds the real one.
/// - **bounded, whatever the number of elections**: what a takeover forgets is the time from
///   the old leader's checkpoint proposal to its commit and apply on the new leader (ms), plus,
///   once per down period, the downtime of a node reported down after the latest checkpoint
///   (at most one checkpoint interval plus the election). Before checkpoints, each takeover
///   granted a full new lease, so leader changes faster than a lease kept a dead node's
///   records forever (issue 14: a 20 s lease took 65 s with six leader kills).
///
/// The Raft driver must make `LeaderTakeover` the first command a new leader proposes (Raft
/// guarantees no older leader's entry commits after it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorityState {
    region: Region,
    next_revision: Revision,
    next_policy_revision: Revision,
    last_applied_index: u64,
    services: BTreeMap<ServiceKey, BTreeMap<InstanceId, Binding>>,
    down_nodes: BTreeMap<NodeId, u64>,
    lease_floor_ms: u64,
    policies: BTreeMap<ServiceKey, SignedPolicy>,
    node_keys: BTreeMap<NodeId, NodeKeyState>,
    audit: AuditLog,
    /// Added to the Raft log index to form a registration's generation; raised by
    /// [`AuthorityState::raise_floor`] when a backup starts a new cluster incarnation (whose
    /// log indexes restart below generations the region already issued). 0 otherwise.
    generation_offset: u64,
    /// Set when this state was restored from a backup as a new cluster incarnation.
    incarnation: Option<Incarnation>,
    /// Downtime (ms) each down node had accrued at its `down_nodes` time, carried over from
    /// earlier checkpoints and leaders. A node is present once a checkpoint or takeover has
    /// counted it.
    down_carried_ms: BTreeMap<NodeId, u64>,
    /// Counter of lease checkpoints (`ExpireLeases` with nodes down, and takeovers).
    lease_checkpoint: u64,
    /// The global policy document (ADR 0013), if one was stored.
    global_policy: Option<shoal_proto::SignedGlobalPolicy>,
}

/// A cluster incarnation started by restoring a backup (see [`AuthorityState::raise_floor`]).
/// Replicated with the state, so every replica (and one re-seeded by a Raft snapshot) reports
/// the same one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incarnation {
    /// Operator-visible id of the incarnation (hex, chosen at the first restore and passed to
    /// the restores of the other replicas).
    pub cluster_id: String,
    /// Every revision and generation issued by this incarnation is above this.
    pub floor: u64,
    /// Raft log index of the backup it was restored from (the snapshot's last log index).
    pub restored_from_index: u64,
}

impl AuthorityState {
    /// An empty state for `region` with the default audit capacity
    /// ([`DEFAULT_AUDIT_CAPACITY`]).
    pub fn new(region: Region) -> Self {
        Self::with_audit_capacity(region, DEFAULT_AUDIT_CAPACITY)
    }

    /// An empty state keeping the last `audit_capacity` audit entries (at least 1).
    pub fn with_audit_capacity(region: Region, audit_capacity: usize) -> Self {
        Self {
            region,
            next_revision: Revision(1),
            next_policy_revision: Revision(1),
            last_applied_index: 0,
            services: BTreeMap::new(),
            down_nodes: BTreeMap::new(),
            lease_floor_ms: 0,
            policies: BTreeMap::new(),
            node_keys: BTreeMap::new(),
            audit: AuditLog::new(audit_capacity),
            generation_offset: 0,
            incarnation: None,
            down_carried_ms: BTreeMap::new(),
            lease_checkpoint: 0,
            global_policy: None,
        }
    }

    /// Raises every counter the region's agents order by above `floor`, for a state restored
    /// from a backup into a new cluster incarnation (`shoal authority snapshot restore`,
    /// docs/adr/0007-authority-restore.md): the next lifecycle revision, the next policy
    /// revision and the next generation (log index + offset) all become `> floor`. Counters
    /// already above it are kept, so raising twice with the same floor is a no-op.
    ///
    /// `floor` must be at least every revision and generation the region issued before the
    /// disaster (agents hold them and treat anything lower or equal as stale or duplicate).
    ///
    /// Records the new incarnation (`cluster_id`, `floor`). Applying the same floor and id to
    /// the same backup gives byte-identical states, which is what lets every replica of the
    /// new cluster be restored from the same file.
    ///
    /// # Errors
    /// [`StateError::Invariant`] when `floor` is so close to `u64::MAX` that counters above it
    /// could overflow (more than `u64::MAX - 2^62`); nothing is changed then.
    pub fn raise_floor(&mut self, floor: u64, cluster_id: String) -> Result<(), StateError> {
        if floor > u64::MAX - (1 << 62) {
            return Err(StateError::Invariant(
                "revision floor too close to u64::MAX",
            ));
        }
        self.incarnation = Some(Incarnation {
            cluster_id,
            floor,
            restored_from_index: self.last_applied_index,
        });
        let above = Revision(floor + 1);
        self.next_revision = self.next_revision.max(above);
        self.next_policy_revision = self.next_policy_revision.max(above);
        let offset = floor.saturating_sub(self.last_applied_index);
        self.generation_offset = self.generation_offset.max(offset);
        Ok(())
    }

    /// The incarnation this state was restored as, if it was restored from a backup.
    pub fn incarnation(&self) -> Option<&Incarnation> {
        self.incarnation.as_ref()
    }

    /// The generation the next registration would get at Raft log index `log_index`
    /// (`log_index` plus the offset set by [`AuthorityState::raise_floor`]).
    pub fn generation_at(&self, log_index: u64) -> Generation {
        Generation(log_index.saturating_add(self.generation_offset))
    }

    // ---- getters -------------------------------------------------------------------------

    /// The region this authority signs for.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// The revision the next emitted record will get (starts at 1).
    pub fn next_revision(&self) -> Revision {
        self.next_revision
    }

    /// The last revision assigned (0 when nothing was emitted yet). Every revision in
    /// `1..=head_revision()` was emitted exactly once.
    pub fn head_revision(&self) -> Revision {
        Revision(self.next_revision.0 - 1)
    }

    /// The last policy revision assigned (0 when no policy was stored yet).
    pub fn head_policy_revision(&self) -> Revision {
        Revision(self.next_policy_revision.0 - 1)
    }

    /// The Raft log index of the last applied command (0 before the first).
    pub fn last_applied_index(&self) -> u64 {
        self.last_applied_index
    }

    /// The binding of one instance, if it was ever admitted (and is not garbage).
    pub fn binding(&self, key: &ServiceKey, instance: &InstanceId) -> Option<&Binding> {
        self.services.get(key)?.get(instance)
    }

    /// Every binding, in (service key, instance id) order.
    pub fn bindings(&self) -> impl Iterator<Item = (&ServiceKey, &InstanceId, &Binding)> {
        self.services
            .iter()
            .flat_map(|(k, m)| m.iter().map(move |(i, b)| (k, i, b)))
    }

    /// The bindings of one service, in instance id order (a service snapshot for agents).
    pub fn service(&self, key: &ServiceKey) -> impl Iterator<Item = (&InstanceId, &Binding)> {
        self.services.get(key).into_iter().flatten()
    }

    /// Number of bindings held (tombstones included).
    pub fn binding_count(&self) -> usize {
        self.services.values().map(BTreeMap::len).sum()
    }

    /// When `node`'s lease clock started (leader monotonic ms), if the state tracks it as down.
    ///
    /// A down node that owns no live record any more is forgotten after an
    /// [`AuthorityCommand::ExpireLeases`]; the driver proposes [`AuthorityCommand::NodeDown`]
    /// again whenever its mesh view says "down" and this says `None`.
    pub fn down_since_ms(&self, node: &NodeId) -> Option<u64> {
        self.down_nodes.get(node).copied()
    }

    /// The lease checkpoint counter: a new leader measures the time since it applied this one
    /// (see [`LeaseCredit`](crate::command::LeaseCredit)).
    pub fn lease_checkpoint(&self) -> u64 {
        self.lease_checkpoint
    }

    /// How long `node` has been down at `now_ms` (current leader's clock) as far as the lease
    /// safety net counts: checkpointed downtime plus time since its lease-clock start.
    pub fn downtime_ms(&self, node: &NodeId, now_ms: u64) -> Option<u64> {
        let since = *self.down_nodes.get(node)?;
        let carried = self.down_carried_ms.get(node).copied().unwrap_or(0);
        Some(carried.saturating_add(now_ms.saturating_sub(since)))
    }

    /// Every node tracked as down with its lease-clock start, in node order.
    pub fn down_nodes(&self) -> impl Iterator<Item = (&NodeId, u64)> {
        self.down_nodes.iter().map(|(n, t)| (n, *t))
    }

    /// The earliest leader-monotonic ms at which an [`AuthorityCommand::ExpireLeases`] would
    /// expire something, or `None` if nothing is on a lease clock. Lets the leader propose the
    /// batch only when it is due instead of polling through the Raft log.
    pub fn next_lease_deadline_ms(&self) -> Option<u64> {
        if self.down_nodes.is_empty() {
            return None;
        }
        self.bindings()
            .filter(|(_, _, b)| b.state() != LifecycleState::Expired)
            .filter_map(|(_, _, b)| {
                let since = self.down_nodes.get(b.node())?;
                let carried = self.down_carried_ms.get(b.node()).copied().unwrap_or(0);
                let left = u64::from(b.lease_ms()).saturating_sub(carried);
                Some(since.saturating_add(left))
            })
            .min()
    }

    /// The signed policy document of `key`, if one was stored.
    pub fn policy(&self, key: &ServiceKey) -> Option<&SignedPolicy> {
        self.policies.get(key)
    }

    /// Every stored policy, in service key order.
    pub fn policies(&self) -> impl Iterator<Item = &SignedPolicy> {
        self.policies.values()
    }

    /// The key bound for `node` (what its records carry as `owner_key`), if any.
    pub fn node_key(&self, node: &NodeId) -> Option<NodeKey> {
        self.node_keys.get(node).and_then(|n| n.key)
    }

    /// What is stored about `node`'s key, if anything.
    pub fn node_key_state(&self, node: &NodeId) -> Option<&NodeKeyState> {
        self.node_keys.get(node)
    }

    /// True when an operator revoked `node` and did not readmit it.
    pub fn node_revoked(&self, node: &NodeId) -> bool {
        self.node_keys.get(node).is_some_and(|n| n.revoked)
    }

    /// The audit log.
    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    // ---- the mutator ---------------------------------------------------------------------

    /// Applies one committed command.
    ///
    /// Returns the signed lifecycle records it emitted, in revision order (empty for liveness,
    /// takeover and policy commands; read a stored policy back with
    /// [`AuthorityState::policy`]). Every record passed `shoal_catalog::check_transition`, is
    /// signed with `ctx.signing_key`, and has revision `head_revision() + 1, + 2, ...`.
    ///
    /// Every call, accepted or refused, appends one audit entry and records `ctx.log_index`
    /// as applied.
    ///
    /// # Errors
    /// A [`Refusal`] saying why; then nothing but the audit log and the last applied index
    /// changed.
    pub fn apply(
        &mut self,
        cmd: AuthorityCommand,
        ctx: ApplyContext<'_>,
    ) -> Result<Vec<SignedLifecycle>, Refusal> {
        self.apply_on_behalf(cmd, ctx, None)
    }

    /// As [`AuthorityState::apply`], naming in the audit entry the local process an agent
    /// forwarded the command for (`on_behalf_of`; it takes no part in the decision).
    ///
    /// # Errors
    /// As [`AuthorityState::apply`].
    pub fn apply_on_behalf(
        &mut self,
        cmd: AuthorityCommand,
        ctx: ApplyContext<'_>,
        on_behalf_of: Option<LocalCaller>,
    ) -> Result<Vec<SignedLifecycle>, Refusal> {
        let caller = caller_id(&cmd);
        let command = summary(&cmd);
        let result = self.execute(cmd, ctx);
        let outcome = match &result {
            Ok((records, policy_revision)) => AuditOutcome::Accepted {
                records: u32::try_from(records.len()).expect("batches are bounded"),
                policy_revision: *policy_revision,
            },
            Err(refusal) => AuditOutcome::Refused(refusal.clone()),
        };
        self.audit.push(AuditEntry {
            seq: 0,
            log_index: ctx.log_index,
            committed_at_ms: ctx.committed_at_ms,
            caller,
            on_behalf_of,
            command,
            outcome,
            revision: self.head_revision(),
        });
        debug_assert!(self.down_nodes.len() <= MAX_DOWN_NODES);
        debug_assert!(self.policies.len() <= MAX_POLICIES);
        result.map(|(records, _)| records)
    }

    fn execute(
        &mut self,
        cmd: AuthorityCommand,
        ctx: ApplyContext<'_>,
    ) -> Result<(Vec<SignedLifecycle>, Option<Revision>), Refusal> {
        if ctx.log_index <= self.last_applied_index {
            return Err(InvalidRequest::LogIndexNotIncreasing {
                log_index: ctx.log_index,
                last_applied: self.last_applied_index,
            }
            .into());
        }
        self.last_applied_index = ctx.log_index;
        match cmd {
            AuthorityCommand::Register {
                caller,
                key,
                instance,
                on_node,
                endpoint,
                lease_ms,
            } => {
                let req = RegisterRequest {
                    caller: &caller,
                    key,
                    instance,
                    on_node,
                    endpoint,
                    lease_ms,
                };
                let planned = self.plan_register(req, self.generation_at(ctx.log_index))?;
                Ok((self.emit(vec![planned], ctx), None))
            }
            AuthorityCommand::Transition {
                caller,
                key,
                instance,
                generation,
                to,
                reason,
            } => {
                let planned =
                    self.plan_transition(&caller, &key, &instance, generation, to, reason)?;
                Ok((self.emit(vec![planned], ctx), None))
            }
            AuthorityCommand::NodeDown { node, at_ms } => {
                self.node_down(node, at_ms)?;
                Ok((Vec::new(), None))
            }
            AuthorityCommand::NodeUp { node } => {
                self.down_nodes.remove(&node);
                self.down_carried_ms.remove(&node);
                Ok((Vec::new(), None))
            }
            AuthorityCommand::ExpireLeases { now_ms } => {
                let planned = self.plan_expiry(now_ms);
                let out = self.emit(planned, ctx);
                self.forget_idle_down_nodes();
                self.checkpoint_leases(now_ms);
                Ok((out, None))
            }
            AuthorityCommand::LeaderTakeover { now_ms, credit } => {
                self.take_over(now_ms, credit);
                Ok((Vec::new(), None))
            }
            AuthorityCommand::PutPolicy {
                caller,
                key,
                policy,
            } => {
                self.check_policy(&caller, &key, &policy)?;
                let revision = self.store_policy(key, policy, ctx);
                Ok((Vec::new(), Some(revision)))
            }
            AuthorityCommand::PutGlobalPolicy { signed, .. } => {
                self.put_global_policy(signed)?;
                Ok((Vec::new(), None))
            }
            AuthorityCommand::BindNodeKey { caller, key } => {
                let node = self.check_bind(&caller, &key)?;
                if self.node_key(&node) == Some(key) {
                    return Ok((Vec::new(), None));
                }
                self.node_keys.entry(node.clone()).or_default().key = Some(key);
                let planned = self.plan_for_node(&node, None, TransitionReason::NodeKeyChanged);
                Ok((self.emit(planned, ctx), None))
            }
            AuthorityCommand::RevokeNode { caller, node } => {
                self.check_operator_node(&caller, &node)?;
                let entry = self.node_keys.entry(node.clone()).or_default();
                entry.revoked = true;
                if let Some(k) = entry.key.take() {
                    if !entry.revoked_keys.contains(&k) {
                        entry.revoked_keys.push(k);
                    }
                    if entry.revoked_keys.len() > MAX_REVOKED_KEYS {
                        entry.revoked_keys.remove(0);
                    }
                }
                let planned = self.plan_for_node(
                    &node,
                    Some(LifecycleState::Expired),
                    TransitionReason::NodeRevoked,
                );
                Ok((self.emit(planned, ctx), None))
            }
            AuthorityCommand::ReadmitNode { caller, node } => {
                self.check_operator_node(&caller, &node)?;
                if let Some(entry) = self.node_keys.get_mut(&node) {
                    entry.revoked = false;
                }
                Ok((Vec::new(), None))
            }
        }
    }

    // ---- changing (&mut self) ------------------------------------------------------------

    /// Assigns revisions, signs and stores planned records, in order.
    fn emit(&mut self, planned: Vec<Planned>, ctx: ApplyContext<'_>) -> Vec<SignedLifecycle> {
        let mut out = Vec::with_capacity(planned.len());
        for Planned { from, mut record } in planned {
            debug_assert!(check_transition(from, record.state, record.reason).is_ok());
            debug_assert_eq!(record.region, self.region);
            record.revision = self.next_revision;
            record.committed_at_ms = ctx.committed_at_ms;
            self.next_revision = Revision(
                self.next_revision
                    .0
                    .checked_add(1)
                    .expect("2^64 revisions are never reached"),
            );
            let signed = ctx.signing_key.sign_lifecycle(record);
            self.store(signed.clone());
            out.push(signed);
        }
        out
    }

    fn store(&mut self, signed: SignedLifecycle) {
        let rec = &signed.record;
        let slot = self.services.entry(rec.key.clone()).or_default();
        let key = rec.instance.clone();
        if let Some(old) = slot.get(&key) {
            debug_assert!(old.current.record.order() < signed.record.order());
        }
        slot.insert(key, Binding { current: signed });
    }

    fn store_policy(
        &mut self,
        key: ServiceKey,
        policy: ServicePolicy,
        ctx: ApplyContext<'_>,
    ) -> Revision {
        let revision = self.next_policy_revision;
        self.next_policy_revision = revision.next();
        let signed = ctx.signing_key.sign_policy(PolicyRecord {
            key: key.clone(),
            region: self.region.clone(),
            revision,
            policy,
            committed_at_ms: ctx.committed_at_ms,
        });
        self.policies.insert(key, signed);
        revision
    }
}
