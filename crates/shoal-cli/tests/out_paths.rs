//! Commands that write key and certificate files check their outputs before they create a
//! missing `--out` directory, so a refused run leaves nothing behind (they used to create it
//! first and then refuse): `shoal authority keygen` and `shoal policy keygen` check `--out`;
//! `shoal certs ca` and `shoal certs node` check the files on the path they will have, so
//! `--out new/..` names files next to `new` and a refused run leaves no `new/`. Run as real
//! processes.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn shoal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn keygen(cmd: &str, out: &Path, force: bool) -> Output {
    let mut args = vec![cmd, "keygen", "--out", out.to_str().unwrap()];
    if force {
        args.push("--force");
    }
    shoal(&args)
}

#[test]
fn a_refused_keygen_creates_no_directory() {
    for cmd in ["authority", "policy"] {
        let tmp = tempfile::tempdir().unwrap();
        let key = tmp.path().join("k.key");
        let o = keygen(cmd, &key, false);
        assert!(o.status.success(), "{cmd}: {}", stderr(&o));
        let first = std::fs::read(&key).unwrap();

        // The same file through a directory that does not exist: refused as existing, and the
        // directory is not created (it was, before the refusal).
        let fresh = tmp.path().join("fresh");
        let o = keygen(cmd, &fresh.join("..").join("k.key"), false);
        assert!(!o.status.success(), "{cmd}: accepted");
        assert!(
            stderr(&o).contains("already exists") && stderr(&o).contains("--force"),
            "{cmd}: {}",
            stderr(&o)
        );
        assert!(!fresh.exists(), "{cmd}: the refused run created {fresh:?}");
        assert_eq!(std::fs::read(&key).unwrap(), first, "{cmd}: key changed");

        // A path that names no file, or names a directory: refused before anything is made.
        let o = keygen(cmd, &fresh.join(".."), true);
        assert!(!o.status.success(), "{cmd}: accepted");
        assert!(
            stderr(&o).contains("names no file"),
            "{cmd}: {}",
            stderr(&o)
        );
        assert!(!fresh.exists(), "{cmd}: the refused run created {fresh:?}");
        let dir = tmp.path().join("dir");
        std::fs::create_dir(&dir).unwrap();
        let o = keygen(cmd, &fresh.join("..").join("dir"), true);
        assert!(!o.status.success(), "{cmd}: accepted");
        assert!(
            stderr(&o).contains("is a directory"),
            "{cmd}: {}",
            stderr(&o)
        );
        assert!(!fresh.exists(), "{cmd}: the refused run created {fresh:?}");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "{cmd}: {dir:?} written"
        );

        // Missing directories of an accepted run are still created, 0700.
        let nested = tmp.path().join("a/b/k.key");
        let o = keygen(cmd, &nested, false);
        assert!(o.status.success(), "{cmd}: {}", stderr(&o));
        let mode = std::fs::metadata(tmp.path().join("a/b"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{cmd}");
        // And `--force` still replaces through a missing directory's `..`.
        let o = keygen(cmd, &tmp.path().join("new/../k.key"), true);
        assert!(o.status.success(), "{cmd}: {}", stderr(&o));
        assert_ne!(std::fs::read(&key).unwrap(), first, "{cmd}: not replaced");
    }
}

fn ca(out: &Path) -> Output {
    shoal(&[
        "certs",
        "ca",
        "--region",
        "dev",
        "--out",
        out.to_str().unwrap(),
    ])
}

fn node(out: &Path) -> Output {
    shoal(&[
        "certs",
        "node",
        "--node-id",
        "n1",
        "--region",
        "dev",
        "--out",
        out.to_str().unwrap(),
    ])
}

#[test]
fn a_refused_certs_run_through_a_missing_directory_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let o = ca(tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let o = node(tmp.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let files = [
        "dev-ca.pem",
        "dev-ca-key.pem",
        "dev-node-n1.pem",
        "dev-node-n1-key.pem",
    ];
    let before: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(tmp.path().join(f)).unwrap())
        .collect();

    // The same files through a directory that does not exist: refused as existing, and the
    // directory is not created.
    let fresh = tmp.path().join("fresh");
    for (what, o) in [
        ("ca", ca(&fresh.join(".."))),
        ("node", node(&fresh.join(".."))),
    ] {
        assert!(!o.status.success(), "{what}: accepted");
        assert!(
            stderr(&o).contains("already exists") && stderr(&o).contains("--force"),
            "{what}: {}",
            stderr(&o)
        );
        assert!(!fresh.exists(), "{what}: the refused run created {fresh:?}");
    }
    for (f, old) in files.iter().zip(&before) {
        assert_eq!(
            &std::fs::read(tmp.path().join(f)).unwrap(),
            old,
            "{f} changed"
        );
    }

    // Through a missing directory whose files do not exist yet: the directory is created and
    // the node certificate is signed by the CA next to it.
    std::fs::remove_file(tmp.path().join("dev-node-n1.pem")).unwrap();
    std::fs::remove_file(tmp.path().join("dev-node-n1-key.pem")).unwrap();
    let o = node(&fresh.join(".."));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(fresh.is_dir());
    assert!(tmp.path().join("dev-node-n1.pem").exists());
}
