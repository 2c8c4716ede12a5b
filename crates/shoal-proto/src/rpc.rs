//! Agent <-> region authority RPC, carried as stream messages of kind
//! [`MessageKind::AuthorityRequest`](crate::envelope::MessageKind::AuthorityRequest) /
//! [`MessageKind::AuthorityReply`](crate::envelope::MessageKind::AuthorityReply) over the same
//! mutual-TLS QUIC transport the mesh uses. The caller's identity is **not** in the request: the
//! authority takes it from the peer certificate (a node may only act for its own instances).
//! An agent forwarding a write for a local process names that process in
//! [`AuthorityRequest::on_behalf_of`] (its unix peer credentials, as the agent saw them): the
//! authority does not authenticate it (the node vouches for it) and records it in its audit log.
//!
//! Every attempt of one call carries the same `request_id`. A replica answers a retried
//! write ([`AuthorityRequestBody::is_write`]) it has already committed with the first answer
//! instead of applying it again (`shoal_authority::replay`, per replica, for two minutes); a
//! retried `Transition` that reaches another replica is answered with the existing record
//! (the `AlreadyInState` rule), a retried `Register` there makes a newer boot generation.

use serde::{Deserialize, Serialize};

use crate::ids::{Generation, InstanceId, NodeId, Revision, ServiceKey};
use crate::policy::{ServicePolicy, SignedGlobalPolicy};
use crate::record::{EndpointSpec, LifecycleState, NodeKey, TransitionReason};
use crate::sign::{SignedLifecycle, SignedPolicy};
use crate::summary::SignedSummary;

/// One request from an agent (or an operator tool) to the authority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorityRequest {
    /// Chosen by the caller; echoed in the reply.
    pub request_id: u64,
    /// What is asked.
    pub body: AuthorityRequestBody,
    /// The local process the calling agent forwards this request for (`None`: the agent's own
    /// request, e.g. an automatic READY after probes, or an operator tool). Audit only.
    pub on_behalf_of: Option<LocalCaller>,
}

/// Longest executable path carried in a [`LocalCaller`], bytes (longer ones are cut).
pub const MAX_EXE_BYTES: usize = 512;

/// A local process as identified by its unix peer credentials on the agent's socket.
///
/// `uid`/`gid` come from `SO_PEERCRED` (fixed at `connect()`), and are what the agent
/// authorises on. `pid` and `exe` (`/proc/<pid>/exe`, read when the connection was accepted)
/// are for the audit trail only: a pid can be reused once its process exits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LocalCaller {
    /// Effective uid of the connecting process.
    pub uid: u32,
    /// Effective (primary) gid of the connecting process.
    pub gid: u32,
    /// Its pid at connect time, when the kernel reported one.
    pub pid: Option<u32>,
    /// Its executable at accept time, when readable (at most [`MAX_EXE_BYTES`]).
    pub exe: Option<String>,
}

impl LocalCaller {
    /// `exe` cut to at most [`MAX_EXE_BYTES`] on a character boundary.
    pub fn bounded(mut self) -> Self {
        if let Some(e) = &mut self.exe {
            if e.len() > MAX_EXE_BYTES {
                let mut end = MAX_EXE_BYTES;
                while !e.is_char_boundary(end) {
                    end -= 1;
                }
                e.truncate(end);
            }
        }
        self
    }
}

impl std::fmt::Display for LocalCaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uid={} gid={}", self.uid, self.gid)?;
        if let Some(p) = self.pid {
            write!(f, " pid={p}")?;
        }
        if let Some(e) = &self.exe {
            write!(f, " exe={e}")?;
        }
        Ok(())
    }
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
    /// Binds the calling node's health-signing public key (the node is the one named by the
    /// caller's certificate; nobody can bind a key for another node). Agents send it at start
    /// and before their first registration. When the key differs from the one the authority
    /// holds, every live instance of the node is re-issued bound to the new key, and those
    /// records are the answer (`Committed`). See `docs/adr/0006-node-keys-in-lifecycle-records.md`.
    BindNodeKey {
        /// The node's ed25519 public key.
        key: NodeKey,
    },
    /// Revokes a node's key (operators only): the authority stores "no key" for the node,
    /// refuses further bindings from it and expires every live instance it owns with reason
    /// `NodeRevoked`, so nothing signed by the node verifies anywhere.
    RevokeNode {
        /// The node to revoke.
        node: NodeId,
    },
    /// Lifts a revocation (operators only): the node may bind a key again.
    ReadmitNode {
        /// The node to readmit.
        node: NodeId,
    },
    /// Lists or changes the authority's replica set (operators only; leader only for a
    /// change). See docs/adr/0009-authority-membership-change.md.
    Members(MembersOp),
    /// Store a global policy document (leader only; any caller: the signature by a trusted
    /// global policy key is the authorisation). Refused unless its version is above the held one.
    PutGlobalPolicy {
        /// The signed document.
        signed: SignedGlobalPolicy,
    },
    /// Read the held global policy document (any replica).
    GetGlobalPolicy,
    /// Another region's authority asks this region for signed summaries of `keys` (any
    /// replica answers from its embedded mesh member's catalog). Only keys whose global policy
    /// lists this region as a failover target are answered. `policy_version` is the asker's
    /// global policy version: a newer document held here comes back with the reply.
    RegionSummaries {
        /// Services wanted (at most [`crate::summary::MAX_SUMMARIES_PER_REPLY`]).
        keys: Vec<ServiceKey>,
        /// The asker's global policy version (0: none).
        policy_version: u64,
    },
    /// An agent asks its own region's authority for the failover feed: every remote summary
    /// held, and the global policy document when newer than `policy_version`.
    FailoverFeed {
        /// The agent's global policy version (0: none).
        policy_version: u64,
    },
}

