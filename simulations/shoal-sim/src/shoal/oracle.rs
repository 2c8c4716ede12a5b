//! The oracle: turns what the observer collected into the report (distributions, counters,
//! checks), and judges convergence (heads, membership views, routable sets). Split out of
//! `shoal.rs` (issue 15) along that concept; the code is moved as it was.

use super::*;
use shoal_mesh::hash::{fnv1a, FNV_OFFSET};

impl ShoalHarness {
    /// Fills `report` at the end of a run (the body of `Harness::finish`).
    pub(super) fn report(
        &mut self,
        world: &World<ShoalNode>,
        report: &mut Report,
        samples: &mut BTreeMap<String, Vec<u64>>,
    ) {
        let obs = self.observer.borrow();
        let alive: Vec<bool> = (0..world.len() as u32).map(|i| world.is_alive(i)).collect();
        let topo = world.topology();
        // Drain propagation.
        let mut per_agent = Vec::new();
        let mut per_stalled_agent = Vec::new();
        let mut per_cut_off_agent = Vec::new();
        let mut last_agent = Vec::new();
        let mut missing_drains = 0u64;
        let mut missing_cut_off = 0u64;
        for t in obs.drains.values().chain(obs.finished_drains.iter()) {
            if std::env::var_os("SHOAL_SIM_DEBUG").is_some() {
                let mut v: Vec<(u64, u32)> = t
                    .seen_ms
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| **s != u64::MAX)
                    .map(|(i, s)| (s.saturating_sub(t.committed_ms), i as u32))
                    .collect();
                let died: Vec<Option<u64>> = v[v.len().saturating_sub(8)..]
                    .iter()
                    .map(|(_, i)| obs.deaths.get(i).map(|d| d.at_ms))
                    .collect();
                eprintln!("  death of the slowest: {died:?}");
                v.sort();
                eprintln!(
                    "drain commit {} marker {:?}: {:?}",
                    t.committed_ms,
                    t.marker,
                    &v[v.len().saturating_sub(8)..]
                );
            }
            let mut worst = 0;
            for i in topo.region_nodes(t.region) {
                if !alive[i as usize] {
                    continue;
                }
                let seen = t.seen_ms[i as usize];
                if seen == u64::MAX && t.cut_off.contains(&i) {
                    // Cut off at commit: after the heal it may get only a later record (or
                    // none, once the tombstone was collected); the convergence check judges
                    // what it ends up routing.
                    missing_cut_off += 1;
                    continue;
                }
                if seen == u64::MAX {
                    missing_drains += 1;
                    continue;
                }
                let d = seen.saturating_sub(t.committed_ms);
                if obs.stalled.contains(&i) {
                    per_stalled_agent.push(d);
                    continue;
                }
                if t.cut_off.contains(&i) {
                    per_cut_off_agent.push(d);
                    continue;
                }
                per_agent.push(d);
                worst = worst.max(d);
            }
            last_agent.push(worst);
        }
        // Detection.
        let mut det_agent = Vec::new();
        let mut det_last = Vec::new();
        let mut missing_detections = 0u64;
        let mut unaware = 0u64;
        for d in obs.deaths.values().chain(obs.finished_deaths.iter()) {
            let mut worst = 0;
            for i in topo.region_nodes(d.region) {
                // An agent restarted since (or at) this death runs as a fresh member that never
                // knew the dead identity, unless its previous incarnation already saw it down.
                let reborn = obs.deaths.get(&i).is_some_and(|o| o.at_ms >= d.at_ms);
                let seen = d.seen_ms[i as usize];
                if alive[i as usize] && (seen == UNAWARE || (seen == u64::MAX && reborn)) {
                    unaware += 1;
                    continue;
                }
                if !alive[i as usize] || d.seen_ms[i as usize] == u64::MAX {
                    if alive[i as usize] && obs.boots[i as usize].is_some() {
                        missing_detections += u64::from(d.seen_ms[i as usize] == u64::MAX);
                    }
                    continue;
                }
                let x = d.seen_ms[i as usize].saturating_sub(d.at_ms);
                det_agent.push(x);
                worst = worst.max(x);
            }
            det_last.push(worst);
        }
        // Process failures.
        let mut proc_agent = Vec::new();
        for p in obs
            .process_deaths
            .values()
            .chain(obs.finished_process.iter())
        {
            for i in topo.region_nodes(p.region) {
                let seen = p.seen_ms[i as usize];
                if alive[i as usize] && seen != u64::MAX {
                    proc_agent.push(seen.saturating_sub(p.at_ms));
                }
            }
        }
        let drain_max = per_agent.iter().copied().max().unwrap_or(0);
        let proc_max = proc_agent.iter().copied().max().unwrap_or(0);
        let det_max = det_agent.iter().copied().max().unwrap_or(0);
        samples.insert("drain_propagation_ms".into(), per_agent.clone());
        samples.insert("detection_ms".into(), det_agent.clone());
        let drain = dist_of(&mut per_agent);
        let detection = dist_of(&mut det_agent);
        report
            .distributions
            .insert("drain_propagation_ms".into(), drain.clone());
        report.distributions.insert(
            "drain_propagation_last_agent_ms".into(),
            dist_of(&mut last_agent),
        );
        if !per_cut_off_agent.is_empty() {
            report.distributions.insert(
                "drain_propagation_cut_off_agents_ms".into(),
                dist_of(&mut per_cut_off_agent),
            );
        }
        if !per_stalled_agent.is_empty() {
            report.distributions.insert(
                "drain_propagation_stalled_agents_ms".into(),
                dist_of(&mut per_stalled_agent),
            );
        }
        report
            .distributions
            .insert("detection_ms".into(), detection.clone());
        report
            .distributions
            .insert("detection_last_agent_ms".into(), dist_of(&mut det_last));
        report
            .distributions
            .insert("process_failure_ms".into(), dist_of(&mut proc_agent));
        let late_w_max = self.late_withdrawn_ms.iter().copied().max().unwrap_or(0);
        let late_d_max = self.late_dead_ms.iter().copied().max().unwrap_or(0);
        report.distributions.insert(
            "late_pick_withdrawn_ms".into(),
            dist_of(&mut self.late_withdrawn_ms.clone()),
        );
        report.distributions.insert(
            "late_pick_dead_ms".into(),
            dist_of(&mut self.late_dead_ms.clone()),
        );
        // Convergence.
        let settle = self.spec.settle_ms;
        let conv: Vec<u64> = self
            .converged_at
            .values()
            .map(|t| t.saturating_sub(settle))
            .collect();
        report.distributions.insert(
            "convergence_after_settle_ms".into(),
            dist_of(&mut conv.clone()),
        );
        let (agree, agree_detail) = self.routable_sets_agree(world);
        let (mut older, mut tombstones) = (Vec::new(), Vec::new());
        for (_, n) in world.nodes() {
            let Some(n) = n else { continue };
            older.push(Self::older_generation_members(world, n));
            tombstones.push(
                n.mesh()
                    .catalog()
                    .entries()
                    .filter(|(_, _, e)| e.lifecycle().record.state == LifecycleState::Expired)
                    .count() as u64,
            );
        }
        report.distributions.insert(
            "members_of_older_generation_per_agent".into(),
            dist_of(&mut older),
        );
        report
            .distributions
            .insert("tombstones_per_agent".into(), dist_of(&mut tombstones));
        if std::env::var_os("SHOAL_SIM_DEBUG").is_some() {
            for (i, n) in world.nodes() {
                let Some(n) = n else { continue };
                for (x, m) in world.nodes() {
                    let Some(m) = m else { continue };
                    let id = m.mesh().membership().identity();
                    if let Some((d, t)) = n.mesh().membership().down_identity(&id.node) {
                        eprintln!(
                            "n{i} holds n{x} (now boot {}) down as boot {} since {t}",
                            id.boot.0, d.boot.0
                        );
                    }
                }
            }
        }
        // Counters.
        let c = &mut report.counters;
        c.insert("picks".into(), self.picks);
        c.insert("picks_no_backend".into(), self.no_backend);
        c.insert(
            "picks_of_withdrawn".into(),
            self.late_withdrawn_ms.len() as u64,
        );
        c.insert("picks_of_dead".into(), self.late_dead_ms.len() as u64);
        c.insert("false_downs".into(), obs.false_downs);
        c.insert(
            "false_down_nodes".into(),
            obs.false_down_targets.len() as u64,
        );
        c.insert("downs_of_cut_or_stalled".into(), obs.excused_downs);
        c.insert(
            "drains_tracked".into(),
            (obs.drains.len() + obs.finished_drains.len()) as u64,
        );
        c.insert("drain_applications_missing".into(), missing_drains);
        if missing_cut_off > 0 {
            c.insert("drain_applications_missing_cut_off".into(), missing_cut_off);
        }
        c.insert(
            "deaths_tracked".into(),
            (obs.deaths.len() + obs.finished_deaths.len()) as u64,
        );
        c.insert("detections_missing".into(), missing_detections);
        if unaware > 0 {
            // Only when non-zero, so reports of scenarios without such deaths stay as they were.
            c.insert("detection_observers_unaware".into(), unaware);
        }
        c.insert("authority_writes_refused".into(), self.refused_writes);
        c.insert("authority_refusals".into(), self.authority_refusals);
        c.insert("instances".into(), self.instances.len() as u64);
        let mut totals = BTreeMap::<&str, u64>::new();
        let mut unverified = 0;
        for (_, n) in world.nodes() {
            let Some(n) = n else { continue };
            let m = n.mesh();
            let cc = m.catalog().counters();
            unverified += cc.unverified;
            for (k, v) in [
                ("records_applied", cc.applied),
                ("records_stale", cc.stale),
                ("records_duplicate", cc.duplicate),
                ("records_conflict", cc.conflict),
                ("records_bad_signature", cc.bad_signature),
                ("records_unadmitted", cc.unadmitted),
                ("gaps_detected", m.counters().gaps_detected),
                ("anti_entropy_rounds", m.counters().anti_entropy_rounds),
                ("deltas_sent", m.counters().deltas_sent),
                ("grafts_sent", m.counters().grafts_sent),
                ("prunes_sent", m.counters().prunes_sent),
                ("snapshots_sent", m.counters().snapshots_sent),
                ("snapshots_installed", m.counters().snapshots_installed),
                ("outbox_overflow", m.counters().outbox_overflow),
                ("transmit_overflow", m.counters().transmit_overflow),
                ("tombstones_collected", m.counters().tombstones_collected),
                (
                    "membership_rejected_decode",
                    m.membership().counters().rejected_decode,
                ),
                ("membership_rejoins", m.membership().counters().rejoins),
                (
                    "membership_downs_withheld",
                    m.membership().counters().downs_withheld,
                ),
                (
                    "membership_renewals_withheld",
                    m.membership().counters().renewals_withheld,
                ),
                (
                    "membership_downs_dropped",
                    m.membership().counters().downs_dropped,
                ),
                (
                    "membership_reconnect_announces",
                    m.membership().counters().reconnect_announces,
                ),
                (
                    "members_learned_by_push_pull",
                    m.membership().counters().members_learned,
                ),
                ("push_pull_lists_sent", m.counters().push_pull_lists_sent),
                (
                    "swim_updates_deduplicated",
                    m.membership().counters().updates_deduplicated,
                ),
                ("eager_links", m.peer_sets().0 as u64),
                ("lazy_links", m.peer_sets().1 as u64),
                ("members_known", m.membership().num_members() as u64),
            ] {
                *totals.entry(k).or_default() += v;
            }
        }
        for (k, v) in totals {
            c.insert(k.into(), v);
        }
        if unverified > 0 {
            // Health no verified lifecycle record bound a key for (ADR 0006); every simulated
            // agent binds its key before registering, so only when non-zero.
            c.insert("records_unverified".into(), unverified);
        }
        for (i, (from, to, at)) in obs.false_down_samples.iter().enumerate() {
            c.insert(format!("false_down_{i:02}_n{from}_saw_n{to}_at_ms"), *at);
        }
        // Checks.
        let e = &self.spec.expect;
        if let Some(max) = e.drain_p99_ms {
            report.checks.insert(
                "drain_propagation_p99".into(),
                p99_check(&drain, max, missing_drains),
            );
        }
        if let Some(max) = e.detection_p99_ms {
            report.checks.insert(
                "detection_p99".into(),
                p99_check(&detection, max, missing_detections),
            );
        }
        if let Some(max) = e.max_false_downs {
            report.checks.insert(
                "false_downs".into(),
                Check {
                    ok: obs.false_downs <= max,
                    detail: format!("{} false downs (limit {max})", obs.false_downs),
                },
            );
        }
        if e.converge {
            let all = self.converged_at.len() == self.region_names.len();
            let within = e
                .converge_within_ms
                .is_none_or(|w| conv.iter().all(|&c| c <= w));
            report.checks.insert(
                "convergence".into(),
                Check {
                    ok: all && within && agree,
                    detail: format!(
                        "{} of {} regions converged after settle ({:?} ms); {agree_detail}",
                        self.converged_at.len(),
                        self.region_names.len(),
                        conv
                    ),
                },
            );
        }
        if e.no_late_picks {
            report.checks.insert("no_late_picks".into(), Check {
                ok: late_w_max <= drain_max && late_d_max <= det_max.max(proc_max),
                detail: format!(
                    "latest pick of a withdrawn endpoint {late_w_max} ms after commit (propagation max {drain_max}); of a dead one {late_d_max} ms after death (detection max {det_max}, process failure max {proc_max})"
                ),
            });
        }
    }

    /// Members `n` holds active under an older boot generation than the one their node runs
    /// now (a renewal or restart `n` has not heard of), at the end of the run.
    pub(super) fn older_generation_members(world: &World<ShoalNode>, n: &ShoalNode) -> u64 {
        n.mesh()
            .membership()
            .members()
            .filter(|m| {
                node_index(&m.node)
                    .and_then(|i| world.node(i))
                    .is_some_and(|o| o.mesh().membership().identity().boot > m.boot)
            })
            .count() as u64
    }

    /// A fingerprint of one agent's state: heads and membership view (its own node id as
    /// its identity says: a `duplicate_id` process claims another node's).
    pub(super) fn fingerprint(n: &ShoalNode, _slot: u32) -> u64 {
        let mut h = FNV_OFFSET;
        let heads = n.mesh().catalog().heads();
        for r in &heads.regions {
            h = fnv1a(r.region.as_str().as_bytes(), h);
            h = fnv1a(&r.contiguous.0.to_le_bytes(), h);
            h = fnv1a(&r.max_seen.0.to_le_bytes(), h);
            h = fnv1a(&r.pending_hash.to_le_bytes(), h);
        }
        for o in &heads.owners {
            h = fnv1a(o.owner.as_str().as_bytes(), h);
            h = fnv1a(&o.boot.0.to_le_bytes(), h);
            h = fnv1a(&o.contiguous.0.to_le_bytes(), h);
            h = fnv1a(&o.pending_hash.to_le_bytes(), h);
        }
        let mut members: Vec<&NodeId> = n.mesh().membership().members().map(|m| &m.node).collect();
        let me = n.mesh().membership().identity().node.clone();
        members.push(&me);
        members.sort();
        for m in members {
            h = fnv1a(m.as_str().as_bytes(), h);
        }
        h
    }

    pub(super) fn sample_convergence(&mut self, world: &World<ShoalNode>, now_ms: u64) {
        for r in 0..self.region_names.len() as u16 {
            if self.converged_at.contains_key(&r) {
                continue;
            }
            let mut prints = world
                .topology()
                .region_nodes(r)
                .filter_map(|i| world.node(i).map(|n| Self::fingerprint(n, i)));
            let Some(first) = prints.next() else { continue };
            if prints.all(|p| p == first) {
                self.converged_at.insert(r, now_ms);
            }
        }
    }

    /// At the end: do all live agents of each region hold the same routable set per service?
    /// Compared by digest (one pass per agent); the first disagreement is described in full.
    pub(super) fn routable_sets_agree(&self, world: &World<ShoalNode>) -> (bool, String) {
        for r in 0..self.region_names.len() as u16 {
            let mut reference: Option<(u32, u64)> = None;
            // Agents whose catalogs share one entry tree and whose down sets are equal have
            // the same routable sets: compute each such digest once.
            let mut seen: Vec<(u32, Vec<NodeId>, u64)> = Vec::new();
            for i in world.topology().region_nodes(r) {
                let Some(n) = world.node(i) else { continue };
                let down: Vec<NodeId> = n.mesh().membership().down_nodes().cloned().collect();
                let cached = seen.iter().find(|(k, d, _)| {
                    *d == down
                        && world.node(*k).is_some_and(|m| {
                            m.mesh().catalog().shares_entries_with(n.mesh().catalog())
                        })
                });
                let digest = match cached {
                    Some((_, _, digest)) => *digest,
                    None => {
                        let digest = routable_digest(n);
                        if seen.len() < 16 {
                            seen.push((i, down, digest));
                        }
                        digest
                    }
                };
                match reference {
                    None => reference = Some((i, digest)),
                    Some((j, d)) if d != digest => {
                        return (false, Self::describe_disagreement(world, j, i));
                    }
                    Some(_) => {}
                }
            }
        }
        (
            true,
            "all live agents of every region hold the same routable sets".into(),
        )
    }

    /// Names the first service on which agents `j` and `i` disagree (with `SHOAL_SIM_DEBUG`,
    /// prints both sets, heads, gaps and the service's entries).
    pub(super) fn describe_disagreement(world: &World<ShoalNode>, j: u32, i: u32) -> String {
        let (a, b) = (
            routable_sets(world.node(j).expect("alive")),
            routable_sets(world.node(i).expect("alive")),
        );
        let Some(k) = a
            .keys()
            .chain(b.keys())
            .find(|k| a.get(*k) != b.get(*k))
            .cloned()
        else {
            return format!("agents n{j} and n{i} disagree (digest collision?)");
        };
        if std::env::var_os("SHOAL_SIM_DEBUG").is_some() {
            eprintln!("n{j}: {:?}\nn{i}: {:?}", a.get(&k), b.get(&k));
            for n in [j, i] {
                let m = world.node(n).expect("alive").mesh();
                eprintln!(
                    "n{n} heads {:?} gaps {:?}",
                    m.catalog().heads().regions,
                    m.catalog().gaps()
                );
                for (_, inst, e) in m.catalog().entries().filter(|(key, _, _)| **key == k) {
                    eprintln!(
                        "  {inst} gen {} rev {} {:?} owner {} down {}",
                        e.lifecycle().record.generation,
                        e.lifecycle().record.revision,
                        e.lifecycle().record.state,
                        e.lifecycle().record.owner,
                        m.membership().is_down(&e.lifecycle().record.owner)
                    );
                }
            }
        }
        format!("agents n{j} and n{i} disagree on {k}")
    }
}

