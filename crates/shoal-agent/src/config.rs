//! The agent's configuration: one TOML file, validated at start, unknown fields refused.
//!
//! ```toml
//! node_id = "node-1"
//! region = "eu-west"
//! zone = "eu-west-1a"
//! data_dir = "/var/lib/shoal"
//! listen = "10.0.0.1:7946"          # QUIC (UDP) for the mesh and the authority RPC
//! socket = "/run/shoal/agent.sock"  # local API (HTTP/1.1 over a unix socket, mode 0660)
//! metrics = "127.0.0.1:9464"        # Prometheus text on a loopback TCP port
//! metrics_max_connections = 64      # past it closed at accept (counted); heads within
//!                                   # [api] header_read_timeout_ms, idle keep-alive too
//! seeds = ["10.0.0.2:7946", "shoal-seed.internal:7946"]
//!
//! [tls]
//! ca = "eu-west-ca.pem"
//! cert = "eu-west-node-node-1.pem"
//! key = "eu-west-node-node-1-key.pem"
//!
//! [trust]
//! authority_keys = ["<64 hex chars>"]            # two during a key rotation
//!
//! [authority]
//! addresses = ["10.0.0.10:7946"]
//!
//! [api]                             # local API limits (defaults shown)
//! header_read_timeout_ms = 10000    # request head must arrive within this (idle keep-alive
//!                                   # too); the metrics port's as well
//! body_read_timeout_ms = 10000      # request body must arrive within this (408 otherwise)
//! max_body_bytes = 65536            # larger bodies: 413
//! max_connections = 4096            # total; capped at RLIMIT_NOFILE - fd_reserve (503 over it)
//! max_connections_per_uid = 512     # per peer uid (429 over it)
//! max_instances_per_caller = 1024   # instances one uid may own here (429 `instance_limit`
//!                                   # past it); at most 65536 (the owner table)
//! eject_ms = 30000                  # local ejection after a failure report (max 600000)
//! max_ejection_percent = 50         # of a service's routable endpoints ejected at once
//!                                   # (at least one, never the last routable one not
//!                                   # ejected); past it reports are 409
//! fd_reserve = 256                  # descriptors kept for persistence, the mesh, probes, logs
//!                                   # (the enabled TCP ports' caps are kept out too: metrics,
//!                                   # consul, dns, xds)
//! socket_mode = 0o660               # the outer gate: who may open the socket at all
//! socket_group = "shoal-clients"    # optional group of the socket (chown at start)
//!
//! [consul]                          # Consul-compatible reads (docs/api/consul.md); off by default
//! listen = "127.0.0.1:8500"         # loopback unless allow_non_loopback = true; anyone on the host can read
//! max_connections = 1024            # past it closed at accept; idle ones closed after 10 s
//!
//! [dns]                             # DNS, UDP + TCP (crate::dns); off by default
//! listen = "127.0.0.1:8600"         # <service>.<port>.<namespace>.service.<domain> SRV / A / AAAA
//! domain = "shoal"
//! ttl_s = 0                         # 0..=60
//! max_tcp_connections = 128         # DNS over TCP; past it closed at accept (counted)
//!
//! [probes]
//! allow_exec = false                # exec probes refused unless true (they run as the registrant)
//!
//! [xds]                             # opt-in xDS server for Envoy / proxyless gRPC (docs/api/xds.md)
//! enabled = false
//! listen = "127.0.0.1:18000"
//! max_connections = 256             # TCP connections; past it closed at accept (counted)
//! handshake_timeout_ms = 5000       # accept -> first ADS call, else closed
//! keepalive_ms = 30000              # HTTP/2 PING interval; unanswered 10 s: closed
//!
//! [access]                          # who may write (see `crate::access`); writes fail closed
//! reads = "open"                    # or "granted"
//! [[access.grants]]
//! users = ["web"]
//! services = ["prod/web/*"]
//! rights = ["register", "change_own"]
//! [[access.grants]]
//! groups = ["deployers"]
//! services = ["prod/*"]
//! rights = ["orchestrator"]
//! ```
//!
//! The metrics listener must be a loopback address unless `metrics_allow_non_loopback = true`
//! (the metrics carry service names and counts; there is no authentication on it). With
//! `[access] reads = "granted"` the per-service series are withheld (exported summed under
//! `service="_withheld"`) unless `metrics_service_labels = true`: the metrics port cannot tell
//! who reads, as the Consul, DNS and xDS ports cannot (those refuse to start in that mode).
//! `[access] dev_allow_all = true` (every local caller may do everything) is for the local
//! development scripts only and is logged loudly at start.
//!
//! Common fields can be overridden from the environment (`SHOAL_NODE_ID`, `SHOAL_REGION`,
//! `SHOAL_ZONE`, `SHOAL_DATA_DIR`, `SHOAL_LISTEN`, `SHOAL_SOCKET`, `SHOAL_METRICS`,
//! `SHOAL_SEEDS` comma-separated) and from `shoal agent` flags, flags winning.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use shoal_mesh::MeshConfig;
use shoal_proto::{NodeId, Region, TrustedKeys, VerifyingKey, Zone};
use shoal_runtime::config::{parse_public_key, parse_public_keys};

