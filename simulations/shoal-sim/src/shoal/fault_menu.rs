//! The node-layer half of the membership fault menu (issue 15; the engine half is in
//! `world/membership_faults.rs`, the schema in `scenario/faults.rs`):
//!
//! * `inject_update`: a crafted SWIM update (a forged `Down` at a member's current
//!   incarnation, or a stale rumour) in another member's name, built with
//!   [`shoal_mesh::membership::forge`] and fed to each receiver as a datagram from the claimed
//!   sender's address;
//! * `duplicate_id`: a second process claiming a node's id (a cloned VM: same node key, same
//!   catalog, the next boot generation) replaces the agent of another machine;
//! * `crash_torn_snapshot`: the agent crashes while writing its snapshot; the torn file is the
//!   real `shoal_catalog::snapshot` encoding cut short, and the next start must refuse it
//!   with the real decoder (invariant 7) and load the previous one.
//!
//! And the oracle pieces they need: how long a live node stayed down in each observer's view
//! (`live_down_spell_ms`), downs of a forged rumour's subject counted apart, and the torn
//! snapshots refused or (a bug) loaded.

use super::*;
use crate::runner::NodeFault;
use crate::scenario::RumourState;
use shoal_catalog::snapshot::{self, Snapshot, SnapshotScope};
use shoal_mesh::membership::forge;

/// State of the fault menu kept by the harness.
#[derive(Debug, Default)]
pub(super) struct MenuState {
    /// Per node: the torn newest snapshot its crash left behind, until its next start.
    torn: BTreeMap<u32, Vec<u8>>,
    torn_written: u64,
    torn_refused: u64,
    torn_loaded: u64,
    /// Crafted datagrams delivered.
    injected: u64,
    /// Second processes started with another node's id.
    duplicates: u64,
}

/// Per (observer, node): when the observer declared a live node down, until it holds that
/// node up again (any identity of the same process). Kept by the observer.
#[derive(Debug, Default)]
pub(super) struct DownSpells {
    open: BTreeMap<(u32, u32), u64>,
    closed_ms: Vec<u64>,
    /// Subjects of a forged or stale rumour: their downs are counted here, not as false.
    pub(super) forged_subjects: BTreeSet<u32>,
    pub(super) forged_subject_downs: u64,
}

impl DownSpells {
    /// `observer` declared the live node `target` down.
    pub(super) fn down(&mut self, observer: u32, target: u32, now_ms: u64) {
        self.open.entry((observer, target)).or_insert(now_ms);
    }

    /// `observer` holds `target` up again.
    pub(super) fn up(&mut self, observer: u32, target: u32, now_ms: u64) {
        if let Some(since) = self.open.remove(&(observer, target)) {
            self.closed_ms.push(now_ms.saturating_sub(since));
        }
    }
}

impl Observer {
    /// An `Up` of `m` at `node`: closes a down spell of that node there.
    pub(super) fn on_up(&mut self, node: u32, now_ms: u64, m: &MemberId) {
        if let Some(target) = node_index(&m.node) {
            self.spells.up(node, target, now_ms);
        }
    }
}

