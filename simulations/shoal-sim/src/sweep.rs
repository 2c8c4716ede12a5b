//! Seed sweeps: one scenario over many seeds, run in parallel processes, merged into one result.
//!
//! A single seed shows one path through a scenario; a p99 over one run hides the seeds where
//! the tail is worse. A sweep runs `shoal-sim run SCENARIO --seed N` for each seed as a child
//! process (at most `jobs` at a time), collects one [`SeedResult`] per seed and merges them into
//! a [`Sweep`]: per-check pass counts, the failing seeds with the line that reproduces each, the
//! spread of every distribution's p99 across seeds, and pooled percentiles over all seeds'
//! samples.
//!
//! A [`Sweep`] is a pure function of its set of [`SeedResult`]s (sorted by seed, no wall-clock
//! figure inside), so sweeps of disjoint seed ranges made on different machines merge into the
//! same document one big sweep would have produced ([`Sweep::merge`]; `shoal-sim merge`). A seed
//! present in two inputs must carry the same result: the simulator is deterministic, so a
//! difference means the inputs came from different code or scenarios, and merging refuses.
//!
//! Pooled percentiles come from [`Histogram`]s rather than raw samples, so a sweep file stays
//! small at reference scale (millions of drain observations). Values below 1,024 are kept
//! exactly; larger ones keep their top 10 significant bits (relative error below 0.1%, the
//! scheme of HdrHistogram with 3 significant decimal digits; Tene, "HdrHistogram").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::report::{Distribution, Report};
use crate::runner::Outcome;

/// Version of the [`SeedResult`] and [`Sweep`] JSON shapes; merging refuses other versions.
pub const FORMAT_VERSION: u32 = 1;

/// Values below this are kept exactly in a [`Histogram`].
const EXACT_BELOW: u64 = 1 << SIGNIFICANT_BITS;
/// Significant bits kept for larger values.
const SIGNIFICANT_BITS: u32 = 10;

/// A mergeable histogram of non-negative integer samples (e.g. milliseconds).
///
/// `buckets` maps a bucket's lower bound to its count; see the module docs for the bucketing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    /// Bucket lower bound -> samples in the bucket.
    pub buckets: BTreeMap<u64, u64>,
}

impl Histogram {
    /// The lower bound of the bucket holding `v`.
    pub fn bucket_of(v: u64) -> u64 {
        if v < EXACT_BELOW {
            return v;
        }
        let shift = (64 - v.leading_zeros()) - SIGNIFICANT_BITS;
        (v >> shift) << shift
    }

    /// A histogram of `values`.
    pub fn of(values: &[u64]) -> Self {
        let mut h = Self::default();
        for &v in values {
            *h.buckets.entry(Self::bucket_of(v)).or_default() += 1;
        }
        h
    }

    /// Adds every sample of `other`.
    pub fn absorb(&mut self, other: &Histogram) {
        for (&b, &n) in &other.buckets {
            *self.buckets.entry(b).or_default() += n;
        }
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.buckets.values().sum()
    }

    /// Nearest-rank percentile `p` (0-100) as a bucket lower bound, like
    /// [`Distribution::from_values`]; `None` when empty.
    pub fn percentile(&self, p: u64) -> Option<u64> {
        self.permille(p * 10)
    }

    /// Nearest-rank quantile in thousandths (999 = p99.9) as a bucket lower bound; `None`
    /// when empty.
    pub fn permille(&self, q: u64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = (q * n).div_ceil(1000).clamp(1, n);
        let mut seen = 0;
        for (&b, &c) in &self.buckets {
            seen += c;
            if seen >= rank {
                return Some(b);
            }
        }
        self.buckets.keys().next_back().copied()
    }
}

/// What one seed's run produced, as a sweep needs it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedResult {
    /// [`FORMAT_VERSION`].
    pub format: u32,
    /// Scenario name from the scenario file.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// Check name -> passed?
    pub checks: BTreeMap<String, bool>,
    /// Failed check name -> its evidence.
    pub failed_details: BTreeMap<String, String>,
    /// The report's named distributions.
    pub distributions: BTreeMap<String, Distribution>,
    /// The report's named counters.
    pub counters: BTreeMap<String, u64>,
    /// Histograms of the run's raw samples (those kept for plots, e.g. `drain_propagation_ms`).
    pub samples: BTreeMap<String, Histogram>,
}

