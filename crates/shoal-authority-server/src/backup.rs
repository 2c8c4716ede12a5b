//! Backups and disaster recovery of a replica's data directory: the directory lock a running
//! replica holds, `snapshot save` (copy the latest verified snapshot, asking a running young
//! replica for one first) and `snapshot restore` (start a new cluster incarnation,
//! docs/adr/0007-authority-restore.md). Split out of [`crate::storage`], which re-exports
//! these items.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::files::{self, FileError};
use crate::storage::{
    dec, enc, StoredSnapshot, AUDIT_FILE, LOG_FILE, PURGED_FILE, SNAPSHOT_FILE, VOTE_FILE,
};
use crate::types::{SnapshotMeta, Vote};

/// File a running replica holds an exclusive lock on (and writes its pid into), so operator
/// commands can tell a live replica from a stopped one.
pub const LOCK_FILE: &str = "replica.lock";
/// File an operator command creates to ask the running replica for a snapshot now; the replica
/// removes it once the snapshot is built.
pub const SNAPSHOT_REQUEST_FILE: &str = "snapshot.request";
/// Default margin added to the backup's own head when `restore` is not given `--floor`: room
/// for the revisions and log entries the region issued after the backup was taken.
pub const DEFAULT_RESTORE_MARGIN: u64 = 1_000_000_000;

/// An exclusive lock on a replica's data directory, held while the replica (or a restore)
/// runs; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

/// Takes the data directory's lock ([`LOCK_FILE`], created 0600) without waiting, and writes
/// our pid in it. A missing directory is created 0700 (its parents too); an existing one is
/// not changed (warned about when group or others can reach it).
///
/// # Errors
/// [`FileError::Busy`] when another process (a running replica) holds it; [`FileError::Io`].
pub fn lock_data_dir(dir: &Path) -> Result<DirLock, FileError> {
    shoal_transport::keyfile::ensure_private_dir(dir).map_err(|e| FileError::io(dir, e.into()))?;
    let path = dir.join(LOCK_FILE);
    match shoal_transport::keyfile::lock_pid_file(&path) {
        Ok(file) => Ok(DirLock { _file: file }),
        Err(shoal_transport::keyfile::PidLockError::Held { path, pid }) => Err(FileError::Busy {
            path,
            what: format!("held by a running replica (pid {pid}); stop it first"),
        }),
        Err(shoal_transport::keyfile::PidLockError::Io { path, source }) => {
            Err(FileError::io(&path, source))
        }
    }
}

/// Refuses a data directory that does not exist (an operator command must not create one:
/// a typo would otherwise leave a new directory behind and blame a stopped replica).
///
/// # Errors
/// [`FileError::Io`] (`NotFound`: "no replica data directory at ...", or not a directory).
pub fn existing_data_dir(dir: &Path) -> Result<(), FileError> {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(FileError::Io {
            path: dir.to_path_buf(),
            error: std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                "not a directory, so not a replica data directory (check --data-dir)",
            ),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(FileError::Io {
            path: dir.to_path_buf(),
            error: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "no replica data directory at {} (check --data-dir)",
                    dir.display()
                ),
            ),
        }),
        Err(e) => Err(FileError::io(dir, e)),
    }
}

/// Whether a running process holds the data directory's lock. Only looks: creates nothing,
/// writes nothing (a missing lock file means no replica has run here).
fn dir_is_locked(dir: &Path) -> bool {
    let path = dir.join(LOCK_FILE);
    let Ok(file) = File::open(&path) else {
        return false;
    };
    matches!(file.try_lock_shared(), Err(fs::TryLockError::WouldBlock))
}

