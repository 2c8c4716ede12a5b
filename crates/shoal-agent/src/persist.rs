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

/// How long an unchanged address book may go without being rewritten (its entries'
/// `last_seen_unix_ms` then lag by at most this much after a restart), ms.
pub const MEMBERS_REFRESH_MS: u64 = 60_000;

/// What the periodic persist last wrote, so that an unchanged catalog or address book is not
/// rewritten (and fsynced) every `persist.interval_ms` (issue 19: idle cost).
///
/// * The snapshot is rewritten only when its encoding differs from the last one written (a
///   CRC-32 and the length of the bytes), or when the previous generation (`catalog.snap.1`)
///   does not hold the same bytes yet: after a change the next round writes once more, so that
///   both generations hold the latest catalog, as they did when every round rewrote. When
///   skipped, only the file's mtime is set to now, so the snapshot age read at the next boot
///   (from the mtime) stays what it was with a rewrite.
/// * The address book is rewritten when its (node, address) set differs from the last one
///   written, or when the last write is [`MEMBERS_REFRESH_MS`] old (its last-seen times move
///   every round, so comparing them would rewrite it every time).
#[derive(Debug, Default)]
pub struct Persisted {
    snapshot_crc: Option<(u32, usize)>,
    /// The previous generation holds the same bytes as the newest.
    prev_same: bool,
    members: Option<(Vec<(String, std::net::SocketAddr)>, SystemTime)>,
}

/// What [`Persisted::write`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The snapshot file was rewritten (false: unchanged, mtime set).
    pub snapshot: bool,
    /// The address book was rewritten.
    pub members: bool,
}

impl Persisted {
    /// Writes the snapshot `bytes` and the address book `members` into `dir`, each unless
    /// unchanged (see the type's docs). What is remembered changes only on success.
    ///
    /// # Errors
    /// IO errors of either file (the files on disk are then the old ones).
    pub fn write(
        &mut self,
        dir: &Path,
        bytes: &[u8],
        members: &[PersistedMember],
    ) -> io::Result<Written> {
        let crc = (crc32fast::hash(bytes), bytes.len());
        let cur = dir.join(SNAPSHOT_FILE);
        let unchanged = self.snapshot_crc == Some(crc);
        let same = unchanged && self.prev_same && touch(&cur).is_ok();
        if !same {
            self.snapshot_crc = None;
            self.prev_same = false;
            write_snapshot(dir, bytes)?;
            self.snapshot_crc = Some(crc);
            // The rotated file is the last write: the same bytes when nothing changed.
            self.prev_same = unchanged;
        }
        let set: Vec<(String, std::net::SocketAddr)> =
            members.iter().map(|m| (m.node.clone(), m.addr)).collect();
        let now = SystemTime::now();
        let fresh = self.members.as_ref().is_some_and(|(last, at)| {
            *last == set
                && now
                    .duration_since(*at)
                    .is_ok_and(|d| d.as_millis() < u128::from(MEMBERS_REFRESH_MS))
        });
        let members_written = !fresh && !members.is_empty();
        if !fresh {
            shoal_runtime::members_file::write_book(dir, members)?;
            self.members = Some((set, now));
        }
        Ok(Written {
            snapshot: !same,
            members: members_written,
        })
    }
}

