//! The replica's `audit.log` writer: one JSON line per applied command (written by the state
//! machine as it applies the Raft log, so every replica writes its own from the same log) plus
//! the RPC layer's lines (`rpc_rejected`, `membership_change`). One writer for both, so a failed
//! append can be cut back without racing another file handle.
//!
//! # When an append fails (a full disk, a file-size limit, an I/O error)
//! Nothing is dropped silently and the replica keeps serving:
//! - the bytes of a failed append are cut back (`set_len` to the last whole line), so no torn
//!   line is ever followed by another one;
//! - the line is kept, in order, in a bounded in-memory backlog ([`BACKLOG_BYTES`]), and every
//!   later line queues behind it;
//! - once the backlog is full, further lines are not kept: the first and last log index they
//!   audit are remembered, and when appending works again one
//!   `{"audit_gap": {first_index, last_index, lines, error, ...}}` line is written after the
//!   backlog, where those lines would have been;
//! - every append (and the replica's periodic [`AuditFile::retry`]) first retries the backlog.
//!
//! One ERROR when an outage starts (and one when the backlog overflows), one WARN when it ends;
//! counters `shoal_authority_audit_append_failures_total` (failed attempts) and
//! `shoal_authority_audit_gaps_total` (gap lines written), gauge
//! `shoal_authority_audit_backlog_lines`.
//!
//! The backlog lives in memory only. If the replica stops before it is written, nothing is lost
//! either: `audit.log` is always an in-order prefix of the audit stream, so at start
//! [`AuditFile::open`]'s high-water mark is the last index written, and what follows it is
//! re-derived: from the snapshot's audit ring (`StateMachineStore::open`) and by openraft
//! re-applying the log above the snapshot.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use metrics::{counter, gauge};
use shoal_authority::AuditEntry;

use crate::files::FileError;

/// Most bytes of audit lines kept in memory while `audit.log` cannot be appended to (about
/// 20,000 lines); lines past it are recorded as one `audit_gap` line.
pub const BACKLOG_BYTES: usize = 8 << 20;

/// Lines that could not be kept (the backlog was full): what the `audit_gap` line will say.
#[derive(Debug, Default)]
struct Dropped {
    first_index: Option<u64>,
    last_index: Option<u64>,
    lines: u64,
}

/// The append-only `audit.log` of one replica (see the module docs).
#[derive(Debug)]
pub struct AuditFile {
    path: PathBuf,
    file: File,
    /// Length of the file up to its last whole line (what a failed append is cut back to).
    good_len: u64,
    /// A failed append may have left part of a line past `good_len`.
    dirty: bool,
    /// Lines not yet written, oldest first.
    backlog: VecDeque<String>,
    backlog_bytes: usize,
    cap_bytes: usize,
    dropped: Option<Dropped>,
    /// The error of the first failed append of the current outage.
    outage: Option<String>,
    /// Lines this process named in `audit_gap` lines instead of writing them.
    gap_lines: u64,
}

