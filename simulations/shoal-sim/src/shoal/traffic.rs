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
        for _ in 0..rounds {
            for node in 0..world.len() as u32 {
                let Some(n) = world.node(node) else { continue };
                if world.is_stalled(node) {
                    continue;
                }
                self.pick_once(n, node, now_ms, world);
            }
        }
    }

    pub(super) fn pick_once(
        &mut self,
        n: &ShoalNode,
        node: u32,
        now_ms: u64,
        world: &World<ShoalNode>,
    ) {
        let region = world.topology().node(node).region as usize;
        // Services are spread over regions round-robin (service s lives in region s % R);
        // an app picks uniformly among its own region's services.
        let regions = self.region_names.len();
        let in_region = self.services.len().saturating_sub(region).div_ceil(regions);
        if in_region == 0 {
            return;
        }
        let k = (self.traffic_rng.next_u64() % in_region as u64) as usize;
        let key = &self.services[k * regions + region];
        let mesh = n.mesh();
        let liveness = mesh.liveness();
        let r = self.traffic_rng.next_u64();
        let zone = &self.zone_names[world.topology().node(node).zone as usize];
        let picked = view::pick(
            mesh.catalog().routable(key, &liveness),
            mesh.region(),
            zone,
            false,
            r,
        );
        self.picks += 1;
        let Some(entry) = picked else {
            self.no_backend += 1;
            return;
        };
        let rec = &entry.lifecycle().record;
        let Some(&idx) = self.by_key.get(&(rec.key.clone(), rec.instance.clone())) else {
            return;
        };
        let inst = &self.instances[idx];
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
        let _ = liveness.is_down(&rec.owner);
    }
}