/// Copies the verified snapshot of a (running or stopped) replica's data directory to `out`.
///
/// The server writes `snapshot.bin` every `snapshot_every_logs` entries and at shutdown. When a
/// young replica has none yet and is running, this asks it for one ([`SNAPSHOT_REQUEST_FILE`],
/// picked up within its `expire_interval_ms`) and waits up to `wait` for it. The copy is
/// written atomically and checked (checksum and the state's invariants) before and after.
///
/// An existing `out` (an earlier backup) is replaced only when `replace` (`--force`); without
/// it the copy is linked into place, which fails rather than overwrite a file that appeared
/// meanwhile.
///
/// # Errors
/// No data directory (it is never created), `out` exists and not `replace`
/// ([`FileError::Busy`]), no snapshot and the replica is stopped (start it: a stopped
/// replica's log may hold uncommitted entries, which must not go into a backup), no snapshot
/// within `wait`, a damaged snapshot, or IO. `out` is untouched on error.
pub fn save_snapshot(
    data_dir: &Path,
    out: &Path,
    wait: std::time::Duration,
    replace: bool,
) -> Result<SnapshotMeta, FileError> {
    existing_data_dir(data_dir)?;
    if !replace && fs::symlink_metadata(out).is_ok() {
        return Err(exists(out));
    }
    let src = data_dir.join(SNAPSHOT_FILE);
    let snap = match StoredSnapshot::read(&src)? {
        Some((snap, _)) => snap,
        None => {
            if !dir_is_locked(data_dir) {
                return Err(FileError::Io {
                    path: src,
                    error: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "no snapshot yet and the replica is not running: start it and run \
                         save again (a running replica builds one on request)",
                    ),
                });
            }
            let req = data_dir.join(SNAPSHOT_REQUEST_FILE);
            OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&req)
                .map_err(|e| FileError::io(&req, e))?;
            let deadline = std::time::Instant::now() + wait;
            loop {
                if let Some((snap, _)) = StoredSnapshot::read(&src)? {
                    break snap;
                }
                if std::time::Instant::now() >= deadline {
                    return Err(FileError::Io {
                        path: src,
                        error: std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("the running replica built no snapshot within {wait:?}"),
                        ),
                    });
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    };
    if replace {
        snap.write(out)?;
    } else {
        write_new(&snap, out)?;
    }
    StoredSnapshot::read(out)?.ok_or_else(|| FileError::Corrupt {
        path: out.to_path_buf(),
        what: "vanished after writing".into(),
    })?;
    Ok(snap.meta)
}

fn exists(out: &Path) -> FileError {
    FileError::Busy {
        path: out.to_path_buf(),
        what: "already exists, refusing to overwrite it (pass --force to replace it)".into(),
    }
}

/// Writes `snap` to `out`, which must not exist: a complete temp file beside it, linked into
/// place (`link(2)` fails on an existing name, so nothing is ever overwritten), then removed.
fn write_new(snap: &StoredSnapshot, out: &Path) -> Result<(), FileError> {
    let name = out
        .file_name()
        .map_or_else(|| "snapshot".into(), |n| n.to_string_lossy().into_owned());
    let tmp = out.with_file_name(format!(".{name}.new-{}", std::process::id()));
    snap.write(&tmp)?;
    let linked = fs::hard_link(&tmp, out);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => files::sync_dir(out),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(exists(out)),
        Err(e) => Err(FileError::io(out, e)),
    }
}

/// How to restore: see [`restore_snapshot`].
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// Every revision and generation the region issued before is `<= floor` (the operator
    /// read it from the agents' region heads). `None`: the backup's own head (the larger of
    /// its revision head and last log index) plus [`RestoreOptions::margin`].
    pub floor: Option<u64>,
    /// Margin added when `floor` is `None` (0 means [`DEFAULT_RESTORE_MARGIN`]).
    pub margin: u64,
    /// Id of the new incarnation: `None` picks a random one (the first replica); the other
    /// replicas pass the id (and the floor) the first restore printed.
    pub cluster_id: Option<String>,
    /// Allow discarding an existing vote, log or snapshot (they are moved aside, not deleted).
    pub force_new_cluster: bool,
    /// Start the new incarnation with this replica (a Raft id of the backup's membership) as
    /// its only voter, so it elects itself alone; the others are then added one at a time
    /// with `members add` (docs/operations.md, "Rebuild a region after a restore").
    /// `None`: keep the backup's voters.
    pub single_voter: Option<crate::types::RaftId>,
}

