//! The traffic model: every agent's app picks endpoints of its region's services, and each
//! pick of a withdrawn or dead endpoint is timed.

use super::*;

impl ShoalHarness {
    pub(super) fn traffic(&mut self, world: &World<ShoalNode>, now_ms: u64) {
        if self.picks_per_agent_per_s <= 0.0 || self.services.is_empty() {
            return;
        }
        self.pick_credit += self.picks_per_agent_per_s * TRAFFIC_TICK_MS as f64 / 1000.0;
        let rounds = self.pick_credit.floor() as u32;
        self.pick_credit -= f64::from(rounds);
        // The draws are taken in the sequential order first, the picks (reads of each agent's
        // catalog) run on the simulator's threads, and their outcomes are counted in order:
        // the same draws and the same counts as picking one agent after another.
        let mut draws = Vec::new();
        for _ in 0..rounds {
            for node in 0..world.len() as u32 {
                if world.node(node).is_none() || world.is_stalled(node) {
                    continue;
                }
                if let Some(d) = self.draw(world, node) {
                    draws.push(d);
                }
            }
        }
        let ctx = PickCtx {
            services: &self.services,
            zone_names: &self.zone_names,
            by_key: &self.by_key,
        };
        let pick = |d: &Draw| ctx.pick(world, d);
        let picked: Vec<Option<usize>> = match world.pool() {
            Some(pool) => pool.install(|| {
                use rayon::prelude::*;
                draws.par_iter().map(pick).collect()
            }),
            None => draws.iter().map(pick).collect(),
        };
        for p in picked {
            self.count_pick(p, now_ms);
        }
    }

    /// One pick's random draws, or `None` if the agent's region has no service.
    fn draw(&mut self, world: &World<ShoalNode>, node: u32) -> Option<Draw> {
        let region = world.topology().node(node).region as usize;
        // Services are spread over regions round-robin (service s lives in region s % R);
        // an app picks uniformly among its own region's services.
        let regions = self.region_names.len();
        let in_region = self.services.len().saturating_sub(region).div_ceil(regions);
        if in_region == 0 {
            return None;
        }
        let k = (self.traffic_rng.next_u64() % in_region as u64) as usize;
        let r = self.traffic_rng.next_u64();
        Some(Draw {
            node,
            service: k * regions + region,
            r,
        })
    }

    /// Counts one pick's outcome (`PickCtx::pick`; `usize::MAX`: untracked).
    fn count_pick(&mut self, picked: Option<usize>, now_ms: u64) {
        self.picks += 1;
        let Some(idx) = picked else {
            self.no_backend += 1;
            return;
        };
        let Some(inst) = self.instances.get(idx) else {
            return;
        };
        if let Some(since) = inst.bad_since {
            if now_ms >= since {
                let late = now_ms - since;
                if inst.process_alive && inst.state != LifecycleState::Ready {
                    self.late_withdrawn_ms.push(late);
                } else {
                    self.late_dead_ms.push(late);
                }
                let e = self.last_bad_pick.entry(idx).or_insert(0);
                *e = (*e).max(late);
            }
        }
    }
}

/// What a pick reads besides the agent: shared by the threads that pick.
struct PickCtx<'a> {
    services: &'a [ServiceKey],
    zone_names: &'a [Zone],
    by_key: &'a HashMap<(ServiceKey, InstanceId), usize>,
}

impl PickCtx<'_> {
    /// The instance (index into `instances`) an agent's app is handed: `None` is a
    /// no-backend answer, `usize::MAX` an endpoint the workload does not track.
    fn pick(&self, world: &World<ShoalNode>, d: &Draw) -> Option<usize> {
        let n = world.node(d.node).expect("drawn for a running agent");
        let key = &self.services[d.service];
        let mesh = n.mesh();
        let liveness = mesh.liveness();
        let zone = &self.zone_names[world.topology().node(d.node).zone as usize];
        let entry = view::pick(
            mesh.catalog().routable(key, &liveness),
            mesh.region(),
            zone,
            false,
            d.r,
        )?;
        let rec = &entry.lifecycle().record;
        Some(
            self.by_key
                .get(&(rec.key.clone(), rec.instance.clone()))
                .copied()
                .unwrap_or(usize::MAX),
        )
    }
}

/// The random draws of one pick, taken in the sequential order.
pub(super) struct Draw {
    node: u32,
    service: usize,
    r: u64,
}
