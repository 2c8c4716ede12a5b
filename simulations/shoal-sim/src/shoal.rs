//! The shoal layer of the simulator: real `shoal-mesh` cores as nodes, a region authority
//! model, a workload (services, rollouts, drains, process and node crashes), a traffic model
//! (every agent's app picks endpoints), and the oracle that turns it all into a report.
//!
//! # What is measured
//! * **Drain propagation**: from the authority's commit of a withdrawal (DRAINING) until each
//!   live agent applied it (the agent stops handing the endpoint out at that moment). Agents
//!   that were ever CPU-stalled are reported apart (`drain_propagation_stalled_agents_ms`), as
//!   their downs are, and so are agents a link fault cut off from the requesting agent when
//!   the withdrawal was committed (`drain_propagation_cut_off_agents_ms`: they get it after
//!   the heal): the check is over the others.
//! * **Hard-failure detection**: from a node's crash until each surviving agent's SWIM declared
//!   it down (every endpoint of that node stops being routable there at that moment).
//! * **Process failure**: from a process crash until each agent applied the owner's failing
//!   health record.
//! * **False downs**: live, current identities declared down while neither cut off nor stalled.
//! * **Late picks**: picks of an endpoint after it was withdrawn or died (the traffic timeline).
//! * **Convergence**: after `settle_ms`, the first time every live agent of a region holds the
//!   same heads and the same membership, and whether all routable sets agree at the end.
//!
//! # The authority model
//! Each region runs the shared `shoal-authority` rules ([`shoal_authority::AuthorityState`], the
//! same state machine the Raft-replicated authority applies): registration assigns the boot
//! generation from the log index, transitions are checked against the legal table and signed
//! with gap-free revisions after `commit_ms`. Writes are refused during configured outage
//! windows (requests are retried with jittered backoff), and each signed record is published at
//! the requesting agent and at one more agent of the region (the authority's own mesh member).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use rand::{Rng, RngExt};
use serde::Deserialize;
use shoal_authority::{ApplyContext, AuthorityCommand, AuthorityState, Caller};
use shoal_catalog::view;
use shoal_catalog::{Catalog, Keyring, RecordCache, Verifier};
use shoal_mesh::membership::MemberId;
use shoal_mesh::mesh::Restore;
use shoal_mesh::{Command, MembershipEvent, Mesh, MeshConfig, MeshEvent, TimerToken};
use shoal_proto::{
    EndpointSpec, Generation, HealthStatus, InstanceId, LabelDimension, Labels, LifecycleState,
    Name, NodeId, NodeKey, Region, Revision, ServiceKey, SignatureBytes, SignatureError,
    SignedHealth, SignedLifecycle, SigningKey, TransitionReason, VerifyingKey, Version, Zone,
};

use crate::node::{Channel, NodeCtx, SimNode, Transmit};
use crate::report::{Check, Distribution, Report};
use crate::rng::{Purpose, SimRng};
use crate::runner::Harness;
use crate::scenario::{CountDist, CrashKind, FaultAction, Scenario, TimedFault};
use crate::world::World;

mod authority;
mod fault_menu;
mod keys;
mod node;
mod observer;
mod oracle;
mod regions;
mod regions_report;
mod spec;
mod traffic;
mod workload;

use authority::*;
pub use keys::{SharedKeys, SimKeys};
pub use node::ShoalNode;
use observer::*;
pub use observer::{Observer, SharedObserver};
pub use spec::{
    Expectations, GlobalServiceSpec, PolicySpec, RegionExpectations, RegionsSpec, ShoalSpec,
    Window, WithdrawSpec,
};
use workload::*;