use crate::probes::ProbeSpec;

/// Default path of the local API socket.
pub const DEFAULT_SOCKET: &str = "/run/shoal/agent.sock";

/// Why the configuration was refused. The agent does not start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error. In the message, and deliberately not the error's `source()`: the
        /// `{:#}` of a binary's error chain would print it twice.
        error: std::io::Error,
    },
    /// The TOML does not parse or has unknown / mistyped fields.
    #[error("config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What toml said (names the field and line).
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("config field `{field}`: {message}")]
    Invalid {
        /// Dotted field name.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
}

fn invalid(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        message: message.into(),
    }
}

/// The whole agent configuration (the TOML file's shape).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// This node's id; must match the node certificate's identity.
    pub node_id: String,
    /// This node's region; must match the certificate.
    pub region: String,
    /// This node's zone (pick prefers it).
    pub zone: String,
    /// Directory for the node key, boot counter and persisted snapshots.
    pub data_dir: PathBuf,
    /// UDP address for QUIC (mesh + authority RPC).
    pub listen: SocketAddr,
    /// Address announced to peers (default: `listen`).
    #[serde(default)]
    pub advertise: Option<SocketAddr>,
    /// Unix socket of the local API.
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// Loopback TCP address of `/metrics` (None: metrics not served).
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
    /// Allow a non-loopback `metrics` address (unauthenticated; off by default).
    #[serde(default)]
    pub metrics_allow_non_loopback: bool,
    /// Most open connections to the metrics port; past it closed at accept and counted
    /// (`shoal_metrics_connections_refused_total`). Kept out of the local API's fd budget.
    /// A request head must arrive within `[api] header_read_timeout_ms` (idle keep-alive too).
    #[serde(default = "default_metrics_max_connections")]
    pub metrics_max_connections: usize,
    /// Export per-service series on `/metrics` (`shoal_ready_endpoints{service}`,
    /// `shoal_no_backend_total{service}`). Unset: yes with `[access] reads = "open"`, no with
    /// `reads = "granted"`: the metrics port has no caller identity, so its labels would show
    /// every service key to whoever can connect; the series are then exported once, under
    /// `service="_withheld"`, summed over every service. `true` exports them anyway
    /// (logged at start), `false` withholds them in either mode.
    #[serde(default)]
    pub metrics_service_labels: Option<bool>,
    /// Seed addresses `host:port` (IP or DNS name, resolved at every join attempt).
    #[serde(default)]
    pub seeds: Vec<String>,
    /// Expected region size, sizing SWIM defaults.
    #[serde(default = "default_cluster_size")]
    pub cluster_size: usize,
    /// Certificates.
    pub tls: shoal_runtime::config::TlsSection,
    /// Trusted keys.
    #[serde(default)]
    pub trust: TrustConfig,
    /// Region authority.
    #[serde(default)]
    pub authority: AuthorityConfig,
    /// SWIM and dissemination knobs.
    #[serde(default)]
    pub membership: MembershipKnobs,
    /// Persistence.
    #[serde(default)]
    pub persist: PersistConfig,
    /// Local API behaviour.
    #[serde(default)]
    pub api: ApiConfig,
    /// Auto-join backoff.
    #[serde(default)]
    pub join: JoinConfig,
    /// Health probe limits.
    #[serde(default)]
    pub probes: ProbesConfig,
    /// Who may do what on the local socket.
    #[serde(default)]
    pub access: crate::access::AccessConfig,
    /// The Consul-compatible read port (off unless `listen` is set).
    #[serde(default)]
    pub consul: crate::consul::ConsulConfig,
    /// DNS (off unless `listen` is set).
    #[serde(default)]
    pub dns: crate::dns::DnsConfig,
    /// Instances declared in the file (registered at start).
    #[serde(default)]
    pub instances: Vec<InstanceConfig>,
    /// `[xds]`: the opt-in xDS (ADS) server for Envoy and proxyless gRPC (crate `shoal-xds`).
    #[serde(default)]
    pub xds: shoal_xds::XdsConfig,
    /// Global policy keys and the failover feed (docs/adr/0013-global-policy-and-failover.md).
    #[serde(default)]
    pub failover: crate::failover::FailoverConfig,
}

