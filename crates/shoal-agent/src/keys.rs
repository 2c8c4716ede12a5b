//! The data directory: the node signing key (generated once, mode 0600), the boot generation
//! counter (bumped on every start), and the atomic file write every persisted file uses.
//!
//! The directory is created mode 0700 when missing; an existing one is never chmod'ed, only
//! warned about when group or others can reach it. The node key is created mode 0600 by the
//! `open` call (`O_EXCL`), and refused at load when group or others may read or write it, as
//! OpenSSH refuses an unprotected private key (see `shoal_transport::keyfile`).

use std::io;
use std::path::{Path, PathBuf};

use shoal_proto::SigningKey;
use shoal_runtime::boot::BootFile;
use shoal_transport::keyfile::{self, Overwrite};

/// File name of the node signing key seed (32 raw bytes, hex-encoded, mode 0600).
pub const NODE_KEY_FILE: &str = "node.key";
/// File name of the boot generation counter (decimal).
pub const BOOT_FILE: &str = "boot";
/// File a running agent holds an exclusive `flock` on (and writes its pid into) for its whole
/// life, so a second agent on the same data directory refuses to start instead of sharing the
/// node key, the boot counter and every persisted file.
pub const LOCK_FILE: &str = "agent.lock";

/// The data directory's lock ([`LOCK_FILE`]); released when dropped or when the process dies.
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
}

/// Takes the data directory's lock without waiting. Call it before anything else in the
/// directory is read or written (the directory itself must exist: [`ensure_dir`]).
///
/// # Errors
/// `<dir>/agent.lock: held by a running agent (pid N); stop it first` when another process
/// holds it (nothing in the directory was touched); IO errors on the lock file.
pub fn lock_data_dir(dir: &Path) -> io::Result<DirLock> {
    match keyfile::lock_pid_file(&dir.join(LOCK_FILE)) {
        Ok(file) => Ok(DirLock { _file: file }),
        Err(keyfile::PidLockError::Held { path, pid }) => Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "{}: held by a running agent (pid {pid}); stop it first",
                path.display()
            ),
        )),
        Err(keyfile::PidLockError::Io { path, source }) => Err(io::Error::new(
            source.kind(),
            format!("{}: {source}", path.display()),
        )),
    }
}

pub use shoal_runtime::config::{from_hex, to_hex};

/// Writes `bytes` to `path` atomically: temp file (created with `mode`), fsync, rename, fsync
/// of the directory. A reader sees the old or the new content, never a mix.
///
/// # Errors
/// Any IO error; the old file is then untouched.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    keyfile::replace_atomic(path, bytes, mode)
}

/// Moves an unreadable (torn, corrupt or unopenable) file out of the way, keeping every byte:
/// renames `dir/name` to `dir/name.corrupt-<unix ms>` (`-1`, `-2`, ... appended when that name
/// is taken) and fsyncs the directory, so a later write of `name` cannot destroy it. An
/// existing file is never replaced: the new name is made with `link(2)`, which fails rather
/// than overwrite, and only then is the old name removed. Returns the new path.
///
/// # Errors
/// IO errors. On error `path` is still there (possibly with a second name, the aside copy);
/// the caller must then not write `path` either.
pub fn set_aside(path: &Path) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?
        .to_string_lossy()
        .into_owned();
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    for n in 0..1_000u32 {
        let aside = match n {
            0 => path.with_file_name(format!("{name}.corrupt-{ms}")),
            n => path.with_file_name(format!("{name}.corrupt-{ms}-{n}")),
        };
        match std::fs::hard_link(path, &aside) {
            Ok(()) => {
                std::fs::remove_file(path)?;
                let dir = match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                std::fs::File::open(dir)?.sync_all()?;
                return Ok(aside);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("{name}.corrupt-{ms}-*: every name taken"),
    ))
}

