//! Ground truth of the workload (instances, their states) and the actions that change it:
//! registrations, rollouts, drains, process and node crashes.

use super::*;

#[derive(Debug, Clone)]
pub(super) struct Instance {
    pub(super) key: ServiceKey,
    pub(super) id: InstanceId,
    pub(super) generation: Generation,
    pub(super) owner: u32,
    pub(super) region: u16,
    pub(super) spec: EndpointSpec,
    pub(super) state: LifecycleState,
    pub(super) process_alive: bool,
    /// When the endpoint stopped being a valid target (withdrawal commit or death), ms.
    pub(super) bad_since: Option<u64>,
    /// Whether the owner agent already reported it failing.
    pub(super) reported_failing: bool,
}

#[derive(Debug, Clone)]
pub(super) enum Action {
    /// Ask the authority for a transition of instance `idx`.
    Request {
        idx: usize,
        to: LifecycleState,
        reason: TransitionReason,
        attempt: u32,
    },
    /// A committed record reaches the requesting agent and the authority's member.
    Publish {
        rec: Arc<SignedLifecycle>,
        at: Vec<u32>,
    },
    /// Register a replacement for instance `idx`.
    Replace { idx: usize },
    /// Drain `count` random READY instances (of one region if set).
    DrainRandom { count: u32, region: Option<u16> },
    /// Crash `count` random instance processes (of one region if set).
    CrashProcesses { count: u32, region: Option<u16> },
    /// Crash `count` random nodes (of one region if set).
    CrashNodes { count: u32, region: Option<u16> },
    /// The owner's probes notice the dead process of `idx`.
    ProbeFails { idx: usize },
}

impl ShoalHarness {
    pub(super) fn at(&mut self, ms: u64, action: Action) {
        self.action_seq += 1;
        self.actions.insert((ms, self.action_seq), action);
    }

    pub(super) fn schedule_workload(&mut self, scenario: &Scenario) {
        let Some(w) = scenario.workload.as_ref() else {
            return;
        };
        if let Some(r) = &w.rollout {
            let region = self.region_of(r.region.as_deref());
            let mut victims: Vec<usize> = (0..self.instances.len())
                .filter(|&i| region.is_none_or(|r| self.instances[i].region == r))
                .collect();
            shuffle(&mut victims, &mut self.rng);
            victims.truncate(r.replacements as usize);
            let step = r.over_ms / u64::from(r.replacements.max(1));
            for (k, idx) in victims.into_iter().enumerate() {
                self.at(r.start_ms + k as u64 * step, Action::Replace { idx });
            }
        }
        for d in &w.drains {
            let region = self.region_of(d.region.as_deref());
            let count = d.instances;
            self.at(d.at_ms, Action::DrainRandom { count, region });
        }
        for c in &w.crashes {
            let (count, region) = (c.count, self.region_of(c.region.as_deref()));
            let a = match c.kind {
                CrashKind::Process => Action::CrashProcesses { count, region },
                CrashKind::Node => Action::CrashNodes { count, region },
            };
            self.at(c.at_ms, a);
        }
    }

    /// The index of a region named in the scenario (validated there), `None` for "any".
    pub(super) fn region_of(&self, name: Option<&str>) -> Option<u16> {
        let name = name?;
        let i = self.region_names.iter().position(|r| r.as_str() == name);
        Some(i.expect("region names are validated with the scenario") as u16)
    }

