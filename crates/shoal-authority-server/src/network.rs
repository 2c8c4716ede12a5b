//! Raft traffic between replicas over shoal-transport (QUIC + mutual TLS).
//!
//! Each replica binds a second [`Transport`] on its `raft_addr`. A Raft RPC is one stream
//! message `b"SR" | version | postcard(RaftWire)`; the answer is another stream message back to
//! the caller's listen address carrying the same `id`. [`RaftRpc`] correlates them: a bounded
//! table of pending calls ([`MAX_PENDING_CALLS`]), each with a deadline (openraft's per-RPC TTL),
//! after which the call fails as `Unreachable` and openraft backs off.
//!
//! Only peers whose certificate node id is a configured member, or a node (voter or learner)
//! of the Raft membership in force, may talk Raft: anything else is dropped and counted (a
//! valid region certificate is not enough to vote). A replica added by `members add` is in
//! the membership from the moment its learner entry is appended, so the others answer it
//! without a config change (docs/adr/0009-authority-membership-change.md).
//!
//! [`RaftRpc::last_heard`] remembers when each peer last answered a call (heartbeats every
//! `heartbeat_ms`): the leader's liveness view for refusing a membership change that would
//! leave no live majority.
//!
//! Every call carries the caller's cluster incarnation id (`None` until a restore started one,
//! docs/adr/0007-authority-restore.md). A replica answers only calls of its own incarnation,
//! except that a pristine replica (nothing applied, no snapshot: a wiped one being re-seeded)
//! answers any and adopts the caller's incarnation (recorded in `cluster.id` in its data
//! directory before it answers, so a crash before the snapshot arrives keeps it). So a replica left
//! out of a restore, with its longer log of the old incarnation, can neither win a vote in the
//! new cluster nor overwrite it; nor can the new cluster truncate that old log.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use shoal_transport::transport::{Inbound, Transport};
use tokio::sync::{mpsc, oneshot};

use crate::types::{Member, Raft, RaftId, TypeConfig};

/// Magic + version prefix of a Raft wire message (distinct from the shoal envelope's `SH`).
pub const RAFT_WIRE_PREFIX: [u8; 3] = [b'S', b'R', 2];
/// Most Raft calls in flight from one replica; more fail at once as unreachable (counted).
pub const MAX_PENDING_CALLS: usize = 1_024;

/// A Raft RPC request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound = "")]
pub enum RaftRequest {
    /// AppendEntries (also heartbeats).
    Append(AppendEntriesRequest<TypeConfig>),
    /// RequestVote.
    Vote(VoteRequest<RaftId>),
    /// One chunk of a snapshot.
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

/// A Raft RPC response, carrying the remote Raft's own error when it failed.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound = "")]
pub enum RaftResponse {
    /// AppendEntries result.
    Append(Result<AppendEntriesResponse<RaftId>, RaftError<RaftId>>),
    /// RequestVote result.
    Vote(Result<VoteResponse<RaftId>, RaftError<RaftId>>),
    /// InstallSnapshot result.
    Snapshot(Result<InstallSnapshotResponse<RaftId>, RaftError<RaftId, InstallSnapshotError>>),
}

/// One message on the Raft transport.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftWire {
    /// A call; answer with the same id.
    Request {
        /// Correlation id, unique per caller.
        id: u64,
        /// The caller's cluster incarnation id (`None`: never restored).
        cluster: Option<String>,
        /// The call.
        body: RaftRequest,
    },
    /// The answer to call `id`.
    Response {
        /// Correlation id of the call.
        id: u64,
        /// The answer.
        body: RaftResponse,
    },
}

/// Encodes a wire message with its prefix.
pub fn encode_wire(msg: &RaftWire) -> Vec<u8> {
    postcard::to_extend(msg, RAFT_WIRE_PREFIX.to_vec()).expect("plain data always serialises")
}

/// Decodes a wire message.
///
/// # Errors
/// A description when the prefix or body is wrong.
pub fn decode_wire(bytes: &[u8]) -> Result<RaftWire, String> {
    let body = bytes
        .strip_prefix(&RAFT_WIRE_PREFIX[..])
        .ok_or_else(|| "not a raft wire message".to_string())?;
    postcard::from_bytes(body).map_err(|e| e.to_string())
}

