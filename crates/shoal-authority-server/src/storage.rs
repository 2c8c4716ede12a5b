//! File-backed Raft storage: the log + vote ([`LogStore`]) and the state machine + snapshots
//! ([`StateMachineStore`]), implementing openraft 0.9's v2 storage traits.
//!
//! # Layout of a replica's data directory
//! | file | content | written |
//! |---|---|---|
//! | `raft.log` | log records `len u32 | crc32 u32 | postcard(Entry)` | appended, fsync'd before Raft is told the entries are durable |
//! | `vote.bin` | framed postcard(`Vote`) | atomically (temp + fsync + rename + dir fsync) before `save_vote` returns |
//! | `purged.bin` | framed postcard(`LogId`) of the last purged entry | atomically, before entries are dropped |
//! | `snapshot.bin` | framed postcard([`StoredSnapshot`]) | atomically, whenever a snapshot is built or installed |
//! | `audit.log` | one JSON [`shoal_authority::AuditEntry`] per line | appended as entries are applied ([`crate::audit_file`]: a failed append is kept in memory and written later, never silently dropped) |
//!
//! The state machine itself is not persisted on every apply: it is rebuilt at start from
//! `snapshot.bin`, and openraft re-applies the committed log after it. Re-applying is exact
//! because applying is deterministic (log index and proposal time come from the entry, ed25519
//! signing is deterministic).
//!
//! # Damage
//! A torn tail of `raft.log` (a final record cut short: an append that crashed before its fsync
//! and was therefore never acknowledged) is truncated at start with a warning. Every other
//! damage, a checksum failure anywhere, a framed file that is torn, a log with holes, is
//! refused with a clear [`FileError::Corrupt`] and the replica does not start.
//!
//! # Compaction
//! Openraft builds a snapshot every `snapshot_every_logs` entries and then purges the log up to
//! it (keeping `keep_logs_after_snapshot`). Purged records are dropped from memory at once;
//! `raft.log` is rewritten (temp + rename) once it holds [`REWRITE_AFTER_PURGED`] dead records.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{Cursor, Write};
use std::ops::RangeBounds;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, EntryPayload, LogState, RaftLogReader, RaftSnapshotBuilder, Snapshot, StorageIOError,
};
use serde::{Deserialize, Serialize};
use shoal_authority::{ApplyContext, AuditEntry, AuthorityState};
use shoal_proto::{Region, SignedLifecycle, SigningKey};
use tokio::sync::mpsc;

use crate::audit_file::AuditFile;
use crate::files::{self, FileError};
use crate::host_clock::{HostClock, HostInstant, WallClock};
use crate::lease_clock::LeaseClock;
use crate::types::{
    ApplyOutcome, Entry, LogId, Member, RaftId, SnapshotMeta, StorageError, StoredMembership,
    TypeConfig, Vote,
};

/// `raft.log` is rewritten without purged records once it holds this many of them.
pub const REWRITE_AFTER_PURGED: u64 = 1_000;

pub(crate) const LOG_FILE: &str = "raft.log";
pub(crate) const VOTE_FILE: &str = "vote.bin";
pub(crate) const PURGED_FILE: &str = "purged.bin";
/// File name of the persisted snapshot inside a data directory.
pub const SNAPSHOT_FILE: &str = "snapshot.bin";
/// File name of the JSON-lines audit log inside a data directory.
pub const AUDIT_FILE: &str = "audit.log";

pub(crate) fn enc<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("plain data always serialises")
}

pub(crate) fn dec<T: for<'a> Deserialize<'a>>(path: &Path, bytes: &[u8]) -> Result<T, FileError> {
    postcard::from_bytes(bytes).map_err(|e| FileError::Codec {
        path: path.to_path_buf(),
        what: e.to_string(),
    })
}

fn io_err(e: &FileError) -> AnyError {
    AnyError::new(e)
}

// ---- log store ---------------------------------------------------------------------------

struct LogInner {
    path: PathBuf,
    dir: PathBuf,
    file: File,
    /// Entries in memory by index, with the offset of their record in `raft.log`.
    entries: BTreeMap<u64, (Entry, u64)>,
    end_offset: u64,
    dead_records: u64,
    vote: Option<Vote>,
    last_purged: Option<LogId>,
}

/// The Raft log and vote, in `raft.log`, `vote.bin` and `purged.bin`. Cloning shares the same
/// log (the clone is the log reader handed to replication tasks).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`.
    ///
    /// # Errors
    /// [`FileError::Corrupt`] for a damaged vote, purge mark or log record, or a log with a
    /// hole; [`FileError::Io`] when the directory cannot be read or written.
    pub fn open(dir: &Path) -> Result<Self, FileError> {
        shoal_transport::keyfile::ensure_private_dir(dir)
            .map_err(|e| FileError::io(dir, e.into()))?;
        let vote_path = dir.join(VOTE_FILE);
        let vote = files::read_framed(&vote_path)?
            .map(|b| decode_vote(&vote_path, &b))
            .transpose()?;
        let purged_path = dir.join(PURGED_FILE);
        let last_purged = files::read_framed(&purged_path)?
            .map(|b| decode_log_id(&purged_path, &b))
            .transpose()?;
        let path = dir.join(LOG_FILE);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(FileError::io(&path, e)),
        };
        let floor = last_purged.map(|l| l.index);
        let ParsedLog {
            entries,
            dead_records,
            valid_len,
        } = parse_log(&path, &bytes, floor)?;
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600) // every command: service keys, addresses, callers' executables
            .open(&path)
            .map_err(|e| FileError::io(&path, e))?;
        if valid_len < bytes.len() as u64 {
            tracing::warn!(
                path = %path.display(),
                cut_bytes = bytes.len() as u64 - valid_len,
                "truncating the torn tail of the raft log (an append that never completed)"
            );
            file.set_len(valid_len)
                .map_err(|e| FileError::io(&path, e))?;
            file.sync_all().map_err(|e| FileError::io(&path, e))?;
        }
        Ok(Self {
            inner: Arc::new(Mutex::new(LogInner {
                path,
                dir: dir.to_path_buf(),
                file,
                entries,
                end_offset: valid_len,
                dead_records,
                vote,
                last_purged,
            })),
        })
    }

    /// Index of the last entry in the log (or the last purged one), if any.
    pub fn last_index(&self) -> Option<u64> {
        let g = self.inner.lock().expect("log lock");
        g.entries
            .keys()
            .next_back()
            .copied()
            .or(g.last_purged.map(|l| l.index))
    }

    /// The persisted vote.
    pub fn vote(&self) -> Option<Vote> {
        self.inner.lock().expect("log lock").vote
    }
}

