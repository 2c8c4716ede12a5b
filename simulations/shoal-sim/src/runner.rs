//! Runs a [`Scenario`] end to end: builds the world, applies timed faults, drives a
//! [`Harness`] (the node layer), and assembles the [`Report`].
//!
//! At equal times, every queued event at `t` is processed before a fault or harness wake-up at
//! `t` is applied, and scenario faults at `t` before the steps of spread faults (`spread_ms`)
//! due at `t`.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::RngExt;

use crate::net::Chance;
use crate::node::{NodeCtx, SimNode};
use crate::report::{round3, AppliedFault, Distribution, EngineSummary, Report, Series};
use crate::rng::{Purpose, RngTree, SimRng};
use crate::scenario::{FaultAction, Scenario, ScenarioError, Target, TimedFault};
use crate::world::{World, SERIES_BUCKET_US};

/// The node layer plugged into the runner (the toy [`crate::testkit::PingHarness`] now, the
/// shoal-mesh adapter later).
pub trait Harness {
    /// Node type.
    type Node: SimNode;

    /// Builds a node for a (re)start. Called at start for every node in index order, and for
    /// every `restart` fault.
    fn make_node(&mut self, ctx: &NodeCtx) -> Self::Node;

    /// Next virtual ms at which [`Harness::wake`] wants to run (workload, traffic, sampling).
    fn next_wakeup_ms(&self) -> Option<u64> {
        None
    }

    /// Called at (or just after, if it was in the past) [`Harness::next_wakeup_ms`]; use
    /// [`World::with_node`] to drive nodes.
    fn wake(&mut self, world: &mut World<Self::Node>) {
        let _ = world;
    }

    /// Called right after a scenario fault was applied, with its resolved targets (the mesh
    /// harness records death times and which nodes are cut off or stalled).
    fn on_fault(&mut self, world: &mut World<Self::Node>, fault: &TimedFault, targets: &[u32]) {
        let _ = (world, fault, targets);
    }

    /// Applies a fault only the node layer can (a crafted membership update, a second process
    /// with another node's id, a torn persisted snapshot), its targets resolved. The default
    /// (the toy node) ignores it; [`Harness::on_fault`] is called afterwards either way.
    fn node_fault(&mut self, world: &mut World<Self::Node>, fault: &NodeFault) {
        let _ = (world, fault);
    }

    /// Maps of simulated agents' state swapped for a shared equal copy to save memory (the
    /// mesh harness's catalog sharing passes), if the harness shares any. An engine figure like
    /// the event count: it moves with how state is stored, never with what the protocol did,
    /// so it goes to [`Speed`], not to the [`Report`].
    fn maps_shared(&self) -> Option<u64> {
        None
    }

    /// Called once at the end: add distributions, series, checks and plot samples.
    fn finish(
        &mut self,
        world: &World<Self::Node>,
        report: &mut Report,
        samples: &mut BTreeMap<String, Vec<u64>>,
    ) {
        let _ = (world, report, samples);
    }
}

/// A fault of the membership menu that needs the node layer, with resolved targets (see
/// [`Harness::node_fault`] and the scenario module docs).
#[derive(Clone, Debug, PartialEq)]
pub enum NodeFault {
    /// A second process claiming `node`'s id starts on `on`'s machine (whose agent stops).
    DuplicateId {
        /// Whose id.
        node: u32,
        /// Which machine.
        on: u32,
    },
    /// A crafted SWIM update about `member`, in `from`'s name, to each of `to`.
    InjectUpdate {
        /// Receivers.
        to: Vec<u32>,
        /// Claimed sender.
        from: u32,
        /// Subject.
        member: u32,
        /// Claimed state.
        state: crate::scenario::RumourState,
        /// Added to the subject's current incarnation.
        incarnation_delta: i64,
        /// Added to the subject's current boot generation.
        boot_delta: i64,
    },
    /// These nodes crash while writing their snapshot (the harness tears it, then crashes
    /// them).
    CrashTornSnapshot(Vec<u32>),
}

