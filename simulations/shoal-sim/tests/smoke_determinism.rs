//! The smoke scenario runs the real shoal-mesh cores; run twice with one seed, the reports must
//! be byte-identical, and every check in it must pass (invariant 9, `docs/invariants.md`).

use std::path::Path;

use shoal_sim::rng::RngTree;
use shoal_sim::runner::{run, RunConfig};
use shoal_sim::scenario::Scenario;
use shoal_sim::shoal::ShoalHarness;

fn smoke_json(seed: u64) -> (String, Vec<String>) {
    smoke_json_threads(seed, 1)
}

fn smoke_json_threads(seed: u64, threads: usize) -> (String, Vec<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/smoke.toml");
    let scenario = Scenario::load(&path).expect("smoke.toml loads");
    let mut harness = ShoalHarness::new(&scenario, &RngTree::new(seed)).expect("harness");
    let cfg = RunConfig {
        seed,
        progress: false,
        threads,
        // Every window of two events or more in parallel, so the mesh cores go through it.
        min_window_events: Some(2),
    };
    let outcome = run(&scenario, &mut harness, &cfg).expect("runs");
    let failed = outcome
        .report
        .failed_checks()
        .into_iter()
        .map(str::to_owned)
        .collect();
    (outcome.report.to_json(), failed)
}

#[test]
fn smoke_is_deterministic_and_passes() {
    let (a, failed) = smoke_json(1);
    let (b, _) = smoke_json(1);
    assert_eq!(a, b, "same seed must give a byte-identical report");
    assert!(
        failed.is_empty(),
        "failed checks {failed:?}\nreproduce with: shoal-sim run simulations/scenarios/smoke.toml --seed 1"
    );
    let (c, _) = smoke_json(2);
    assert_ne!(a, c, "another seed must give another run");
}

/// Parallel windows (`World::set_threads`) must not change a byte of the report.
#[test]
fn smoke_is_identical_on_two_threads() {
    let (one, _) = smoke_json_threads(1, 1);
    let (two, failed) = smoke_json_threads(1, 2);
    assert_eq!(one, two, "two threads must give the one-thread report");
    assert!(failed.is_empty(), "failed checks {failed:?}");
}
