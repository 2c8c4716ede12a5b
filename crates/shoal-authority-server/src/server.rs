//! One authority replica: Raft node, agent RPC server, leader duties, metrics.
//!
//! # Requests
//! Agents (and operator tools) send [`AuthorityRequest`]s as stream messages to the replica's
//! `rpc_addr`. The caller is the peer certificate's node id: [`Caller::Operator`] when it
//! starts with `operator-` or is listed in `operators`, else [`Caller::Node`].
//! - **Writes** (`Register`, `Transition`, `PutPolicy`) are leader-only. A follower answers
//!   `NotLeader { leader: <leader rpc_addr> }` (no forwarding: the agent retries at the leader,
//!   one hop, and the follower never holds a request it cannot commit). A leader that has not
//!   heard from a quorum for `quorum_stale_ms`, or whose write does not commit within
//!   `write_timeout_ms`, answers `NoQuorum`. A rules refusal becomes `Refused { code, reason }`,
//!   except `AlreadyInState`, which answers `Committed` with the current record (a retried
//!   request whose first attempt committed, e.g. after a `NoQuorum` timeout, is idempotent).
//! - **Reads** (`GetPolicy`, `Status`) are answered by any replica from its applied state.
//!
//! # Leader duties
//! On becoming leader (each new term) the replica proposes `LeaderTakeover { now_ms }` before
//! anything else of its own, then every `expire_interval_ms` proposes `ExpireLeases { now_ms }`
//! when the state says a lease deadline has passed. `now_ms` is this process's monotonic clock.
//! Lease and liveness duties wait until this term's takeover has committed.
//!
//! # The embedded mesh member
//! With `mesh_addr` set, every replica runs an ordinary mesh member ([`crate::member`]).
//! - **Publishing**: every replica hands each applied signed lifecycle record (client writes
//!   and `ExpireLeases` batches) to its member, which disseminates it. Followers publish too:
//!   if the leader dies between commit and publish (an expiry batch has no requesting agent
//!   to relay it), a follower's member still carries the record; a record already received
//!   through the mesh merges as a duplicate and is not pushed again.
//! - **Liveness** (leader only): on every membership change and every `expire_interval_ms`
//!   the leader reconciles its member's view with the state: `NodeDown { node, at_ms }` for a
//!   node owning live records that the view holds down (or, past `absent_grace_ms` of being
//!   active, has never seen alive) and the state does not track; `NodeUp` for a tracked node
//!   the view sees alive. No `NodeDown` is proposed while the member is not active or more
//!   than `max_down_percent` of the nodes it knows are down: an isolated member must not
//!   start the lease clock of a whole region.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use metrics::{counter, gauge, histogram};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ServerState, SnapshotPolicy};
use shoal_authority::{AuthorityCommand, Caller, Refusal};
use shoal_proto::envelope::{self, MessageKind, MAX_STREAM_MESSAGE_BYTES};
use shoal_proto::rpc::{
    AuthorityError, AuthorityOk, AuthorityReply, AuthorityRequest, AuthorityRequestBody,
    AuthorityStatus, LocalCaller,
};
use shoal_proto::{NodeId, Revision};
use shoal_transport::certs::NodeIdentity;
use shoal_transport::tls::{self, TlsPaths, TlsState};
use shoal_transport::transport::{Channel, Inbound, Transport, TransportConfig};
use tokio::sync::{mpsc, watch, Semaphore};

use crate::config::AuthorityConfig;
use crate::member::{self, MemberHandle, MemberSettings, MeshView};
use crate::network::{Network, RaftRpc};
use crate::storage::{
    self, Applied, DirLock, LogStore, StateMachineStore, AUDIT_FILE, SNAPSHOT_REQUEST_FILE,
};
use crate::types::{Proposal, Raft, RaftId};

mod membership;
pub use membership::{is_majority, MAX_CATCH_UP_MS};

/// Clock skew (ms) assumed between replicas' wall clocks when a new leader credits the time
/// since the latest lease checkpoint by wall clock (NTP keeps hosts within a few ms).
pub const LEASE_CREDIT_SKEW_MS: u64 = 250;

/// Capacity of the queue of applied records waiting to be published.
pub const APPLIED_QUEUE: usize = 4_096;

/// Unix wall-clock ms (what records carry as `committed_at_ms`).
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Stable machine-readable code of a refusal (the `code` of `AuthorityError::Refused`).
pub fn refusal_code(r: &Refusal) -> &'static str {
    match r {
        Refusal::NotOwner { .. } => "not_owner",
        Refusal::UnknownInstance => "unknown_instance",
        Refusal::StaleGeneration { .. } => "stale_generation",
        Refusal::UnknownGeneration { .. } => "unknown_generation",
        Refusal::IllegalTransition { .. } => "illegal_transition",
        Refusal::AlreadyInState(_) => "already_in_state",
        Refusal::Expired => "expired",
        Refusal::InvalidRequest(_) => "invalid_request",
        Refusal::NotAllowed => "not_allowed",
        Refusal::CapacityExhausted { .. } => "capacity_exhausted",
        Refusal::NodeRevoked { .. } => "node_revoked",
    }
}