/// The records of a `raft.log` file, as [`parse_log`] found them.
#[derive(Debug)]
pub struct ParsedLog {
    /// Live entries by index, with the offset of their record.
    pub entries: BTreeMap<u64, (Entry, u64)>,
    /// Records at or below the purge floor (dropped).
    pub dead_records: u64,
    /// Offset just past the last complete record; anything beyond is a torn tail.
    pub valid_len: u64,
}

/// Parses the bytes of a `raft.log` file: framing and checksums ([`files::scan_records`]),
/// each record's entry, no duplicate index, no hole above `floor` (the last purged index).
///
/// # Errors
/// [`FileError::Corrupt`] or [`FileError::Codec`] naming `path`; never panics on any bytes.
pub fn parse_log(path: &Path, bytes: &[u8], floor: Option<u64>) -> Result<ParsedLog, FileError> {
    let scanned = files::scan_records(path, bytes)?;
    let mut entries = BTreeMap::new();
    let mut dead_records = 0;
    for (offset, payload) in &scanned.records {
        let entry: Entry = dec(path, payload)?;
        if floor.is_some_and(|f| entry.log_id.index <= f) {
            dead_records += 1;
            continue;
        }
        // A later record for an index replaces a truncated one only if truncation was not
        // persisted; truncation always cuts the file, so a repeat is damage.
        if entries
            .insert(entry.log_id.index, (entry, *offset))
            .is_some()
        {
            return Err(FileError::Corrupt {
                path: path.to_path_buf(),
                what: format!("duplicate log record at offset {offset}"),
            });
        }
    }
    check_contiguous(path, &entries, floor)?;
    Ok(ParsedLog {
        entries,
        dead_records,
        valid_len: scanned.valid_len,
    })
}

/// Decodes the payload of `vote.bin` (after [`files::unframe`]).
///
/// # Errors
/// [`FileError::Codec`] naming `path`.
pub fn decode_vote(path: &Path, payload: &[u8]) -> Result<Vote, FileError> {
    dec(path, payload)
}

/// Decodes the payload of `purged.bin` (after [`files::unframe`]).
///
/// # Errors
/// [`FileError::Codec`] naming `path`.
pub fn decode_log_id(path: &Path, payload: &[u8]) -> Result<LogId, FileError> {
    dec(path, payload)
}

fn check_contiguous(
    path: &Path,
    entries: &BTreeMap<u64, (Entry, u64)>,
    floor: Option<u64>,
) -> Result<(), FileError> {
    let mut expect = floor.map(|f| f + 1);
    for idx in entries.keys() {
        if let Some(e) = expect {
            if *idx != e {
                return Err(FileError::Corrupt {
                    path: path.to_path_buf(),
                    what: format!("hole in the log: expected index {e}, found {idx}"),
                });
            }
        }
        expect = Some(idx + 1);
    }
    Ok(())
}

