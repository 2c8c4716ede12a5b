//! Files that hold secrets: how shoal creates, replaces and loads them.
//!
//! | what | rule |
//! |---|---|
//! | a new private file | created with mode 0600 *by the `open` call* (`O_CREAT\|O_EXCL`, mode 0600): it never exists with a wider mode, not even for an instant |
//! | replacing a file | the new content goes to a temp file created 0600 with `O_EXCL` next to it, is fsync'd, then renamed over the old one (a reader sees the old or the new file, never half of one) |
//! | refusing to overwrite | [`Overwrite::Refuse`]: `O_EXCL` on the final path; an existing file is an [`KeyFileError::Exists`] naming it |
//! | a directory we create | mode 0700 (every missing component, as `mkdir -p -m 700`) |
//! | a directory that exists | never chmod'ed; a warning is logged when it is group/world writable ([`ensure_dir`], output dirs) or group/world accessible at all ([`ensure_private_dir`], data dirs holding keys) |
//! | loading a private key | refused when the file is readable or writable by group or others, as OpenSSH refuses `id_*` keys with "UNPROTECTED PRIVATE KEY FILE" ([`read_private`]); one exception, PostgreSQL's rule for `ssl_key_file`: a file **owned by root** may also be group-readable (0640, 0440), because only root could have granted that group read access. This is how Kubernetes projects a Secret into a pod with `fsGroup` (root-owned, mode `defaultMode \| 0440`, group = fsGroup; deploy/k8s) and how Debian's `ssl-cert` group shares keys |
//!
//! | reading any file a command is given | [`read_bounded`]: at most a stated limit, so a wrong path such as `/dev/zero` fails fast instead of exhausting memory; key and certificate files are bounded by [`MAX_KEY_FILE_BYTES`] |
//!
//! The owner of the file is not checked (OpenSSH does; here the file may belong to a deploy user
//! and be read by a service user through group-less 0600 + ownership, which the mode check
//! cannot see either way).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Why [`lock_pid_file`] could not take its lock.
#[derive(Debug, thiserror::Error)]
pub enum PidLockError {
    /// Another process holds the lock; `pid` is what it wrote in the file (may be empty when
    /// it has not written it yet). Nothing was changed.
    #[error("{}: held by pid {pid}", path.display())]
    Held {
        /// The lock file.
        path: PathBuf,
        /// The holder's pid as written in the file, trimmed.
        pid: String,
    },
    /// The file could not be opened, locked or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// Takes an exclusive `flock(2)` on `path` without waiting (created mode 0600 when missing),
/// then writes our pid into it. The lock lasts as long as the returned file is open: until it
/// is dropped or the process dies (the kernel releases it even after `kill -9`), so a stale
/// file left by a dead process never blocks a start. Used for a data directory that only one
/// process may use at a time (the authority's `replica.lock`, the agent's `agent.lock`).
///
/// # Errors
/// [`PidLockError::Held`] when another open file description holds the lock (the file is left
/// as it is); [`PidLockError::Io`] otherwise.
pub fn lock_pid_file(path: &Path) -> Result<File, PidLockError> {
    let io_err = |source| PidLockError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(PRIVATE_FILE_MODE)
        .open(path)
        .map_err(io_err)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let pid = fs::read_to_string(path).unwrap_or_default();
            return Err(PidLockError::Held {
                path: path.to_path_buf(),
                pid: pid.trim().to_owned(),
            });
        }
        Err(fs::TryLockError::Error(e)) => return Err(io_err(e)),
    }
    file.set_len(0)
        .and_then(|()| file.write_all(std::process::id().to_string().as_bytes()))
        .and_then(|()| file.sync_data())
        .map_err(io_err)?;
    Ok(file)
}

