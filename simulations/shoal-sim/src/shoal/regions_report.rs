//! The regional part of the oracle: failover reaction, cross-region bytes, picks outside
//! policy, caps and region isolation, as report figures and checks (see [`super::regions`]).

use super::regions::Regions;
use super::*;
use shoal_catalog::remote::summarize;

impl ShoalHarness {
    /// Adds the regional figures and checks to `report` (nothing without `[shoal.regions]`).
    pub(super) fn report_regions(
        &mut self,
        world: &World<ShoalNode>,
        report: &mut Report,
        samples: &mut BTreeMap<String, Vec<u64>>,
    ) {
        let Some(st) = self.regions.take() else {
            return;
        };
        let topo = world.topology();
        let duration_s = (world.now_ms() as f64 / 1000.0).max(1e-3);
        // Failover reaction: last local endpoint withdrawn -> each agent's first failover pick.
        let mut reaction = Vec::new();
        let (mut missing, mut before_last) = (0u64, 0u64);
        let mut no_policy_withdrawn = false;
        for w in st.withdrawals.iter().filter(|w| w.count.is_none()) {
            let svc = &st.services[w.service];
            if svc.allowed.is_none() {
                no_policy_withdrawn = true;
                continue;
            }
            let idxs = &svc.instances[w.region as usize];
            let Some(last) = idxs
                .iter()
                .map(|&i| self.instances[i].bad_since)
                .collect::<Option<Vec<u64>>>()
                .and_then(|v| v.into_iter().max())
            else {
                // Some endpoint was never withdrawn: nothing to time.
                missing += topo.region_nodes(w.region).len() as u64;
                continue;
            };
            for i in topo.region_nodes(w.region) {
                let first = w.first_failover_ms[i as usize];
                if first == u64::MAX {
                    // Only agents alive through the whole run must have failed over.
                    let restarted = world.epoch(i) > 0;
                    if world.is_alive(i) && !restarted {
                        missing += 1;
                    }
                    continue;
                }
                if first < last {
                    before_last += 1;
                }
                reaction.push(first.saturating_sub(last));
            }
        }
        samples.insert("failover_reaction_ms".into(), reaction.clone());
        let reaction = oracle::dist_of(&mut reaction);
        report
            .distributions
            .insert("failover_reaction_ms".into(), reaction.clone());
        // Isolation: summary age at the heal, reconcile time after it.
        let (mut ages, mut reconcile) = (Vec::new(), Vec::new());
        let mut reconcile_missing = 0u64;
        for c in &st.cuts {
            ages.extend(c.age_at_heal_ms);
            let Some(h) = c.healed_ms else { continue };
            for i in topo.region_nodes(c.holder) {
                let t = c.reconciled_ms[i as usize];
                if t == u64::MAX {
                    reconcile_missing += u64::from(world.is_alive(i));
                } else {
                    reconcile.push(t - h);
                }
            }
        }
        if !st.cuts.is_empty() {
            report.distributions.insert(
                "isolated_summary_age_at_heal_ms".into(),
                oracle::dist_of(&mut ages),
            );
            report.distributions.insert(
                "summary_reconcile_after_heal_ms".into(),
                oracle::dist_of(&mut reconcile.clone()),
            );
        }
        let reconcile_d = oracle::dist_of(&mut reconcile);
        // Held summaries at the end against each remote region's own view now.
        let (mismatches, policy_changed) = self.summaries_at_end(world, &st);
        let cr_bytes = st.c.request_bytes + st.c.reply_bytes;
        let c = &mut report.counters;
        c.insert("cross_region_bytes".into(), cr_bytes);
        c.insert("cross_region_request_bytes".into(), st.c.request_bytes);
        c.insert("cross_region_reply_bytes".into(), st.c.reply_bytes);
        c.insert(
            "cross_region_bytes_per_s".into(),
            (cr_bytes as f64 / duration_s).round() as u64,
        );
        c.insert("summary_pulls".into(), st.c.pulls);
        c.insert("summary_pulls_lost_to_cut".into(), st.c.pulls_lost_to_cut);
        c.insert("summaries_built".into(), st.c.summaries_built);
        c.insert("failover_feeds".into(), st.c.feeds);
        for (k, v) in &st.c.summaries_rejected {
            c.insert(format!("summaries_rejected_{k}"), *v);
        }
        c.insert("region_picks".into(), st.c.picks);
        c.insert("region_picks_tier_zone".into(), st.c.tier_zone);
        c.insert("region_picks_tier_region".into(), st.c.tier_region);
        c.insert("region_picks_tier_failover".into(), st.c.tier_failover);
        for (r, v) in &st.c.failover_by_region {
            c.insert(format!("region_picks_failover_{r}"), *v);
        }
        c.insert(
            "region_picks_failover_degraded".into(),
            st.c.failover_degraded,
        );
        c.insert(
            "region_picks_failover_of_withdrawn".into(),
            st.c.failover_of_withdrawn,
        );
        for (k, v) in &st.c.refused {
            c.insert(format!("region_picks_no_backend_{k}"), *v);
        }
        c.insert("region_picks_outside_policy".into(), st.c.outside_policy);
        c.insert(
            "region_picks_no_backend_with_local_ready".into(),
            st.c.no_backend_with_local_ready,
        );
        c.insert("failover_reaction_missing".into(), missing);
        c.insert("failover_before_last_withdrawal".into(), before_last);
        c.insert("failover_cap_violations".into(), st.c.cap_violations);
        c.insert("region_cuts".into(), st.cuts.len() as u64);
        c.insert(
            "summary_upgrades_during_cut".into(),
            st.c.upgrades_during_cut,
        );
        c.insert("summary_reconcile_missing".into(), reconcile_missing);
        c.insert("summaries_mismatched_at_end".into(), mismatches);
        c.insert("agents_with_changed_policy".into(), policy_changed);
        let threshold = st.services.iter().any(|s| s.factor_pct.is_some());
        if threshold {
            // Only scenarios with threshold failover carry these (the others' reports are
            // unchanged).
            c.insert("region_picks_spilled".into(), st.c.spill_answered);
            for (k, v) in &st.c.spill_refused {
                c.insert(format!("region_picks_spill_refused_{k}"), *v);
            }
            c.insert("spill_window_picks".into(), st.c.spill_window_picks);
            c.insert("spill_window_observed".into(), st.c.spill_observed);
            c.insert(
                "spill_window_expected".into(),
                st.c.spill_expected.round() as u64,
            );
            c.insert("spills_while_healthy".into(), st.c.spills_while_healthy);
        }
        for (r, v) in &st.c.served_during_cut {
            c.insert(
                format!(
                    "region_picks_served_during_cut_{}",
                    self.region_names[*r as usize]
                ),
                *v,
            );
        }
        // Checks.
        let ck = &mut report.checks;
        ck.insert(
            "picks_outside_policy".into(),
            Check {
                ok: st.c.outside_policy == 0 && st.c.picks > 0,
                detail: format!(
                    "{} of {} regional picks outside policy (own region, then the policy's regions)",
                    st.c.outside_policy, st.c.picks
                ),
            },
        );
        if no_policy_withdrawn {
            let no_policy = st.c.refused.get("no_policy").copied().unwrap_or(0);
            ck.insert(
                "no_policy_stays_local".into(),
                Check {
                    ok: st.c.no_policy_failovers == 0 && no_policy > 0,
                    detail: format!(
                        "{} failover answers for services without policy; {no_policy} explicit no-backend (no_policy) answers",
                        st.c.no_policy_failovers
                    ),
                },
            );
        }
        let e = &st.spec.expect;
        if let Some(max) = e.failover_reaction_p99_ms {
            ck.insert(
                "failover_reaction_p99".into(),
                Check {
                    ok: reaction.count > 0 && reaction.p99 <= max && missing == 0 && before_last == 0,
                    detail: format!(
                        "p99 {} ms (limit {max}), max {}, {} samples, {missing} agents missing, {before_last} before the last withdrawal",
                        reaction.p99, reaction.max, reaction.count
                    ),
                },
            );
        }
        if let Some(max) = e.reconcile_within_ms {
            let every_region_served = (0..self.region_names.len() as u16)
                .all(|r| st.c.served_during_cut.get(&r).is_some_and(|&v| v > 0));
            let healed = !st.cuts.is_empty() && st.cuts.iter().all(|c| c.healed_ms.is_some());
            ck.insert(
                "region_isolation".into(),
                Check {
                    ok: healed
                        && every_region_served
                        && st.c.no_backend_with_local_ready == 0
                        && st.c.upgrades_during_cut == 0
                        && policy_changed == 0
                        && reconcile_missing == 0
                        && reconcile_d.max <= max
                        && mismatches == 0,
                    detail: format!(
                        "{} cuts, all healed: {healed}; every region served during the cut: {every_region_served}; {} local no-backend with a READY local endpoint; {} summaries of a cut-off region upgraded; {policy_changed} agents with another policy; reconcile after heal max {} ms (limit {max}), {reconcile_missing} agents missing; {mismatches} held summaries differ from their region's view at the end",
                        st.cuts.len(),
                        st.c.no_backend_with_local_ready,
                        st.c.upgrades_during_cut,
                        reconcile_d.max
                    ),
                },
            );
        }
        if e.capped {
            let capped = st.c.refused.get("capped").copied().unwrap_or(0);
            ck.insert(
                "failover_capped".into(),
                Check {
                    ok: capped > 0 && st.c.cap_violations == 0 && st.c.tier_failover > 0,
                    detail: format!(
                        "{capped} explicit capped answers, {} served failover picks, {} agent-seconds over the cap",
                        st.c.tier_failover, st.c.cap_violations
                    ),
                },
            );
        }
        if e.spill_share_from_ms.is_some() {
            // Binomial bound: each windowed pick spills with its own ground-truth probability
            // p_i; the count's mean is sum p_i and its variance sum p_i (1 - p_i). Within 4
            // standard deviations (+1 for the all-zero case's rounding) passes.
            let n = st.c.spill_window_picks;
            let (obs, exp) = (st.c.spill_observed as f64, st.c.spill_expected);
            let bound = 4.0 * st.c.spill_variance.sqrt() + 1.0;
            let share = |x: f64| if n == 0 { 0.0 } else { 100.0 * x / n as f64 };
            ck.insert(
                "threshold_spill_share".into(),
                Check {
                    ok: n > 0
                        && st.c.spill_observed > 0
                        && (obs - exp).abs() <= bound
                        && st.c.spills_while_healthy == 0
                        && st.c.outside_policy == 0,
                    detail: format!(
                        "{} of {n} windowed picks (every region's callers of the threshold services) spilled ({:.2} %), formula on the ground truth {:.1} ({:.2} %), bound +-{:.1}; {} spills while the region was fully routable; {} answered by the failover tier",
                        st.c.spill_observed,
                        share(obs),
                        exp,
                        share(exp),
                        bound,
                        st.c.spills_while_healthy,
                        st.c.spill_answered
                    ),
                },
            );
        }
        self.regions = Some(st);
    }