/// The shoal harness: drives `shoal-mesh` nodes through a scenario and measures it.
pub struct ShoalHarness {
    spec: ShoalSpec,
    mesh_config: Vec<MeshConfig>,
    keys: SharedKeys,
    node_keys: Vec<SigningKey>,
    authorities: Vec<RegionAuthority>,
    region_names: Vec<Region>,
    zone_names: Vec<Zone>,
    observer: SharedObserver,
    instances: Vec<Instance>,
    by_key: HashMap<(ServiceKey, InstanceId), usize>,
    services: Vec<ServiceKey>,
    service_instances: BTreeMap<ServiceKey, Vec<usize>>,
    initial: Vec<Catalog>,
    actions: BTreeMap<(u64, u64), Action>,
    action_seq: u64,
    rng: SimRng,
    traffic_rng: SimRng,
    picks_per_agent_per_s: f64,
    pick_credit: f64,
    next_traffic_ms: u64,
    next_sample_ms: u64,
    converged_at: BTreeMap<u16, u64>,
    // traffic timeline
    picks: u64,
    no_backend: u64,
    late_withdrawn_ms: Vec<u64>,
    late_dead_ms: Vec<u64>,
    /// Per instance (by index): the latest pick after it went bad, ms after it went bad.
    last_bad_pick: HashMap<usize, u64>,
    replaced: u64,
    refused_writes: u64,
    authority_refusals: u64,
    first_boot_ids: Vec<MemberId>,
    next_share_ms: u64,
    maps_shared: u64,
    /// Per agent: the catalogs' [`ShareMark`] at its last sharing pass ([`share_catalogs`]).
    share_marks: Vec<Option<ShareMark>>,
    /// Each agent's last persisted snapshot (only kept when the scenario restarts agents).
    persisted: Vec<Option<Catalog>>,
    next_persist_ms: u64,
    /// The membership fault menu's state (`shoal/fault_menu.rs`).
    menu: fault_menu::MenuState,
    /// The regional model (`[shoal.regions]`), if the scenario has one.
    regions: Option<Box<regions::Regions>>,
}

/// How often the traffic model runs, ms.
const TRAFFIC_TICK_MS: u64 = 100;
/// How often convergence is sampled after `settle_ms`, ms.
const SAMPLE_MS: u64 = 1_000;
/// How often an agent persists its catalog, ms (shoal-agent's `persist.interval_ms` default).
const PERSIST_MS: u64 = 10_000;
/// How often agents of a region are made to share equal catalog maps, ms.
const SHARE_MS: u64 = 1_000;

/// What a sharing pass saw of one agent's catalog and its region's reference catalog: the
/// reference agent, then each catalog's index (bumped by every stored or removed record), entry
/// count (changed by garbage collection, which bumps no index) and owner count (an owner's
/// empty health index appears when a head is first observed, which bumps no index either).
/// Each side also carries its agent's boot epoch: a restarted agent holds a new catalog.
type ShareMark = (u32, CatalogMark, CatalogMark);

/// One side of a [`ShareMark`]: boot epoch, index, entry count, owner count.
type CatalogMark = [usize; 4];

fn catalog_mark(epoch: u32, c: &Catalog) -> CatalogMark {
    [epoch as usize, c.index() as usize, c.len(), c.owner_count()]
}

/// Memory only: every live agent of each region swaps its catalog maps that equal the first
/// live agent's for shared copies ([`Catalog::share_equal_maps`]). Contents never change, so
/// nothing observable does; without it a rollout leaves every agent with a private copy of
/// its region's catalog (~1,667 x 33,000 entries). Returns how many maps were swapped.
///
/// An agent is skipped when neither its catalog nor the reference's changed since its last pass
/// (same [`ShareMark`]): what was equal then is shared already and what differed still does.
/// The walk over 2,000 services per agent per second was ~14 % of a steady-state reference run
/// (`reference/crash`, 5,001 agents). A node key learnt from a stale record changes no mark
/// and is shared at the agent's next change.
fn share_catalogs(
    world: &mut World<ShoalNode>,
    regions: u16,
    marks: &mut [Option<ShareMark>],
) -> u64 {
    let mut swapped = 0;
    for r in 0..regions {
        let nodes: Vec<u32> = world.topology().region_nodes(r).collect();
        let Some((first, reference)) = nodes
            .iter()
            .find_map(|&i| world.node(i).map(|n| (i, n.mesh.catalog().clone())))
        else {
            continue;
        };
        let reference_mark = catalog_mark(world.epoch(first), &reference);
        let epochs: Vec<u32> = (0..world.len() as u32).map(|i| world.epoch(i)).collect();
        let seen: &[Option<ShareMark>] = marks;
        // Each agent compares its own maps with the reference: independent, so in parallel.
        let passes = world.par_map_nodes(&nodes, |i, n| {
            let mark = (
                first,
                catalog_mark(epochs[i as usize], n.mesh.catalog()),
                reference_mark,
            );
            (seen[i as usize] != Some(mark))
                .then(|| (mark, n.mesh.share_catalog_maps(&reference) as u64))
        });
        for (&i, pass) in nodes.iter().zip(passes) {
            if let Some(Some((mark, n))) = pass {
                swapped += n;
                marks[i as usize] = Some(mark);
            }
        }
    }
    swapped
}

