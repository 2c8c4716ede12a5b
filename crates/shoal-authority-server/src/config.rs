//! `authority.toml`: one replica's configuration.
//!
//! ```toml
//! id = 1                                  # this replica's Raft id (one of members[].id)
//! region = "eu-west"
//! data_dir = "/var/lib/shoal/authority"  # relative paths: relative to this file's directory
//! signing_key = "/etc/shoal/region.key"   # 64 hex chars: the region's ed25519 seed (same on every replica)
//! metrics_addr = "127.0.0.1:9465"         # optional Prometheus text endpoint (loopback)
//! operators = ["ops-alice"]               # node ids treated as operators, besides "operator-*"
//! mesh_addr = "10.0.0.1:7102"             # embedded mesh member (optional; none: no member;
//!                                         # $SHOAL_MESH_ADDR overrides it, e.g. with a pod IP)
//! mesh_seeds = ["10.0.0.20:7946"]         # agent addresses to join through
//!
//! [tls]                                   # the same section as the agent's
//! ca = "/etc/shoal/ca.pem"                # region CA
//! cert = "/etc/shoal/auth-1.pem"          # this replica's node certificate (node id = members[].node)
//! key = "/etc/shoal/auth-1.key"
//!
//! [mesh]                                  # optional SWIM knobs; match the agents' [membership]
//! cluster_size = 1667
//! absent_grace_ms = 60000                 # see MeshKnobs::absent_grace_ms
//!
//! # join = true                         # added later by `members add`; never initialises
//!
//! [[members]]
//! id = 1
//! node = "auth-1"
//! raft_addr = "10.0.0.1:7101"             # replica <-> replica (Raft); IP or DNS name
//! rpc_addr = "10.0.0.1:7100"              # agents -> authority RPC; e.g. "auth-0.auth.shoal.svc:7100"
//! # ... 3 or 5 members
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;
use shoal_proto::{Region, SigningKey, Zone};
use shoal_runtime::config::TlsSection;

use crate::types::{Member, RaftId};

/// Why `[mesh] node_keys` is refused.
pub const NODE_KEYS_REMOVED: &str = "this setting was removed: every lifecycle record now \
carries its owner node's key as the region authority bound it, so no node key is configured \
anywhere (docs/adr/0006-node-keys-in-lifecycle-records.md); delete the setting";

/// One voter in the config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    /// Raft id (unique, non-zero).
    pub id: RaftId,
    /// Shoal node id in the replica's certificate.
    pub node: String,
    /// Raft transport address, `host:port`: an IP or a DNS name (e.g. a StatefulSet's
    /// `auth-0.auth.shoal.svc:7951`). Peers resolve it at connect time; this replica binds
    /// the address its own entry resolves to at start.
    pub raft_addr: String,
    /// Agent RPC address, `host:port` (IP or DNS name). Handed to agents in `NotLeader`
    /// answers; they resolve it at connect time.
    pub rpc_addr: String,
}

/// Resolves `host:port` (an IP address or a DNS name) to its first socket address.
///
/// # Errors
/// Not `host:port`, or the name does not resolve.
pub fn resolve_now(addr: &str) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = addr.parse() {
        return Ok(a);
    }
    addr.to_socket_addrs()
        .with_context(|| format!("resolving {addr:?} (expected host:port)"))?
        .next()
        .with_context(|| format!("{addr:?} resolves to no address"))
}

/// Checks that `addr` has the form `host:port` (without resolving it).
pub(crate) fn check_host_port(what: &str, addr: &str) -> anyhow::Result<()> {
    if addr.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        bail!("{what} {addr:?}: expected host:port");
    };
    if host.is_empty() || port.parse::<u16>().is_err() || host.contains(['/', ' ']) {
        bail!("{what} {addr:?}: expected host:port (an IP address or a DNS name)");
    }
    Ok(())
}