/// Maps a peer identity to the caller the state machine authorises.
pub fn caller_of(peer: &NodeIdentity, operators: &BTreeSet<String>) -> Caller {
    let id = peer.node_id.as_str();
    if id.starts_with("operator-") || operators.contains(id) {
        Caller::Operator
    } else {
        Caller::Node(peer.node_id.clone())
    }
}

/// A running replica.
pub struct Replica {
    cfg: AuthorityConfig,
    raft: Raft,
    sm: StateMachineStore,
    rpc: Transport,
    raft_rpc: Arc<RaftRpc>,
    started: Instant,
    operators: BTreeSet<String>,
    inflight: Arc<Semaphore>,
    audit: std::sync::Mutex<Option<std::fs::File>>,
    takeover_term: AtomicU64,
    /// The term whose `LeaderTakeover` has committed (lease and liveness duties wait for it).
    takeover_done: AtomicU64,
    liveness_busy: AtomicBool,
    expire_busy: AtomicBool,
    /// Monotonic ms of the last `ExpireLeases` proposal (the lease checkpoint cadence).
    last_checkpoint_ms: AtomicU64,
    /// The term this replica last saw itself leader of, and since when.
    leader_since: std::sync::Mutex<Option<(u64, Instant)>>,
    member: Option<MemberHandle>,
    /// Cross-region duties: global policy checks, remote summaries (ADR 0013).
    regions: Arc<crate::regions::Regions>,
    /// Reloads the TLS material of every transport on SIGHUP.
    reloader: tokio::task::JoinHandle<()>,
    tls: TlsState,
    /// The data directory's lock, held while the replica runs (restore refuses while held).
    _lock: DirLock,
}

/// Most liveness commands proposed per reconciliation round.
pub const MAX_LIVENESS_PROPOSALS: usize = 256;

/// The liveness commands that bring the state in line with the member's view (see the
/// module docs). Pure; exposed for tests.
pub fn liveness_plan(
    state: &shoal_authority::AuthorityState,
    view: &MeshView,
    now_ms: u64,
    absent_grace_ms: u64,
    max_down_percent: u8,
) -> Vec<AuthorityCommand> {
    let mut out = Vec::new();
    for (node, _) in state.down_nodes() {
        if view.alive.contains(node) {
            out.push(AuthorityCommand::NodeUp { node: node.clone() });
        }
    }
    if !view.active {
        out.truncate(MAX_LIVENESS_PROPOSALS);
        return out;
    }
    let owners: BTreeSet<&NodeId> = state
        .bindings()
        .filter(|(_, _, b)| b.state() != shoal_proto::LifecycleState::Expired)
        .map(|(_, _, b)| b.node())
        .collect();
    let absent_ok = absent_grace_ms > 0
        && view
            .active_since_ms
            .is_some_and(|t| now_ms.saturating_sub(t) >= absent_grace_ms);
    let mut downs = Vec::new();
    let mut absent = 0usize;
    for node in &owners {
        if view.alive.contains(*node) {
            continue;
        }
        let at = match view.down.get(*node) {
            Some(at) => *at,
            None if absent_ok => {
                absent += 1;
                now_ms
            }
            None => continue,
        };
        if state.down_since_ms(node).is_none() {
            downs.push(AuthorityCommand::NodeDown {
                node: (*node).clone(),
                at_ms: at,
            });
        }
    }
    let known = view.alive.len() + view.down.len() + absent;
    let down = view.down.len() + absent;
    if down * 100 > known * usize::from(max_down_percent) {
        if !downs.is_empty() {
            counter!("shoal_authority_liveness_suppressed_total").increment(downs.len() as u64);
        }
        downs.clear();
    }
    out.extend(downs);
    out.truncate(MAX_LIVENESS_PROPOSALS);
    out
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.cfg.id)
            .finish_non_exhaustive()
    }
}

fn transport_config(listen: SocketAddr, tls: &TlsState) -> TransportConfig {
    let mut t = TransportConfig::with_tls(listen, tls.clone());
    t.max_stream_message_bytes = MAX_STREAM_MESSAGE_BYTES;
    t.max_connections = 4_096;
    t.idle_timeout_ms = 10_000;
    t.keep_alive_ms = 2_000;
    t
}