    pub(super) fn run_action(&mut self, world: &mut World<ShoalNode>, now_ms: u64, action: Action) {
        match action {
            Action::Request {
                idx,
                to,
                reason,
                attempt,
            } => self.request(world, now_ms, idx, to, reason, attempt),
            Action::Publish { rec, at } => {
                for node in at {
                    if world.is_alive(node) {
                        let rec = Arc::clone(&rec);
                        world.with_node(node, |n, now| {
                            // The authority signed it: a refusal would be a conflict, which
                            // the core counts (`MeshCounters::refused`) and the catalog
                            // oracle would see; the report does not judge it here.
                            let _refused = n.command(
                                now,
                                Command::Publish {
                                    lifecycle: vec![rec],
                                },
                            );
                        });
                    }
                }
            }
            Action::Replace { idx } => self.replace(world, now_ms, idx),
            Action::DrainRandom { count, region } => {
                let mut ready: Vec<usize> = (0..self.instances.len())
                    .filter(|&i| {
                        let inst = &self.instances[i];
                        region.is_none_or(|r| inst.region == r)
                            && inst.state == LifecycleState::Ready
                            && inst.process_alive
                            && world.is_alive(inst.owner)
                    })
                    .collect();
                shuffle(&mut ready, &mut self.rng);
                for idx in ready.into_iter().take(count as usize) {
                    self.at(
                        now_ms,
                        Action::Request {
                            idx,
                            to: LifecycleState::Draining,
                            reason: TransitionReason::DrainRequested,
                            attempt: 0,
                        },
                    );
                }
            }
            Action::CrashProcesses { count, region } => {
                let mut live: Vec<usize> = (0..self.instances.len())
                    .filter(|&i| {
                        let inst = &self.instances[i];
                        region.is_none_or(|r| inst.region == r)
                            && inst.state == LifecycleState::Ready
                            && inst.process_alive
                            && world.is_alive(inst.owner)
                    })
                    .collect();
                shuffle(&mut live, &mut self.rng);
                for idx in live.into_iter().take(count as usize) {
                    self.crash_process(now_ms, idx);
                }
            }
            Action::CrashNodes { count, region } => {
                let topo = world.topology();
                let mut live: Vec<u32> = (0..world.len() as u32)
                    .filter(|&i| {
                        world.is_alive(i) && region.is_none_or(|r| topo.node(i).region == r)
                    })
                    .collect();
                shuffle(&mut live, &mut self.rng);
                for node in live.into_iter().take(count as usize) {
                    world.crash(node);
                    self.on_node_crash(world, now_ms, node);
                }
            }
            Action::ProbeFails { idx } => {
                let inst = &mut self.instances[idx];
                if inst.reported_failing || !world.is_alive(inst.owner) {
                    return;
                }
                inst.reported_failing = true;
                let (owner, key, id, generation) = (
                    inst.owner,
                    inst.key.clone(),
                    inst.id.clone(),
                    inst.generation,
                );
                world.with_node(owner, |n, now| {
                    // Refused only when the owner no longer binds the instance at this
                    // generation (it was replaced meanwhile); counted by the core.
                    let _refused = n.command(
                        now,
                        Command::ReportHealth {
                            key,
                            instance: id,
                            generation,
                            status: HealthStatus::Failing,
                            reason: TransitionReason::ReadinessFailed,
                        },
                    );
                });
            }
        }
    }

    pub(super) fn request(
        &mut self,
        world: &mut World<ShoalNode>,
        now_ms: u64,
        idx: usize,
        to: LifecycleState,
        reason: TransitionReason,
        attempt: u32,
    ) {
        let inst = &self.instances[idx];
        if !world.is_alive(inst.owner) || inst.state == LifecycleState::Expired {
            return;
        }
        if let Some(until) = self.in_outage(inst.region, now_ms) {
            // No quorum: refused; the agent retries with exponential backoff and full jitter.
            self.refused_writes += 1;
            let cap = 1_000u64 << attempt.min(5);
            let retry = (now_ms + self.rng.next_u64() % cap.max(1)).max(until.min(now_ms + cap));
            self.at(
                retry,
                Action::Request {
                    idx,
                    to,
                    reason,
                    attempt: attempt + 1,
                },
            );
            return;
        }
        let commit_ms = now_ms + self.spec.commit_ms;
        let Some(rec) = self.commit(idx, to, reason, commit_ms) else {
            return;
        };
        let rec = Arc::new(rec);
        let owner = self.instances[idx].owner;
        let region = self.instances[idx].region;
        let inst = &mut self.instances[idx];
        match to {
            LifecycleState::Draining | LifecycleState::Expired => {
                if inst.bad_since.is_none() {
                    inst.bad_since = Some(commit_ms);
                }
                if to == LifecycleState::Draining {
                    let seen = vec![u64::MAX; self.observer.borrow().nodes];
                    let faults = world.link_faults();
                    let cut_off = if faults.is_empty() {
                        BTreeSet::new()
                    } else {
                        (0..world.len() as u32)
                            .filter(|&i| faults.blocked(owner, i))
                            .collect()
                    };
                    let tracked = Tracked {
                        marker: rec.record.order(),
                        region,
                        committed_ms: commit_ms,
                        seen_ms: seen,
                        cut_off,
                    };
                    let mut obs = self.observer.borrow_mut();
                    let key = (inst.key.clone(), inst.id.clone());
                    if let Some(old) = obs.drains.insert(key, tracked) {
                        obs.finished_drains.push(old);
                    }
                    drop(obs);
                    self.at(
                        commit_ms + self.spec.drain_grace_ms,
                        Action::Request {
                            idx,
                            to: LifecycleState::Expired,
                            reason: TransitionReason::Deregistered,
                            attempt: 0,
                        },
                    );
                }
            }
            LifecycleState::Starting => {
                self.at(
                    commit_ms + self.spec.startup_ms,
                    Action::Request {
                        idx,
                        to: LifecycleState::Ready,
                        reason: TransitionReason::ReadinessPassed,
                        attempt: 0,
                    },
                );
            }
            LifecycleState::Ready => {}
        }
        let nodes = world.topology().region_nodes(region);
        let member =
            nodes.start + (self.rng.next_u64() % u64::from(nodes.end - nodes.start)) as u32;
        self.at(
            commit_ms,
            Action::Publish {
                rec,
                at: vec![owner, member],
            },
        );
    }

