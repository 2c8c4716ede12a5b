//! The data directory: the node signing key (generated once, mode 0600), the boot generation
//! counter (bumped on every start), and the atomic file write every persisted file uses.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use shoal_proto::{Generation, SigningKey};

/// File name of the node signing key seed (32 raw bytes, hex-encoded, mode 0600).
pub const NODE_KEY_FILE: &str = "node.key";
/// File name of the boot generation counter (decimal).
pub const BOOT_FILE: &str = "boot";

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// Parses hex (either case); `None` on odd length or a non-hex digit.
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// Writes `bytes` to `path` atomically: temp file, fsync, rename, fsync of the directory.
/// A reader sees the old or the new content, never a mix.
///
/// # Errors
/// Any IO error; the old file is then untouched (a temp file may be left behind).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

/// Creates the data directory (mode 0700) if needed.
///
/// # Errors
/// IO errors.
pub fn ensure_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let mut perm = fs::metadata(dir)?.permissions();
    if perm.mode() & 0o077 != 0 {
        perm.set_mode(0o700);
        fs::set_permissions(dir, perm)?;
    }
    Ok(())
}

/// Loads the node signing key, generating and persisting a new one on first start.
///
/// # Errors
/// IO errors, or a key file that is not 64 hex characters (never silently replaced: other nodes
/// may trust the old public key).
pub fn load_or_create_node_key(dir: &Path) -> io::Result<SigningKey> {
    let path = dir.join(NODE_KEY_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => {
            let seed: [u8; 32] = from_hex(text.trim())
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{} is not a 32-byte hex seed", path.display()),
                    )
                })?;
            Ok(SigningKey::from_seed(seed))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed).map_err(|e| io::Error::other(e.to_string()))?;
            write_atomic(&path, to_hex(&seed).as_bytes(), 0o600)?;
            Ok(SigningKey::from_seed(seed))
        }
        Err(e) => Err(e),
    }
}

/// Reads the last boot generation, adds one, persists it and returns it. The first start is 1.
///
/// # Errors
/// IO errors, or a counter file that does not parse.
pub fn bump_boot(dir: &Path) -> io::Result<Generation> {
    let path = dir.join(BOOT_FILE);
    let last = match fs::read_to_string(&path) {
        Ok(text) => text.trim().parse::<u64>().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a number", path.display()),
            )
        })?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e),
    };
    let next = last.saturating_add(1);
    write_atomic(&path, next.to_string().as_bytes(), 0o600)?;
    Ok(Generation(next))
}

/// 64 random bits from the OS (seeds the mesh RNG and jitter).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // Fall back to the std hasher's per-process random keys.
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        return h.finish();
    }
    u64::from_le_bytes(b)
}

/// A small non-cryptographic RNG (SplitMix64) for jitter.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from the OS.
    pub fn new() -> Self {
        Self(random_u64())
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
    fn hex_round_trips_and_rejects_junk() {
        assert_eq!(to_hex(&[0, 0xab, 0xff]), "00abff");
        assert_eq!(from_hex("00ABff").unwrap(), vec![0, 0xab, 0xff]);
        assert!(from_hex("abc").is_none());
        assert!(from_hex("zz").is_none());
    }

    #[test]
    fn node_key_is_generated_once_and_boot_grows() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create_node_key(dir.path()).unwrap();
        let b = load_or_create_node_key(dir.path()).unwrap();
        assert_eq!(a.to_seed(), b.to_seed());
        let mode = fs::metadata(dir.path().join(NODE_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(bump_boot(dir.path()).unwrap(), Generation(1));
        assert_eq!(bump_boot(dir.path()).unwrap(), Generation(2));
    }
}