impl Replica {
    /// Opens storage, binds both transports, starts Raft (initialising a pristine cluster from
    /// the lowest member id) and spawns every task. Returns when the replica is serving.
    ///
    /// # Errors
    /// Bad certificates or key, damaged storage (refused, see [`crate::storage`]), an address
    /// that cannot be bound, or openraft refusing the configuration.
    pub async fn start(cfg: AuthorityConfig) -> anyhow::Result<Arc<Self>> {
        cfg.validate()?;
        let tls_paths = TlsPaths {
            ca: cfg.ca.clone(),
            cert: cfg.cert.clone(),
            key: cfg.key.clone(),
        };
        let tls = TlsState::from_files(&cfg.region, &tls_paths).context("TLS material")?;
        let signing_key = cfg.load_signing_key()?;
        let lock = storage::lock_data_dir(&cfg.data_dir).context("locking the data directory")?;
        let me = cfg.me().clone();
        let started = Instant::now();

        let member = match cfg.mesh_addr {
            None => None,
            Some(listen) => {
                let (zone, mesh) = cfg.mesh_settings_parts()?;
                let mut keyring = shoal_catalog::Keyring::new();
                keyring.trust_authority(cfg.region.clone(), signing_key.verifying_key());
                let settings = MemberSettings {
                    listen,
                    seeds: cfg.mesh_seeds.clone(),
                    region: cfg.region.clone(),
                    zone,
                    mesh,
                    keyring,
                    tls: tls.clone(),
                    join_max_ms: cfg.mesh.join_max_ms,
                };
                let node: NodeId = me
                    .node
                    .parse()
                    .map_err(|e| anyhow::anyhow!("members[].node {}: {e}", me.node))?;
                let boot = member::bump_boot(&cfg.data_dir).context("mesh boot generation")?;
                Some(member::start(settings, node, boot, started)?)
            }
        };

        let (applied_tx, applied_rx) = mpsc::channel(APPLIED_QUEUE);
        let log = LogStore::open(&cfg.data_dir).context("opening the raft log")?;
        let pristine = log.last_index().is_none() && log.vote().is_none();
        let summary_key = signing_key.clone();
        let sm = StateMachineStore::open(
            &cfg.data_dir,
            cfg.region.clone(),
            signing_key,
            Some(applied_tx),
        )
        .context("opening the state machine")?;
        let regions = Arc::new(crate::regions::Regions::new(
            cfg.region.clone(),
            cfg.failover.clone(),
            summary_key,
            sm.clone(),
            member.clone(),
        )?);

        let (raft_t, raft_in) = Transport::bind(transport_config(
            crate::config::resolve_now(&me.raft_addr)?,
            &tls,
        ))?;
        if raft_t.identity().node_id.as_str() != me.node {
            anyhow::bail!(
                "certificate node id {} does not match members[].node {}",
                raft_t.identity().node_id,
                me.node
            );
        }
        let (rpc_t, rpc_in) = Transport::bind(transport_config(
            crate::config::resolve_now(&me.rpc_addr)?,
            &tls,
        ))?;
        let raft_rpc = RaftRpc::new(raft_t);
        let (sm_view, log_view) = (sm.clone(), log.clone());
        raft_rpc.set_cluster_source(
            Box::new(move || {
                let (id, sm_pristine) = sm_view.cluster_tag();
                let log_pristine = log_view.last_index().is_none() && log_view.vote().is_none();
                (id, sm_pristine && log_pristine)
            }),
            &cfg.data_dir,
        );

        let raft_config = openraft::Config {
            cluster_name: format!("shoal-{}", cfg.region),
            heartbeat_interval: cfg.heartbeat_ms,
            election_timeout_min: cfg.election_timeout_ms,
            election_timeout_max: cfg.election_timeout_ms * 2,
            install_snapshot_timeout: 2_000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_every_logs),
            max_in_snapshot_log_to_keep: cfg.keep_logs_after_snapshot,
            snapshot_max_chunk_size: 256 * 1024,
            purge_batch_size: 64,
            ..Default::default()
        }
        .validate()?;
        let raft = Raft::new(
            cfg.id,
            Arc::new(raft_config),
            Network::new(raft_rpc.clone()),
            log,
            sm.clone(),
        )
        .await?;
        let members: BTreeSet<String> = cfg.members.iter().map(|m| m.node.clone()).collect();
        tokio::spawn(raft_rpc.clone().serve(raft_in, raft.clone(), members));

        let lowest = cfg.members.iter().map(|m| m.id).min().expect("validated");
        if cfg.join {
            tracing::info!(
                "join = true: waiting to be added by `shoal authority members add` (never initialises a cluster)"
            );
        } else if pristine && cfg.id == lowest {
            tracing::info!(members = ?cfg.raft_members(), "pristine lowest-id replica: initialising the cluster");
            if let Err(e) = raft.initialize(cfg.raft_members()).await {
                tracing::warn!(error = %e, "initialize");
            }
        }

