//! The three-replica region harness shared by `authority_cluster.rs` and `authority_faults.rs`:
//! `shoal authority run` replicas (each with its embedded mesh member) and `shoal agent`
//! processes on 127.0.<subnet>.x, certificates and the region key in a temp dir. Included with
//! `#[path]` by those two test binaries only. Every wait polls with a bounded deadline.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{endpoint, eventually, Agent, MEMBERSHIP, PORT};
use serde_json::Value;
use shoal_authority_server::config::to_hex;
use shoal_proto::{NodeId, Region, SigningKey};
use shoal_transport::certs;

pub const SVC: &str = "/v1/services/prod/web/http";
pub const RAFT_PORT: u16 = 27101;
pub const RPC_PORT: u16 = 27100;
pub const MESH_PORT: u16 = 27102;
pub const METRICS_PORT: u16 = 29464;
pub const WAIT: Duration = Duration::from_secs(40);

pub struct Authority {
    pub name: String,
    pub config: PathBuf,
    pub log: PathBuf,
    pub child: Option<Child>,
}

impl Authority {
    pub fn start(&mut self) {
        assert!(self.child.is_none());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        self.child = Some(
            Command::new(crate::common::shoal_bin())
                .args(["authority", "run", "--config"])
                .arg(&self.config)
                .env("RUST_LOG", "info,openraft=warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Authority {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub struct Region3 {
    pub tmp: tempfile::TempDir,
    pub subnet: u8,
    pub region_key: SigningKey,
    pub auths: Vec<Authority>,
    pub agents: Vec<Agent>,
    /// How many of `auths` are initial voters (the rest are spares with `join = true`).
    pub voters: usize,
}

impl Drop for Region3 {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for a in &self.auths {
                let t = std::fs::read_to_string(&a.log).unwrap_or_default();
                eprintln!("---- {} ----", a.name);
                for l in t
                    .lines()
                    .rev()
                    .take(25)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                {
                    eprintln!("{l}");
                }
            }
            for a in &self.agents {
                let t = a.log();
                eprintln!("---- {} ----", a.name);
                for l in t
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                {
                    eprintln!("{l}");
                }
            }
        }
        for a in &mut self.agents {
            a.kill9();
        }
        for a in &mut self.auths {
            a.kill9();
        }
        let _ = self.tmp.path();
    }
}

pub fn agent_ip(subnet: u8, i: usize) -> String {
    format!("127.0.{subnet}.{}", i + 1)
}
pub fn auth_ip(subnet: u8, i: usize) -> String {
    format!("127.0.{subnet}.{}", i + 11)
}

impl Region3 {
    /// 3 authorities (each with an embedded mesh member) and `n` agents trusting the region key.
    pub fn new(subnet: u8, n: usize) -> Self {
        Self::with_replicas(subnet, 3, 0, n)
    }