    pub(super) fn replace(&mut self, world: &mut World<ShoalNode>, now_ms: u64, idx: usize) {
        let old = self.instances[idx].clone();
        if old.state != LifecycleState::Ready {
            return;
        }
        self.replaced += 1;
        let topo = Arc::clone(world.topology());
        let nodes = topo.region_nodes(old.region);
        let owner = nodes.start + (self.rng.next_u64() % u64::from(nodes.end - nodes.start)) as u32;
        let id = InstanceId::new(format!("{}-r{}", old.id, self.replaced)).expect("valid id");
        let new = self.add_instance(old.key.clone(), id, owner, old.region, &topo);
        self.request(
            world,
            now_ms,
            new,
            LifecycleState::Starting,
            TransitionReason::Registered,
            0,
        );
        // The old instance is drained once its replacement is READY (k8s maxUnavailable = 0).
        let ready_at = now_ms + self.spec.commit_ms * 2 + self.spec.startup_ms;
        self.at(
            ready_at,
            Action::Request {
                idx,
                to: LifecycleState::Draining,
                reason: TransitionReason::DrainRequested,
                attempt: 0,
            },
        );
    }

    pub(super) fn crash_process(&mut self, now_ms: u64, idx: usize) {
        let inst = &mut self.instances[idx];
        inst.process_alive = false;
        inst.bad_since.get_or_insert(now_ms);
        let seen = vec![u64::MAX; self.observer.borrow().nodes];
        self.observer.borrow_mut().process_deaths.insert(
            (inst.key.clone(), inst.id.clone()),
            ProcessDeath {
                at_ms: now_ms,
                generation: inst.generation,
                region: inst.region,
                seen_ms: seen,
            },
        );
        // The owner's readiness probe runs every period with jitter; `probe_failures`
        // consecutive failures mark the instance failing.
        let period = self.spec.probe_period_ms;
        let first = now_ms + self.rng.next_u64() % period.max(1);
        let at = first + period * u64::from(self.spec.probe_failures.saturating_sub(1));
        self.at(at, Action::ProbeFails { idx });
    }

    pub(super) fn on_node_crash(&mut self, world: &World<ShoalNode>, now_ms: u64, node: u32) {
        let region = world.topology().node(node).region;
        let mut obs = self.observer.borrow_mut();
        let boot = obs.boots[node as usize].take().unwrap_or(Generation(0));
        let death = Death {
            at_ms: now_ms,
            boot,
            region,
            seen_ms: vec![u64::MAX; obs.nodes],
        };
        if let Some(old) = obs.deaths.insert(node, death) {
            obs.finished_deaths.push(old);
        }
        drop(obs);
        self.mark_unaware(world, node);
        for inst in self.instances.iter_mut().filter(|i| i.owner == node) {
            inst.bad_since.get_or_insert(now_ms);
            inst.process_alive = false;
        }
    }

    /// Right after `node`'s death was recorded: marks the agents of its region that do not
    /// hold the dead identity as an active member, so have nothing to detect. They held it
    /// down already (the far side of a partition), never learned it (an agent that restarted
    /// and has not heard of it yet), or are the node itself, restarted. Such agents are left
    /// out of the detection figures (counted in `detection_observers_unaware`), not counted
    /// as missing. O(agents x log members) per death (a scan of every member list here was
    /// ~30 % of `reference/mass-restart`, which has 1,668 deaths).
    pub(super) fn mark_unaware(&self, world: &World<ShoalNode>, node: u32) {
        let mut obs = self.observer.borrow_mut();
        let Some(d) = obs.deaths.get_mut(&node) else {
            return;
        };
        let id = node_id(node);
        for i in world.topology().region_nodes(d.region) {
            let Some(n) = world.node(i) else { continue };
            let aware = i != node
                && n.mesh()
                    .membership()
                    .member(&id)
                    .is_some_and(|m| m.boot == d.boot);
            if !aware && d.seen_ms[i as usize] == u64::MAX {
                d.seen_ms[i as usize] = UNAWARE;
            }
        }
    }
}

pub(super) fn shuffle<T>(v: &mut [T], rng: &mut SimRng) {
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

pub(super) fn draw_count(d: &CountDist, rng: &mut SimRng) -> u32 {
    match *d {
        CountDist::Fixed { n } => n,
        CountDist::Uniform { min, max } => rng.random_range(min..=max),
        CountDist::Tiered { ref tiers } => {
            // Pick the tier by its share (the last one takes rounding leftovers), then the count.
            let mut u = rng.random::<f64>() * 100.0;
            let tier = tiers
                .iter()
                .find(|t| {
                    u -= t.pct;
                    u < 0.0
                })
                .or(tiers.last())
                .expect("validated: at least one tier");
            rng.random_range(tier.min..=tier.max)
        }
        CountDist::Zipf { max, exponent } => {
            // Inverse-CDF sampling over 1..=max with weights k^-exponent.
            let total: f64 = (1..=max).map(|k| f64::from(k).powf(-exponent)).sum();
            let mut u = rng.random::<f64>() * total;
            for k in 1..=max {
                u -= f64::from(k).powf(-exponent);
                if u <= 0.0 {
                    return max + 1 - k;
                }
            }
            1
        }
    }
}
