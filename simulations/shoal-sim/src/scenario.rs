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
//! `skew {nodes, offset_ms}`, `set_network {loss_pct?, dup_pct?}`, and the membership fault
//! menu (issue 15): `restart_at_new_address {nodes}`, `duplicate_id {nodes = [x], to = [y]}`
//! (a second process claiming x's node id runs on y's machine), `inject_update {nodes, from =
//! [s], member = [x], state, incarnation_delta?, boot_delta?}` (a crafted SWIM update about x
//! in s's name: `state = "down"` at delta 0 is a forged down at x's current incarnation, a
//! negative delta a stale rumour), `link_max_datagram {from, to, max_datagram_bytes}` (a
//! path with a smaller MTU; `heal` lifts it) and `crash_torn_snapshot {nodes}` (crash while
//! writing the snapshot; the next `restart` finds the newest file torn).
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
//!
//! # Where each part lives
//! This file holds [`Scenario`] (the whole file), [`ScenarioError`], loading and the topology it
//! builds. `schema.rs`: topology, network, fault tables and toy node; `workload.rs`: workload
//! and traffic; `validate.rs`: the cross-field rules; `faults.rs`: the typed, time-ordered
//! fault list ([`FaultAction`], [`TimedFault`]).

mod faults;
mod schema;
mod validate;
mod workload;

use std::path::Path;

use serde::Deserialize;

use crate::topology::{RegionShape, Topology};

pub use faults::{FaultAction, TimedFault};
pub use schema::{
    FaultKind, FaultSpec, LatencySpec, NetworkSpec, RegionSpec, RumourState, Selector, Target,
    TopologySpec, ToySpec,
};
pub use workload::{
    CountDist, CrashKind, CrashSpec, DrainSpec, RolloutSpec, ServicesSpec, Tier, TrafficSpec,
    WorkloadSpec,
};

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