impl AuthorityRequestBody {
    /// Whether this request changes the authority's state when applied (a log entry), so a
    /// retry of it must not be applied twice (`shoal_authority::replay`). Reads and replica
    /// set changes (`Members`, idempotent by their own rules) are not.
    pub fn is_write(&self) -> bool {
        match self {
            Self::Register { .. }
            | Self::Transition { .. }
            | Self::PutPolicy { .. }
            | Self::BindNodeKey { .. }
            | Self::RevokeNode { .. }
            | Self::ReadmitNode { .. }
            | Self::PutGlobalPolicy { .. } => true,
            Self::GetPolicy { .. }
            | Self::Status
            | Self::Members(_)
            | Self::GetGlobalPolicy
            | Self::RegionSummaries { .. }
            | Self::FailoverFeed { .. } => false,
        }
    }
}

/// What `shoal authority members ...` asks of the region authority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembersOp {
    /// The voters and learners, with the leader's replication view.
    List,
    /// Adds a replica: first as a learner (it receives the log or a snapshot until it has
    /// caught up, bounded by `catch_up_ms`), then as a voter through joint consensus.
    Add {
        /// Its Raft id (unique, non-zero, never used before in this cluster).
        id: u64,
        /// Its shoal node id (the node id in its certificate).
        node: NodeId,
        /// Its replica-to-replica address, `host:port` (IP or DNS name).
        raft_addr: String,
        /// Its agent RPC address, `host:port` (IP or DNS name).
        rpc_addr: String,
        /// Longest wait for the learner to catch up before the change is abandoned, ms.
        catch_up_ms: u64,
    },
    /// Removes a voter (or a learner) through joint consensus. Refused when it is the last
    /// voter, or when the remaining voters hold no live majority.
    Remove {
        /// Its Raft id.
        id: u64,
    },
}

/// One replica in a [`MembersView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// Raft id.
    pub id: u64,
    /// Shoal node id.
    pub node: String,
    /// Replica-to-replica address.
    pub raft_addr: String,
    /// Agent RPC address.
    pub rpc_addr: String,
    /// A voter of the current configuration (else a learner).
    pub voter: bool,
    /// The last log index the leader knows it holds (`None`: unknown, or not asked by a
    /// leader).
    pub matched_index: Option<u64>,
    /// Ms since the leader last heard a Raft answer from it (`None`: never, or not a leader;
    /// 0 for the leader itself).
    pub last_heard_ms: Option<u64>,
}

/// The replica set as one replica sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembersView {
    /// Raft id of the replica that answered.
    pub answered_by: u64,
    /// Raft id of the leader it knows.
    pub leader: Option<u64>,
    /// Log index of the membership entry in force.
    pub config_index: Option<u64>,
    /// True while a joint configuration (old and new voters) is in force.
    pub joint: bool,
    /// Every voter and learner.
    pub members: Vec<MemberInfo>,
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
    /// The replica set after a `Members` request (for a change: once it has committed).
    Members(MembersView),
    /// The held global policy document, if any.
    GlobalPolicy(Option<SignedGlobalPolicy>),
    /// Signed summaries (of this region for `RegionSummaries`, of remote regions for
    /// `FailoverFeed`), and the global policy when the asker's version is older.
    Summaries {
        /// Signed summaries, at most [`crate::summary::MAX_SUMMARIES_PER_REPLY`].
        summaries: Vec<SignedSummary>,
        /// The held global policy, when newer than the asker's.
        policy: Option<SignedGlobalPolicy>,
    },
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
