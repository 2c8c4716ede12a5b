//! The versioned envelope every shoal message travels in.
//!
//! ```text
//! +------+------+---------+------+------------------+
//! | 'S'  | 'H'  | version | kind | postcard body... |
//! +------+------+---------+------+------------------+
//!   2 bytes magic, 1 byte protocol version, 1 byte message kind, then the body.
//! ```
//!
//! Decoding checks the total size against a hard limit *before* touching the body, so the
//! decoder never allocates more than the limit: postcard's collection visitors pre-allocate
//! at most what the (already bounded) input can hold. Every string and collection type inside a
//! body validates its own limits during deserialisation.

use serde::{de::DeserializeOwned, Serialize};

/// Two magic bytes: `b"SH"`.
pub const MAGIC: [u8; 2] = *b"SH";
/// The protocol version written by this build. Decoders accept exactly this version.
pub const PROTOCOL_VERSION: u8 = 1;
/// Header length in bytes.
pub const HEADER_BYTES: usize = 4;
/// Default upper bound on one datagram's payload (fits a 1,280-byte IPv6 MTU after QUIC).
pub const DEFAULT_MAX_DATAGRAM_BYTES: usize = 1_200;
/// Hard upper bound on one stream message (a delta or a one-service snapshot chunk).
pub const MAX_STREAM_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// What a message is. The numbering is part of the wire format: never reuse a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum MessageKind {
    /// A SWIM (foca) membership packet.
    Swim = 1,
    /// Eager push of records (Plumtree gossip).
    RecordPush = 2,
    /// Lazy announcement of record ids (Plumtree IHAVE).
    IHave = 3,
    /// Request for announced records and re-attachment to the tree (Plumtree GRAFT).
    Graft = 4,
    /// Detach from the eager tree (Plumtree PRUNE).
    Prune = 5,
    /// Anti-entropy: per-origin version heads.
    Heads = 6,
    /// Anti-entropy: records the peer lacks, with the range they cover.
    Delta = 7,
    /// Request for a full snapshot (of one service or the whole catalog).
    SnapshotRequest = 8,
    /// A full snapshot.
    Snapshot = 9,
    /// Agent-to-authority request.
    AuthorityRequest = 10,
    /// Authority-to-agent reply.
    AuthorityReply = 11,
}

impl MessageKind {
    /// Every kind, in wire order.
    pub const ALL: [MessageKind; 11] = [
        Self::Swim,
        Self::RecordPush,
        Self::IHave,
        Self::Graft,
        Self::Prune,
        Self::Heads,
        Self::Delta,
        Self::SnapshotRequest,
        Self::Snapshot,
        Self::AuthorityRequest,
        Self::AuthorityReply,
    ];

    /// Parses the kind byte.
    pub fn from_u8(b: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u8 == b)
    }

    /// Lower-case name for metrics labels, e.g. `"record_push"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Swim => "swim",
            Self::RecordPush => "record_push",
            Self::IHave => "ihave",
            Self::Graft => "graft",
            Self::Prune => "prune",
            Self::Heads => "heads",
            Self::Delta => "delta",
            Self::SnapshotRequest => "snapshot_request",
            Self::Snapshot => "snapshot",
            Self::AuthorityRequest => "authority_request",
            Self::AuthorityReply => "authority_reply",
        }
    }
}

/// Why a message was rejected. The receiver's state is untouched on every variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than the 4-byte header.
    #[error("message of {0} bytes is shorter than the header")]
    Truncated(usize),
    /// The magic bytes are wrong: not a shoal message.
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 2]),
    /// A protocol version this build does not speak.
    #[error("unsupported protocol version {0} (this build speaks {PROTOCOL_VERSION})")]
    Version(u8),
    /// Unknown message kind byte.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// The message is larger than the limit for its channel.
    #[error("message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Actual length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The kind byte does not match the body type the caller expected.
    #[error("expected a {expected:?} message, got {got:?}")]
    WrongKind {
        /// What the caller asked for.
        expected: MessageKind,
        /// What the header said.
        got: MessageKind,
    },
    /// The body is not a valid postcard encoding of the type, or a contained value failed
    /// validation (identifier charset, label rules, length limits).
    #[error("malformed body: {0}")]
    Body(String),
    /// Bytes were left over after the body.
    #[error("{0} trailing bytes after the body")]
    Trailing(usize),
}

impl DecodeError {
    /// A short stable name for metric labels, e.g. `"bad_magic"`.
    pub fn as_label(&self) -> &'static str {
        match self {
            Self::Truncated(_) => "truncated",
            Self::BadMagic(_) => "bad_magic",
            Self::Version(_) => "version",
            Self::UnknownKind(_) => "unknown_kind",
            Self::TooLarge { .. } => "too_large",
            Self::WrongKind { .. } => "wrong_kind",
            Self::Body(_) => "malformed",
            Self::Trailing(_) => "trailing",
        }
    }
}

/// Why a message could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The encoded message would exceed the caller's limit; nothing was produced.
    #[error("encoded message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Encoded length.
        len: usize,
        /// Limit.
        max: usize,
    },
}

/// Encodes `body` as a `kind` message. Fails rather than produce more than `max_bytes`.
///
/// # Errors
/// [`EncodeError::TooLarge`] when the encoding is longer than `max_bytes`.
pub fn encode<T: Serialize>(
    kind: MessageKind,
    body: &T,
    max_bytes: usize,
) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&MAGIC);
    out.push(PROTOCOL_VERSION);
    out.push(kind as u8);
    let out = postcard::to_extend(body, out).expect("plain data always serialises");
    if out.len() > max_bytes {
        return Err(EncodeError::TooLarge {
            len: out.len(),
            max: max_bytes,
        });
    }
    Ok(out)
}

/// Reads and checks the header; returns the kind and the body bytes.
///
/// # Errors
/// [`DecodeError`] for short input, wrong magic or version, unknown kind, or over `max_bytes`.
pub fn decode_header(bytes: &[u8], max_bytes: usize) -> Result<(MessageKind, &[u8]), DecodeError> {
    if bytes.len() > max_bytes {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            max: max_bytes,
        });
    }
    if bytes.len() < HEADER_BYTES {
        return Err(DecodeError::Truncated(bytes.len()));
    }
    if bytes[..2] != MAGIC {
        return Err(DecodeError::BadMagic([bytes[0], bytes[1]]));
    }
    if bytes[2] != PROTOCOL_VERSION {
        return Err(DecodeError::Version(bytes[2]));
    }
    let kind = MessageKind::from_u8(bytes[3]).ok_or(DecodeError::UnknownKind(bytes[3]))?;
    Ok((kind, &bytes[HEADER_BYTES..]))
}

/// Decodes a body (the bytes after the header) as `T`; the whole body must be consumed.
///
/// # Errors
/// [`DecodeError::Body`] or [`DecodeError::Trailing`].
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    let (value, rest) =
        postcard::take_from_bytes::<T>(body).map_err(|e| DecodeError::Body(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Trailing(rest.len()));
    }
    Ok(value)
}

/// Decodes a whole message that must be of `kind`.
///
/// # Errors
/// Any [`DecodeError`]; `WrongKind` when the header names another kind.
pub fn decode<T: DeserializeOwned>(
    bytes: &[u8],
    kind: MessageKind,
    max_bytes: usize,
) -> Result<T, DecodeError> {
    let (got, body) = decode_header(bytes, max_bytes)?;
    if got != kind {
        return Err(DecodeError::WrongKind {
            expected: kind,
            got,
        });
    }
    decode_body(body)
}
