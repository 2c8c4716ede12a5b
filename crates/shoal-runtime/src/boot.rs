//! The boot generation file, OS randomness and the jitter RNG.
//!
//! Every start of a mesh member bumps a persisted counter so the member rejoins SWIM with an
//! identity that supersedes its previous life (`shoal_mesh::MemberId::boot`). A running member
//! also raises its boot in memory when it is declared down and rejoins by itself
//! (`MembershipEvent::Rejoined`); [`BootFile::record`] writes that generation too, before the
//! member announces itself under it (`crate::io::MeshIo::dispatch`), so the file holds the
//! highest boot generation the node ever used and the next start supersedes all of them.

use std::io;
use std::path::{Path, PathBuf};

use shoal_proto::Generation;
use shoal_transport::keyfile;

/// Largest boot file read, bytes. The counter is at most 20 decimal digits; the rest is room
/// for whitespace. A larger file (or `/dev/zero` in its place) is refused unread.
pub const MAX_BOOT_FILE_BYTES: u64 = 64;

/// After a failed write of the boot file, how long [`BootFile::record`] waits before it
/// tries again, ms: a broken disk is not hammered with an fsync per mesh input.
pub const BOOT_WRITE_RETRY_MS: u64 = 1_000;

/// Parses the content of a boot counter file: a decimal number (surrounding whitespace
/// ignored).
pub fn parse_boot(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text).ok()?.trim().parse().ok()
}

/// Reads the last boot generation from `dir/file`, adds one, writes it back atomically (temp
/// file + fsync + rename, mode 0600) and returns it. A missing file counts as 0, so the first
/// start is 1. The directory must exist.
///
/// # Errors
/// IO errors; a file larger than [`MAX_BOOT_FILE_BYTES`] (`InvalidData`, naming the file and
/// the limit; nothing of it is read past the limit); a file that is not a decimal number
/// (`InvalidData`; never silently reset: a lower boot would not supersede the previous life);
/// a file holding `u64::MAX` (`InvalidData`: the generation cannot grow, and reusing it would
/// not supersede the previous life). The file is left as it is on every error.
pub fn bump_boot(dir: &Path, file: &str) -> io::Result<Generation> {
    let path = dir.join(file);
    let last = read_boot(&path)?;
    let next = last.checked_add(1).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} holds {last}, the highest boot generation there is: this node cannot \
                 start under a newer identity; replace it (a new node id and data directory)",
                path.display()
            ),
        )
    })?;
    write_boot(&path, Generation(next))?;
    Ok(Generation(next))
}

