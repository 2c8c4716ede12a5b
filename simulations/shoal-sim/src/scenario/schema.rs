//! The TOML schema of a scenario's world: `[topology]`, `[network]`, `[[faults]]` (as written,
//! before checking) and `[toy]`. Field meanings and defaults are documented on each type; the
//! rules that span fields are in `validate.rs`, the typed fault list in `faults.rs`.

use serde::Deserialize;

use crate::net::{Chance, JitterDist, Latency, NetConfig};

// Named by intra-doc links only.
#[cfg(doc)]
use super::Scenario;

/// `[topology]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    /// One entry per region.
    pub regions: Vec<RegionSpec>,
}

/// `[[topology.regions]]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RegionSpec {
    /// Region name (unique).
    pub name: String,
    /// Zone names (unique within the region).
    pub zones: Vec<String>,
    /// Agents per zone.
    pub agents_per_zone: u32,
}

/// One latency class.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LatencySpec {
    /// Fixed part, ms (fractions allowed; resolution 1 µs).
    pub base_ms: f64,
    /// Random part scale, ms.
    #[serde(default)]
    pub jitter_ms: f64,
    /// Random part shape.
    #[serde(default)]
    pub jitter: JitterDist,
}

impl LatencySpec {
    fn to_latency(self) -> Latency {
        Latency {
            base_us: (self.base_ms * 1000.0).round() as u64,
            jitter_us: (self.jitter_ms * 1000.0).round() as u64,
            dist: self.jitter,
        }
    }
}

/// `[network]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkSpec {
    /// Same-zone latency.
    pub same_zone: LatencySpec,
    /// Same-region, other-zone latency.
    pub same_region: LatencySpec,
    /// Cross-region latency.
    pub cross_region: LatencySpec,
    /// Datagram loss, percent.
    pub loss_pct: f64,
    /// Datagram duplication, percent.
    pub dup_pct: f64,
    /// Datagram size limit, bytes.
    pub max_datagram_bytes: u32,
    /// Stream message size limit, bytes.
    pub max_stream_message_bytes: u32,
}

impl Default for NetworkSpec {
    fn default() -> Self {
        let l = |base_ms, jitter_ms| LatencySpec {
            base_ms,
            jitter_ms,
            jitter: JitterDist::Uniform,
        };
        Self {
            same_zone: l(0.2, 0.1),
            same_region: l(1.0, 0.5),
            cross_region: l(40.0, 10.0),
            loss_pct: 0.0,
            dup_pct: 0.0,
            max_datagram_bytes: 1200,
            max_stream_message_bytes: 1 << 20,
        }
    }
}

impl NetworkSpec {
    /// The engine's network configuration.
    pub fn to_config(&self) -> NetConfig {
        NetConfig {
            latency: [
                self.same_zone.to_latency(),
                self.same_region.to_latency(),
                self.cross_region.to_latency(),
            ],
            loss: Chance::from_pct(self.loss_pct),
            dup: Chance::from_pct(self.dup_pct),
            max_datagram_bytes: self.max_datagram_bytes as usize,
            max_stream_message_bytes: self.max_stream_message_bytes as usize,
        }
    }
}

/// Which nodes a fault applies to.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Target {
    /// Explicit node indices.
    Ids(Vec<u32>),
    /// A selector.
    Select(Selector),
}

/// A node selector; see the module docs.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    /// Start from these indices instead of every node.
    pub ids: Option<Vec<u32>>,
    /// Keep only this region.
    pub region: Option<String>,
    /// Keep only this zone (needs `region`).
    pub zone: Option<String>,
    /// Keep only crashed nodes.
    #[serde(default)]
    pub crashed: bool,
    /// Then pick this many at random (faults RNG).
    pub random: Option<u32>,
}

