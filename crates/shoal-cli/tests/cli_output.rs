//! The `shoal` binary's output as a shell sees it, run as a real process: a reader that goes
//! away early (`| head`) ends the command quietly, and the help text's examples are accepted.

use std::process::{Command, Stdio};
use std::sync::Arc;

use shoal_catalog::snapshot::{self, Snapshot, SnapshotScope};
use shoal_catalog::testkit::Fixture;
use shoal_catalog::Catalog;
use shoal_proto::LifecycleState;

fn shoal() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shoal"))
}

/// A catalog snapshot file with a few records.
fn snapshot_file(dir: &std::path::Path) -> std::path::PathBuf {
    let f = Fixture::new();
    let mut catalog = Catalog::new();
    for i in 0..3 {
        let r = f.lifecycle(&format!("web-{i}"), 1, i + 1, LifecycleState::Ready);
        let merged = catalog.apply_lifecycle(Arc::new(r), &f.keyring);
        assert_eq!(merged, shoal_catalog::MergeOutcome::Applied);
    }
    let snap = Snapshot::of(&catalog, SnapshotScope::Catalog, f.region.clone());
    let path = dir.join("catalog.snap");
    std::fs::write(&path, snapshot::encode(&snap)).unwrap();
    path
}

#[test]
fn inspect_into_a_closed_pipe_exits_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let file = snapshot_file(dir.path());
    // Sanity: to a live pipe it prints the table.
    let out = shoal()
        .arg("snapshot")
        .arg("inspect")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("SERVICE"));
    for json in [false, true] {
        // `| head` that has already exited: the reading end is closed before the first write.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut cmd = shoal();
        if json {
            cmd.arg("--json");
        }
        let out = cmd
            .arg("snapshot")
            .arg("inspect")
            .arg(&file)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "json={json}: {stderr}");
        assert!(!stderr.contains("panicked"), "json={json}: {stderr}");
        assert!(stderr.is_empty(), "quietly: {stderr}");
    }
}

#[test]
fn the_probes_example_of_the_register_help_is_accepted() {
    let out = shoal().args(["register", "--help"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    let start = help.find("e.g. `").expect("an example") + "e.g. `".len();
    let len = help[start..].find('`').expect("closing backquote");
    let example = &help[start..start + len];
    let probes: shoal_agent::probes::ProbeSet = serde_json::from_str(example)
        .unwrap_or_else(|e| panic!("example {example:?} does not parse: {e}"));
    probes
        .validate()
        .unwrap_or_else(|e| panic!("example {example:?} is refused: {e}"));
    assert!(probes.readiness.is_some());
}

/// An error printed by `shoal` names its cause once (it used to repeat it:
/// "No such file or directory (os error 2): No such file or directory (os error 2)").
#[test]
fn errors_name_their_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nonexistent");
    let config = missing.join("agent.toml");
    let out = shoal()
        .args(["agent", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );

    // An operator command on a mistyped data dir: says so once, creates nothing.
    let out = shoal()
        .args(["authority", "snapshot", "save"])
        .arg(dir.path().join("x.snap"))
        .arg("--data-dir")
        .arg(&missing)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.matches("no replica data directory at").count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("start it"), "{stderr}");
    assert!(!missing.exists(), "created {}", missing.display());
}