/// Default `metrics_max_connections`: a Prometheus server or two, an operator's curl.
pub const DEFAULT_METRICS_MAX_CONNECTIONS: usize = 64;

fn default_metrics_max_connections() -> usize {
    DEFAULT_METRICS_MAX_CONNECTIONS
}

fn default_socket() -> PathBuf {
    PathBuf::from(DEFAULT_SOCKET)
}
fn default_cluster_size() -> usize {
    64
}

/// `[trust]`: keys whose signatures this agent accepts.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustConfig {
    /// Authority public keys of this region (hex, 32 bytes); two during a rotation.
    #[serde(default)]
    pub authority_keys: Vec<String>,
    /// Removed setting, kept only to refuse it with a clear message: node keys now come bound
    /// in authority-signed lifecycle records (docs/adr/0006-node-keys-in-lifecycle-records.md).
    #[serde(default)]
    pub node_keys: Option<serde::de::IgnoredAny>,
    /// Trust the well-known, INSECURE development authority key of this region (for agents that
    /// forward to a peer running `--dev-authority`).
    #[serde(default)]
    pub dev_authority: bool,
}

/// `[authority]`: where lifecycle requests go.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthorityConfig {
    /// Authority replica addresses, `host:port` of their QUIC endpoints: IPs or DNS names
    /// (e.g. `auth-0.auth.shoal.svc:7950`), resolved at every call.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// Run the DEVELOPMENT authority in-process (INSECURE well-known key; never in production).
    #[serde(default)]
    pub dev: bool,
    /// Timeout of one RPC attempt, ms.
    #[serde(default = "default_rpc_timeout_ms")]
    pub rpc_timeout_ms: u64,
    /// Total budget of one lifecycle call across retries, ms.
    #[serde(default = "default_rpc_budget_ms")]
    pub rpc_budget_ms: u64,
    /// Period of the status ping that measures "last authority contact", ms.
    #[serde(default = "default_status_interval_ms")]
    pub status_interval_ms: u64,
    /// Lease given to registered instances, ms.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u32,
}

fn default_rpc_timeout_ms() -> u64 {
    1_000
}
fn default_rpc_budget_ms() -> u64 {
    5_000
}
fn default_status_interval_ms() -> u64 {
    5_000
}
fn default_lease_ms() -> u32 {
    300_000
}

impl Default for AuthorityConfig {
    fn default() -> Self {
        Self {
            addresses: Vec::new(),
            dev: false,
            rpc_timeout_ms: default_rpc_timeout_ms(),
            rpc_budget_ms: default_rpc_budget_ms(),
            status_interval_ms: default_status_interval_ms(),
            lease_ms: default_lease_ms(),
        }
    }
}

/// `[membership]`: overrides of the SWIM / dissemination defaults (ms; unset = the tuned
/// default for `cluster_size`). The same type as the authority's `[mesh]` knobs
/// (`shoal_runtime::knobs`), so both daemons read and apply them identically.
pub type MembershipKnobs = shoal_runtime::knobs::SwimKnobs;

/// `[persist]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PersistConfig {
    /// Snapshot period, ms.
    #[serde(default = "default_persist_ms")]
    pub interval_ms: u64,
}

fn default_persist_ms() -> u64 {
    10_000
}

impl Default for PersistConfig {
    fn default() -> Self {
        Self {
            interval_ms: default_persist_ms(),
        }
    }
}

