//! Full snapshots of a catalog or of one service, with a checked header.
//!
//! ```text
//! offset size field
//!      0    4 magic  b"SHSN"
//!      4    2 format version (LE) = 1
//!      6    2 flags (LE) = 0
//!      8    8 revision (LE): the writer's contiguous head of its home region
//!     16    4 record count (LE): lifecycle + health records in the body
//!     20    8 body length in bytes (LE)
//!     28    4 CRC-32 (IEEE) of the body (LE)
//!     32    .. body: postcard(SnapshotBody)
//! ```
//!
//! Decoding checks, in order: header length, magic, version, flags, body length against the
//! bytes present (a truncated or torn file is shorter, a NUL-padded one longer), the checksum,
//! the postcard body (which must be consumed exactly), the record count and revision against
//! the header, the region heads (GC floor <= contiguous <= max seen; the header revision is the
//! home region's head), and finally every record's signature. Only when all pass is a [`Snapshot`]
//! returned: a partial snapshot is never produced (invariant 7, docs/invariants.md).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use shoal_proto::{
    InstanceId, NodeKey, Region, Revision, ServiceKey, SignatureError, SignedHealth,
    SignedLifecycle, VerifyingKey,
};

use crate::catalog::{Catalog, OwnerHead, RegionHead};
use crate::verify::Verifier;

/// Magic bytes at offset 0.
pub const SNAPSHOT_MAGIC: [u8; 4] = *b"SHSN";
/// Format version written and accepted.
pub const SNAPSHOT_FORMAT_VERSION: u16 = 1;
/// Fixed header length in bytes.
pub const SNAPSHOT_HEADER_BYTES: usize = 32;
/// Largest body accepted: 512 MiB (a 100,000-record global snapshot is ~25 MiB).
pub const MAX_SNAPSHOT_BODY_BYTES: u64 = 512 * 1024 * 1024;
/// Most records accepted in one snapshot.
pub const MAX_SNAPSHOT_RECORDS: u32 = 2_000_000;

/// What a snapshot covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotScope {
    /// Every service and every region the writer held.
    Catalog,
    /// One service key only.
    Service(ServiceKey),
}

impl SnapshotScope {
    /// True when `key` is inside the scope.
    pub fn contains(&self, key: &ServiceKey) -> bool {
        match self {
            Self::Catalog => true,
            Self::Service(k) => k == key,
        }
    }

    /// True for a whole-catalog snapshot.
    pub fn is_catalog(&self) -> bool {
        matches!(self, Self::Catalog)
    }
}

/// A decoded, verified snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// What it covers.
    pub scope: SnapshotScope,
    /// The writer's home region.
    pub region: Region,
    /// The writer's contiguous head of its home region.
    pub revision: Revision,
    /// Heads of every region at the time of writing.
    pub regions: Vec<RegionHead>,
    /// Heads of every owner health chain.
    pub owners: Vec<OwnerHead>,
    /// Lifecycle records in scope (tombstones included).
    pub lifecycle: Vec<Arc<SignedLifecycle>>,
    /// Health records in scope.
    pub health: Vec<Arc<SignedHealth>>,
}

impl Snapshot {
    /// Takes a snapshot of `catalog` (whole, or one service) as seen from `home` region.
    pub fn of(catalog: &Catalog, scope: SnapshotScope, home: Region) -> Self {
        let (regions, owners) = catalog.raw_heads();
        let mut lifecycle = Vec::new();
        let mut health = Vec::new();
        for (key, _, entry) in catalog.entries() {
            if !scope.contains(key) {
                continue;
            }
            lifecycle.push(entry.lifecycle.val.clone());
            if let Some(h) = &entry.health {
                health.push(h.val.clone());
            }
        }
        Self {
            scope,
            revision: catalog.region_head(&home),
            region: home,
            regions,
            owners,
            lifecycle,
            health,
        }
    }