/// Why a call failed locally.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No answer within the deadline.
    #[error("raft rpc to {0} timed out")]
    Timeout(SocketAddr),
    /// The message could not be sent (queue full, shut down, too large).
    #[error("raft rpc to {0} not sent: {1}")]
    Send(SocketAddr, String),
    /// The peer's `host:port` did not resolve.
    #[error("raft peer {0} does not resolve: {1}")]
    Resolve(String, String),
    /// Too many calls in flight.
    #[error("too many raft calls in flight")]
    TooManyPending,
    /// The answer was of the wrong kind.
    #[error("unexpected raft response kind")]
    WrongKind,
}

/// Request/response correlation over the Raft transport.
pub struct RaftRpc {
    transport: Transport,
    pending: Mutex<HashMap<u64, oneshot::Sender<RaftResponse>>>,
    next_id: AtomicU64,
    /// Calls refused because [`MAX_PENDING_CALLS`] were in flight.
    pub overflow: AtomicU64,
    /// Inbound messages dropped: undecodable, or from a peer that is not a member.
    pub rejected: AtomicU64,
    /// Calls dropped because they came from another cluster incarnation.
    pub foreign: AtomicU64,
    cluster: std::sync::OnceLock<(ClusterSource, std::path::PathBuf)>,
    adopted: Mutex<Option<String>>,
    /// When each peer (by certificate node id) last answered one of our calls.
    heard: Mutex<HashMap<String, Instant>>,
}

/// File in a replica's data directory holding the cluster incarnation it adopted or was
/// restored as.
pub const CLUSTER_ID_FILE: &str = "cluster.id";

/// Reads this replica's cluster incarnation id from its state and whether it is pristine (no
/// log entry, no vote, no snapshot, nothing applied).
pub type ClusterSource = Box<dyn Fn() -> (Option<String>, bool) + Send + Sync>;

impl std::fmt::Debug for RaftRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftRpc")
            .field("listen", &self.transport.listen_addr())
            .finish_non_exhaustive()
    }
}

impl RaftRpc {
    /// Wraps a bound transport.
    pub fn new(transport: Transport) -> Arc<Self> {
        Arc::new(Self {
            transport,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            overflow: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            foreign: AtomicU64::new(0),
            cluster: std::sync::OnceLock::new(),
            adopted: Mutex::new(None),
            heard: Mutex::new(HashMap::new()),
        })
    }

    /// Sets where the replica's cluster incarnation is read from (once; later calls are
    /// ignored) and the data directory holding [`CLUSTER_ID_FILE`]. Until set, the replica
    /// behaves as never restored.
    pub fn set_cluster_source(&self, source: ClusterSource, data_dir: &std::path::Path) {
        let path = data_dir.join(CLUSTER_ID_FILE);
        if let Ok(id) = std::fs::read_to_string(&path) {
            let id = id.trim().to_string();
            if !id.is_empty() {
                *self.adopted.lock().expect("adopted lock") = Some(id);
            }
        }
        let _ = self.cluster.set((source, path));
    }

    /// (our incarnation: the state's, else the adopted one; pristine).
    fn cluster(&self) -> (Option<String>, bool) {
        let Some((f, _)) = self.cluster.get() else {
            return (None, false);
        };
        let (state_id, pristine) = f();
        let adopted = self.adopted.lock().expect("adopted lock").clone();
        (state_id.or(adopted), pristine)
    }

    /// Whether to answer a call from incarnation `theirs`; a pristine replica adopts it.
    fn accept_cluster(&self, theirs: &Option<String>) -> bool {
        let (ours, pristine) = self.cluster();
        if &ours == theirs {
            return true;
        }
        if ours.is_some() || !pristine {
            return false;
        }
        let Some(id) = theirs else {
            return true;
        };
        let Some((_, path)) = self.cluster.get() else {
            return false;
        };
        if let Err(e) = crate::files::write_plain_atomic(path, id.as_bytes()) {
            tracing::warn!(error = %e, "could not record the adopted cluster id");
            return false;
        }
        tracing::info!(cluster = %id, "pristine replica adopted cluster incarnation");
        *self.adopted.lock().expect("adopted lock") = Some(id.clone());
        true
    }

    /// How long ago `node` (a certificate node id) last answered one of our Raft calls;
    /// `None` if it never did since this process started.
    pub fn last_heard(&self, node: &str) -> Option<Duration> {
        self.heard
            .lock()
            .expect("heard lock")
            .get(node)
            .map(Instant::elapsed)
    }