/// `[api]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// Past this long without authority contact or mesh peers, answers carry `stale: true`.
    #[serde(default = "default_staleness_ms")]
    pub staleness_budget_ms: u64,
    /// Upper bound of a blocking query's wait, ms.
    #[serde(default = "default_max_wait_ms")]
    pub max_wait_ms: u64,
    /// Default local ejection after a failure report, ms (at most `api::MAX_EJECT_MS`).
    #[serde(default = "default_eject_ms")]
    pub eject_ms: u64,
    /// Most of a service's routable endpoints that reports may eject at once, percent (rounded
    /// down, at least one, but never the last routable endpoint that is not ejected: reports
    /// cannot empty a service); a report past it is answered 409 `ejection_cap` and ejects
    /// nothing. Envoy's outlier detection has `max_ejection_percent` (10 by default).
    #[serde(default = "default_max_ejection_percent")]
    pub max_ejection_percent: u8,
    /// A connection's request head must arrive within this, ms (idle keep-alive included);
    /// on the local socket and on the metrics port.
    #[serde(default = "default_io_timeout_ms")]
    pub header_read_timeout_ms: u64,
    /// A request body must arrive within this, ms (408 otherwise).
    #[serde(default = "default_io_timeout_ms")]
    pub body_read_timeout_ms: u64,
    /// Largest request body, bytes (413 over it).
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Most open local API connections in total (503 over it); lowered at start to the fd
    /// limit minus `fd_reserve`.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Most open local API connections per peer uid (429 over it).
    #[serde(default = "default_max_connections_per_uid")]
    pub max_connections_per_uid: usize,
    /// Most instances one local caller (uid) may own on this node; a registration of a new
    /// instance past it is answered 429 `instance_limit` and registers nothing. Bounds what one
    /// unprivileged user with `register` on a prefix can put into the region's catalog (QA:
    /// ~11,700 instances in 5 minutes). The agent's own `[[instances]]` are not counted
    /// against it.
    #[serde(default = "default_max_instances_per_caller")]
    pub max_instances_per_caller: usize,
    /// File descriptors kept out of the connection budget (persistence, mesh, probes, logs).
    #[serde(default = "default_fd_reserve")]
    pub fd_reserve: usize,
    /// Mode of the socket file (the outer gate: who may connect at all).
    #[serde(default = "default_socket_mode")]
    pub socket_mode: u32,
    /// Group given to the socket file at start (name or numeric gid).
    #[serde(default)]
    pub socket_group: Option<String>,
}

fn default_io_timeout_ms() -> u64 {
    10_000
}
fn default_max_body_bytes() -> usize {
    64 * 1024
}
fn default_max_connections() -> usize {
    4_096
}
fn default_max_connections_per_uid() -> usize {
    512
}
fn default_max_instances_per_caller() -> usize {
    1_024
}
fn default_fd_reserve() -> usize {
    256
}
fn default_socket_mode() -> u32 {
    0o660
}

fn default_staleness_ms() -> u64 {
    30_000
}
fn default_max_wait_ms() -> u64 {
    300_000
}
fn default_eject_ms() -> u64 {
    30_000
}
fn default_max_ejection_percent() -> u8 {
    50
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            staleness_budget_ms: default_staleness_ms(),
            max_wait_ms: default_max_wait_ms(),
            eject_ms: default_eject_ms(),
            max_ejection_percent: default_max_ejection_percent(),
            header_read_timeout_ms: default_io_timeout_ms(),
            body_read_timeout_ms: default_io_timeout_ms(),
            max_body_bytes: default_max_body_bytes(),
            max_connections: default_max_connections(),
            max_connections_per_uid: default_max_connections_per_uid(),
            max_instances_per_caller: default_max_instances_per_caller(),
            fd_reserve: default_fd_reserve(),
            socket_mode: default_socket_mode(),
            socket_group: None,
        }
    }
}

/// `[join]`: exponential backoff with full jitter until the membership is active.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinConfig {
    /// First backoff ceiling, ms.
    #[serde(default = "default_join_base_ms")]
    pub base_ms: u64,
    /// Backoff ceiling cap, ms.
    #[serde(default = "default_join_max_ms")]
    pub max_ms: u64,
}

fn default_join_base_ms() -> u64 {
    500
}
fn default_join_max_ms() -> u64 {
    30_000
}

impl Default for JoinConfig {
    fn default() -> Self {
        Self {
            base_ms: default_join_base_ms(),
            max_ms: default_join_max_ms(),
        }
    }
}