/// Creates the data directory (mode 0700, parents too) if needed; an existing directory that
/// group or others can reach is warned about, not changed.
///
/// # Errors
/// IO errors.
pub fn ensure_dir(dir: &Path) -> io::Result<()> {
    keyfile::ensure_private_dir(dir).map_err(io::Error::from)
}

/// Parses the content of a node key file: 64 hex characters (surrounding whitespace ignored).
pub fn parse_node_key(text: &[u8]) -> Option<[u8; 32]> {
    let text = std::str::from_utf8(text).ok()?;
    from_hex(text.trim())?.try_into().ok()
}

pub use shoal_runtime::boot::{parse_boot, random_u64, Jitter};

/// Loads the node signing key, generating and persisting a new one on first start.
///
/// # Errors
/// IO errors, a key file readable or writable by group or others (refused, like OpenSSH), or a
/// key file that is not 64 hex characters (never silently replaced: other nodes may trust the
/// old public key).
pub fn load_or_create_node_key(dir: &Path) -> io::Result<SigningKey> {
    let path = dir.join(NODE_KEY_FILE);
    match keyfile::read_private(&path) {
        Ok(text) => {
            let seed = parse_node_key(&text).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is not a 32-byte hex seed", path.display()),
                )
            })?;
            Ok(SigningKey::from_seed(seed))
        }
        Err(keyfile::KeyFileError::NotFound { .. }) => {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed).map_err(|e| io::Error::other(e.to_string()))?;
            keyfile::write_private(&path, to_hex(&seed).as_bytes(), Overwrite::Refuse)?;
            Ok(SigningKey::from_seed(seed))
        }
        Err(e) => Err(e.into()),
    }
}

/// Reads the last boot generation (`data_dir/boot`), adds one, persists it and returns the
/// file, whose [`BootFile::generation`] is this start's boot. The first start is 1
/// (`shoal_runtime::boot::bump_boot`). The driver keeps the file and writes every boot the
/// agent renews itself to when declared down before announcing it
/// (`shoal_runtime::io::MeshIo::dispatch`).
///
/// # Errors
/// IO errors, a counter file that does not parse, is larger than
/// `shoal_runtime::boot::MAX_BOOT_FILE_BYTES` or holds `u64::MAX`: the agent must not start.
pub fn open_boot(dir: &Path) -> io::Result<BootFile> {
    BootFile::bump(dir, BOOT_FILE)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use shoal_proto::Generation;

    use super::*;

    #[test]
    fn an_open_node_key_is_refused_and_the_dir_is_0700() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        ensure_dir(&dir).unwrap();
        let mode = fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        load_or_create_node_key(&dir).unwrap();
        let key = dir.join(NODE_KEY_FILE);
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
        let err = load_or_create_node_key(&dir).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("node.key"), "{err}");
        assert!(parse_node_key(b"zz").is_none());
        assert_eq!(parse_boot(b" 7\n"), Some(7));
        assert_eq!(parse_boot(b"\xff"), None);
    }

    #[test]
    fn a_second_holder_of_the_data_dir_lock_is_refused_with_the_pid() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock_data_dir(dir.path()).unwrap();
        // flock belongs to the open file description: a second open in this process conflicts
        // as a second agent process would.
        let err = lock_data_dir(dir.path()).unwrap_err();
        let want = format!(
            "{}: held by a running agent (pid {}); stop it first",
            dir.path().join(LOCK_FILE).display(),
            std::process::id()
        );
        assert_eq!(err.to_string(), want);
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        drop(first);
        // Released with its holder; a stale file (its pid inside) does not block.
        let _again = lock_data_dir(dir.path()).unwrap();
    }

    #[test]
    fn node_key_is_generated_once_and_boot_grows() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create_node_key(dir.path()).unwrap();
        let b = load_or_create_node_key(dir.path()).unwrap();
        assert_eq!(a.to_seed(), b.to_seed());
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(dir.path().join(NODE_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(open_boot(dir.path()).unwrap().generation(), Generation(1));
        assert_eq!(open_boot(dir.path()).unwrap().generation(), Generation(2));
    }
}
