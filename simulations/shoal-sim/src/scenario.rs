//! Scenario files: TOML describing topology, network, duration, a timed fault list, and
//! (typed, optional, not yet acted on by the engine) workload and traffic sections.
//!
//! ```toml
//! name = "ping-small"
//! duration_ms = 30000
//!
//! [[topology.regions]]
//! name = "us-east"
//! zones = ["a", "b", "c"]
//! agents_per_zone = 10
//!
//! [network]
//! loss_pct = 0.5
//! dup_pct = 0.1
//! max_datagram_bytes = 1200
//! same_zone = { base_ms = 0.2, jitter_ms = 0.1 }
//! same_region = { base_ms = 1.0, jitter_ms = 0.5 }
//! cross_region = { base_ms = 40.0, jitter_ms = 10.0, jitter = "exponential" }
//!
//! [[faults]]
//! at_ms = 10000
//! action = "isolate"
//! nodes = { region = "us-east", zone = "a", random = 2 }
//!
//! [[faults]]
//! at_ms = 20000
//! action = "heal"
//! ```
//!
//! Fault actions and their fields:
//! `cut {a, b}`, `cut_one_way {from, to}`, `isolate {nodes}`,
//! `isolate_except {nodes, peer}` (each node reachable only by the single `peer`),
//! `drop_link {from, to}` (every directed pair), `heal`, `recover {nodes}`, `crash {nodes}`,
//! `restart {nodes}`, `stall {nodes, stall_ms, period_ms, for_ms?}`, `unstall {nodes}`,
//! `skew {nodes, offset_ms}`, `set_network {loss_pct?, dup_pct?}`.
//!
//! `crash` and `restart` also take `spread_ms`: the targets are resolved once, at `at_ms`, put
//! in a random order (faults RNG), and the k-th of n is hit at `at_ms + k * spread_ms / n`
//! (a rolling restart of a whole region: `nodes = { region = "us-east" }`, `spread_ms = 60000`).
//! The report lists such a fault once, at `at_ms`, with all its targets.
//!
//! A target is a list of node indices (`[0, 5]`) or a selector table
//! `{ ids?, region?, zone?, crashed?, random? }`: start from `ids` (or every node), keep those in
//! `region` / `zone`, keep only crashed ones if `crashed = true`, then pick `random` of them with
//! the faults RNG. Selectors are resolved when the fault fires.
//!
//! The workload (acted on by [`crate::shoal`]) may be confined to one region: `region` on
//! `[workload.rollout]`, `[[workload.drains]]` and `[[workload.crashes]]` draws their victims
//! from that region only (default: every region), and `[shoal] outages` entries take a
//! `region` too (default: every region's authority is down).
//!
//! Instances per service (`[workload.services] instances`) follow one of
//! `{ dist = "fixed", n }`, `{ dist = "uniform", min, max }`, `{ dist = "zipf", max, exponent }`
//! or `{ dist = "tiered", tiers = [{ pct, min, max }, ...] }`: each service falls in a tier with
//! probability `pct` percent (the percentages sum to 100), then draws uniformly in that tier's
//! `[min, max]`. `tiers = [{ pct = 1.0, min = 1000, max = 1500 }, { pct = 99.0, min = 10,
//! max = 66 }]` gives a few very large services and many small ones, ~50 instances per service
//! on average.

use std::path::Path;

use serde::Deserialize;

use crate::net::{Chance, JitterDist, Latency, NetConfig};
use crate::topology::{RegionShape, Topology};