/// The generation `path` holds (0 when it does not exist), read through
/// [`keyfile::read_bounded`] with [`MAX_BOOT_FILE_BYTES`].
fn read_boot(path: &Path) -> io::Result<u64> {
    match keyfile::read_bounded(path, MAX_BOOT_FILE_BYTES) {
        Ok(text) => parse_boot(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a number", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
}

/// Writes `boot` to `path`: temp file + fsync + rename + fsync of the directory, mode 0600.
fn write_boot(path: &Path, boot: Generation) -> io::Result<()> {
    keyfile::replace_atomic(path, boot.0.to_string().as_bytes(), 0o600)
}

/// The boot file of a running mesh member: the start's [`bump_boot`], then every generation
/// the member renews itself to, written before it is announced.
#[derive(Debug)]
pub struct BootFile {
    path: PathBuf,
    /// The highest generation written to the file.
    stored: Generation,
    /// Monotonic ms of the last failed write; `None` once a write succeeds.
    failed_at_ms: Option<u64>,
    counters: BootFileCounters,
}

/// What [`BootFile::record`] has done since start, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BootFileCounters {
    /// Renewed generations written (the start's bump not included).
    pub writes: u64,
    /// Failed writes (each retry that fails counts again).
    pub write_errors: u64,
}

/// The outcome of one [`BootFile::record`].
#[derive(Debug)]
#[must_use = "a failed write means the generation in use is not on disk"]
pub enum BootRecord {
    /// The file already holds this generation or a higher one: nothing written.
    Held,
    /// The generation was written (and fsynced) now.
    Written,
    /// The write failed now: the generation is in use but not on disk.
    Failed(io::Error),
    /// A write failed less than [`BOOT_WRITE_RETRY_MS`] ago: not tried again yet.
    Deferred,
}

impl BootFile {
    /// At start: [`bump_boot`] of `dir/file`; [`BootFile::generation`] is this life's boot.
    ///
    /// # Errors
    /// As [`bump_boot`]: the member must not start.
    pub fn bump(dir: &Path, file: &str) -> io::Result<Self> {
        let stored = bump_boot(dir, file)?;
        Ok(Self {
            path: dir.join(file),
            stored,
            failed_at_ms: None,
            counters: BootFileCounters::default(),
        })
    }

    /// The highest generation written to the file (at start, this life's boot).
    pub fn generation(&self) -> Generation {
        self.stored
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Counters since start.
    pub fn counters(&self) -> BootFileCounters {
        self.counters
    }

    /// Makes the file hold `boot` — the member's current SWIM identity, `now_ms` on the
    /// monotonic clock — when it holds less: the same atomic write and fsync as at start.
    /// Call it before anything is sent under `boot` (`crate::io::MeshIo::dispatch` does).
    ///
    /// When the write fails, the member keeps `boot` and its transmits go out all the same:
    /// the mesh core has already renewed its identity, and holding its datagrams back would
    /// leave a live node out of the mesh (its endpoints unroutable everywhere) for as long as
    /// the disk refuses writes, while what an unwritten generation costs is one more rejoin
    /// after a later restart (it may start at a boot its peers already saw). The failure is
    /// not silent: it is logged (once, until a write succeeds again), counted in
    /// [`BootFileCounters::write_errors`], and the write is retried by the first call at
    /// least [`BOOT_WRITE_RETRY_MS`] later, so the file catches up as soon as the disk takes
    /// writes again.
    pub fn record(&mut self, now_ms: u64, boot: Generation) -> BootRecord {
        if boot <= self.stored {
            return BootRecord::Held;
        }
        if self
            .failed_at_ms
            .is_some_and(|at| now_ms.saturating_sub(at) < BOOT_WRITE_RETRY_MS)
        {
            return BootRecord::Deferred;
        }
        match write_boot(&self.path, boot) {
            Ok(()) => {
                if self.failed_at_ms.take().is_some() {
                    tracing::info!(file = %self.path.display(), boot = boot.0, "boot generation written again");
                }
                self.stored = boot;
                self.counters.writes += 1;
                BootRecord::Written
            }
            Err(e) => {
                if self.failed_at_ms.is_none() {
                    tracing::error!(
                        file = %self.path.display(),
                        boot = boot.0,
                        on_disk = self.stored.0,
                        error = %e,
                        "cannot write the renewed boot generation; running under it unwritten \
                         (retried every second): a restart before it is written may reuse it"
                    );
                }
                self.failed_at_ms = Some(now_ms);
                self.counters.write_errors += 1;
                BootRecord::Failed(e)
            }
        }
    }
}

/// 64 random bits from the OS (seeds the mesh RNG and jitter). Falls back to the std
/// hasher's per-process random keys if the OS source fails.
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        return h.finish();
    }
    u64::from_le_bytes(b)
}

