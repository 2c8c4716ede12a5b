//! The boot generation file, OS randomness and the jitter RNG.
//!
//! Every start of a mesh member bumps a persisted counter so the member rejoins SWIM with an
//! identity that supersedes its previous life (`shoal_mesh::MemberId::boot`).

use std::fs;
use std::io;
use std::path::Path;

use shoal_proto::Generation;
use shoal_transport::keyfile;

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
/// IO errors, or a file that is not a decimal number (`InvalidData`; never silently reset:
/// a lower boot would not supersede the previous life).
pub fn bump_boot(dir: &Path, file: &str) -> io::Result<Generation> {
    let path = dir.join(file);
    let last = match fs::read(&path) {
        Ok(text) => parse_boot(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a number", path.display()),
            )
        })?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e),
    };
    let next = last.saturating_add(1);
    keyfile::replace_atomic(&path, next.to_string().as_bytes(), 0o600)?;
    Ok(Generation(next))
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
    fn jitter_stays_in_range() {
        let mut j = Jitter::from_seed(7);
        for max in [0, 1, 99, u64::MAX] {
            for _ in 0..100 {
                assert!(j.upto(max) <= max);
            }
        }
    }
}