impl ShoalHarness {
    /// Builds the harness for `scenario` (which must have a `[shoal]` section).
    pub fn new(scenario: &Scenario, tree: &crate::rng::RngTree) -> anyhow::Result<Self> {
        let spec = scenario
            .shoal
            .clone()
            .ok_or_else(|| anyhow::anyhow!("scenario has no [shoal] section"))?;
        let topo = scenario.build_topology()?;
        let region_names: Vec<Region> = topo
            .region_names()
            .iter()
            .map(|r| Region::new(r.clone()))
            .collect::<Result<_, _>>()?;
        let zone_names: Vec<Zone> = topo
            .zone_names()
            .iter()
            .map(|(r, z)| Zone::new(format!("{}-{z}", topo.region_names()[*r as usize])))
            .collect::<Result<_, _>>()?;
        let mut keyring = Keyring::new();
        let authorities: Vec<RegionAuthority> = region_names
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut seed = [0xA0u8; 32];
                seed[..8].copy_from_slice(&(i as u64).to_le_bytes());
                let key = SigningKey::from_seed(seed);
                keyring.trust_authority(r.clone(), key.verifying_key());
                RegionAuthority {
                    key,
                    state: AuthorityState::new(r.clone()),
                    log_index: 0,
                }
            })
            .collect();
        let node_keys: Vec<SigningKey> = (0..topo.len() as u64)
            .map(|i| {
                let mut seed = [0x5Au8; 32];
                seed[..8].copy_from_slice(&i.to_le_bytes());
                // Not trusted anywhere: the authority binds each into its node's records.
                SigningKey::from_seed(seed)
            })
            .collect();
        let mesh_config = (0..region_names.len() as u16)
            .map(|r| {
                let n = topo.region_nodes(r).len();
                let mut c = MeshConfig::for_cluster_size(n);
                if let Some(ae) = spec.anti_entropy_ms {
                    c.anti_entropy_interval_ms = ae;
                }
                if let Some(s) = spec.suspicion_ms {
                    c.membership.suspect_to_down_after_ms = s;
                }
                if let Some(r) = spec.remove_down_ms {
                    c.membership.remove_down_after_ms = r;
                }
                if let Some(v) = spec.reconnect_per_tick {
                    c.membership.reconnect_per_tick = v;
                }
                if let Some(v) = spec.probe_health {
                    c.membership.probe_health = v;
                }
                if let Some(v) = spec.drop_refuted_downs {
                    c.membership.drop_refuted_downs = v;
                }
                c
            })
            .collect();
        let observer = SharedObserver::new(Observer {
            nodes: topo.len(),
            boots: vec![None; topo.len()],
            ..Observer::default()
        });
        let mut h = Self {
            picks_per_agent_per_s: scenario
                .traffic
                .as_ref()
                .map_or(0.0, |t| t.picks_per_agent_per_s),
            spec,
            mesh_config,
            keys: SharedKeys(Arc::new(SimKeys::new(keyring))),
            node_keys,
            authorities,
            region_names,
            zone_names,
            observer,
            instances: Vec::new(),
            by_key: HashMap::new(),
            services: Vec::new(),
            service_instances: BTreeMap::new(),
            initial: Vec::new(),
            actions: BTreeMap::new(),
            action_seq: 0,
            rng: tree.child(Purpose::Workload, 0),
            traffic_rng: tree.child(Purpose::Traffic, 0),
            pick_credit: 0.0,
            next_traffic_ms: TRAFFIC_TICK_MS,
            next_sample_ms: 0,
            converged_at: BTreeMap::new(),
            picks: 0,
            no_backend: 0,
            late_withdrawn_ms: Vec::new(),
            late_dead_ms: Vec::new(),
            last_bad_pick: HashMap::new(),
            replaced: 0,
            refused_writes: 0,
            authority_refusals: 0,
            first_boot_ids: Vec::new(),
            next_share_ms: SHARE_MS,
            maps_shared: 0,
            share_marks: vec![None; topo.len()],
            persisted: if scenario.faults.iter().any(|f| f.action.restarts()) {
                vec![None; topo.len()]
            } else {
                Vec::new()
            },
            next_persist_ms: PERSIST_MS,
            menu: fault_menu::MenuState::default(),
            regions: None,
        };
        h.next_sample_ms = h.spec.settle_ms;
        h.populate(scenario, &topo);
        h.schedule_workload(scenario);
        if let Some(r) = h.spec.regions.clone() {
            h.setup_regions(&r, &topo, tree)?;
        }
        Ok(h)
    }

    /// Registers the initial services as READY and builds each region's initial catalog.
    fn populate(&mut self, scenario: &Scenario, topo: &crate::topology::Topology) {
        let regions = self.region_names.len() as u16;
        let mut catalogs: Vec<Catalog> = (0..regions).map(|_| Catalog::new()).collect();
        let Some(services) = scenario.workload.as_ref().and_then(|w| w.services.as_ref()) else {
            self.initial = catalogs;
            return;
        };
        // Every key shares one namespace and one port-name string: ids compare equal strings
        // by pointer first, so a catalog lookup compares only service names (the same keys
        // as `format!("prod/svc-{s}/http").parse()`, built without a copy of each part).
        let namespace = Name::new("prod").expect("valid name");
        let port_name = Name::new("http").expect("valid name");
        for s in 0..services.count {
            let key = ServiceKey {
                namespace: namespace.clone(),
                service: Name::new(format!("svc-{s}")).expect("valid name"),
                port_name: port_name.clone(),
            };
            let region = (s % u32::from(regions)) as u16;
            let n = draw_count(&services.instances, &mut self.rng);
            self.services.push(key.clone());
            for i in 0..n {
                let nodes = topo.region_nodes(region);
                let owner =
                    nodes.start + (self.rng.next_u64() % u64::from(nodes.end - nodes.start)) as u32;
                let id = InstanceId::new(format!("svc-{s}-{i}")).expect("valid id");
                let idx = self.add_instance(key.clone(), id, owner, region, topo);
                for (to, reason) in [
                    (LifecycleState::Starting, TransitionReason::Registered),
                    (LifecycleState::Ready, TransitionReason::ReadinessPassed),
                ] {
                    let rec = self.commit(idx, to, reason, 0).expect("initial admission");
                    let merged =
                        catalogs[region as usize].apply_lifecycle(Arc::new(rec), &self.keys);
                    assert_eq!(
                        merged,
                        shoal_catalog::MergeOutcome::Applied,
                        "initial admission merges"
                    );
                }
            }
        }
        self.initial = catalogs;
    }

    fn add_instance(
        &mut self,
        key: ServiceKey,
        id: InstanceId,
        owner: u32,
        region: u16,
        topo: &crate::topology::Topology,
    ) -> usize {
        let zone = self.zone_names[topo.node(owner).zone as usize].clone();
        let n = self.instances.len() as u32;
        let spec = EndpointSpec {
            address: SocketAddr::from(([10, (n >> 16) as u8, (n >> 8) as u8, n as u8], 8080)),
            zone,
            version: Version::new("1.0.0").expect("valid"),
            weight: 100,
            labels: Labels::new(vec![(LabelDimension::Protocol, "http2".into())]).expect("valid"),
        };
        let idx = self.instances.len();
        self.instances.push(Instance {
            key: key.clone(),
            id: id.clone(),
            // Assigned by the authority at registration (its log index).
            generation: Generation(0),
            owner,
            region,
            spec,
            state: LifecycleState::Starting,
            process_alive: true,
            bad_since: None,
            reported_failing: false,
        });
        self.by_key.insert((key.clone(), id), idx);
        self.service_instances.entry(key).or_default().push(idx);
        idx
    }
}