/// Routable (instance, generation) per service held, services with none left out.
pub(super) fn routable_sets(n: &ShoalNode) -> RoutableSets {
    let live = n.mesh().liveness();
    let catalog = n.mesh().catalog();
    catalog
        .service_keys()
        .map(|key| {
            let v: Vec<(InstanceId, Generation)> = catalog
                .routable(key, &live)
                .map(|e| {
                    let rec = &e.lifecycle().record;
                    (rec.instance.clone(), rec.generation)
                })
                .collect();
            (key.clone(), v)
        })
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

/// FNV digest of [`routable_sets`], without building it.
pub(super) fn routable_digest(n: &ShoalNode) -> u64 {
    let live = n.mesh().liveness();
    let catalog = n.mesh().catalog();
    let mut h = FNV_OFFSET;
    for key in catalog.service_keys() {
        let mut any = false;
        for e in catalog.routable(key, &live) {
            if !any {
                h = fnv1a(key.to_string().as_bytes(), h);
                any = true;
            }
            let rec = &e.lifecycle().record;
            h = fnv1a(rec.instance.as_str().as_bytes(), h);
            h = fnv1a(&rec.generation.0.to_le_bytes(), h);
        }
    }
    h
}

/// A p99 bound that also needs samples and no missing observations.
pub(super) fn p99_check(d: &Distribution, max: u64, missing: u64) -> Check {
    Check {
        ok: d.count > 0 && d.p99 <= max && missing == 0,
        detail: format!(
            "p99 {} ms (limit {max}), {} samples, {missing} missing",
            d.p99, d.count
        ),
    }
}

pub(super) fn dist_of(samples: &mut [u64]) -> Distribution {
    Distribution::from_values(samples)
}

pub(super) type RoutableSets = BTreeMap<ServiceKey, Vec<(InstanceId, Generation)>>;
