//! When this replica's host first applied the latest lease checkpoint, kept in the data
//! directory so that a restarted process still measures the time since then
//! (docs/adr/0024-lease-credit-across-process-restarts.md).
//!
//! A new leader's `LeaderTakeover` credits the time since it applied the latest checkpoint
//! (docs/adr/0008-lease-checkpoints.md). Measured with an `Instant`, a process restarted since
//! then measures only from its own replay of the log, and the wall-clock part of the credit is
//! capped: under leader churn a restarted process that becomes leader after a long election
//! forgot seconds of a dead node's downtime at every such takeover, so the dead node's
//! records expired late. The [`HostInstant`] of the first apply, written here, survives the
//! restart; the file is not fsync'd, because only a later process of the same boot can use
//! it, and the page cache survives a process crash.
//!
//! A replica that was not among those that committed the checkpoint (it was starting, or
//! behind) applies it later, when it catches up: that lag, from the entry's proposal to this
//! host's first apply, only wall clocks can measure; it is recorded too, and credited less the
//! assumed clock skew and capped like any wall-clock credit.
//!
//! Format: one line,
//! `v1 <boot id> <host ms> <checkpoint> <log index> <proposal wall ms> <lag ms>`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::host_clock::{HostClock, HostInstant, WallClock};

/// File in the data directory holding the latest [`CheckpointApplied`].
pub const LEASE_CLOCK_FILE: &str = "lease-clock";
/// Largest [`LEASE_CLOCK_FILE`] read, bytes: its one line is under 200 bytes (a 36-byte boot
/// id and five numbers). A larger file (or a path that never ends, such as `/dev/zero`) is not
/// read past this, so it cannot exhaust memory at start.
pub const MAX_LEASE_CLOCK_BYTES: u64 = 4_096;

/// One checkpoint entry and when this host first applied it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointApplied {
    /// The state's lease checkpoint counter after the entry was applied.
    pub checkpoint: u64,
    /// Raft log index of the entry (within a cluster incarnation, applied indexes only grow
    /// and a committed entry never changes; a restore moves this file aside).
    pub log_index: u64,
    /// The entry's proposal wall time (Unix ms).
    pub proposed_wall_ms: u64,
    /// When this host first applied it.
    pub applied: HostInstant,
    /// Wall-clock ms from the entry's proposal to that first apply (this host's wall clock
    /// against the proposer's; 0 if this host's reads earlier).
    pub lag_ms: u64,
}