fn node_id(i: u32) -> NodeId {
    NodeId::new(format!("n{i}")).expect("valid node id")
}

impl ShoalHarness {
    /// Three random seed addresses of `region` (not `me`), as an agent's configuration lists.
    fn seed_addrs(
        &mut self,
        topo: &crate::topology::Topology,
        region: u16,
        me: u32,
    ) -> Vec<SocketAddr> {
        let nodes = topo.region_nodes(region);
        (0..3)
            .map(|_| {
                nodes.start + (self.rng.next_u64() % u64::from(nodes.end - nodes.start)) as u32
            })
            .filter(|&i| i != me)
            .map(|i| topo.node(i).addr)
            .collect()
    }
}

impl Harness for ShoalHarness {
    type Node = ShoalNode;

    fn maps_shared(&self) -> Option<u64> {
        Some(self.maps_shared)
    }

    fn make_node(&mut self, ctx: &NodeCtx) -> ShoalNode {
        let topo = &ctx.topology;
        let region = topo.node(ctx.index).region;
        let boot = Generation(u64::from(ctx.epoch) + 1);
        let identity = MemberId {
            node: node_id(ctx.index),
            addr: ctx.addr,
            boot,
        };
        let mut mesh = Mesh::new(
            identity,
            self.region_names[region as usize].clone(),
            self.zone_names[ctx.zone as usize].clone(),
            self.node_keys[ctx.index as usize].clone(),
            self.mesh_config[region as usize].clone(),
            self.keys.clone(),
            ctx.seed,
        );
        let now = ctx.now_ms;
        if ctx.epoch == 0 {
            // First boot: the region is already formed (as after a long steady state). The
            // copy is O(1) and shares the tree until this agent changes an entry.
            mesh.restore(
                now,
                Restore::Catalog(Box::new(self.initial[region as usize].clone())),
            );
            if self.first_boot_ids.is_empty() {
                // Built once and shared (ids are Arc-backed) by every node's membership.
                self.first_boot_ids = (0..topo.len() as u32)
                    .map(|i| MemberId {
                        node: node_id(i),
                        addr: topo.node(i).addr,
                        boot: Generation(1),
                    })
                    .collect();
            }
            if self.spec.join_on_first_boot {
                let seeds = self.seed_addrs(topo, region, ctx.index);
                mesh.join(now, &seeds);
            } else {
                let members: Vec<MemberId> = topo
                    .region_nodes(region)
                    .filter(|&i| i != ctx.index)
                    .map(|i| self.first_boot_ids[i as usize].clone())
                    .collect();
                mesh.bootstrap(now, members);
            }
        } else {
            // Restart: the agent loads its persisted snapshot (as shoal-agent does at boot),
            // the one its previous process wrote at the last persist tick (every PERSIST_MS,
            // up to that long before the crash); anti-entropy must bring everything since.
            // Then it auto-joins through three seeds of its region.
            self.try_torn_snapshot(ctx.index);
            let persisted = self
                .persisted
                .get_mut(ctx.index as usize)
                .and_then(Option::take);
            let catalog = persisted.unwrap_or_else(|| self.initial[region as usize].clone());
            mesh.restore(now, Restore::Catalog(Box::new(catalog)));
            let seeds = self.seed_addrs(topo, region, ctx.index);
            mesh.join(now, &seeds);
            self.regions_on_restart(ctx.index);
        }
        self.observer.borrow_mut().boots[ctx.index as usize] = Some(boot);
        let mut node = ShoalNode {
            index: ctx.index,
            mesh,
            observer: self.observer.clone(),
            notes: Vec::new(),
        };
        node.tap(now);
        node
    }