        let audit = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(cfg.data_dir.join(AUDIT_FILE))
            .ok();
        let replica = Arc::new(Self {
            operators: cfg.operators.iter().cloned().collect(),
            inflight: Arc::new(Semaphore::new(cfg.max_inflight_requests)),
            cfg,
            raft,
            sm,
            rpc: rpc_t,
            raft_rpc,
            started,
            audit: std::sync::Mutex::new(audit),
            takeover_term: AtomicU64::new(0),
            takeover_done: AtomicU64::new(0),
            liveness_busy: AtomicBool::new(false),
            expire_busy: AtomicBool::new(false),
            last_checkpoint_ms: AtomicU64::new(0),
            leader_since: std::sync::Mutex::new(None),
            member: member.clone(),
            regions: regions.clone(),
            reloader: tls::spawn_reloader(
                tls.clone(),
                tls_paths,
                Duration::from_secs(10),
                tls::record_metrics,
            )
            .context("SIGHUP handler")?,
            tls,
            _lock: lock,
        });
        tokio::spawn(replica.clone().serve_rpc(rpc_in));
        tokio::spawn(replica.clone().leader_duties());
        tokio::spawn(drain_applied(applied_rx, member));
        let relay = Arc::downgrade(&replica);
        tokio::spawn(crate::regions::pull_loop(regions, move |signed| {
            let relay = relay.clone();
            async move {
                let Some(r) = relay.upgrade() else {
                    return Err(AuthorityError::NoQuorum);
                };
                let me = r.tls().identity().clone();
                r.handle(&me, AuthorityRequestBody::PutGlobalPolicy { signed })
                    .await
            }
        }));
        tracing::info!(id = replica.cfg.id, node = %me.node, rpc = %me.rpc_addr, raft = %me.raft_addr, "authority replica started");
        Ok(replica)
    }

    /// The Raft handle.
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The state machine.
    pub fn state_machine(&self) -> &StateMachineStore {
        &self.sm
    }

    fn mono_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Builds a snapshot now (also done every `snapshot_every_logs` entries).
    ///
    /// # Errors
    /// Raft has stopped.
    pub async fn snapshot_now(&self) -> anyhow::Result<()> {
        self.raft.trigger().snapshot().await?;
        Ok(())
    }

    /// The embedded mesh member, when configured.
    pub fn member(&self) -> Option<&MemberHandle> {
        self.member.as_ref()
    }

    /// Builds a final snapshot, stops Raft, leaves the mesh and closes the transports.
    pub async fn shutdown(&self) {
        self.reloader.abort();
        let _ = self.snapshot_now().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = self.raft.shutdown().await;
        if let Some(m) = &self.member {
            m.shutdown().await;
        }
        self.rpc.shutdown().await;
        self.raft_rpc.transport().shutdown().await;
    }

    /// The TLS material shared by the replica's transports (Raft, RPC, mesh member);
    /// SIGHUP reloads it from the configured files.
    pub fn tls(&self) -> &TlsState {
        &self.tls
    }

    /// This replica's status.
    pub fn status(&self) -> AuthorityStatus {
        let m = self.raft.metrics().borrow().clone();
        let node_of = |id: RaftId| -> Option<NodeId> {
            m.membership_config
                .membership()
                .get_node(&id)
                .and_then(|n| n.node.parse().ok())
        };
        let (revision, cluster_id): (Revision, Option<String>) = self.sm.with_state(|s| {
            (
                s.head_revision(),
                s.incarnation().map(|i| i.cluster_id.clone()),
            )
        });
        AuthorityStatus {
            node: self
                .cfg
                .me()
                .node
                .parse()
                .unwrap_or_else(|_| "unknown".parse().expect("valid node id")),
            leader: m.current_leader.and_then(node_of),
            term: m.current_term,
            applied_index: m.last_applied.map_or(0, |l| l.index),
            revision,
            members: m
                .membership_config
                .membership()
                .voter_ids()
                .filter_map(node_of)
                .collect(),
            cluster_id,
        }
    }

    fn leader_rpc_addr(&self) -> Option<String> {
        let m = self.raft.metrics().borrow().clone();
        let leader = m.current_leader?;
        m.membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.rpc_addr.clone())
    }

    async fn serve_rpc(self: Arc<Self>, mut inbound: mpsc::Receiver<Inbound>) {
        while let Some(msg) = inbound.recv().await {
            if msg.channel != Channel::Stream {
                continue; // the RPC endpoint carries no SWIM (the member has its own address)
            }
            let req: AuthorityRequest = match envelope::decode(
                &msg.bytes,
                MessageKind::AuthorityRequest,
                MAX_STREAM_MESSAGE_BYTES,
            ) {
                Ok(r) => r,
                Err(e) => {
                    counter!("shoal_authority_rpc_rejected_total", "reason" => e.as_label())
                        .increment(1);
                    continue;
                }
            };
            let Ok(permit) = self.inflight.clone().try_acquire_owned() else {
                counter!("shoal_authority_rpc_rejected_total", "reason" => "overload").increment(1);
                self.reply(msg.from, req.request_id, Err(AuthorityError::NoQuorum));
                continue;
            };
            let this = self.clone();
            tokio::spawn(async move {
                let on_behalf_of = req.on_behalf_of.map(LocalCaller::bounded);
                let result = this.handle_for(&msg.peer, req.body, on_behalf_of).await;
                this.reply(msg.from, req.request_id, result);
                drop(permit);
            });
        }
    }

    fn reply(&self, to: SocketAddr, request_id: u64, result: Result<AuthorityOk, AuthorityError>) {
        let reply = AuthorityReply { request_id, result };
        match envelope::encode(
            MessageKind::AuthorityReply,
            &reply,
            MAX_STREAM_MESSAGE_BYTES,
        ) {
            Ok(bytes) => {
                if let Err(e) = self.rpc.send_stream_message(to, bytes) {
                    tracing::debug!(error = %e, %to, "reply not sent");
                }
            }
            Err(e) => tracing::warn!(error = %e, "reply too large"),
        }
    }

    /// Handles one request from `peer` (exposed for in-process tests).
    pub async fn handle(
        &self,
        peer: &NodeIdentity,
        body: AuthorityRequestBody,
    ) -> Result<AuthorityOk, AuthorityError> {
        self.handle_for(peer, body, None).await
    }

    /// As [`Replica::handle`], for a request an agent forwards on behalf of a local process
    /// (recorded in the audit log, never used to decide).
    pub async fn handle_for(
        &self,
        peer: &NodeIdentity,
        body: AuthorityRequestBody,
        on_behalf_of: Option<LocalCaller>,
    ) -> Result<AuthorityOk, AuthorityError> {
        let caller = caller_of(peer, &self.operators);
        if !crate::regions::gateway_may(peer.node_id.as_str(), &body) {
            return Err(AuthorityError::Refused {
                code: "gateway_read_only".into(),
                reason: "gateway identities (other regions' authorities) may only read".into(),
            });
        }
        let (cmd, policy_key) = match body {
            AuthorityRequestBody::Status => return Ok(AuthorityOk::Status(self.status())),
            AuthorityRequestBody::Members(op) => return self.members(peer, &caller, op).await,
            AuthorityRequestBody::GetGlobalPolicy => {
                return Ok(AuthorityOk::GlobalPolicy(
                    self.sm.with_state(|s| s.global_policy().cloned()),
                ))
            }
            AuthorityRequestBody::RegionSummaries {
                keys,
                policy_version,
            } => return Ok(self.regions.serve_summaries(keys, policy_version).await),
            AuthorityRequestBody::FailoverFeed { policy_version } => {
                return Ok(self.regions.feed(policy_version))
            }
            AuthorityRequestBody::PutGlobalPolicy { signed } => {
                self.regions.verify_policy(&signed)?;
                let cmd = AuthorityCommand::PutGlobalPolicy { caller, signed };
                self.write(cmd, on_behalf_of).await?;
                return Ok(AuthorityOk::GlobalPolicy(
                    self.sm.with_state(|s| s.global_policy().cloned()),
                ));
            }
            AuthorityRequestBody::GetPolicy { key } => {
                return Ok(AuthorityOk::Policy(
                    self.sm.with_state(|s| s.policy(&key).cloned()),
                ))
            }
            AuthorityRequestBody::Register {
                key,
                instance,
                on_node,
                endpoint,
                lease_ms,
            } => (
                AuthorityCommand::Register {
                    caller,
                    key,
                    instance,
                    on_node,
                    endpoint,
                    lease_ms,
                },
                None,
            ),
            AuthorityRequestBody::Transition {
                key,
                instance,
                generation,
                to,
                reason,
            } => (
                AuthorityCommand::Transition {
                    caller,
                    key,
                    instance,
                    generation,
                    to,
                    reason,
                },
                None,
            ),
            AuthorityRequestBody::PutPolicy { key, policy } => (
                AuthorityCommand::PutPolicy {
                    caller,
                    key: key.clone(),
                    policy,
                },
                Some(key),
            ),
            AuthorityRequestBody::BindNodeKey { key } => {
                if self.sm.with_state(
                    |s| matches!(&caller, Caller::Node(n) if s.node_key(n) == Some(key)),
                ) {
                    // Every agent start: already bound, nothing to commit.
                    return Ok(AuthorityOk::Committed {
                        records: Vec::new(),
                    });
                }
                (AuthorityCommand::BindNodeKey { caller, key }, None)
            }
            AuthorityRequestBody::RevokeNode { node } => {
                (AuthorityCommand::RevokeNode { caller, node }, None)
            }
            AuthorityRequestBody::ReadmitNode { node } => {
                (AuthorityCommand::ReadmitNode { caller, node }, None)
            }
        };
        let started = Instant::now();
        let res = self.write(cmd.clone(), on_behalf_of.clone()).await;
        let outcome = match &res {
            Ok(_) => "committed",
            Err(AuthorityError::Refused { .. }) => "refused",
            Err(AuthorityError::NotLeader { .. }) => "not_leader",
            Err(AuthorityError::NoQuorum) => "no_quorum",
            Err(AuthorityError::Invalid(_)) => "invalid",
        };
        counter!("shoal_authority_writes_total", "outcome" => outcome).increment(1);
        if res.is_ok() {
            histogram!("shoal_authority_commit_latency_seconds")
                .record(started.elapsed().as_secs_f64());
        }
        if let Err(e) = &res {
            if !matches!(e, AuthorityError::Refused { .. }) {
                self.audit_rejected(peer, on_behalf_of.as_ref(), &cmd, e);
            }
        }
        match (res, policy_key) {
            (Ok(_), Some(key)) => Ok(AuthorityOk::Policy(
                self.sm.with_state(|s| s.policy(&key).cloned()),
            )),
            (Ok(records), None) => Ok(AuthorityOk::Committed { records }),
            (Err(e), _) => Err(e),
        }
    }

    /// Proposes `cmd` and waits for its outcome, bounded by `write_timeout_ms`.
    async fn write(
        &self,
        cmd: AuthorityCommand,
        on_behalf_of: Option<LocalCaller>,
    ) -> Result<Vec<shoal_proto::SignedLifecycle>, AuthorityError> {
        let m = self.raft.metrics().borrow().clone();
        if m.state != ServerState::Leader {
            return Err(AuthorityError::NotLeader {
                leader: self.leader_rpc_addr(),
            });
        }
        if m.millis_since_quorum_ack
            .is_some_and(|ms| ms > self.cfg.quorum_stale_ms)
        {
            return Err(AuthorityError::NoQuorum);
        }
        let retry = match &cmd {
            AuthorityCommand::Transition { key, instance, .. } => {
                Some((key.clone(), instance.clone()))
            }
            _ => None,
        };
        let proposal = Proposal {
            cmd,
            proposed_at_ms: wall_ms(),
            on_behalf_of,
        };
        let timeout = Duration::from_millis(self.cfg.write_timeout_ms);
        let res = match tokio::time::timeout(timeout, self.raft.client_write(proposal)).await {
            Err(_) => return Err(AuthorityError::NoQuorum),
            Ok(r) => r,
        };
        match res {
            Ok(resp) => match resp.data {
                Ok(records) => Ok(records),
                Err(Refusal::AlreadyInState(_)) if retry.is_some() => {
                    let (key, instance) = retry.expect("checked");
                    counter!("shoal_authority_refusals_total", "code" => "already_in_state")
                        .increment(1);
                    Ok(self.sm.with_state(|s| {
                        s.binding(&key, &instance)
                            .map(|b| vec![b.current().clone()])
                            .unwrap_or_default()
                    }))
                }
                Err(refusal) => {
                    let code = refusal_code(&refusal);
                    counter!("shoal_authority_refusals_total", "code" => code).increment(1);
                    Err(AuthorityError::Refused {
                        code: code.to_string(),
                        reason: refusal.to_string(),
                    })
                }
            },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(AuthorityError::NotLeader {
                    leader: f.leader_node.map(|n| n.rpc_addr),
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "client_write failed");
                Err(AuthorityError::NoQuorum)
            }
        }
    }

    fn audit_rejected(
        &self,
        peer: &NodeIdentity,
        on_behalf_of: Option<&LocalCaller>,
        cmd: &AuthorityCommand,
        e: &AuthorityError,
    ) {
        self.audit_line(&serde_json::json!({
            "rpc_rejected": {
                "at_ms": wall_ms(),
                "peer": peer.node_id.as_str(),
                "on_behalf_of": on_behalf_of,
                "command": format!("{cmd:?}"),
                "error": e.to_string(),
            }
        }));
    }

    /// Appends one JSON line to this replica's `audit.log` (RPC-layer events; applied
    /// commands are audited by the state machine).
    fn audit_line(&self, line: &serde_json::Value) {
        if let Some(f) = self.audit.lock().expect("audit lock").as_mut() {
            use std::io::Write;
            if let Err(e) = writeln!(f, "{line}") {
                tracing::error!(error = %e, "audit.log append failed");
            }
        }
    }

    /// Leader duties: `LeaderTakeover` once per term won, periodic `ExpireLeases`, metrics.
    async fn leader_duties(self: Arc<Self>) {
        let mut metrics: watch::Receiver<_> = self.raft.metrics();
        let mut tick = tokio::time::interval(Duration::from_millis(self.cfg.expire_interval_ms));
        let mut last_leader: Option<RaftId> = None;
        let member = self.member.clone();
        loop {
            tokio::select! {
                r = metrics.changed() => if r.is_err() { return },
                _ = tick.tick() => {},
                () = async { match &member { Some(m) => m.changed().await, None => std::future::pending().await } } => {},
            }
            let m = metrics.borrow().clone();
            gauge!("shoal_authority_term").set(m.current_term as f64);
            gauge!("shoal_authority_applied_index")
                .set(m.last_applied.map_or(0, |l| l.index) as f64);
            let is_leader = m.state == ServerState::Leader;
            gauge!("shoal_authority_is_leader").set(if is_leader { 1.0 } else { 0.0 });
            let quorum = m.current_leader.is_some()
                && (!is_leader
                    || m.millis_since_quorum_ack
                        .is_some_and(|ms| ms <= self.cfg.quorum_stale_ms));
            gauge!("shoal_authority_quorum").set(if quorum { 1.0 } else { 0.0 });
            let request = self.cfg.data_dir.join(SNAPSHOT_REQUEST_FILE);
            if request.exists() {
                // An operator's `snapshot save` found no snapshot: build one now.
                let _ = std::fs::remove_file(&request);
                tracing::info!("snapshot requested by an operator");
                if let Err(e) = self.snapshot_now().await {
                    tracing::warn!(error = %e, "requested snapshot");
                }
            }
            if m.current_leader != last_leader {
                if m.current_leader.is_some() {
                    counter!("shoal_authority_leader_changes_total").increment(1);
                }
                last_leader = m.current_leader;
            }
            if !is_leader {
                continue;
            }
            let term = m.current_term;
            if self.takeover_term.load(Ordering::Acquire) < term {
                // Apply everything in the log first, so the lease credit refers to the latest
                // checkpoint (a credit for an older one is ignored by the rules), but wait at
                // most one election timeout: a leader that restarted into its old term has
                // nothing committed until it proposes, and its takeover commits the rest.
                let applied = m.last_applied.map(|l| l.index);
                let since = *self
                    .leader_since
                    .lock()
                    .expect("leader_since")
                    .get_or_insert((term, Instant::now()));
                let waited = if since.0 == term {
                    since.1.elapsed()
                } else {
                    *self.leader_since.lock().expect("leader_since") = Some((term, Instant::now()));
                    Duration::ZERO
                };
                if applied < m.last_log_index
                    && waited < Duration::from_millis(self.cfg.election_timeout_ms)
                {
                    continue;
                }
                self.takeover_term.store(term, Ordering::Release);
                let this = self.clone();
                tokio::spawn(async move {
                    let now_ms = this.mono_ms();
                    // Wall-clock part of the credit: assume replicas' clocks within
                    // LEASE_CREDIT_SKEW_MS; cap it at a checkpoint interval plus two maximal
                    // elections (docs/adr/0008-lease-checkpoints.md).
                    let cap = this.cfg.lease_checkpoint_ms + 4 * this.cfg.election_timeout_ms;
                    let credit = Some(this.sm.lease_credit(wall_ms(), LEASE_CREDIT_SKEW_MS, cap));
                    match this
                        .write(AuthorityCommand::LeaderTakeover { now_ms, credit }, None)
                        .await
                    {
                        Ok(_) => {
                            this.takeover_done.fetch_max(term, Ordering::AcqRel);
                            tracing::info!(term, now_ms, "leader takeover committed");
                        }
                        Err(e) => {
                            tracing::warn!(term, error = %e, "leader takeover not committed");
                            // Retry at the next tick.
                            this.takeover_term
                                .store(term.saturating_sub(1), Ordering::Release);
                        }
                    }
                });
                continue;
            }
            if self.takeover_done.load(Ordering::Acquire) < term {
                continue; // the takeover is in flight: no lease or liveness entry before it
            }
            self.reconcile_liveness();
            let now_ms = self.mono_ms();
            let (due, any_down) = self.sm.with_state(|s| {
                (
                    s.next_lease_deadline_ms().is_some_and(|d| d <= now_ms),
                    s.down_nodes().next().is_some(),
                )
            });
            // While nodes are down, an ExpireLeases every lease_checkpoint_ms is also the lease
            // checkpoint a later leader resumes from (docs/adr/0008-lease-checkpoints.md).
            let checkpoint_due = any_down
                && now_ms.saturating_sub(self.last_checkpoint_ms.load(Ordering::Acquire))
                    >= self.cfg.lease_checkpoint_ms;
            let due = due || checkpoint_due;
            // One batch in flight at a time (the state is re-read after it applied).
            if due && !self.expire_busy.swap(true, Ordering::AcqRel) {
                let this = self.clone();
                this.last_checkpoint_ms.store(now_ms, Ordering::Release);
                tokio::spawn(async move {
                    match this
                        .write(AuthorityCommand::ExpireLeases { now_ms }, None)
                        .await
                    {
                        Ok(recs) if recs.is_empty() => {
                            tracing::debug!("lease checkpoint committed")
                        }
                        Ok(recs) => tracing::info!(expired = recs.len(), "lease safety net"),
                        Err(e) => tracing::warn!(error = %e, "expire leases not committed"),
                    }
                    this.expire_busy.store(false, Ordering::Release);
                });
            }
        }
    }
}

