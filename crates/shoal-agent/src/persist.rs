//! Snapshot persistence: the catalog (with its version heads) and the last live members,
//! written atomically every `persist.interval_ms` and on shutdown, two generations kept.
//!
//! Files in the data directory:
//! * `catalog.snap` — the newest `shoal_catalog::snapshot` encoding (checked header + CRC +
//!   signatures); `catalog.snap.1` — the previous one;
//! * `members.json` — the membership's address book (`shoal_runtime::members_file`, shared
//!   with the authority's embedded member; re-exported here).
//!
//! At boot [`load_snapshot`] tries `catalog.snap`, then `catalog.snap.1`; a file that fails any
//! check is reported, counted and skipped, never installed (invariant 7, docs/invariants.md).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use shoal_catalog::snapshot::{self, Snapshot};
use shoal_catalog::Verifier;

use crate::keys::write_atomic;

/// Newest snapshot file.
pub const SNAPSHOT_FILE: &str = "catalog.snap";
/// Previous snapshot file.
pub const SNAPSHOT_PREV_FILE: &str = "catalog.snap.1";

pub use shoal_runtime::members_file::{
    parse_members, read_members, read_members_checked, unix_ms, write_members, MembersFileError,
    PersistedMember, MAX_PERSISTED_MEMBERS, MEMBERS_FILE,
};

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
}