    /// `replicas` voters (auth-1..), `spare` more replicas configured with `join = true` (not
    /// members until `members add`), and `n` agents. Agents know every replica's address.
    pub fn with_replicas(subnet: u8, replicas: usize, spare: usize, n: usize) -> Self {
        let total = replicas + spare;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let region: Region = "dev".parse().unwrap();
        let ca = certs::create_ca(&region, dir).unwrap();
        let seed = [subnet; 32];
        let region_key = SigningKey::from_seed(seed);
        shoal_transport::keyfile::write_private(
            &dir.join("region.key"),
            to_hex(&seed).as_bytes(),
            shoal_transport::keyfile::Overwrite::Refuse,
        )
        .unwrap();
        let pubkey = to_hex(&region_key.verifying_key().to_bytes());
        let names: Vec<String> = (0..n)
            .map(|i| format!("node-{}", (b'a' + i as u8) as char))
            .collect();
        // The rogue member of the bad-signature check, and an operator for `members`.
        let extra = ["node-x".to_owned(), "operator-ops".to_owned()];
        for name in names
            .iter()
            .cloned()
            .chain((1..=total).map(|i| format!("auth-{i}")))
            .chain(extra)
        {
            certs::create_node_cert(
                &ca,
                &name.parse::<NodeId>().unwrap(),
                &region,
                &certs::ExtraSans::default(),
                dir,
            )
            .unwrap();
        }
        let agent_addrs: Vec<String> = (0..n)
            .map(|i| format!("\"{}:{PORT}\"", agent_ip(subnet, i)))
            .collect();
        let mesh_addrs: Vec<String> = (0..total)
            .map(|i| format!("\"{}:{MESH_PORT}\"", auth_ip(subnet, i)))
            .collect();
        let rpc_addrs: Vec<String> = (0..total)
            .map(|i| format!("\"{}:{RPC_PORT}\"", auth_ip(subnet, i)))
            .collect();
        let member_toml = |i: usize| {
            let ip = auth_ip(subnet, i);
            format!(
                "[[members]]\nid = {}\nnode = \"auth-{}\"\nraft_addr = \"{ip}:{RAFT_PORT}\"\nrpc_addr = \"{ip}:{RPC_PORT}\"\n\n",
                i + 1,
                i + 1
            )
        };
        let members: String = (0..replicas).map(member_toml).collect();
        // The agents' SWIM timings (common::MEMBERSHIP) without the agent-only key.
        let knobs: String = MEMBERSHIP
            .lines()
            .filter(|l| !l.starts_with('['))
            .map(|l| format!("{l}\n"))
            .collect();
        let mut auths = Vec::new();
        for i in 0..total {
            let name = format!("auth-{}", i + 1);
            let (join, members) = if i < replicas {
                ("", members.clone())
            } else {
                ("join = true\n", format!("{members}{}", member_toml(i)))
            };
            let config = dir.join(format!("{name}.toml"));
            let text = format!(
                "{join}id = {}\nregion = \"dev\"\ndata_dir = \"{}\"\ntls = {{ ca = \"{}\", cert = \"{}\", key = \"{}\" }}\n\
                 signing_key = \"{}\"\nheartbeat_ms = 100\nelection_timeout_ms = 500\nwrite_timeout_ms = 2000\n\
                 quorum_stale_ms = 1000\nexpire_interval_ms = 200\n\
                 mesh_addr = \"{}:{MESH_PORT}\"\nmesh_seeds = [{}]\n\n[mesh]\ncluster_size = 8\njoin_max_ms = 1000\n\
                 absent_grace_ms = 5000\n{knobs}\n{members}",
                i + 1,
                dir.join(format!("data-{name}")).display(),
                dir.join("dev-ca.pem").display(),
                dir.join(format!("dev-node-{name}.pem")).display(),
                dir.join(format!("dev-node-{name}-key.pem")).display(),
                dir.join("region.key").display(),
                auth_ip(subnet, i),
                agent_addrs.join(", "),
            );
            std::fs::write(&config, text).unwrap();
            auths.push(Authority {
                log: dir.join(format!("{name}.log")),
                name,
                config,
                child: None,
            });
        }
        let mut agents = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let ip = agent_ip(subnet, i);
            let seeds: Vec<String> = agent_addrs
                .iter()
                .filter(|a| !a.contains(&format!("{ip}:")))
                .chain(mesh_addrs.iter())
                .cloned()
                .collect();
            let authority = format!(
                "addresses = [{}]\nrpc_timeout_ms = 500\nrpc_budget_ms = 4000\nstatus_interval_ms = 300",
                rpc_addrs.join(", ")
            );
            let trust = format!("authority_keys = [\"{pubkey}\"]");
            agents.push(write_agent(
                dir,
                name,
                &ip,
                &seeds.join(", "),
                &trust,
                &authority,
            ));
        }
        Self {
            tmp,
            subnet,
            region_key,
            auths,
            agents,
            voters: replicas,
        }
    }

    /// Starts the initial voters (not the spares) and every agent.
    pub fn start_all(&mut self) {
        for a in self.auths.iter_mut().take(self.voters) {
            a.start();
        }
        for a in &mut self.agents {
            a.start();
        }
    }

    pub fn live_agents(&self) -> impl Iterator<Item = &Agent> {
        self.agents.iter().filter(|a| a.child.is_some())
    }
}