/// Reads the record at `path`, at most [`MAX_LEASE_CLOCK_BYTES`]: `Ok(None)` when the file
/// is missing or its content is not a record.
///
/// # Errors
/// The file cannot be read, or is larger than the limit; the message names the file and, for
/// a large one, the limit.
pub fn read_record(path: &Path) -> Result<Option<CheckpointApplied>, crate::files::FileError> {
    match shoal_transport::keyfile::read_bounded(path, MAX_LEASE_CLOCK_BYTES) {
        Ok(bytes) => Ok(std::str::from_utf8(&bytes)
            .ok()
            .and_then(CheckpointApplied::decode)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(crate::files::FileError::Io {
            path: path.to_path_buf(),
            error: e,
        }),
    }
}

impl CheckpointApplied {
    fn encode(&self) -> String {
        format!(
            "v1 {} {} {} {} {} {}\n",
            self.applied.boot,
            self.applied.ms,
            self.checkpoint,
            self.log_index,
            self.proposed_wall_ms,
            self.lag_ms
        )
    }

    fn decode(text: &str) -> Option<Self> {
        let mut f = text.split_whitespace();
        if f.next()? != "v1" {
            return None;
        }
        let boot = f.next()?.to_owned();
        let mut num = || f.next()?.parse::<u64>().ok();
        let (ms, checkpoint, log_index) = (num()?, num()?, num()?);
        let (proposed_wall_ms, lag_ms) = (num()?, num()?);
        Some(Self {
            checkpoint,
            log_index,
            proposed_wall_ms,
            applied: HostInstant { boot, ms },
            lag_ms,
        })
    }

    fn same_entry(&self, checkpoint: u64, log_index: u64, proposed_wall_ms: u64) -> bool {
        self.checkpoint == checkpoint
            && self.log_index == log_index
            && self.proposed_wall_ms == proposed_wall_ms
    }
}

/// The record of the data directory, and the clocks that make new ones.
#[derive(Debug)]
pub struct LeaseClock {
    dir: PathBuf,
    clock: HostClock,
    wall: WallClock,
    record: Option<CheckpointApplied>,
    write_failed_logged: bool,
}

impl LeaseClock {
    /// Reads `dir`'s record (a missing or unreadable file is no record: credits fall back to
    /// what this process measures). A file that cannot be read, or is larger than
    /// [`MAX_LEASE_CLOCK_BYTES`], is refused with a warning naming it (see [`read_record`]).
    pub fn open(dir: &Path, clock: HostClock, wall: WallClock) -> Self {
        let path = dir.join(LEASE_CLOCK_FILE);
        let record = match read_record(&path) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e,
                    "lease clock file refused: a restart of this replica credits only the downtime it measures itself");
                None
            }
        };
        Self {
            dir: dir.to_path_buf(),
            clock,
            wall,
            record,
            write_failed_logged: false,
        }
    }

    /// The host clock now (`None` without one).
    pub fn now(&self) -> Option<HostInstant> {
        (self.clock)()
    }

    /// Wall-clock ms from `proposed_wall_ms` to now (0 if this host's clock reads earlier).
    pub fn lag_ms(&self, proposed_wall_ms: u64) -> u64 {
        (self.wall)().saturating_sub(proposed_wall_ms)
    }

    /// Entry `log_index`, proposed at `proposed_wall_ms`, made the checkpoint counter
    /// `checkpoint`: when this host first applied it, and the wall-clock lag from the
    /// proposal to then. That is the record when an earlier process of this replica applied
    /// the same entry in this boot; otherwise now, recorded for a later process. Replaying an
    /// entry older than the recorded one (a restarted process re-applies its log) keeps the
    /// record: the newer entry comes next.
    pub fn applied(
        &mut self,
        checkpoint: u64,
        log_index: u64,
        proposed_wall_ms: u64,
    ) -> Option<(HostInstant, u64)> {
        let now = self.now()?;
        let lag_ms = self.lag_ms(proposed_wall_ms);
        if let Some(rec) = &self.record {
            if rec.applied.boot == now.boot {
                if rec.same_entry(checkpoint, log_index, proposed_wall_ms) {
                    return Some((rec.applied.clone(), rec.lag_ms));
                }
                if rec.log_index > log_index {
                    return Some((now, lag_ms));
                }
            }
        }
        let rec = CheckpointApplied {
            checkpoint,
            log_index,
            proposed_wall_ms,
            applied: now.clone(),
            lag_ms,
        };
        if let Err(e) = self.write(&rec) {
            if !self.write_failed_logged {
                tracing::warn!(error = %e, dir = %self.dir.display(),
                    "cannot record the lease checkpoint's apply time: a restart of this replica will credit less downtime");
                self.write_failed_logged = true;
            }
        }
        self.record = Some(rec);
        Some((now, lag_ms))
    }

    /// The record of checkpoint `checkpoint` when the entry that made it is at or below
    /// `upto_index`: a state loaded from a snapshot up to `upto_index` whose counter is
    /// `checkpoint` holds exactly that entry's checkpoint (one entry per counter value in a
    /// cluster incarnation).
    pub fn covered(&self, checkpoint: u64, upto_index: u64) -> Option<&CheckpointApplied> {
        self.record
            .as_ref()
            .filter(|r| r.checkpoint == checkpoint && r.log_index <= upto_index)
    }

    fn write(&self, rec: &CheckpointApplied) -> std::io::Result<()> {
        let path = self.dir.join(LEASE_CLOCK_FILE);
        let tmp = self.dir.join(format!("{LEASE_CLOCK_FILE}.tmp"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(rec.encode().as_bytes())?;
        drop(f);
        std::fs::rename(&tmp, &path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_garbage_is_no_record() {
        let r = CheckpointApplied {
            checkpoint: 7,
            log_index: 42,
            proposed_wall_ms: 1_796_420_625_808,
            applied: HostInstant {
                boot: "2f0c2a5e-6f0e-4d0b-9f7e-0b1e2c3d4e5f".into(),
                ms: 123_456,
            },
            lag_ms: 1_250,
        };
        assert_eq!(CheckpointApplied::decode(&r.encode()), Some(r));
        for bad in ["", "v2 b 1 2 3 4 5", "v1 b 1 2 3 4", "v1 b 1 2 x 4 5"] {
            assert_eq!(CheckpointApplied::decode(bad), None, "{bad:?}");
        }
    }

    fn record() -> CheckpointApplied {
        CheckpointApplied {
            checkpoint: 3,
            log_index: 9,
            proposed_wall_ms: 1_000,
            applied: HostInstant {
                boot: "b".into(),
                ms: 5,
            },
            lag_ms: 0,
        }
    }

    /// An oversized file (or `/dev/zero`) is refused after at most the limit, naming the file
    /// and the limit, and is no record, even when it starts with a valid one (it was read
    /// whole, and `/dev/zero` until memory ran out).
    #[test]
    fn an_oversized_file_is_refused_naming_the_file_and_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LEASE_CLOCK_FILE);
        assert_eq!(read_record(&path).unwrap(), None, "missing: no record");
        std::fs::write(&path, record().encode()).unwrap();
        assert_eq!(read_record(&path).unwrap(), Some(record()));

        let mut big = record().encode().into_bytes();
        big.resize(MAX_LEASE_CLOCK_BYTES as usize + 1, b' ');
        std::fs::write(&path, &big).unwrap();
        let e = read_record(&path).unwrap_err().to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("4096 bytes limit"),
            "{e}"
        );
        let lc = LeaseClock::open(dir.path(), || None, || 0);
        assert_eq!(lc.covered(3, 9), None, "an oversized file is no record");

        // Exactly the limit is read.
        big.truncate(MAX_LEASE_CLOCK_BYTES as usize);
        std::fs::write(&path, &big).unwrap();
        assert_eq!(read_record(&path).unwrap(), Some(record()));

        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let e = read_record(&path).unwrap_err().to_string();
        assert!(e.contains("lease-clock") && e.contains("limit"), "{e}");
    }
}