/// `[probes]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbesConfig {
    /// Probes running at once on this node (capacity protection).
    #[serde(default = "default_probe_concurrency")]
    pub max_concurrent: usize,
    /// Accept `exec` probes (off by default). They run as the registering uid/gid with an
    /// empty environment (PATH only), bounded output, and their process group killed on
    /// timeout; an agent not running as root refuses exec probes from other uids.
    #[serde(default)]
    pub allow_exec: bool,
}

fn default_probe_concurrency() -> usize {
    16
}

impl Default for ProbesConfig {
    fn default() -> Self {
        Self {
            max_concurrent: default_probe_concurrency(),
            allow_exec: false,
        }
    }
}

/// `[[instances]]`: an instance of this node registered at start.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceConfig {
    /// `namespace/service/port`.
    pub service: String,
    /// Stable instance id.
    pub instance: String,
    /// `ip:port`.
    pub address: SocketAddr,
    /// Version string.
    #[serde(default = "default_version")]
    pub version: String,
    /// Weight 1..=10000.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Zone (default: the node's).
    #[serde(default)]
    pub zone: Option<String>,
    /// Labels by predefined dimension.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Probes.
    #[serde(default)]
    pub probes: crate::probes::ProbeSet,
}

/// Default version string of an instance.
pub fn default_version() -> String {
    "0.0.0".into()
}
/// Default weight of an instance.
pub fn default_weight() -> u32 {
    100
}

/// Command-line / environment overrides of common fields.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Node id.
    pub node_id: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Zone.
    pub zone: Option<String>,
    /// Data dir.
    pub data_dir: Option<PathBuf>,
    /// QUIC listen address.
    pub listen: Option<SocketAddr>,
    /// API socket.
    pub socket: Option<PathBuf>,
    /// Metrics address.
    pub metrics: Option<SocketAddr>,
    /// Seeds (replace the file's).
    pub seeds: Option<Vec<String>>,
    /// Run the development authority.
    pub dev_authority: bool,
}

impl Overrides {
    /// Reads `SHOAL_*` variables; `self`'s values (flags) win over them.
    ///
    /// # Errors
    /// A variable that does not parse.
    pub fn with_env(mut self) -> Result<Self, ConfigError> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        self.node_id = self.node_id.or_else(|| env("SHOAL_NODE_ID"));
        self.region = self.region.or_else(|| env("SHOAL_REGION"));
        self.zone = self.zone.or_else(|| env("SHOAL_ZONE"));
        self.data_dir = self
            .data_dir
            .or_else(|| env("SHOAL_DATA_DIR").map(PathBuf::from));
        self.socket = self
            .socket
            .or_else(|| env("SHOAL_SOCKET").map(PathBuf::from));
        if self.listen.is_none() {
            if let Some(v) = env("SHOAL_LISTEN") {
                self.listen = Some(
                    v.parse()
                        .map_err(|_| invalid("SHOAL_LISTEN", format!("`{v}` is not ip:port")))?,
                );
            }
        }
        if self.metrics.is_none() {
            if let Some(v) = env("SHOAL_METRICS") {
                self.metrics = Some(
                    v.parse()
                        .map_err(|_| invalid("SHOAL_METRICS", format!("`{v}` is not ip:port")))?,
                );
            }
        }
        if self.seeds.is_none() {
            self.seeds = env("SHOAL_SEEDS").map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_owned())
                    .collect::<Vec<_>>()
            });
        }
        Ok(self)
    }
}

/// A validated configuration with parsed identifiers and keys.
#[derive(Debug, Clone)]
pub struct Validated {
    /// The raw configuration (paths made absolute).
    pub raw: AgentConfig,
    /// Node id.
    pub node_id: NodeId,
    /// Region.
    pub region: Region,
    /// Zone.
    pub zone: Zone,
    /// Trusted authority keys.
    pub authority_keys: Vec<VerifyingKey>,
    /// Trusted global policy keys (`[failover] policy_keys`).
    pub policy_keys: TrustedKeys,
    /// Mesh tuning after overrides.
    pub mesh: MeshConfig,
    /// The compiled `[access]` policy (names resolved at start).
    pub access: crate::access::Policy,
    /// The agent's effective uid (an admin of the local API).
    pub agent_uid: u32,
    /// Gid for the socket file, when `[api] socket_group` is set.
    pub socket_gid: Option<u32>,
    /// Whether `/metrics` carries per-service labels (`metrics_service_labels`, defaulting
    /// to whether reads are open).
    pub metrics_per_service: bool,
}