/// Mode of every private file shoal writes.
pub const PRIVATE_FILE_MODE: u32 = 0o600;
/// Mode of public files (certificates) shoal writes.
pub const PUBLIC_FILE_MODE: u32 = 0o644;
/// Mode of every directory shoal creates.
pub const PRIVATE_DIR_MODE: u32 = 0o700;

/// Largest key or certificate file read (1 MiB): a PEM key is under 4 KiB and a CA bundle of
/// a few hundred certificates stays far below it.
pub const MAX_KEY_FILE_BYTES: u64 = 1 << 20;

/// What to do when the destination exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Fail with [`KeyFileError::Exists`] (the default of `keygen` and `certs`).
    Refuse,
    /// Replace it atomically (`--force`).
    Replace,
}

/// Why a secret file could not be written or loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// Refused to overwrite an existing file.
    #[error("{}: already exists, refusing to overwrite (pass --force to replace it)", path.display())]
    Exists {
        /// The existing file.
        path: PathBuf,
    },
    /// A private key file is readable or writable by group or others.
    #[error(
        "{}: private key file has mode {mode:04o}, readable or writable by group or others; \
         refusing to use it (run `chmod 600 {}`)",
        path.display(),
        path.display()
    )]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A private key path names something other than a regular file (a device such as
    /// `/dev/zero`, a FIFO, a directory). Refused before its mode is judged, so that the
    /// advice of [`KeyFileError::TooOpen`] (`chmod 600`) is never given for a device.
    #[error("{}: not a regular file; a private key must be a file of its own", path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
    },
    /// The file does not exist.
    #[error("{}: file not found", path.display())]
    NotFound {
        /// The missing file.
        path: PathBuf,
    },
    /// The operating system failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl KeyFileError {
    fn io(path: &Path, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::NotFound {
            return Self::NotFound {
                path: path.to_path_buf(),
            };
        }
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl From<KeyFileError> for io::Error {
    fn from(e: KeyFileError) -> Self {
        let kind = match &e {
            KeyFileError::Exists { .. } => io::ErrorKind::AlreadyExists,
            KeyFileError::TooOpen { .. } => io::ErrorKind::PermissionDenied,
            KeyFileError::NotRegular { .. } => io::ErrorKind::InvalidInput,
            KeyFileError::NotFound { .. } => io::ErrorKind::NotFound,
            KeyFileError::Io { source, .. } => source.kind(),
        };
        io::Error::new(kind, e.to_string())
    }
}

/// Creates `dir` (and missing parents) with mode 0700 if it does not exist. An existing
/// directory is left as it is; a warning is logged when group or others may write to it
/// (they could replace a file in it). Use for output directories such as `--out .`.
///
/// # Errors
/// [`KeyFileError::Io`] when the directory cannot be created, or the path is not a directory.
pub fn ensure_dir(dir: &Path) -> Result<(), KeyFileError> {
    ensure(dir, 0o022, "group/world-writable")
}

/// As [`ensure_dir`], for directories that hold private keys and state (the agent's and the
/// authority's data directories): the warning is logged when group or others have *any*
/// access to an existing directory.
///
/// # Errors
/// [`KeyFileError::Io`].
pub fn ensure_private_dir(dir: &Path) -> Result<(), KeyFileError> {
    ensure(dir, 0o077, "accessible by group or others")
}

fn ensure(dir: &Path, warn_bits: u32, what: &str) -> Result<(), KeyFileError> {
    if dir.as_os_str().is_empty() {
        return Ok(());
    }
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => {
            let mode = m.permissions().mode() & 0o7777;
            if mode & warn_bits != 0 {
                tracing::warn!(
                    dir = %dir.display(),
                    mode = format!("{mode:04o}"),
                    "directory is {what}; it was not changed (run `chmod 700` on it)"
                );
            }
            Ok(())
        }
        Ok(_) => Err(KeyFileError::Io {
            path: dir.to_path_buf(),
            source: io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists and is not a directory",
            ),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR_MODE)
            .create(dir)
            .map_err(|e| KeyFileError::io(dir, e)),
        Err(e) => Err(KeyFileError::io(dir, e)),
    }
}

