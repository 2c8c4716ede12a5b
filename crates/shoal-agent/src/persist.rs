//! Snapshot persistence: the catalog (with its version heads) and the last live members,
//! written atomically every `persist.interval_ms` and on shutdown, two generations kept.
//!
//! Files in the data directory:
//! * `catalog.snap` — the newest `shoal_catalog::snapshot` encoding (checked header + CRC +
//!   signatures); `catalog.snap.1` — the previous one;
//! * `members.json` — the membership's address book: live members, seeds and members that
//!   went down, each with when it was last seen (unix ms); used as extra join seeds and put
//!   back into the book at start, which keeps knocking on them (heals partitions of any
//!   length, `shoal-mesh` `membership/reconnect.rs`). Written atomically like the snapshot;
//!   a torn or corrupt file reads as empty (counted, logged), entries only being hints.
//!
//! At boot [`load_snapshot`] tries `catalog.snap`, then `catalog.snap.1`; a file that fails any
//! check is reported, counted and skipped, never installed (invariant 7, docs/invariants.md).

use std::fs;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use shoal_catalog::snapshot::{self, Snapshot};
use shoal_catalog::Verifier;
use shoal_mesh::membership::KnownAddress;
use shoal_proto::NodeId;

use crate::keys::write_atomic;

/// Newest snapshot file.
pub const SNAPSHOT_FILE: &str = "catalog.snap";
/// Previous snapshot file.
pub const SNAPSHOT_PREV_FILE: &str = "catalog.snap.1";
/// Last live members.
pub const MEMBERS_FILE: &str = "members.json";
/// Most members persisted (bounds the file and the seed list; the membership's book holds
/// 512 by default, the freshest are kept).
pub const MAX_PERSISTED_MEMBERS: usize = 256;

/// One persisted member (an address-book entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistedMember {
    /// Node id (empty for a seed never answered).
    pub node: String,
    /// Listen address.
    pub addr: SocketAddr,
    /// When a member was last active at this address, unix ms (absent in files written
    /// before the address book: read as "now").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_unix_ms: Option<u64>,
}

impl PersistedMember {
    /// From a book entry, `now_unix_ms` being the wall time of the export.
    pub fn from_known(k: &KnownAddress, now_unix_ms: u64) -> Self {
        Self {
            node: k.node.as_ref().map(ToString::to_string).unwrap_or_default(),
            addr: k.addr,
            last_seen_unix_ms: Some(now_unix_ms.saturating_sub(k.unseen_for_ms)),
        }
    }

    /// Back to a book entry (as a non-seed; seeds come from configuration). A node id that
    /// does not parse is dropped, the address kept.
    pub fn to_known(&self, now_unix_ms: u64) -> KnownAddress {
        KnownAddress {
            addr: self.addr,
            node: NodeId::new(&self.node).ok(),
            seed: false,
            unseen_for_ms: self
                .last_seen_unix_ms
                .map_or(0, |t| now_unix_ms.saturating_sub(t)),
        }
    }
}

/// Wall time in unix ms (0 before 1970).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Writes a snapshot, keeping the previous one as `catalog.snap.1`.
///
/// # Errors
/// IO errors (disk full...): the files on disk are then the old ones.
pub fn write_snapshot(dir: &Path, bytes: &[u8]) -> io::Result<()> {
    let cur = dir.join(SNAPSHOT_FILE);
    if cur.exists() {
        fs::rename(&cur, dir.join(SNAPSHOT_PREV_FILE))?;
    }
    write_atomic(&cur, bytes, 0o600)
}

/// Writes the live members.
///
/// # Errors
/// IO errors.
pub fn write_members(dir: &Path, members: &[PersistedMember]) -> io::Result<()> {
    let members = &members[..members.len().min(MAX_PERSISTED_MEMBERS)];
    let json = serde_json::to_vec(members).map_err(io::Error::other)?;
    write_atomic(&dir.join(MEMBERS_FILE), &json, 0o600)
}

/// Reads the persisted members; missing or corrupt -> empty (they are only join hints).
pub fn read_members(dir: &Path) -> Vec<PersistedMember> {
    fs::read(dir.join(MEMBERS_FILE))
        .map(|b| parse_members(&b).unwrap_or_default())
        .unwrap_or_default()
}