/// A small non-cryptographic RNG (SplitMix64, Steele et al. 2014) for jitter.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from the OS.
    pub fn new() -> Self {
        Self(random_u64())
    }

    /// Seeded with `seed` (tests).
    pub fn from_seed(seed: u64) -> Self {
        Self(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=max`.
    pub fn upto(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            return self.next_u64();
        }
        self.next_u64() % (max + 1)
    }
}

impl Default for Jitter {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn boot_starts_at_one_grows_and_refuses_garbage() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(bump_boot(dir.path(), "b").unwrap(), Generation(1));
        assert_eq!(bump_boot(dir.path(), "b").unwrap(), Generation(2));
        let mode = fs::metadata(dir.path().join("b"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        fs::write(dir.path().join("b"), b"two").unwrap();
        let err = bump_boot(dir.path(), "b").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(fs::read(dir.path().join("b")).unwrap(), b"two");
        assert_eq!(parse_boot(b" 7\n"), Some(7));
        assert_eq!(parse_boot(b"\xff"), None);
    }

    #[test]
    fn an_oversized_boot_file_is_refused_unread_naming_file_and_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b");
        // 7 padded to 65 bytes: a number once trimmed, but over the limit.
        let big = format!("{:>65}", 7);
        fs::write(&path, &big).unwrap();
        let err = bump_boot(dir.path(), "b").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("64 bytes limit"), "{msg}");
        assert_eq!(fs::read(&path).unwrap(), big.as_bytes(), "left as it was");
        // A character device that never ends, in the file's place.
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let err = bump_boot(dir.path(), "b").unwrap_err();
        assert!(err.to_string().contains("64 bytes limit"), "{err}");
        // At the limit it is read.
        fs::remove_file(&path).unwrap();
        fs::write(&path, format!("{:>64}", 7)).unwrap();
        assert_eq!(bump_boot(dir.path(), "b").unwrap(), Generation(8));
    }

    #[test]
    fn a_boot_file_at_u64_max_refuses_to_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b");
        fs::write(&path, u64::MAX.to_string()).unwrap();
        let err = bump_boot(dir.path(), "b").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("new node id and data directory"), "{msg}");
        assert_eq!(fs::read(&path).unwrap(), u64::MAX.to_string().as_bytes());
        assert!(BootFile::bump(dir.path(), "b").is_err());
        // One below still starts, at the last generation there is.
        fs::write(&path, (u64::MAX - 1).to_string()).unwrap();
        assert_eq!(bump_boot(dir.path(), "b").unwrap(), Generation(u64::MAX));
    }

    #[test]
    fn a_renewed_boot_is_written_and_a_failed_write_is_retried_later() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        fs::create_dir(&dir).unwrap();
        let read = || parse_boot(&fs::read(dir.join("b")).unwrap()).unwrap();
        let mut f = BootFile::bump(&dir, "b").unwrap();
        assert_eq!(f.generation(), Generation(1));
        assert!(matches!(f.record(0, Generation(1)), BootRecord::Held));
        assert!(matches!(f.record(0, Generation(2)), BootRecord::Written));
        assert_eq!((read(), f.generation()), (2, Generation(2)));
        assert!(matches!(f.record(0, Generation(1)), BootRecord::Held));

        // The directory goes away: the write fails, is not retried within the interval, and
        // is retried (and succeeds) once the interval has passed and the disk is back.
        fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(f.record(10, Generation(3)), BootRecord::Failed(_)));
        assert_eq!(f.generation(), Generation(2));
        fs::create_dir(&dir).unwrap();
        let deferred = 10 + BOOT_WRITE_RETRY_MS - 1;
        assert!(matches!(
            f.record(deferred, Generation(3)),
            BootRecord::Deferred
        ));
        assert!(!dir.join("b").exists());
        let retry = 10 + BOOT_WRITE_RETRY_MS;
        assert!(matches!(
            f.record(retry, Generation(3)),
            BootRecord::Written
        ));
        assert_eq!((read(), f.generation()), (3, Generation(3)));
        assert_eq!(
            f.counters(),
            BootFileCounters {
                writes: 2,
                write_errors: 1
            }
        );
        // The next start supersedes every generation used.
        assert_eq!(bump_boot(&dir, "b").unwrap(), Generation(4));
    }

    #[test]
    fn jitter_stays_in_range() {
        let mut j = Jitter::from_seed(7);
        for max in [0, 1, 99, u64::MAX] {
            for _ in 0..100 {
                assert!(j.upto(max) <= max);
            }
        }
    }
}
