//! A rolling restart of a whole region: every old identity is timed until the agents that knew
//! it declare it down; agents with nothing to detect (the restarted node itself, agents that
//! restarted after it and never knew the old identity) are left out, not counted as missing.

use shoal_sim::rng::RngTree;
use shoal_sim::runner::{run, RunConfig};
use shoal_sim::scenario::Scenario;
use shoal_sim::shoal::ShoalHarness;

const ROLLING: &str = r#"
name = "rolling-restart"
duration_ms = 60000
[[topology.regions]]
name = "r"
zones = ["a", "b"]
agents_per_zone = 6
[network]
loss_pct = 0.5
[workload.services]
count = 6
instances = { dist = "uniform", min = 2, max = 4 }
[[faults]]
at_ms = 5000
action = "restart"
nodes = { region = "r" }
spread_ms = 12000
[shoal]
settle_ms = 30000
[shoal.expect]
detection_p99_ms = 10000
max_false_downs = 0
"#;

#[test]
fn rolling_restart_times_every_old_identity() {
    let scenario = Scenario::parse(ROLLING).expect("valid");
    let mut harness = ShoalHarness::new(&scenario, &RngTree::new(1)).expect("harness");
    let cfg = RunConfig {
        seed: 1,
        progress: false,
        threads: 1,
        min_window_events: None,
    };
    let report = run(&scenario, &mut harness, &cfg).expect("runs").report;
    let c = &report.counters;
    assert_eq!(c["deaths_tracked"], 12, "one death per restarted agent");
    assert_eq!(c["detections_missing"], 0, "{c:?}");
    // At least each restarted node itself (it is alive but never knew its old identity).
    assert!(c["detection_observers_unaware"] >= 12, "{c:?}");
    assert!(report.failed_checks().is_empty(), "{:?}", report.checks);
    assert_eq!(report.faults.len(), 1);
    assert_eq!(report.faults[0].target_count, 12);
}
