//! `shoal-sim run <scenario.toml> --seed N [--out DIR] [--json] [--quiet]`

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use shoal_sim::rng::RngTree;
use shoal_sim::runner::{run, RunConfig};
use shoal_sim::scenario::Scenario;
use shoal_sim::shoal::ShoalHarness;
use shoal_sim::testkit::{PingConfig, PingHarness};

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
    },
}

fn run_cmd(
    scenario_path: &Path,
    seed: u64,
    out: Option<&Path>,
    json: bool,
    quiet: bool,
) -> anyhow::Result<bool> {
    let scenario = Scenario::load(scenario_path)?;
    let cfg = RunConfig {
        seed,
        progress: !quiet,
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
        } => {
            let reproduce = format!(
                "reproduce with: shoal-sim run {} --seed {seed}",
                scenario.display()
            );
            match run_cmd(&scenario, seed, out.as_deref(), json, quiet) {
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
    }
}
