//! The membership fault menu (issue 15) in miniature; the full scenarios are
//! `simulations/scenarios/faults/{restart-new-address,duplicate-id,forged-down,link-mtu,
//! torn-snapshot}.toml`. Each test runs 24 agents through one fault and checks what the
//! report says happened, not only that the checks passed.

use shoal_sim::report::Report;
use shoal_sim::rng::RngTree;
use shoal_sim::runner::{run, RunConfig};
use shoal_sim::scenario::Scenario;
use shoal_sim::shoal::ShoalHarness;

fn run_seed(toml: &str, seed: u64) -> Report {
    let scenario = Scenario::parse(toml).expect("valid");
    let mut harness = ShoalHarness::new(&scenario, &RngTree::new(seed)).expect("harness");
    let cfg = RunConfig {
        seed,
        progress: false,
        threads: 1,
        min_window_events: None,
    };
    run(&scenario, &mut harness, &cfg).expect("runs").report
}

/// 24 agents, 1% loss, drains at 20 s and 70 s; `faults` and `shoal` are appended.
fn scenario(duration_ms: u64, faults: &str, shoal: &str) -> String {
    format!(
        r#"
name = "menu-mini"
duration_ms = {duration_ms}
[[topology.regions]]
name = "r"
zones = ["a", "b"]
agents_per_zone = 12
[network]
loss_pct = 1.0
[workload.services]
count = 6
instances = {{ dist = "uniform", min = 2, max = 4 }}
[[workload.drains]]
at_ms = 20000
instances = 3
[[workload.drains]]
at_ms = 70000
instances = 3
{faults}
[shoal]
{shoal}
"#
    )
}

fn counter(r: &Report, k: &str) -> u64 {
    r.counters.get(k).copied().unwrap_or(0)
}

#[test]
fn restart_at_a_new_address_is_one_death_and_the_new_identity_is_accepted() {
    let toml = scenario(
        100_000,
        "[[faults]]\nat_ms = 30000\naction = \"restart_at_new_address\"\nnodes = [5]\n",
        "settle_ms = 30000\n[shoal.expect]\ndrain_p99_ms = 1000\ndetection_p99_ms = 15000\n\
         max_false_downs = 0\nconverge = true\nconverge_within_ms = 60000\n",
    );
    let r = run_seed(&toml, 1);
    assert_eq!(counter(&r, "deaths_tracked"), 1, "{:?}", r.counters);
    assert_eq!(counter(&r, "detections_missing"), 0, "{:?}", r.counters);
    // Every other agent saw the old identity go: the new one is at a new address.
    assert!(
        r.distributions["detection_ms"].count >= 20,
        "{:?}",
        r.distributions["detection_ms"]
    );
    assert_eq!(
        r.distributions["members_of_older_generation_per_agent"].max, 0,
        "someone still holds the old identity"
    );
    assert!(r.failed_checks().is_empty(), "{:?}", r.checks);
}

#[test]
fn a_forged_down_at_the_current_incarnation_does_not_keep_a_live_node_down() {
    let toml = scenario(
        100_000,
        "[[faults]]\nat_ms = 30000\naction = \"inject_update\"\nnodes = [14, 16, 18]\n\
         from = [2]\nmember = [9]\nstate = \"down\"\n",
        "settle_ms = 30000\n[shoal.expect]\ndrain_p99_ms = 1000\nmax_false_downs = 0\n\
         max_live_down_spell_ms = 5000\nconverge = true\nconverge_within_ms = 60000\n",
    );
    let r = run_seed(&toml, 1);
    assert_eq!(counter(&r, "updates_injected"), 3, "{:?}", r.counters);
    // The forgery took effect (n9 was declared down somewhere) and was repaired.
    assert!(
        counter(&r, "downs_of_forged_subject") > 0,
        "{:?}",
        r.counters
    );
    assert_eq!(
        counter(&r, "live_down_spells_open_at_end"),
        0,
        "{:?}",
        r.counters
    );
    assert!(r.failed_checks().is_empty(), "{:?}", r.checks);
}

#[test]
fn a_stale_down_of_an_older_boot_generation_changes_nothing() {
    let toml = scenario(
        80_000,
        "[[faults]]\nat_ms = 30000\naction = \"inject_update\"\nnodes = [14, 16, 18]\n\
         from = [2]\nmember = [9]\nstate = \"down\"\nboot_delta = -1\n",
        "settle_ms = 30000\n[shoal.expect]\nmax_false_downs = 0\nmax_live_down_spell_ms = 0\n\
         converge = true\n",
    );
    let r = run_seed(&toml, 1);
    assert_eq!(counter(&r, "updates_injected"), 3, "{:?}", r.counters);
    assert_eq!(
        counter(&r, "downs_of_forged_subject"),
        0,
        "{:?}",
        r.counters
    );
    assert_eq!(counter(&r, "membership_rejoins"), 0, "{:?}", r.counters);
    assert!(r.failed_checks().is_empty(), "{:?}", r.checks);
}

