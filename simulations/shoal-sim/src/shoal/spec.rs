//! `[shoal]` of a scenario: the shoal layer's settings and pass/fail thresholds.

use super::*;

/// `[shoal]`: settings of the shoal layer.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShoalSpec {
    /// Authority commit latency, ms.
    #[serde(default = "default_commit_ms")]
    pub commit_ms: u64,
    /// Authority unavailable in these windows (writes refused; agents retry with backoff);
    /// each window names one region's authority, or every region's if it names none.
    #[serde(default)]
    pub outages: Vec<Window>,
    /// Startup (STARTING -> READY) time of a new instance, ms.
    #[serde(default = "default_startup_ms")]
    pub startup_ms: u64,
    /// How long a drained instance keeps serving before it is deregistered, ms.
    #[serde(default = "default_drain_grace_ms")]
    pub drain_grace_ms: u64,
    /// Readiness probe period of owner agents, ms.
    #[serde(default = "default_probe_ms")]
    pub probe_period_ms: u64,
    /// Consecutive probe failures before the owner reports UNHEALTHY.
    #[serde(default = "default_probe_failures")]
    pub probe_failures: u32,
    /// Faults end here; from now on every region must converge.
    pub settle_ms: u64,
    /// Override of the anti-entropy period, ms.
    pub anti_entropy_ms: Option<u64>,
    /// Override of the SWIM suspicion window, ms.
    pub suspicion_ms: Option<u64>,
    /// Override of how long SWIM remembers a down member, ms (foca's `remove_down_after`,
    /// 24 h by default): lets a scenario split a region for longer than every membership
    /// timeout without simulating a day.
    pub remove_down_ms: Option<u64>,
    /// First boot joins through three seed addresses of the region, as the real agent does
    /// (`Command::Join`), instead of starting with the formed membership (the default, as
    /// after a long steady state). The catalog is still the region's initial one.
    #[serde(default)]
    pub join_on_first_boot: bool,
    /// Override of the membership's reconnect announces per tick (0 = off), for measuring.
    pub reconnect_per_tick: Option<usize>,
    /// Override of the membership's probe health (ADR 0010), for measuring.
    pub probe_health: Option<bool>,
    /// Override of dropping refuted `Down` updates (ADR 0010), for measuring.
    pub drop_refuted_downs: Option<bool>,
    /// Thresholds that turn into report checks.
    #[serde(default)]
    pub expect: Expectations,
}

fn default_commit_ms() -> u64 {
    10
}
fn default_startup_ms() -> u64 {
    2_000
}
fn default_drain_grace_ms() -> u64 {
    10_000
}
fn default_probe_ms() -> u64 {
    1_000
}
fn default_probe_failures() -> u32 {
    2
}

/// A time window `[from_ms, to_ms)`, optionally of one region.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Start, virtual ms.
    pub from_ms: u64,
    /// End, virtual ms.
    pub to_ms: u64,
    /// Only this region (default: every region).
    pub region: Option<String>,
}

/// Pass/fail thresholds for a scenario.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Expectations {
    /// Drain propagation p99 must not exceed this, ms.
    pub drain_p99_ms: Option<u64>,
    /// Hard-failure detection p99 must not exceed this, ms.
    pub detection_p99_ms: Option<u64>,
    /// At most this many false downs (live, not cut off, not stalled).
    pub max_false_downs: Option<u64>,
    /// Every region must converge (same heads, members and routable sets) by the end.
    #[serde(default)]
    pub converge: bool,
    /// Convergence after `settle_ms` must happen within this, ms.
    pub converge_within_ms: Option<u64>,
    /// No pick of a withdrawn or dead endpoint later than its own measured propagation.
    #[serde(default)]
    pub no_late_picks: bool,
}