/// A scenario file that failed to load. Nothing is run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// File path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Not valid TOML or not the schema (unknown field, wrong type...).
    #[error("{0}")]
    Parse(#[from] toml::de::Error),
    /// Parsed, but values are inconsistent; one line per problem.
    #[error("invalid scenario:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

/// The whole file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, used in reports.
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// Virtual run time, ms.
    pub duration_ms: u64,
    /// Regions, zones, agents.
    pub topology: TopologySpec,
    /// Network model; defaults if absent.
    #[serde(default)]
    pub network: NetworkSpec,
    /// Timed faults, applied in `at_ms` order (file order breaks ties).
    #[serde(default)]
    pub faults: Vec<FaultSpec>,
    /// Parameters for the toy node ([`crate::testkit::PingNode`]).
    #[serde(default)]
    pub toy: ToySpec,
    /// Workload (services, rollout, drains, crashes). Typed now; acted on by a later layer.
    #[serde(default)]
    pub workload: Option<WorkloadSpec>,
    /// Traffic (picks), acted on by the shoal layer.
    #[serde(default)]
    pub traffic: Option<TrafficSpec>,
    /// The shoal layer: when present, nodes are real `shoal-mesh` cores
    /// ([`crate::shoal::ShoalHarness`]); otherwise the toy ping node runs.
    #[serde(default)]
    pub shoal: Option<crate::shoal::ShoalSpec>,
}

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

/// `[workload]` (not yet acted on).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Services to register at start.
    pub services: Option<ServicesSpec>,
    /// A rolling replacement.
    pub rollout: Option<RolloutSpec>,
    /// Deliberate withdrawals.
    #[serde(default)]
    pub drains: Vec<DrainSpec>,
    /// Hard failures of processes or nodes.
    #[serde(default)]
    pub crashes: Vec<CrashSpec>,
}

/// `[workload.services]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServicesSpec {
    /// Number of logical services.
    pub count: u32,
    /// Instances per service.
    pub instances: CountDist,
}

/// A distribution of counts.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "dist", rename_all = "snake_case", deny_unknown_fields)]
pub enum CountDist {
    /// Always `n`.
    Fixed {
        /// The count.
        n: u32,
    },
    /// Uniform in `[min, max]`.
    Uniform {
        /// Lower bound.
        min: u32,
        /// Upper bound (inclusive).
        max: u32,
    },
    /// Zipf over `[1, max]` with `exponent` (a few big services, many small).
    Zipf {
        /// Largest count.
        max: u32,
        /// Skew (> 0).
        exponent: f64,
    },
    /// A mixture of uniform ranges: a service falls in tier `i` with probability
    /// `tiers[i].pct` percent, then draws uniformly in its `[min, max]`.
    Tiered {
        /// The tiers; their `pct` sum to 100.
        tiers: Vec<Tier>,
    },
}

/// One tier of [`CountDist::Tiered`].
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    /// Share of services in this tier, percent (> 0).
    pub pct: f64,
    /// Lower bound (> 0).
    pub min: u32,
    /// Upper bound (inclusive).
    pub max: u32,
}

impl CountDist {
    /// Expected value (mean) of one draw.
    pub fn mean(&self) -> f64 {
        match self {
            CountDist::Fixed { n } => f64::from(*n),
            CountDist::Uniform { min, max } => (f64::from(*min) + f64::from(*max)) / 2.0,
            CountDist::Zipf { max, exponent } => {
                let w = |k: u32| f64::from(k).powf(-exponent);
                let total: f64 = (1..=*max).map(w).sum();
                // `draw_count` returns `max + 1 - k` for rank k.
                (1..=*max)
                    .map(|k| f64::from(max + 1 - k) * w(k))
                    .sum::<f64>()
                    / total
            }
            CountDist::Tiered { tiers } => tiers
                .iter()
                .map(|t| t.pct / 100.0 * (f64::from(t.min) + f64::from(t.max)) / 2.0)
                .sum(),
        }
    }