impl SeedResult {
    /// Extracts the sweep's view of one run.
    pub fn from_outcome(outcome: &Outcome) -> Self {
        let r: &Report = &outcome.report;
        Self {
            format: FORMAT_VERSION,
            scenario: r.scenario.clone(),
            seed: r.seed,
            checks: r.checks.iter().map(|(k, c)| (k.clone(), c.ok)).collect(),
            failed_details: r
                .checks
                .iter()
                .filter(|(_, c)| !c.ok)
                .map(|(k, c)| (k.clone(), c.detail.clone()))
                .collect(),
            distributions: r.distributions.clone(),
            counters: r.counters.clone(),
            samples: outcome
                .samples
                .iter()
                .map(|(k, v)| (k.clone(), Histogram::of(v)))
                .collect(),
        }
    }

    /// Did every check pass?
    pub fn passed(&self) -> bool {
        self.checks.values().all(|&ok| ok)
    }
}

/// Pass counts of one check across a sweep.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckTally {
    /// Seeds on which it passed.
    pub passed: u64,
    /// Seeds on which it failed, ascending.
    pub failing_seeds: Vec<u64>,
}

/// One distribution across a sweep.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AcrossSeeds {
    /// The per-seed p99s summarised (min, median, max... over seeds).
    pub p99_over_seeds: Distribution,
    /// The per-seed maxima summarised.
    pub max_over_seeds: Distribution,
    /// Seed with the largest p99 (ties: the smallest seed).
    pub worst_seed: u64,
}

/// Pooled percentiles of one sample kind over every seed's samples.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pooled {
    /// Samples over all seeds.
    pub count: u64,
    /// Pooled median (bucket lower bound).
    pub p50: u64,
    /// Pooled 99th percentile (bucket lower bound).
    pub p99: u64,
    /// Pooled 99.9th percentile (bucket lower bound).
    pub p999: u64,
    /// Largest bucket lower bound.
    pub max: u64,
    /// The merged histogram, so sweeps merge exactly.
    pub histogram: Histogram,
}

/// The merged result of a sweep: a pure function of its [`SeedResult`]s.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    /// [`FORMAT_VERSION`].
    pub format: u32,
    /// Scenario name.
    pub scenario: String,
    /// Scenario file as given to the sweep (for reproduce lines).
    pub scenario_file: String,
    /// Seeds run, ascending.
    pub seeds: Vec<u64>,
    /// Seeds on which every check passed.
    pub seeds_passed: u64,
    /// Check name -> tally.
    pub checks: BTreeMap<String, CheckTally>,
    /// `shoal-sim run ...` lines reproducing each failing seed, ascending by seed.
    pub reproduce: Vec<String>,
    /// Distribution name -> spread across seeds.
    pub distributions: BTreeMap<String, AcrossSeeds>,
    /// Sample kind -> pooled percentiles.
    pub pooled: BTreeMap<String, Pooled>,
    /// Counter name -> sum over seeds.
    pub counters_total: BTreeMap<String, u64>,
    /// Every seed's result, ascending by seed.
    pub runs: Vec<SeedResult>,
}

