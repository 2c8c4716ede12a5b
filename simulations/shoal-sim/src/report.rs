//! Reports: a deterministic JSON document, a markdown summary and SVG plots.
//!
//! Determinism rules: only structs and `BTreeMap` (no `HashMap`), integers wherever possible,
//! and the few floats rounded to 3 decimals before serialisation. Wall-clock figures never
//! enter a [`Report`]; they live in [`crate::runner::Speed`] (`speed.json`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::net::NodeCounters;
use crate::scenario::FaultKind;
use crate::world::EngineStats;

/// Rounds to 3 decimals so float output is stable and readable.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Summary of a sample of integer values (nearest-rank percentiles).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    /// Number of samples.
    pub count: u64,
    /// Smallest.
    pub min: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest.
    pub max: u64,
    /// Mean, rounded to 3 decimals.
    pub mean: f64,
}

impl Distribution {
    /// Summarises `values` (sorted in place). All zero for an empty sample.
    pub fn from_values(values: &mut [u64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_unstable();
        let n = values.len();
        let rank = |p: u64| values[((p as usize * n).div_ceil(100)).clamp(1, n) - 1];
        let sum: u128 = values.iter().map(|&v| u128::from(v)).sum();
        Self {
            count: n as u64,
            min: values[0],
            p50: rank(50),
            p90: rank(90),
            p99: rank(99),
            max: values[n - 1],
            mean: round3(sum as f64 / n as f64),
        }
    }

    /// Summarises a copy of `values`.
    pub fn of(values: &[u64]) -> Self {
        Self::from_values(&mut values.to_vec())
    }
}

/// A time series with fixed-width buckets.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Series {
    /// Bucket width, ms.
    pub bucket_ms: u64,
    /// One value per bucket from t = 0.
    pub values: Vec<u64>,
}

/// Engine statistics as reported.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EngineSummary {
    /// Events processed.
    pub events: u64,
    /// Messages delivered.
    pub deliveries: u64,
    /// Timers fired.
    pub timers_fired: u64,
    /// Timers dropped after a crash/restart.
    pub stale_timers: u64,
    /// Events deferred by CPU stalls.
    pub deferred_by_stall: u64,
    /// Largest event-queue length.
    pub max_queue_len: u64,
}

impl From<&EngineStats> for EngineSummary {
    fn from(s: &EngineStats) -> Self {
        Self {
            events: s.events,
            deliveries: s.deliveries,
            timers_fired: s.timers_fired,
            stale_timers: s.stale_timers,
            deferred_by_stall: s.deferred_by_stall,
            max_queue_len: s.max_queue_len,
        }
    }
}

/// One fault as applied.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AppliedFault {
    /// Virtual ms.
    pub at_ms: u64,
    /// What.
    pub action: FaultKind,
    /// How many nodes the targets resolved to (all sides together).
    pub target_count: u64,
    /// The first resolved targets (at most 16), for reading.
    pub targets_sample: Vec<u32>,
}

/// A pass/fail judgement with its evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Passed?
    pub ok: bool,
    /// What was measured.
    pub detail: String,
}

/// The report of one run. Same scenario + same seed => byte-identical [`Report::to_json`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// `--seed`.
    pub seed: u64,
    /// Virtual duration, ms.
    pub duration_ms: u64,
    /// Node count.
    pub nodes: u64,
    /// Region names.
    pub regions: Vec<String>,
    /// Engine statistics.
    pub engine: EngineSummary,
    /// Counters summed over nodes.
    pub totals: NodeCounters,
    /// Per-node distributions (e.g. `bytes_out_per_s`).
    pub per_node: BTreeMap<String, Distribution>,
    /// Faults in the order applied.
    pub faults: Vec<AppliedFault>,
    /// Named distributions added by the node layer (e.g. `ping_rtt_ms`).
    pub distributions: BTreeMap<String, Distribution>,
    /// Named time series.
    pub series: BTreeMap<String, Series>,
    /// Named checks; any `ok = false` fails the run.
    pub checks: BTreeMap<String, Check>,
    /// Named totals (counters summed over nodes, pick counts...).
    pub counters: BTreeMap<String, u64>,
}

