//! Agent benchmark (a bench binary, not a timed test): starts a real `shoal agent` whose data
//! dir holds a persisted 33,000-record catalog (2,000 services), then measures
//!
//! 1. resident memory (VmRSS / VmHWM) once the catalog is loaded;
//! 2. local API latency over the unix socket, **open loop** at a fixed offered rate (latency is
//!    measured from each request's scheduled send time, so queueing is not hidden);
//! 3. closed-loop maximum throughput;
//!
//! and the same load, from the same generator in the same run, against a **physical
//! reference**: nginx (the Debian package, `apt-get install nginx-light`) serving two static
//! files over a unix socket, each the size of the agent's own answer to the same request (an
//! endpoints list of 16, a pick). Rounds alternate agent / nginx so both see the same machine.
//!
//! `cargo bench -p shoal-cli --bench agent [-- RATES [SECONDS [ROUNDS]]]`: RATES is a
//! comma-separated list of offered req/s (default `2000,10000`), SECONDS per run (default 5),
//! ROUNDS per rate and target (default 2). `BENCH_CONNS` sets the connections (default 4),
//! `BENCH_SERVICES` the services the mix cycles over (default all 2,000; e.g. 20 for one
//! caller's working set, which the agent's rendered-array reuse serves from memory);
//! `SHOAL_BIN` runs another `shoal` binary instead of this tree's; `SHOAL_BASELINE` runs a
//! second agent from another build (e.g. of main) beside it, loaded alike and measured in the
//! same rounds, so old and new are compared under the same machine load.
//!
//! `BENCH_PIN=LOAD:SERVER` (taskset CPU lists, e.g. `0:1`) pins the load generator's threads to
//! `LOAD` and every server (each agent's threads, nginx's master and workers) to `SERVER`, so
//! on a small machine the generator's own wake-ups do not queue behind the server under test
//! and the tail measured is the server's. Both targets get the same CPUs, so the comparison
//! stays side by side.

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
/// Default keep-alive connections of the load generator (one thread each).
const CONNS: usize = 4;

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
        let merged = catalog.apply_lifecycle(Arc::new(key.sign_lifecycle(rec)), &keyring);
        assert_eq!(merged, shoal_catalog::MergeOutcome::Applied);
    }
    snapshot::encode(&Snapshot::of(
        &catalog,
        SnapshotScope::Catalog,
        region.clone(),
    ))
}

#[path = "agent/load.rs"]
mod load;

use load::{closed_loop, open_loop, Conn, Run};

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

/// A server under test: its socket and the processes whose CPU time it spends.
struct Target {
    name: &'static str,
    socket: std::path::PathBuf,
    pid: u32,
}

/// utime + stime (clock ticks) of `pid` and its direct children (nginx's workers).
fn cpu_ticks(pid: u32) -> u64 {
    let one = |p: &str| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| {
                // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
                let rest = s.rsplit_once(')')?.1;
                let f: Vec<&str> = rest.split_whitespace().collect();
                Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
            })
            .unwrap_or(0)
    };
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    one(&pid.to_string()) + children.split_whitespace().map(one).sum::<u64>()
}

/// Pins `pid`, all its threads and its direct children's (nginx's workers) to `cpus` (a
/// taskset CPU list). Panics when taskset fails: a pinned run that is not pinned would mislead.
fn pin(pid: u32, cpus: &str) {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for p in std::iter::once(pid.to_string()).chain(children.split_whitespace().map(String::from)) {
        let ok = Command::new("taskset")
            .args(["-a", "-p", "-c", cpus, &p])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "taskset -a -p -c {cpus} {p} failed");
    }
}

/// The machine's load averages (1, 5, 15 min) from `/proc/loadavg`: the machine is shared, so
/// every figure carries the load it was taken under.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".into())
}