/// Why `node_keys` is refused (agent `[trust]` and authority `[mesh]` alike).
pub const NODE_KEYS_REMOVED: &str = "this setting was removed: every lifecycle record now \
carries its owner node's key as the region authority bound it, so no node key is configured \
anywhere (docs/adr/0006-node-keys-in-lifecycle-records.md); delete the setting";

/// Largest agent config file read (1 MiB; a real one is a few KiB even with long `[access]`
/// and `[[instances]]` lists): `shoal agent --config /dev/zero` is refused, not read until
/// memory runs out.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Loads, overrides and validates.
///
/// # Errors
/// [`ConfigError`] naming the file, field and problem.
pub fn load(path: &Path, overrides: Overrides) -> Result<Validated, ConfigError> {
    let read_error = |error| ConfigError::Read {
        path: path.to_owned(),
        error,
    };
    let bytes =
        shoal_transport::keyfile::read_bounded(path, MAX_CONFIG_BYTES).map_err(read_error)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        read_error(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8: {e}"),
        ))
    })?;
    let mut raw: AgentConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    raw.tls.resolve(base);
    if raw.data_dir.is_relative() {
        raw.data_dir = base.join(&raw.data_dir);
    }
    apply_overrides(&mut raw, overrides);
    validate(raw)
}

fn apply_overrides(raw: &mut AgentConfig, o: Overrides) {
    if let Some(v) = o.node_id {
        raw.node_id = v;
    }
    if let Some(v) = o.region {
        raw.region = v;
    }
    if let Some(v) = o.zone {
        raw.zone = v;
    }
    if let Some(v) = o.data_dir {
        raw.data_dir = v;
    }
    if let Some(v) = o.listen {
        raw.listen = v;
    }
    if let Some(v) = o.socket {
        raw.socket = v;
    }
    if let Some(v) = o.metrics {
        raw.metrics = Some(v);
    }
    if let Some(v) = o.seeds {
        raw.seeds = v;
    }
    if o.dev_authority {
        raw.authority.dev = true;
    }
}