    /// (Held summaries of live agents whose endpoint set differs from what the summarised
    /// region's authority member routes now, agents whose policy is not the initial one.)
    fn summaries_at_end(&self, world: &World<ShoalNode>, st: &Regions) -> (u64, u64) {
        let now = world.now_ms();
        let regions = self.region_names.len() as u16;
        let mut truth = BTreeMap::new();
        for r in 0..regions {
            let Some(member) = world
                .topology()
                .region_nodes(r)
                .find(|&i| world.node(i).is_some())
            else {
                continue;
            };
            let mesh = world.node(member).expect("live").mesh();
            let liveness = mesh.liveness();
            for s in &st.services {
                let sum = summarize(
                    mesh.catalog(),
                    &self.region_names[r as usize],
                    &s.key,
                    &liveness,
                    now,
                );
                let ids: Vec<InstanceId> = sum.endpoints.into_iter().map(|e| e.instance).collect();
                truth.insert((self.region_names[r as usize].clone(), s.key.clone()), ids);
            }
        }
        let (mut mismatches, mut changed) = (0, 0);
        for (i, a) in st.agents.iter().enumerate() {
            if world.node(i as u32).is_none() {
                continue;
            }
            if a.policy().is_none_or(|p| **p != *st.policy) {
                changed += 1;
            }
            for h in a.remote().iter() {
                let s = &h.signed.summary;
                let ids: Vec<&InstanceId> = s.endpoints.iter().map(|e| &e.instance).collect();
                let want = truth.get(&(s.region.clone(), s.key.clone()));
                if want.is_none_or(|w| w.iter().collect::<Vec<_>>() != ids) {
                    mismatches += 1;
                }
            }
        }
        (mismatches, changed)
    }
}