/// A replica's configuration (see the module docs for the file format).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorityConfig {
    /// This replica's Raft id.
    pub id: RaftId,
    /// The region.
    pub region: Region,
    /// Data directory (log, vote, snapshot, audit log).
    pub data_dir: PathBuf,
    /// `[tls]`: region CA, this replica's node certificate and key (the agent's section).
    pub tls: TlsSection,
    /// Path of the region signing key seed (64 hex chars).
    pub signing_key: PathBuf,
    /// Loopback address for the Prometheus text endpoint; none by default.
    #[serde(default)]
    pub metrics_addr: Option<SocketAddr>,
    /// Node ids treated as operators (in addition to any node id starting with `operator-`).
    #[serde(default)]
    pub operators: Vec<String>,
    /// The 3 or 5 voters the cluster was initialised with. With `join = true`: the replicas
    /// of the running cluster this replica will be added to (any number; only their node ids
    /// matter here, to accept their Raft calls) plus this replica's own entry.
    pub members: Vec<MemberConfig>,
    /// This replica is added to a running cluster by `shoal authority members add` and never
    /// initialises one, even when pristine and lowest-id (docs/operations.md, "Replace a
    /// replica"). Default false.
    #[serde(default)]
    pub join: bool,
    /// Raft heartbeat period, ms.
    #[serde(default = "d_heartbeat")]
    pub heartbeat_ms: u64,
    /// Lower bound of the randomised election timeout, ms (upper bound: twice this).
    #[serde(default = "d_election")]
    pub election_timeout_ms: u64,
    /// How long a write may wait for commit before the caller gets `NoQuorum`, ms.
    #[serde(default = "d_write_timeout")]
    pub write_timeout_ms: u64,
    /// A leader that has not heard from a quorum for this long answers `NoQuorum` at once, ms.
    #[serde(default = "d_quorum_stale")]
    pub quorum_stale_ms: u64,
    /// Period of the lease safety-net check on the leader, ms.
    #[serde(default = "d_expire_interval")]
    pub expire_interval_ms: u64,
    /// While any node is down, the leader checkpoints lease downtime into the log at least
    /// this often, ms (docs/adr/0008-lease-checkpoints.md). What a leader change can forget
    /// of a node reported down after the latest checkpoint is bounded by it.
    #[serde(default = "d_lease_checkpoint")]
    pub lease_checkpoint_ms: u64,
    /// Build a snapshot (and compact the log) every this many entries.
    #[serde(default = "d_snapshot_every")]
    pub snapshot_every_logs: u64,
    /// Entries kept in the log behind the snapshot (lets lagging followers catch up by log).
    #[serde(default = "d_keep_logs")]
    pub keep_logs_after_snapshot: u64,
    /// Most agent requests handled concurrently; more are answered `NoQuorum` (counted).
    #[serde(default = "d_max_inflight")]
    pub max_inflight_requests: usize,
    /// Listen address of the embedded mesh member (SWIM datagrams + record streams). `None`:
    /// no member (the lease safety net then has no input; records reach agents only through
    /// the requesting agent).
    #[serde(default)]
    pub mesh_addr: Option<SocketAddr>,
    /// Seeds of the embedded member, `host:port` (agent addresses), resolved at every attempt.
    #[serde(default)]
    pub mesh_seeds: Vec<String>,
    /// Zone the embedded member announces.
    #[serde(default = "d_mesh_zone")]
    pub mesh_zone: String,
    /// Tuning of the embedded member.
    #[serde(default)]
    pub mesh: MeshKnobs,
    /// Global policy keys and remote regions (docs/adr/0013-global-policy-and-failover.md).
    #[serde(default)]
    pub failover: crate::regions::FailoverConfig,
}