    /// The transport (for shutdown and counters).
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// Sends `body` to `to` and waits at most `ttl` for the answer.
    ///
    /// # Errors
    /// [`CallError`]; the pending slot is always released.
    pub async fn call(
        &self,
        to: SocketAddr,
        body: RaftRequest,
        ttl: Duration,
    ) -> Result<RaftResponse, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock().expect("pending lock");
            if p.len() >= MAX_PENDING_CALLS {
                self.overflow.fetch_add(1, Ordering::Relaxed);
                return Err(CallError::TooManyPending);
            }
            p.insert(id, tx);
        }
        let cluster = self.cluster().0;
        let bytes = encode_wire(&RaftWire::Request { id, cluster, body });
        if let Err(e) = self.transport.send_stream_message(to, bytes) {
            self.pending.lock().expect("pending lock").remove(&id);
            return Err(CallError::Send(to, e.to_string()));
        }
        let res = tokio::time::timeout(ttl, rx).await;
        self.pending.lock().expect("pending lock").remove(&id);
        match res {
            Ok(Ok(resp)) => Ok(resp),
            _ => Err(CallError::Timeout(to)),
        }
    }

    /// Serves inbound Raft traffic until the transport closes: answers calls from members with
    /// `raft`, routes responses to their pending call.
    pub async fn serve(
        self: Arc<Self>,
        mut inbound: mpsc::Receiver<Inbound>,
        raft: Raft,
        members: BTreeSet<String>,
    ) {
        while let Some(msg) = inbound.recv().await {
            let peer = msg.peer.node_id.as_str();
            let in_membership = || {
                raft.metrics()
                    .borrow()
                    .membership_config
                    .membership()
                    .nodes()
                    .any(|(_, n)| n.node == peer)
            };
            if !members.contains(peer) && !in_membership() {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(peer = %msg.peer, "raft message from a non-member dropped");
                continue;
            }
            match decode_wire(&msg.bytes) {
                Ok(RaftWire::Response { id, body }) => {
                    self.heard
                        .lock()
                        .expect("heard lock")
                        .insert(msg.peer.node_id.as_str().to_owned(), Instant::now());
                    if let Some(tx) = self.pending.lock().expect("pending lock").remove(&id) {
                        let _ = tx.send(body);
                    }
                }
                Ok(RaftWire::Request { id, cluster, body }) => {
                    if !self.accept_cluster(&cluster) {
                        self.foreign.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(peer = %msg.peer, theirs = ?cluster, ours = ?self.cluster().0,
                            "raft call from another cluster incarnation dropped");
                        continue;
                    }
                    let this = self.clone();
                    let raft = raft.clone();
                    tokio::spawn(async move {
                        let body = match body {
                            RaftRequest::Append(r) => {
                                RaftResponse::Append(raft.append_entries(r).await)
                            }
                            RaftRequest::Vote(r) => RaftResponse::Vote(raft.vote(r).await),
                            RaftRequest::Snapshot(r) => {
                                RaftResponse::Snapshot(raft.install_snapshot(r).await)
                            }
                        };
                        let bytes = encode_wire(&RaftWire::Response { id, body });
                        if let Err(e) = this.transport.send_stream_message(msg.from, bytes) {
                            tracing::debug!(error = %e, to = %msg.from, "raft response not sent");
                        }
                    });
                }
                Err(e) => {
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(peer = %msg.peer, error = %e, "undecodable raft message");
                }
            }
        }
    }
}

/// openraft's network factory: one [`RaftClient`] per target replica.
#[derive(Clone, Debug)]
pub struct Network {
    rpc: Arc<RaftRpc>,
}

