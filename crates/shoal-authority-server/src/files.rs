//! Checksummed files: atomic replacement of small state files (vote, purge mark, snapshot) and
//! the framing of log records.
//!
//! A *framed* file is `magic (4) | payload length (u32 LE) | crc32 (u32 LE) | payload`. It is
//! replaced atomically: written to `.<name>.tmp` (created mode 0600), fsync'd, renamed over the old file, and the
//! directory fsync'd, so a crash leaves either the old or the new file, never half of one. A file
//! whose magic, length or checksum does not match is refused with [`FileError::Corrupt`]: a torn
//! or bit-rotted file is never loaded (invariant 7).

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};

/// Magic of a framed state file.
pub const FILE_MAGIC: [u8; 4] = *b"SHA1";
/// Bytes before the payload of a framed file: magic, length, crc.
pub const FILE_HEADER_BYTES: usize = 12;
/// Bytes before the payload of a log record: length, crc.
pub const RECORD_HEADER_BYTES: usize = 8;
/// Largest payload accepted in a framed file or log record (256 MiB); bounds what a corrupt
/// length field can make us allocate.
pub const MAX_PAYLOAD_BYTES: usize = 256 << 20;

/// Why a file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The operating system failed; nothing was replaced.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error. In the message, and deliberately not the error's `source()`: the `{:#}`
        /// of the binary's error chain would print it twice.
        error: io::Error,
    },
    /// The file exists but is torn, truncated or fails its checksum. It was not loaded; an
    /// operator must restore it (e.g. from a peer's snapshot) before the replica may start.
    #[error("{path}: corrupt ({what}); refusing to load it")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What did not match.
        what: String,
    },
    /// The operation was refused to protect the data (a running replica holds the directory,
    /// or it belongs to a cluster and the operator did not confirm); nothing was changed.
    #[error("{path}: {what}")]
    Busy {
        /// The file or directory.
        path: PathBuf,
        /// Why, and what to do.
        what: String,
    },
    /// The payload could not be encoded or decoded.
    #[error("{path}: {what}")]
    Codec {
        /// The file.
        path: PathBuf,
        /// The codec error.
        what: String,
    },
}

impl FileError {
    pub(crate) fn io(path: &Path, error: io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            error,
        }
    }
}

/// Frames `payload` with magic, length and crc32.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FILE_HEADER_BYTES + payload.len());
    out.extend_from_slice(&FILE_MAGIC);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Checks and strips the frame of a whole framed file's bytes.
///
/// # Errors
/// [`FileError::Corrupt`] on a bad magic, a length that disagrees with the file size, or a
/// checksum mismatch.
pub fn unframe<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a [u8], FileError> {
    let corrupt = |what: String| FileError::Corrupt {
        path: path.to_path_buf(),
        what,
    };
    if bytes.len() < FILE_HEADER_BYTES {
        return Err(corrupt(format!(
            "{} bytes, shorter than the header",
            bytes.len()
        )));
    }
    if bytes[..4] != FILE_MAGIC {
        return Err(corrupt("bad magic".into()));
    }
    let len = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    let payload = &bytes[FILE_HEADER_BYTES..];
    if payload.len() != len {
        return Err(corrupt(format!(
            "header says {len} payload bytes, file has {}",
            payload.len()
        )));
    }
    if crc32fast::hash(payload) != crc {
        return Err(corrupt("checksum mismatch".into()));
    }
    Ok(payload)
}

/// Atomically replaces `path` with the framed `payload` (temp file, fsync, rename, fsync dir).
///
/// # Errors
/// [`FileError::Io`]; the old file is untouched then.
pub fn write_atomic(path: &Path, payload: &[u8]) -> Result<(), FileError> {
    shoal_transport::keyfile::replace_atomic(path, &frame(payload), 0o600)
        .map_err(|e| FileError::io(path, e))
}

/// Atomically replaces `path` with `bytes` as they are (no frame): temp file, fsync, rename,
/// fsync dir. For small human-readable files (the cluster id).
///
/// # Errors
/// [`FileError::Io`]; the old file is untouched then.
pub fn write_plain_atomic(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    shoal_transport::keyfile::replace_atomic(path, bytes, 0o600).map_err(|e| FileError::io(path, e))
}