    /// Number of records (lifecycle + health).
    pub fn record_count(&self) -> usize {
        self.lifecycle.len() + self.health.len()
    }
}

/// Why a snapshot was refused. Nothing was returned or installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Fewer bytes than the header or than the body length says (truncated or torn).
    #[error("snapshot truncated: {have} bytes present, {need} needed")]
    Truncated {
        /// Bytes present.
        have: u64,
        /// Bytes the header requires.
        need: u64,
    },
    /// More bytes than the header says (e.g. NUL padding from a torn write).
    #[error("snapshot has {0} trailing bytes after the body")]
    Trailing(u64),
    /// Not a snapshot file.
    #[error("bad snapshot magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// A format version this build cannot read.
    #[error("unsupported snapshot format version {0}")]
    Version(u16),
    /// Unknown flags set.
    #[error("unsupported snapshot flags {0:#x}")]
    Flags(u16),
    /// Body or record count over the limits.
    #[error("snapshot too large: {0}")]
    TooLarge(String),
    /// The body checksum does not match.
    #[error("snapshot checksum mismatch: header {header:#010x}, body {body:#010x}")]
    Checksum {
        /// Checksum in the header.
        header: u32,
        /// Checksum of the body present.
        body: u32,
    },
    /// The body does not decode (or a value in it fails validation).
    #[error("snapshot body malformed: {0}")]
    Malformed(String),
    /// Header and body disagree (record count or revision).
    #[error("snapshot header and body disagree: {0}")]
    Inconsistent(String),
    /// A record's signature does not verify.
    #[error("snapshot record {index} has a bad signature: {error}")]
    BadSignature {
        /// Position of the record (lifecycle first, then health).
        index: usize,
        /// Why.
        error: SignatureError,
    },
}

/// Encodes a snapshot with its header.
pub fn encode(snapshot: &Snapshot) -> Vec<u8> {
    let body = postcard::to_allocvec(snapshot).expect("plain data always serialises");
    let mut out = Vec::with_capacity(SNAPSHOT_HEADER_BYTES + body.len());
    out.extend_from_slice(&SNAPSHOT_MAGIC);
    out.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&snapshot.revision.0.to_le_bytes());
    out.extend_from_slice(&(snapshot.record_count() as u32).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    debug_assert_eq!(out.len(), SNAPSHOT_HEADER_BYTES);
    out.extend_from_slice(&body);
    out
}

fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}
fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}
fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Decodes and fully verifies a snapshot. See the module docs for the checks.
///
/// # Errors
/// [`SnapshotError`] naming the first check that failed.
pub fn decode(bytes: &[u8], verifier: &dyn Verifier) -> Result<Snapshot, SnapshotError> {
    let have = bytes.len() as u64;
    if bytes.len() < SNAPSHOT_HEADER_BYTES {
        return Err(SnapshotError::Truncated {
            have,
            need: SNAPSHOT_HEADER_BYTES as u64,
        });
    }
    let magic: [u8; 4] = bytes[..4].try_into().expect("4 bytes");
    if magic != SNAPSHOT_MAGIC {
        return Err(SnapshotError::BadMagic(magic));
    }
    let version = le_u16(&bytes[4..]);
    if version != SNAPSHOT_FORMAT_VERSION {
        return Err(SnapshotError::Version(version));
    }
    let flags = le_u16(&bytes[6..]);
    if flags != 0 {
        return Err(SnapshotError::Flags(flags));
    }
    let revision = le_u64(&bytes[8..]);
    let count = le_u32(&bytes[16..]);
    let body_len = le_u64(&bytes[20..]);
    let crc = le_u32(&bytes[28..]);
    if body_len > MAX_SNAPSHOT_BODY_BYTES || count > MAX_SNAPSHOT_RECORDS {
        return Err(SnapshotError::TooLarge(format!(
            "body {body_len} bytes, {count} records"
        )));
    }
    let need = SNAPSHOT_HEADER_BYTES as u64 + body_len;
    if have < need {
        return Err(SnapshotError::Truncated { have, need });
    }
    if have > need {
        return Err(SnapshotError::Trailing(have - need));
    }
    let body = &bytes[SNAPSHOT_HEADER_BYTES..];
    let actual = crc32fast::hash(body);
    if actual != crc {
        return Err(SnapshotError::Checksum {
            header: crc,
            body: actual,
        });
    }
    let (snap, rest) = postcard::take_from_bytes::<Snapshot>(body)
        .map_err(|e| SnapshotError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(SnapshotError::Malformed(format!(
            "{} bytes left after the body",
            rest.len()
        )));
    }
    if snap.record_count() != count as usize {
        return Err(SnapshotError::Inconsistent(format!(
            "header says {count} records, body has {}",
            snap.record_count()
        )));
    }
    if snap.revision.0 != revision {
        return Err(SnapshotError::Inconsistent(format!(
            "header revision {revision}, body revision {}",
            snap.revision
        )));
    }
    check_heads(&snap)?;
    verify_all(&snap, verifier)?;
    Ok(snap)
}

