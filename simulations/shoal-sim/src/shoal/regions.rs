//! Three regions, one policy (issue 16 item 5, docs/adr/0013-global-policy-and-failover.md):
//! services present in every region, the signed global policy every agent holds, the summary
//! path between region authorities, each agent's failover feed, and the regional traffic
//! whose picks go zone -> region -> the policy's regions in order.
//!
//! The protocol code is the library's: `shoal_catalog::remote::summarize` builds a region's
//! summary from its authority member's catalog and SWIM view, `RemoteSummaries` holds them at
//! each authority, and every agent runs `shoal_catalog::failover::FailoverState` (the same
//! pick tiers, caps and staleness rules as `shoal-agent`). The path, simply:
//!
//! 1. every `authority_pull_ms`, L's authority asks R's for the services whose policy lets L
//!    fail over to R (`RegionSummaries`), one cross-region leg each way (`cross_region_ms` +
//!    jitter); a leg whose authority nodes a link fault cuts is lost;
//! 2. R builds the summaries from its authority member (the first live agent of R) and signs
//!    them with R's key; L's authority verifies and keeps them (only newer replace);
//! 3. every `agent_pull_ms` (own phase per agent) each agent of L pulls its authority's held
//!    set (`FailoverFeed`, `feed_ms` one way) and offers every summary to its own state.
//!
//! A region authority's network location (for link faults) is its region's first node.
//!
//! A policy with `overprovisioning_factor_pct` (threshold failover) makes each pick the region
//! can answer go through `FailoverState::spill_remote` with the agent's own `LocalCapacity`
//! (one extra traffic draw per such pick, so scenarios without it keep their random stream);
//! the oracle applies the formula to the ground truth at each pick and compares.

use super::*;
use shoal_catalog::failover::{local_tier, FailoverState, LocalCapacity, RemotePick, Spill, Tier};
use shoal_catalog::remote::{summarize, RemoteSummaries};
use shoal_proto::rpc::{AuthorityOk, AuthorityRequestBody};
use shoal_proto::{
    FailoverMode, GlobalPolicy, GlobalServicePolicy, RegionKeys, RegionSummary, ServicePolicy,
    SignedGlobalPolicy, SignedSummary, StaleAction, TrustedKeys,
};

/// Step of the regional traffic (each agent picks on its own phase of this grid), ms.
pub(super) const REGION_TICK_MS: u64 = 10;
/// Step of the agents' feed pulls (each agent on its own phase of this grid), ms.
const FEED_TICK_MS: u64 = 100;

/// A service present in every region.
pub(super) struct GlobalService {
    pub(super) key: ServiceKey,
    /// Allowed failover regions in order (the scenario's ground truth, not the document).
    pub(super) allowed: Option<Vec<u16>>,
    pub(super) cap_rps: Option<u32>,
    /// Threshold failover's factor, percent (the scenario's ground truth).
    pub(super) factor_pct: Option<u32>,
    /// Instances per region, by index.
    pub(super) instances: Vec<Vec<usize>>,
}

/// A withdrawal of every endpoint of one service in one region.
pub(super) struct Withdrawal {
    pub(super) service: usize,
    pub(super) region: u16,
    pub(super) at_ms: u64,
    /// Only this many endpoints (not timed).
    pub(super) count: Option<u32>,
    /// Per node: first failover answer for the service at or after `at_ms`.
    pub(super) first_failover_ms: Vec<u64>,
}

/// A region pair's authorities cut off from each other (ground truth from the link faults).
pub(super) struct Cut {
    /// The holder region (L) and the cut-off region (R).
    pub(super) holder: u16,
    pub(super) remote: u16,
    pub(super) start_ms: u64,
    pub(super) healed_ms: Option<u64>,
    /// Age of the oldest summary of R held by L's authority at the heal, ms.
    pub(super) age_at_heal_ms: Option<u64>,
    /// Per node of L: first summary of R accepted that was built after the heal.
    pub(super) reconciled_ms: Vec<u64>,
}