/// Writes a private file (mode 0600, created with that mode).
///
/// # Errors
/// [`KeyFileError::Exists`] with [`Overwrite::Refuse`] when `path` exists; [`KeyFileError::Io`].
pub fn write_private(path: &Path, bytes: &[u8], overwrite: Overwrite) -> Result<(), KeyFileError> {
    write_file(path, bytes, PRIVATE_FILE_MODE, overwrite)
}

/// Writes `bytes` to `path` with `mode` (applied at creation). With [`Overwrite::Refuse`] the
/// final path is opened with `O_EXCL`; with [`Overwrite::Replace`] see [`replace_atomic`].
///
/// # Errors
/// [`KeyFileError::Exists`], [`KeyFileError::Io`].
pub fn write_file(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    overwrite: Overwrite,
) -> Result<(), KeyFileError> {
    match overwrite {
        Overwrite::Replace => {
            replace_atomic(path, bytes, mode).map_err(|e| KeyFileError::io(path, e))
        }
        Overwrite::Refuse => {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(path)
                .map_err(|e| {
                    if e.kind() == io::ErrorKind::AlreadyExists {
                        KeyFileError::Exists {
                            path: path.to_path_buf(),
                        }
                    } else {
                        KeyFileError::io(path, e)
                    }
                })?;
            f.write_all(bytes).map_err(|e| KeyFileError::io(path, e))?;
            f.sync_all().map_err(|e| KeyFileError::io(path, e))?;
            sync_parent(path).map_err(|e| KeyFileError::io(path, e))
        }
    }
}

/// Replaces `path` atomically: `.<name>.tmp` next to it is created with `O_EXCL` and `mode`
/// (a stale one from a crash is removed first), written, fsync'd, renamed over `path`, and the
/// directory fsync'd. A reader sees the old or the new content, never a mix, and the new file
/// never exists with a wider mode than `mode`.
///
/// # Errors
/// Any IO error; the old file is then untouched.
pub fn replace_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = parent(path);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, path)?;
    sync_parent(path)
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

fn sync_parent(path: &Path) -> io::Result<()> {
    File::open(parent(path))?.sync_all()
}

/// What `path` will name once its missing parent directories exist, found without creating
/// them: its deepest existing ancestor, then the rest with `.` and `..` resolved by hand. The
/// kernel cannot resolve `new/..` while `new` is missing, and nothing below a missing
/// directory exists, so no symlink there can change what `..` means.
///
/// Commands that create an output's missing directories check the output here first, and
/// create the directories only once every check passed, so a refused run leaves no directory
/// behind (`shoal certs`, `shoal authority keygen`, `shoal policy keygen`: `--out new/..` with
/// the files present used to create `new/` and then refuse).
pub fn path_once_created(path: &Path) -> PathBuf {
    let parts: Vec<Component<'_>> = path.components().collect();
    let mut existing = parts.len();
    while existing > 0
        && std::fs::symlink_metadata(parts[..existing].iter().collect::<PathBuf>()).is_err()
    {
        existing -= 1;
    }
    let mut out: PathBuf = parts[..existing].iter().collect();
    let mut below = 0usize;
    for part in &parts[existing..] {
        match part {
            Component::CurDir => {}
            Component::ParentDir if below > 0 => {
                out.pop();
                below -= 1;
            }
            Component::Normal(_) => {
                out.push(part);
                below += 1;
            }
            other => out.push(other),
        }
    }
    out
}

/// Reads all of `path`, but refuses (without reading further) a file of more than `limit`
/// bytes: a regular file by its size, anything else (a pipe, `/dev/zero`) once `limit + 1`
/// bytes have arrived. So memory use stays below `limit` whatever the path names.
///
/// # Errors
/// The open or read error, or [`io::ErrorKind::InvalidData`] with a message stating the limit
/// when the file is larger. The errors do not name the file: callers add it (as with
/// [`std::fs::read`]).
pub fn read_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let f = File::open(path)?;
    let meta = f.metadata()?;
    read_opened(f, &meta, limit)
}

