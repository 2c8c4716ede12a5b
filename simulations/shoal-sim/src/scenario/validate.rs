//! Scenario validation: every cross-field rule (topology, network, faults, workload, outages,
//! traffic), reporting all problems at once as [`ScenarioError::Invalid`], so a bad file is
//! refused before anything runs.

use super::{Scenario, ScenarioError, Target, WorkloadSpec};

impl Scenario {
    /// Checks every cross-field rule; reports all problems at once.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let mut errs = Vec::new();
        if self.duration_ms == 0 {
            errs.push("duration_ms: must be > 0".to_string());
        }
        self.validate_topology(&mut errs);
        self.validate_network(&mut errs);
        let node_count: u64 = self
            .topology
            .regions
            .iter()
            .map(|r| u64::from(r.agents_per_zone) * r.zones.len() as u64)
            .sum();
        for (i, f) in self.faults.iter().enumerate() {
            if let Err(e) = self.check_fault(f, node_count) {
                errs.push(format!("faults[{i}] ({:?}): {e}", f.action));
            }
        }
        if self.toy.ping_interval_ms == 0 {
            errs.push("toy.ping_interval_ms: must be > 0".into());
        }
        if let Some(w) = &self.workload {
            self.validate_workload(w, &mut errs);
        }
        if let Some(sh) = &self.shoal {
            for (i, o) in sh.outages.iter().enumerate() {
                if o.from_ms >= o.to_ms {
                    errs.push(format!("shoal.outages[{i}]: need from_ms < to_ms"));
                }
                self.check_region(
                    o.region.as_deref(),
                    &format!("shoal.outages[{i}]"),
                    &mut errs,
                );
            }
        }
        if let Some(t) = &self.traffic {
            if !(t.picks_per_agent_per_s >= 0.0 && t.picks_per_agent_per_s.is_finite()) {
                errs.push("traffic.picks_per_agent_per_s: must be a finite number >= 0".into());
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ScenarioError::Invalid(errs))
        }
    }

    fn validate_topology(&self, errs: &mut Vec<String>) {
        let regions = &self.topology.regions;
        if regions.is_empty() {
            errs.push("topology.regions: at least one region".into());
        }
        for (i, r) in regions.iter().enumerate() {
            if regions[..i].iter().any(|o| o.name == r.name) {
                errs.push(format!(
                    "topology.regions[{i}]: duplicate region name {:?}",
                    r.name
                ));
            }
            if r.zones.is_empty() {
                errs.push(format!(
                    "topology.regions[{i}] ({}): zones must not be empty",
                    r.name
                ));
            }
            for (j, z) in r.zones.iter().enumerate() {
                if r.zones[..j].contains(z) {
                    errs.push(format!(
                        "topology.regions[{i}] ({}): duplicate zone {z:?}",
                        r.name
                    ));
                }
            }
            if r.agents_per_zone == 0 {
                errs.push(format!(
                    "topology.regions[{i}] ({}): agents_per_zone must be > 0",
                    r.name
                ));
            }
        }
    }

    fn validate_network(&self, errs: &mut Vec<String>) {
        let n = &self.network;
        for (name, l) in [
            ("same_zone", n.same_zone),
            ("same_region", n.same_region),
            ("cross_region", n.cross_region),
        ] {
            if !(l.base_ms >= 0.0
                && l.base_ms.is_finite()
                && l.jitter_ms >= 0.0
                && l.jitter_ms.is_finite())
            {
                errs.push(format!(
                    "network.{name}: base_ms and jitter_ms must be finite and >= 0"
                ));
            }
        }
        for (name, v) in [("loss_pct", n.loss_pct), ("dup_pct", n.dup_pct)] {
            if !(0.0..=100.0).contains(&v) {
                errs.push(format!("network.{name}: must be within 0..=100, got {v}"));
            }
        }
        if n.max_datagram_bytes == 0 || n.max_stream_message_bytes == 0 {
            errs.push("network: size limits must be > 0".into());
        }
    }

    fn check_target(&self, t: &Target, node_count: u64) -> Result<(), String> {
        let ids = match t {
            Target::Ids(ids) => Some(ids),
            Target::Select(s) => {
                let region = match &s.region {
                    Some(r) => Some(
                        self.topology
                            .regions
                            .iter()
                            .find(|x| &x.name == r)
                            .ok_or_else(|| format!("unknown region {r:?}"))?,
                    ),
                    None => None,
                };
                if let Some(z) = &s.zone {
                    let region = region.ok_or_else(|| format!("zone {z:?} needs a region"))?;
                    if !region.zones.contains(z) {
                        return Err(format!("unknown zone {z:?} in region {:?}", region.name));
                    }
                }
                s.ids.as_ref()
            }
        };
        if let Some(bad) = ids.and_then(|ids| ids.iter().find(|&&i| u64::from(i) >= node_count)) {
            return Err(format!("node index {bad} out of range (0..{node_count})"));
        }
        Ok(())
    }

    pub(super) fn need<'a>(
        &self,
        v: &'a Option<Target>,
        field: &str,
        n: u64,
    ) -> Result<&'a Target, String> {
        let t = v.as_ref().ok_or_else(|| format!("missing `{field}`"))?;
        self.check_target(t, n)
            .map_err(|e| format!("`{field}`: {e}"))?;
        Ok(t)
    }

    /// `region`, if set, must name a region of the topology.
    fn check_region(&self, region: Option<&str>, what: &str, errs: &mut Vec<String>) {
        if let Some(r) = region {
            if !self.topology.regions.iter().any(|x| x.name == r) {
                errs.push(format!("{what}: unknown region {r:?}"));
            }
        }
    }

    fn validate_workload(&self, w: &WorkloadSpec, errs: &mut Vec<String>) {
        if let Some(s) = &w.services {
            if s.count == 0 {
                errs.push("workload.services.count: must be > 0".into());
            }
            if let Some(e) = s.instances.check() {
                errs.push(format!("workload.services.instances: {e}"));
            }
        }
        if let Some(r) = &w.rollout {
            if r.replacements == 0 || r.over_ms == 0 {
                errs.push("workload.rollout: replacements and over_ms must be > 0".into());
            }
            self.check_region(r.region.as_deref(), "workload.rollout", errs);
        }
        for (i, d) in w.drains.iter().enumerate() {
            if d.instances == 0 {
                errs.push(format!("workload.drains[{i}]: instances must be > 0"));
            }
            self.check_region(d.region.as_deref(), &format!("workload.drains[{i}]"), errs);
        }
        for (i, c) in w.crashes.iter().enumerate() {
            if c.count == 0 {
                errs.push(format!("workload.crashes[{i}]: count must be > 0"));
            }
            self.check_region(c.region.as_deref(), &format!("workload.crashes[{i}]"), errs);
        }
    }
}
