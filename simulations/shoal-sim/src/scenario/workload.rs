//! The TOML schema of a scenario's workload and traffic: `[workload]` (services and their
//! instance-count distributions, rollout, drains, crashes) and `[traffic]`. Acted on by
//! [`crate::shoal`].

use serde::Deserialize;

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
    pub(super) fn check(&self) -> Option<String> {
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