impl ShoalHarness {
    /// [`Harness::node_fault`] for the shoal layer.
    pub(super) fn apply_node_fault(&mut self, world: &mut World<ShoalNode>, fault: &NodeFault) {
        match fault {
            NodeFault::InjectUpdate {
                to,
                from,
                member,
                state,
                incarnation_delta,
                boot_delta,
            } => self.inject(
                world,
                to,
                *from,
                *member,
                *state,
                *incarnation_delta,
                *boot_delta,
            ),
            NodeFault::DuplicateId { node, on } => self.duplicate(world, *node, *on),
            NodeFault::CrashTornSnapshot(nodes) => {
                let now = world.now_ms();
                for &i in nodes {
                    self.tear_snapshot(world, i);
                    // The runner crashes it next; the death is timed as any crash.
                    self.on_node_crash_before(world, now, i);
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn inject(
        &mut self,
        world: &mut World<ShoalNode>,
        to: &[u32],
        from: u32,
        member: u32,
        state: RumourState,
        incarnation_delta: i64,
        boot_delta: i64,
    ) {
        let (Some(sender), Some(subject)) = (world.node(from), world.node(member)) else {
            return;
        };
        let src = sender.mesh().membership().identity().clone();
        let current = subject.mesh().membership().identity().clone();
        // The subject's current incarnation as the claimed sender holds it.
        let incarnation = sender
            .mesh()
            .membership()
            .incarnation_of(&current)
            .unwrap_or(0);
        let incarnation =
            (i64::from(incarnation) + incarnation_delta).clamp(0, i64::from(u16::MAX));
        let boot = (current.boot.0 as i64 + boot_delta).max(0) as u64;
        let about = MemberId {
            boot: Generation(boot),
            ..current
        };
        let state = match state {
            RumourState::Alive => forge::RumourState::Alive,
            RumourState::Suspect => forge::RumourState::Suspect,
            RumourState::Down => forge::RumourState::Down,
        };
        if state == forge::RumourState::Down {
            self.observer
                .borrow_mut()
                .spells
                .forged_subjects
                .insert(member);
        }
        let from_addr = world.addr_of(from);
        for &r in to {
            let Some(dst) = world
                .node(r)
                .map(|n| n.mesh().membership().identity().clone())
            else {
                continue;
            };
            let bytes =
                forge::gossip_datagram(&src, &dst, &[(about.clone(), incarnation as u16, state)]);
            self.menu.injected += 1;
            world.with_node(r, |n, now| n.handle_datagram(now, from_addr, &bytes));
        }
    }

    /// A second process claiming `node`'s id starts on `on`'s machine: `on`'s agent stops
    /// (its death is timed as a crash) and a copy of `node`'s agent state (catalog, node key)
    /// starts there at the next boot generation, joining through three seeds.
    fn duplicate(&mut self, world: &mut World<ShoalNode>, node: u32, on: u32) {
        let Some(original) = world.node(node) else {
            return;
        };
        let boot = original.mesh().membership().identity().boot.next();
        let catalog = original.mesh().catalog().clone();
        let now = world.now_ms();
        world.crash(on);
        self.on_node_crash(world, now, on);
        let ctx = world.ctx_for(on);
        let topo = Arc::clone(world.topology());
        let region = topo.node(node).region;
        let identity = MemberId {
            node: node_id(node),
            addr: world.addr_of(on),
            boot,
        };
        let mut mesh = Mesh::new(
            identity,
            self.region_names[region as usize].clone(),
            self.zone_names[topo.node(on).zone as usize].clone(),
            self.node_keys[node as usize].clone(),
            self.mesh_config[region as usize].clone(),
            self.keys.clone(),
            ctx.seed,
        );
        mesh.restore(now, Restore::Catalog(Box::new(catalog)));
        let seeds = self.seed_addrs(&topo, region, on);
        mesh.join(now, &seeds);
        {
            let mut obs = self.observer.borrow_mut();
            // Both claimants' downs are the conflict's, not false; `on` stays "crashed" for
            // the oracle (its own agent is gone).
            obs.excused.insert(node);
            obs.excused.insert(on);
        }
        self.menu.duplicates += 1;
        let mut n = ShoalNode {
            index: on,
            mesh,
            observer: self.observer.clone(),
            notes: Vec::new(),
        };
        n.tap(now);
        world.start(on, n);
    }

    /// The snapshot `i` was writing when it crashed: the real encoding of its catalog, cut
    /// at a random byte.
    fn tear_snapshot(&mut self, world: &World<ShoalNode>, i: u32) {
        let Some(n) = world.node(i) else { return };
        let region = self.region_names[world.topology().node(i).region as usize].clone();
        let bytes = snapshot::encode(&Snapshot::of(
            n.mesh().catalog(),
            SnapshotScope::Catalog,
            region,
        ));
        let cut = 1 + (self.rng.next_u64() % (bytes.len() as u64 - 1)) as usize;
        self.menu.torn.insert(i, bytes[..cut].to_vec());
        self.menu.torn_written += 1;
    }

    /// At a restart of `i`: a torn newest snapshot is tried first, as the agent's loader does
    /// (`shoal-agent` `persist::load_snapshot`); it must be refused, and the previous one
    /// (the last complete write, kept by the harness) is loaded instead.
    pub(super) fn try_torn_snapshot(&mut self, i: u32) {
        let Some(bytes) = self.menu.torn.remove(&i) else {
            return;
        };
        match snapshot::decode(&bytes, &self.keys) {
            Err(_) => self.menu.torn_refused += 1,
            Ok(_) => self.menu.torn_loaded += 1,
        }
    }

    /// A crash about to be applied by the runner: times the death like `Action::CrashNodes`.
    fn on_node_crash_before(&mut self, world: &World<ShoalNode>, now_ms: u64, i: u32) {
        if world.is_alive(i) {
            self.on_node_crash(world, now_ms, i);
        }
    }

    /// The fault menu's report: counters, the down-spell distribution and its check.
    pub(super) fn menu_report(&self, report: &mut Report) {
        let obs = self.observer.borrow();
        let spells = &obs.spells;
        let mut closed = spells.closed_ms.clone();
        let m = &self.menu;
        // Only where the menu is used, so every other report stays as it was.
        let used =
            m.injected > 0 || m.duplicates > 0 || self.spec.expect.max_live_down_spell_ms.is_some();
        if used {
            report
                .distributions
                .insert("live_down_spell_ms".into(), oracle::dist_of(&mut closed));
            report.counters.insert(
                "live_down_spells_open_at_end".into(),
                spells.open.len() as u64,
            );
        }
        let c = &mut report.counters;
        if !spells.forged_subjects.is_empty() {
            c.insert(
                "downs_of_forged_subject".into(),
                spells.forged_subject_downs,
            );
        }
        for (k, v) in [
            ("updates_injected", m.injected),
            ("duplicate_id_processes", m.duplicates),
            ("snapshots_torn", m.torn_written),
            ("torn_snapshots_refused", m.torn_refused),
            ("torn_snapshots_loaded", m.torn_loaded),
        ] {
            if v > 0 {
                c.insert(k.into(), v);
            }
        }
        if m.torn_written > 0 {
            report.checks.insert(
                "torn_snapshot_refused".into(),
                Check {
                    ok: m.torn_loaded == 0 && m.torn_refused == m.torn_written,
                    detail: format!(
                        "{} torn snapshots written, {} refused at restart, {} loaded",
                        m.torn_written, m.torn_refused, m.torn_loaded
                    ),
                },
            );
        }
        if let Some(max) = self.spec.expect.max_live_down_spell_ms {
            let worst = spells.closed_ms.iter().copied().max().unwrap_or(0);
            report.checks.insert(
                "live_down_spell".into(),
                Check {
                    ok: worst <= max && spells.open.is_empty(),
                    detail: format!(
                        "longest time a live node stayed down in a view {worst} ms (limit {max}), {} still down at the end",
                        spells.open.len()
                    ),
                },
            );
        }
    }
}