/// Reads a state file this process wrote itself (its data directory: snapshots, the owner and
/// probe tables, the policy): as [`read_bounded`], but only a regular file (symlinks are
/// followed). The open never blocks, so a FIFO planted in the file's place cannot hang the
/// process before it serves (QA: `mkfifo data/probes.json` kept an agent from ever binding
/// its socket); a FIFO, device, socket or directory is refused unread.
///
/// # Errors
/// As [`read_bounded`], plus [`io::ErrorKind::InvalidData`] for a file that is not a regular
/// file. The errors do not name the file.
pub fn read_regular_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file (a FIFO, device, socket or directory); refusing to read it",
        ));
    }
    read_opened(f, &meta, limit)
}

fn read_opened(f: File, meta: &std::fs::Metadata, limit: u64) -> io::Result<Vec<u8>> {
    let too_large = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "larger than the {} limit for this file; refusing to read it",
                human_bytes(limit)
            ),
        )
    };
    if meta.is_file() && meta.len() > limit {
        return Err(too_large());
    }
    let hint = if meta.is_file() { meta.len() } else { 0 };
    let mut bytes = Vec::with_capacity(usize::try_from(hint.min(limit)).unwrap_or(0));
    f.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(bytes)
}

/// `1048576` -> `1 MiB (1048576 bytes)`, `1048588` -> `1 MiB + 12 bytes (1048588 bytes)`,
/// `1000` -> `1000 bytes`.
fn human_bytes(n: u64) -> String {
    const MIB: u64 = 1 << 20;
    match (n / MIB, n % MIB) {
        (0, _) => format!("{n} bytes"),
        (m, 0) => format!("{m} MiB ({n} bytes)"),
        (m, r) => format!("{m} MiB + {r} bytes ({n} bytes)"),
    }
}

