//! `shoal certs ca` and `shoal certs node` check their output files before they create the
//! missing `--out` directory: `--out new/..` names files next to `new`, and a refused run leaves
//! no `new/` behind (it used to create it first and then refuse). Run as real processes.

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
