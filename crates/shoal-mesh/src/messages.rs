//! Stream message bodies of record dissemination and anti-entropy.
//!
//! Each body travels inside the shoal envelope (`shoal_proto::envelope`) under its own
//! [`MessageKind`]. Collections are bounded on decode by the stream message size limit (postcard
//! pre-allocates at most what the bounded input can hold) and checked again against the
//! explicit limits below before anything is applied.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use shoal_catalog::{HealthDelta, LifecycleDelta, OwnerHead, RegionHead};
use shoal_proto::envelope::{self, DecodeError, MessageKind};
use shoal_proto::{Generation, HealthSeq, NodeId, Region, Revision, SignedHealth, SignedLifecycle};

use crate::membership::{MemberId, MEMBER_BUCKETS};

/// Most records in one [`RecordPush`] (a push of 256 records is ~70 KiB).
pub const MAX_RECORDS_PER_PUSH: usize = 256;
/// Most records per delta in one [`DeltaBody`].
pub const MAX_RECORDS_PER_DELTA: usize = 2_048;
/// Most origins named in one message.
pub const MAX_ORIGINS_PER_MESSAGE: usize = 8_192;
/// Number of owner-head buckets in an anti-entropy digest.
pub const DIGEST_BUCKETS: usize = 32;
/// Most identities in one [`AntiEntropy::Members`] list (10x a 1,667-member region).
pub const MAX_MEMBERS_PER_MESSAGE: usize = 16_384;

/// Plumtree eager push: records new to the sender, forwarded along the broadcast tree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordPush {
    /// Authority-signed lifecycle records.
    pub lifecycle: Vec<Arc<SignedLifecycle>>,
    /// Owner-signed health records.
    pub health: Vec<Arc<SignedHealth>>,
}

/// Plumtree lazy push: "I have records up to these numbers" for origins that moved recently.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IHave {
    /// Highest revision seen per region.
    pub regions: Vec<(Region, Revision)>,
    /// Highest health sequence seen per owner chain.
    pub owners: Vec<(NodeId, Generation, HealthSeq)>,
}

/// Plumtree graft: "send me what I miss since these heads, and put me on your eager list".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Graft {
    /// The asker's region heads for the regions it misses.
    pub regions: Vec<RegionHead>,
    /// The asker's owner heads for the chains it misses.
    pub owners: Vec<OwnerHead>,
}

/// Plumtree prune: "I got that already; stop eager-pushing to me".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prune {}

/// Anti-entropy messages (kind `Heads`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AntiEntropy {
    /// Opening move: region heads plus one hash per bucket of owner heads.
    Digest {
        /// Every region head of the sender.
        regions: Vec<RegionHead>,
        /// Hash of the sender's owner heads falling in each of [`DIGEST_BUCKETS`] buckets.
        buckets: Vec<u64>,
        /// The sender's SWIM member set, one 32-bit hash per bucket
        /// ([`Membership::member_buckets`](crate::Membership::member_buckets), each folded
        /// to 32 bits); empty in answers, which never open a push-pull.
        members: Vec<u32>,
        /// Whether the receiver should answer with its own digest if the sender has something
        /// the receiver lacks (false in answers, so exchanges never ping-pong).
        reply: bool,
    },
    /// Push-pull of SWIM membership (memberlist's state exchange): the sender's active
    /// identities, itself included, in the member buckets whose hashes differed.
    Members {
        /// Member bucket numbers covered.
        buckets: Vec<u16>,
        /// The sender's active identities in those buckets, in node order.
        members: Vec<MemberId>,
        /// Whether the receiver should answer with its own list for these buckets when the
        /// sender lacks an identity it holds.
        reply: bool,
    },
    /// Owner heads of the buckets whose hashes differed.
    BucketHeads {
        /// Bucket numbers covered.
        buckets: Vec<u16>,
        /// The sender's owner heads in those buckets.
        owners: Vec<OwnerHead>,
        /// Whether the receiver should answer with its heads of these buckets when the sender
        /// has something it lacks.
        reply: bool,
    },
}

/// Records the receiver lacks, with completeness claims (kind `Delta`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaBody {
    /// Per-region lifecycle deltas.
    pub lifecycle: Vec<LifecycleDelta>,
    /// Per-owner health deltas.
    pub health: Vec<HealthDelta>,
}

/// Request for a full snapshot (kind `SnapshotRequest`): sent when a delta is impossible
/// because the peer already collected tombstones above our head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRequest {
    /// The region whose chain could not be repaired by deltas.
    pub region: Region,
}

/// Any decoded stream message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamMessage {
    /// Eager push.
    Push(RecordPush),
    /// Lazy announcement.
    IHave(IHave),
    /// Graft.
    Graft(Graft),
    /// Prune.
    Prune(Prune),
    /// Anti-entropy.
    AntiEntropy(AntiEntropy),
    /// Delta.
    Delta(DeltaBody),
    /// Snapshot request.
    SnapshotRequest(SnapshotRequest),
    /// Snapshot bytes (`shoal_catalog::snapshot` format), decoded and verified by the receiver.
    Snapshot(Vec<u8>),
}

/// Why a stream message was refused (nothing was applied).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// Envelope or body decode failure.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A message kind that does not travel on streams.
    #[error("message kind {0:?} is not a stream message")]
    NotStream(MessageKind),
    /// A collection over its explicit limit.
    #[error("{what}: {len} exceeds the limit of {max}")]
    OverLimit {
        /// Which collection.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
}