/// Sets `path`'s modification time to now (one open and one `utimensat`; no data written).
fn touch(path: &Path) -> io::Result<()> {
    fs::File::options()
        .write(true)
        .open(path)?
        .set_modified(SystemTime::now())
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

/// Largest state file the agent reads back from its data directory, bytes (256 MiB: a
/// global snapshot of 100,000 endpoints is ~24 MiB; the owner and probe tables are bounded
/// far below). A larger file is refused unread.
pub const MAX_STATE_FILE_BYTES: u64 = 256 << 20;

/// Reads a state file of the data directory: a regular file of at most
/// [`MAX_STATE_FILE_BYTES`], opened without blocking (a FIFO in its place is refused, not
/// waited on; see [`shoal_transport::keyfile::read_regular_bounded`]).
///
/// # Errors
/// The open error (`NotFound` for a missing file), or `InvalidData` for a file that is not a
/// regular file or is too large.
pub fn read_state_file(path: &Path) -> io::Result<Vec<u8>> {
    shoal_transport::keyfile::read_regular_bounded(path, MAX_STATE_FILE_BYTES)
}

/// Loads the newest snapshot that passes every check. Returns it (if any) and the files
/// refused on the way.
pub fn load_snapshot(dir: &Path, verifier: &dyn Verifier) -> (Option<Loaded>, Vec<Refused>) {
    let mut refused = Vec::new();
    for name in [SNAPSHOT_FILE, SNAPSHOT_PREV_FILE] {
        let path = dir.join(name);
        let bytes = match read_state_file(&path) {
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
            let merged = c.apply_lifecycle(Arc::new(rec), &fx.keyring);
            assert_eq!(merged, shoal_catalog::MergeOutcome::Applied);
        }
        snapshot::encode(&Snapshot::of(&c, SnapshotScope::Catalog, fx.region.clone()))
    }

    #[test]
    fn unchanged_files_are_not_rewritten_but_the_snapshot_mtime_moves() {
        let fx = Fixture::new();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let member = |node: &str, seen: u64| PersistedMember {
            node: node.into(),
            addr: "127.0.0.1:7946".parse().unwrap(),
            last_seen_unix_ms: Some(seen),
        };
        let mut p = Persisted::default();
        let two = snap_bytes(&fx, 2);
        let w = p.write(d, &two, &[member("n1", 1)]).unwrap();
        assert_eq!((w.snapshot, w.members), (true, true));
        // Unchanged, but the previous generation does not hold it yet: written once more.
        let w = p.write(d, &two, &[member("n1", 1)]).unwrap();
        assert_eq!((w.snapshot, w.members), (true, false));
        assert_eq!(fs::read(d.join(SNAPSHOT_PREV_FILE)).unwrap(), two);
        // Backdate the file: an unchanged write must set its mtime to now without rewriting.
        let old = SystemTime::now() - std::time::Duration::from_secs(3_600);
        fs::File::options()
            .write(true)
            .open(d.join(SNAPSHOT_FILE))
            .unwrap()
            .set_modified(old)
            .unwrap();
        // Same snapshot, same member set with a newer last-seen: nothing rewritten.
        let w = p.write(d, &two, &[member("n1", 2)]).unwrap();
        assert_eq!((w.snapshot, w.members), (false, false));
        assert_eq!(
            fs::read(d.join(SNAPSHOT_PREV_FILE)).unwrap(),
            two,
            "no rotation"
        );
        let mtime = fs::metadata(d.join(SNAPSHOT_FILE))
            .unwrap()
            .modified()
            .unwrap();
        assert!(mtime > old + std::time::Duration::from_secs(3_000));
        assert_eq!(read_members(d), vec![member("n1", 1)]);
        // A changed catalog or member set is written (the previous snapshot rotated).
        let three = snap_bytes(&fx, 3);
        let w = p.write(d, &three, &[member("n2", 3)]).unwrap();
        assert_eq!((w.snapshot, w.members), (true, true));
        assert_eq!(fs::read(d.join(SNAPSHOT_FILE)).unwrap(), three);
        assert_eq!(fs::read(d.join(SNAPSHOT_PREV_FILE)).unwrap(), two);
        assert_eq!(read_members(d), vec![member("n2", 3)]);
        // Then once more (both generations hold it), then skipped.
        assert!(p.write(d, &three, &[member("n2", 3)]).unwrap().snapshot);
        assert_eq!(fs::read(d.join(SNAPSHOT_PREV_FILE)).unwrap(), three);
        assert!(!p.write(d, &three, &[member("n2", 3)]).unwrap().snapshot);
        // The file removed behind its back: rewritten, not just touched.
        fs::remove_file(d.join(SNAPSHOT_FILE)).unwrap();
        let w = p.write(d, &three, &[member("n2", 3)]).unwrap();
        assert!(w.snapshot);
        assert_eq!(fs::read(d.join(SNAPSHOT_FILE)).unwrap(), three);
        // The book's refresh: once MEMBERS_REFRESH_MS old, an unchanged set is written again.
        p.members.as_mut().unwrap().1 -= std::time::Duration::from_millis(MEMBERS_REFRESH_MS);
        let w = p.write(d, &three, &[member("n2", 4)]).unwrap();
        assert_eq!((w.snapshot, w.members), (false, true));
        assert_eq!(read_members(d), vec![member("n2", 4)]);
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