impl Replica {
    /// Leader only: proposes the liveness commands of [`liveness_plan`], one round at a time.
    fn reconcile_liveness(self: &Arc<Self>) {
        let Some(member) = &self.member else {
            return;
        };
        if self.liveness_busy.load(Ordering::Acquire) {
            return;
        }
        let now_ms = self.mono_ms();
        let knobs = &self.cfg.mesh;
        let plan = member.with_view(|view| {
            self.sm.with_state(|s| {
                liveness_plan(
                    s,
                    view,
                    now_ms,
                    knobs.absent_grace_ms,
                    knobs.max_down_percent,
                )
            })
        });
        if plan.is_empty() || self.liveness_busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            for cmd in plan {
                let (kind, up) = match &cmd {
                    AuthorityCommand::NodeDown { .. } => ("node_down", None),
                    AuthorityCommand::NodeUp { node } => ("node_up", Some(node.clone())),
                    _ => ("other", None),
                };
                let desc = format!("{cmd:?}");
                match this.write(cmd, None).await {
                    Ok(_) => {
                        counter!("shoal_authority_liveness_proposals_total", "kind" => kind)
                            .increment(1);
                        if let Some(node) = up {
                            let leases =
                                this.sm.with_state(|s| crate::renewals::leases_of(s, &node));
                            crate::renewals::record_node_up(leases);
                        }
                        tracing::info!(command = %desc, "liveness committed");
                    }
                    Err(e) => {
                        tracing::warn!(command = %desc, error = %e, "liveness not committed");
                        break;
                    }
                }
            }
            this.liveness_busy.store(false, Ordering::Release);
        });
    }
}