pub fn write_agent(
    dir: &Path,
    name: &str,
    ip: &str,
    seeds: &str,
    trust: &str,
    authority: &str,
) -> Agent {
    let config = dir.join(format!("{name}.toml"));
    let socket = dir.join(format!("{name}.sock"));
    let text = format!(
        "node_id = \"{name}\"\nregion = \"dev\"\nzone = \"z1\"\ndata_dir = \"data-{name}\"\nlisten = \"{ip}:{PORT}\"\n\
         socket = \"{}\"\nmetrics = \"{ip}:{METRICS_PORT}\"\nseeds = [{seeds}]\ncluster_size = 8\n\n\
         [tls]\nca = \"dev-ca.pem\"\ncert = \"dev-node-{name}.pem\"\nkey = \"dev-node-{name}-key.pem\"\n\n\
         [trust]\n{trust}\n\n[authority]\n{authority}\n\n[persist]\ninterval_ms = 300\n\n\
         [api]\nstaleness_budget_ms = 2000\n\n[join]\nbase_ms = 100\nmax_ms = 1000\n\n{MEMBERSHIP}",
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

/// Registers `instance` at `agent` (retrying while the authority elects a leader), optionally
/// with a lease, and returns the response.
pub fn register(agent: &Agent, instance: &str, lease_ms: Option<u32>) -> Value {
    let lease = lease_ms.map_or(String::new(), |l| format!(",\"lease_ms\":{l}"));
    let body = format!(
        "{{\"instance\":\"{instance}\",\"address\":\"{}:{}\"{lease}}}",
        agent.ip,
        8000 + instance.len()
    );
    eventually(
        WAIT,
        &format!("register {instance} at {}", agent.name),
        || {
            let (code, v) = agent.post(&format!("{SVC}/register"), &body)?;
            (code == 200).then_some(v)
        },
    )
}

pub fn transition(agent: &Agent, instance: &str, action: &str) -> Value {
    eventually(
        WAIT,
        &format!("{action} {instance} at {}", agent.name),
        || {
            let (code, v) = agent.post(&format!("{SVC}/instances/{instance}/{action}"), "")?;
            (code == 200).then_some(v)
        },
    )
}

pub fn endpoint_at(agent: &Agent, instance: &str) -> Option<Value> {
    let (_, v) = agent.get(&format!("{SVC}/endpoints"))?;
    endpoint(&v, instance).cloned()
}

pub fn wait_state(agent: &Agent, instance: &str, state: &str) -> Value {
    eventually(
        WAIT,
        &format!("{} sees {instance} {state}", agent.name),
        || endpoint_at(agent, instance).filter(|e| e["state"] == state),
    )
}

pub fn wait_members(agent: &Agent, n: u64) {
    eventually(WAIT, &format!("{} sees {n} members", agent.name), || {
        let (_, v) = agent.get("/v1/agent/self")?;
        (v["members"].as_u64()? >= n && v["active"] == true).then_some(())
    });
}

// ---------------------------------------------------------------------------------------------
// Write workload and checker (issue 14): register, ready, drain, deregister through several
// agents while faults run; then every acknowledged write is checked against every agent.

/// One acknowledged write, as the agent that forwarded it answered.
#[derive(Clone, Debug)]
pub struct Ack {
    pub worker: usize,
    pub instance: String,
    /// `register`, `ready`, `drain` or `deregister`.
    pub action: &'static str,
    pub generation: u64,
    pub revision: u64,
    /// The lifecycle state the write produced.
    pub state: &'static str,
}

/// What the workload did: acknowledged writes (in each worker's order) and attempts that got
/// no acknowledgement (retried until acknowledged).
#[derive(Debug, Default)]
pub struct WorkloadLog {
    pub acks: Vec<Ack>,
    pub unacked_attempts: u64,
    /// Acknowledged writes re-sent once (idempotency probe): (instance, action, first
    /// revision, revision of the repeat).
    pub repeats: Vec<(String, &'static str, u64, u64)>,
    /// Writes refused outright (4xx) on their first attempt: the workload never asks for an
    /// illegal transition, so each is a violation.
    pub refused: Vec<String>,
    /// Instances whose last write's outcome is unknown: an attempt without acknowledgement,
    /// then a refusal of its retry. Left out of the catalog check, kept in the history check.
    pub uncertain: Vec<String>,
}

/// The outcome of one write attempt.
enum Attempt {
    /// Acknowledged: (generation, revision).
    Acked(u64, u64),
    /// No answer or 5xx (no quorum, not leader yet): retry.
    Retry,
    /// Refused (4xx): the body.
    Refused(String),
}

const STEPS: [(&str, &str); 4] = [
    ("register", "STARTING"),
    ("ready", "READY"),
    ("drain", "DRAINING"),
    ("deregister", "EXPIRED"),
];

/// One write attempt.
fn attempt(agent: &Agent, instance: &str, step: usize, port: u16) -> Attempt {
    let answer = if step == 0 {
        let body = format!(
            "{{\"instance\":\"{instance}\",\"address\":\"{}:{port}\"}}",
            agent.ip
        );
        agent.post(&format!("{SVC}/register"), &body)
    } else {
        let (action, _) = STEPS[step];
        agent.post(&format!("{SVC}/instances/{instance}/{action}"), "")
    };
    let Some((code, v)) = answer else {
        return Attempt::Retry;
    };
    if (400..500).contains(&code) {
        return Attempt::Refused(format!("{code} {v}"));
    }
    if code != 200 {
        return Attempt::Retry;
    }
    let acked = || -> Option<(u64, u64)> {
        let generation = v["generation"].as_u64()?;
        if step > 0 {
            return Some((generation, v["revision"].as_u64()?));
        }
        // Read-your-writes: the agent applied the records before answering.
        let e = endpoint_at(agent, instance)?;
        (e["generation"].as_u64()? == generation).then_some(())?;
        Some((generation, e["revision"].as_u64()?))
    };
    match acked() {
        Some((g, r)) => Attempt::Acked(g, r),
        None => Attempt::Refused(format!("200 without generation/revision: {v}")),
    }
}

/// Runs `workers` workers (worker `w` writes through agent `w % agents.len()`) until `stop`
/// is set; each cycles its own instances through register, ready, drain, deregister, retrying
/// an unacknowledged step until it is acknowledged (bounded by `WAIT` per step after `stop`).
/// Every 7th acknowledged transition is sent again and must be answered with the same revision.
pub fn run_workload(
    agents: &[&Agent],
    workers: usize,
    seed: u64,
    stop: &std::sync::atomic::AtomicBool,
) -> WorkloadLog {
    use std::sync::atomic::Ordering;
    let logs: Vec<WorkloadLog> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let agent = agents[w % agents.len()];
                s.spawn(move || {
                    let mut log = WorkloadLog::default();
                    let mut rng = seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    let mut k = 0u64;
                    'outer: loop {
                        let instance = format!("w{w}-{k}");
                        let port = 10_000 + (w as u16) * 1_000 + (k % 1_000) as u16;
                        // Instances stop at a random step (0..=3) so the final catalog holds
                        // every state.
                        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let last = (rng >> 33) as usize % 4;
                        for (step, &(action, state)) in STEPS.iter().enumerate().take(last + 1) {
                            let mut stopped_at = None;
                            let mut tries = 0;
                            let ack = loop {
                                tries += 1;
                                match attempt(agent, &instance, step, port) {
                                    Attempt::Acked(g, r) => break Some((g, r)),
                                    Attempt::Retry => {}
                                    Attempt::Refused(why) if tries == 1 => {
                                        log.refused.push(format!("{action} {instance}: {why}"));
                                        break None;
                                    }
                                    Attempt::Refused(_) => {
                                        log.uncertain.push(instance.clone());
                                        break None;
                                    }
                                }
                                log.unacked_attempts += 1;
                                if stop.load(Ordering::Relaxed) {
                                    let t = *stopped_at.get_or_insert_with(std::time::Instant::now);
                                    if t.elapsed() > WAIT {
                                        break None;
                                    }
                                    if step == 0 {
                                        break None; // a register never acknowledged: no write to finish
                                    }
                                }
                                std::thread::sleep(Duration::from_millis(100)); // retry pacing, not synchronisation
                            };
                            let Some((generation, revision)) = ack else {
                                if stop.load(Ordering::Relaxed) && step > 0 && stopped_at.is_some_and(|t: std::time::Instant| t.elapsed() > WAIT) {
                                    log.refused.push(format!("{instance}: step {step} never acknowledged within {WAIT:?} after the faults stopped"));
                                    log.uncertain.push(instance.clone());
                                }
                                if stop.load(Ordering::Relaxed) {
                                    break 'outer;
                                }
                                break; // next instance
                            };
                            log.acks.push(Ack { worker: w, instance: instance.clone(), action, generation, revision, state });
                            if step > 0 && log.acks.len() % 7 == 0 {
                                match attempt(agent, &instance, step, port) {
                                    Attempt::Acked(g2, r2) => {
                                        if g2 != generation {
                                            log.refused.push(format!("{action} {instance} repeated: generation {g2} != {generation}"));
                                        }
                                        log.repeats.push((instance.clone(), action, revision, r2));
                                    }
                                    Attempt::Refused(why) => log.refused.push(format!("{action} {instance} repeated: {why}")),
                                    Attempt::Retry => {}
                                }
                            }
                        }
                        k += 1;
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                    }
                    log
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut out = WorkloadLog::default();
    for l in logs {
        out.acks.extend(l.acks);
        out.unacked_attempts += l.unacked_attempts;
        out.repeats.extend(l.repeats);
        out.refused.extend(l.refused);
        out.uncertain.extend(l.uncertain);
    }
    out
}

/// The checker. Safety of the acknowledged history (no agent needed):
/// - each worker's acknowledged revisions strictly increase (its writes are sequential);
/// - no revision is acknowledged for two different writes, and a write acknowledged twice
///   (the idempotency probe) has the same revision both times.
///
/// Returns the violations (empty: pass).
pub fn check_history(log: &WorkloadLog) -> Vec<String> {
    let mut bad = Vec::new();
    let mut last: std::collections::BTreeMap<usize, u64> = Default::default();
    let mut by_rev: std::collections::BTreeMap<u64, (String, &str, u64)> = Default::default();
    for a in &log.acks {
        if let Some(prev) = last.insert(a.worker, a.revision) {
            if a.revision <= prev {
                bad.push(format!(
                    "worker {}: {} {} acknowledged revision {} after {prev}",
                    a.worker, a.action, a.instance, a.revision
                ));
            }
        }
        let this = (a.instance.clone(), a.action, a.generation);
        if let Some(other) = by_rev.insert(a.revision, this.clone()) {
            if other != this {
                bad.push(format!(
                    "revision {} acknowledged for {other:?} and {this:?}",
                    a.revision
                ));
            }
        }
    }
    bad.extend(log.refused.iter().map(|r| format!("refused: {r}")));
    for (inst, action, r1, r2) in &log.repeats {
        if r1 != r2 {
            bad.push(format!(
                "{action} {inst} acknowledged twice with revisions {r1} and {r2}"
            ));
        }
    }
    bad
}

/// What each acknowledged instance must look like on every agent: its last acknowledged
/// write's (generation, revision, state).
pub fn expected_catalog(
    log: &WorkloadLog,
) -> std::collections::BTreeMap<String, (u64, u64, &'static str)> {
    let mut m = std::collections::BTreeMap::new();
    for a in &log.acks {
        m.insert(a.instance.clone(), (a.generation, a.revision, a.state));
    }
    for u in &log.uncertain {
        m.remove(u);
    }
    m
}

/// Differences between `agent`'s catalog and `expected`: an instance whose last acknowledged
/// write left it live must be listed with exactly that generation, revision and state; one
/// whose last write was a deregister must not be listed (EXPIRED is never listed).
/// `None` when the agent does not answer.
pub fn catalog_diff(
    agent: &Agent,
    expected: &std::collections::BTreeMap<String, (u64, u64, &'static str)>,
) -> Option<Vec<String>> {
    let (_, v) = agent.get(&format!("{SVC}/endpoints"))?;
    let held: std::collections::BTreeMap<String, (u64, u64, String)> = v["endpoints"]
        .as_array()?
        .iter()
        .map(|e| {
            (
                e["instance"].as_str().unwrap_or("").to_owned(),
                (
                    e["generation"].as_u64().unwrap_or(0),
                    e["revision"].as_u64().unwrap_or(0),
                    e["state"].as_str().unwrap_or("").to_owned(),
                ),
            )
        })
        .collect();
    let mut diff = Vec::new();
    for (inst, (g, r, s)) in expected {
        let got = held.get(inst);
        let ok = if *s == "EXPIRED" {
            got.is_none()
        } else {
            got.is_some_and(|(hg, hr, hs)| hg == g && hr == r && hs == s)
        };
        if !ok {
            diff.push(format!(
                "{}: {inst} acknowledged ({g}, {r}, {s}), holds {got:?}",
                agent.name
            ));
        }
    }
    Some(diff)
}

/// Waits (bounded by `timeout`) until every agent's catalog matches the acknowledged writes;
/// returns the remaining differences (empty: pass).
pub fn check_agents(agents: &[&Agent], log: &WorkloadLog, timeout: Duration) -> Vec<String> {
    let expected = expected_catalog(log);
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let diffs: Vec<String> = agents
            .iter()
            .flat_map(|a| {
                catalog_diff(a, &expected).unwrap_or_else(|| vec![format!("{}: no answer", a.name)])
            })
            .collect();
        if diffs.is_empty() || std::time::Instant::now() > deadline {
            return diffs;
        }
        std::thread::sleep(Duration::from_millis(200)); // polling interval of a bounded wait
    }
}

// ---------------------------------------------------------------------------------------------
// Operator commands against the replicas.

/// Status of replica `i` as JSON, via `shoal authority status`.
pub fn replica_status(r: &Region3, i: usize) -> Option<Value> {
    let dir = r.tmp.path();
    let out = Command::new(crate::common::shoal_bin())
        .args(["authority", "status", "--timeout-ms", "1000", "--addr"])
        .arg(format!("{}:{RPC_PORT}", auth_ip(r.subnet, i)))
        .arg("--ca")
        .arg(dir.join("dev-ca.pem"))
        .arg("--cert")
        .arg(dir.join("dev-node-node-a.pem"))
        .arg("--key")
        .arg(dir.join("dev-node-node-a-key.pem"))
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// Index in `r.auths` of the leader some running replica reports.
pub fn leader_index(r: &Region3) -> Option<usize> {
    let name = (0..r.auths.len())
        .filter(|i| r.auths[*i].child.is_some())
        .find_map(|i| replica_status(r, i)?["leader"].as_str().map(str::to_owned))?;
    r.auths.iter().position(|a| a.name == name)
}

/// The operator certificate (`operator-ops`) made with the region.
pub fn operator_cert(r: &Region3) -> (PathBuf, PathBuf) {
    let dir = r.tmp.path();
    (
        dir.join("dev-node-operator-ops.pem"),
        dir.join("dev-node-operator-ops-key.pem"),
    )
}

/// Runs `shoal authority members <args>` against replica `via` with `cert`/`key`;
/// (success, stdout JSON or Null, stderr).
pub fn members_cmd_as(
    r: &Region3,
    via: usize,
    cert: &Path,
    key: &Path,
    args: &[&str],
) -> (bool, Value, String) {
    let dir = r.tmp.path();
    let out = Command::new(crate::common::shoal_bin())
        .args(["authority", "members"])
        .args(args)
        .arg("--addr")
        .arg(format!("{}:{RPC_PORT}", auth_ip(r.subnet, via)))
        .arg("--ca")
        .arg(dir.join("dev-ca.pem"))
        .arg("--cert")
        .arg(cert)
        .arg("--key")
        .arg(key)
        .output()
        .unwrap();
    (
        out.status.success(),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// As [`members_cmd_as`] with the operator certificate.
pub fn members_cmd(r: &Region3, via: usize, args: &[&str]) -> (bool, Value, String) {
    let (cert, key) = operator_cert(r);
    members_cmd_as(r, via, &cert, &key, args)
}

/// The voter ids of a `members` JSON answer.
pub fn voters_of(v: &Value) -> Vec<u64> {
    v["members"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["voter"] == true)
                .filter_map(|m| m["id"].as_u64())
                .collect()
        })
        .unwrap_or_default()
}

/// A handle on `a` that talks to its socket but does not own its process (for workload
/// threads while the test keeps killing and restarting processes).
pub fn socket_handle(a: &Agent) -> Agent {
    Agent {
        name: a.name.clone(),
        ip: a.ip.clone(),
        dir: a.dir.clone(),
        config: a.config.clone(),
        socket: a.socket.clone(),
        child: None,
    }
}

/// Starts [`run_workload`] on a thread over handles of every agent of `r`; set the returned
/// flag to stop it, then join the handle for the log.
pub fn spawn_workload(
    r: &Region3,
    workers: usize,
    seed: u64,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<WorkloadLog>,
) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handles: Vec<Agent> = r.agents.iter().map(socket_handle).collect();
    let flag = stop.clone();
    let join = std::thread::spawn(move || {
        let refs: Vec<&Agent> = handles.iter().collect();
        run_workload(&refs, workers, seed, &flag)
    });
    (stop, join)
}