#[test]
fn a_torn_snapshot_is_refused_at_restart_and_the_agent_catches_up() {
    let toml = scenario(
        110_000,
        "[[faults]]\nat_ms = 30000\naction = \"crash_torn_snapshot\"\nnodes = [4]\n\
         [[faults]]\nat_ms = 40000\naction = \"restart\"\nnodes = [4]\n",
        "settle_ms = 40000\n[shoal.expect]\ndrain_p99_ms = 1000\nmax_false_downs = 0\n\
         converge = true\nconverge_within_ms = 60000\n",
    );
    let r = run_seed(&toml, 1);
    assert_eq!(counter(&r, "snapshots_torn"), 1, "{:?}", r.counters);
    assert_eq!(counter(&r, "torn_snapshots_refused"), 1, "{:?}", r.counters);
    assert_eq!(counter(&r, "torn_snapshots_loaded"), 0, "{:?}", r.counters);
    assert_eq!(
        counter(&r, "deaths_tracked"),
        1,
        "crash + restart is one death"
    );
    assert!(r.checks["torn_snapshot_refused"].ok, "{:?}", r.checks);
    assert!(r.failed_checks().is_empty(), "{:?}", r.checks);
}

#[test]
fn a_smaller_path_mtu_between_zones_drops_only_large_datagrams_and_blames_nobody() {
    let toml = scenario(
        110_000,
        "[[faults]]\nat_ms = 10000\naction = \"link_max_datagram\"\n\
         from = { region = \"r\", zone = \"a\" }\nto = { region = \"r\", zone = \"b\" }\n\
         max_datagram_bytes = 300\n\
         [[faults]]\nat_ms = 10000\naction = \"link_max_datagram\"\n\
         from = { region = \"r\", zone = \"b\" }\nto = { region = \"r\", zone = \"a\" }\n\
         max_datagram_bytes = 300\n\
         [[faults]]\nat_ms = 80000\naction = \"heal\"\n",
        "settle_ms = 80000\n[shoal.expect]\ndrain_p99_ms = 1000\nmax_false_downs = 0\n\
         converge = true\nconverge_within_ms = 30000\n",
    );
    let r = run_seed(&toml, 1);
    // The limit took effect: full SWIM packets between the zones were dropped.
    assert!(r.totals.dropped.oversize > 0, "{:?}", r.totals.dropped);
    assert!(r.failed_checks().is_empty(), "{:?}", r.checks);
}

/// Known failure (ADR 0019): the two claimants renew in turn for ever and drag other members
/// down with them (the 50-agent `faults/duplicate-id` seed 1: 1,116 renewals, no convergence). Run with `--ignored`.
#[test]
#[ignore = "known failure: two live processes with one node id flap (ADR 0019)"]
fn a_second_process_with_the_same_node_id_settles_on_one_claimant() {
    let toml = scenario(
        200_000,
        "[[faults]]\nat_ms = 30000\naction = \"duplicate_id\"\nnodes = [5]\nto = [17]\n",
        "settle_ms = 90000\n[shoal.expect]\ndrain_p99_ms = 1000\nmax_false_downs = 0\n\
         converge = true\nconverge_within_ms = 60000\n",
    );
    let r = run_seed(&toml, 1);
    assert_eq!(counter(&r, "duplicate_id_processes"), 1, "{:?}", r.counters);
    assert!(r.failed_checks().is_empty(), "{:?}", r.checks);
}

#[test]
fn menu_faults_are_checked_when_the_scenario_loads() {
    let bad = |faults: &str| {
        Scenario::parse(&scenario(1000, faults, "settle_ms = 0\n"))
            .unwrap_err()
            .to_string()
    };
    let e = bad("[[faults]]\nat_ms = 1\naction = \"duplicate_id\"\nnodes = [5]\nto = [5]\n");
    assert!(e.contains("must be different nodes"), "{e}");
    let e =
        bad("[[faults]]\nat_ms = 1\naction = \"duplicate_id\"\nnodes = { random = 1 }\nto = [5]\n");
    assert!(e.contains("`nodes` must name exactly one node"), "{e}");
    let e = bad("[[faults]]\nat_ms = 1\naction = \"inject_update\"\nnodes = [1]\nfrom = [2]\nmember = [3]\n");
    assert!(e.contains("missing `state`"), "{e}");
    let e = bad("[[faults]]\nat_ms = 1\naction = \"link_max_datagram\"\nfrom = [1]\nto = [2]\nmax_datagram_bytes = 0\n");
    assert!(e.contains("must be > 0"), "{e}");
    let e = bad("[[faults]]\nat_ms = 1\naction = \"restart_at_new_address\"\nnodes = [1]\nstate = \"down\"\n");
    assert!(e.contains("field `state` does not apply"), "{e}");
}