/// Consumes applied records: counts them and hands them to the embedded mesh member, which
/// disseminates them (bounded queue, drops counted). Without a member the records reach
/// agents through the requesting agent (which injects the signed reply) and anti-entropy.
async fn drain_applied(mut rx: mpsc::Receiver<Applied>, member: Option<MemberHandle>) {
    while let Some(a) = rx.recv().await {
        counter!("shoal_authority_records_signed_total").increment(a.records.len() as u64);
        if let Some(m) = &member {
            if m.publish(a.records) {
                counter!("shoal_authority_mesh_published_total").increment(1);
            }
        }
    }
}

/// Installs the Prometheus recorder and serves its text rendering on `addr` (plain HTTP/1.0,
/// one response per connection). Loopback addresses only.
///
/// # Errors
/// A non-loopback address, or the port cannot be bound.
pub async fn serve_metrics(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if !addr.ip().is_loopback() {
        anyhow::bail!("metrics_addr {addr} must be a loopback address");
    }
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
        ])?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).context("a metrics recorder is already installed")?;
    crate::metrics_describe::describe_all();
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            let body = handle.render();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = tokio::time::timeout(Duration::from_secs(2), sock.read(&mut buf)).await;
                let head = format!(
                    "HTTP/1.0 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(body.as_bytes()).await;
            });
        }
    });
    Ok(bound)
}

/// Runs a replica until SIGINT/SIGTERM, then shuts it down (final snapshot first).
///
/// # Errors
/// As [`Replica::start`], or the metrics endpoint cannot be bound.
pub async fn run(cfg: AuthorityConfig) -> anyhow::Result<()> {
    if let Some(addr) = cfg.metrics_addr {
        let bound = serve_metrics(addr).await?;
        tracing::info!(%bound, "metrics endpoint");
    }
    let replica = Replica::start(cfg).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // systemd `Type=notify`: storage opened, transports bound, Raft started (a no-op without
    // $NOTIFY_SOCKET; a failed send only logs).
    if let Err(e) = sd_notify::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status("replica started"),
    ]) {
        tracing::warn!(error = %e, "sd_notify to $NOTIFY_SOCKET failed");
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutting down");
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    replica.shutdown().await;
    Ok(())
}

/// Leader-only view used by tests: the voters as `(raft id, node)`.
pub fn members_of(cfg: &AuthorityConfig) -> BTreeMap<RaftId, String> {
    cfg.members.iter().map(|m| (m.id, m.node.clone())).collect()
}