impl Sweep {
    /// Builds the sweep document from per-seed results (any order; duplicates must agree).
    ///
    /// # Errors
    /// No results; results of different scenarios or format versions; one seed with two
    /// different results.
    pub fn from_results(scenario_file: &str, results: Vec<SeedResult>) -> anyhow::Result<Self> {
        let mut by_seed: BTreeMap<u64, SeedResult> = BTreeMap::new();
        for r in results {
            if r.format != FORMAT_VERSION {
                bail!(
                    "seed {} has format {}, this build reads {FORMAT_VERSION}",
                    r.seed,
                    r.format
                );
            }
            if let Some(prev) = by_seed.get(&r.seed) {
                if *prev != r {
                    bail!(
                        "seed {} appears twice with different results: the inputs come from \
                         different code or scenario files",
                        r.seed
                    );
                }
                continue;
            }
            by_seed.insert(r.seed, r);
        }
        let runs: Vec<SeedResult> = by_seed.into_values().collect();
        let Some(first) = runs.first() else {
            bail!("a sweep needs at least one seed result");
        };
        let scenario = first.scenario.clone();
        if let Some(other) = runs.iter().find(|r| r.scenario != scenario) {
            bail!(
                "seed {} ran scenario {:?}, seed {} ran {scenario:?}: one sweep is one scenario",
                other.seed,
                other.scenario,
                first.seed
            );
        }

        let mut checks: BTreeMap<String, CheckTally> = BTreeMap::new();
        let mut reproduce = Vec::new();
        let mut p99s: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
        let mut maxes: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut hist: BTreeMap<String, Histogram> = BTreeMap::new();
        let mut counters_total: BTreeMap<String, u64> = BTreeMap::new();
        for r in &runs {
            for (name, &ok) in &r.checks {
                let t = checks.entry(name.clone()).or_default();
                if ok {
                    t.passed += 1;
                } else {
                    t.failing_seeds.push(r.seed);
                }
            }
            if !r.passed() {
                reproduce.push(format!("shoal-sim run {scenario_file} --seed {}", r.seed));
            }
            for (name, d) in &r.distributions {
                p99s.entry(name.clone()).or_default().push((d.p99, r.seed));
                maxes.entry(name.clone()).or_default().push(d.max);
            }
            for (name, h) in &r.samples {
                hist.entry(name.clone()).or_default().absorb(h);
            }
            for (name, &v) in &r.counters {
                let total = counters_total.entry(name.clone()).or_default();
                *total = total.saturating_add(v);
            }
        }
        let distributions = p99s
            .into_iter()
            .map(|(name, pairs)| {
                let worst_seed = pairs
                    .iter()
                    .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
                    .map_or(0, |p| p.1);
                let values: Vec<u64> = pairs.iter().map(|p| p.0).collect();
                let across = AcrossSeeds {
                    p99_over_seeds: Distribution::of(&values),
                    max_over_seeds: Distribution::of(&maxes[&name]),
                    worst_seed,
                };
                (name, across)
            })
            .collect();
        let pooled = hist
            .into_iter()
            .map(|(name, h)| {
                let p = Pooled {
                    count: h.count(),
                    p50: h.percentile(50).unwrap_or(0),
                    p99: h.percentile(99).unwrap_or(0),
                    p999: h.permille(999).unwrap_or(0),
                    max: h.buckets.keys().next_back().copied().unwrap_or(0),
                    histogram: h,
                };
                (name, p)
            })
            .collect();
        Ok(Self {
            format: FORMAT_VERSION,
            scenario,
            scenario_file: scenario_file.to_string(),
            seeds: runs.iter().map(|r| r.seed).collect(),
            seeds_passed: runs.iter().filter(|r| r.passed()).count() as u64,
            checks,
            reproduce,
            distributions,
            pooled,
            counters_total,
            runs,
        })
    }

    /// Merges sweeps of the same scenario (e.g. seed ranges run on different machines).
    ///
    /// # Errors
    /// As [`Sweep::from_results`]; also sweeps of different scenario files.
    pub fn merge(sweeps: Vec<Sweep>) -> anyhow::Result<Self> {
        let Some(file) = sweeps.first().map(|s| s.scenario_file.clone()) else {
            bail!("nothing to merge");
        };
        let mut results = Vec::new();
        for s in sweeps {
            if s.format != FORMAT_VERSION {
                bail!(
                    "a sweep has format {}, this build reads {FORMAT_VERSION}",
                    s.format
                );
            }
            results.extend(s.runs);
        }
        Self::from_results(&file, results)
    }

