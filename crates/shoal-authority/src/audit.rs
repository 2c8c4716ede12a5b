//! The audit log: every applied command, accepted or refused, with who asked and what happened.
//!
//! The log is a bounded ring (the last `capacity` entries) plus a total counter, and it lives
//! inside the replicated state, so every replica (and every snapshot) holds the same tail.
//! Longer retention is the job of whoever tails it (entries carry a gap-free `seq`, so a
//! shipper can tell what it missed).

use std::collections::VecDeque;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use shoal_proto::rpc::LocalCaller;
use shoal_proto::TransitionReason;
use shoal_proto::{Generation, InstanceId, KeyId, LifecycleState, NodeId, Revision, ServiceKey};

use crate::caller::CallerId;
use crate::refusal::Refusal;

/// Default number of audit entries kept.
pub const DEFAULT_AUDIT_CAPACITY: usize = 10_000;

/// A compact description of a command (identifiers only, no endpoint details or scope lists).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandSummary {
    /// A registration.
    Register {
        /// Service key.
        key: ServiceKey,
        /// Instance id.
        instance: InstanceId,
        /// Node asked to bind to (`None`: the calling node).
        on_node: Option<NodeId>,
        /// The address claimed (who claims to run where is what registration audits).
        address: SocketAddr,
        /// Lease in ms.
        lease_ms: u32,
    },
    /// A lifecycle transition.
    Transition {
        /// Service key.
        key: ServiceKey,
        /// Instance id.
        instance: InstanceId,
        /// Generation named by the caller.
        generation: Generation,
        /// Requested state.
        to: LifecycleState,
        /// Reason given.
        reason: TransitionReason,
    },
    /// Mesh liveness: node down.
    NodeDown {
        /// The node.
        node: NodeId,
        /// Leader monotonic ms.
        at_ms: u64,
    },
    /// Mesh liveness: node up.
    NodeUp {
        /// The node.
        node: NodeId,
    },
    /// A lease-expiry batch.
    ExpireLeases {
        /// Leader monotonic ms.
        now_ms: u64,
    },
    /// A leader takeover.
    LeaderTakeover {
        /// New leader monotonic ms.
        now_ms: u64,
    },
    /// A global policy document (ADR 0013).
    PutGlobalPolicy {
        /// Its version.
        version: u64,
        /// The policy key that signed it.
        signer: KeyId,
    },
    /// A policy write.
    PutPolicy {
        /// Service key.
        key: ServiceKey,
    },
    /// A node key binding (the node is the caller).
    BindNodeKey {
        /// Id of the key presented.
        key: KeyId,
    },
    /// A node revocation.
    RevokeNode {
        /// The node.
        node: NodeId,
    },
    /// A revocation lifted.
    ReadmitNode {
        /// The node.
        node: NodeId,
    },
}

/// What became of a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuditOutcome {
    /// Accepted: `records` lifecycle records were emitted (revisions `revision - records + 1
    /// ..= revision` of the entry), and a policy document with `policy_revision` was stored
    /// if it was a policy write.
    Accepted {
        /// Number of lifecycle records emitted (0 for liveness and policy commands).
        records: u32,
        /// Policy revision assigned, for policy writes.
        policy_revision: Option<Revision>,
    },
    /// Refused; nothing but the audit log changed.
    Refused(Refusal),
}

/// One audit entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Gap-free sequence number over all entries ever appended, starting at 1.
    pub seq: u64,
    /// Raft log index of the command.
    pub log_index: u64,
    /// Commit wall-clock time in Unix ms (informational).
    pub committed_at_ms: u64,
    /// Who asked.
    pub caller: CallerId,
    /// The local process the calling agent forwarded the request for (unix peer credentials
    /// as the agent saw them; vouched for by the node, not authenticated here).
    pub on_behalf_of: Option<LocalCaller>,
    /// What was asked.
    pub command: CommandSummary,
    /// What happened.
    pub outcome: AuditOutcome,
    /// Region revision head after the command (the last lifecycle revision assigned so far).
    pub revision: Revision,
}

/// A bounded ring of [`AuditEntry`] with a total counter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditLog {
    entries: VecDeque<AuditEntry>,
    capacity: usize,
    total: u64,
}

impl AuditLog {
    /// An empty log keeping the last `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            capacity: capacity.max(1),
            total: 0,
        }
    }

    /// Appends an entry built from everything but its `seq`, evicting the oldest past capacity.
    pub(crate) fn push(&mut self, mut entry: AuditEntry) {
        self.total += 1;
        entry.seq = self.total;
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
        debug_assert!(self.entries.len() <= self.capacity);
    }

    /// Entries held, oldest first.
    pub fn entries(&self) -> impl DoubleEndedIterator<Item = &AuditEntry> + ExactSizeIterator {
        self.entries.iter()
    }

    /// The most recent entry.
    pub fn last(&self) -> Option<&AuditEntry> {
        self.entries.back()
    }

    /// Entries ever appended (held + evicted).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Entries evicted from the ring so far.
    pub fn evicted(&self) -> u64 {
        self.total - self.entries.len() as u64
    }

    /// The ring's capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Number of entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing was ever appended.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
