//! Every committed scenario file loads and validates; the reference family has the shape it
//! claims (3 regions x 3 zones, ~1,667 agents per region, ~100,000 instances; a tenth of that
//! under `reference/small/`).

use std::path::{Path, PathBuf};

use shoal_sim::scenario::Scenario;

fn toml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable scenarios dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            toml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
}

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

#[test]
fn every_scenario_file_loads() {
    let mut files = Vec::new();
    toml_files(&scenarios_dir(), &mut files);
    assert!(files.len() >= 20, "found only {files:?}");
    for f in files {
        let s = Scenario::load(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        s.timed_faults()
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
}

#[test]
fn reference_family_has_its_shape() {
    // The reference directory also holds the three regions-* scenarios (issue 16).
    for (dir, agents, instances, count) in [
        ("reference", 5_001, 100_000.0, 9),
        ("reference/small", 501, 10_000.0, 6),
    ] {
        let mut files = Vec::new();
        toml_files(&scenarios_dir().join(dir), &mut files);
        files.retain(|f| f.parent() == Some(&scenarios_dir().join(dir)));
        assert_eq!(files.len(), count, "{dir}: {files:?}");
        for f in files {
            let s = Scenario::load(&f).expect("loads");
            let topo = s.build_topology().expect("topology");
            assert_eq!(topo.len(), agents, "{}", f.display());
            assert_eq!(topo.region_names().len(), 3, "{}", f.display());
            let services = s
                .workload
                .as_ref()
                .and_then(|w| w.services.as_ref())
                .expect("services");
            let expected = f64::from(services.count) * services.instances.mean();
            assert!(
                (expected - instances).abs() < instances * 0.01,
                "{}: expected {expected} instances",
                f.display()
            );
            let expect = &s.shoal.as_ref().expect("[shoal]").expect;
            assert_eq!(expect.drain_p99_ms, Some(1000), "{}", f.display());
            assert_eq!(expect.detection_p99_ms, Some(10_000), "{}", f.display());
            assert_eq!(expect.max_false_downs, Some(0), "{}", f.display());
            assert!(expect.converge, "{}", f.display());
        }
    }
}