/// How to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunConfig {
    /// `--seed`.
    pub seed: u64,
    /// Show a progress bar on stderr (only if stderr is a terminal).
    pub progress: bool,
    /// `--threads`: threads handling nodes' events ([`World::set_threads`]); the report is the
    /// same for any value.
    pub threads: usize,
    /// Smallest window handled in parallel ([`World::set_min_window_events`]); `None` keeps
    /// the engine's default. Tests set it low to run small scenarios through parallel windows.
    pub min_window_events: Option<usize>,
}

/// Wall-clock speed of a run. Never part of the [`Report`] (it differs run to run).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Speed {
    /// Nodes simulated.
    pub nodes: u64,
    /// Events processed.
    pub events: u64,
    /// Wall seconds.
    pub wall_s: f64,
    /// Events per wall second.
    pub events_per_s: f64,
    /// Virtual seconds per wall second.
    pub virtual_s_per_wall_s: f64,
    /// Threads handling nodes' events ([`RunConfig::threads`]).
    pub threads: usize,
    /// Windows handled in parallel, and the events in them ([`World::parallel_windows`]).
    pub parallel_windows: u64,
    /// Events handled in parallel windows; the rest ran one at a time.
    pub parallel_events: u64,
    /// Maps swapped for shared equal copies ([`Harness::maps_shared`]), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maps_shared: Option<u64>,
}

/// Everything a run produced.
#[derive(Debug)]
pub struct Outcome {
    /// The deterministic report.
    pub report: Report,
    /// Raw samples for plots, by name.
    pub samples: BTreeMap<String, Vec<u64>>,
    /// Wall-clock speed.
    pub speed: Speed,
}

/// A run that could not start. (A run that completes with failed checks is an [`Outcome`].)
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The scenario is invalid.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
}

/// Resolves a fault target against the world now.
pub fn resolve<N: SimNode>(t: &Target, world: &World<N>, rng: &mut SimRng) -> Vec<u32> {
    let topo = world.topology();
    let s = match t {
        Target::Ids(ids) => return ids.clone(),
        Target::Select(s) => s,
    };
    let mut v: Vec<u32> = match &s.ids {
        Some(ids) => ids.clone(),
        None => (0..topo.len() as u32).collect(),
    };
    if let Some(r) = s.region.as_deref().and_then(|r| topo.region_index(r)) {
        v.retain(|&i| topo.node(i).region == r);
        if let Some(z) = s.zone.as_deref().and_then(|z| topo.zone_index(r, z)) {
            v.retain(|&i| topo.node(i).zone == z);
        }
    }
    if s.crashed {
        v.retain(|&i| !world.is_alive(i));
    }
    if let Some(k) = s.random {
        // Partial Fisher-Yates: the first k positions become a uniform sample.
        let k = (k as usize).min(v.len());
        for i in 0..k {
            let j = rng.random_range(i..v.len());
            v.swap(i, j);
        }
        v.truncate(k);
        v.sort_unstable();
    }
    v
}

struct FaultCtx<'a, H: Harness> {
    world: &'a mut World<H::Node>,
    harness: &'a mut H,
    rng: &'a mut SimRng,
    scenario: &'a Scenario,
}

