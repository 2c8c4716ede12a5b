//! Cross-process tests: three real `shoal-authority` processes on 127.0.0.x loopback addresses
//! with certificates generated in a temp dir. No fixed sleeps: every wait polls with a deadline.

use shoal_transport::keyfile::Overwrite;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_authority_server::client::AuthorityClient;
use shoal_authority_server::config::to_hex;
use shoal_authority_server::storage;
use shoal_catalog::verify::Keyring;
use shoal_catalog::{Catalog, MergeOutcome};
use shoal_proto::rpc::{AuthorityError, AuthorityOk, AuthorityRequestBody, AuthorityStatus};
use shoal_proto::{
    Generation, LifecycleState, NodeId, Region, ServiceKey, SignedLifecycle, SigningKey,
    TransitionReason,
};
use shoal_transport::certs::{generate_ca, generate_node_cert, CertPair, ExtraSans, Validity};

const BIN: &str = env!("CARGO_BIN_EXE_shoal-authority");

struct Node {
    id: u64,
    dir: PathBuf,
    config: PathBuf,
    rpc: SocketAddr,
    child: Option<Child>,
}

struct Cluster {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    nodes: Vec<Node>,
    key: SigningKey,
    ca: CertPair,
    region: Region,
}

fn free_port(ip: &str) -> u16 {
    UdpSocket::bind(format!("{ip}:0"))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn write_pair(dir: &Path, name: &str, p: &CertPair) -> (PathBuf, PathBuf) {
    let c = dir.join(format!("{name}.pem"));
    let k = dir.join(format!("{name}.key"));
    std::fs::write(&c, &p.cert_pem).unwrap();
    shoal_transport::keyfile::write_private(&k, p.key_pem.as_bytes(), Overwrite::Refuse).unwrap();
    (c, k)
}

impl Cluster {
    fn new(n: usize, snapshot_every: u64) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let region: Region = "test-1".parse().unwrap();
        let ca = generate_ca(&region, Validity::from_now(Duration::from_secs(3600))).unwrap();
        std::fs::write(root.join("ca.pem"), &ca.cert_pem).unwrap();
        let key = SigningKey::from_seed([9; 32]);
        shoal_transport::keyfile::write_private(
            &root.join("region.key"),
            to_hex(&[9; 32]).as_bytes(),
            Overwrite::Refuse,
        )
        .unwrap();
        let base = 20 + (std::process::id() % 200) as u8;
        let addrs: Vec<(String, u16, u16)> = (0..n)
            .map(|i| {
                let ip = format!("127.0.0.{}", base + i as u8);
                let a = free_port(&ip);
                let b = free_port(&ip);
                (ip, a, b)
            })
            .collect();
        let mut members = String::new();
        for (i, (ip, r, p)) in addrs.iter().enumerate() {
            members.push_str(&format!(
                "[[members]]\nid = {}\nnode = \"auth-{}\"\nraft_addr = \"{ip}:{r}\"\nrpc_addr = \"{ip}:{p}\"\n\n",
                i + 1,
                i + 1
            ));
        }
        let mut nodes = Vec::new();
        for (i, (ip, _, p)) in addrs.iter().enumerate() {
            let id = i as u64 + 1;
            let dir = root.join(format!("auth-{id}"));
            std::fs::create_dir_all(&dir).unwrap();
            let node: NodeId = format!("auth-{id}").parse().unwrap();
            let pair = generate_node_cert(
                &ca,
                &node,
                &region,
                &ExtraSans::default(),
                Validity::from_now(Duration::from_secs(3600)),
            )
            .unwrap();
            let (c, k) = write_pair(&root, &format!("auth-{id}"), &pair);
            let config = root.join(format!("auth-{id}.toml"));
            std::fs::write(
                &config,
                format!(
                    "id = {id}\nregion = \"test-1\"\ndata_dir = \"{}\"\ntls = {{ ca = \"{}\", cert = \"{}\", key = \"{}\" }}\n\
                     signing_key = \"{}\"\nheartbeat_ms = 100\nelection_timeout_ms = 500\nwrite_timeout_ms = 2000\n\
                     quorum_stale_ms = 1000\nsnapshot_every_logs = {snapshot_every}\nkeep_logs_after_snapshot = 5\n\n{members}",
                    dir.join("data").display(),
                    root.join("ca.pem").display(),
                    c.display(),
                    k.display(),
                    root.join("region.key").display(),
                ),
            )
            .unwrap();
            nodes.push(Node {
                id,
                dir,
                config,
                rpc: format!("{ip}:{p}").parse().unwrap(),
                child: None,
            });
        }
        Self {
            _tmp: tmp,
            root,
            nodes,
            key,
            ca,
            region,
        }
    }

    fn start(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(n.dir.join("stderr.log"))
            .unwrap();
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(&n.config)
            .env("RUST_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        n.child = Some(child);
    }

    /// As [`Cluster::start`], but SIGXFSZ is ignored (a disposition kept across `exec`) and
    /// stderr reaches `stderr.log` through a pipe: a file-size limit set later with
    /// [`Cluster::limit_file_size`] then makes each write past it fail with `EFBIG`, the way a
    /// full disk fails it with `ENOSPC` (the same `io::Error` path in the replica; no mount, no
    /// root), instead of killing the process, while the replica's own log stays writable.
    fn start_limitable(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(n.dir.join("stderr.log"))
            .unwrap();
        let mut child = Command::new("sh")
            .args([
                "-c",
                "trap '' XFSZ; exec \"$0\" \"$@\"",
                BIN,
                "run",
                "--config",
            ])
            .arg(&n.config)
            .env("RUST_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = child.stderr.take().unwrap();
        std::thread::spawn(move || std::io::copy(&mut err, &mut log));
        n.child = Some(child);
    }

    /// Sets the soft `RLIMIT_FSIZE` of running replica `i` (`None`: unlimited again), with
    /// util-linux `prlimit`; the hard limit stays unlimited, so no privilege is needed.
    fn limit_file_size(&self, i: usize, bytes: Option<u64>) {
        let pid = self.nodes[i].child.as_ref().unwrap().id();
        let soft = bytes.map_or("unlimited".to_owned(), |b| b.to_string());
        let out = Command::new("prlimit")
            .arg(format!("--pid={pid}"))
            .arg(format!("--fsize={soft}:unlimited"))
            .output()
            .expect("prlimit (util-linux) runs");
        assert!(
            out.status.success(),
            "prlimit: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Waits (bounded) for replica `i`'s process to exit by itself; its exit status.
    async fn wait_exit(&mut self, i: usize, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            let child = self.nodes[i].child.as_mut().expect("running");
            if let Some(status) = child.try_wait().unwrap() {
                self.nodes[i].child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "auth-{} still runs after {within:?}",
                i + 1
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn client(&self, node: &str) -> AuthorityClient {
        let node: NodeId = node.parse().unwrap();
        let pair = generate_node_cert(
            &self.ca,
            &node,
            &self.region,
            &ExtraSans::default(),
            Validity::from_now(Duration::from_secs(3600)),
        )
        .unwrap();
        AuthorityClient::connect(
            "127.0.0.1:0".parse().unwrap(),
            &self.ca.cert_pem,
            &pair.cert_pem,
            &pair.key_pem,
        )
        .unwrap()
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.rpc).collect()
    }

    fn dump_logs(&self) {
        for n in &self.nodes {
            let t = std::fs::read_to_string(n.dir.join("stderr.log")).unwrap_or_default();
            let tail: Vec<&str> = t.lines().rev().take(30).collect();
            eprintln!("---- auth-{} ----", n.id);
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
        let _ = &self.root;
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

async fn status(c: &AuthorityClient, addr: SocketAddr) -> Option<AuthorityStatus> {
    match c
        .call(
            addr,
            AuthorityRequestBody::Status,
            Duration::from_millis(500),
        )
        .await
    {
        Ok(Ok(AuthorityOk::Status(s))) => Some(s),
        _ => None,
    }
}

/// Polls until every live replica in `live` agrees on one leader among them; returns its index.
async fn wait_leader(cl: &Cluster, c: &AuthorityClient, live: &[usize], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let mut leaders = Vec::new();
        for &i in live {
            leaders.push(status(c, cl.nodes[i].rpc).await.and_then(|s| s.leader));
        }
        if let Some(Some(l)) = leaders.first() {
            if leaders.iter().all(|x| x.as_ref() == Some(l)) {
                let idx = cl
                    .nodes
                    .iter()
                    .position(|n| format!("auth-{}", n.id) == l.as_str())
                    .unwrap();
                if live.contains(&idx) {
                    return idx;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no agreed leader within {within:?}: {leaders:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn key() -> ServiceKey {
    "prod/payments/http".parse().unwrap()
}

fn register(i: u32) -> AuthorityRequestBody {
    AuthorityRequestBody::Register {
        key: key(),
        instance: format!("pay-{i}").parse().unwrap(),
        on_node: None,
        endpoint: shoal_catalog::testkit::Fixture::spec(i),
        lease_ms: 60_000,
    }
}

fn transition(i: u32, generation: Generation, to: LifecycleState) -> AuthorityRequestBody {
    let reason = match to {
        LifecycleState::Ready => TransitionReason::ReadinessPassed,
        LifecycleState::Draining => TransitionReason::DrainRequested,
        _ => TransitionReason::Deregistered,
    };
    AuthorityRequestBody::Transition {
        key: key(),
        instance: format!("pay-{i}").parse().unwrap(),
        generation,
        to,
        reason,
    }
}

fn committed(r: Result<AuthorityOk, AuthorityError>) -> Vec<SignedLifecycle> {
    match r {
        Ok(AuthorityOk::Committed { records }) => records,
        other => panic!("expected Committed, got {other:?}"),
    }
}

const BUDGET: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_authorities_failover_quorum_loss_and_stale_generations() {
    let mut cl = Cluster::new(3, 20);
    for i in 0..3 {
        cl.start(i);
    }
    let c = cl.client("node-a");
    let all = [0, 1, 2];
    let leader = wait_leader(&cl, &c, &all, Duration::from_secs(20)).await;
    let addrs = cl.addrs();
    let vk = cl.key.verifying_key();

    // Writes commit, signed by the region key, revisions increasing.
    let mut accepted: Vec<SignedLifecycle> = Vec::new();
    let mut gens = Vec::new();
    for i in 0..10 {
        let r = committed(c.write(&addrs, register(i), BUDGET).await);
        assert_eq!(r[0].record.state, LifecycleState::Starting);
        vk.verify_lifecycle(&r[0]).unwrap();
        gens.push(r[0].record.generation);
        accepted.extend(r);
        let r = committed(
            c.write(
                &addrs,
                transition(i, gens[i as usize], LifecycleState::Ready),
                BUDGET,
            )
            .await,
        );
        vk.verify_lifecycle(&r[0]).unwrap();
        accepted.extend(r);
    }
    let revs: Vec<u64> = accepted.iter().map(|r| r.record.revision.0).collect();
    assert!(revs.windows(2).all(|w| w[0] < w[1]), "{revs:?}");

    // A follower answers NotLeader naming the leader's RPC address.
    let follower = (leader + 1) % 3;
    match c
        .call(
            cl.nodes[follower].rpc,
            transition(0, gens[0], LifecycleState::Draining),
            Duration::from_secs(3),
        )
        .await
        .unwrap()
    {
        Err(AuthorityError::NotLeader { leader: Some(l) }) => {
            assert_eq!(l, cl.nodes[leader].rpc.to_string())
        }
        other => panic!("expected NotLeader, got {other:?}"),
    }

    // Kill the leader: a new one is elected and writes continue.
    cl.kill(leader);
    let live: Vec<usize> = all.iter().copied().filter(|&i| i != leader).collect();
    let leader2 = wait_leader(&cl, &c, &live, Duration::from_secs(20)).await;
    assert_ne!(leader2, leader);
    let max_before = *revs.last().unwrap();
    // No accepted transition lost: re-asking READY returns the very record accepted before.
    for i in 0..10u32 {
        let r = committed(
            c.write(
                &addrs,
                transition(i, gens[i as usize], LifecycleState::Ready),
                BUDGET,
            )
            .await,
        );
        assert_eq!(r[0], accepted[(2 * i + 1) as usize], "instance {i}");
    }
    let r = committed(
        c.write(
            &addrs,
            transition(0, gens[0], LifecycleState::Draining),
            BUDGET,
        )
        .await,
    );
    assert!(
        r[0].record.revision.0 > max_before,
        "revisions stay monotonic"
    );
    vk.verify_lifecycle(&r[0]).unwrap();

    // A delayed request from an older generation is refused and never resurrects.
    let new_gen = committed(c.write(&addrs, register(1), BUDGET).await)[0]
        .record
        .generation;
    assert!(new_gen > gens[1]);
    match c
        .write(
            &addrs,
            transition(1, gens[1], LifecycleState::Draining),
            BUDGET,
        )
        .await
    {
        Err(AuthorityError::Refused { code, .. }) => assert_eq!(code, "stale_generation"),
        other => panic!("expected a stale_generation refusal, got {other:?}"),
    }

    // Restart the old leader: it rejoins and converges.
    cl.start(leader);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s: Vec<_> = futures_join(&c, &cl, &all).await;
        let applied: Vec<Option<u64>> =
            s.iter().map(|x| x.as_ref().map(|s| s.revision.0)).collect();
        if applied.iter().all(|a| a.is_some() && *a == applied[0]) {
            break;
        }
        assert!(Instant::now() < deadline, "no convergence: {applied:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Stop 2 of 3 (both followers): the leader answers NoQuorum within a bound.
    let leader3 = wait_leader(&cl, &c, &all, Duration::from_secs(20)).await;
    let others: Vec<usize> = all.iter().copied().filter(|&i| i != leader3).collect();
    for &i in &others {
        cl.kill(i);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let t = Instant::now();
        let r = c
            .call(
                cl.nodes[leader3].rpc,
                transition(2, gens[2], LifecycleState::Draining),
                Duration::from_secs(5),
            )
            .await;
        let took = t.elapsed();
        match r {
            Ok(Err(AuthorityError::NoQuorum)) => {
                assert!(
                    took < Duration::from_millis(2_500),
                    "NoQuorum took {took:?}"
                );
                break;
            }
            Ok(Err(AuthorityError::NotLeader { .. })) | Err(_) => {}
            Ok(Ok(_)) => {} // committed before the followers' loss was noticed
            Ok(other) => panic!("unexpected {other:?}"),
        }
        assert!(Instant::now() < deadline, "never answered NoQuorum");
    }
    // Restart them: writes commit again.
    for &i in &others {
        cl.start(i);
    }
    let r = c
        .write(
            &addrs,
            transition(3, gens[3], LifecycleState::Draining),
            Duration::from_secs(30),
        )
        .await;
    committed(r);

    // Snapshots were built (every 20 entries) and can be saved; a snapshot is a valid state.
    let snap = cl.root.join("saved.snapshot");
    let data = cl.nodes[leader3].dir.join("data");
    let deadline = Instant::now() + Duration::from_secs(10);
    while storage::save_snapshot(&data, &snap, Duration::from_secs(5), false).is_err() {
        assert!(Instant::now() < deadline, "no snapshot");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The data directory holds every command (service keys, addresses, callers'
    // executables): created 0700, every file in it 0600.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&data), 0o700, "{}", data.display());
        for entry in std::fs::read_dir(&data).unwrap() {
            let p = entry.unwrap().path();
            if p.is_file() {
                assert_eq!(mode(&p), 0o600, "{}", p.display());
            }
        }
        for f in ["raft.log", "replica.lock", "audit.log", "snapshot.bin"] {
            assert!(data.join(f).exists(), "{f}");
        }
    }
    c.shutdown().await;
}

async fn futures_join(
    c: &AuthorityClient,
    cl: &Cluster,
    idx: &[usize],
) -> Vec<Option<AuthorityStatus>> {
    let mut out = Vec::new();
    for &i in idx {
        out.push(status(c, cl.nodes[i].rpc).await);
    }
    out
}

/// An authority restored from an older snapshot starts a new incarnation whose revisions are
/// above the floor (default: the backup's head plus the margin), so an agent holding the newer
/// pre-restore records applies what it signs afterwards instead of dropping it as stale.
/// (Before issue 14 the restored authority re-issued lower revisions, which agents dropped.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_older_snapshot_signs_above_the_floor_and_agents_apply_it() {
    let mut cl = Cluster::new(1, 5);
    cl.start(0);
    let c = cl.client("node-b");
    let addrs = cl.addrs();
    wait_leader(&cl, &c, &[0], Duration::from_secs(20)).await;
    let mut keyring = Keyring::new();
    keyring.trust_authority(cl.region.clone(), cl.key.verifying_key());
    let mut catalog = Catalog::new();

    let mut gens = Vec::new();
    for i in 0..4 {
        let r = committed(c.write(&addrs, register(i), BUDGET).await);
        gens.push(r[0].record.generation);
        for rec in r {
            assert_eq!(
                catalog.apply_lifecycle(Arc::new(rec), &keyring),
                MergeOutcome::Applied
            );
        }
    }
    // Wait for a snapshot covering the registrations, and save it (the "older" snapshot).
    let data = cl.nodes[0].dir.join("data");
    let old = cl.root.join("old.snapshot");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(meta) = storage::save_snapshot(&data, &old, Duration::from_secs(5), true) {
            if meta.last_log_id.is_some_and(|l| l.index >= 4) {
                break;
            }
        }
        assert!(Instant::now() < deadline, "no snapshot");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Newer state: READY then DRAINING for every instance, held by the agent's catalog.
    for i in 0..4u32 {
        for to in [LifecycleState::Ready, LifecycleState::Draining] {
            for rec in committed(
                c.write(&addrs, transition(i, gens[i as usize], to), BUDGET)
                    .await,
            ) {
                assert_eq!(
                    catalog.apply_lifecycle(Arc::new(rec), &keyring),
                    MergeOutcome::Applied
                );
            }
        }
    }
    // Disaster recovery from the older snapshot.
    cl.kill(0);
    let opts = storage::RestoreOptions {
        force_new_cluster: true,
        ..Default::default()
    };
    let refused = storage::restore_snapshot(&data, &old, &storage::RestoreOptions::default());
    assert!(
        refused.is_err(),
        "a cluster's data dir needs force_new_cluster"
    );
    let report = storage::restore_snapshot(&data, &old, &opts).unwrap();
    assert!(report.floor >= storage::DEFAULT_RESTORE_MARGIN);
    cl.start(0);
    wait_leader(&cl, &c, &[0], Duration::from_secs(20)).await;
    let mut checked = 0;
    // The restored authority thinks the instances are STARTING/READY; what it signs now is
    // above every revision the agent holds, so the agent applies it.
    for i in 0..4u32 {
        let r = c
            .write(
                &addrs,
                transition(i, gens[i as usize], LifecycleState::Ready),
                BUDGET,
            )
            .await;
        if let Ok(AuthorityOk::Committed { records }) = r {
            for rec in records {
                let out = catalog.apply_lifecycle(Arc::new(rec.clone()), &keyring);
                assert!(rec.record.revision.0 > report.floor, "{:?}", rec.record);
                assert_eq!(
                    out,
                    MergeOutcome::Applied,
                    "instance {i}: record at revision {} was {out:?}",
                    rec.record.revision.0
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 1,
        "the restored authority signed nothing to compare"
    );
    c.shutdown().await;
}

fn log_of(cl: &Cluster, i: usize) -> String {
    std::fs::read_to_string(cl.nodes[i].dir.join("stderr.log")).unwrap_or_default()
}

fn hup(cl: &Cluster, i: usize) {
    let pid = cl.nodes[i].child.as_ref().unwrap().id();
    let ok = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

async fn wait_log(cl: &Cluster, i: usize, needle: &str, times: usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while log_of(cl, i).matches(needle).count() < times {
        assert!(Instant::now() < deadline, "no {needle:?} in the log");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_reloads_its_certificate_on_sighup() {
    let mut cl = Cluster::new(1, 100);
    cl.start(0);
    let rpc = cl.nodes[0].rpc;
    let old = cl.client("op-1");
    wait_leader(&cl, &old, &[0], Duration::from_secs(20)).await;
    let first = old.transport().peer_certificate(rpc).unwrap();

    // Same CA, new certificate (another serial, a longer validity).
    let pair = generate_node_cert(
        &cl.ca,
        &"auth-1".parse().unwrap(),
        &cl.region,
        &ExtraSans::default(),
        Validity::from_now(Duration::from_secs(7200)),
    )
    .unwrap();
    let replace = |name: &str, bytes: &str| {
        shoal_transport::keyfile::write_private(
            &cl.root.join(name),
            bytes.as_bytes(),
            Overwrite::Replace,
        )
        .unwrap()
    };
    replace("auth-1.key", &pair.key_pem);
    replace("auth-1.pem", &pair.cert_pem);
    hup(&cl, 0);
    wait_log(&cl, 0, "TLS certificate, key and CA bundle reloaded", 1).await;

    let new = cl.client("op-2");
    assert!(status(&new, rpc).await.is_some());
    let second = new.transport().peer_certificate(rpc).unwrap();
    assert_ne!(second.serial, first.serial);
    assert!(second.not_after > first.not_after + Duration::from_secs(3000));
    // The connection made before the reload still answers, on the old certificate.
    assert!(status(&old, rpc).await.is_some());
    assert_eq!(
        old.transport().peer_certificate(rpc).unwrap().serial,
        first.serial
    );

    // Another node's certificate: refused, the rotated one stays.
    let other = generate_node_cert(
        &cl.ca,
        &"auth-9".parse().unwrap(),
        &cl.region,
        &ExtraSans::default(),
        Validity::from_now(Duration::from_secs(3600)),
    )
    .unwrap();
    replace("auth-1.key", &other.key_pem);
    replace("auth-1.pem", &other.cert_pem);
    hup(&cl, 0);
    wait_log(&cl, 0, "TLS reload refused", 1).await;
    let third = cl.client("op-3");
    assert!(status(&third, rpc).await.is_some());
    assert_eq!(
        third.transport().peer_certificate(rpc).unwrap().serial,
        second.serial
    );
    for c in [old, new, third] {
        c.shutdown().await;
    }
}

/// Registers `pay-<i>` and makes it READY; the generation and the READY record acknowledged.
async fn register_ready(
    c: &AuthorityClient,
    addrs: &[SocketAddr],
    i: u32,
) -> (Generation, SignedLifecycle) {
    let generation = committed(c.write(addrs, register(i), BUDGET).await)[0]
        .record
        .generation;
    let ready = committed(
        c.write(
            addrs,
            transition(i, generation, LifecycleState::Ready),
            BUDGET,
        )
        .await,
    );
    (generation, ready[0].clone())
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// The `log_index` of every audit entry line of a replica's `audit.log`, and the revisions
/// they name (other lines skipped).
fn audited(cl: &Cluster, i: usize) -> (Vec<u64>, Vec<u64>) {
    let text = std::fs::read_to_string(cl.nodes[i].dir.join("data/audit.log")).unwrap_or_default();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let idx = lines
        .iter()
        .filter_map(|v| v["log_index"].as_u64())
        .collect();
    let revs = lines
        .iter()
        .filter_map(|v| v["revision"].as_u64())
        .collect();
    (idx, revs)
}

fn assert_each_once(what: &str, idx: &[u64]) {
    let mut sorted = idx.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        idx.len(),
        "{what}: an index audited twice: {idx:?}"
    );
    assert_eq!(sorted, idx, "{what}: audit.log out of log order: {idx:?}");
}

/// Polls until all of `idx` answer with one leader, one applied index and one revision.
async fn wait_converged(cl: &Cluster, c: &AuthorityClient, idx: &[usize], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let s = futures_join(c, cl, idx).await;
        let views: Vec<Option<(Option<String>, u64, u64)>> = s
            .iter()
            .map(|x| {
                x.as_ref().map(|s| {
                    (
                        s.leader.as_ref().map(|l| l.as_str().to_owned()),
                        s.applied_index,
                        s.revision.0,
                    )
                })
            })
            .collect();
        if views[0].as_ref().is_some_and(|v| v.0.is_some()) && views.iter().all(|v| v == &views[0])
        {
            return;
        }
        assert!(Instant::now() < deadline, "no convergence: {views:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// QA finding A: a full disk stopped a replica's Raft core (openraft stops for good on a
/// storage error) while the process stayed up, still reporting the leader it had been, and
/// nothing restarted it. Now the replica exits non-zero with the cause as soon as its core
/// stops, the others go on, and a restart (what systemd / Kubernetes do) recovers it with every
/// acknowledged write. The leader is the one whose disk fills: the worst case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_disk_fills_exits_and_a_restart_recovers_every_acknowledged_write() {
    let mut cl = Cluster::new(3, 1000);
    for i in 0..3 {
        cl.start_limitable(i);
    }
    let c = cl.client("node-a");
    let all = [0, 1, 2];
    let full = wait_leader(&cl, &c, &all, Duration::from_secs(20)).await;
    let addrs = cl.addrs();
    let mut acked = Vec::new();
    for i in 0..5 {
        acked.push(register_ready(&c, &addrs, i).await);
    }

    // The leader's raft.log may grow by 100 more bytes: the next append is torn and fails.
    let data = cl.nodes[full].dir.join("data");
    cl.limit_file_size(full, Some(file_len(&data.join("raft.log")) + 100));
    acked.push(register_ready(&c, &addrs, 5).await);
    let exit = cl.wait_exit(full, Duration::from_secs(30)).await;
    assert!(!exit.success(), "auth-{} exited {exit}", full + 1);
    let log = log_of(&cl, full);
    assert!(
        log.contains("the Raft core stopped") && log.contains("File too large"),
        "the replica's last words name the cause:\n{log}"
    );
    // The other two go on (the client skips the address that no longer answers).
    let others: Vec<usize> = all.iter().copied().filter(|&i| i != full).collect();
    let leader = wait_leader(&cl, &c, &others, Duration::from_secs(20)).await;
    assert_ne!(leader, full);
    let live: Vec<SocketAddr> = others.iter().map(|&i| cl.nodes[i].rpc).collect();
    for i in 6..15 {
        acked.push(register_ready(&c, &live, i).await);
    }

    // Restarted with room on its disk: it rejoins and holds everything acknowledged.
    cl.start(full);
    wait_converged(&cl, &c, &all, Duration::from_secs(30)).await;
    for (i, (generation, ready)) in acked.iter().enumerate() {
        let r = committed(
            c.write(
                &addrs,
                transition(i as u32, *generation, LifecycleState::Ready),
                BUDGET,
            )
            .await,
        );
        assert_eq!(&r[0], ready, "pay-{i}: the acknowledged READY record");
    }
    // Its audit.log too: the lines it could not write before it exited are re-derived from
    // the log at the restart, each index once.
    wait_converged(&cl, &c, &all, Duration::from_secs(30)).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (theirs, _) = audited(&cl, leader);
        let (mine, revs) = audited(&cl, full);
        if mine == theirs {
            assert_each_once("restarted replica", &mine);
            for (_, ready) in &acked {
                assert!(
                    revs.contains(&ready.record.revision.0),
                    "{ready:?} not audited"
                );
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "audit.log of auth-{}: {mine:?}\nauth-{}: {theirs:?}",
            full + 1,
            leader + 1
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.shutdown().await;
}

/// QA finding B: a leader whose audit.log could not be appended to (a full disk) went on
/// acknowledging writes and dropped their audit lines, silently. Now it keeps them and writes
/// them, in order, as soon as appending works again; one ERROR says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_append_to_its_audit_log_writes_the_lines_when_it_can() {
    let mut cl = Cluster::new(3, 1000);
    for i in 0..3 {
        cl.start_limitable(i);
    }
    let c = cl.client("node-a");
    let all = [0, 1, 2];
    let leader = wait_leader(&cl, &c, &all, Duration::from_secs(20)).await;
    let addrs = cl.addrs();
    for i in 0..10 {
        register_ready(&c, &addrs, i).await;
    }
    let data = cl.nodes[leader].dir.join("data");
    let (audit, raft) = (data.join("audit.log"), data.join("raft.log"));
    let (audit_len, raft_len) = (file_len(&audit), file_len(&raft));
    // audit.log may not grow at all; raft.log (smaller: postcard, not JSON) keeps room.
    assert!(
        audit_len > raft_len + 4096,
        "the test needs audit.log ({audit_len} B) well ahead of raft.log ({raft_len} B)"
    );
    cl.limit_file_size(leader, Some(audit_len));
    let mut acked = Vec::new();
    for i in 10..14 {
        acked.push(register_ready(&c, &addrs, i).await);
    }
    assert_eq!(
        wait_leader(&cl, &c, &all, Duration::from_secs(5)).await,
        leader,
        "the leader kept its role (its raft.log had room)"
    );
    assert!(
        file_len(&raft) > raft_len,
        "the writes went through the leader's log"
    );
    assert_eq!(
        file_len(&audit),
        audit_len,
        "appends to audit.log failed meanwhile"
    );

    cl.limit_file_size(leader, None);
    let follower = (leader + 1) % 3;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (theirs, _) = audited(&cl, follower);
        let (mine, revs) = audited(&cl, leader);
        if mine == theirs
            && acked
                .iter()
                .all(|(_, r)| revs.contains(&r.record.revision.0))
        {
            assert_each_once("leader", &mine);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "leader audit.log: {mine:?}\nfollower: {theirs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = log_of(&cl, leader);
    assert_eq!(
        log.matches("audit.log append failed").count(),
        1,
        "one ERROR for the outage:\n{log}"
    );
    assert!(log.contains("audit.log appends work again"), "{log}");
    c.shutdown().await;
}