impl MessageError {
    /// Short label for metrics.
    pub fn as_label(&self) -> &'static str {
        match self {
            Self::Decode(e) => e.as_label(),
            Self::NotStream(_) => "not_stream",
            Self::OverLimit { .. } => "over_limit",
        }
    }
}

fn limit(what: &'static str, len: usize, max: usize) -> Result<(), MessageError> {
    if len > max {
        return Err(MessageError::OverLimit { what, len, max });
    }
    Ok(())
}

impl StreamMessage {
    /// Decodes one stream message of at most `max_bytes`.
    ///
    /// # Errors
    /// [`MessageError`]; the caller counts it and keeps serving.
    pub fn decode(bytes: &[u8], max_bytes: usize) -> Result<Self, MessageError> {
        let (kind, body) = envelope::decode_header(bytes, max_bytes)?;
        let msg = match kind {
            MessageKind::RecordPush => {
                let m: RecordPush = envelope::decode_body(body)?;
                limit(
                    "push records",
                    m.lifecycle.len() + m.health.len(),
                    MAX_RECORDS_PER_PUSH,
                )?;
                Self::Push(m)
            }
            MessageKind::IHave => {
                let m: IHave = envelope::decode_body(body)?;
                limit(
                    "ihave origins",
                    m.regions.len() + m.owners.len(),
                    MAX_ORIGINS_PER_MESSAGE,
                )?;
                Self::IHave(m)
            }
            MessageKind::Graft => {
                let m: Graft = envelope::decode_body(body)?;
                limit(
                    "graft origins",
                    m.regions.len() + m.owners.len(),
                    MAX_ORIGINS_PER_MESSAGE,
                )?;
                Self::Graft(m)
            }
            MessageKind::Prune => Self::Prune(envelope::decode_body(body)?),
            MessageKind::Heads => {
                let m: AntiEntropy = envelope::decode_body(body)?;
                match &m {
                    AntiEntropy::Digest {
                        regions,
                        buckets,
                        members,
                        ..
                    } => {
                        limit("digest regions", regions.len(), MAX_ORIGINS_PER_MESSAGE)?;
                        limit("digest buckets", buckets.len(), DIGEST_BUCKETS)?;
                        limit("member buckets", members.len(), MEMBER_BUCKETS)?;
                    }
                    AntiEntropy::Members {
                        buckets, members, ..
                    } => {
                        limit("member bucket numbers", buckets.len(), MEMBER_BUCKETS)?;
                        limit("members", members.len(), MAX_MEMBERS_PER_MESSAGE)?;
                    }
                    AntiEntropy::BucketHeads {
                        buckets, owners, ..
                    } => {
                        limit("bucket numbers", buckets.len(), DIGEST_BUCKETS)?;
                        limit("bucket owners", owners.len(), MAX_ORIGINS_PER_MESSAGE)?;
                    }
                }
                Self::AntiEntropy(m)
            }
            MessageKind::Delta => {
                let m: DeltaBody = envelope::decode_body(body)?;
                limit(
                    "delta origins",
                    m.lifecycle.len() + m.health.len(),
                    MAX_ORIGINS_PER_MESSAGE,
                )?;
                for d in &m.lifecycle {
                    limit("delta records", d.records.len(), MAX_RECORDS_PER_DELTA)?;
                }
                for d in &m.health {
                    limit("delta records", d.records.len(), MAX_RECORDS_PER_DELTA)?;
                }
                Self::Delta(m)
            }
            MessageKind::SnapshotRequest => Self::SnapshotRequest(envelope::decode_body(body)?),
            MessageKind::Snapshot => Self::Snapshot(body.to_vec()),
            other => return Err(MessageError::NotStream(other)),
        };
        Ok(msg)
    }

    /// The kind this message travels as.
    pub fn kind(&self) -> MessageKind {
        match self {
            Self::Push(_) => MessageKind::RecordPush,
            Self::IHave(_) => MessageKind::IHave,
            Self::Graft(_) => MessageKind::Graft,
            Self::Prune(_) => MessageKind::Prune,
            Self::AntiEntropy(_) => MessageKind::Heads,
            Self::Delta(_) => MessageKind::Delta,
            Self::SnapshotRequest(_) => MessageKind::SnapshotRequest,
            Self::Snapshot(_) => MessageKind::Snapshot,
        }
    }

    /// Encodes the message; `None` if it would exceed `max_bytes` (the caller splits or counts).
    pub fn encode(&self, max_bytes: usize) -> Option<Vec<u8>> {
        let kind = self.kind();
        let r = match self {
            Self::Push(m) => envelope::encode(kind, m, max_bytes),
            Self::IHave(m) => envelope::encode(kind, m, max_bytes),
            Self::Graft(m) => envelope::encode(kind, m, max_bytes),
            Self::Prune(m) => envelope::encode(kind, m, max_bytes),
            Self::AntiEntropy(m) => envelope::encode(kind, m, max_bytes),
            Self::Delta(m) => envelope::encode(kind, m, max_bytes),
            Self::SnapshotRequest(m) => envelope::encode(kind, m, max_bytes),
            Self::Snapshot(bytes) => {
                let mut out = Vec::with_capacity(bytes.len() + envelope::HEADER_BYTES);
                out.extend_from_slice(&envelope::MAGIC);
                out.push(envelope::PROTOCOL_VERSION);
                out.push(kind as u8);
                out.extend_from_slice(bytes);
                if out.len() > max_bytes {
                    return None;
                }
                Ok(out)
            }
        };
        r.ok()
    }
}
