//! One authority replica: Raft node, agent RPC server, leader duties, metrics.
//!
//! # Requests
//! Agents (and operator tools) send [`AuthorityRequest`](shoal_proto::rpc::AuthorityRequest)s as stream messages to the replica's
//! `rpc_addr`. The caller is the peer certificate's node id: [`Caller::Operator`](shoal_authority::Caller::Operator) when it
//! starts with `operator-` or is listed in `operators`, else [`Caller::Node`](shoal_authority::Caller::Node).
//! - **Writes** (`Register`, `Transition`, `PutPolicy`) are leader-only. A follower answers
//!   `NotLeader { leader: <leader rpc_addr> }` (no forwarding: the agent retries at the leader,
//!   one hop, and the follower never holds a request it cannot commit). A leader that has not
//!   heard from a quorum for `quorum_stale_ms`, or whose write does not commit within
//!   `write_timeout_ms`, answers `NoQuorum`. A rules refusal becomes `Refused { code, reason }`,
//!   except `AlreadyInState`, which answers `Committed` with the current record (a retried
//!   request whose first attempt committed, e.g. after a `NoQuorum` timeout, is idempotent).
//! - **Retries**: a write whose `(caller, request_id)` this replica has seen in the last two
//!   minutes is not proposed again: while the first is in flight the copy is dropped (the
//!   first's reply carries the same id), after it committed it is answered with the same
//!   answer (`shoal_authority::replay`; `shoal_authority_replays_total{outcome}`).
//! - **Reads** (`GetPolicy`, `Status`) are answered by any replica from its applied state.
//!
//! # A stopped Raft core
//! openraft stops a replica's Raft core for good on a storage error (a full disk, an I/O error:
//! `Fatal::StorageError`), and its metrics keep the last leader and term the core knew. Such a
//! replica must not pose as healthy: [`run`] exits non-zero as soon as the core stops (ADR
//! 0023), so systemd or Kubernetes restarts it; a restart reopens the log (a torn tail is
//! cut), and the replica rejoins once its disk takes writes again. Until it has exited,
//! `Status` is refused with code `replica_stopped` and the cause, and writes answer
//! `NotLeader { leader: None }` (the caller tries another replica).
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
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use metrics::counter;
use openraft::SnapshotPolicy;
use shoal_proto::envelope::MAX_STREAM_MESSAGE_BYTES;
use shoal_proto::rpc::{AuthorityError, AuthorityRequestBody, AuthorityStatus};
use shoal_proto::{NodeId, Revision};
use shoal_transport::tls::{self, TlsState};
use shoal_transport::transport::{Transport, TransportConfig};
use tokio::sync::{mpsc, Semaphore};

use crate::config::AuthorityConfig;
use crate::member::{self, MemberHandle, MemberSettings};
use crate::network::{Network, RaftRpc};
use crate::storage::{self, Applied, DirLock, LogStore, StateMachineStore};
use crate::types::{Member, Raft, RaftId};

/// The replica's openraft metrics.
pub type RaftMetrics = openraft::RaftMetrics<RaftId, Member>;

