//! Harness for cross-process tests: real `shoal agent` processes on distinct 127.0.x.y
//! addresses, certificates generated in a temp dir, a dev authority on the first agent.
//! Everything waits by polling with a bounded deadline, never by sleeping a fixed time.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use shoal_proto::{NodeId, Region};
use shoal_transport::certs;

/// The `shoal` binary under test.
///
/// `$SHOAL_BIN` when set; otherwise `target/<profile>/shoal`, the directory above this test
/// executable (`target/<profile>/deps/<test>-<hash>`). This crate cannot name another package's
/// binary (`CARGO_BIN_EXE_*` is per package). `cargo test --workspace` builds it in the same
/// invocation (shoal-cli has tests of its own); when it is missing, or older than any source
/// file under `crates/` or `Cargo.lock` (only `cargo test -p shoal-system-tests` ran after an
/// edit), the first call in the test process runs `cargo test --workspace --no-run` into that
/// target directory (the build CI does, so no second feature set of the dependencies is
/// compiled), so a test never runs a stale binary. Panics with cargo's output if the build
/// fails.
pub fn shoal_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("SHOAL_BIN") {
            return PathBuf::from(bin);
        }
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test executable under target/<profile>/deps");
        let bin = profile_dir.join("shoal");
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
        let mut newest = std::fs::metadata(root.join("Cargo.lock"))
            .and_then(|m| m.modified())
            .ok();
        newest_source(&root.join("crates"), &mut newest);
        if built.is_some() && built >= newest {
            return bin;
        }
        // `cargo test --workspace --no-run`, not `cargo build -p shoal-cli`: a `-p` selection
        // unifies other features and rebuilds the whole dependency stack (quinn, rustls, axum,
        // hickory, tonic) into artifacts CI never uses; this is the build CI does.
        let mut build = Command::new(env!("CARGO"));
        build
            .args([
                "test",
                "--workspace",
                "--no-run",
                "--quiet",
                "--manifest-path",
            ])
            .arg(root.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(profile_dir.parent().expect("target dir"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let out = build
            .output()
            .expect("run cargo test --no-run for the shoal binary");
        assert!(
            out.status.success(),
            "cargo test --workspace --no-run failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
}

/// Raises `newest` to the latest modification time of any `.rs` or `.toml` file under `dir`.
fn newest_source(dir: &Path, newest: &mut Option<std::time::SystemTime>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if meta.is_dir() {
            newest_source(&path, newest);
        } else if path.extension().is_some_and(|e| e == "rs" || e == "toml") {
            let modified = meta.modified().ok();
            if modified > *newest {
                *newest = modified;
            }
        }
    }
}

/// Test cluster port (all agents; they differ by IP).
pub const PORT: u16 = 27946;

/// One agent process.
pub struct Agent {
    pub name: String,
    pub ip: String,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub child: Option<Child>,
}

impl Agent {
    pub fn addr(&self) -> String {
        format!("{}:{PORT}", self.ip)
    }

    pub fn start(&mut self) {
        self.spawn(Command::new(shoal_bin()).args(["agent", "--config"]));
    }

    /// As [`Agent::start`], under `ulimit -n <nofile>` (soft and hard, set by `sh`, which
    /// then execs the agent). Returns the agent's pid.
    pub fn start_with_nofile(&mut self, nofile: u64) -> u32 {
        self.spawn(
            Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "ulimit -n {nofile} && exec \"$0\" agent --config \"$1\""
                ))
                .arg(shoal_bin()),
        );
        self.child.as_ref().unwrap().id()
    }

    /// Runs `cmd` with the config path appended, logging to `<dir>/<name>.log`.
    fn spawn(&mut self, cmd: &mut Command) {
        assert!(self.child.is_none(), "{} already running", self.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", self.name)))
            .unwrap();
        let child = cmd
            .arg(&self.config)
            .env("SHOAL_LOG", "info,shoal_transport=debug")
            .env_remove("SHOAL_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// SIGKILL, no goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for exit (graceful leave + final snapshot).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if c.try_wait().unwrap().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn get(&self, path: &str) -> Option<(u16, Value)> {
        http(&self.socket, "GET", path, None)
    }

    pub fn post(&self, path: &str, body: &str) -> Option<(u16, Value)> {
        http(&self.socket, "POST", path, Some(body))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.log", self.name))).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One HTTP/1.1 request over a unix socket (`Connection: close`, 60 s read timeout;
/// `shoal_runtime::local_api`); `None` if the agent is not up.
pub fn http(socket: &Path, method: &str, path: &str, body: Option<&str>) -> Option<(u16, Value)> {
    shoal_runtime::local_api::call(socket, method, path, body, Duration::from_secs(60)).ok()
}

/// Polls `f` until it returns `Some`, panicking with `what` after `timeout`.
pub fn eventually<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A set of agents of region `dev` sharing one CA.
pub struct Cluster {
    pub tmp: tempfile::TempDir,
    pub agents: Vec<Agent>,
    pub subnet: u8,
}

/// Small SWIM timings so the tests run in seconds.
pub const MEMBERSHIP: &str = "[membership]\nprobe_period_ms = 200\nprobe_rtt_ms = 80\nsuspect_to_down_after_ms = 600\nperiodic_gossip_ms = 100\njoin_retry_ms = 200\nanti_entropy_interval_ms = 500\n";

/// Hard-failure detection bound for these timings (see `MembershipConfig::detection_budget`),
/// plus slack for a loaded CI machine.
pub fn detection_bound() -> Duration {
    let mut m = shoal_mesh::MembershipConfig::for_cluster_size(8);
    m.probe_period_ms = 200;
    m.probe_rtt_ms = 80;
    m.suspect_to_down_after_ms = 600;
    m.periodic_gossip_ms = 100;
    Duration::from_millis(m.detection_budget(5).total_ms + 3_000)
}

impl Cluster {
    /// `n` agents on 127.0.`subnet`.1..=n; agent 0 runs the dev authority and is the seed.
    pub fn new(subnet: u8, n: usize) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let region: Region = "dev".parse().unwrap();
        let ca = certs::create_ca(&region, tmp.path()).unwrap();
        let mut agents = Vec::new();
        for i in 0..n {
            let name = format!("node-{}", (b'a' + i as u8) as char);
            let ip = format!("127.0.{subnet}.{}", i + 1);
            certs::create_node_cert(
                &ca,
                &name.parse::<NodeId>().unwrap(),
                &region,
                &certs::ExtraSans::default(),
                tmp.path(),
            )
            .unwrap();
            let seed = format!("127.0.{subnet}.1:{PORT}");
            let dev = i == 0;
            let agent = write_agent(tmp.path(), &name, &ip, &seed, dev, "dev-ca.pem");
            agents.push(agent);
        }
        Self {
            tmp,
            agents,
            subnet,
        }
    }

    pub fn start_all(&mut self) {
        for a in &mut self.agents {
            a.start();
        }
    }

    /// Waits until every running agent sees `n - 1` members.
    pub fn wait_converged(&self, n: usize, timeout: Duration) {
        for a in self.agents.iter().filter(|a| a.child.is_some()) {
            eventually(
                timeout,
                &format!("{} sees {} members", a.name, n - 1),
                || {
                    let (_, v) = a.get("/v1/agent/self")?;
                    (v["members"].as_u64()? as usize == n - 1 && v["active"] == true).then_some(())
                },
            );
        }
    }
}

/// Writes an agent's config file.
pub fn write_agent(dir: &Path, name: &str, ip: &str, seed: &str, dev: bool, ca: &str) -> Agent {
    let config = dir.join(format!("{name}.toml"));
    let socket = dir.join(format!("{name}.sock"));
    let seeds = if dev {
        String::new()
    } else {
        format!("\"{seed}\"")
    };
    let authority = if dev {
        "dev = true".to_owned()
    } else {
        format!("addresses = [\"{seed}\"]\nrpc_timeout_ms = 500\nrpc_budget_ms = 2000\nstatus_interval_ms = 500")
    };
    let text = format!(
        "node_id = \"{name}\"\nregion = \"dev\"\nzone = \"z1\"\ndata_dir = \"data-{name}\"\nlisten = \"{ip}:{PORT}\"\nsocket = \"{}\"\nseeds = [{seeds}]\ncluster_size = 8\n\n[tls]\nca = \"{ca}\"\ncert = \"dev-node-{name}.pem\"\nkey = \"dev-node-{name}-key.pem\"\n\n[trust]\ndev_authority = true\n\n[authority]\n{authority}\n\n[persist]\ninterval_ms = 300\n\n[api]\nstaleness_budget_ms = 3000\n\n[access]\n# Development policy: every local caller may do everything (the agent logs it loudly).\ndev_allow_all = true\n\n[join]\nbase_ms = 100\nmax_ms = 1000\n\n{MEMBERSHIP}",
        socket.display()
    );
    std::fs::write(&config, text).unwrap();
    Agent {
        name: name.to_owned(),
        ip: ip.to_owned(),
        dir: dir.to_owned(),
        config,
        socket,
        child: None,
    }
}

/// Finds an endpoint by instance in an endpoints response.
pub fn endpoint<'a>(v: &'a Value, instance: &str) -> Option<&'a Value> {
    v["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e["instance"] == instance)
}

pub const SVC: &str = "/v1/services/prod/web/http";

/// Registers `instance` on `agent` and marks it READY.
pub fn register_ready(agent: &Agent, instance: &str, addr: &str) {
    let body = format!("{{\"instance\":\"{instance}\",\"address\":\"{addr}\",\"labels\":{{\"protocol\":\"http2\"}}}}");
    let (code, v) = eventually(Duration::from_secs(10), "register accepted", || {
        let r = agent.post(&format!("{SVC}/register"), &body)?;
        (r.0 == 200).then_some(r)
    });
    assert_eq!(code, 200, "{v}");
    let (code, v) = agent
        .post(&format!("{SVC}/instances/{instance}/ready"), "")
        .unwrap();
    assert_eq!(code, 200, "{v}");
}

/// State of `instance` at `agent` (None if absent).
pub fn state_at(agent: &Agent, instance: &str) -> Option<(String, bool)> {
    let (_, v) = agent.get(&format!("{SVC}/endpoints"))?;
    let e = endpoint(&v, instance)?;
    Some((e["state"].as_str()?.to_owned(), e["routable"].as_bool()?))
}

// ---- local-socket identity tests: unprivileged unix users ---------------------------------

/// The two unprivileged users `.ci/run` creates.
pub const USER_A: &str = "shoal-test-a";
pub const USER_B: &str = "shoal-test-b";

/// Uid and primary gid of a unix user (via `id`), if it exists.
pub fn unix_user(name: &str) -> Option<(u32, u32)> {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, name]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    Some((id("-u")?, id("-g")?))
}

/// This process's effective uid (owner of `/proc/self`).
pub fn euid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

/// The users A and B when the test can act as them (running as root, users present). Otherwise
/// prints a SKIP line and returns `None`, or panics when `SHOAL_REQUIRE_UNIX_USERS=1` (CI).
pub fn users_or_skip(test: &str) -> Option<((u32, u32), (u32, u32))> {
    let why = if euid() != 0 {
        Some("not running as root (cannot act as other uids)".to_owned())
    } else {
        match (unix_user(USER_A), unix_user(USER_B)) {
            (Some(a), Some(b)) => return Some((a, b)),
            _ => Some(format!(
                "unix users {USER_A} / {USER_B} missing (.ci/run creates them with useradd --system)"
            )),
        }
    };
    let why = why.expect("set");
    if std::env::var("SHOAL_REQUIRE_UNIX_USERS").as_deref() == Ok("1") {
        panic!("SHOAL_REQUIRE_UNIX_USERS=1 but {test} cannot run: {why}");
    }
    println!("SKIP {test}: {why}");
    None
}

/// `curl --unix-socket` run as `uid`/`gid`: (HTTP status, JSON body).
pub fn curl_as(
    (uid, gid): (u32, u32),
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, Value) {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "20", "--unix-socket"])
        .arg(socket)
        .args(["-X", method, "-H", "content-type: application/json"])
        .args(["-w", "\n%{http_code}"]);
    if let Some(b) = body {
        cmd.args(["--data-binary", b]);
    }
    cmd.arg(format!("http://agent{path}"))
        .uid(uid)
        .gid(gid)
        .current_dir("/");
    let out = cmd.output().expect("curl runs (CI installs it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (json, code) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(json).unwrap_or(Value::Null),
    )
}

/// `GET /metrics` from `addr` as text (empty when unreachable).
pub fn metrics_text(addr: &str) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Sum of the samples of `name` whose labels contain every `key="value"` in `labels`.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            if n != name {
                return None;
            }
            labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// `s` without ANSI colour sequences (the agent's log is coloured).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\x1b' {
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