impl AuditFile {
    /// Opens (or creates, mode 0600: it names local callers) `path` and returns it with the
    /// highest log index it records (0 for none): audit entries, membership lines, and the
    /// `last_index` of an `audit_gap` line. A torn last line (an append that crashed) is cut
    /// off first, so the next line starts on a line of its own.
    ///
    /// # Errors
    /// [`FileError::Io`] when the file cannot be opened or its torn tail cut.
    pub fn open(path: &Path) -> Result<(Self, u64), FileError> {
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| FileError::io(path, e))?;
        let bytes = std::fs::read(path).map_err(|e| FileError::io(path, e))?;
        let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        if whole < bytes.len() {
            tracing::warn!(
                path = %path.display(),
                cut_bytes = bytes.len() - whole,
                "cutting a torn last line off the audit log (an append that never completed)"
            );
            file.set_len(whole as u64)
                .map_err(|e| FileError::io(path, e))?;
        }
        let high_water = last_index(&String::from_utf8_lossy(&bytes[..whole]));
        Ok((
            Self {
                path: path.to_path_buf(),
                file,
                good_len: whole as u64,
                dirty: false,
                backlog: VecDeque::new(),
                backlog_bytes: 0,
                cap_bytes: BACKLOG_BYTES,
                dropped: None,
                outage: None,
                gap_lines: 0,
            },
            high_water,
        ))
    }

    /// Appends `lines` (whole lines, each ending in `\n`; empty: only retries the backlog)
    /// auditing log indexes `indexes` (first, last; `None` for RPC-layer lines). Never fails:
    /// see the module docs for what happens when the file cannot be written.
    pub fn append(&mut self, lines: String, indexes: Option<(u64, u64)>) {
        self.retry();
        if lines.is_empty() {
            return;
        }
        if self.backlog.is_empty() && self.dropped.is_none() {
            // The common case: straight to the file.
            let Err(e) = self.write(lines.as_bytes()) else {
                return;
            };
            self.failed(&e);
        }
        self.enqueue(lines, indexes);
    }

    /// Writes what is waiting (the backlog, then the `audit_gap` line), if anything is.
    pub fn retry(&mut self) {
        if self.backlog.is_empty() && self.dropped.is_none() {
            return;
        }
        let mut buf = String::with_capacity(self.backlog_bytes + 256);
        for l in &self.backlog {
            buf.push_str(l);
        }
        if let Some(d) = &self.dropped {
            let gap = serde_json::json!({
                "audit_gap": {
                    "first_index": d.first_index,
                    "last_index": d.last_index,
                    "lines": d.lines,
                    "error": self.outage.as_deref().unwrap_or("unknown"),
                    "reason": format!(
                        "audit.log could not be appended to and the in-memory backlog ({} bytes) was full",
                        self.cap_bytes
                    ),
                }
            });
            buf.push_str(&format!("{gap}\n"));
        }
        if let Err(e) = self.write(buf.as_bytes()) {
            self.failed(&e);
            return;
        }
        let written = self.backlog.len();
        if let Some(d) = self.dropped.take() {
            counter!("shoal_authority_audit_gaps_total").increment(1);
            self.gap_lines += d.lines;
        }
        self.backlog.clear();
        self.backlog_bytes = 0;
        gauge!("shoal_authority_audit_backlog_lines").set(0.0);
        if let Some(e) = self.outage.take() {
            tracing::warn!(path = %self.path.display(), lines = written, first_error = %e,
                "audit.log appends work again: the lines kept in memory are written");
        }
    }

    /// True when the file holds no line (new, or moved away by an operator).
    pub fn is_empty(&self) -> bool {
        self.good_len == 0 && self.backlog.is_empty()
    }

    /// Lines waiting in memory.
    pub fn backlog_lines(&self) -> usize {
        self.backlog.len()
    }

    /// Lines named by `audit_gap` lines written by this process (never written themselves).
    pub fn gap_lines(&self) -> u64 {
        self.gap_lines
    }

    /// Sets the backlog bound (tests).
    pub fn set_backlog_cap(&mut self, bytes: usize) {
        self.cap_bytes = bytes;
    }

    /// Replaces the file written to (tests: `/dev/full` stands for a full disk).
    pub fn redirect(&mut self, file: File) {
        self.good_len = file.metadata().map_or(0, |m| m.len());
        self.file = file;
        self.dirty = false;
    }

    /// Counts a failed append; the first of an outage is logged (at ERROR) and remembered.
    fn failed(&mut self, e: &std::io::Error) {
        counter!("shoal_authority_audit_append_failures_total").increment(1);
        if self.outage.is_none() {
            tracing::error!(path = %self.path.display(), error = %e,
                "audit.log append failed: keeping audit lines in memory (bounded) until it works again");
            self.outage = Some(e.to_string());
        } else {
            tracing::debug!(error = %e, "audit.log append failed again");
        }
    }

    /// Queues `lines` behind the backlog, or past its bound into the gap.
    fn enqueue(&mut self, lines: String, indexes: Option<(u64, u64)>) {
        let count = lines.matches('\n').count() as u64;
        if self.dropped.is_none() && self.backlog_bytes + lines.len() <= self.cap_bytes {
            self.backlog_bytes += lines.len();
            self.backlog.push_back(lines);
            gauge!("shoal_authority_audit_backlog_lines").set(self.backlog.len() as f64);
            return;
        }
        if self.dropped.is_none() {
            tracing::error!(path = %self.path.display(), cap_bytes = self.cap_bytes,
                "audit backlog full: further audit lines are not kept; an audit_gap line will name their log indexes");
        }
        let d = self.dropped.get_or_insert_with(Dropped::default);
        d.lines += count;
        if let Some((first, last)) = indexes {
            d.first_index.get_or_insert(first);
            d.last_index = Some(last);
        }
    }

    /// One append of whole lines: all of it or, cut back, none of it.
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.dirty {
            self.file.set_len(self.good_len)?;
            self.dirty = false;
        }
        if let Err(e) = self.file.write_all(bytes) {
            // Part of it may be in the file: cut it back now, or before the next attempt.
            self.dirty = self.file.set_len(self.good_len).is_err();
            return Err(e);
        }
        self.good_len += bytes.len() as u64;
        Ok(())
    }
}

