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
            Command::new(env!("CARGO_BIN_EXE_shoal"))
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
        let extra = ["node-x".to_owned()]; // the rogue member of the bad-signature check
        for name in names
            .iter()
            .cloned()
            .chain((1..=3).map(|i| format!("auth-{i}")))
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
        let mesh_addrs: Vec<String> = (0..3)
            .map(|i| format!("\"{}:{MESH_PORT}\"", auth_ip(subnet, i)))
            .collect();
        let rpc_addrs: Vec<String> = (0..3)
            .map(|i| format!("\"{}:{RPC_PORT}\"", auth_ip(subnet, i)))
            .collect();
        let mut members = String::new();
        for i in 0..3 {
            let ip = auth_ip(subnet, i);
            members.push_str(&format!(
                "[[members]]\nid = {}\nnode = \"auth-{}\"\nraft_addr = \"{ip}:{RAFT_PORT}\"\nrpc_addr = \"{ip}:{RPC_PORT}\"\n\n",
                i + 1,
                i + 1
            ));
        }
        // The agents' SWIM timings (common::MEMBERSHIP) without the agent-only key.
        let knobs: String = MEMBERSHIP
            .lines()
            .filter(|l| !l.starts_with('['))
            .map(|l| format!("{l}\n"))
            .collect();
        let mut auths = Vec::new();
        for i in 0..3 {
            let name = format!("auth-{}", i + 1);
            let config = dir.join(format!("{name}.toml"));
            let text = format!(
                "id = {}\nregion = \"dev\"\ndata_dir = \"{}\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
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
        }
    }

    pub fn start_all(&mut self) {
        for a in &mut self.auths {
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