/// Reads a framed file; `Ok(None)` when it does not exist.
///
/// # Errors
/// [`FileError::Io`] for read failures, [`FileError::Corrupt`] for a torn or damaged file.
pub fn read_framed(path: &Path) -> Result<Option<Vec<u8>>, FileError> {
    // The largest framed file is its header and the largest payload: a wrong path (e.g.
    // `snapshot restore /dev/zero`) is refused after that many bytes.
    let limit = (FILE_HEADER_BYTES + MAX_PAYLOAD_BYTES) as u64;
    match shoal_transport::keyfile::read_bounded(path, limit) {
        Ok(bytes) => Ok(Some(unframe(path, &bytes)?.to_vec())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FileError::io(path, e)),
    }
}

/// fsyncs the directory holding `path`, so a rename or a new file survives a crash.
///
/// # Errors
/// [`FileError::Io`].
pub fn sync_dir(path: &Path) -> Result<(), FileError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let d = OpenOptions::new()
        .read(true)
        .open(dir)
        .map_err(|e| FileError::io(dir, e))?;
    d.sync_all().map_err(|e| FileError::io(dir, e))
}

/// Appends one log record (`length | crc32 | payload`) to `out`.
pub fn push_record(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The outcome of scanning a log file.
#[derive(Debug)]
pub struct Scanned<'a> {
    /// Each complete record: its start offset and payload.
    pub records: Vec<(u64, &'a [u8])>,
    /// Offset just past the last complete record; anything beyond is a torn tail.
    pub valid_len: u64,
}

/// Splits a log file into records.
///
/// A final record whose header or payload runs past the end of the file is a **torn tail**: an
/// append that crashed before its fsync, which was therefore never acknowledged to Raft. It is
/// reported through `valid_len` (the caller truncates it). Any complete record whose checksum
/// fails is corruption, not a torn write, and is refused.
///
/// # Errors
/// [`FileError::Corrupt`] naming the offset of the first damaged record.
pub fn scan_records<'a>(path: &Path, bytes: &'a [u8]) -> Result<Scanned<'a>, FileError> {
    let mut records = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        if bytes.len() - at < RECORD_HEADER_BYTES {
            break;
        }
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes"));
        if len > MAX_PAYLOAD_BYTES {
            return Err(FileError::Corrupt {
                path: path.to_path_buf(),
                what: format!("record at offset {at} claims {len} bytes"),
            });
        }
        let start = at + RECORD_HEADER_BYTES;
        if bytes.len() - start < len {
            break;
        }
        let payload = &bytes[start..start + len];
        if crc32fast::hash(payload) != crc {
            return Err(FileError::Corrupt {
                path: path.to_path_buf(),
                what: format!("checksum mismatch in the record at offset {at}"),
            });
        }
        records.push((at as u64, payload));
        at = start + len;
    }
    Ok(Scanned {
        records,
        valid_len: at as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn framed_round_trip_and_corruption_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vote.bin");
        assert!(read_framed(&p).unwrap().is_none());
        write_atomic(&p, b"hello").unwrap();
        assert_eq!(read_framed(&p).unwrap().unwrap(), b"hello");
        let mut bytes = fs::read(&p).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        fs::write(&p, &bytes).unwrap();
        assert!(matches!(read_framed(&p), Err(FileError::Corrupt { .. })));
        fs::write(&p, &bytes[..bytes.len() - 2]).unwrap();
        assert!(matches!(read_framed(&p), Err(FileError::Corrupt { .. })));
    }

    #[test]
    fn torn_tail_is_cut_and_bad_checksum_refused() {
        let mut log = Vec::new();
        push_record(&mut log, b"one");
        push_record(&mut log, b"two");
        let full = log.len() as u64;
        push_record(&mut log, b"three");
        let p = Path::new("raft.log");
        let s = scan_records(p, &log[..log.len() - 2]).unwrap();
        assert_eq!(s.records.len(), 2);
        assert_eq!(s.valid_len, full);
        let mut bad = log.clone();
        bad[RECORD_HEADER_BYTES] ^= 0xff;
        assert!(matches!(
            scan_records(p, &bad),
            Err(FileError::Corrupt { .. })
        ));
    }
}