/// The highest log index the lines of an audit log record: an entry's `log_index`, a membership
/// line's, an `audit_gap` line's `last_index`, a `restored` line's `from_log_index` (0 when
/// there is none). The file is in log
/// order, so the last line that names one decides.
fn last_index(text: &str) -> u64 {
    text.lines()
        .rev()
        .filter(|l| !l.trim().is_empty())
        .find_map(|l| {
            if let Ok(e) = serde_json::from_str::<AuditEntry>(l) {
                return Some(e.log_index);
            }
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            v["membership"]["log_index"]
                .as_u64()
                .or_else(|| v["audit_gap"]["last_index"].as_u64())
                // `snapshot restore`: what came before is the old incarnation's audit log.
                .or_else(|| v["restored"]["from_log_index"].as_u64())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> File {
        OpenOptions::new().write(true).open("/dev/full").unwrap()
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }

    fn line(i: u64) -> String {
        format!("{}\n", serde_json::json!({"membership": {"log_index": i}}))
    }

    /// While the disk is full every line is kept, in order; when appends work again they are
    /// written before the next one and the file reads back every index once, in order.
    #[test]
    fn lines_that_fail_to_append_are_written_when_appending_works_again() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("audit.log");
        let (mut a, hw) = AuditFile::open(&path).unwrap();
        assert_eq!(hw, 0);
        a.append(line(1), Some((1, 1)));
        a.redirect(full());
        for i in 2..=5 {
            a.append(line(i), Some((i, i)));
        }
        a.append("{\"rpc_rejected\":{}}\n".into(), None);
        assert_eq!(a.backlog_lines(), 5);
        a.redirect(OpenOptions::new().append(true).open(&path).unwrap());
        a.retry();
        assert_eq!(a.backlog_lines(), 0);
        a.append(line(6), Some((6, 6)));
        let got: Vec<Option<u64>> = lines(&path)
            .iter()
            .map(|v| v["membership"]["log_index"].as_u64())
            .collect();
        assert_eq!(
            got,
            [1, 2, 3, 4, 5]
                .map(Some)
                .into_iter()
                .chain([None, Some(6)])
                .collect::<Vec<_>>()
        );
        assert_eq!(AuditFile::open(&path).unwrap().1, 6);
    }

    /// Past the backlog bound the lines are not kept, but one `audit_gap` line names their
    /// first and last log index and the error, where they would have been; the high water
    /// mark after a restart is past the gap (each index is accounted for once).
    #[test]
    fn lines_past_the_backlog_bound_become_one_audit_gap_line() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("audit.log");
        let (mut a, _) = AuditFile::open(&path).unwrap();
        a.set_backlog_cap(2 * line(1).len());
        a.redirect(full());
        for i in 1..=10 {
            a.append(line(i), Some((i, i)));
        }
        assert_eq!(a.backlog_lines(), 2);
        a.redirect(OpenOptions::new().append(true).open(&path).unwrap());
        a.append(line(11), Some((11, 11)));
        let got = lines(&path);
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[0]["membership"]["log_index"], 1);
        assert_eq!(got[1]["membership"]["log_index"], 2);
        let gap = &got[2]["audit_gap"];
        assert_eq!(gap["first_index"], 3, "{gap}");
        assert_eq!(gap["last_index"], 10, "{gap}");
        assert_eq!(gap["lines"], 8, "{gap}");
        assert!(
            gap["error"].as_str().unwrap().contains("No space left"),
            "{gap}"
        );
        assert_eq!(got[3]["membership"]["log_index"], 11);
        assert_eq!(a.gap_lines(), 8);
        drop(a);
        // A gap as the last line still counts as audited.
        std::fs::write(
            &path,
            format!(
                "{}{}",
                line(1),
                "{\"audit_gap\":{\"first_index\":2,\"last_index\":9}}\n"
            ),
        )
        .unwrap();
        assert_eq!(AuditFile::open(&path).unwrap().1, 9);
    }

    /// A torn last line (a crash mid-append) is cut at open; the next line starts clean.
    #[test]
    fn a_torn_last_line_is_cut_at_open() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("audit.log");
        std::fs::write(&path, format!("{}{{\"membership\":{{\"log_in", line(1))).unwrap();
        let (mut a, hw) = AuditFile::open(&path).unwrap();
        assert_eq!(hw, 1);
        a.append(line(2), Some((2, 2)));
        assert_eq!(lines(&path).len(), 2);
    }
}