enum RegionEvent {
    Pull {
        from: u16,
        to: u16,
    },
    Build {
        from: u16,
        to: u16,
    },
    Reply {
        from: u16,
        to: u16,
        summaries: Vec<Arc<SignedSummary>>,
    },
    Feed {
        region: u16,
        agents: Vec<u32>,
        held: Arc<Vec<Arc<SignedSummary>>>,
    },
    Withdraw {
        w: usize,
    },
}

/// The regional state of a run.
pub(super) struct Regions {
    pub(super) spec: RegionsSpec,
    pub(super) services: Vec<GlobalService>,
    pub(super) policy: Arc<SignedGlobalPolicy>,
    authority_held: Vec<RemoteSummaries>,
    held_snapshot: Vec<Option<Arc<Vec<Arc<SignedSummary>>>>>,
    /// Per node: the agent's failover state.
    pub(super) agents: Vec<FailoverState>,
    /// Per region, per feed slot (of [`FEED_TICK_MS`]): the agents that pull in it.
    feed_slots: Vec<Vec<Vec<u32>>>,
    /// Per pick slot (of [`REGION_TICK_MS`]): the agents that pick in it, once per period.
    pick_slots: Vec<Vec<u32>>,
    events: BTreeMap<(u64, u64), RegionEvent>,
    seq: u64,
    pub(super) next_tick_ms: u64,
    rng: SimRng,
    /// Summaries some authority verified (real ed25519), by address: an agent's check of the
    /// same shared copy is a lookup (equal content, equal result: cost, not outcome).
    verified: HashMap<*const SignedSummary, Arc<SignedSummary>>,
    pub(super) withdrawals: Vec<Withdrawal>,
    pub(super) cuts: Vec<Cut>,
    pub(super) c: RegionCounters,
    /// Per (node, service): (second, failover answers in it), the oracle's own count.
    cap_windows: HashMap<(u32, usize), (u64, u32)>,
}

/// What the regional model counts.
#[derive(Default)]
pub(super) struct RegionCounters {
    pub(super) request_bytes: u64,
    pub(super) reply_bytes: u64,
    pub(super) pulls: u64,
    pub(super) pulls_lost_to_cut: u64,
    pub(super) summaries_built: u64,
    pub(super) feeds: u64,
    pub(super) picks: u64,
    pub(super) tier_zone: u64,
    pub(super) tier_region: u64,
    pub(super) tier_failover: u64,
    pub(super) failover_degraded: u64,
    pub(super) failover_by_region: BTreeMap<String, u64>,
    pub(super) refused: BTreeMap<&'static str, u64>,
    pub(super) outside_policy: u64,
    pub(super) failover_of_withdrawn: u64,
    pub(super) no_policy_failovers: u64,
    pub(super) cap_violations: u64,
    pub(super) upgrades_during_cut: u64,
    /// Per region: local answers while some cut was open.
    pub(super) served_during_cut: BTreeMap<u16, u64>,
    /// Local no-backend answers while the region held a READY, live instance (ground truth).
    pub(super) no_backend_with_local_ready: u64,
    pub(super) summaries_rejected: BTreeMap<&'static str, u64>,
    /// Threshold failover: picks the agent spilled, answered by the failover tier.
    pub(super) spill_answered: u64,
    /// Threshold failover: spills the failover tier refused (answered locally), by reason.
    pub(super) spill_refused: BTreeMap<&'static str, u64>,
    /// The oracle's spill tally over the window (`spill_share_from_ms` on): locally
    /// answerable picks of factor services, spills observed, and the sum of the expected spill
    /// probabilities and of their variances (ground truth at each pick).
    pub(super) spill_window_picks: u64,
    pub(super) spill_observed: u64,
    pub(super) spill_expected: f64,
    pub(super) spill_variance: f64,
    /// Spills while the picking agent's region was fully routable (ground truth), any time.
    pub(super) spills_while_healthy: u64,
}

impl Regions {
    fn at(&mut self, ms: u64, e: RegionEvent) {
        self.seq += 1;
        self.events.insert((ms, self.seq), e);
    }

    /// Next time the regional model needs a wakeup.
    pub(super) fn next_wakeup_ms(&self) -> u64 {
        let e = self.events.keys().next().map_or(u64::MAX, |(t, _)| *t);
        e.min(self.next_tick_ms)
    }