/// `[mesh]`: the embedded member's SWIM / dissemination knobs (ms; unset = the tuned default
/// for `cluster_size`) and the leader's liveness rules.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeshKnobs {
    /// Expected region size, sizing SWIM defaults.
    #[serde(default = "d_cluster_size")]
    pub cluster_size: usize,
    /// SWIM probe period.
    pub probe_period_ms: Option<u64>,
    /// SWIM direct-ack wait.
    pub probe_rtt_ms: Option<u64>,
    /// Suspicion window.
    pub suspect_to_down_after_ms: Option<u64>,
    /// Gossip period.
    pub periodic_gossip_ms: Option<u64>,
    /// Join retry while not connected.
    pub join_retry_ms: Option<u64>,
    /// Anti-entropy period.
    pub anti_entropy_interval_ms: Option<u64>,
    /// Longest pause between join attempts, ms.
    #[serde(default = "d_join_max")]
    pub join_max_ms: u64,
    /// A node owning live records that the member has not seen alive for this long after it
    /// became active (it died before this replica joined, e.g. during an authority outage) is
    /// proposed down, so its lease clock starts too. 0 disables.
    #[serde(default = "d_absent_grace")]
    pub absent_grace_ms: u64,
    /// The leader proposes no `NodeDown` while more than this percentage of the nodes it knows
    /// are down or absent (a partition or an isolated member, not node failures).
    #[serde(default = "d_max_down_percent")]
    pub max_down_percent: u8,
    /// Removed setting, kept only to refuse it with a clear message: node keys now come bound
    /// in authority-signed lifecycle records (docs/adr/0006-node-keys-in-lifecycle-records.md).
    #[serde(default)]
    pub node_keys: Option<serde::de::IgnoredAny>,
}

impl MeshKnobs {
    /// The six SWIM / dissemination overrides, as the agent's `[membership]` holds them.
    pub fn swim(&self) -> shoal_runtime::knobs::SwimKnobs {
        shoal_runtime::knobs::SwimKnobs {
            probe_period_ms: self.probe_period_ms,
            probe_rtt_ms: self.probe_rtt_ms,
            suspect_to_down_after_ms: self.suspect_to_down_after_ms,
            periodic_gossip_ms: self.periodic_gossip_ms,
            join_retry_ms: self.join_retry_ms,
            anti_entropy_interval_ms: self.anti_entropy_interval_ms,
        }
    }
}

impl Default for MeshKnobs {
    fn default() -> Self {
        Self {
            cluster_size: d_cluster_size(),
            probe_period_ms: None,
            probe_rtt_ms: None,
            suspect_to_down_after_ms: None,
            periodic_gossip_ms: None,
            join_retry_ms: None,
            anti_entropy_interval_ms: None,
            join_max_ms: d_join_max(),
            absent_grace_ms: d_absent_grace(),
            max_down_percent: d_max_down_percent(),
            node_keys: None,
        }
    }
}

fn d_mesh_zone() -> String {
    "authority".into()
}
fn d_cluster_size() -> usize {
    64
}
fn d_join_max() -> u64 {
    5_000
}
fn d_absent_grace() -> u64 {
    60_000
}
fn d_max_down_percent() -> u8 {
    50
}

// Raft timing for a loaded 2-core host (docs/adr/0008-lease-checkpoints.md): heartbeats every
// 250 ms; a follower waits 1.5-3 s without one before it campaigns, i.e. six missed
// heartbeats. At 100/500 ms a tokio worker or an fsync stalled for ~0.5 s by other builds on
// the same two cores was enough for an election (issue 14: 17 elections for 6 kills).
fn d_heartbeat() -> u64 {
    250
}
fn d_election() -> u64 {
    1_500
}
fn d_lease_checkpoint() -> u64 {
    2_000
}
fn d_write_timeout() -> u64 {
    2_000
}
fn d_quorum_stale() -> u64 {
    1_500
}
fn d_expire_interval() -> u64 {
    1_000
}
fn d_snapshot_every() -> u64 {
    1_000
}
fn d_keep_logs() -> u64 {
    500
}
fn d_max_inflight() -> usize {
    1_024
}

