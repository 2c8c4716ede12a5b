//! The observer: what nodes report (applied records, downs), keyed for cheap lookup.

use super::*;

/// A withdrawal being timed: the first time each agent applied a record at or past `marker`.
#[derive(Debug)]
pub(super) struct Tracked {
    pub(super) marker: (Generation, Revision),
    pub(super) region: u16,
    pub(super) committed_ms: u64,
    pub(super) seen_ms: Vec<u64>,
    /// Agents a link fault cut off from the requesting agent at commit time: they cannot
    /// apply the withdrawal before the heal, whatever the protocol, so their samples are
    /// reported apart (`drain_propagation_cut_off_agents_ms`).
    pub(super) cut_off: BTreeSet<u32>,
}

/// `Death::seen_ms` of an agent that did not hold the dead identity as an active member when
/// it died: nothing to detect there (see [`ShoalHarness::mark_unaware`]).
pub(super) const UNAWARE: u64 = u64::MAX - 1;

/// A death being timed: the first time each agent declared the node down.
#[derive(Debug)]
pub(super) struct Death {
    pub(super) at_ms: u64,
    pub(super) boot: Generation,
    pub(super) region: u16,
    pub(super) seen_ms: Vec<u64>,
}

/// A process crash being timed: the first time each agent applied the failing health.
#[derive(Debug)]
pub(super) struct ProcessDeath {
    pub(super) at_ms: u64,
    pub(super) generation: Generation,
    pub(super) region: u16,
    pub(super) seen_ms: Vec<u64>,
}

/// Collects what nodes report, keyed for cheap lookup.
#[derive(Debug, Default)]
pub struct Observer {
    pub(super) nodes: usize,
    pub(super) drains: HashMap<(ServiceKey, InstanceId), Tracked>,
    pub(super) finished_drains: Vec<Tracked>,
    pub(super) deaths: BTreeMap<u32, Death>,
    pub(super) finished_deaths: Vec<Death>,
    pub(super) process_deaths: HashMap<(ServiceKey, InstanceId), ProcessDeath>,
    pub(super) finished_process: Vec<ProcessDeath>,
    /// Per node: current boot while running, `None` when crashed.
    pub(super) boots: Vec<Option<Generation>>,
    /// Nodes cut off from (part of) the region, or stalled: their downs are not false.
    pub(super) excused: BTreeSet<u32>,
    /// Nodes ever CPU-stalled: their drain applications are reported apart (a node asleep
    /// 800 ms of every second cannot apply anything within a second, whatever the protocol).
    pub(super) stalled: BTreeSet<u32>,
    pub(super) false_downs: u64,
    /// Distinct nodes falsely declared down.
    pub(super) false_down_targets: BTreeSet<u32>,
    pub(super) excused_downs: u64,
    /// (node, time) of every false down, for the report (first 32).
    pub(super) false_down_samples: Vec<(u32, u32, u64)>,
    /// How long live nodes stay down in each view; forged rumours' subjects.
    pub(super) spells: super::fault_menu::DownSpells,
}

/// The observer, shared by the harness and every node. Only the engine's thread locks it:
/// nodes on worker threads keep their events as notes ([`crate::SimNode::Note`]), which the
/// engine applies in sequential order.
#[derive(Clone, Debug)]
pub struct SharedObserver(std::sync::Arc<std::sync::Mutex<Observer>>);

impl SharedObserver {
    pub(super) fn new(observer: Observer) -> Self {
        Self(std::sync::Arc::new(std::sync::Mutex::new(observer)))
    }

    /// The observer, to read.
    pub(super) fn borrow(&self) -> std::sync::MutexGuard<'_, Observer> {
        self.0.lock().expect("the observer lock is never poisoned")
    }

    /// The observer, to change.
    pub(super) fn borrow_mut(&self) -> std::sync::MutexGuard<'_, Observer> {
        self.borrow()
    }
}

pub(super) fn node_index(id: &NodeId) -> Option<u32> {
    id.as_str().strip_prefix('n')?.parse().ok()
}

impl Observer {
    pub(super) fn on_event(&mut self, node: u32, now_ms: u64, ev: MeshEvent) {
        match ev {
            MeshEvent::LifecycleApplied(rec) => self.on_lifecycle(node, now_ms, &rec),
            MeshEvent::HealthApplied(rec) => self.on_health(node, now_ms, &rec),
            MeshEvent::Membership(MembershipEvent::Down(m)) => self.on_down(node, now_ms, &m),
            MeshEvent::Membership(MembershipEvent::Up(m)) => self.on_up(node, now_ms, &m),
            _ => {}
        }
    }

    pub(super) fn on_lifecycle(&mut self, node: u32, now_ms: u64, rec: &SignedLifecycle) {
        if self.drains.is_empty() {
            return;
        }
        let r = &rec.record;
        // Borrowed lookup: build the key only when something is tracked.
        if let Some(t) = self.drains.get_mut(&(r.key.clone(), r.instance.clone())) {
            if r.order() >= t.marker && t.seen_ms[node as usize] == u64::MAX {
                t.seen_ms[node as usize] = now_ms;
            }
        }
    }

    pub(super) fn on_health(&mut self, node: u32, now_ms: u64, rec: &SignedHealth) {
        let r = &rec.record;
        if r.status != HealthStatus::Failing || self.process_deaths.is_empty() {
            return;
        }
        if let Some(p) = self
            .process_deaths
            .get_mut(&(r.key.clone(), r.instance.clone()))
        {
            if r.generation == p.generation && p.seen_ms[node as usize] == u64::MAX {
                p.seen_ms[node as usize] = now_ms;
            }
        }
    }

    pub(super) fn on_down(&mut self, node: u32, now_ms: u64, m: &MemberId) {
        let Some(target) = node_index(&m.node) else {
            return;
        };
        if let Some(d) = self.deaths.get_mut(&target) {
            if d.boot == m.boot {
                if d.seen_ms[node as usize] == u64::MAX {
                    d.seen_ms[node as usize] = now_ms;
                }
                return;
            }
        }
        // The process that runs now started at `current`; it may have renewed its identity
        // since (boot + 1 per renewal), so any boot from `current` on is this live process.
        let current = self.boots.get(target as usize).copied().flatten();
        if current.is_some_and(|b| m.boot >= b) {
            self.spells.down(node, target, now_ms);
            if self.spells.forged_subjects.contains(&target) {
                self.spells.forged_subject_downs += 1;
            } else if self.excused.contains(&target) || self.excused.contains(&node) {
                self.excused_downs += 1;
            } else {
                self.false_downs += 1;
                self.false_down_targets.insert(target);
                if self.false_down_samples.len() < 32 {
                    self.false_down_samples.push((node, target, now_ms));
                }
            }
        }
    }
}