mod leader;
mod membership;
mod rpc;
pub use leader::{liveness_plan, MAX_LIVENESS_PROPOSALS};
pub use membership::{is_majority, MAX_CATCH_UP_MS};
pub use rpc::caller_of;

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
    /// Committed answers of callers' writes, for their retries (`shoal_authority::replay`).
    replays: std::sync::Mutex<shoal_authority::ReplayCache>,
    takeover_term: AtomicU64,
    /// The term whose `LeaderTakeover` has committed (lease and liveness duties wait for it).
    takeover_done: AtomicU64,
    liveness_busy: AtomicBool,
    expire_busy: AtomicBool,
    /// Monotonic ms of the last `ExpireLeases` proposal (the lease checkpoint cadence).
    last_checkpoint_ms: AtomicU64,
    /// The term this replica last saw itself leader of, since when, and its last log index
    /// then (what the takeover waits to have applied).
    leader_since: std::sync::Mutex<Option<(u64, Instant, Option<u64>)>>,
    member: Option<MemberHandle>,
    /// Cross-region duties: global policy checks, remote summaries (ADR 0013).
    regions: Arc<crate::regions::Regions>,
    /// Reloads the TLS material of every transport on SIGHUP.
    reloader: tokio::task::JoinHandle<()>,
    tls: TlsState,
    /// The data directory's lock, held while the replica runs (restore refuses while held).
    _lock: DirLock,
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
        let tls_paths = cfg.tls.paths();
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
                    data_dir: cfg.data_dir.clone(),
                };
                let node: NodeId = me
                    .node
                    .parse()
                    .map_err(|e| anyhow::anyhow!("members[].node {}: {e}", me.node))?;
                let boot_file = member::bump_boot(&cfg.data_dir).context("mesh boot generation")?;
                Some(member::start(settings, node, boot_file, started)?)
            }
        };

        let (applied_tx, applied_rx) = mpsc::channel(APPLIED_QUEUE);
        // The error names the file (vote.bin, purged.bin or the log) that failed.
        let log = LogStore::open(&cfg.data_dir).with_context(|| {
            format!(
                "opening the raft vote, purge mark and log in {}",
                cfg.data_dir.display()
            )
        })?;
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

        let raft_addr = crate::config::resolve_now(&me.raft_addr)?;
        // `{e}`, not a context: the transport error names the address, and its `source()`
        // would print the OS error a second time.
        let (raft_t, raft_in) = Transport::bind(transport_config(raft_addr, &tls))
            .map_err(|e| anyhow::anyhow!("binding the raft listener (members[].raft_addr): {e}"))?;
        if raft_t.identity().node_id.as_str() != me.node {
            anyhow::bail!(
                "certificate node id {} does not match members[].node {}",
                raft_t.identity().node_id,
                me.node
            );
        }
        let rpc_addr = crate::config::resolve_now(&me.rpc_addr)?;
        // `{e}`, not a context: the transport error names the address, and its `source()`
        // would print the OS error a second time.
        let (rpc_t, rpc_in) = Transport::bind(transport_config(rpc_addr, &tls)).map_err(|e| {
            anyhow::anyhow!("binding the agent API listener (members[].rpc_addr): {e}")
        })?;
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

        let replica = Arc::new(Self {
            operators: cfg.operators.iter().cloned().collect(),
            inflight: Arc::new(Semaphore::new(cfg.max_inflight_requests)),
            replays: Default::default(),
            cfg,
            raft,
            sm,
            rpc: rpc_t,
            raft_rpc,
            started,
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

    /// Why this replica's Raft core has stopped (e.g. `storage error: ... No space left on
    /// device`); `None` while it runs. A stopped core never restarts in this process.
    pub fn core_stopped(&self) -> Option<String> {
        core_stopped(&self.raft.metrics().borrow())
    }

    /// Waits until the Raft core stops (on a storage error, or at shutdown) and returns why.
    pub async fn wait_core_stopped(&self) -> String {
        let mut rx = self.raft.metrics();
        loop {
            if let Some(cause) = core_stopped(&rx.borrow_and_update()) {
                return cause;
            }
            if rx.changed().await.is_err() {
                return core_stopped(&rx.borrow())
                    .unwrap_or_else(|| "the Raft core's metrics channel closed".to_owned());
            }
        }
    }

    /// This replica's status. `leader` is the leader this replica's running Raft core follows
    /// (or is); `None` once the core has stopped, whatever its last metrics said.
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
            leader: live_leader(&m).and_then(node_of),
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
}

/// Why the Raft core behind `m` has stopped (`Display` of openraft's `Fatal`), or `None` while
/// it runs.
pub fn core_stopped(m: &RaftMetrics) -> Option<String> {
    match &m.running_state {
        Ok(()) if m.state != openraft::ServerState::Shutdown => None,
        Ok(()) => Some("raft stopped".to_owned()),
        Err(openraft::error::Fatal::StorageError(e)) => Some(format!("storage error: {e}")),
        Err(e) => Some(e.to_string()),
    }
}

/// The leader a running Raft core backs: `current_leader` while the core runs, `None` once it
/// has stopped (openraft leaves the last leader it knew in the metrics then).
pub fn live_leader(m: &RaftMetrics) -> Option<RaftId> {
    if core_stopped(m).is_some() {
        return None;
    }
    m.current_leader
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
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics listener (metrics_addr) on {addr}"))?;
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
    let node = cfg.me().node.clone();
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
        cause = replica.wait_core_stopped() => {
            // openraft stopped the core for good (a storage error: full disk, I/O error). A
            // process that stays up would answer with a stale leader and never write again:
            // exit non-zero so the service manager restarts it (ADR 0023).
            tracing::error!(%cause, "the Raft core stopped: exiting so that the service manager restarts this replica");
            let status = format!("raft core stopped: {cause}");
            let _ = sd_notify::notify(&[
                sd_notify::NotifyState::Status(&status),
                sd_notify::NotifyState::Stopping,
            ]);
            replica.shutdown().await;
            anyhow::bail!("replica {node}: the Raft core stopped: {cause}");
        }
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

#[cfg(test)]
mod tests {
    use openraft::error::Fatal;
    use openraft::{AnyError, ServerState, StorageIOError};

    use super::*;

    /// QA finding A: after a storage error openraft's metrics still carry the last leader (and
    /// term); `status` must not name it, and the cause must be reported.
    #[test]
    fn a_stopped_core_backs_no_leader_and_names_its_cause() {
        let mut m = RaftMetrics::new_initial(3);
        m.current_leader = Some(3);
        m.state = ServerState::Leader;
        assert_eq!(core_stopped(&m), None);
        assert_eq!(live_leader(&m), Some(3));

        let io = StorageIOError::write_logs(AnyError::error("raft.log: No space left on device"));
        m.running_state = Err(Fatal::StorageError(io.into()));
        m.state = ServerState::Shutdown;
        let cause = core_stopped(&m).expect("stopped");
        assert!(
            cause.starts_with("storage error: ") && cause.contains("No space left on device"),
            "{cause}"
        );
        assert_eq!(live_leader(&m), None, "the stale leader is not reported");
    }
}