/// Validates a parsed configuration.
///
/// # Errors
/// [`ConfigError::Invalid`] for the first bad field.
pub fn validate(raw: AgentConfig) -> Result<Validated, ConfigError> {
    let node_id =
        NodeId::new(raw.node_id.clone()).map_err(|e| invalid("node_id", e.to_string()))?;
    let region = Region::new(raw.region.clone()).map_err(|e| invalid("region", e.to_string()))?;
    let zone = Zone::new(raw.zone.clone()).map_err(|e| invalid("zone", e.to_string()))?;
    if raw.listen.port() == 0 && raw.advertise.is_none() {
        return Err(invalid("listen", "port 0 needs `advertise`"));
    }
    if let Some(m) = raw.metrics {
        if !m.ip().is_loopback() && !raw.metrics_allow_non_loopback {
            return Err(invalid(
                "metrics",
                format!("{m} is not a loopback address (set metrics_allow_non_loopback = true to force)"),
            ));
        }
    }
    if raw.metrics_max_connections == 0 {
        return Err(invalid("metrics_max_connections", "must be >= 1"));
    }
    crate::consul::validate_read_port(
        "consul.listen",
        raw.consul.listen,
        raw.consul.allow_non_loopback,
        raw.access.reads,
    )
    .map_err(|(field, message)| invalid(field, message))?;
    crate::dns::validate(&raw.dns, raw.access.reads)
        .map_err(|(field, message)| invalid(field, message))?;
    if raw.xds.enabled {
        raw.xds
            .validate()
            .map_err(|e| invalid("xds", e.to_string()))?;
        if raw.access.reads == crate::access::ReadAccess::Granted {
            return Err(invalid(
                "xds.enabled",
                "the xDS port has no caller identity, so it cannot honour [access] reads = \"granted\"",
            ));
        }
    }
    let api = &raw.api;
    if api.header_read_timeout_ms == 0 || api.body_read_timeout_ms == 0 {
        return Err(invalid(
            "api.header_read_timeout_ms",
            "header and body read timeouts must be > 0",
        ));
    }
    if api.max_body_bytes == 0 || api.max_body_bytes > 16 * 1024 * 1024 {
        return Err(invalid("api.max_body_bytes", "must be in 1..=16 MiB"));
    }
    if api.max_connections == 0 || api.max_connections_per_uid == 0 {
        return Err(invalid(
            "api.max_connections",
            "connection caps must be >= 1",
        ));
    }
    if api.max_instances_per_caller == 0 || api.max_instances_per_caller > crate::access::MAX_OWNED
    {
        return Err(invalid(
            "api.max_instances_per_caller",
            format!("must be in 1..={}", crate::access::MAX_OWNED),
        ));
    }
    if api.eject_ms == 0 || api.eject_ms > crate::api::MAX_EJECT_MS {
        return Err(invalid(
            "api.eject_ms",
            format!("must be in 1..={}", crate::api::MAX_EJECT_MS),
        ));
    }
    if !(1..=100).contains(&api.max_ejection_percent) {
        return Err(invalid("api.max_ejection_percent", "must be in 1..=100"));
    }
    if api.socket_mode > 0o777 {
        return Err(invalid("api.socket_mode", "must be a file mode (<= 0o777)"));
    }
    let socket_gid = match &api.socket_group {
        None => None,
        Some(g) => Some(match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => crate::access::Directory::group(&crate::access::SystemDirectory, g)
                .map(|(gid, _)| gid)
                .ok_or_else(|| invalid("api.socket_group", format!("unknown group `{g}`")))?,
        }),
    };
    let agent_uid = nix::unistd::geteuid().as_raw();
    let access =
        crate::access::Policy::compile(&raw.access, agent_uid, &crate::access::SystemDirectory)
            .map_err(|e| invalid("access.grants", e))?;
    let mut authority_keys = Vec::new();
    for k in &raw.trust.authority_keys {
        authority_keys
            .push(parse_public_key(k).map_err(|e| invalid("trust.authority_keys", e.to_string()))?);
    }
    let policy_keys = parse_public_keys(&raw.failover.policy_keys)
        .map_err(|e| invalid("failover.policy_keys", e.to_string()))?;
    if raw.trust.node_keys.is_some() {
        return Err(invalid("trust.node_keys", NODE_KEYS_REMOVED));
    }
    if authority_keys.is_empty() && !raw.trust.dev_authority && !raw.authority.dev {
        // Without a key every record is refused: the agent would join, report ready and
        // serve an empty catalog (QA found exactly that, with no warning).
        return Err(invalid(
            "trust.authority_keys",
            "no authority key to trust: set [trust] authority_keys (the region authority's \
             public key, which `shoal authority keygen` printed) or, for development only, \
             [trust] dev_authority = true",
        ));
    }
    if !raw.authority.dev && raw.authority.addresses.is_empty() {
        tracing::warn!("no [authority] addresses and no dev authority: lifecycle calls will fail");
    }
    if raw.authority.rpc_timeout_ms == 0
        || raw.authority.rpc_budget_ms < raw.authority.rpc_timeout_ms
    {
        return Err(invalid(
            "authority.rpc_budget_ms",
            "rpc_timeout_ms must be > 0 and <= rpc_budget_ms",
        ));
    }
    if raw.join.base_ms == 0 || raw.join.max_ms < raw.join.base_ms {
        return Err(invalid("join", "need 0 < base_ms <= max_ms"));
    }
    if raw.persist.interval_ms < 100 {
        return Err(invalid("persist.interval_ms", "must be >= 100"));
    }
    if raw.probes.max_concurrent == 0 {
        return Err(invalid("probes.max_concurrent", "must be >= 1"));
    }
    if raw.cluster_size == 0 {
        return Err(invalid("cluster_size", "must be >= 1"));
    }
    for inst in &raw.instances {
        if let Some(why) = crate::api::endpoint_address_problem(inst.address) {
            return Err(invalid(
                "instances.address",
                format!(
                    "instance `{}`: address {} refused: {why}",
                    inst.instance, inst.address
                ),
            ));
        }
        inst.probes
            .validate()
            .map_err(|e| invalid("instances.probes", e))?;
        inst.probes
            .check_targets(inst.address)
            .map_err(|e| invalid("instances.probes", e))?;
        if inst.probes.has_exec() && !raw.probes.allow_exec {
            return Err(invalid(
                "instances.probes",
                format!(
                    "instance `{}` has an exec probe but [probes] allow_exec = false",
                    inst.instance
                ),
            ));
        }
    }
    let mesh = mesh_config(&raw)?;
    let metrics_per_service = raw
        .metrics_service_labels
        .unwrap_or(raw.access.reads == crate::access::ReadAccess::Open);
    Ok(Validated {
        metrics_per_service,
        node_id,
        region,
        zone,
        authority_keys,
        policy_keys,
        mesh,
        access,
        agent_uid,
        socket_gid,
        raw,
    })
}