    /// Problems with the parameters, if any (for [`Scenario::validate`]).
    fn check(&self) -> Option<String> {
        match self {
            CountDist::Fixed { n: 0 } => Some("n must be > 0".into()),
            CountDist::Uniform { min, max } if *min == 0 || min > max => {
                Some(format!("need 0 < min ({min}) <= max ({max})"))
            }
            CountDist::Zipf { max, exponent }
                if *max == 0 || !(*exponent > 0.0 && exponent.is_finite()) =>
            {
                Some("zipf needs max > 0 and exponent > 0".into())
            }
            CountDist::Tiered { tiers } => {
                if tiers.is_empty() {
                    return Some("tiered needs at least one tier".into());
                }
                for (i, t) in tiers.iter().enumerate() {
                    if !(t.pct > 0.0 && t.pct.is_finite()) {
                        return Some(format!("tiers[{i}]: pct must be > 0, got {}", t.pct));
                    }
                    if t.min == 0 || t.min > t.max {
                        return Some(format!(
                            "tiers[{i}]: need 0 < min ({}) <= max ({})",
                            t.min, t.max
                        ));
                    }
                }
                let sum: f64 = tiers.iter().map(|t| t.pct).sum();
                ((sum - 100.0).abs() > 1e-6)
                    .then(|| format!("tier percentages must sum to 100, got {sum}"))
            }
            _ => None,
        }
    }
}

/// `[workload.rollout]`: `replacements` instance replacements spread over `over_ms`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RolloutSpec {
    /// Start, virtual ms.
    pub start_ms: u64,
    /// Replacements (each = one add + one remove).
    pub replacements: u32,
    /// Spread, ms.
    pub over_ms: u64,
    /// Replace instances of this region only (default: any region).
    pub region: Option<String>,
}

/// `[[workload.drains]]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DrainSpec {
    /// When, virtual ms.
    pub at_ms: u64,
    /// How many instances to drain.
    pub instances: u32,
    /// Restrict to one service index.
    pub service: Option<u32>,
    /// Drain instances of this region only (default: any region).
    pub region: Option<String>,
}

/// What dies in a [`CrashSpec`].
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CrashKind {
    /// An instance process on a live node.
    Process,
    /// A whole node (agent included).
    Node,
}

/// `[[workload.crashes]]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CrashSpec {
    /// When, virtual ms.
    pub at_ms: u64,
    /// Process or node.
    pub kind: CrashKind,
    /// How many.
    pub count: u32,
    /// Kill processes or nodes of this region only (default: any region).
    pub region: Option<String>,
}

/// `[traffic]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrafficSpec {
    /// Endpoint picks per agent per second.
    pub picks_per_agent_per_s: f64,
}

/// A fault with every field checked, ready to apply.
#[derive(Clone, Debug, PartialEq)]
pub enum FaultAction {
    /// See [`FaultKind::Cut`].
    Cut {
        /// Side A.
        a: Target,
        /// Side B.
        b: Target,
    },
    /// See [`FaultKind::CutOneWay`].
    CutOneWay {
        /// Senders.
        from: Target,
        /// Receivers.
        to: Target,
    },
    /// See [`FaultKind::Isolate`].
    Isolate(Target),
    /// See [`FaultKind::IsolateExcept`].
    IsolateExcept {
        /// Isolated nodes.
        nodes: Target,
        /// The one peer still reachable.
        peer: Target,
    },
    /// See [`FaultKind::DropLink`].
    DropLink {
        /// Senders.
        from: Target,
        /// Receivers.
        to: Target,
    },
    /// See [`FaultKind::Heal`].
    Heal,
    /// See [`FaultKind::Recover`].
    Recover(Target),
    /// See [`FaultKind::Crash`].
    Crash(Target),
    /// See [`FaultKind::Restart`].
    Restart(Target),
    /// See [`FaultKind::Stall`].
    Stall {
        /// Stalled nodes.
        nodes: Target,
        /// Stall length, ms.
        stall_ms: u64,
        /// Period, ms.
        period_ms: u64,
        /// Total, ms.
        for_ms: Option<u64>,
    },
    /// See [`FaultKind::Unstall`].
    Unstall(Target),
    /// See [`FaultKind::Skew`].
    Skew {
        /// Skewed nodes.
        nodes: Target,
        /// Offset, ms.
        offset_ms: i64,
    },
    /// See [`FaultKind::SetNetwork`].
    SetNetwork {
        /// New loss, percent.
        loss_pct: Option<f64>,
        /// New duplication, percent.
        dup_pct: Option<f64>,
    },
}