/// Fault kinds.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Symmetric partition between `a` and `b`.
    Cut,
    /// `from` -> `to` blocked.
    CutOneWay,
    /// Each of `nodes` cut off from everyone.
    Isolate,
    /// Each of `nodes` reachable only by `peer`.
    IsolateExcept,
    /// Each directed pair `from` x `to` dropped.
    DropLink,
    /// All link faults removed.
    Heal,
    /// `nodes` whole again (links, stall, skew).
    Recover,
    /// `nodes` crash without leave.
    Crash,
    /// `nodes` restart with fresh state (crash first if running).
    Restart,
    /// `nodes` CPU-stall.
    Stall,
    /// `nodes` stop stalling.
    Unstall,
    /// `nodes` clocks offset.
    Skew,
    /// Loss / duplication change.
    SetNetwork,
    /// `nodes` crash and start again at a new address (a rescheduled pod, a new VM): same node
    /// id, next boot generation, an address no node had before.
    RestartAtNewAddress,
    /// A second process claiming the node id of `nodes` (one node) starts on the machine of
    /// `to` (one node, whose own agent stops): a cloned VM or a copied configuration.
    DuplicateId,
    /// A crafted SWIM update about `member` (one node) in the name of `from` (one node), sent
    /// to each of `nodes`: `state` at the member's current incarnation plus
    /// `incarnation_delta`, for its current boot generation plus `boot_delta` (a forged
    /// `down` at delta 0; a stale rumour below 0).
    InjectUpdate,
    /// Datagrams larger than `max_datagram_bytes` are dropped on every link `from` x `to`
    /// (a path with a smaller MTU); `heal` lifts it.
    LinkMaxDatagram,
    /// `nodes` crash in the middle of writing their snapshot: the newest persisted file is
    /// torn; a later `restart` must refuse it (invariant 7) and start from the previous one.
    CrashTornSnapshot,
}

impl FaultKind {
    /// Whether this fault (re)starts agents, which then load their persisted snapshot.
    pub fn restarts(self) -> bool {
        matches!(
            self,
            FaultKind::Restart | FaultKind::RestartAtNewAddress | FaultKind::CrashTornSnapshot
        )
    }
}

/// The state carried by an [`FaultKind::InjectUpdate`].
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RumourState {
    /// Alive.
    Alive,
    /// Suspect.
    Suspect,
    /// Down.
    Down,
}

/// `[[faults]]`: a flat table, checked by [`Scenario::validate`] per kind.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// When, virtual ms.
    pub at_ms: u64,
    /// What.
    pub action: FaultKind,
    /// Targets for single-set actions.
    pub nodes: Option<Target>,
    /// `cut` side A.
    pub a: Option<Target>,
    /// `cut` side B.
    pub b: Option<Target>,
    /// Sender side.
    pub from: Option<Target>,
    /// Receiver side.
    pub to: Option<Target>,
    /// `isolate_except` peer (must resolve to one node).
    pub peer: Option<Target>,
    /// `stall` length, ms.
    pub stall_ms: Option<u64>,
    /// `stall` period, ms.
    pub period_ms: Option<u64>,
    /// `stall` total duration, ms (absent = until unstall/recover).
    pub for_ms: Option<u64>,
    /// `skew` offset, ms.
    pub offset_ms: Option<i64>,
    /// `set_network` loss, percent.
    pub loss_pct: Option<f64>,
    /// `set_network` duplication, percent.
    pub dup_pct: Option<f64>,
    /// `crash` / `restart`: hit the targets one by one, evenly over this many ms.
    pub spread_ms: Option<u64>,
    /// `inject_update`: the member the update is about (one node).
    pub member: Option<Target>,
    /// `inject_update`: the state it claims.
    pub state: Option<RumourState>,
    /// `inject_update`: added to the member's current incarnation (default 0: current).
    pub incarnation_delta: Option<i64>,
    /// `inject_update`: added to the member's current boot generation (default 0).
    pub boot_delta: Option<i64>,
    /// `link_max_datagram`: the path's datagram limit, bytes.
    pub max_datagram_bytes: Option<u32>,
}

/// `[toy]`: the ping node used until the mesh adapter exists.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ToySpec {
    /// Ping period, ms.
    pub ping_interval_ms: u64,
    /// Ping datagram size, bytes.
    pub ping_bytes: u32,
    /// Every n-th tick also sends a stream message (0 = never).
    pub stream_every: u32,
    /// Stream message size, bytes.
    pub stream_bytes: u32,
}

impl Default for ToySpec {
    fn default() -> Self {
        Self {
            ping_interval_ms: 1000,
            ping_bytes: 64,
            stream_every: 5,
            stream_bytes: 512,
        }
    }
}