    fn leg_ms(&mut self) -> u64 {
        self.spec.cross_region_ms + self.rng.next_u64() % (self.spec.cross_region_jitter_ms + 1)
    }

    fn snapshot(&mut self, region: u16) -> Arc<Vec<Arc<SignedSummary>>> {
        let held = &self.authority_held[region as usize];
        Arc::clone(
            self.held_snapshot[region as usize].get_or_insert_with(|| {
                Arc::new(held.iter().map(|h| Arc::clone(&h.signed)).collect())
            }),
        )
    }

    fn open_cut(&self, holder: u16, remote: u16) -> Option<&Cut> {
        self.cuts
            .iter()
            .find(|c| c.holder == holder && c.remote == remote && c.healed_ms.is_none())
    }

    /// Records what a holder in `region` accepted from `summary`'s region (upgrade and
    /// reconcile checks).
    fn on_accepted(
        &mut self,
        region: u16,
        remote: u16,
        node: Option<u32>,
        s: &RegionSummary,
        now_ms: u64,
    ) {
        if self
            .open_cut(region, remote)
            .is_some_and(|c| s.generated_at_ms > c.start_ms)
        {
            self.c.upgrades_during_cut += 1;
        }
        let Some(node) = node else { return };
        for c in &mut self.cuts {
            if c.holder == region && c.remote == remote {
                if let Some(h) = c.healed_ms {
                    let slot = &mut c.reconciled_ms[node as usize];
                    if s.generated_at_ms >= h && *slot == u64::MAX {
                        *slot = now_ms;
                    }
                }
            }
        }
    }
}

/// The authority node of `region` (its network location for link faults).
fn authority_node(world: &World<ShoalNode>, region: u16) -> u32 {
    world.topology().region_nodes(region).start
}