/// A validated, time-ordered fault.
#[derive(Clone, Debug, PartialEq)]
pub struct TimedFault {
    /// When, virtual ms.
    pub at_ms: u64,
    /// Kind, for reports.
    pub kind: FaultKind,
    /// What to do.
    pub action: FaultAction,
    /// `crash` / `restart` only: hit the targets one by one over this many ms (see the module
    /// docs).
    pub spread_ms: Option<u64>,
}

impl Scenario {
    /// Reads, parses and validates a scenario file.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses and validates scenario text.
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        let s: Scenario = toml::from_str(text)?;
        s.validate()?;
        Ok(s)
    }

    /// The topology this scenario describes.
    pub fn build_topology(&self) -> Result<Topology, ScenarioError> {
        let shapes: Vec<RegionShape> = self
            .topology
            .regions
            .iter()
            .map(|r| RegionShape {
                name: r.name.clone(),
                zones: r.zones.clone(),
                agents_per_zone: r.agents_per_zone,
            })
            .collect();
        Topology::new(&shapes).map_err(|e| ScenarioError::Invalid(vec![format!("topology: {e}")]))
    }

    /// Checks every cross-field rule; reports all problems at once.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let mut errs = Vec::new();
        if self.duration_ms == 0 {
            errs.push("duration_ms: must be > 0".to_string());
        }
        self.validate_topology(&mut errs);
        self.validate_network(&mut errs);
        let node_count: u64 = self
            .topology
            .regions
            .iter()
            .map(|r| u64::from(r.agents_per_zone) * r.zones.len() as u64)
            .sum();
        for (i, f) in self.faults.iter().enumerate() {
            if let Err(e) = self.check_fault(f, node_count) {
                errs.push(format!("faults[{i}] ({:?}): {e}", f.action));
            }
        }
        if self.toy.ping_interval_ms == 0 {
            errs.push("toy.ping_interval_ms: must be > 0".into());
        }
        if let Some(w) = &self.workload {
            self.validate_workload(w, &mut errs);
        }
        if let Some(sh) = &self.shoal {
            for (i, o) in sh.outages.iter().enumerate() {
                if o.from_ms >= o.to_ms {
                    errs.push(format!("shoal.outages[{i}]: need from_ms < to_ms"));
                }
                self.check_region(
                    o.region.as_deref(),
                    &format!("shoal.outages[{i}]"),
                    &mut errs,
                );
            }
        }
        if let Some(t) = &self.traffic {
            if !(t.picks_per_agent_per_s >= 0.0 && t.picks_per_agent_per_s.is_finite()) {
                errs.push("traffic.picks_per_agent_per_s: must be a finite number >= 0".into());
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ScenarioError::Invalid(errs))
        }
    }

    fn validate_topology(&self, errs: &mut Vec<String>) {
        let regions = &self.topology.regions;
        if regions.is_empty() {
            errs.push("topology.regions: at least one region".into());
        }
        for (i, r) in regions.iter().enumerate() {
            if regions[..i].iter().any(|o| o.name == r.name) {
                errs.push(format!(
                    "topology.regions[{i}]: duplicate region name {:?}",
                    r.name
                ));
            }
            if r.zones.is_empty() {
                errs.push(format!(
                    "topology.regions[{i}] ({}): zones must not be empty",
                    r.name
                ));
            }
            for (j, z) in r.zones.iter().enumerate() {
                if r.zones[..j].contains(z) {
                    errs.push(format!(
                        "topology.regions[{i}] ({}): duplicate zone {z:?}",
                        r.name
                    ));
                }
            }
            if r.agents_per_zone == 0 {
                errs.push(format!(
                    "topology.regions[{i}] ({}): agents_per_zone must be > 0",
                    r.name
                ));
            }
        }
    }

    fn validate_network(&self, errs: &mut Vec<String>) {
        let n = &self.network;
        for (name, l) in [
            ("same_zone", n.same_zone),
            ("same_region", n.same_region),
            ("cross_region", n.cross_region),
        ] {
            if !(l.base_ms >= 0.0
                && l.base_ms.is_finite()
                && l.jitter_ms >= 0.0
                && l.jitter_ms.is_finite())
            {
                errs.push(format!(
                    "network.{name}: base_ms and jitter_ms must be finite and >= 0"
                ));
            }
        }
        for (name, v) in [("loss_pct", n.loss_pct), ("dup_pct", n.dup_pct)] {
            if !(0.0..=100.0).contains(&v) {
                errs.push(format!("network.{name}: must be within 0..=100, got {v}"));
            }
        }
        if n.max_datagram_bytes == 0 || n.max_stream_message_bytes == 0 {
            errs.push("network: size limits must be > 0".into());
        }
    }

    fn check_target(&self, t: &Target, node_count: u64) -> Result<(), String> {
        let ids = match t {
            Target::Ids(ids) => Some(ids),
            Target::Select(s) => {
                let region = match &s.region {
                    Some(r) => Some(
                        self.topology
                            .regions
                            .iter()
                            .find(|x| &x.name == r)
                            .ok_or_else(|| format!("unknown region {r:?}"))?,
                    ),
                    None => None,
                };
                if let Some(z) = &s.zone {
                    let region = region.ok_or_else(|| format!("zone {z:?} needs a region"))?;
                    if !region.zones.contains(z) {
                        return Err(format!("unknown zone {z:?} in region {:?}", region.name));
                    }
                }
                s.ids.as_ref()
            }
        };
        if let Some(bad) = ids.and_then(|ids| ids.iter().find(|&&i| u64::from(i) >= node_count)) {
            return Err(format!("node index {bad} out of range (0..{node_count})"));
        }
        Ok(())
    }

    fn need<'a>(&self, v: &'a Option<Target>, field: &str, n: u64) -> Result<&'a Target, String> {
        let t = v.as_ref().ok_or_else(|| format!("missing `{field}`"))?;
        self.check_target(t, n)
            .map_err(|e| format!("`{field}`: {e}"))?;
        Ok(t)
    }

    /// Converts one fault table into a typed action, or says what is wrong.
    pub fn check_fault(&self, f: &FaultSpec, n: u64) -> Result<FaultAction, String> {
        use FaultKind as K;
        let allowed: &[&str] = match f.action {
            K::Cut => &["a", "b"],
            K::CutOneWay | K::DropLink => &["from", "to"],
            K::IsolateExcept => &["nodes", "peer"],
            K::Heal => &[],
            K::Stall => &["nodes", "stall_ms", "period_ms", "for_ms"],
            K::Skew => &["nodes", "offset_ms"],
            K::SetNetwork => &["loss_pct", "dup_pct"],
            K::Crash | K::Restart => &["nodes", "spread_ms"],
            K::Isolate | K::Recover | K::Unstall => &["nodes"],
        };
        let present = [
            ("nodes", f.nodes.is_some()),
            ("a", f.a.is_some()),
            ("b", f.b.is_some()),
            ("from", f.from.is_some()),
            ("to", f.to.is_some()),
            ("peer", f.peer.is_some()),
            ("stall_ms", f.stall_ms.is_some()),
            ("period_ms", f.period_ms.is_some()),
            ("for_ms", f.for_ms.is_some()),
            ("offset_ms", f.offset_ms.is_some()),
            ("loss_pct", f.loss_pct.is_some()),
            ("dup_pct", f.dup_pct.is_some()),
            ("spread_ms", f.spread_ms.is_some()),
        ];
        if let Some((name, _)) = present
            .iter()
            .find(|(name, set)| *set && !allowed.contains(name))
        {
            return Err(format!(
                "field `{name}` does not apply (allowed: {allowed:?})"
            ));
        }
        let a = match f.action {
            K::Cut => FaultAction::Cut {
                a: self.need(&f.a, "a", n)?.clone(),
                b: self.need(&f.b, "b", n)?.clone(),
            },
            K::CutOneWay => FaultAction::CutOneWay {
                from: self.need(&f.from, "from", n)?.clone(),
                to: self.need(&f.to, "to", n)?.clone(),
            },
            K::DropLink => FaultAction::DropLink {
                from: self.need(&f.from, "from", n)?.clone(),
                to: self.need(&f.to, "to", n)?.clone(),
            },
            K::Isolate => FaultAction::Isolate(self.need(&f.nodes, "nodes", n)?.clone()),
            K::IsolateExcept => FaultAction::IsolateExcept {
                nodes: self.need(&f.nodes, "nodes", n)?.clone(),
                peer: self.need(&f.peer, "peer", n)?.clone(),
            },
            K::Heal => FaultAction::Heal,
            K::Recover => FaultAction::Recover(self.need(&f.nodes, "nodes", n)?.clone()),
            K::Crash => FaultAction::Crash(self.need(&f.nodes, "nodes", n)?.clone()),
            K::Restart => FaultAction::Restart(self.need(&f.nodes, "nodes", n)?.clone()),
            K::Unstall => FaultAction::Unstall(self.need(&f.nodes, "nodes", n)?.clone()),
            K::Stall => {
                let stall_ms = f.stall_ms.ok_or("missing `stall_ms`")?;
                let period_ms = f.period_ms.ok_or("missing `period_ms`")?;
                if stall_ms == 0 || stall_ms >= period_ms {
                    return Err(format!(
                        "need 0 < stall_ms ({stall_ms}) < period_ms ({period_ms})"
                    ));
                }
                FaultAction::Stall {
                    nodes: self.need(&f.nodes, "nodes", n)?.clone(),
                    stall_ms,
                    period_ms,
                    for_ms: f.for_ms,
                }
            }
            K::Skew => FaultAction::Skew {
                nodes: self.need(&f.nodes, "nodes", n)?.clone(),
                offset_ms: f.offset_ms.ok_or("missing `offset_ms`")?,
            },
            K::SetNetwork => {
                for v in [f.loss_pct, f.dup_pct].into_iter().flatten() {
                    if !(0.0..=100.0).contains(&v) {
                        return Err(format!("percentages must be within 0..=100, got {v}"));
                    }
                }
                if f.loss_pct.is_none() && f.dup_pct.is_none() {
                    return Err("set at least one of `loss_pct`, `dup_pct`".into());
                }
                FaultAction::SetNetwork {
                    loss_pct: f.loss_pct,
                    dup_pct: f.dup_pct,
                }
            }
        };
        if f.at_ms > self.duration_ms {
            return Err(format!(
                "at_ms {} is after duration_ms {}",
                f.at_ms, self.duration_ms
            ));
        }
        if let Some(spread) = f.spread_ms {
            if spread == 0 || f.at_ms + spread > self.duration_ms {
                return Err(format!(
                    "need 0 < spread_ms ({spread}) and at_ms + spread_ms <= duration_ms ({})",
                    self.duration_ms
                ));
            }
        }
        Ok(a)
    }

    /// The fault list, validated and stably sorted by time.
    pub fn timed_faults(&self) -> Result<Vec<TimedFault>, ScenarioError> {
        let n = self
            .topology
            .regions
            .iter()
            .map(|r| u64::from(r.agents_per_zone) * r.zones.len() as u64)
            .sum();
        let mut out = Vec::with_capacity(self.faults.len());
        let mut errs = Vec::new();
        for (i, f) in self.faults.iter().enumerate() {
            match self.check_fault(f, n) {
                Ok(action) => out.push(TimedFault {
                    at_ms: f.at_ms,
                    kind: f.action,
                    action,
                    spread_ms: f.spread_ms,
                }),
                Err(e) => errs.push(format!("faults[{i}]: {e}")),
            }
        }
        if !errs.is_empty() {
            return Err(ScenarioError::Invalid(errs));
        }
        out.sort_by_key(|f| f.at_ms);
        Ok(out)
    }
}

