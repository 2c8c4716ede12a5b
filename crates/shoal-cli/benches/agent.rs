//! Agent benchmark (a bench binary, not a timed test): starts a real `shoal agent` whose data
//! dir holds a persisted 33,000-record catalog (2,000 services), then measures
//!
//! 1. resident memory (VmRSS / VmHWM) once the catalog is loaded;
//! 2. local API latency over the unix socket, **open loop** at a fixed offered rate (latency is
//!    measured from each request's scheduled send time, so queueing is not hidden);
//! 3. closed-loop maximum throughput.
//!
//! `cargo bench -p shoal-cli --bench agent [-- RATE SECONDS]` (defaults 10000 req/s, 5 s).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_catalog::snapshot::{self, Snapshot, SnapshotScope};
use shoal_catalog::Catalog;
use shoal_proto::{
    EndpointSpec, Generation, InstanceId, LabelDimension, Labels, LifecycleRecord, LifecycleState,
    NodeId, Region, Revision, ServiceKey, TransitionReason, TransitionSource, Version, Zone,
};
use shoal_transport::certs;

const RECORDS: usize = 33_000;
const SERVICES: usize = 2_000;
const THREADS: usize = 4;

fn build_snapshot(region: &Region) -> Vec<u8> {
    let key = shoal_agent::dev_authority::dev_key(region);
    let mut keyring = shoal_catalog::Keyring::new();
    keyring.trust_authority(region.clone(), key.verifying_key());
    let mut catalog = Catalog::new();
    for i in 0..RECORDS {
        let svc = i % SERVICES;
        let rec = LifecycleRecord {
            key: ServiceKey::new("prod", &format!("svc-{svc}"), "http").unwrap(),
            instance: InstanceId::new(format!("inst-{i}")).unwrap(),
            generation: Generation(i as u64 + 1),
            region: region.clone(),
            revision: Revision(i as u64 + 1),
            owner: NodeId::new(format!("node-{}", i % 1_667)).unwrap(),
            // A real key's bytes (size is what matters here); bound per node by the authority.
            owner_key: Some(key.verifying_key().to_bytes()),
            endpoint: EndpointSpec {
                address: format!("10.{}.{}.{}:8080", (i >> 16) & 255, (i >> 8) & 255, i & 255)
                    .parse()
                    .unwrap(),
                zone: Zone::new(format!("z{}", i % 3)).unwrap(),
                version: Version::new("1.4.2").unwrap(),
                weight: 100,
                labels: Labels::new(vec![
                    (LabelDimension::Protocol, "http2".into()),
                    (LabelDimension::Track, "stable".into()),
                ])
                .unwrap(),
            },
            state: LifecycleState::Ready,
            reason: TransitionReason::ReadinessPassed,
            source: TransitionSource::OwnerAgent,
            lease_ms: 300_000,
            committed_at_ms: 0,
        };
        catalog.apply_lifecycle(Arc::new(key.sign_lifecycle(rec)), &keyring);
    }
    snapshot::encode(&Snapshot::of(
        &catalog,
        SnapshotScope::Catalog,
        region.clone(),
    ))
}

/// A keep-alive HTTP/1.1 client over the unix socket.
struct Conn {
    w: UnixStream,
    r: BufReader<UnixStream>,
}