impl Report {
    /// Pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("report serialises");
        s.push('\n');
        s
    }

    /// Names of failed checks.
    pub fn failed_checks(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|(_, c)| !c.ok)
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// A human summary in markdown.
    pub fn to_markdown(&self) -> String {
        let mut m = String::new();
        let _ = writeln!(m, "# shoal-sim report: {}\n", self.scenario);
        let _ = writeln!(
            m,
            "seed {} · {} nodes in {} regions ({}) · {} ms virtual\n",
            self.seed,
            self.nodes,
            self.regions.len(),
            self.regions.join(", "),
            self.duration_ms
        );
        let e = &self.engine;
        let _ = writeln!(m, "## Engine\n\n| events | deliveries | timers | stale timers | deferred by stall | max queue |");
        let _ = writeln!(m, "|---:|---:|---:|---:|---:|---:|");
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} |\n",
            e.events,
            e.deliveries,
            e.timers_fired,
            e.stale_timers,
            e.deferred_by_stall,
            e.max_queue_len
        );
        let t = &self.totals;
        let _ = writeln!(m, "## Traffic (all nodes)\n\n| channel | sent msgs | sent bytes | delivered msgs | delivered bytes |");
        let _ = writeln!(m, "|---|---:|---:|---:|---:|");
        let _ = writeln!(
            m,
            "| datagram | {} | {} | {} | {} |",
            t.datagram_out.msgs, t.datagram_out.bytes, t.datagram_in.msgs, t.datagram_in.bytes
        );
        let _ = writeln!(
            m,
            "| stream | {} | {} | {} | {} |\n",
            t.stream_out.msgs, t.stream_out.bytes, t.stream_in.msgs, t.stream_in.bytes
        );
        let d = &t.dropped;
        let _ = writeln!(m, "Dropped: loss {} · partition {} · crashed {} · oversize {} · unknown addr {} · stall overflow {} · duplicated {}\n",
            d.loss, d.partition, d.crashed, d.oversize, d.unknown_addr, d.stall_overflow, t.duplicated);
        let mut dists: Vec<(String, &Distribution)> = self
            .per_node
            .iter()
            .map(|(k, v)| (format!("per node: {k}"), v))
            .collect();
        dists.extend(self.distributions.iter().map(|(k, v)| (k.clone(), v)));
        if !dists.is_empty() {
            let _ = writeln!(
                m,
                "## Distributions\n\n| name | count | min | p50 | p90 | p99 | max | mean |"
            );
            let _ = writeln!(m, "|---|---:|---:|---:|---:|---:|---:|---:|");
            for (k, v) in dists {
                let _ = writeln!(
                    m,
                    "| {k} | {} | {} | {} | {} | {} | {} | {} |",
                    v.count, v.min, v.p50, v.p90, v.p99, v.max, v.mean
                );
            }
            m.push('\n');
        }
        if !self.counters.is_empty() {
            let _ = writeln!(m, "## Counters\n\n| name | value |\n|---|---:|");
            for (k, v) in &self.counters {
                let _ = writeln!(m, "| {k} | {v} |");
            }
            m.push('\n');
        }
        if !self.faults.is_empty() {
            let _ = writeln!(
                m,
                "## Faults\n\n| at ms | action | targets |\n|---:|---|---:|"
            );
            for f in &self.faults {
                let _ = writeln!(m, "| {} | {:?} | {} |", f.at_ms, f.action, f.target_count);
            }
            m.push('\n');
        }
        if !self.checks.is_empty() {
            let _ = writeln!(m, "## Checks\n\n| check | result | detail |\n|---|---|---|");
            for (k, c) in &self.checks {
                let _ = writeln!(
                    m,
                    "| {k} | {} | {} |",
                    if c.ok { "pass" } else { "**FAIL**" },
                    c.detail
                );
            }
        }
        m
    }

    /// Writes `report.json`, `summary.md`, one `<name>_hist.svg` + `<name>_cdf.svg` per sample
    /// set and one `<name>_series.svg` per series into `dir` (created if missing).
    pub fn write_dir(
        &self,
        dir: &Path,
        samples: &BTreeMap<String, Vec<u64>>,
    ) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("report.json"), self.to_json())?;
        std::fs::write(dir.join("summary.md"), self.to_markdown())?;
        let io = |e: crate::plot::PlotError| std::io::Error::other(e.to_string());
        for (name, values) in samples {
            crate::plot::histogram_svg(&dir.join(format!("{name}_hist.svg")), name, values)
                .map_err(io)?;
            crate::plot::cdf_svg(&dir.join(format!("{name}_cdf.svg")), name, values).map_err(io)?;
        }
        for (name, s) in &self.series {
            crate::plot::series_svg(&dir.join(format!("{name}_series.svg")), name, s)
                .map_err(io)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        let d = Distribution::from_values(&mut v);
        assert_eq!(
            (d.count, d.min, d.p50, d.p90, d.p99, d.max),
            (100, 1, 50, 90, 99, 100)
        );
        assert_eq!(d.mean, 50.5);
        assert_eq!(Distribution::of(&[]), Distribution::default());
        assert_eq!(Distribution::of(&[7]).p99, 7);
    }
}