/// Heads are not signed, so at least refuse heads no honest catalog can have: a GC floor above
/// the contiguous head (installing it would refuse every new instance at or below it as
/// "collected"), a contiguous head above the highest revision seen, or a header revision that
/// is not the writer's home-region head.
fn check_heads(snap: &Snapshot) -> Result<(), SnapshotError> {
    for h in &snap.regions {
        if h.gc_floor > h.contiguous || h.contiguous > h.max_seen {
            return Err(SnapshotError::Inconsistent(format!(
                "region {} head: gc floor {}, contiguous {}, max seen {}",
                h.region, h.gc_floor, h.contiguous, h.max_seen
            )));
        }
    }
    let home = snap
        .regions
        .iter()
        .find(|h| h.region == snap.region)
        .map_or(Revision(0), |h| h.contiguous);
    if home != snap.revision {
        return Err(SnapshotError::Inconsistent(format!(
            "snapshot revision {} is not the home region's head {home}",
            snap.revision
        )));
    }
    Ok(())
}

fn verify_all(snap: &Snapshot, verifier: &dyn Verifier) -> Result<(), SnapshotError> {
    for (index, rec) in snap.lifecycle.iter().enumerate() {
        if let Some(key) = scope_mismatch(&snap.scope, &rec.record.key) {
            return Err(SnapshotError::Inconsistent(format!(
                "record {index} for {key} outside the snapshot scope"
            )));
        }
        verifier
            .verify_lifecycle(rec)
            .map_err(|error| SnapshotError::BadSignature { index, error })?;
    }
    // Health verifies against the key its own lifecycle record binds (ADR 0006).
    let bound: BTreeMap<(&ServiceKey, &InstanceId), Option<NodeKey>> = snap
        .lifecycle
        .iter()
        .map(|r| ((&r.record.key, &r.record.instance), r.record.owner_key))
        .collect();
    let base = snap.lifecycle.len();
    for (i, rec) in snap.health.iter().enumerate() {
        if let Some(key) = scope_mismatch(&snap.scope, &rec.record.key) {
            return Err(SnapshotError::Inconsistent(format!(
                "record {} for {key} outside the snapshot scope",
                base + i
            )));
        }
        let key = bound
            .get(&(&rec.record.key, &rec.record.instance))
            .copied()
            .flatten()
            .and_then(|k| VerifyingKey::from_bytes(k).ok())
            .ok_or(SignatureError::UnknownKey(rec.signer));
        key.and_then(|k| verifier.verify_health(rec, &k))
            .map_err(|error| SnapshotError::BadSignature {
                index: base + i,
                error,
            })?;
    }
    Ok(())
}

fn scope_mismatch<'a>(scope: &SnapshotScope, key: &'a ServiceKey) -> Option<&'a ServiceKey> {
    (!scope.contains(key)).then_some(key)
}