impl<H: Harness> FaultCtx<'_, H> {
    fn r(&mut self, t: &Target) -> Vec<u32> {
        resolve(t, self.world, self.rng)
    }

    /// Applies one fault; returns every resolved target.
    fn apply(&mut self, f: &TimedFault) -> Vec<u32> {
        match &f.action {
            FaultAction::Cut { a, b } => {
                let (a, b) = (self.r(a), self.r(b));
                self.world.cut(&a, &b);
                [a, b].concat()
            }
            FaultAction::CutOneWay { from, to } => {
                let (a, b) = (self.r(from), self.r(to));
                self.world.cut_one_way(&a, &b);
                [a, b].concat()
            }
            FaultAction::DropLink { from, to } => {
                let (a, b) = (self.r(from), self.r(to));
                for &x in &a {
                    for &y in &b {
                        self.world.drop_link(x, y);
                    }
                }
                [a, b].concat()
            }
            FaultAction::Isolate(t) => self.each(t, |w, i| {
                w.isolate(i);
            }),
            FaultAction::IsolateExcept { nodes, peer } => {
                let peers = self.r(peer);
                let nodes = self.r(nodes);
                if let Some(&p) = peers.first() {
                    for &i in &nodes {
                        self.world.isolate_except(i, p);
                    }
                }
                [nodes, peers].concat()
            }
            FaultAction::Heal => {
                self.world.heal();
                self.world.clear_link_max_datagram();
                Vec::new()
            }
            FaultAction::Recover(t) => self.each(t, |w, i| w.recover(i)),
            FaultAction::Crash(t) => self.each(t, |w, i| w.crash(i)),
            FaultAction::Restart(t) => {
                let nodes = self.r(t);
                for &i in &nodes {
                    let ctx = self.world.ctx_for(i);
                    let node = self.harness.make_node(&ctx);
                    self.world.restart(i, node);
                }
                nodes
            }
            FaultAction::RestartAtNewAddress(t) => {
                let nodes = self.r(t);
                for &i in &nodes {
                    self.world.crash(i);
                    self.world.relocate(i);
                    let ctx = self.world.ctx_for(i);
                    let node = self.harness.make_node(&ctx);
                    self.world.start(i, node);
                }
                nodes
            }
            FaultAction::LinkMaxDatagram {
                from,
                to,
                max_datagram_bytes,
            } => {
                let (a, b) = (self.r(from), self.r(to));
                for &x in &a {
                    for &y in &b {
                        self.world
                            .set_link_max_datagram(x, y, *max_datagram_bytes as usize);
                    }
                }
                [a, b].concat()
            }
            FaultAction::DuplicateId { node, on } => {
                let (node, on) = (self.r(node)[0], self.r(on)[0]);
                let fault = NodeFault::DuplicateId { node, on };
                self.harness.node_fault(self.world, &fault);
                vec![node, on]
            }
            FaultAction::InjectUpdate {
                to,
                from,
                member,
                state,
                incarnation_delta,
                boot_delta,
            } => {
                let to = self.r(to);
                let (from, member) = (self.r(from)[0], self.r(member)[0]);
                let fault = NodeFault::InjectUpdate {
                    to: to.clone(),
                    from,
                    member,
                    state: *state,
                    incarnation_delta: *incarnation_delta,
                    boot_delta: *boot_delta,
                };
                self.harness.node_fault(self.world, &fault);
                [vec![member, from], to].concat()
            }
            FaultAction::CrashTornSnapshot(t) => {
                let nodes = self.r(t);
                let fault = NodeFault::CrashTornSnapshot(nodes.clone());
                self.harness.node_fault(self.world, &fault);
                for &i in &nodes {
                    self.world.crash(i);
                }
                nodes
            }
            FaultAction::Stall {
                nodes,
                stall_ms,
                period_ms,
                for_ms,
            } => {
                let (s, p, f) = (*stall_ms, *period_ms, *for_ms);
                self.each(nodes, |w, i| w.stall(i, s, p, f))
            }
            FaultAction::Unstall(t) => self.each(t, |w, i| w.unstall(i)),
            FaultAction::Skew { nodes, offset_ms } => {
                let o = *offset_ms;
                self.each(nodes, |w, i| w.set_clock_skew(i, o))
            }
            FaultAction::SetNetwork { loss_pct, dup_pct } => {
                let mut cfg = self.world.net_config().clone();
                if let Some(l) = loss_pct {
                    cfg.loss = Chance::from_pct(*l);
                }
                if let Some(d) = dup_pct {
                    cfg.dup = Chance::from_pct(*d);
                }
                let _ = self.scenario;
                self.world.set_net_config(cfg);
                Vec::new()
            }
        }
    }

    /// Resolves the targets of a spread `crash` / `restart` now and splits it into one step
    /// per target, in random order, the k-th of n at `at_ms + k * spread_ms / n`. Returns the
    /// steps (each a single-target fault without spread) and every target, in step order.
    fn spread(&mut self, f: &TimedFault, spread_ms: u64) -> (Vec<TimedFault>, Vec<u32>) {
        let (FaultAction::Crash(t) | FaultAction::Restart(t)) = &f.action else {
            unreachable!("validated: spread_ms only on crash and restart");
        };
        let mut nodes = self.r(t);
        for i in (1..nodes.len()).rev() {
            let j = self.rng.random_range(0..=i);
            nodes.swap(i, j);
        }
        let n = nodes.len() as u64;
        let steps = nodes
            .iter()
            .enumerate()
            .map(|(k, &node)| {
                let one = Target::Ids(vec![node]);
                TimedFault {
                    at_ms: f.at_ms + k as u64 * spread_ms / n,
                    kind: f.kind,
                    action: match f.action {
                        FaultAction::Crash(_) => FaultAction::Crash(one),
                        _ => FaultAction::Restart(one),
                    },
                    spread_ms: None,
                }
            })
            .collect();
        (steps, nodes)
    }

    fn each(&mut self, t: &Target, mut f: impl FnMut(&mut World<H::Node>, u32)) -> Vec<u32> {
        let nodes = self.r(t);
        for &i in &nodes {
            f(self.world, i);
        }
        nodes
    }
}

