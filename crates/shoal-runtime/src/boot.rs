//! The boot generation file, OS randomness and the jitter RNG.
//!
//! Every start of a mesh member bumps a persisted counter so the member rejoins SWIM with an
//! identity that supersedes its previous life (`shoal_mesh::MemberId::boot`).

use std::io;
use std::path::Path;

use shoal_proto::Generation;
use shoal_transport::keyfile;

/// Largest boot file read, bytes. The counter is at most 20 decimal digits; the rest is room
/// for whitespace. A larger file (or `/dev/zero` in its place) is refused unread.
pub const MAX_BOOT_FILE_BYTES: u64 = 64;

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
        // One below still starts, at the last generation there is.
        fs::write(&path, (u64::MAX - 1).to_string()).unwrap();
        assert_eq!(bump_boot(dir.path(), "b").unwrap(), Generation(u64::MAX));
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