    /// Pretty JSON with a trailing newline (deterministic: maps are ordered).
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("sweep serialises");
        s.push('\n');
        s
    }

    /// A human summary in markdown.
    pub fn to_markdown(&self) -> String {
        use std::fmt::Write as _;
        let mut m = String::new();
        let n = self.seeds.len();
        let _ = writeln!(m, "# shoal-sim sweep: {}\n", self.scenario);
        let _ = writeln!(
            m,
            "{n} seeds ({}..={}), {} passed every check\n",
            self.seeds.first().unwrap_or(&0),
            self.seeds.last().unwrap_or(&0),
            self.seeds_passed
        );
        let _ = writeln!(
            m,
            "## Checks\n\n| check | passed | failing seeds |\n|---|---:|---|"
        );
        for (name, t) in &self.checks {
            let failing: Vec<String> = t.failing_seeds.iter().map(u64::to_string).collect();
            let _ = writeln!(m, "| {name} | {}/{n} | {} |", t.passed, failing.join(" "));
        }
        if !self.reproduce.is_empty() {
            let _ = writeln!(m, "\nReproduce the failing seeds:\n\n```");
            for line in &self.reproduce {
                let _ = writeln!(m, "{line}");
            }
            let _ = writeln!(m, "```");
        }
        let _ = writeln!(
            m,
            "\n## p99 across seeds\n\n| distribution | min | median | max | worst seed |\n|---|---:|---:|---:|---:|"
        );
        for (name, a) in &self.distributions {
            let d = &a.p99_over_seeds;
            let _ = writeln!(
                m,
                "| {name} | {} | {} | {} | {} |",
                d.min, d.p50, d.max, a.worst_seed
            );
        }
        if !self.pooled.is_empty() {
            let _ = writeln!(
                m,
                "\n## Pooled over all seeds' samples\n\n| sample | count | p50 | p99 | p99.9 | max |\n|---|---:|---:|---:|---:|---:|"
            );
            for (name, p) in &self.pooled {
                let _ = writeln!(
                    m,
                    "| {name} | {} | {} | {} | {} | {} |",
                    p.count, p.p50, p.p99, p.p999, p.max
                );
            }
        }
        m
    }
}

/// Parses `A..B` (exclusive end) or `A..=B` (inclusive end) into the seeds it names.
///
/// # Errors
/// Not a range, end before start, or more than 1,000,000 seeds.
pub fn parse_seed_range(s: &str) -> anyhow::Result<Vec<u64>> {
    let (a, b, inclusive) = if let Some((a, b)) = s.split_once("..=") {
        (a, b, true)
    } else if let Some((a, b)) = s.split_once("..") {
        (a, b, false)
    } else {
        bail!("seed range {s:?}: expected A..B (end excluded) or A..=B");
    };
    let a: u64 = a
        .trim()
        .parse()
        .with_context(|| format!("seed range {s:?}: bad start"))?;
    let b: u64 = b
        .trim()
        .parse()
        .with_context(|| format!("seed range {s:?}: bad end"))?;
    let end = if inclusive { b.checked_add(1) } else { Some(b) };
    let Some(end) = end.filter(|&e| e > a) else {
        bail!("seed range {s:?} is empty");
    };
    if end - a > 1_000_000 {
        bail!("seed range {s:?} names more than 1,000,000 seeds");
    }
    Ok((a..end).collect())
}

/// The seeds of shard `I/N`: every N-th seed of `seeds` starting at position I (0-based), so N
/// shards together run every seed exactly once and each gets a similar mix.
///
/// # Errors
/// Not `I/N`, N = 0, I >= N, or N above 100,000.
pub fn shard_of(seeds: &[u64], shard: &str) -> anyhow::Result<Vec<u64>> {
    let Some((i, n)) = shard.split_once('/') else {
        bail!("shard {shard:?}: expected I/N, e.g. 3/10");
    };
    let i: usize = i
        .trim()
        .parse()
        .with_context(|| format!("shard {shard:?}: bad index"))?;
    let n: usize = n
        .trim()
        .parse()
        .with_context(|| format!("shard {shard:?}: bad count"))?;
    if n == 0 || n > 100_000 || i >= n {
        bail!("shard {shard:?}: need 0 <= I < N <= 100000");
    }
    Ok(seeds.iter().skip(i).step_by(n).copied().collect())
}

