//! Key files written by the CLI: mode 0600 in 0700 directories, no overwrite without
//! `--force`, and a private key readable by others refused at load (agent start).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn shoal(args: &[&str]) -> Output {
    Command::new(common::shoal_bin())
        .args(args)
        .output()
        .unwrap()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `shoal certs node --node-id ID --region eu --out OUT`.
fn node_args<'a>(id: &'a str, out: &'a str) -> [&'a str; 8] {
    [
        "certs",
        "node",
        "--node-id",
        id,
        "--region",
        "eu",
        "--out",
        out,
    ]
}

#[test]
fn keygen_and_certs_write_private_files_and_refuse_to_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("keys/region");
    let key = dir.join("region.key");
    let key_s = key.to_str().unwrap();

    let o = shoal(&["authority", "keygen", "--out", key_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(mode(&key), 0o600);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&tmp.path().join("keys")), 0o700);
    let first = std::fs::read(&key).unwrap();

    let o = shoal(&["authority", "keygen", "--out", key_s]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("region.key") && stderr(&o).contains("--force"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read(&key).unwrap(),
        first,
        "refused run left the key alone"
    );

    let o = shoal(&["authority", "keygen", "--out", key_s, "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_ne!(std::fs::read(&key).unwrap(), first);
    assert_eq!(mode(&key), 0o600);

    let out = tmp.path().join("pki");
    let out_s = out.to_str().unwrap();
    let o = shoal(&["certs", "ca", "--region", "eu", "--out", out_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(mode(&out), 0o700);
    assert_eq!(mode(&out.join("eu-ca-key.pem")), 0o600);
    assert_eq!(mode(&out.join("eu-ca.pem")), 0o644);
    let o = shoal(&["certs", "ca", "--region", "eu", "--out", out_s]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("eu-ca.pem"), "{}", stderr(&o));

    let node = node_args("n1", out_s);
    let o = shoal(&node);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(mode(&out.join("eu-node-n1-key.pem")), 0o600);
    let cert = std::fs::read(out.join("eu-node-n1.pem")).unwrap();
    let o = shoal(&node);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("eu-node-n1.pem"), "{}", stderr(&o));
    let mut forced = node.to_vec();
    forced.push("--force");
    let o = shoal(&forced);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_ne!(std::fs::read(out.join("eu-node-n1.pem")).unwrap(), cert);
    assert_eq!(mode(&out.join("eu-node-n1-key.pem")), 0o600);

    // A CA key readable by others is refused when signing.
    std::fs::set_permissions(
        out.join("eu-ca-key.pem"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let o = shoal(&node_args("n2", out_s));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("eu-ca-key.pem") && stderr(&o).contains("chmod 600"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn an_agent_refuses_a_tls_key_readable_by_others() {
    let mut c = common::Cluster::new(36, 1);
    let key = c.tmp.path().join("dev-node-node-a-key.pem");
    // Readable by others (0640 would be accepted from a root-owned file, as PostgreSQL does).
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    c.agents[0].start();
    let mut child = c.agents[0].child.take().unwrap();
    let status = common::eventually(
        std::time::Duration::from_secs(20),
        "the agent exits",
        || child.try_wait().unwrap(),
    );
    assert!(!status.success());
    let log = c.agents[0].log();
    assert!(
        log.contains("dev-node-node-a-key.pem") && log.contains("0644"),
        "{log}"
    );
}

/// `ensure_dir` warns through `tracing` about an output directory that group or others can
/// write; the CLI must show that warning (it installed no log subscriber, so it was lost).
#[test]
fn certs_and_keygen_warn_about_an_output_dir_others_can_write() {
    let tmp = tempfile::tempdir().unwrap();
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let open_s = open.to_str().unwrap();
    let warned = |o: &Output| {
        let e = stderr(o);
        assert!(o.status.success(), "{e}");
        assert!(
            e.contains("WARN") && e.contains("group/world-writable") && e.contains(open_s),
            "no warning naming {open_s}: {e}"
        );
        assert!(e.contains("0777"), "{e}");
    };
    warned(&shoal(&["certs", "ca", "--region", "eu", "--out", open_s]));
    warned(&shoal(&node_args("n1", open_s)));
    let key = open.join("region.key");
    warned(&shoal(&[
        "authority",
        "keygen",
        "--out",
        key.to_str().unwrap(),
    ]));
    // The directory was reported, not changed.
    assert_eq!(mode(&open), 0o777);
    // A private directory gets no warning.
    let o = shoal(&[
        "certs",
        "ca",
        "--region",
        "eu",
        "--out",
        tmp.path().join("private").to_str().unwrap(),
    ]);
    assert!(
        o.status.success() && !stderr(&o).contains("WARN"),
        "{}",
        stderr(&o)
    );
}

/// A refused `certs ca` leaves nothing behind: with the certificate path taken (here by a
/// dangling symlink, which `exists()` does not see) the key used to be written first, so the
/// re-run after removing the symlink failed on the key.
#[test]
fn a_refused_certs_ca_writes_nothing_and_can_be_rerun() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path();
    let out_s = out.to_str().unwrap();
    std::os::unix::fs::symlink(out.join("elsewhere.pem"), out.join("dev-ca.pem")).unwrap();
    let o = shoal(&["certs", "ca", "--region", "dev", "--out", out_s]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("dev-ca.pem"), "{}", stderr(&o));
    assert!(
        std::fs::symlink_metadata(out.join("dev-ca-key.pem")).is_err(),
        "the refused run left dev-ca-key.pem behind"
    );
    std::fs::remove_file(out.join("dev-ca.pem")).unwrap();
    let o = shoal(&["certs", "ca", "--region", "dev", "--out", out_s]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Every command that reads a file bounds the read: an endless input fails fast, naming the
/// file and the limit, instead of growing without bound (each grew to 2+ GB before).
#[test]
fn file_reading_commands_refuse_an_endless_input() {
    let tmp = tempfile::tempdir().unwrap();
    let dummy = tmp.path().join("none.pem");
    let dummy = dummy.to_str().unwrap();
    let data_dir = tmp.path().join("data");
    let cases: [(&[&str], &str); 5] = [
        (
            &[
                "policy",
                "push",
                "/dev/zero",
                "--addr",
                "127.0.0.1:9",
                "--ca",
                dummy,
                "--cert",
                dummy,
                "--key",
                dummy,
            ],
            "4 MiB",
        ),
        (&["snapshot", "inspect", "/dev/zero"], "512 MiB"),
        (&["agent", "--config", "/dev/zero"], "1 MiB"),
        (
            &[
                "authority",
                "snapshot",
                "restore",
                "/dev/zero",
                "--data-dir",
                data_dir.to_str().unwrap(),
            ],
            "256 MiB",
        ),
        (
            &[
                "authority",
                "status",
                "--addr",
                "127.0.0.1:9",
                "--ca",
                "/dev/zero",
                "--cert",
                dummy,
                "--key",
                dummy,
            ],
            "1 MiB",
        ),
    ];
    for (args, limit) in cases {
        let o = shoal(args);
        let e = stderr(&o);
        assert!(!o.status.success(), "{args:?}: {e}");
        assert!(
            e.contains("/dev/zero") && e.contains(limit) && e.contains("limit"),
            "{args:?}: {e}"
        );
    }
    assert!(!data_dir.exists(), "a refused restore created the data dir");
}