impl ShoalHarness {
    /// Builds the regional model: the global services' instances (READY in every region's
    /// initial catalog), the signed global policy (held by every agent, as if delivered and
    /// persisted long before), the pull schedule and the withdrawals.
    pub(super) fn setup_regions(
        &mut self,
        spec: &RegionsSpec,
        topo: &crate::topology::Topology,
        tree: &crate::rng::RngTree,
    ) -> anyhow::Result<()> {
        let regions = self.region_names.len() as u16;
        anyhow::ensure!(regions >= 2, "[shoal.regions] needs at least two regions");
        anyhow::ensure!(
            spec.cross_region_ms >= 30,
            "[shoal.regions] cross_region_ms must be at least 30"
        );
        anyhow::ensure!(
            spec.picks_per_agent_per_s > 0.0
                && spec.authority_pull_ms > 0
                && spec.agent_pull_ms > 0,
            "[shoal.regions] picks and pull periods must be positive"
        );
        let mut rng = tree.child(Purpose::Custom(16), 0);
        let names = self.region_names.clone();
        let region_index = |name: &str| -> anyhow::Result<u16> {
            names
                .iter()
                .position(|r| r.as_str() == name)
                .map(|i| i as u16)
                .ok_or_else(|| anyhow::anyhow!("[shoal.regions]: unknown region {name:?}"))
        };
        let mut services = Vec::new();
        let mut doc_services = Vec::new();
        for (s, g) in spec.services.iter().enumerate() {
            let key: ServiceKey = g
                .name
                .parse()
                .map_err(|e| anyhow::anyhow!("[shoal.regions] service {:?}: {e}", g.name))?;
            anyhow::ensure!(
                g.instances_per_region > 0,
                "{}: instances_per_region is 0",
                g.name
            );
            let allowed = match &g.policy {
                None => None,
                Some(p) => {
                    let ids = p
                        .regions
                        .iter()
                        .map(|r| region_index(r))
                        .collect::<anyhow::Result<Vec<u16>>>()?;
                    doc_services.push(GlobalServicePolicy {
                        key: key.clone(),
                        policy: ServicePolicy {
                            allowed_failover_regions: ids
                                .iter()
                                .map(|&i| self.region_names[i as usize].clone())
                                .collect(),
                            mode: if p.read_only {
                                FailoverMode::ReadOnly
                            } else {
                                FailoverMode::Writable
                            },
                            max_cross_region_rps: p.max_cross_region_rps,
                            max_snapshot_age_s: p.max_snapshot_age_s,
                            on_stale: if p.refuse_stale {
                                StaleAction::Refuse
                            } else {
                                StaleAction::Degrade
                            },
                            overprovisioning_factor_pct: p.overprovisioning_factor_pct,
                        },
                    });
                    Some(ids)
                }
            };
            let mut per_region = Vec::new();
            for r in 0..regions {
                let nodes = topo.region_nodes(r);
                let mut idxs = Vec::new();
                for i in 0..g.instances_per_region {
                    let owner =
                        nodes.start + (rng.next_u64() % u64::from(nodes.end - nodes.start)) as u32;
                    let id = InstanceId::new(format!(
                        "g{s}-{}-{i}",
                        self.region_names[r as usize].as_str()
                    ))
                    .expect("valid id");
                    let idx = self.add_instance(key.clone(), id, owner, r, topo);
                    for (to, reason) in [
                        (LifecycleState::Starting, TransitionReason::Registered),
                        (LifecycleState::Ready, TransitionReason::ReadinessPassed),
                    ] {
                        let rec = self.commit(idx, to, reason, 0).expect("initial admission");
                        let _ = self.initial[r as usize].apply_lifecycle(Arc::new(rec), &self.keys);
                    }
                    idxs.push(idx);
                }
                per_region.push(idxs);
            }
            services.push(GlobalService {
                key,
                allowed,
                cap_rps: g.policy.as_ref().and_then(|p| p.max_cross_region_rps),
                factor_pct: g
                    .policy
                    .as_ref()
                    .and_then(|p| p.overprovisioning_factor_pct),
                instances: per_region,
            });
        }
        doc_services.sort_by(|a, b| a.key.cmp(&b.key));
        let policy_key = SigningKey::from_seed([0xC0; 32]);
        let mut policy_keys = TrustedKeys::new();
        policy_keys.insert(policy_key.verifying_key());
        let mut directory: Vec<RegionKeys> = self
            .region_names
            .iter()
            .zip(&self.authorities)
            .map(|(r, a)| RegionKeys {
                region: r.clone(),
                authority_keys: vec![a.key.verifying_key().to_bytes()],
            })
            .collect();
        directory.sort_by(|a, b| a.region.cmp(&b.region));
        let doc = policy_key.sign_global_policy(GlobalPolicy {
            version: 1,
            issued_at_ms: 0,
            regions: directory,
            services: doc_services,
        });
        doc.verify(&policy_keys)
            .map_err(|e| anyhow::anyhow!("[shoal.regions] global policy: {e}"))?;
        let policy = Arc::new(doc);
        let agents = (0..topo.len() as u32)
            .map(|i| {
                let r = topo.node(i).region;
                let mut st = FailoverState::new(self.region_names[r as usize].clone());
                st.offer_policy(Arc::clone(&policy), &policy_keys)
                    .expect("the policy verified above");
                st
            })
            .collect();
        let slots = (spec.agent_pull_ms / FEED_TICK_MS).max(1);
        let mut feed_slots = vec![vec![Vec::new(); slots as usize]; regions as usize];
        for i in 0..topo.len() as u32 {
            let slot = rng.next_u64() % slots;
            feed_slots[topo.node(i).region as usize][slot as usize].push(i);
        }
        // Each agent picks every `period` ms on its own phase, so the failover reaction is
        // sampled at agent-specific times, not on one grid.
        let period = ((1_000.0 / spec.picks_per_agent_per_s).round() as u64).max(REGION_TICK_MS);
        let mut pick_slots = vec![Vec::new(); (period / REGION_TICK_MS) as usize];
        for i in 0..topo.len() as u32 {
            let slot = rng.next_u64() % pick_slots.len() as u64;
            pick_slots[slot as usize].push(i);
        }
        let mut st = Regions {
            spec: spec.clone(),
            services,
            policy,
            authority_held: self
                .region_names
                .iter()
                .map(|r| RemoteSummaries::new(r.clone()))
                .collect(),
            held_snapshot: vec![None; regions as usize],
            agents,
            feed_slots,
            pick_slots,
            events: BTreeMap::new(),
            seq: 0,
            next_tick_ms: REGION_TICK_MS,
            rng,
            verified: HashMap::new(),
            withdrawals: Vec::new(),
            cuts: Vec::new(),
            c: RegionCounters::default(),
            cap_windows: HashMap::new(),
        };
        for from in 0..regions {
            for to in 0..regions {
                let (l, r) = (
                    &self.region_names[from as usize],
                    &self.region_names[to as usize],
                );
                if st.policy.policy.failover_services(l, r).next().is_some() {
                    let phase = st.rng.next_u64() % spec.authority_pull_ms;
                    st.at(phase, RegionEvent::Pull { from, to });
                }
            }
        }
        for w in &spec.withdraw {
            let service = st
                .services
                .iter()
                .position(|s| s.key.to_string() == w.service)
                .ok_or_else(|| anyhow::anyhow!("withdraw: unknown service {:?}", w.service))?;
            let region = region_index(&w.region)?;
            let idx = st.withdrawals.len();
            st.withdrawals.push(Withdrawal {
                service,
                region,
                at_ms: w.at_ms,
                count: w.count,
                first_failover_ms: vec![u64::MAX; topo.len()],
            });
            st.at(w.at_ms, RegionEvent::Withdraw { w: idx });
        }
        self.regions = Some(Box::new(st));
        Ok(())
    }