/// Why `members.json` was not used.
#[derive(Debug, thiserror::Error)]
pub enum MembersFileError {
    /// The file exists but could not be read.
    #[error("cannot read {MEMBERS_FILE}: {0}")]
    Read(#[from] io::Error),
    /// Torn, truncated or not our format: nothing of it is used.
    #[error("{MEMBERS_FILE} is not a valid member list: {0}")]
    Parse(#[from] serde_json::Error),
}

/// Reads the persisted members for the address book. A missing file is an empty list; a
/// torn or corrupt one is an error (the caller logs and counts it, and starts without).
///
/// # Errors
/// [`MembersFileError`]: nothing was read.
pub fn read_members_checked(dir: &Path) -> Result<Vec<PersistedMember>, MembersFileError> {
    match fs::read(dir.join(MEMBERS_FILE)) {
        Ok(b) => Ok(parse_members(&b)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Parses the content of `members.json`, at most [`MAX_PERSISTED_MEMBERS`].
///
/// # Errors
/// The JSON error of a torn or corrupt file.
pub fn parse_members(bytes: &[u8]) -> Result<Vec<PersistedMember>, serde_json::Error> {
    serde_json::from_slice::<Vec<PersistedMember>>(bytes).map(|mut v| {
        v.truncate(MAX_PERSISTED_MEMBERS);
        v
    })
}

/// A snapshot loaded at boot.
#[derive(Debug)]
pub struct Loaded {
    /// The verified snapshot.
    pub snapshot: Snapshot,
    /// Which file it came from.
    pub path: PathBuf,
    /// When the file was written.
    pub written: SystemTime,
}

/// A snapshot file that was refused.
#[derive(Debug)]
pub struct Refused {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub reason: String,
}

/// Loads the newest snapshot that passes every check. Returns it (if any) and the files
/// refused on the way.
pub fn load_snapshot(dir: &Path, verifier: &dyn Verifier) -> (Option<Loaded>, Vec<Refused>) {
    let mut refused = Vec::new();
    for name in [SNAPSHOT_FILE, SNAPSHOT_PREV_FILE] {
        let path = dir.join(name);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                refused.push(Refused {
                    path,
                    reason: e.to_string(),
                });
                continue;
            }
        };
        match snapshot::decode(&bytes, verifier) {
            Ok(snapshot) => {
                let written = fs::metadata(&path)
                    .and_then(|m| m.modified())
                    .unwrap_or_else(|_| SystemTime::now());
                return (
                    Some(Loaded {
                        snapshot,
                        path,
                        written,
                    }),
                    refused,
                );
            }
            Err(e) => refused.push(Refused {
                path,
                reason: e.to_string(),
            }),
        }
    }
    (None, refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_catalog::snapshot::SnapshotScope;
    use shoal_catalog::testkit::Fixture;
    use shoal_catalog::Catalog;
    use std::sync::Arc;

    fn snap_bytes(fx: &Fixture, n: usize) -> Vec<u8> {
        let mut c = Catalog::new();
        for i in 0..n {
            let rec = fx.lifecycle(
                &format!("a-{i}"),
                1,
                i as u64 + 1,
                shoal_proto::LifecycleState::Ready,
            );
            c.apply_lifecycle(Arc::new(rec), &fx.keyring);
        }
        snapshot::encode(&Snapshot::of(&c, SnapshotScope::Catalog, fx.region.clone()))
    }

    #[test]
    fn corrupt_newest_falls_back_to_previous() {
        let fx = Fixture::new();
        let dir = tempfile::tempdir().unwrap();
        write_snapshot(dir.path(), &snap_bytes(&fx, 2)).unwrap();
        let mut newer = snap_bytes(&fx, 3);
        write_snapshot(dir.path(), &newer).unwrap();
        let (loaded, refused) = load_snapshot(dir.path(), &fx.keyring);
        assert!(refused.is_empty());
        assert_eq!(loaded.unwrap().snapshot.lifecycle.len(), 3);
        // Flip a body byte of the newest: refused, the older generation is used.
        let last = newer.len() - 1;
        newer[last] ^= 0xff;
        fs::write(dir.path().join(SNAPSHOT_FILE), &newer).unwrap();
        let (loaded, refused) = load_snapshot(dir.path(), &fx.keyring);
        assert_eq!(refused.len(), 1);
        assert_eq!(loaded.unwrap().snapshot.lifecycle.len(), 2);
        // Truncate the older too: nothing is served.
        fs::write(dir.path().join(SNAPSHOT_PREV_FILE), &newer[..10]).unwrap();
        let (loaded, refused) = load_snapshot(dir.path(), &fx.keyring);
        assert!(loaded.is_none());
        assert_eq!(refused.len(), 2);
    }

    #[test]
    fn members_round_trip_and_garbage_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let m = vec![PersistedMember {
            node: "n1".into(),
            addr: "127.0.0.1:1".parse().unwrap(),
            last_seen_unix_ms: Some(1_000),
        }];
        write_members(dir.path(), &m).unwrap();
        assert_eq!(read_members(dir.path()), m);
        fs::write(dir.path().join(MEMBERS_FILE), b"{garbage").unwrap();
        assert!(read_members(dir.path()).is_empty());
        assert!(matches!(
            read_members_checked(dir.path()),
            Err(MembersFileError::Parse(_))
        ));
    }

    #[test]
    fn a_torn_members_file_is_refused_whole_and_an_old_one_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let m: Vec<PersistedMember> = (0..10)
            .map(|i| PersistedMember {
                node: format!("n{i}"),
                addr: format!("127.0.0.1:{}", 1000 + i).parse().unwrap(),
                last_seen_unix_ms: Some(5_000 + i),
            })
            .collect();
        write_members(dir.path(), &m).unwrap();
        let full = fs::read(dir.path().join(MEMBERS_FILE)).unwrap();
        // A crash mid-write (were the write not atomic) leaves a prefix: never half a list.
        for cut in [1, full.len() / 2, full.len() - 1] {
            fs::write(dir.path().join(MEMBERS_FILE), &full[..cut]).unwrap();
            assert!(read_members_checked(dir.path()).is_err(), "cut at {cut}");
        }
        // Files written before the address book (no last-seen time) still read.
        fs::write(
            dir.path().join(MEMBERS_FILE),
            br#"[{"node":"n1","addr":"127.0.0.1:1"}]"#,
        )
        .unwrap();
        let old = read_members_checked(dir.path()).unwrap();
        assert_eq!(old[0].last_seen_unix_ms, None);
        assert_eq!(old[0].to_known(9_000).unseen_for_ms, 0);
        // Last-seen round trip through the book's "unseen for".
        let k = KnownAddress {
            addr: "127.0.0.1:2".parse().unwrap(),
            node: NodeId::new("n2").ok(),
            seed: false,
            unseen_for_ms: 4_000,
        };
        let p = PersistedMember::from_known(&k, 10_000);
        assert_eq!(p.last_seen_unix_ms, Some(6_000));
        assert_eq!(p.to_known(16_000).unseen_for_ms, 10_000);
        assert_eq!(p.to_known(16_000).node, k.node);
    }
}