/// What a restore did (or, refused, would do).
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// The backup's metadata.
    pub meta: SnapshotMeta,
    /// The new incarnation's id.
    pub cluster_id: String,
    /// The floor: every new revision and generation is above it.
    pub floor: u64,
    /// The backup's revision head and last log index.
    pub backup_head: (u64, u64),
    /// Existing files of the data directory that were (or would be) moved aside.
    pub moved_aside: Vec<String>,
    /// Where they went.
    pub aside_dir: Option<PathBuf>,
}

fn random_cluster_id() -> String {
    let mut b = [0u8; 8];
    rand::fill(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Restores a backup (`file`, made by [`save_snapshot`]) into a **stopped** replica's data
/// directory as a **new cluster incarnation** (docs/adr/0007-authority-restore.md):
///
/// - refuses while a replica holds the directory's lock ([`LOCK_FILE`]);
/// - refuses when the directory holds a vote, a log or a snapshot (it belongs to a cluster)
///   unless `force_new_cluster`; those files, `audit.log` included, are then moved into
///   `pre-restore-<cluster id>/` inside the directory, never deleted;
/// - raises the state's floor ([`shoal_authority::AuthorityState::raise_floor`]) so every
///   revision and generation issued afterwards is above everything the region issued before;
/// - writes `snapshot.bin`, `purged.bin` (the log starts empty after the backup's last index)
///   and a fresh `vote.bin`: not committed, voting for nobody, at the larger of the old vote's
///   and the backup's term, so the replica never believes it is leader without an election.
///
/// Restoring the same file with the same floor and cluster id gives byte-identical
/// directories, which is how the other replicas of the new cluster are seeded today.
///
/// # Errors
/// [`FileError::Busy`] for a running replica or a directory that belongs to a cluster without
/// `force_new_cluster` (nothing changed then); a damaged backup; IO.
pub fn restore_snapshot(
    data_dir: &Path,
    file: &Path,
    opts: &RestoreOptions,
) -> Result<RestoreReport, FileError> {
    let (snap, mut state) = StoredSnapshot::read(file)?.ok_or_else(|| FileError::Io {
        path: file.to_path_buf(),
        error: std::io::Error::new(std::io::ErrorKind::NotFound, "no such snapshot file"),
    })?;
    shoal_transport::keyfile::ensure_private_dir(data_dir)
        .map_err(|e| FileError::io(data_dir, e.into()))?;
    let _lock = lock_data_dir(data_dir)?;
    let last_index = snap.meta.last_log_id.map_or(0, |l| l.index);
    let backup_head = (state.head_revision().0, last_index);
    let margin = if opts.margin == 0 {
        DEFAULT_RESTORE_MARGIN
    } else {
        opts.margin
    };
    let floor = opts
        .floor
        .unwrap_or_else(|| backup_head.0.max(backup_head.1).saturating_add(margin));
    let cluster_id = match &opts.cluster_id {
        Some(id)
            if id.is_empty()
                || id.len() > 64
                || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') =>
        {
            return Err(FileError::Busy {
                path: file.to_path_buf(),
                what: format!("--cluster-id {id:?}: use 1-64 letters, digits or '-'"),
            })
        }
        Some(id) => id.clone(),
        None => random_cluster_id(),
    };
    let existing: Vec<String> = [
        LOG_FILE,
        VOTE_FILE,
        PURGED_FILE,
        SNAPSHOT_FILE,
        AUDIT_FILE,
        crate::network::CLUSTER_ID_FILE,
        // Names a checkpoint entry of the old log by index (docs/adr/0024).
        crate::lease_clock::LEASE_CLOCK_FILE,
    ]
    .iter()
    .filter(|f| data_dir.join(f).exists())
    .map(|f| (*f).to_string())
    .collect();
    let belongs = existing
        .iter()
        .any(|f| f == LOG_FILE || f == VOTE_FILE || f == SNAPSHOT_FILE);
    let mut report = RestoreReport {
        meta: snap.meta.clone(),
        cluster_id: cluster_id.clone(),
        floor,
        backup_head,
        moved_aside: existing.clone(),
        aside_dir: None,
    };
    if belongs && !opts.force_new_cluster {
        return Err(FileError::Busy {
            path: data_dir.to_path_buf(),
            what: format!(
                "holds a Raft vote/log/snapshot ({}): it belongs to a cluster. Restoring starts \
                 a NEW cluster from the backup ({} at revision {}, log index {}): those files \
                 are moved to pre-restore-<id>/, the log and vote start fresh, and every \
                 revision and generation issued afterwards is above {floor}. Stop every \
                 replica of the region and pass --force-new-cluster to do it",
                existing.join(", "),
                snap.meta.snapshot_id,
                backup_head.0,
                backup_head.1
            ),
        });
    }
    if let Some(id) = opts.single_voter {
        if single_voter_membership(&snap.meta, id).is_none() {
            return Err(FileError::Busy {
                path: file.to_path_buf(),
                what: format!("--single-voter {id}: not a replica of the backup's membership"),
            });
        }
    }
    state
        .raise_floor(floor, cluster_id.clone())
        .map_err(|e| FileError::Corrupt {
            path: file.to_path_buf(),
            what: e.to_string(),
        })?;
    // The term the new incarnation starts above: never below the old vote (if readable).
    let vote_path = data_dir.join(VOTE_FILE);
    let old_term = files::read_framed(&vote_path)
        .ok()
        .flatten()
        .and_then(|b| dec::<Vote>(&vote_path, &b).ok())
        .map_or(0, |v| v.leader_id().term);
    let term = old_term.max(snap.meta.last_log_id.map_or(0, |l| l.leader_id.term));
    if !existing.is_empty() {
        let aside = data_dir.join(format!("pre-restore-{cluster_id}"));
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&aside)
            .map_err(|e| FileError::io(&aside, e))?;
        for f in &existing {
            let to = aside.join(f);
            fs::rename(data_dir.join(f), &to).map_err(|e| FileError::io(&to, e))?;
        }
        files::sync_dir(&aside.join("x"))?;
        report.aside_dir = Some(aside);
    }
    let last_membership = match opts.single_voter {
        None => snap.meta.last_membership.clone(),
        Some(id) => single_voter_membership(&snap.meta, id).ok_or_else(|| FileError::Busy {
            path: file.to_path_buf(),
            what: format!(
                "--single-voter {id}: not a replica of the backup's membership ({:?})",
                snap.meta
                    .last_membership
                    .membership()
                    .nodes()
                    .map(|(i, n)| format!("{i}={}", n.node))
                    .collect::<Vec<_>>()
            ),
        })?,
    };
    let restored = StoredSnapshot {
        meta: SnapshotMeta {
            last_log_id: snap.meta.last_log_id,
            last_membership,
            snapshot_id: format!("restored-{cluster_id}-{last_index}"),
        },
        data: state.encode(),
    };
    restored.write(&data_dir.join(SNAPSHOT_FILE))?;
    if let Some(last) = snap.meta.last_log_id {
        files::write_atomic(&data_dir.join(PURGED_FILE), &enc(&last))?;
    }
    files::write_atomic(&vote_path, &enc(&Vote::new(term, 0)))?;
    files::write_plain_atomic(
        &data_dir.join(crate::network::CLUSTER_ID_FILE),
        cluster_id.as_bytes(),
    )?;
    let audit = data_dir.join(AUDIT_FILE);
    let header = serde_json::json!({
        "restored": {
            "cluster_id": cluster_id,
            "floor": floor,
            "from_snapshot": snap.meta.snapshot_id,
            "from_log_index": last_index,
        }
    });
    files::write_plain_atomic(&audit, format!("{header}\n").as_bytes())?;
    Ok(report)
}

/// The backup's membership reduced to replica `id` as the only voter (its addresses as the
/// backup recorded them); `None` if `id` is not a node of it.
fn single_voter_membership(
    meta: &SnapshotMeta,
    id: crate::types::RaftId,
) -> Option<crate::types::StoredMembership> {
    let node = meta.last_membership.membership().get_node(&id)?.clone();
    let m = openraft::Membership::new(
        vec![std::collections::BTreeSet::from([id])],
        std::collections::BTreeMap::from([(id, node)]),
    );
    Some(crate::types::StoredMembership::new(
        *meta.last_membership.log_id(),
        m,
    ))
}