/// Largest `authority.toml` read (1 MiB; a real one is a few KiB even with a long
/// `operators` list).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

impl AuthorityConfig {
    /// Reads and validates a config file.
    ///
    /// # Errors
    /// Unreadable file, bad TOML, or a failed [`AuthorityConfig::validate`].
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let bytes = shoal_transport::keyfile::read_bounded(path, MAX_CONFIG_BYTES)
            .with_context(|| format!("reading {}", path.display()))?;
        let text = String::from_utf8(bytes)
            .with_context(|| format!("reading {}: not UTF-8", path.display()))?;
        let mut cfg = Self::parse(&text).with_context(|| format!("parsing {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        cfg.tls.resolve(base);
        for p in [&mut cfg.data_dir, &mut cfg.signing_key] {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        cfg.override_mesh_addr(std::env::var("SHOAL_MESH_ADDR").ok().as_deref())?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses the TOML text (no validation, paths as written). A file from before the `[tls]`
    /// section (top-level `ca`, `cert`, `key`) is refused with a hint saying where they moved.
    ///
    /// # Errors
    /// Bad TOML, an unknown or missing field.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        toml::from_str(text).map_err(|e| {
            let moved = ["`ca`", "`cert`", "`key`"]
                .iter()
                .any(|f| e.message().contains(&format!("unknown field {f}")));
            if moved {
                anyhow::anyhow!(
                    "{e}\nhint: `ca`, `cert` and `key` now go in a [tls] section, as in agent.toml"
                )
            } else {
                anyhow::Error::new(e)
            }
        })
    }

    /// `SHOAL_MESH_ADDR` (`ip:port`, read by [`AuthorityConfig::load`]) replaces `mesh_addr`:
    /// where the address is only known at start, e.g. a Kubernetes pod IP
    /// (`value: "$(POD_IP):7102"`, deploy/k8s). Empty or unset: the file's value stays.
    ///
    /// # Errors
    /// A value that is not `ip:port` (nothing is changed then).
    pub fn override_mesh_addr(&mut self, value: Option<&str>) -> anyhow::Result<()> {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            let addr = v
                .parse()
                .with_context(|| format!("SHOAL_MESH_ADDR `{v}` is not ip:port"))?;
            self.mesh_addr = Some(addr);
        }
        Ok(())
    }

    /// Checks the member list: 3 or 5 voters (1 allowed for development), unique non-zero ids,
    /// node ids and addresses, and this replica among them.
    ///
    /// # Errors
    /// A description of the first problem.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.mesh.node_keys.is_some() {
            bail!("[mesh] node_keys: {NODE_KEYS_REMOVED}");
        }
        let n = self.members.len();
        if self.join && n == 0 {
            bail!("members: a joining replica lists itself and the running cluster's replicas");
        }
        if !self.join && ![1, 3, 5].contains(&n) {
            bail!("members: {n} voters; use 3 or 5 (1 for development only)");
        }
        let mut ids = std::collections::BTreeSet::new();
        let mut nodes = std::collections::BTreeSet::new();
        for m in &self.members {
            if m.id == 0 || !ids.insert(m.id) {
                bail!("members: id {} is zero or repeated", m.id);
            }
            if !nodes.insert(m.node.clone()) {
                bail!("members: node {} repeated", m.node);
            }
            check_host_port("members[].raft_addr", &m.raft_addr)?;
            check_host_port("members[].rpc_addr", &m.rpc_addr)?;
        }
        if !ids.contains(&self.id) {
            bail!("id {} is not one of the members", self.id);
        }
        if self.heartbeat_ms == 0 || self.election_timeout_ms <= self.heartbeat_ms * 2 {
            bail!("election_timeout_ms must exceed twice heartbeat_ms");
        }
        if self.lease_checkpoint_ms < self.expire_interval_ms {
            bail!("lease_checkpoint_ms must be at least expire_interval_ms");
        }
        if self.mesh.cluster_size == 0 || self.mesh.max_down_percent > 100 {
            bail!("[mesh]: cluster_size must be >= 1 and max_down_percent <= 100");
        }
        if self.mesh_addr.is_some() {
            self.mesh_settings_parts()?;
        }
        Ok(())
    }

    /// This replica's member entry.
    pub fn me(&self) -> &MemberConfig {
        self.members
            .iter()
            .find(|m| m.id == self.id)
            .expect("validated: id is a member")
    }

    /// The voters as openraft nodes.
    pub fn raft_members(&self) -> BTreeMap<RaftId, Member> {
        self.members
            .iter()
            .map(|m| {
                (
                    m.id,
                    Member {
                        node: m.node.clone(),
                        raft_addr: m.raft_addr.clone(),
                        rpc_addr: m.rpc_addr.clone(),
                    },
                )
            })
            .collect()
    }

    /// The embedded member's zone and mesh tuning (validated).
    ///
    /// # Errors
    /// A bad zone, SWIM timings foca refuses, or the removed `node_keys` setting.
    pub fn mesh_settings_parts(&self) -> anyhow::Result<(Zone, shoal_mesh::MeshConfig)> {
        let zone = Zone::new(self.mesh_zone.clone()).context("mesh_zone")?;
        if self.mesh.node_keys.is_some() {
            bail!("[mesh] node_keys: {NODE_KEYS_REMOVED}");
        }
        let mut mesh = shoal_mesh::MeshConfig::for_cluster_size(self.mesh.cluster_size);
        self.mesh.swim().apply(&mut mesh);
        mesh.membership
            .validate()
            .map_err(|e| anyhow::anyhow!("[mesh]: {e}"))?;
        Ok((zone, mesh))
    }

    /// Reads the region signing key.
    ///
    /// # Errors
    /// Unreadable file or not 64 hex characters.
    pub fn load_signing_key(&self) -> anyhow::Result<SigningKey> {
        read_signing_key(&self.signing_key)
    }
}

