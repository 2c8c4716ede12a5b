//! The openraft type configuration: what a log entry carries and what applying it returns.

use std::fmt;

use serde::{Deserialize, Serialize};
use shoal_authority::{AuthorityCommand, Refusal};
use shoal_proto::SignedLifecycle;

/// Raft's numeric id of a replica (`id` in the config's `[[members]]`).
pub type RaftId = u64;

/// What the cluster knows about one voter: its shoal node id (certificate identity) and its two
/// listen addresses. Stored in the Raft membership, so every replica learns every address from
/// the log, not only from its own config file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The replica's shoal node id (the node id in its certificate).
    pub node: String,
    /// `ip:port` of its replica-to-replica (Raft) transport.
    pub raft_addr: String,
    /// `ip:port` of its agent RPC + mesh transport.
    pub rpc_addr: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}(raft {}, rpc {})",
            self.node, self.raft_addr, self.rpc_addr
        )
    }
}

/// The payload of one normal Raft log entry: an authority command plus the leader's wall-clock
/// time when it proposed it.
///
/// `proposed_at_ms` is read by the leader **before** proposing and stored in the entry, so the
/// state machine never reads a clock: every replica passes the same value to
/// [`shoal_authority::ApplyContext::committed_at_ms`] and signs byte-identical records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// The command.
    pub cmd: AuthorityCommand,
    /// Leader wall-clock Unix ms at proposal; becomes the records' `committed_at_ms`.
    pub proposed_at_ms: u64,
    /// The local process the requesting agent forwarded the command for (audit only; see
    /// [`shoal_proto::rpc::AuthorityRequest::on_behalf_of`]).
    pub on_behalf_of: Option<shoal_proto::rpc::LocalCaller>,
}

/// What applying one entry produced: the signed records, or the rules' refusal. Blank and
/// membership entries produce `Ok(vec![])`.
pub type ApplyOutcome = Result<Vec<SignedLifecycle>, Refusal>;

openraft::declare_raft_types!(
    /// The authority's openraft type configuration.
    pub TypeConfig:
        D = Proposal,
        R = ApplyOutcome,
        NodeId = RaftId,
        Node = Member,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);

/// Shorthand for openraft's log id with our node id type.
pub type LogId = openraft::LogId<RaftId>;
/// Shorthand for openraft's vote.
pub type Vote = openraft::Vote<RaftId>;
/// Shorthand for a log entry.
pub type Entry = openraft::Entry<TypeConfig>;
/// Shorthand for the stored membership.
pub type StoredMembership = openraft::StoredMembership<RaftId, Member>;
/// Shorthand for a snapshot's metadata.
pub type SnapshotMeta = openraft::SnapshotMeta<RaftId, Member>;
/// Shorthand for a storage error.
pub type StorageError = openraft::StorageError<RaftId>;
/// The running Raft node.
pub type Raft = openraft::Raft<TypeConfig>;