/// Checks that a private key file is neither readable nor writable by group or others (a
/// root-owned file may be readable by its group, as PostgreSQL allows for its key file).
///
/// # Errors
/// [`KeyFileError::NotRegular`]; [`KeyFileError::TooOpen`]; [`KeyFileError::NotFound`] /
/// [`KeyFileError::Io`].
pub fn check_private(path: &Path) -> Result<(), KeyFileError> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(path).map_err(|e| KeyFileError::io(path, e))?;
    if !meta.is_file() {
        return Err(KeyFileError::NotRegular {
            path: path.to_path_buf(),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    // Root-owned: group read is allowed (PostgreSQL's rule; see the module docs).
    let forbidden = if meta.uid() == 0 { 0o037 } else { 0o077 };
    if mode & forbidden != 0 {
        return Err(KeyFileError::TooOpen {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// Reads a private key file after [`check_private`].
///
/// # Errors
/// As [`check_private`], or the read fails.
pub fn read_private(path: &Path) -> Result<Vec<u8>, KeyFileError> {
    check_private(path)?;
    read_bounded(path, MAX_KEY_FILE_BYTES).map_err(|e| KeyFileError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn devices_and_fifos_are_refused_without_blocking_or_chmod_advice() {
        let err = check_private(Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(err, KeyFileError::NotRegular { .. }), "{err}");
        assert!(!err.to_string().contains("chmod"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("probes.json");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Would block forever in open(2) without O_NONBLOCK (no writer ever comes).
        let err = read_regular_bounded(&fifo, 1024).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        let err = read_regular_bounded(Path::new("/dev/zero"), 1024).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        let err = read_regular_bounded(dir.path(), 1024).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        let file = dir.path().join("owners.json");
        fs::write(&file, b"[]").unwrap();
        assert_eq!(read_regular_bounded(&file, 1024).unwrap(), b"[]");
        fs::write(&file, vec![b' '; 2048]).unwrap();
        assert!(read_regular_bounded(&file, 1024).is_err());
        assert_eq!(
            read_regular_bounded(&dir.path().join("missing"), 1024)
                .unwrap_err()
                .kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn private_files_are_0600_and_never_overwritten_unless_asked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        write_private(&p, b"one", Overwrite::Refuse).unwrap();
        assert_eq!(mode(&p), 0o600);
        let err = write_private(&p, b"two", Overwrite::Refuse).unwrap_err();
        assert!(matches!(err, KeyFileError::Exists { .. }), "{err}");
        assert!(err.to_string().contains("--force"), "{err}");
        assert_eq!(fs::read(&p).unwrap(), b"one");
        // A stale temp file with a wide mode must not be reused.
        let tmp = dir.path().join(".k.tmp");
        fs::write(&tmp, b"stale").unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o666)).unwrap();
        write_private(&p, b"two", Overwrite::Replace).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(mode(&p), 0o600);
        assert!(!tmp.exists());
    }

    #[test]
    fn bounded_reads_refuse_large_and_endless_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"12345").unwrap();
        assert_eq!(read_bounded(&p, 5).unwrap(), b"12345");
        let err = read_bounded(&p, 4).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("4 bytes limit"), "{err}");
        // An endless device stops at the limit.
        let err = read_bounded(Path::new("/dev/zero"), 2 << 20).unwrap_err();
        assert!(err.to_string().contains("2 MiB (2097152 bytes)"), "{err}");
        // A huge key file is refused by size, naming the file.
        let key = dir.path().join("big-key.pem");
        write_private(&key, b"", Overwrite::Refuse).unwrap();
        File::options()
            .write(true)
            .open(&key)
            .unwrap()
            .set_len(MAX_KEY_FILE_BYTES + 1)
            .unwrap();
        let err = read_private(&key).unwrap_err().to_string();
        assert!(
            err.contains("big-key.pem") && err.contains("1 MiB"),
            "{err}"
        );
    }

    #[test]
    fn open_key_files_are_refused_and_dirs_created_0700() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        ensure_private_dir(&nested).unwrap();
        assert_eq!(mode(&nested), 0o700);
        assert_eq!(mode(&dir.path().join("a")), 0o700);
        // An existing directory is not changed.
        fs::set_permissions(&nested, fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&nested).unwrap();
        assert_eq!(mode(&nested), 0o755);
        let p = nested.join("k");
        write_private(&p, b"secret", Overwrite::Refuse).unwrap();
        assert_eq!(read_private(&p).unwrap(), b"secret");
        for bad in [0o604, 0o660, 0o644, 0o620] {
            fs::set_permissions(&p, fs::Permissions::from_mode(bad)).unwrap();
            let err = read_private(&p).unwrap_err();
            assert!(
                matches!(err, KeyFileError::TooOpen { mode, .. } if mode == bad),
                "{err}"
            );
            assert!(err.to_string().contains("chmod 600"), "{err}");
        }
        // Group read: refused unless root owns the file (PostgreSQL's rule; the Kubernetes
        // Secret projection with fsGroup). The tests run as root in CI and as a user elsewhere.
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        let root_owned = std::os::unix::fs::MetadataExt::uid(&fs::metadata(&p).unwrap()) == 0;
        assert_eq!(
            read_private(&p).is_ok(),
            root_owned,
            "0640, root-owned: {root_owned}"
        );
        fs::set_permissions(&p, fs::Permissions::from_mode(0o440)).unwrap();
        assert_eq!(
            read_private(&p).is_ok(),
            root_owned,
            "0440, root-owned: {root_owned}"
        );
        assert!(matches!(
            read_private(&nested.join("missing")),
            Err(KeyFileError::NotFound { .. })
        ));
    }
}
