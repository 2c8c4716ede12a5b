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

    let node = [
        "certs",
        "node",
        "--node-id",
        "n1",
        "--region",
        "eu",
        "--out",
        out_s,
    ];
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
    let o = shoal(&[
        "certs",
        "node",
        "--node-id",
        "n2",
        "--region",
        "eu",
        "--out",
        out_s,
    ]);
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
