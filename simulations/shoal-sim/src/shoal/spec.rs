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
    /// Cross-region services, their global policy and the summary path (issue 16); see
    /// [`RegionsSpec`]. Absent: regions never exchange anything, as before.
    pub regions: Option<RegionsSpec>,
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
    /// No live node may stay down in any agent's view longer than this, ms (and none at the
    /// end): a forged or mistaken down must heal (`shoal/fault_menu.rs`).
    pub max_live_down_spell_ms: Option<u64>,
}

/// `[shoal.regions]`: services present in every region, the global policy, the summary path
/// between region authorities and the regional failover workload (issue 16,
/// docs/adr/0013-global-policy-and-failover.md).
///
/// The model: each region's authority pulls, every `authority_pull_ms`, the summaries of the
/// services whose policy lets its region fail over to the other region (one request per
/// remote region, `cross_region_ms` + up to `cross_region_jitter_ms` each way); the remote
/// authority builds them from its mesh member's catalog and signs them. Each agent pulls its
/// own authority's held set every `agent_pull_ms` (in-region, `feed_ms` one way). Every
/// byte of the cross-region requests and replies is counted (postcard payloads, as the real
/// authority's `shoal_cross_region_bytes_total`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RegionsSpec {
    /// Authority-to-authority summary pull period, ms (the real authority's default).
    #[serde(default = "default_pull_ms")]
    pub authority_pull_ms: u64,
    /// Agent-to-own-authority failover feed pull period, ms (the real agent's default).
    #[serde(default = "default_pull_ms")]
    pub agent_pull_ms: u64,
    /// One-way latency between two regions' authorities, ms (at least 30).
    #[serde(default = "default_cross_region_ms")]
    pub cross_region_ms: u64,
    /// Uniform jitter added to each cross-region leg, ms.
    #[serde(default = "default_cross_region_jitter_ms")]
    pub cross_region_jitter_ms: u64,
    /// One-way latency of an agent's feed pull inside its region, ms.
    #[serde(default = "default_feed_ms")]
    pub feed_ms: u64,
    /// Picks per agent per second of each service listed here (every agent calls every
    /// one of them; the sampling step of the failover reaction is 1 / this).
    #[serde(default = "default_region_picks")]
    pub picks_per_agent_per_s: f64,
    /// Services with `instances_per_region` READY instances in every region.
    pub services: Vec<GlobalServiceSpec>,
    /// Withdrawals of every endpoint of one service in one region.
    #[serde(default)]
    pub withdraw: Vec<WithdrawSpec>,
    /// Checks.
    #[serde(default)]
    pub expect: RegionExpectations,
}

fn default_pull_ms() -> u64 {
    1_000
}
fn default_cross_region_ms() -> u64 {
    40
}
fn default_cross_region_jitter_ms() -> u64 {
    20
}
fn default_feed_ms() -> u64 {
    2
}
fn default_region_picks() -> f64 {
    10.0
}

/// One service present in every region.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GlobalServiceSpec {
    /// Catalog key, `namespace/name/port`.
    pub name: String,
    /// READY instances per region at the start.
    pub instances_per_region: u32,
    /// Its global policy; absent: the service never leaves its region.
    pub policy: Option<PolicySpec>,
}

/// A service's policy as the scenario states it (becomes a `ServicePolicy` in the signed
/// global policy document every agent holds).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// Allowed failover regions, in order.
    pub regions: Vec<String>,
    /// Read-only failover (default: writable).
    #[serde(default)]
    pub read_only: bool,
    /// Cap on failover requests per second per agent.
    pub max_cross_region_rps: Option<u32>,
    /// Past this summary age, degrade (default) or refuse.
    pub max_snapshot_age_s: Option<u32>,
    /// Refuse summaries older than `max_snapshot_age_s` instead of serving them degraded.
    #[serde(default)]
    pub refuse_stale: bool,
    /// Threshold failover: Envoy's overprovisioning factor, percent (absent: all-or-nothing).
    pub overprovisioning_factor_pct: Option<u32>,
}

/// At `at_ms`, every READY endpoint of `service` in `region` is drained (or only `count`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WithdrawSpec {
    /// When, virtual ms.
    pub at_ms: u64,
    /// Catalog key.
    pub service: String,
    /// Region name.
    pub region: String,
    /// Drain only this many (in instance order); the failover reaction is timed only for
    /// full withdrawals.
    pub count: Option<u32>,
}

/// Pass/fail thresholds of the regional checks.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RegionExpectations {
    /// Failover reaction p99 (last local endpoint withdrawn -> each agent's first failover
    /// pick) must not exceed this, ms; every agent of the region must fail over.
    pub failover_reaction_p99_ms: Option<u64>,
    /// Region isolation checks (a region cut off from the others by link faults): every
    /// region keeps serving, the policy is unchanged, no summary of a cut-off region is
    /// upgraded, and every agent holds a fresh one within this many ms after the heal.
    pub reconcile_within_ms: Option<u64>,
    /// A capped policy must give explicit capped answers and never exceed its cap.
    #[serde(default)]
    pub capped: bool,
    /// Threshold failover: from this virtual time on, the spills of the services whose policy
    /// sets `overprovisioning_factor_pct` must match the formula applied to the ground truth at
    /// each pick (within a binomial bound), and no pick may spill while its region is fully
    /// routable, at any time.
    pub spill_share_from_ms: Option<u64>,
}