    fn next_wakeup_ms(&self) -> Option<u64> {
        let action = self.actions.keys().next().map(|(t, _)| *t);
        let traffic = (self.picks_per_agent_per_s > 0.0).then_some(self.next_traffic_ms);
        let sample =
            (self.converged_at.len() < self.region_names.len()).then_some(self.next_sample_ms);
        let regions = self.regions.as_ref().map(|r| r.next_wakeup_ms());
        [action, traffic, sample, regions]
            .into_iter()
            .flatten()
            .min()
    }

    fn wake(&mut self, world: &mut World<ShoalNode>) {
        let now = world.now_ms();
        while let Some(entry) = self.actions.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let action = entry.remove();
            self.run_action(world, now, action);
        }
        if self.picks_per_agent_per_s > 0.0 && self.next_traffic_ms <= now {
            self.traffic(world, now);
            self.next_traffic_ms = now + TRAFFIC_TICK_MS;
        }
        if !self.persisted.is_empty() && self.next_persist_ms <= now {
            for (i, slot) in self.persisted.iter_mut().enumerate() {
                if let Some(n) = world.node(i as u32) {
                    *slot = Some(n.mesh.catalog().clone());
                }
            }
            self.next_persist_ms = now + PERSIST_MS;
        }
        if self.next_share_ms <= now {
            self.maps_shared +=
                share_catalogs(world, self.region_names.len() as u16, &mut self.share_marks);
            self.next_share_ms = now + SHARE_MS;
        }
        if now >= self.spec.settle_ms && self.next_sample_ms <= now {
            self.sample_convergence(world, now);
            self.next_sample_ms = now + SAMPLE_MS;
        }
        if self.regions.is_some() {
            self.wake_regions(world);
        }
    }

    fn on_fault(&mut self, world: &mut World<ShoalNode>, fault: &TimedFault, targets: &[u32]) {
        let now = fault.at_ms;
        match &fault.action {
            FaultAction::Crash(_) => {
                for &t in targets {
                    self.on_node_crash(world, now, t);
                }
            }
            FaultAction::Restart(_) | FaultAction::RestartAtNewAddress(_) => {
                // make_node already recorded the new boot; the old identity's death is timed,
                // unless it was crashed before: crash + restart is one death, timed from the
                // crash.
                for &t in targets {
                    let region = world.topology().node(t).region;
                    let mut obs = self.observer.borrow_mut();
                    let boot = Generation(u64::from(world.epoch(t)));
                    if obs.deaths.get(&t).is_some_and(|d| d.boot == boot) {
                        continue;
                    }
                    let death = Death {
                        at_ms: now,
                        boot,
                        region,
                        seen_ms: vec![u64::MAX; obs.nodes],
                    };
                    if let Some(old) = obs.deaths.insert(t, death) {
                        obs.finished_deaths.push(old);
                    }
                }
            }
            FaultAction::Cut { .. }
            | FaultAction::CutOneWay { .. }
            | FaultAction::DropLink { .. }
            | FaultAction::Isolate(_)
            | FaultAction::IsolateExcept { .. }
            | FaultAction::Stall { .. } => {
                let mut obs = self.observer.borrow_mut();
                obs.excused.extend(targets.iter().copied());
                if matches!(fault.action, FaultAction::Stall { .. }) {
                    obs.stalled.extend(targets.iter().copied());
                }
            }
            FaultAction::Heal => {}
            FaultAction::Recover(_) | FaultAction::Unstall(_) => {}
            FaultAction::Skew { .. } | FaultAction::SetNetwork { .. } => {}
            // Applied (and recorded) by `node_fault`; a path MTU is not a cut.
            FaultAction::DuplicateId { .. }
            | FaultAction::InjectUpdate { .. }
            | FaultAction::CrashTornSnapshot(_)
            | FaultAction::LinkMaxDatagram { .. } => {}
        }
        self.regions_on_fault(world, now);
        if let FaultAction::Restart(_) | FaultAction::RestartAtNewAddress(_) = fault.action {
            for &t in targets {
                self.mark_unaware(world, t);
            }
        }
    }

    fn finish(
        &mut self,
        world: &World<ShoalNode>,
        report: &mut Report,
        samples: &mut BTreeMap<String, Vec<u64>>,
    ) {
        self.report(world, report, samples);
        self.report_regions(world, report, samples);
        self.menu_report(report);
    }

    fn node_fault(&mut self, world: &mut World<ShoalNode>, fault: &crate::runner::NodeFault) {
        self.apply_node_fault(world, fault);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::RngTree;
    use crate::scenario::Tier;

    #[test]
    fn tiered_draws_stay_in_their_tiers_with_their_shares() {
        let d = CountDist::Tiered {
            tiers: vec![
                Tier {
                    pct: 1.0,
                    min: 1000,
                    max: 1500,
                },
                Tier {
                    pct: 99.0,
                    min: 10,
                    max: 66,
                },
            ],
        };
        let mut rng = RngTree::new(1).child(Purpose::Workload, 0);
        let draws: Vec<u32> = (0..100_000).map(|_| draw_count(&d, &mut rng)).collect();
        let big = draws.iter().filter(|&&n| n >= 1000).count();
        assert!(
            draws
                .iter()
                .all(|&n| (10..=66).contains(&n) || (1000..=1500).contains(&n)),
            "every draw falls in a tier"
        );
        assert!(
            (800..=1200).contains(&big),
            "{big} of 100,000 in the 1% tier"
        );
        let mean = draws.iter().map(|&n| f64::from(n)).sum::<f64>() / draws.len() as f64;
        assert!((mean - d.mean()).abs() < 2.0, "mean {mean} vs {}", d.mean());
    }
}