/// Reads a signing key seed file (64 hex chars, surrounding whitespace ignored).
///
/// # Errors
/// Unreadable file, a file readable or writable by group or others (refused, as OpenSSH
/// refuses an unprotected private key), or not 64 hex characters.
pub fn read_signing_key(path: &Path) -> anyhow::Result<SigningKey> {
    let bytes = shoal_transport::keyfile::read_private(path)
        .with_context(|| format!("reading signing key {}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    let bytes = from_hex(text.trim())
        .filter(|b| b.len() == 32)
        .with_context(|| format!("{}: expected 64 hex characters", path.display()))?;
    let mut seed = [0u8; 32];
    seed.copy_from_slice(&bytes);
    Ok(SigningKey::from_seed(seed))
}

pub use shoal_runtime::config::{from_hex, to_hex};

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
id = 1
region = "eu-west"
data_dir = "/tmp/x"
signing_key = "s.key"
[tls]
ca = "ca.pem"
cert = "c.pem"
key = "k.pem"

[[members]]
id = 1
node = "auth-1"
raft_addr = "127.0.0.1:7101"
rpc_addr = "127.0.0.1:7100"
"#;

    #[test]
    fn the_removed_node_keys_setting_is_refused_naming_adr_0006() {
        let ok: AuthorityConfig = toml::from_str(BASE).unwrap();
        ok.validate().unwrap();
        let old = BASE.replace(
            "[[members]]",
            "[mesh]\nnode_keys = { \"node-2\" = \"00\" }\n\n[[members]]",
        );
        let cfg: AuthorityConfig = toml::from_str(&old).unwrap();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("node_keys"), "{err}");
        assert!(err.contains("0006-node-keys-in-lifecycle-records"), "{err}");
        assert!(cfg.mesh_settings_parts().is_err());
    }

    #[test]
    fn tls_files_outside_the_tls_section_are_refused_with_a_hint() {
        let ok = AuthorityConfig::parse(BASE).unwrap();
        assert_eq!(ok.tls.cert, PathBuf::from("c.pem"));
        // The same three lines at the top level, as files before the section had them.
        let old = BASE.replace("[tls]\n", "");
        let err = AuthorityConfig::parse(&old).unwrap_err().to_string();
        assert!(err.contains("unknown field `ca`"), "{err}");
        assert!(err.contains("[tls] section"), "{err}");
        let other = BASE.replace("id = 1\nregion", "id = 1\ncolour = \"red\"\nregion");
        let err = AuthorityConfig::parse(&other).unwrap_err().to_string();
        assert!(err.contains("colour") && !err.contains("hint"), "{err}");
    }

    #[test]
    fn relative_paths_are_relative_to_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("authority.toml");
        std::fs::write(
            &path,
            BASE.replace("data_dir = \"/tmp/x\"", "data_dir = \"data\""),
        )
        .unwrap();
        let cfg = AuthorityConfig::load(&path).unwrap();
        assert_eq!(cfg.tls.ca, dir.path().join("ca.pem"));
        assert_eq!(cfg.signing_key, dir.path().join("s.key"));
        assert_eq!(cfg.data_dir, dir.path().join("data"));
    }

    #[test]
    fn addresses_may_be_dns_names_and_are_checked_for_host_port() {
        for ok in [
            "10.0.0.1:7100",
            "[::1]:7100",
            "auth-0.auth.shoal.svc:7950",
            "localhost:1",
        ] {
            check_host_port("x", ok).unwrap();
        }
        for bad in [
            "auth-0",
            "auth-0:",
            ":7100",
            "auth-0:http",
            "a b:1",
            "10.0.0.1",
        ] {
            assert!(check_host_port("x", bad).is_err(), "{bad} accepted");
        }
        let a = resolve_now("localhost:7100").unwrap();
        assert!(a.ip().is_loopback() && a.port() == 7100, "{a}");
        assert!(resolve_now("no-such-host.invalid:1").is_err());
    }

    #[test]
    fn a_config_with_dns_member_addresses_validates() {
        let text = r#"
id = 1
region = "dev"
data_dir = "/tmp/x"
signing_key = "s.key"
[tls]
ca = "ca.pem"
cert = "c.pem"
key = "k.pem"
[[members]]
id = 1
node = "auth-0"
raft_addr = "auth-0.auth.shoal.svc:7951"
rpc_addr = "auth-0.auth.shoal.svc:7950"
"#;
        let cfg: AuthorityConfig = toml::from_str(text).unwrap();
        cfg.validate().unwrap();
        assert_eq!(
            cfg.raft_members()[&1].rpc_addr,
            "auth-0.auth.shoal.svc:7950"
        );
        let bad = text.replace("auth-0.auth.shoal.svc:7951", "auth-0.auth.shoal.svc");
        let cfg: AuthorityConfig = toml::from_str(&bad).unwrap();
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn shoal_mesh_addr_overrides_the_file_and_bad_values_change_nothing() {
        let mut cfg: AuthorityConfig = toml::from_str(BASE).unwrap();
        assert_eq!(cfg.mesh_addr, None);
        cfg.override_mesh_addr(None).unwrap();
        cfg.override_mesh_addr(Some("")).unwrap();
        assert_eq!(cfg.mesh_addr, None);
        cfg.override_mesh_addr(Some("10.1.2.3:7102")).unwrap();
        assert_eq!(cfg.mesh_addr, Some("10.1.2.3:7102".parse().unwrap()));
        let err = cfg.override_mesh_addr(Some("pod:7102")).unwrap_err();
        assert!(err.to_string().contains("SHOAL_MESH_ADDR"), "{err}");
        assert_eq!(cfg.mesh_addr, Some("10.1.2.3:7102".parse().unwrap()));
    }
}