fn clk_tck() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// Starts nginx serving `endpoints` and `pick` bodies (for `.../endpoints` and `.../pick`) on
/// a unix socket in `dir`, two workers (the agent runs two tokio workers). `None` when nginx
/// is not installed.
fn start_nginx(dir: &Path, endpoints: &[u8], pick: &[u8]) -> Option<(std::process::Child, Target)> {
    let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| Path::new(p).exists())?;
    let root = dir.join("nginx");
    std::fs::create_dir_all(root.join("www")).unwrap();
    std::fs::write(root.join("www/endpoints.json"), endpoints).unwrap();
    std::fs::write(root.join("www/pick.json"), pick).unwrap();
    let socket = root.join("nginx.sock");
    let conf = format!(
        "user root;\nworker_processes 2;\npid {r}/nginx.pid;\nerror_log {r}/error.log warn;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 100000000;\n  keepalive_timeout 600s;\n\
         \x20 default_type application/json;\n\
         \x20 server {{\n    listen unix:{s};\n    root {r}/www;\n\
         \x20   rewrite ^.*/endpoints$ /endpoints.json break;\n\
         \x20   rewrite ^.*/pick$ /pick.json break;\n  }}\n}}\n",
        r = root.display(),
        s = socket.display()
    );
    std::fs::write(root.join("nginx.conf"), conf).unwrap();
    let child = Command::new(bin)
        .arg("-c")
        .arg(root.join("nginx.conf"))
        .args(["-g", "daemon off;"])
        .stdout(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if Instant::now() > deadline {
            eprintln!("nginx did not create its socket; reference skipped");
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child.id();
    Some((
        child,
        Target {
            name: "nginx",
            socket,
            pid,
        },
    ))
}

/// Starts `bin` as an agent named `name` whose data dir (under `dir`) holds `snap`, and waits
/// until it answers from it. Prints its RSS once loaded.
fn start_agent(
    dir: &Path,
    name: &'static str,
    bin: &str,
    snap: &[u8],
) -> (std::process::Child, Target) {
    let home = dir.join(name);
    let data = home.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("catalog.snap"), snap).unwrap();
    let socket = home.join("agent.sock");
    std::fs::write(
        home.join("agent.toml"),
        format!(
            "node_id = \"bench\"\nregion = \"dev\"\nzone = \"z0\"\ndata_dir = \"data\"\nlisten = \"127.0.0.1:0\"\nadvertise = \"127.0.0.1:1\"\nsocket = \"{}\"\n[tls]\nca = \"{d}/dev-ca.pem\"\ncert = \"{d}/dev-node-bench.pem\"\nkey = \"{d}/dev-node-bench-key.pem\"\n[authority]\ndev = true\n[persist]\ninterval_ms = 600000\n",
            socket.display(),
            d = dir.display(),
        ),
    )
    .unwrap();
    println!("{name} binary: {bin}");
    let child = Command::new(bin)
        .args(["agent", "--config"])
        .arg(home.join("agent.toml"))
        .env("SHOAL_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "{name} did not load the snapshot"
        );
        if let Ok(s) = UnixStream::connect(&socket) {
            drop(s);
            let mut c = Conn::new(&socket);
            if c.get("/v1/services/prod/svc-1/http/endpoints").0 == 200 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (rss, hwm) = rss_kib(child.id());
    println!(
        "{name} RSS with {RECORDS} records loaded: {:.1} MiB (peak {:.1} MiB)",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    let pid = child.id();
    (child, Target { name, socket, pid })
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let rates: Vec<u64> = args
        .first()
        .map_or("2000,10000", String::as_str)
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect();
    let secs: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let rounds: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2);
    let conns: usize = std::env::var("BENCH_CONNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(CONNS);
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
    let t = Instant::now();
    let snap = build_snapshot(&region);
    println!(
        "snapshot: {RECORDS} records, {SERVICES} services, {} bytes (built in {:?})",
        snap.len(),
        t.elapsed()
    );
    // This tree's agent, and SHOAL_BASELINE's (another build, e.g. of main) beside it.
    let this = std::env::var("SHOAL_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_shoal").into());
    let mut agents = vec![start_agent(dir, "agent", &this, &snap)];
    if let Ok(base) = std::env::var("SHOAL_BASELINE") {
        agents.push(start_agent(dir, "baseline", &base, &snap));
    }

    // Warm-up, and the agent's own answers as nginx's files (same sizes).
    let mut c = Conn::new(&agents[0].1.socket);
    let (_, endpoints_body) = c.get(&load::path(0));
    let (_, pick_body) = c.get(&load::path(1));
    println!(
        "answer sizes: endpoints {} bytes, pick {} bytes",
        endpoints_body.len(),
        pick_body.len()
    );
    drop(c);
    let nginx = start_nginx(dir, &endpoints_body, &pick_body);
    if nginx.is_none() {
        println!("nginx not installed (apt-get install nginx-light): reference skipped");
    }
    let mut targets: Vec<&Target> = agents.iter().map(|(_, t)| t).collect();
    if let Some((_, n)) = &nginx {
        targets.push(n);
    }
    if let Ok(spec) = std::env::var("BENCH_PIN") {
        let (load_cpus, server_cpus) = spec
            .split_once(':')
            .expect("BENCH_PIN=LOAD_CPUS:SERVER_CPUS, e.g. 0:1");
        for t in &targets {
            pin(t.pid, server_cpus);
        }
        // Threads the generator starts from now on inherit this.
        pin(std::process::id(), load_cpus);
        println!("pinned: load generator on CPUs {load_cpus}, servers on CPUs {server_cpus}");
    }
    for t in &targets {
        let mut c = Conn::new(&t.socket);
        for i in 0..2_000 {
            c.get(&load::path(i));
        }
    }
    let hz = clk_tck();
    let mut table: Vec<(u64, &str, Run, f64, String)> = Vec::new();
    for &rate in &rates {
        for _ in 0..rounds {
            for t in &targets {
                let c0 = cpu_ticks(t.pid);
                let run = open_loop(&t.socket, rate, secs, conns);
                let cpu_s = (cpu_ticks(t.pid) - c0) as f64 / hz as f64;
                let us_per_req = cpu_s * 1e6 / run.completed.max(1) as f64;
                let load = loadavg();
                println!(
                    "{:<10} {} server CPU {:.1} us/request, load average {load}",
                    t.name, run, us_per_req
                );
                table.push((rate, t.name, run, us_per_req, load));
            }
        }
    }
    println!();
    println!("| offered req/s | server | achieved req/s | non-200 | p50 | p99 | p99.9 | max | server CPU us/req | load avg 1/5/15 min |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (rate, name, r, us, load) in &table {
        println!(
            "| {rate} | {name} | {:.0} | {} | {} | {} | {} | {} | {us:.1} | {load} |",
            r.achieved,
            r.errors,
            load::ms(r.p50),
            load::ms(r.p99),
            load::ms(r.p999),
            load::ms(r.max)
        );
    }
    println!();
    for t in &targets {
        println!(
            "closed loop {:<12}: {:.0} req/s over {conns} connections",
            t.name,
            closed_loop(&t.socket, conns, 3)
        );
    }
    for (_, t) in &agents {
        let (rss, hwm) = rss_kib(t.pid);
        println!(
            "{} RSS after the load: {:.1} MiB (peak {:.1} MiB)",
            t.name,
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0
        );
    }
    if let Some((mut n, _)) = nginx {
        // TERM, not KILL: the master then stops its workers.
        let _ = Command::new("kill")
            .args(["-TERM", &n.id().to_string()])
            .status();
        let _ = n.wait();
    }
    for (mut child, _) in agents {
        let _ = child.kill();
        let _ = child.wait();
    }
}