fn mesh_config(raw: &AgentConfig) -> Result<MeshConfig, ConfigError> {
    let mut mesh = MeshConfig::for_cluster_size(raw.cluster_size);
    raw.membership.apply(&mut mesh);
    mesh.membership
        .validate()
        .map_err(|e| invalid("membership", e.to_string()))?;
    Ok(mesh)
}

/// `ProbeSpec` re-exported for config users.
pub type Probe = ProbeSpec;

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
node_id = "node-a"
region = "dev"
zone = "z1"
data_dir = "/tmp/x"
listen = "127.0.0.1:7946"
socket = "/tmp/x.sock"

[tls]
ca = "ca.pem"
cert = "c.pem"
key = "k.pem"

[trust]
dev_authority = true

[authority]
dev = true
"#;

    #[test]
    fn the_removed_node_keys_setting_is_refused_naming_adr_0006() {
        validate(toml::from_str(BASE).unwrap()).unwrap();
        let old = BASE.replace(
            "[trust]\n",
            "[trust]\nnode_keys = { \"node-2\" = \"00\" }\n",
        );
        let err = validate(toml::from_str(&old).unwrap())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("trust.node_keys"), "{err}");
        assert!(err.contains("0006-node-keys-in-lifecycle-records"), "{err}");
    }

    #[test]
    fn xds_is_off_by_default_loopback_only_and_refused_with_granted_reads() {
        let base = validate(toml::from_str(BASE).unwrap()).unwrap();
        assert!(!base.raw.xds.enabled);
        let on = format!("{BASE}\n[xds]\nenabled = true\n");
        let v = validate(toml::from_str(&on).unwrap()).unwrap();
        assert_eq!(v.raw.xds.listen.to_string(), "127.0.0.1:18000");
        let err = |text: &str| {
            validate(toml::from_str(text).unwrap())
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        let wide = format!("{on}listen = \"0.0.0.0:18000\"\n");
        assert!(
            err(&wide).contains("not a loopback address"),
            "{}",
            err(&wide)
        );
        let granted = format!("{on}\n[access]\nreads = \"granted\"\n");
        assert!(
            err(&granted).contains("no caller identity"),
            "{}",
            err(&granted)
        );
    }

    #[test]
    fn per_service_metric_labels_follow_the_read_policy_unless_set() {
        let v = |text: &str| validate(toml::from_str(text).unwrap()).unwrap();
        let at_top = |line: &str, rest: &str| format!("{line}\n{BASE}{rest}");
        let granted = "\n[access]\nreads = \"granted\"\n";
        assert!(v(BASE).metrics_per_service, "open reads: labelled");
        assert!(
            !v(&format!("{BASE}{granted}")).metrics_per_service,
            "granted: withheld"
        );
        assert!(v(&at_top("metrics_service_labels = true", granted)).metrics_per_service);
        assert!(!v(&at_top("metrics_service_labels = false", "")).metrics_per_service);
    }

    #[test]
    fn an_agent_that_trusts_no_authority_key_is_refused() {
        let none = BASE
            .replace("[trust]\ndev_authority = true\n", "[trust]\n")
            .replace("[authority]\ndev = true\n", "[authority]\n");
        let err = validate(toml::from_str(&none).unwrap())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("trust.authority_keys"), "{err}");
        // Any one of the three is enough.
        let region = "dev".parse().unwrap();
        let key: String = crate::dev_authority::dev_key(&region)
            .verifying_key()
            .to_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        for ok in [
            none.replace("[trust]\n", "[trust]\ndev_authority = true\n"),
            none.replace("[authority]\n", "[authority]\ndev = true\n"),
            none.replace(
                "[trust]\n",
                &format!("[trust]\nauthority_keys = [\"{key}\"]\n"),
            ),
        ] {
            validate(toml::from_str(&ok).unwrap()).unwrap();
        }
    }
}
