//! `shoal-sim run <scenario.toml> --seed N [--out DIR] [--json] [--quiet]`
//! `shoal-sim sweep <scenario.toml> --seeds A..B [--jobs J] [--out FILE]`
//! `shoal-sim merge SWEEP.json... [--out FILE]`

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use shoal_sim::rng::RngTree;
use shoal_sim::runner::{run, RunConfig};
use shoal_sim::scenario::Scenario;
use shoal_sim::shoal::ShoalHarness;
use shoal_sim::sweep::{self, SeedResult, Sweep};
use shoal_sim::testkit::{PingConfig, PingHarness};

/// jemalloc instead of glibc malloc. Each agent's catalog is a set of persistent maps
/// (`imbl::OrdMap`, ADR 0005) and every applied record path-copies a few of their nodes, so a
/// reference run allocates and frees small blocks at a very high rate, and glibc keeps handing
/// the heap top back to the kernel and faulting it in again. Measured on a 26 virtual s cut of
/// `reference/rollout` (5,001 agents), seed 1, report byte-identical: user CPU 132.6 -> 103.5 s,
/// 0.196 -> 0.251 virtual s per wall s, peak RSS 8.43 -> 8.67 GB; mimalloc was as fast with
/// 9.39 GB (docs/benchmarks/simulator.md, session 8). Addresses never reach a report, so the
/// allocator cannot change one.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "shoal-sim", about = "Deterministic simulator for shoal")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one scenario with one seed.
    Run {
        /// Scenario TOML file.
        scenario: PathBuf,
        /// Root seed; the same seed reproduces the same run.
        #[arg(long)]
        seed: u64,
        /// Write report.json, summary.md, speed.json and SVG plots here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the report JSON on stdout.
        #[arg(long)]
        json: bool,
        /// No progress bar, no speed line.
        #[arg(long)]
        quiet: bool,
        /// Print only the compact per-seed result a sweep collects (JSON on stdout).
        #[arg(long, hide = true, conflicts_with_all = ["json", "out"])]
        seed_result: bool,
        /// Threads handling agents' events (1 to 8; default: available cores, at most 8).
        /// Any value gives the same report, byte for byte.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=8))]
        threads: Option<u16>,
    },
    /// Run one scenario over many seeds in parallel processes and merge the results: per-check
    /// pass counts, failing seeds with reproduce lines, p99 across seeds, pooled percentiles.
    Sweep {
        /// Scenario TOML file.
        scenario: PathBuf,
        /// Seeds: `A..B` (end excluded) or `A..=B`.
        #[arg(long)]
        seeds: String,
        /// Processes at a time (default: available cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Run only shard `I/N` of the seeds (every N-th seed, starting with the I-th, 0-based),
        /// e.g. one pod of a Kubernetes Indexed Job: `--shard $(JOB_COMPLETION_INDEX)/10`.
        #[arg(long, value_name = "I/N")]
        shard: Option<String>,
        /// Write the sweep JSON here (input of `shoal-sim merge`); the markdown summary goes to
        /// stdout. `-` writes the JSON to stdout and nothing else (no progress, no summary), so
        /// a container's log is the sweep file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Merge sweep files of one scenario (e.g. seed ranges run on different machines).
    Merge {
        /// Sweep JSON files written by `shoal-sim sweep --out`.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// Write the merged sweep JSON here; the markdown summary goes to stdout either way.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// The available cores, at most [`shoal_sim::world::MAX_THREADS`].
fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(shoal_sim::world::MAX_THREADS)
}

fn run_cmd(
    scenario_path: &Path,
    seed: u64,
    out: Option<&Path>,
    json: bool,
    quiet: bool,
    seed_result: bool,
    threads: usize,
) -> anyhow::Result<bool> {
    let scenario = Scenario::load(scenario_path)?;
    let cfg = RunConfig {
        seed,
        progress: !quiet,
        threads,
        min_window_events: None,
    };
    let outcome = if scenario.shoal.is_some() {
        let mut harness = ShoalHarness::new(&scenario, &RngTree::new(seed))?;
        run(&scenario, &mut harness, &cfg)?
    } else {
        let mut harness = PingHarness {
            cfg: PingConfig::from(&scenario.toy),
        };
        run(&scenario, &mut harness, &cfg)?
    };
    let report = &outcome.report;
    if seed_result {
        println!(
            "{}",
            serde_json::to_string(&SeedResult::from_outcome(&outcome))?
        );
        return Ok(report.failed_checks().is_empty());
    }
    if let Some(dir) = out {
        report
            .write_dir(dir, &outcome.samples)
            .with_context(|| format!("writing {}", dir.display()))?;
        let speed = serde_json::to_string_pretty(&outcome.speed)? + "\n";
        std::fs::write(dir.join("speed.json"), speed)
            .with_context(|| format!("writing {}", dir.display()))?;
    }
    if json {
        print!("{}", report.to_json());
    } else if out.is_none() {
        print!("{}", report.to_markdown());
    }
    if !quiet {
        let s = &outcome.speed;
        eprintln!(
            "speed: {} nodes, {} events in {:.3} s wall = {:.0} events/s, {:.1} virtual s per wall s",
            s.nodes, s.events, s.wall_s, s.events_per_s, s.virtual_s_per_wall_s
        );
    }
    let failed = report.failed_checks();
    if !failed.is_empty() {
        eprintln!("FAILED checks: {}", failed.join(", "));
    }
    Ok(failed.is_empty())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Run {
            scenario,
            seed,
            out,
            json,
            quiet,
            seed_result,
            threads,
        } => {
            let quiet = quiet || seed_result;
            let threads = threads.map_or_else(default_threads, usize::from);
            let reproduce = format!(
                "reproduce with: shoal-sim run {} --seed {seed}",
                scenario.display()
            );
            match run_cmd(
                &scenario,
                seed,
                out.as_deref(),
                json,
                quiet,
                seed_result,
                threads,
            ) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => {
                    eprintln!("{reproduce}");
                    ExitCode::FAILURE
                }
                Err(e) => {
                    eprintln!("error: {e:#}\n{reproduce}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Sweep {
            scenario,
            seeds,
            jobs,
            shard,
            out,
        } => {
            let to_stdout = out.as_deref() == Some(Path::new("-"));
            let sweep = sweep_cmd(&scenario, &seeds, shard.as_deref(), jobs, !to_stdout);
            finish_sweep(sweep, out.as_deref())
        }
        Cmd::Merge { inputs, out } => finish_sweep(sweep::merge_files(&inputs), out.as_deref()),
    }
}

fn sweep_cmd(
    scenario: &Path,
    seeds: &str,
    shard: Option<&str>,
    jobs: Option<usize>,
    progress: bool,
) -> anyhow::Result<Sweep> {
    // Fail on a bad scenario once, here, rather than once per child.
    Scenario::load(scenario)?;
    let mut seeds = sweep::parse_seed_range(seeds)?;
    if let Some(shard) = shard {
        seeds = sweep::shard_of(&seeds, shard)?;
    }
    let jobs = jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let exe = std::env::current_exe().context("locating the shoal-sim binary")?;
    sweep::run_sweep(&exe, scenario, &seeds, jobs, &|r, done, total| {
        if progress {
            let verdict = if r.passed() { "pass" } else { "FAIL" };
            eprintln!("[{done}/{total}] seed {}: {verdict}", r.seed);
        }
    })
}

/// Writes the sweep JSON if asked, prints the summary; fails when any seed failed a check.
fn finish_sweep(sweep: anyhow::Result<Sweep>, out: Option<&Path>) -> ExitCode {
    let to_stdout = out == Some(Path::new("-"));
    let result = sweep.and_then(|s| {
        match out {
            Some(_) if to_stdout => print!("{}", s.to_json()),
            Some(path) => std::fs::write(path, s.to_json())
                .with_context(|| format!("writing {}", path.display()))?,
            None => {}
        }
        Ok(s)
    });
    match result {
        Ok(s) => {
            if !to_stdout {
                print!("{}", s.to_markdown());
            }
            if s.seeds_passed == s.seeds.len() as u64 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