impl Conn {
    fn new(socket: &Path) -> Self {
        let s = UnixStream::connect(socket).unwrap();
        Self {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    fn get(&mut self, path: &str) -> u16 {
        write!(self.w, "GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut len = 0;
        loop {
            line.clear();
            self.r.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        self.r.read_exact(&mut body).unwrap();
        status
    }
}

fn path(i: usize) -> String {
    let svc = i % SERVICES;
    if i.is_multiple_of(2) {
        format!("/v1/services/prod/svc-{svc}/http/endpoints")
    } else {
        format!("/v1/services/prod/svc-{svc}/http/pick")
    }
}

fn rss_kib(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let rate: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let secs: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let region: Region = "dev".parse().unwrap();
    let ca = certs::create_ca(&region, dir).unwrap();
    certs::create_node_cert(
        &ca,
        &"bench".parse().unwrap(),
        &region,
        &certs::ExtraSans::default(),
        dir,
    )
    .unwrap();
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let t = Instant::now();
    let snap = build_snapshot(&region);
    println!(
        "snapshot: {RECORDS} records, {SERVICES} services, {} bytes (built in {:?})",
        snap.len(),
        t.elapsed()
    );
    std::fs::write(data.join("catalog.snap"), &snap).unwrap();
    let socket = dir.join("agent.sock");
    std::fs::write(
        dir.join("agent.toml"),
        format!(
            "node_id = \"bench\"\nregion = \"dev\"\nzone = \"z0\"\ndata_dir = \"data\"\nlisten = \"127.0.0.1:0\"\nadvertise = \"127.0.0.1:1\"\nsocket = \"{}\"\n[tls]\nca = \"dev-ca.pem\"\ncert = \"dev-node-bench.pem\"\nkey = \"dev-node-bench-key.pem\"\n[authority]\ndev = true\n[persist]\ninterval_ms = 600000\n",
            socket.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["agent", "--config"])
        .arg(dir.join("agent.toml"))
        .env("SHOAL_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "agent did not load the snapshot");
        if let Ok(s) = UnixStream::connect(&socket) {
            drop(s);
            let mut c = Conn::new(&socket);
            if c.get("/v1/services/prod/svc-1/http/endpoints") == 200 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (rss, hwm) = rss_kib(child.id());
    println!(
        "agent RSS with {RECORDS} records loaded: {:.1} MiB (peak {:.1} MiB)",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );

    // Warm-up.
    let mut c = Conn::new(&socket);
    for i in 0..2_000 {
        c.get(&path(i));
    }

    // Open loop at `rate` req/s across THREADS connections.
    let per_thread = rate / THREADS as u64;
    let interval = Duration::from_nanos(1_000_000_000 / per_thread.max(1));
    let total = per_thread * secs;
    let start = Instant::now() + Duration::from_millis(50);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Conn::new(&socket);
                let mut lat = Vec::with_capacity(total as usize);
                let mut errors = 0u64;
                for k in 0..total {
                    let due = start + interval * k as u32;
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    let st = c.get(&path(t * 7919 + k as usize));
                    if st != 200 {
                        errors += 1;
                    }
                    lat.push(Instant::now() - due);
                }
                (lat, errors)
            })
        })
        .collect();
    let mut lat = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (l, e) = h.join().unwrap();
        lat.extend(l);
        errors += e;
    }
    let elapsed = start.elapsed();
    lat.sort();
    println!(
        "open loop: offered {rate} req/s for {secs} s over {THREADS} keep-alive connections: achieved {:.0} req/s, non-200 {errors}, latency p50 {:?} p99 {:?} p99.9 {:?} max {:?}",
        lat.len() as f64 / elapsed.as_secs_f64(),
        pct(&lat, 0.50),
        pct(&lat, 0.99),
        pct(&lat, 0.999),
        lat.last().unwrap()
    );

    // Closed loop: as fast as possible for 3 s.
    let stop = Instant::now() + Duration::from_secs(3);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Conn::new(&socket);
                let mut n = 0usize;
                while Instant::now() < stop {
                    c.get(&path(t * 7919 + n));
                    n += 1;
                }
                n
            })
        })
        .collect();
    let n: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    println!(
        "closed loop: {:.0} req/s over {THREADS} connections",
        n as f64 / 3.0
    );
    let (rss, hwm) = rss_kib(child.id());
    println!(
        "agent RSS after the load: {:.1} MiB (peak {:.1} MiB)",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    let _ = child.kill();
    let _ = child.wait();
}