fn progress_bar(total_ms: u64, enabled: bool) -> ProgressBar {
    if !enabled || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(total_ms), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} virtual ms {msg}")
    {
        pb.set_style(style);
    }
    pb
}

/// Runs `scenario` with `harness`.
pub fn run<H: Harness>(
    scenario: &Scenario,
    harness: &mut H,
    cfg: &RunConfig,
) -> Result<Outcome, RunError> {
    scenario.validate()?;
    let faults = scenario.timed_faults()?;
    let topo = Arc::new(scenario.build_topology()?);
    let tree = RngTree::new(cfg.seed);
    let mut fault_rng = tree.child(Purpose::Faults, 0);
    let mut world: World<H::Node> =
        World::new(Arc::clone(&topo), scenario.network.to_config(), &tree);
    world.set_threads(cfg.threads);
    if let Some(n) = cfg.min_window_events {
        world.set_min_window_events(n);
    }
    let wall = Instant::now();
    world.start_all(|ctx| harness.make_node(ctx));

    let end_us = scenario.duration_ms * 1000;
    let chunk_us = (end_us / 200).max(100_000);
    let pb = progress_bar(scenario.duration_ms, cfg.progress);
    let mut applied = Vec::new();
    let mut next_fault = 0;
    // Pending steps of spread faults, by (at_ms, order of creation).
    let mut steps: BTreeMap<(u64, u64), TimedFault> = BTreeMap::new();
    let mut step_seq = 0u64;
    let mut logged_steps = 0;
    loop {
        let now = world.now_us();
        let fault_at = [
            faults.get(next_fault).map(|f| f.at_ms),
            steps.keys().next().map(|k| k.0),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|ms| ms * 1000);
        let wake_at = harness.next_wakeup_ms().map(|m| (m * 1000).max(now));
        let target = [Some(end_us), fault_at, wake_at, Some(now + chunk_us)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(end_us);
        world.run_until(target);
        pb.set_position(target / 1000);
        if cfg.progress && !std::io::stderr().is_terminal() {
            let step = (scenario.duration_ms / 20).max(1);
            let done = target / 1000 / step;
            if done > logged_steps {
                logged_steps = done;
                eprintln!(
                    "progress: {} / {} virtual ms, {:.1} s wall, {} events",
                    target / 1000,
                    scenario.duration_ms,
                    wall.elapsed().as_secs_f64(),
                    world.stats().events
                );
            }
        }
        loop {
            let file_at = faults.get(next_fault).map(|f| f.at_ms);
            let step_at = steps.keys().next().map(|k| k.0);
            let due = |at: Option<u64>| at.filter(|&ms| ms * 1000 <= target);
            let mut fc = FaultCtx {
                world: &mut world,
                harness,
                rng: &mut fault_rng,
                scenario,
            };
            let file_first = match (due(file_at), due(step_at)) {
                (None, None) => break,
                (Some(f), Some(s)) => f <= s,
                (file, _) => file.is_some(),
            };
            if file_first {
                let f = &faults[next_fault];
                next_fault += 1;
                let targets = if let Some(spread_ms) = f.spread_ms {
                    // Only the steps reach the harness, each at its own time.
                    let (new, targets) = fc.spread(f, spread_ms);
                    for step in new {
                        step_seq += 1;
                        steps.insert((step.at_ms, step_seq), step);
                    }
                    targets
                } else {
                    let targets = fc.apply(f);
                    harness.on_fault(&mut world, f, &targets);
                    targets
                };
                applied.push(AppliedFault {
                    at_ms: f.at_ms,
                    action: f.kind,
                    target_count: targets.len() as u64,
                    targets_sample: targets.iter().take(16).copied().collect(),
                });
            } else {
                let (_, step) = steps.pop_first().expect("a step is due");
                let targets = fc.apply(&step);
                harness.on_fault(&mut world, &step, &targets);
            }
        }
        if wake_at.is_some_and(|w| w <= target) {
            harness.wake(&mut world);
        }
        if target >= end_us {
            break;
        }
    }
    pb.finish_and_clear();
    let wall_s = wall.elapsed().as_secs_f64();

    let mut report = base_report(scenario, cfg.seed, &world);
    report.faults = applied;
    let mut samples = BTreeMap::new();
    harness.finish(&world, &mut report, &mut samples);
    let events = world.stats().events;
    let speed = Speed {
        nodes: topo.len() as u64,
        events,
        wall_s: round3(wall_s),
        events_per_s: round3(events as f64 / wall_s.max(1e-9)),
        virtual_s_per_wall_s: round3(scenario.duration_ms as f64 / 1000.0 / wall_s.max(1e-9)),
        threads: cfg.threads,
        parallel_windows: world.parallel_windows(),
        parallel_events: world.parallel_events(),
        maps_shared: harness.maps_shared(),
    };
    Ok(Outcome {
        report,
        samples,
        speed,
    })
}

/// The engine-level part of a report (everything but the harness's additions).
pub fn base_report<N: SimNode>(scenario: &Scenario, seed: u64, world: &World<N>) -> Report {
    let topo = world.topology();
    let mut report = Report {
        scenario: scenario.name.clone(),
        seed,
        duration_ms: scenario.duration_ms,
        nodes: topo.len() as u64,
        regions: topo.region_names().to_vec(),
        engine: EngineSummary::from(world.stats()),
        ..Report::default()
    };
    let secs = (scenario.duration_ms / 1000).max(1);
    let mut bytes_out_per_s = Vec::with_capacity(topo.len());
    let mut msgs_out = Vec::with_capacity(topo.len());
    let mut drops = Vec::with_capacity(topo.len());
    for c in world.all_counters() {
        report.totals.add(c);
        bytes_out_per_s.push((c.datagram_out.bytes + c.stream_out.bytes) / secs);
        msgs_out.push(c.datagram_out.msgs + c.stream_out.msgs);
        drops.push(c.dropped.total());
    }
    report.per_node.insert(
        "bytes_out_per_s".into(),
        Distribution::from_values(&mut bytes_out_per_s),
    );
    report
        .per_node
        .insert("msgs_out".into(), Distribution::from_values(&mut msgs_out));
    report
        .per_node
        .insert("dropped".into(), Distribution::from_values(&mut drops));
    let bucket_ms = SERIES_BUCKET_US / 1000;
    let buckets = scenario.duration_ms.div_ceil(bucket_ms) as usize;
    for (name, v) in [
        ("deliveries", &world.stats().deliveries_per_bucket),
        ("drops", &world.stats().drops_per_bucket),
    ] {
        let mut values = v.clone();
        values.resize(buckets.max(values.len()), 0);
        report
            .series
            .insert(name.into(), Series { bucket_ms, values });
    }
    report
}