    /// Runs the regional model up to now.
    pub(super) fn wake_regions(&mut self, world: &mut World<ShoalNode>) {
        let Some(mut st) = self.regions.take() else {
            return;
        };
        let now = world.now_ms();
        while let Some(entry) = st.events.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let e = entry.remove();
            self.region_event(&mut st, world, now, e);
        }
        if st.next_tick_ms <= now {
            // The grid stays aligned even if this wakeup came late.
            let tick = st.next_tick_ms;
            self.region_tick(&mut st, world, now, tick);
            st.next_tick_ms = (now / REGION_TICK_MS + 1) * REGION_TICK_MS;
        }
        self.regions = Some(st);
    }

    fn region_event(
        &mut self,
        st: &mut Regions,
        world: &mut World<ShoalNode>,
        now: u64,
        e: RegionEvent,
    ) {
        match e {
            RegionEvent::Pull { from, to } => {
                st.at(
                    now + st.spec.authority_pull_ms,
                    RegionEvent::Pull { from, to },
                );
                st.c.pulls += 1;
                if world
                    .link_faults()
                    .blocked(authority_node(world, from), authority_node(world, to))
                {
                    st.c.pulls_lost_to_cut += 1;
                    return;
                }
                let keys: Vec<ServiceKey> = st
                    .policy
                    .policy
                    .failover_services(
                        &self.region_names[from as usize],
                        &self.region_names[to as usize],
                    )
                    .cloned()
                    .collect();
                let body = AuthorityRequestBody::RegionSummaries {
                    keys,
                    policy_version: st.policy.policy.version,
                };
                st.c.request_bytes +=
                    postcard::to_allocvec(&body).expect("plain data").len() as u64;
                let at = now + st.leg_ms();
                st.at(at, RegionEvent::Build { from, to });
            }
            RegionEvent::Build { from, to } => {
                let (l, r) = (
                    self.region_names[from as usize].clone(),
                    self.region_names[to as usize].clone(),
                );
                let Some(member) = world
                    .topology()
                    .region_nodes(to)
                    .find(|&i| world.node(i).is_some())
                else {
                    return;
                };
                let mesh = world.node(member).expect("live").mesh();
                let liveness = mesh.liveness();
                let key = &self.authorities[to as usize].key;
                let summaries: Vec<Arc<SignedSummary>> = st
                    .policy
                    .policy
                    .failover_services(&l, &r)
                    .map(|k| {
                        Arc::new(key.sign_summary(summarize(mesh.catalog(), &r, k, &liveness, now)))
                    })
                    .collect();
                st.c.summaries_built += summaries.len() as u64;
                if world
                    .link_faults()
                    .blocked(authority_node(world, to), authority_node(world, from))
                {
                    st.c.pulls_lost_to_cut += 1;
                    return;
                }
                let reply = AuthorityOk::Summaries {
                    summaries: summaries.iter().map(|s| (**s).clone()).collect(),
                    policy: None,
                };
                st.c.reply_bytes += postcard::to_allocvec(&reply).expect("plain data").len() as u64;
                let at = now + st.leg_ms();
                st.at(
                    at,
                    RegionEvent::Reply {
                        from,
                        to,
                        summaries,
                    },
                );
            }
            RegionEvent::Reply {
                from,
                to,
                summaries,
            } => {
                let keys = st
                    .policy
                    .policy
                    .region_keys(&self.region_names[to as usize]);
                for s in summaries {
                    match st.authority_held[from as usize].offer(Arc::clone(&s), &keys, now) {
                        Ok(()) => {
                            st.on_accepted(from, to, None, &s.summary, now);
                            st.held_snapshot[from as usize] = None;
                            st.verified.insert(Arc::as_ptr(&s), s);
                        }
                        Err(e) => *st.c.summaries_rejected.entry(e.as_label()).or_default() += 1,
                    }
                }
                if st.verified.len() > 4_096 {
                    // Only copies some holder still shares need the fast path.
                    st.verified.retain(|_, s| Arc::strong_count(s) > 1);
                }
            }
            RegionEvent::Feed {
                region,
                agents,
                held,
            } => {
                st.c.feeds += agents.len() as u64;
                for node in agents {
                    if world.node(node).is_none() {
                        continue;
                    }
                    for s in held.iter() {
                        let Regions {
                            agents, verified, ..
                        } = &mut *st;
                        let res = agents[node as usize].offer_summary_with(
                            Arc::clone(s),
                            now,
                            |s, keys| {
                                if verified.contains_key(&(s as *const SignedSummary)) {
                                    Ok(())
                                } else {
                                    s.verify(keys)
                                }
                            },
                        );
                        match res {
                            Ok(()) => {
                                let remote = self
                                    .region_names
                                    .iter()
                                    .position(|r| *r == s.summary.region)
                                    .expect("a known region")
                                    as u16;
                                st.on_accepted(region, remote, Some(node), &s.summary, now);
                            }
                            Err(shoal_catalog::remote::OfferError::NotNewer) => {}
                            Err(e) => {
                                *st.c.summaries_rejected.entry(e.as_label()).or_default() += 1
                            }
                        }
                    }
                }
            }
            RegionEvent::Withdraw { w } => {
                let (svc, region) = (st.withdrawals[w].service, st.withdrawals[w].region);
                let count = st.withdrawals[w].count.map_or(usize::MAX, |c| c as usize);
                for &idx in st.services[svc].instances[region as usize]
                    .iter()
                    .take(count)
                {
                    let inst = &self.instances[idx];
                    if inst.state == LifecycleState::Ready && inst.process_alive {
                        self.at(
                            now,
                            Action::Request {
                                idx,
                                to: LifecycleState::Draining,
                                reason: TransitionReason::DrainRequested,
                                attempt: 0,
                            },
                        );
                    }
                }
            }
        }
    }

    /// One tick: on the feed grid, this slot's agents pull their feed; this pick slot's
    /// agents call every regional service once (each agent every `1 / picks_per_agent_per_s`).
    fn region_tick(&mut self, st: &mut Regions, world: &World<ShoalNode>, now: u64, tick: u64) {
        if tick.is_multiple_of(FEED_TICK_MS) {
            let slots = st.feed_slots[0].len() as u64;
            let slot = ((tick / FEED_TICK_MS) % slots) as usize;
            for region in 0..self.region_names.len() as u16 {
                if self.in_outage(region, now).is_some() {
                    continue; // the region's authority answers no feed
                }
                let agents = st.feed_slots[region as usize][slot].clone();
                if agents.is_empty() {
                    continue;
                }
                let held = st.snapshot(region);
                let at = now + st.spec.feed_ms;
                st.at(
                    at,
                    RegionEvent::Feed {
                        region,
                        agents,
                        held,
                    },
                );
            }
        }
        let slot = ((tick / REGION_TICK_MS) % st.pick_slots.len() as u64) as usize;
        let agents = std::mem::take(&mut st.pick_slots[slot]);
        for &node in &agents {
            let Some(n) = world.node(node) else { continue };
            if world.is_stalled(node) {
                continue;
            }
            for svc in 0..st.services.len() {
                self.region_pick(st, n, node, svc, now, world);
            }
        }
        st.pick_slots[slot] = agents;
    }

    fn region_pick(
        &mut self,
        st: &mut Regions,
        n: &ShoalNode,
        node: u32,
        svc: usize,
        now: u64,
        world: &World<ShoalNode>,
    ) {
        let region = world.topology().node(node).region;
        let key = &st.services[svc].key;
        let mesh = n.mesh();
        let liveness = mesh.liveness();
        let zone = &self.zone_names[world.topology().node(node).zone as usize];
        let r = self.traffic_rng.next_u64();
        st.c.picks += 1;
        let cut_open = st.cuts.iter().any(|c| c.healed_ms.is_none());
        if let Some(e) = view::pick(
            mesh.catalog().routable(key, &liveness),
            mesh.region(),
            zone,
            false,
            r,
        ) {
            if st.agents[node as usize]
                .overprovisioning_factor_pct(key)
                .is_some()
            {
                // Threshold failover, with the agent's own view of its region.
                let r_spill = self.traffic_rng.next_u64();
                let capacity = LocalCapacity::of(mesh.catalog(), key, mesh.region(), &liveness);
                let spill = st.agents[node as usize].spill_remote(
                    key,
                    capacity,
                    false,
                    now / 1_000,
                    now,
                    r_spill,
                    r,
                );
                self.judge_spill(st, svc, region, now, !matches!(spill, Spill::Local));
                match spill {
                    Spill::Local => {}
                    Spill::Refused(why) => {
                        *st.c.spill_refused.entry(why.as_label()).or_default() += 1
                    }
                    Spill::Remote(p) => {
                        st.c.spill_answered += 1;
                        self.record_failover(st, node, svc, region, now, &p, true);
                        return;
                    }
                }
            }
            let rec = &e.lifecycle().record;
            match local_tier(&rec.endpoint.zone, zone) {
                Tier::Zone => st.c.tier_zone += 1,
                _ => st.c.tier_region += 1,
            }
            let truth = self.by_key.get(&(rec.key.clone(), rec.instance.clone()));
            if truth.is_none_or(|&i| self.instances[i].region != region) {
                st.c.outside_policy += 1;
            }
            if cut_open {
                *st.c.served_during_cut.entry(region).or_default() += 1;
            }
            return;
        }
        let ready_here = st.services[svc].instances[region as usize]
            .iter()
            .any(|&i| {
                let inst = &self.instances[i];
                inst.state == LifecycleState::Ready
                    && inst.process_alive
                    && inst.bad_since.is_none()
            });
        if ready_here {
            st.c.no_backend_with_local_ready += 1;
        }
        match st.agents[node as usize].pick_remote(key, false, now / 1_000, now, r) {
            Err(why) => *st.c.refused.entry(why.as_label()).or_default() += 1,
            Ok(p) => self.record_failover(st, node, svc, region, now, &p, false),
        }
    }

    /// The oracle's checks of one failover answer (`spill`: a threshold spill, not a region
    /// without a local endpoint, so it does not time the failover reaction).
    #[allow(clippy::too_many_arguments)]
    fn record_failover(
        &mut self,
        st: &mut Regions,
        node: u32,
        svc: usize,
        region: u16,
        now: u64,
        p: &RemotePick,
        spill: bool,
    ) {
        let key = &st.services[svc].key;
        st.c.tier_failover += 1;
        st.c.failover_degraded += u64::from(p.degraded);
        *st.c
            .failover_by_region
            .entry(p.region.to_string())
            .or_default() += 1;
        let truth = self
            .by_key
            .get(&(key.clone(), p.endpoint.instance.clone()))
            .map(|&i| (self.instances[i].region, self.instances[i].bad_since));
        let service = &st.services[svc];
        let inside = match (&service.allowed, truth) {
            (Some(allowed), Some((r, _))) => r != region && allowed.contains(&r),
            _ => false,
        };
        if !inside {
            st.c.outside_policy += 1;
        }
        if service.allowed.is_none() {
            st.c.no_policy_failovers += 1;
        }
        if truth.is_some_and(|(_, bad)| bad.is_some_and(|b| b <= now)) {
            st.c.failover_of_withdrawn += 1;
        }
        if let Some(cap) = service.cap_rps {
            let w = st
                .cap_windows
                .entry((node, svc))
                .or_insert((now / 1_000, 0));
            if w.0 != now / 1_000 {
                *w = (now / 1_000, 0);
            }
            w.1 += 1;
            if w.1 > cap {
                st.c.cap_violations += 1;
            }
        }
        if spill {
            return;
        }
        for w in &mut st.withdrawals {
            if w.service == svc && w.region == region && w.at_ms <= now && w.count.is_none() {
                let slot = &mut w.first_failover_ms[node as usize];
                if *slot == u64::MAX {
                    *slot = now;
                }
            }
        }
    }

    /// The oracle's tally of one threshold decision (`spilled`: the agent spilled, answered or
    /// refused), against the formula applied to the ground truth: the share the region keeps
    /// is `min(100, factor * routable / registered)` percent, routable = READY, process alive,
    /// never withdrawn; registered = not EXPIRED.
    fn judge_spill(&self, st: &mut Regions, svc: usize, region: u16, now: u64, spilled: bool) {
        let Some(factor) = st.services[svc].factor_pct else {
            return;
        };
        let (mut routable, mut registered) = (0u64, 0u64);
        for &i in &st.services[svc].instances[region as usize] {
            let inst = &self.instances[i];
            if inst.state != LifecycleState::Expired {
                registered += 1;
            }
            if inst.state == LifecycleState::Ready && inst.process_alive && inst.bad_since.is_none()
            {
                routable += 1;
            }
        }
        let keep_pct = (u64::from(factor) * routable)
            .checked_div(registered)
            .map_or(0, |v| v.min(100));
        let p = (100 - keep_pct) as f64 / 100.0;
        if keep_pct == 100 && spilled {
            st.c.spills_while_healthy += 1;
        }
        if st
            .spec
            .expect
            .spill_share_from_ms
            .is_some_and(|from| now >= from)
        {
            st.c.spill_window_picks += 1;
            st.c.spill_observed += u64::from(spilled);
            st.c.spill_expected += p;
            st.c.spill_variance += p * (1.0 - p);
        }
    }

    /// After a fault: opens or closes the region-pair cuts (ground truth: whether a link
    /// fault separates the two authorities), recording at a heal the age of the held
    /// summaries.
    pub(super) fn regions_on_fault(&mut self, world: &World<ShoalNode>, now: u64) {
        let Some(st) = self.regions.as_mut() else {
            return;
        };
        let regions = self.region_names.len() as u16;
        for holder in 0..regions {
            for remote in 0..regions {
                let (l, r) = (
                    &self.region_names[holder as usize],
                    &self.region_names[remote as usize],
                );
                if st.policy.policy.failover_services(l, r).next().is_none() {
                    continue;
                }
                let (a, b) = (authority_node(world, holder), authority_node(world, remote));
                let cut = world.link_faults().blocked(a, b) || world.link_faults().blocked(b, a);
                let open = st.cuts.iter().position(|c| {
                    c.holder == holder && c.remote == remote && c.healed_ms.is_none()
                });
                match (cut, open) {
                    (true, None) => st.cuts.push(Cut {
                        holder,
                        remote,
                        start_ms: now,
                        healed_ms: None,
                        age_at_heal_ms: None,
                        reconciled_ms: vec![u64::MAX; world.len()],
                    }),
                    (false, Some(i)) => {
                        let age = st.authority_held[holder as usize]
                            .iter()
                            .filter(|h| h.signed.summary.region == *r)
                            .map(|h| now.saturating_sub(h.signed.summary.generated_at_ms))
                            .max();
                        let c = &mut st.cuts[i];
                        c.healed_ms = Some(now);
                        c.age_at_heal_ms = age;
                    }
                    _ => {}
                }
            }
        }
    }

    /// An agent restarted: its summaries were in memory only; its policy was persisted.
    pub(super) fn regions_on_restart(&mut self, node: u32) {
        if let Some(st) = self.regions.as_mut() {
            st.agents[node as usize].forget_summaries();
        }
    }
}