/// Runs `scenario` for every seed in child processes of `exe` (`exe run SCENARIO --seed N
/// --seed-result`), at most `jobs` at a time, and merges the results.
///
/// A child that fails to start, crashes or prints something that is not a [`SeedResult`] stops
/// the sweep with its seed and stderr: a sweep that silently skipped seeds would overstate
/// confidence. (Failed *checks* are results, not errors.)
///
/// # Errors
/// As above, and [`Sweep::from_results`]'s errors.
pub fn run_sweep(
    exe: &Path,
    scenario: &Path,
    seeds: &[u64],
    jobs: usize,
    on_done: &(dyn Fn(&SeedResult, usize, usize) + Sync),
) -> anyhow::Result<Sweep> {
    let jobs = jobs.clamp(1, 256).min(seeds.len().max(1));
    let queue: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(seeds.iter().rev().copied().collect()));
    let results: Arc<Mutex<Vec<SeedResult>>> = Arc::new(Mutex::new(Vec::new()));
    let first_error: Arc<Mutex<Option<anyhow::Error>>> = Arc::new(Mutex::new(None));
    let total = seeds.len();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let (queue, results, first_error) = (&queue, &results, &first_error);
            scope.spawn(move || loop {
                if first_error.lock().expect("error slot").is_some() {
                    return;
                }
                let Some(seed) = queue.lock().expect("seed queue").pop() else {
                    return;
                };
                match run_child(exe, scenario, seed) {
                    Ok(r) => {
                        let mut all = results.lock().expect("results");
                        all.push(r);
                        on_done(all.last().expect("just pushed"), all.len(), total);
                    }
                    Err(e) => {
                        first_error.lock().expect("error slot").get_or_insert(e);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = first_error.lock().expect("error slot").take() {
        return Err(e);
    }
    let results = std::mem::take(&mut *results.lock().expect("results"));
    Sweep::from_results(&scenario.display().to_string(), results)
}

fn run_child(exe: &Path, scenario: &Path, seed: u64) -> anyhow::Result<SeedResult> {
    let out = Command::new(exe)
        .arg("run")
        .arg(scenario)
        .arg("--seed")
        .arg(seed.to_string())
        .arg("--seed-result")
        // The sweep runs seeds side by side: one thread each.
        .arg("--threads")
        .arg("1")
        .output()
        .with_context(|| format!("seed {seed}: starting {}", exe.display()))?;
    // Exit status 1 with a result on stdout means "checks failed": still a result.
    let parsed: Result<SeedResult, _> = serde_json::from_slice(&out.stdout);
    match parsed {
        Ok(r) if r.seed == seed => Ok(r),
        Ok(r) => bail!("seed {seed}: child reported seed {}", r.seed),
        Err(e) => bail!(
            "seed {seed}: no result ({e}; exit {}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

/// Reads sweep files and merges them.
///
/// # Errors
/// Unreadable or malformed files, and [`Sweep::merge`]'s errors.
pub fn merge_files(paths: &[PathBuf]) -> anyhow::Result<Sweep> {
    let mut sweeps = Vec::with_capacity(paths.len());
    for p in paths {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let s: Sweep = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a shoal-sim sweep file", p.display()))?;
        sweeps.push(s);
    }
    Sweep::merge(sweeps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(seed: u64, ok: bool, p99: u64, samples: &[u64]) -> SeedResult {
        let mut d = Distribution::of(samples);
        d.p99 = p99;
        SeedResult {
            format: FORMAT_VERSION,
            scenario: "s".into(),
            seed,
            checks: [("a".to_string(), true), ("b".to_string(), ok)].into(),
            failed_details: BTreeMap::new(),
            distributions: [("drain_ms".to_string(), d)].into(),
            counters: [("picks".to_string(), seed)].into(),
            samples: [("drain_ms".to_string(), Histogram::of(samples))].into(),
        }
    }

    #[test]
    fn histogram_is_exact_below_1024_and_within_a_tenth_of_a_percent_above() {
        for v in 0..1024 {
            assert_eq!(Histogram::bucket_of(v), v);
        }
        for v in [1024u64, 1025, 4097, 99_999, 1 << 40, u64::MAX] {
            let b = Histogram::bucket_of(v);
            assert!(b <= v, "{v}");
            assert!((v - b) as f64 / v as f64 <= 1.0 / 1024.0, "{v} -> {b}");
        }
        let h = Histogram::of(&[1, 2, 3, 4, 100]);
        assert_eq!(h.percentile(50), Some(3));
        assert_eq!(h.percentile(99), Some(100));
        assert_eq!(h.permille(200), Some(1));
        assert_eq!(h.permille(999), Some(100));
        assert_eq!(Histogram::default().percentile(50), None);
    }

    #[test]
    fn a_sweep_counts_checks_and_names_failing_seeds() {
        let s = Sweep::from_results(
            "x.toml",
            vec![
                result(3, false, 30, &[30]),
                result(1, true, 10, &[10]),
                result(2, true, 20, &[20]),
            ],
        )
        .unwrap();
        assert_eq!(s.seeds, vec![1, 2, 3]);
        assert_eq!(s.seeds_passed, 2);
        assert_eq!(s.checks["a"].passed, 3);
        assert_eq!(s.checks["b"].failing_seeds, vec![3]);
        assert_eq!(s.reproduce, vec!["shoal-sim run x.toml --seed 3"]);
        let d = &s.distributions["drain_ms"];
        assert_eq!(
            (d.p99_over_seeds.min, d.p99_over_seeds.max, d.worst_seed),
            (10, 30, 3)
        );
        assert_eq!(s.pooled["drain_ms"].count, 3);
        assert_eq!(s.counters_total["picks"], 6);
    }

    #[test]
    fn merging_split_sweeps_equals_one_sweep() {
        let all: Vec<SeedResult> = (1..=6)
            .map(|s| result(s, s % 4 != 0, s * 7, &[s, s * 100, s * 1000]))
            .collect();
        let whole = Sweep::from_results("x.toml", all.clone()).unwrap();
        let a = Sweep::from_results("x.toml", all[..4].to_vec()).unwrap();
        // Overlapping seed 4 in both halves: identical results merge silently.
        let b = Sweep::from_results("x.toml", all[3..].to_vec()).unwrap();
        let merged = Sweep::merge(vec![b, a]).unwrap();
        assert_eq!(merged, whole);
        assert_eq!(merged.to_json(), whole.to_json());
    }

    #[test]
    fn merging_refuses_conflicting_or_foreign_results() {
        let a = result(1, true, 10, &[10]);
        let mut b = a.clone();
        b.counters.insert("picks".into(), 99);
        let err = Sweep::from_results("x", vec![a.clone(), b]).unwrap_err();
        assert!(err.to_string().contains("twice"), "{err}");
        let mut other = result(2, true, 10, &[10]);
        other.scenario = "t".into();
        let err = Sweep::from_results("x", vec![a.clone(), other]).unwrap_err();
        assert!(err.to_string().contains("one scenario"), "{err}");
        let mut old = a;
        old.format = 0;
        assert!(Sweep::from_results("x", vec![old]).is_err());
        assert!(Sweep::from_results("x", vec![]).is_err());
    }

    #[test]
    fn shards_partition_the_seeds() {
        let seeds: Vec<u64> = (1..=10).collect();
        let mut all: Vec<u64> = (0..3)
            .flat_map(|i| shard_of(&seeds, &format!("{i}/3")).unwrap())
            .collect();
        assert_eq!(shard_of(&seeds, "1/3").unwrap(), vec![2, 5, 8]);
        all.sort_unstable();
        assert_eq!(all, seeds);
        for bad in ["3/3", "0/0", "x/2", "1", "1/200000"] {
            assert!(shard_of(&seeds, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn seed_ranges_parse_like_rust_ranges() {
        assert_eq!(parse_seed_range("1..4").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_seed_range("1..=3").unwrap(), vec![1, 2, 3]);
        assert!(parse_seed_range("3..3").is_err());
        assert!(parse_seed_range("5..1").is_err());
        assert!(parse_seed_range("x..2").is_err());
        assert!(parse_seed_range("7").is_err());
        assert!(parse_seed_range("0..2000000").is_err());
    }
}