impl Network {
    /// A factory sending through `rpc`.
    pub fn new(rpc: Arc<RaftRpc>) -> Self {
        Self { rpc }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = RaftClient;

    async fn new_client(&mut self, target: RaftId, node: &Member) -> RaftClient {
        RaftClient {
            rpc: self.rpc.clone(),
            target,
            node: node.clone(),
            addr: Mutex::new(None),
        }
    }
}

/// Calls to one target replica.
#[derive(Debug)]
pub struct RaftClient {
    rpc: Arc<RaftRpc>,
    target: RaftId,
    node: Member,
    /// `node.raft_addr` resolved, and when (re-resolved after [`RESOLVE_TTL`] or a failure).
    addr: Mutex<Option<(SocketAddr, std::time::Instant)>>,
}

/// How long a resolved peer address is reused before `raft_addr` is resolved again (a
/// StatefulSet pod that is rescheduled keeps its name and gets a new IP).
pub const RESOLVE_TTL: Duration = Duration::from_secs(5);

impl RaftClient {
    /// The peer's address: `raft_addr` parsed, or resolved by DNS at connect time (cached
    /// for [`RESOLVE_TTL`]).
    async fn resolve(&self) -> Result<SocketAddr, CallError> {
        if let Ok(a) = self.node.raft_addr.parse() {
            return Ok(a);
        }
        if let Some((a, at)) = *self.addr.lock().expect("addr lock") {
            if at.elapsed() < RESOLVE_TTL {
                return Ok(a);
            }
        }
        let unresolved = |why: String| CallError::Resolve(self.node.raft_addr.clone(), why);
        let a = tokio::net::lookup_host(self.node.raft_addr.as_str())
            .await
            .map_err(|e| unresolved(e.to_string()))?
            .next()
            .ok_or_else(|| unresolved("no address".into()))?;
        *self.addr.lock().expect("addr lock") = Some((a, std::time::Instant::now()));
        Ok(a)
    }
}

type RpcErr<E = openraft::error::Infallible> = RPCError<RaftId, Member, RaftError<RaftId, E>>;

impl RaftClient {
    async fn call<E: std::error::Error>(
        &self,
        req: RaftRequest,
        option: &RPCOption,
    ) -> Result<RaftResponse, RpcErr<E>> {
        let addr = self
            .resolve()
            .await
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        let res = self.rpc.call(addr, req, option.hard_ttl()).await;
        if res.is_err() {
            *self.addr.lock().expect("addr lock") = None; // resolve again next time
        }
        res.map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }

    fn remote<E: std::error::Error>(&self, e: RaftError<RaftId, E>) -> RpcErr<E> {
        RPCError::RemoteError(RemoteError::new_with_node(
            self.target,
            self.node.clone(),
            e,
        ))
    }

    fn wrong_kind<E: std::error::Error>() -> RpcErr<E> {
        RPCError::Network(NetworkError::new(&CallError::WrongKind))
    }
}

impl RaftNetwork<TypeConfig> for RaftClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<RaftId>, RpcErr> {
        match self.call(RaftRequest::Append(rpc), &option).await? {
            RaftResponse::Append(r) => r.map_err(|e| self.remote(e)),
            _ => Err(Self::wrong_kind()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<RaftId>, RpcErr<InstallSnapshotError>> {
        match self.call(RaftRequest::Snapshot(rpc), &option).await? {
            RaftResponse::Snapshot(r) => r.map_err(|e| self.remote(e)),
            _ => Err(Self::wrong_kind()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<RaftId>,
        option: RPCOption,
    ) -> Result<VoteResponse<RaftId>, RpcErr> {
        match self.call(RaftRequest::Vote(rpc), &option).await? {
            RaftResponse::Vote(r) => r.map_err(|e| self.remote(e)),
            _ => Err(Self::wrong_kind()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
    use shoal_authority::AuthorityCommand;

    use crate::types::Proposal;

    #[test]
    fn wire_round_trips_with_postcard() {
        let entry = Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(3, 1), 7),
            payload: EntryPayload::Normal(Proposal {
                cmd: AuthorityCommand::ExpireLeases { now_ms: 5 },
                proposed_at_ms: 9,
                on_behalf_of: None,
            }),
        };
        let req = AppendEntriesRequest::<TypeConfig> {
            vote: openraft::Vote::new_committed(3, 1),
            prev_log_id: None,
            entries: vec![entry],
            leader_commit: Some(LogId::new(CommittedLeaderId::new(3, 1), 6)),
        };
        let bytes = encode_wire(&RaftWire::Request {
            id: 42,
            cluster: Some("c1".into()),
            body: RaftRequest::Append(req),
        });
        match decode_wire(&bytes).unwrap() {
            RaftWire::Request {
                id: 42,
                cluster: Some(c),
                body: RaftRequest::Append(r),
            } => assert_eq!((r.entries.len(), c.as_str()), (1, "c1")),
            other => panic!("{other:?}"),
        }
        let err: RaftError<RaftId> = RaftError::Fatal(openraft::error::Fatal::Stopped);
        let bytes = encode_wire(&RaftWire::Response {
            id: 1,
            body: RaftResponse::Append(Err(err)),
        });
        assert!(decode_wire(&bytes).is_ok());
    }
}