impl Scenario {
    /// `region`, if set, must name a region of the topology.
    fn check_region(&self, region: Option<&str>, what: &str, errs: &mut Vec<String>) {
        if let Some(r) = region {
            if !self.topology.regions.iter().any(|x| x.name == r) {
                errs.push(format!("{what}: unknown region {r:?}"));
            }
        }
    }

    fn validate_workload(&self, w: &WorkloadSpec, errs: &mut Vec<String>) {
        if let Some(s) = &w.services {
            if s.count == 0 {
                errs.push("workload.services.count: must be > 0".into());
            }
            if let Some(e) = s.instances.check() {
                errs.push(format!("workload.services.instances: {e}"));
            }
        }
        if let Some(r) = &w.rollout {
            if r.replacements == 0 || r.over_ms == 0 {
                errs.push("workload.rollout: replacements and over_ms must be > 0".into());
            }
            self.check_region(r.region.as_deref(), "workload.rollout", errs);
        }
        for (i, d) in w.drains.iter().enumerate() {
            if d.instances == 0 {
                errs.push(format!("workload.drains[{i}]: instances must be > 0"));
            }
            self.check_region(d.region.as_deref(), &format!("workload.drains[{i}]"), errs);
        }
        for (i, c) in w.crashes.iter().enumerate() {
            if c.count == 0 {
                errs.push(format!("workload.crashes[{i}]: count must be > 0"));
            }
            self.check_region(c.region.as_deref(), &format!("workload.crashes[{i}]"), errs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
name = "t"
duration_ms = 1000
[[topology.regions]]
name = "r"
zones = ["a", "b"]
agents_per_zone = 2
"#;

    #[test]
    fn parses_minimal_and_full() {
        let s = Scenario::parse(BASE).unwrap();
        assert_eq!(s.build_topology().unwrap().len(), 4);
        let full = format!(
            "{BASE}\n[network]\nloss_pct = 1.0\nsame_zone = {{ base_ms = 0.5 }}\n\
             [[faults]]\nat_ms = 10\naction = \"cut\"\na = [0]\nb = {{ region = \"r\", zone = \"b\" }}\n\
             [[faults]]\nat_ms = 5\naction = \"stall\"\nnodes = [1]\nstall_ms = 10\nperiod_ms = 100\n\
             [workload.services]\ncount = 3\ninstances = {{ dist = \"uniform\", min = 1, max = 5 }}\n\
             [workload.rollout]\nstart_ms = 0\nreplacements = 10\nover_ms = 100\n\
             [traffic]\npicks_per_agent_per_s = 2.5\n"
        );
        let s = Scenario::parse(&full).unwrap();
        let f = s.timed_faults().unwrap();
        assert_eq!(f[0].kind, FaultKind::Stall);
        assert_eq!(f[1].kind, FaultKind::Cut);
    }

    #[test]
    fn clear_errors() {
        let bad = format!("{BASE}\n[[faults]]\nat_ms = 10\naction = \"cut\"\na = [9]\n");
        let e = Scenario::parse(&bad).unwrap_err().to_string();
        assert!(e.contains("faults[0]"), "{e}");
        assert!(e.contains("`a`: node index 9 out of range"), "{e}");
        assert!(
            e.contains("missing `b`") || e.contains("out of range"),
            "{e}"
        );
        let bad = format!("{BASE}\n[[faults]]\nat_ms = 10\naction = \"heal\"\nnodes = [1]\n");
        let e = Scenario::parse(&bad).unwrap_err().to_string();
        assert!(e.contains("field `nodes` does not apply"), "{e}");
        let bad = format!("{BASE}\nbogus = 1\n");
        assert!(Scenario::parse(&bad)
            .unwrap_err()
            .to_string()
            .contains("bogus"));
        let bad = format!("{BASE}\n[network]\nloss_pct = 140.0\n");
        assert!(Scenario::parse(&bad)
            .unwrap_err()
            .to_string()
            .contains("loss_pct"));
    }

    #[test]
    fn tiered_counts_parse_validate_and_have_a_mean() {
        let ok = format!(
            "{BASE}\n[workload.services]\ncount = 2000\ninstances = {{ dist = \"tiered\", \
             tiers = [{{ pct = 1.0, min = 1000, max = 1500 }}, {{ pct = 99.0, min = 10, max = 66 }}] }}\n"
        );
        let s = Scenario::parse(&ok).unwrap();
        let d = &s.workload.unwrap().services.unwrap().instances;
        // 1% x 1,250 + 99% x 38 = 50.12 per service: ~100k instances for 2,000 services.
        assert!((d.mean() - 50.12).abs() < 1e-9, "{}", d.mean());
        let bad = |tiers: &str| {
            let t = format!(
                "{BASE}\n[workload.services]\ncount = 1\ninstances = {{ dist = \"tiered\", tiers = {tiers} }}\n"
            );
            Scenario::parse(&t).unwrap_err().to_string()
        };
        let e = bad("[{ pct = 1.0, min = 1, max = 2 }, { pct = 98.0, min = 1, max = 2 }]");
        assert!(e.contains("sum to 100, got 99"), "{e}");
        let e = bad("[{ pct = 100.0, min = 5, max = 2 }]");
        assert!(e.contains("tiers[0]: need 0 < min (5) <= max (2)"), "{e}");
        let e = bad("[{ pct = 0.0, min = 1, max = 2 }, { pct = 100.0, min = 1, max = 2 }]");
        assert!(e.contains("tiers[0]: pct must be > 0"), "{e}");
        assert!(bad("[]").contains("at least one tier"));
    }

    #[test]
    fn workload_and_outages_name_known_regions() {
        let ok = format!(
            "{BASE}\n[workload.rollout]\nstart_ms = 0\nreplacements = 1\nover_ms = 10\nregion = \"r\"\n\
             [[workload.drains]]\nat_ms = 5\ninstances = 1\nregion = \"r\"\n\
             [[workload.crashes]]\nat_ms = 5\nkind = \"node\"\ncount = 1\nregion = \"r\"\n\
             [shoal]\nsettle_ms = 500\noutages = [{{ from_ms = 10, to_ms = 20, region = \"r\" }}]\n"
        );
        let s = Scenario::parse(&ok).unwrap();
        assert_eq!(s.shoal.unwrap().outages[0].region.as_deref(), Some("r"));
        let bad = ok.replace("region = \"r\"", "region = \"x\"");
        let e = Scenario::parse(&bad).unwrap_err().to_string();
        for what in [
            "workload.rollout: unknown region \"x\"",
            "workload.drains[0]: unknown region \"x\"",
            "workload.crashes[0]: unknown region \"x\"",
            "shoal.outages[0]: unknown region \"x\"",
        ] {
            assert!(e.contains(what), "{what} in {e}");
        }
        let e = Scenario::parse(&ok.replace("to_ms = 20", "to_ms = 10"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("shoal.outages[0]: need from_ms < to_ms"), "{e}");
    }

    #[test]
    fn spread_applies_to_crash_and_restart_within_the_run() {
        let f = |action: &str, at: u64, spread: u64| {
            format!(
                "{BASE}\n[[faults]]\nat_ms = {at}\naction = \"{action}\"\n\
                 nodes = {{ region = \"r\" }}\nspread_ms = {spread}\n"
            )
        };
        let s = Scenario::parse(&f("restart", 100, 900)).unwrap();
        let t = s.timed_faults().unwrap();
        assert_eq!(t[0].spread_ms, Some(900));
        assert!(Scenario::parse(&f("crash", 0, 1000)).is_ok());
        let e = Scenario::parse(&f("isolate", 0, 10))
            .unwrap_err()
            .to_string();
        assert!(e.contains("field `spread_ms` does not apply"), "{e}");
        let e = Scenario::parse(&f("restart", 100, 901))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at_ms + spread_ms <= duration_ms (1000)"), "{e}");
        assert!(Scenario::parse(&f("crash", 0, 0)).is_err());
    }
}