impl LogInner {
    fn rewrite(&mut self) -> Result<(), FileError> {
        let tmp = self.path.with_extension("log.tmp");
        let mut buf = Vec::new();
        let mut offsets = Vec::with_capacity(self.entries.len());
        for (idx, (entry, _)) in &self.entries {
            offsets.push((*idx, buf.len() as u64));
            files::push_record(&mut buf, &enc(entry));
        }
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| FileError::io(&tmp, e))?;
        f.write_all(&buf).map_err(|e| FileError::io(&tmp, e))?;
        f.sync_all().map_err(|e| FileError::io(&tmp, e))?;
        drop(f);
        fs::rename(&tmp, &self.path).map_err(|e| FileError::io(&self.path, e))?;
        files::sync_dir(&self.path)?;
        self.file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| FileError::io(&self.path, e))?;
        for (idx, off) in offsets {
            if let Some(slot) = self.entries.get_mut(&idx) {
                slot.1 = off;
            }
        }
        self.end_offset = buf.len() as u64;
        self.dead_records = 0;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let g = self.inner.lock().expect("log lock");
        Ok(g.entries
            .range(range)
            .map(|(_, (e, _))| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let g = self.inner.lock().expect("log lock");
        let last = g.entries.values().next_back().map(|(e, _)| e.log_id);
        Ok(LogState {
            last_purged_log_id: g.last_purged,
            last_log_id: last.or(g.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let mut g = self.inner.lock().expect("log lock");
        let path = g.dir.join(VOTE_FILE);
        files::write_atomic(&path, &enc(vote))
            .map_err(|e| StorageIOError::write_vote(io_err(&e)))?;
        g.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.inner.lock().expect("log lock").vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut g = self.inner.lock().expect("log lock");
        let mut buf = Vec::new();
        let mut added = Vec::new();
        for entry in entries {
            let at = g.end_offset + buf.len() as u64;
            files::push_record(&mut buf, &enc(&entry));
            added.push((entry, at));
        }
        let res = g.file.write_all(&buf).and_then(|_| g.file.sync_data());
        if let Err(e) = res {
            let fe = FileError::io(&g.path, e);
            let err = StorageIOError::write_logs(io_err(&fe));
            callback.log_io_completed(Err(std::io::Error::other(fe.to_string())));
            return Err(err.into());
        }
        g.end_offset += buf.len() as u64;
        for (entry, at) in added {
            g.entries.insert(entry.log_id.index, (entry, at));
        }
        drop(g);
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut g = self.inner.lock().expect("log lock");
        let Some(offset) = g.entries.get(&log_id.index).map(|(_, off)| *off) else {
            return Ok(());
        };
        g.file
            .set_len(offset)
            .and_then(|_| g.file.sync_all())
            .map_err(|e| StorageIOError::write_logs(io_err(&FileError::io(&g.path, e))))?;
        g.end_offset = offset;
        g.entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut g = self.inner.lock().expect("log lock");
        let path = g.dir.join(PURGED_FILE);
        files::write_atomic(&path, &enc(&log_id))
            .map_err(|e| StorageIOError::write_logs(io_err(&e)))?;
        g.last_purged = Some(log_id);
        let keep = g.entries.split_off(&(log_id.index + 1));
        let dropped = std::mem::replace(&mut g.entries, keep).len() as u64;
        g.dead_records += dropped;
        if g.dead_records >= REWRITE_AFTER_PURGED {
            g.rewrite()
                .map_err(|e| StorageIOError::write_logs(io_err(&e)))?;
        }
        Ok(())
    }
}

// ---- state machine -------------------------------------------------------------------------

/// What `snapshot.bin` holds: the Raft metadata and the `AuthorityState::encode` bytes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoredSnapshot {
    /// Last log id included, membership, snapshot id.
    pub meta: SnapshotMeta,
    /// `AuthorityState::encode()` of the state at `meta.last_log_id`.
    pub data: Vec<u8>,
}

impl StoredSnapshot {
    /// Reads and verifies a snapshot file (framing checksum, then the state's own invariants).
    ///
    /// # Errors
    /// [`FileError::Corrupt`] for a torn or damaged file or a state that fails its checks;
    /// `Ok(None)` when the file does not exist.
    pub fn read(path: &Path) -> Result<Option<(Self, AuthorityState)>, FileError> {
        let Some(bytes) = files::read_framed(path)? else {
            return Ok(None);
        };
        Self::decode(path, &bytes).map(Some)
    }

    /// Decodes and checks the payload of a snapshot file (after [`files::unframe`]): the
    /// snapshot, then the state's own invariants.
    ///
    /// # Errors
    /// [`FileError::Codec`] or [`FileError::Corrupt`] naming `path`; never panics on any bytes.
    pub fn decode(path: &Path, payload: &[u8]) -> Result<(Self, AuthorityState), FileError> {
        let snap: Self = dec(path, payload)?;
        let state = AuthorityState::decode(&snap.data).map_err(|e| FileError::Corrupt {
            path: path.to_path_buf(),
            what: format!("snapshot state: {e}"),
        })?;
        Ok((snap, state))
    }

    /// Writes the snapshot atomically.
    ///
    /// # Errors
    /// [`FileError::Io`]; the previous file is untouched then.
    pub fn write(&self, path: &Path) -> Result<(), FileError> {
        files::write_atomic(path, &enc(self))
    }
}

/// One applied entry's effects, for the server: signed records to publish, audit entries.
#[derive(Clone, Debug)]
pub struct Applied {
    /// Log index of the entry.
    pub log_index: u64,
    /// Records it emitted (publish them into the mesh).
    pub records: Vec<SignedLifecycle>,
}

struct SmInner {
    dir: PathBuf,
    state: AuthorityState,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    snapshot: Option<StoredSnapshot>,
    signing_key: SigningKey,
    audit: AuditFile,
    /// The highest log index handed to `audit` (written, waiting in its backlog, or named by
    /// a gap line): each index is audited once.
    audit_high_water: u64,
    applied_tx: Option<mpsc::Sender<Applied>>,
    applied_dropped: u64,
    /// The latest lease checkpoint this replica applied, and when (see
    /// [`StateMachineStore::lease_credit`]).
    checkpoint_applied: CheckpointSeen,
    /// When this host first applied the latest checkpoint entry, kept across restarts.
    lease_clock: LeaseClock,
}

/// The latest lease checkpoint a replica applied, and the clocks a new leader measures the
/// time since it on (docs/adr/0008-lease-checkpoints.md, docs/adr/0024).
#[derive(Clone, Debug)]
struct CheckpointSeen {
    /// The state's lease checkpoint counter.
    checkpoint: u64,
    /// When this process applied it (or loaded it: later than the real apply, so credits
    /// measured from it are never too large).
    at: std::time::Instant,
    /// The checkpoint entry's proposal wall time (Unix ms; 0 when unknown: a checkpoint that
    /// came in a snapshot this host has no record of).
    proposed_wall_ms: u64,
    /// Wall-clock ms from the proposal to `at` (0 when unknown).
    lag_ms: u64,
    /// When this host first applied the entry, possibly in an earlier process of this
    /// replica, and the wall-clock lag from the proposal to then; `None` when unknown (no
    /// host clock, a snapshot this host has no record of).
    host: Option<(HostInstant, u64)>,
}

impl CheckpointSeen {
    /// Checkpoint `checkpoint` as found in a state loaded from a snapshot up to
    /// `upto_index` (open, install): known to the host clock only if this host recorded
    /// applying it.
    fn loaded(checkpoint: u64, upto_index: u64, clock: &LeaseClock) -> Self {
        let rec = clock.covered(checkpoint, upto_index);
        Self {
            checkpoint,
            at: std::time::Instant::now(),
            proposed_wall_ms: rec.map_or(0, |r| r.proposed_wall_ms),
            lag_ms: 0,
            host: rec.map(|r| (r.applied.clone(), r.lag_ms)),
        }
    }
}

/// The authority state machine: [`AuthorityState`] driven by committed entries, plus the
/// persisted snapshot. Cloning shares it (the server reads status and policies from a clone).
#[derive(Clone)]
pub struct StateMachineStore {
    inner: Arc<Mutex<SmInner>>,
}

impl StateMachineStore {
    /// Opens the state machine in `dir`: loads `snapshot.bin` if present, else starts empty for
    /// `region`.
    ///
    /// `applied_tx` receives each applied entry's records (bounded; overflow counted, the mesh
    /// repairs by anti-entropy).
    ///
    /// # Errors
    /// [`FileError::Corrupt`] for a damaged snapshot; [`FileError::Io`].
    pub fn open(
        dir: &Path,
        region: Region,
        signing_key: SigningKey,
        applied_tx: Option<mpsc::Sender<Applied>>,
    ) -> Result<Self, FileError> {
        let clocks = (
            HostInstant::now as HostClock,
            crate::server::wall_ms as WallClock,
        );
        Self::open_with_clocks(dir, region, signing_key, applied_tx, clocks)
    }

    /// [`StateMachineStore::open`] with the host and wall clocks lease credits are measured
    /// on (tests pass fixed ones).
    fn open_with_clocks(
        dir: &Path,
        region: Region,
        signing_key: SigningKey,
        applied_tx: Option<mpsc::Sender<Applied>>,
        (host_clock, wall_clock): (HostClock, WallClock),
    ) -> Result<Self, FileError> {
        shoal_transport::keyfile::ensure_private_dir(dir)
            .map_err(|e| FileError::io(dir, e.into()))?;
        let (snapshot, state) = match StoredSnapshot::read(&dir.join(SNAPSHOT_FILE))? {
            Some((snap, state)) => (Some(snap), state),
            None => (None, AuthorityState::new(region.clone())),
        };
        if state.region() != &region {
            return Err(FileError::Corrupt {
                path: dir.join(SNAPSHOT_FILE),
                what: format!("snapshot is for region {}, not {region}", state.region()),
            });
        }
        let (audit, audit_high_water) = AuditFile::open(&dir.join(AUDIT_FILE))?;
        let checkpoint = state.lease_checkpoint();
        let lease_clock = LeaseClock::open(dir, host_clock, wall_clock);
        let (last_applied, last_membership) = match &snapshot {
            Some(s) => (s.meta.last_log_id, s.meta.last_membership.clone()),
            None => (None, StoredMembership::default()),
        };
        let mut inner = SmInner {
            dir: dir.to_path_buf(),
            state,
            last_applied,
            last_membership,
            snapshot,
            signing_key,
            audit,
            audit_high_water,
            applied_tx,
            applied_dropped: 0,
            checkpoint_applied: CheckpointSeen::loaded(
                checkpoint,
                last_applied.map_or(0, |l| l.index),
                &lease_clock,
            ),
            lease_clock,
        };
        // The snapshot may cover entries this replica never wrote to audit.log (appends that
        // failed, then a snapshot and a restart): openraft re-applies only the log above the
        // snapshot, so they come from the snapshot's audit ring (or an `audit_gap` line).
        // An empty audit.log (new, or moved away by an operator) starts at the snapshot.
        if let Some(upto) = last_applied.map(|l| l.index) {
            if !inner.audit.is_empty() {
                inner.audit_snapshot_entries(upto);
            }
        }
        Ok(Self {
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    /// Appends one RPC-layer line (`rpc_rejected`, `membership_change`) to `audit.log`, behind
    /// any applied entries still waiting to be written.
    pub fn audit_line(&self, line: &serde_json::Value) {
        let mut g = self.inner.lock().expect("sm lock");
        g.audit.append(format!("{line}\n"), None);
    }

    /// Retries writing the audit lines kept in memory after failed appends (the replica calls
    /// this periodically, so a backlog is written even when no new entry is applied).
    pub fn retry_audit(&self) {
        self.inner.lock().expect("sm lock").audit.retry();
    }

    /// Audit lines waiting in memory (appends to `audit.log` failed).
    pub fn audit_backlog_lines(&self) -> usize {
        self.inner.lock().expect("sm lock").audit.backlog_lines()
    }

    /// Points the audit writer at another file (tests: `/dev/full` for a full disk).
    #[cfg(test)]
    fn redirect_audit(&self, file: File) {
        self.inner.lock().expect("sm lock").audit.redirect(file);
    }

    /// Runs `f` on the current state (read-only).
    pub fn with_state<R>(&self, f: impl FnOnce(&AuthorityState) -> R) -> R {
        f(&self.inner.lock().expect("sm lock").state)
    }

    /// Applied entries whose effects could not be queued for publishing.
    pub fn applied_dropped(&self) -> u64 {
        self.inner.lock().expect("sm lock").applied_dropped
    }

    /// The cluster incarnation id of the applied state (`None`: never restored) and whether
    /// the state machine is pristine (nothing applied, no snapshot).
    pub fn cluster_tag(&self) -> (Option<String>, bool) {
        let g = self.inner.lock().expect("sm lock");
        let id = g.state.incarnation().map(|i| i.cluster_id.clone());
        (id, g.last_applied.is_none() && g.snapshot.is_none())
    }

    /// The latest lease checkpoint this replica applied and how long ago (what a new leader
    /// credits in its `LeaderTakeover`, docs/adr/0008-lease-checkpoints.md).
    ///
    /// The elapsed time is the largest of
    /// (a) this process's monotonic time since it applied the checkpoint;
    /// (b) the host's monotonic time since this replica's host first applied it, possibly in
    /// an earlier process of this replica (docs/adr/0024): a process restarted since the
    /// checkpoint, which (a) measures only from its replay of the log, still measures the
    /// whole time;
    /// (c) the wall-clock time since the checkpoint was *proposed*.
    /// Wall-clock times (all of (c), and in (a) and (b) the lag from the proposal to the apply
    /// they start at, which a replica catching up has) count less `skew_ms` (the clock skew
    /// assumed between replicas) and at most `cap_ms` (what a forward wall-clock step may
    /// cost). So each measure starts at the proposal and none exceeds the real time since.
    /// `now_wall_ms` is Unix ms.
    pub fn lease_credit(
        &self,
        now_wall_ms: u64,
        skew_ms: u64,
        cap_ms: u64,
    ) -> shoal_authority::LeaseCredit {
        let g = self.inner.lock().expect("sm lock");
        let seen = &g.checkpoint_applied;
        let by_wall = |ms: u64| {
            if seen.proposed_wall_ms == 0 {
                0
            } else {
                ms.saturating_sub(skew_ms).min(cap_ms)
            }
        };
        let mono = (seen.at.elapsed().as_millis() as u64).saturating_add(by_wall(seen.lag_ms));
        let host = seen
            .host
            .as_ref()
            .and_then(|(first, lag)| {
                let since = g.lease_clock.now()?.ms_since(first)?;
                Some(since.saturating_add(by_wall(*lag)))
            })
            .unwrap_or(0);
        let wall = by_wall(now_wall_ms.saturating_sub(seen.proposed_wall_ms));
        shoal_authority::LeaseCredit {
            checkpoint: seen.checkpoint,
            elapsed_ms: mono.max(host).max(wall),
        }
    }

    /// The last applied log id.
    pub fn last_applied(&self) -> Option<LogId> {
        self.inner.lock().expect("sm lock").last_applied
    }
}

impl SmInner {
    fn apply_entry(&mut self, entry: Entry) -> ApplyOutcome {
        self.last_applied = Some(entry.log_id);
        let proposal = match entry.payload {
            EntryPayload::Blank => return Ok(Vec::new()),
            EntryPayload::Membership(m) => {
                self.audit_membership(entry.log_id.index, &m);
                self.last_membership = StoredMembership::new(Some(entry.log_id), m);
                return Ok(Vec::new());
            }
            EntryPayload::Normal(p) => p,
        };
        let before = self.state.audit().total();
        let ctx = ApplyContext {
            log_index: entry.log_id.index,
            committed_at_ms: proposal.proposed_at_ms,
            signing_key: &self.signing_key,
        };
        let out = self
            .state
            .apply_on_behalf(proposal.cmd, ctx, proposal.on_behalf_of);
        self.note_checkpoint(entry.log_id.index, proposal.proposed_at_ms);
        self.write_audit(before, entry.log_id.index);
        if let Ok(records) = &out {
            self.publish(entry.log_id.index, records);
        }
        out
    }

    /// One `{"membership": {log_index, voters, learners, joint}}` audit line per membership
    /// entry (each log index once, like commands; docs/adr/0009-authority-membership-change.md).
    fn audit_membership(&mut self, log_index: u64, m: &openraft::Membership<RaftId, Member>) {
        if log_index <= self.audit_high_water {
            return;
        }
        self.audit_high_water = log_index;
        let line = serde_json::json!({
            "membership": {
                "log_index": log_index,
                "voters": m.voter_ids().collect::<Vec<_>>(),
                "learners": m.learner_ids().collect::<Vec<_>>(),
                "joint": m.get_joint_config().len() > 1,
            }
        });
        self.audit
            .append(format!("{line}\n"), Some((log_index, log_index)));
    }

    /// Notes a new checkpoint counter after applying entry `log_index` (proposed at
    /// `proposed_wall_ms`).
    fn note_checkpoint(&mut self, log_index: u64, proposed_wall_ms: u64) {
        let cp = self.state.lease_checkpoint();
        if cp != self.checkpoint_applied.checkpoint {
            self.checkpoint_applied = CheckpointSeen {
                checkpoint: cp,
                at: std::time::Instant::now(),
                proposed_wall_ms,
                lag_ms: self.lease_clock.lag_ms(proposed_wall_ms),
                host: self.lease_clock.applied(cp, log_index, proposed_wall_ms),
            };
        }
    }

    fn write_audit(&mut self, total_before: u64, log_index: u64) {
        if log_index <= self.audit_high_water {
            return;
        }
        self.audit_high_water = log_index;
        let new = (self.state.audit().total() - total_before) as usize;
        let entries: Vec<&AuditEntry> = self.state.audit().entries().rev().take(new).collect();
        let mut buf = String::new();
        for e in entries.into_iter().rev() {
            buf.push_str(&serde_json::to_string(e).expect("audit entries serialise"));
            buf.push('\n');
        }
        self.audit.append(buf, Some((log_index, log_index)));
    }

    /// After installing a snapshot up to `upto`: appends the audit entries of the installed
    /// state's ring that this replica's `audit.log` lacks (log indexes above its high water),
    /// so every committed command is audited exactly once here even though this replica never
    /// applied them. If the ring no longer reaches back that far, one `audit_gap` line names
    /// the missing range instead of silently skipping it.
    fn audit_snapshot_entries(&mut self, upto: u64) {
        let from = self.audit_high_water;
        if upto <= from {
            return;
        }
        let mut buf = String::new();
        let missing: Vec<&AuditEntry> = self
            .state
            .audit()
            .entries()
            .filter(|e| e.log_index > from && e.log_index <= upto)
            .collect();
        let ring = self.state.audit();
        let truncated = ring.total() > ring.len() as u64;
        if let Some(oldest) = ring.entries().next().map(|e| e.log_index) {
            if truncated && oldest > from + 1 {
                let gap = serde_json::json!({
                    "audit_gap": {"after_index": from, "before_index": oldest,
                                  "first_index": from + 1, "last_index": oldest - 1,
                                  "reason": "the snapshot's audit ring no longer holds them"}
                });
                buf.push_str(&format!("{gap}\n"));
                metrics::counter!("shoal_authority_audit_gaps_total").increment(1);
            }
        }
        for e in missing {
            buf.push_str(&serde_json::to_string(e).expect("audit entries serialise"));
            buf.push('\n');
        }
        self.audit_high_water = upto;
        self.audit.append(buf, Some((from + 1, upto)));
    }

    fn publish(&mut self, log_index: u64, records: &[SignedLifecycle]) {
        if records.is_empty() {
            return;
        }
        let Some(tx) = &self.applied_tx else {
            return;
        };
        let applied = Applied {
            log_index,
            records: records.to_vec(),
        };
        if tx.try_send(applied).is_err() {
            self.applied_dropped += 1;
        }
    }

    fn build_snapshot(&mut self) -> Result<StoredSnapshot, FileError> {
        let data = self.state.encode();
        let last = self.last_applied;
        let snapshot_id = match last {
            Some(l) => format!("{}-{}", l.leader_id.term, l.index),
            None => "empty".to_string(),
        };
        let snap = StoredSnapshot {
            meta: SnapshotMeta {
                last_log_id: last,
                last_membership: self.last_membership.clone(),
                snapshot_id,
            },
            data,
        };
        snap.write(&self.dir.join(SNAPSHOT_FILE))?;
        self.snapshot = Some(snap.clone());
        Ok(snap)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let mut g = self.inner.lock().expect("sm lock");
        let snap = g
            .build_snapshot()
            .map_err(|e| StorageIOError::write_snapshot(None, io_err(&e)))?;
        tracing::info!(snapshot = %snap.meta, bytes = snap.data.len(), "snapshot built");
        Ok(Snapshot {
            meta: snap.meta,
            snapshot: Box::new(Cursor::new(snap.data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let g = self.inner.lock().expect("sm lock");
        Ok((g.last_applied, g.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyOutcome>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut g = self.inner.lock().expect("sm lock");
        let out = entries.into_iter().map(|e| g.apply_entry(e)).collect();
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let sig = Some(meta.signature());
        let state = AuthorityState::decode(&data)
            .map_err(|e| StorageIOError::read_snapshot(sig.clone(), AnyError::new(&e)))?;
        let mut g = self.inner.lock().expect("sm lock");
        if state.region() != g.state.region() {
            let e = FileError::Corrupt {
                path: g.dir.join(SNAPSHOT_FILE),
                what: format!("received snapshot for region {}", state.region()),
            };
            return Err(StorageIOError::read_snapshot(sig, io_err(&e)).into());
        }
        let snap = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        snap.write(&g.dir.join(SNAPSHOT_FILE))
            .map_err(|e| StorageIOError::write_snapshot(sig, io_err(&e)))?;
        g.state = state;
        g.last_applied = meta.last_log_id;
        g.last_membership = meta.last_membership.clone();
        let upto = meta.last_log_id.map_or(0, |l| l.index);
        g.audit_snapshot_entries(upto);
        if g.state.lease_checkpoint() != g.checkpoint_applied.checkpoint {
            g.checkpoint_applied =
                CheckpointSeen::loaded(g.state.lease_checkpoint(), upto, &g.lease_clock);
        }
        g.snapshot = Some(snap);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let g = self.inner.lock().expect("sm lock");
        Ok(g.snapshot.as_ref().map(|s| Snapshot {
            meta: s.meta.clone(),
            snapshot: Box::new(Cursor::new(s.data.clone())),
        }))
    }
}

pub use crate::backup::{
    lock_data_dir, restore_snapshot, save_snapshot, DirLock, RestoreOptions, RestoreReport,
    DEFAULT_RESTORE_MARGIN, LOCK_FILE, SNAPSHOT_REQUEST_FILE,
};

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    }

    /// The Raft log holds every command (service keys, addresses, callers' executables): the
    /// data directory is created 0700 and every file in it 0600, whatever the umask allows.
    #[test]
    fn the_data_dir_and_every_file_the_log_writes_are_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("new/data");
        let lock = lock_data_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700, "data dir");
        assert_eq!(mode(&dir.join(LOCK_FILE)), 0o600, "{LOCK_FILE}");
        let log = LogStore::open(&dir).unwrap();
        assert_eq!(mode(&dir.join(LOG_FILE)), 0o600, "{LOG_FILE} at open");
        // Compaction rewrites the log through a temp file: the new file is private too.
        fs::remove_file(dir.join(LOG_FILE)).unwrap();
        log.inner.lock().unwrap().rewrite().unwrap();
        assert_eq!(
            mode(&dir.join(LOG_FILE)),
            0o600,
            "{LOG_FILE} after a rewrite"
        );
        // Snapshots (built, installed, restored) go through the same atomic writer.
        let snap = StoredSnapshot {
            meta: SnapshotMeta::default(),
            data: vec![1, 2, 3],
        };
        snap.write(&dir.join(SNAPSHOT_FILE)).unwrap();
        assert_eq!(mode(&dir.join(SNAPSHOT_FILE)), 0o600, "{SNAPSHOT_FILE}");
        drop(lock);
    }

    fn takeover(index: u64) -> Entry {
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(crate::types::Proposal {
                cmd: shoal_authority::AuthorityCommand::LeaderTakeover {
                    now_ms: index,
                    credit: None,
                },
                proposed_at_ms: 1_000 + index,
                on_behalf_of: None,
            }),
        }
    }

    fn audited(dir: &Path) -> Vec<u64> {
        fs::read_to_string(dir.join(AUDIT_FILE))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<AuditEntry>(l).ok())
            .map(|e| e.log_index)
            .collect()
    }

    fn dev_full() -> File {
        OpenOptions::new().write(true).open("/dev/full").unwrap()
    }

    /// QA finding B: entries applied while `audit.log` cannot be appended to (`/dev/full`
    /// answers ENOSPC like a full disk) are kept and written once appending works again; if
    /// the replica stops first (after a snapshot covering them), the restart re-derives them
    /// from the snapshot's audit ring and the log above it. Every index once, in order.
    #[tokio::test]
    async fn audit_entries_that_fail_to_append_are_written_later_or_after_a_restart() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let region: Region = "test-1".parse().unwrap();
        let key = SigningKey::from_seed([3; 32]);
        let open = || StateMachineStore::open(dir, region.clone(), key.clone(), None).unwrap();
        let append_to_audit_log = || {
            OpenOptions::new()
                .append(true)
                .open(dir.join(AUDIT_FILE))
                .unwrap()
        };
        let mut sm = open();
        sm.apply([takeover(1)]).await.unwrap();
        sm.redirect_audit(dev_full());
        sm.apply((2..=4).map(takeover)).await.unwrap();
        assert_eq!(audited(dir), [1]);
        assert_eq!(sm.audit_backlog_lines(), 3);
        sm.redirect_audit(append_to_audit_log());
        sm.retry_audit();
        assert_eq!(audited(dir), [1, 2, 3, 4]);

        // The disk fills again; a snapshot covers the unwritten entries; the process stops.
        sm.redirect_audit(dev_full());
        sm.apply((5..=7).map(takeover)).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        sm.apply([takeover(8)]).await.unwrap();
        drop(sm);
        let mut sm = open();
        assert_eq!(
            audited(dir),
            [1, 2, 3, 4, 5, 6, 7],
            "from the snapshot's ring"
        );
        // openraft re-applies the log above the snapshot, then new entries come.
        sm.apply([takeover(8), takeover(9)]).await.unwrap();
        assert_eq!(audited(dir), [1, 2, 3, 4, 5, 6, 7, 8, 9]);
        // A replay of what is already audited writes nothing twice.
        drop(sm);
        let mut sm = open();
        sm.apply((8..=9).map(takeover)).await.unwrap();
        assert_eq!(audited(dir), [1, 2, 3, 4, 5, 6, 7, 8, 9]);
    }

    /// The fixed host clock of `a_restarted_replica_credits_the_time_since_its_host_first_applied_the_checkpoint`.
    static HOST_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static HOST_BOOT: Mutex<&str> = Mutex::new("boot-a");
    static WALL_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    fn test_wall_clock() -> u64 {
        WALL_MS.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn test_host_clock() -> Option<HostInstant> {
        Some(HostInstant {
            boot: (*HOST_BOOT.lock().unwrap()).to_owned(),
            ms: HOST_MS.load(std::sync::atomic::Ordering::SeqCst),
        })
    }

    /// ADR 0024: a replica's process restarted since it applied the latest lease checkpoint
    /// credits, as a new leader, the whole time since its host first applied it, not only the
    /// time since the restart replayed the log (before: a restarted leader after a long
    /// election forgot the rest beyond the wall-clock cap, and a dead node's records expired
    /// that much later). Replaying older checkpoints keeps the record of the newest; a state
    /// loaded from a snapshot that holds the recorded checkpoint uses it too; another boot's
    /// record, or none, credits only the time since this process's replay. A replica that
    /// applies the checkpoint late (catching up) adds the wall-clock lag less the skew.
    /// Deterministic: fixed host and wall clocks (this process's own `Instant` measures
    /// milliseconds, far below them), and no wall-clock credit past the checkpoint's
    /// proposal (`now_wall_ms` is the proposal time).
    #[tokio::test]
    async fn a_restarted_replica_credits_the_time_since_its_host_first_applied_the_checkpoint() {
        use std::sync::atomic::Ordering::SeqCst;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let region: Region = "test-1".parse().unwrap();
        let key = SigningKey::from_seed([4; 32]);
        let open = || {
            StateMachineStore::open_with_clocks(
                dir,
                region.clone(),
                key.clone(),
                None,
                (test_host_clock, test_wall_clock),
            )
            .unwrap()
        };
        let credit = |sm: &StateMachineStore| sm.lease_credit(1_000 + 2, 250, 4_000);

        // Entry i is proposed at wall time 1_000 + i; replicas apply at once (no lag).
        WALL_MS.store(1_002, SeqCst);
        HOST_MS.store(100_000, SeqCst);
        let mut sm = open();
        sm.apply([takeover(1), takeover(2)]).await.unwrap();
        let cp = sm.with_state(|s| s.lease_checkpoint());
        assert_eq!(mode(&dir.join(crate::lease_clock::LEASE_CLOCK_FILE)), 0o600);
        drop(sm);

        // The process restarts 3 s later and replays its log; 4 s after that it is leader.
        HOST_MS.store(103_000, SeqCst);
        let mut sm = open();
        sm.apply([takeover(1), takeover(2)]).await.unwrap();
        HOST_MS.store(107_000, SeqCst);
        let c = credit(&sm);
        assert_eq!((c.checkpoint, c.elapsed_ms), (cp, 7_000));

        // A snapshot holding that checkpoint, then a restart with nothing to replay.
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        drop(sm);
        HOST_MS.store(109_000, SeqCst);
        let sm = open();
        assert_eq!(
            credit(&sm).elapsed_ms,
            9_000,
            "from the snapshot's checkpoint"
        );
        drop(sm);

        // A newer checkpoint is recorded at its own first apply.
        let mut sm = open();
        sm.apply([takeover(3)]).await.unwrap();
        HOST_MS.store(110_000, SeqCst);
        let c = credit(&sm);
        assert_eq!((c.checkpoint, c.elapsed_ms), (cp + 1, 1_000));
        drop(sm);

        // Another boot: the record does not compare (naively it would give 92 s); the replay
        // in this boot is the first apply it knows.
        *HOST_BOOT.lock().unwrap() = "boot-b";
        HOST_MS.store(200_000, SeqCst);
        let mut sm = open();
        sm.apply([takeover(3)]).await.unwrap();
        HOST_MS.store(201_000, SeqCst);
        assert_eq!(credit(&sm).elapsed_ms, 1_000);
        drop(sm);

        // No record at all (a data dir from before ADR 0024): the same.
        std::fs::remove_file(dir.join(crate::lease_clock::LEASE_CLOCK_FILE)).unwrap();
        HOST_MS.store(300_000, SeqCst);
        let mut sm = open();
        sm.apply([takeover(3)]).await.unwrap();
        HOST_MS.store(301_500, SeqCst);
        assert_eq!(credit(&sm).elapsed_ms, 1_500);

        // A replica catching up applies a checkpoint 1.5 s (wall clock) after its proposal:
        // that lag counts less the 250 ms skew, then the host clock runs.
        WALL_MS.store(1_004 + 1_500, SeqCst);
        sm.apply([takeover(4)]).await.unwrap();
        HOST_MS.store(304_500, SeqCst);
        let c = credit(&sm);
        assert_eq!((c.checkpoint, c.elapsed_ms), (cp + 2, 3_000 + 1_250));
    }

    /// `snapshot save --data-dir <typo>` must not create the directory (nor a lock file in it).
    #[test]
    fn saving_from_a_missing_data_dir_creates_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let typo = tmp.path().join("nonexistent");
        let out = tmp.path().join("backup.snap");
        let e = save_snapshot(&typo, &out, std::time::Duration::ZERO, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no replica data directory at"), "{e}");
        assert!(!typo.exists(), "created {}", typo.display());
        assert!(!out.exists());
        // An existing directory with no snapshot and no running replica: told to start it,
        // and still nothing is created in it (no lock file).
        fs::create_dir(&typo).unwrap();
        let e = save_snapshot(&typo, &out, std::time::Duration::ZERO, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the replica is not running"), "{e}");
        assert_eq!(fs::read_dir(&typo).unwrap().count(), 0, "nothing written");
    }

    /// `snapshot save` onto an existing backup is refused without `--force` (as `certs` and
    /// `keygen` are); the old backup is untouched. With it, the file is replaced atomically.
    #[test]
    fn saving_over_an_existing_backup_needs_force() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        fs::create_dir(&dir).unwrap();
        let state = shoal_authority::AuthorityState::new("test-1".parse().unwrap());
        let snap = StoredSnapshot {
            meta: SnapshotMeta {
                snapshot_id: "s-1".into(),
                ..SnapshotMeta::default()
            },
            data: state.encode(),
        };
        snap.write(&dir.join(SNAPSHOT_FILE)).unwrap();
        let out = tmp.path().join("backup.snap");
        let wait = std::time::Duration::ZERO;
        assert_eq!(
            save_snapshot(&dir, &out, wait, false).unwrap().snapshot_id,
            "s-1"
        );
        assert_eq!(mode(&out), 0o600);
        fs::write(&out, b"an older backup").unwrap();
        let e = save_snapshot(&dir, &out, wait, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists") && e.contains("--force"), "{e}");
        assert_eq!(fs::read(&out).unwrap(), b"an older backup", "untouched");
        let stray: Vec<_> = fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(stray.len(), 2, "no temp file left: {stray:?}");
        assert_eq!(
            save_snapshot(&dir, &out, wait, true).unwrap().snapshot_id,
            "s-1"
        );
        assert!(StoredSnapshot::read(&out).unwrap().is_some());
    }
}
