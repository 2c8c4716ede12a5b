//! State shared between the driver task, the local API and the probe tasks.
//!
//! The driver task is the only writer of the [`Mesh`]: every input (datagram, stream message,
//! timer, command) is fed by it, under the write lock, and its outputs are drained before the
//! lock is released. Operator and write paths take the read lock for the microseconds they
//! need, and never wait on the network or the authority while holding it (invariant 6).
//!
//! **The read path takes no lock.** What a local API read needs (the catalog, the nodes SWIM
//! holds down, the local ejections, the apply times) is published as one immutable [`View`]
//! in an atomically swapped pointer ([`Shared::view`], the `arc-swap` crate): a reader loads the
//! current `Arc<View>` without a lock or a syscall and answers from it, however long the driver
//! then holds the mesh write lock. Every part is a persistent or shared structure (the catalog's
//! `imbl` maps, `Arc`s), so publishing a new view costs a few pointer copies, not a copy of the
//! catalog (Consul's go-memdb immutable trees do the same for its blocking reads). Writers
//! publish before they bump an index ([`crate::api::ViewIndex`]), so a blocking query woken by
//! a change reads a view that holds it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use arc_swap::ArcSwap;

use shoal_catalog::view::Liveness;
use shoal_catalog::{Catalog, Keyring};
use shoal_mesh::{Command, Mesh, MeshEvent};
use shoal_proto::rpc::{AuthorityError, AuthorityOk, AuthorityRequestBody};
use shoal_proto::{
    Generation, InstanceId, LifecycleRecord, LifecycleState, NodeId, Revision, ServiceKey,
};
use tokio::sync::{mpsc, oneshot};

use crate::config::Validated;

/// Most local ejections held; past it new ejections are refused and counted.
pub const MAX_EJECTIONS: usize = 65_536;
/// Most apply times held: at most one per catalog entry, so the catalog's own bound. Past it
/// new ones are dropped and counted (the API then shows `applied_at_ms: null`).
pub const MAX_APPLY_TIMES: usize = shoal_catalog::catalog::DEFAULT_MAX_ENTRIES;

/// What the API and the probes ask of the driver task.
#[derive(Debug)]
pub enum DriverCmd {
    /// Feed a mesh command (publish records, report health).
    Mesh(Command),
    /// Feed a mesh command and acknowledge once it was applied (read-your-writes for the API).
    MeshAck(Command, oneshot::Sender<()>),
    /// Send an authority RPC (`to: None` = the in-process development authority).
    Authority {
        /// Destination replica.
        to: Option<std::net::SocketAddr>,
        /// The same for every attempt of one call, so a replica answers a retry of a write
        /// it committed instead of applying it again (`shoal_authority::replay`).
        request_id: u64,
        /// The request.
        body: AuthorityRequestBody,
        /// The local process the request is forwarded for (audit).
        on_behalf_of: Option<shoal_proto::rpc::LocalCaller>,
        /// Where the reply goes.
        reply: oneshot::Sender<Result<AuthorityOk, AuthorityError>>,
    },
    /// Join through these seeds (resolved by the join task).
    Join(Vec<std::net::SocketAddr>),
    /// Persist the snapshot now (tests, shutdown).
    PersistNow,
}

/// Health and freshness of the agent, for `/v1/agent/*` and the `stale` flag.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// Membership reported Active (at least one peer knows us).
    pub active: bool,
    /// Monotonic ms when we last had at least one active peer.
    pub last_peer_ms: Option<u64>,
    /// Monotonic ms of the last authority reply (or dev authority use).
    pub last_authority_ms: Option<u64>,
    /// Last authority error, cleared by the next success.
    pub authority_error: Option<String>,
    /// Wall time of the data served when booted from a persisted snapshot.
    pub loaded_snapshot_written: Option<SystemTime>,
    /// Wall time of the last successful persistence.
    pub persisted_at: Option<SystemTime>,
    /// Last persistence error (logged once), cleared by the next success.
    pub persist_error: Option<String>,
    /// Snapshot files refused at boot.
    pub refused_snapshots: Vec<String>,
}

/// What one local API read answers from: an immutable snapshot of the agent's view, replaced
/// whole by writers ([`Shared::update_view`]) and read without locks ([`Shared::view`]).
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The catalog (an O(1) clone of the mesh's, sharing its `imbl` trees).
    pub catalog: Catalog,
    /// Nodes SWIM holds down now (as `Membership::is_down` answers in shoal-mesh).
    pub down: DownNodes,
    /// Local ejections: (instance, generation) -> until (monotonic ms).
    pub ejections: Arc<HashMap<(InstanceId, Generation), u64>>,
    /// When this agent applied each endpoint's current lifecycle record.
    pub apply_times: ApplyTimes,
    /// Unique in the process ([`View::next_generation`]; every [`Shared::update_view`] takes
    /// a new one), so two reads that see the same generation see the same view, even with
    /// several agents in one process (tests): readers cache what they render by this number.
    pub generation: u64,
}

/// The last generation handed out by [`View::next_generation`].
static VIEW_GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl View {
    /// A generation no view of this process has had (starts at 1: 0 is a default view's).
    pub fn next_generation() -> u64 {
        VIEW_GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    }

    /// Liveness as the API judges it at `now_ms`: SWIM's down nodes plus the local ejections.
    pub fn liveness(&self, now_ms: u64) -> ViewLiveness<'_, &DownNodes> {
        ViewLiveness {
            mesh: &self.down,
            ejections: &self.ejections,
            now_ms,
        }
    }
}

/// The nodes SWIM holds down, as published in a [`View`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DownNodes(Arc<HashSet<NodeId>>);

impl DownNodes {
    /// The nodes `mesh`'s membership holds down now.
    pub fn of(mesh: &Mesh<Keyring>) -> Self {
        Self(Arc::new(mesh.membership().down_nodes().cloned().collect()))
    }

    /// True when it lists exactly the nodes `mesh` holds down now (O(down nodes)).
    pub fn matches(&self, mesh: &Mesh<Keyring>) -> bool {
        let mut n = 0;
        let all = mesh.membership().down_nodes().all(|node| {
            n += 1;
            self.0.contains(node)
        });
        all && n == self.0.len()
    }

    /// Nodes listed.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no node is down.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Liveness for &DownNodes {
    fn is_down(&self, node: &NodeId) -> bool {
        !self.0.is_empty() && self.0.contains(node)
    }
    fn is_ejected(&self, _: &InstanceId, _: Generation) -> bool {
        false
    }
}

/// The freshness fields of an answer, read under one take of the status lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    /// [`Shared::snapshot_age_ms`].
    pub snapshot_age_ms: u64,
    /// [`Shared::authority_age_ms`].
    pub authority_age_ms: Option<u64>,
    /// [`Shared::is_stale`].
    pub stale: bool,
}

/// Everything shared.
pub struct Shared {
    /// Validated configuration.
    pub cfg: Validated,
    /// The protocol core (written by the driver only).
    pub mesh: RwLock<Mesh<Keyring>>,
    /// Origin of the monotonic ms clock.
    pub origin: tokio::time::Instant,
    /// Blocking-query indexes: whole view, members, per service (ADR 0011).
    pub index: crate::api::ViewIndex,
    /// Local ejections: (instance, generation) -> until (monotonic ms). The writers' copy:
    /// every change is published in [`Shared::view`] while this lock is held.
    pub ejections: Mutex<HashMap<(InstanceId, Generation), u64>>,
    /// When this agent applied each endpoint's current lifecycle record (written by the driver,
    /// published in [`Shared::view`]). Lock order: after `mesh` and `ejections`.
    pub apply_times: Mutex<ApplyTimes>,
    /// The view local reads answer from, swapped whole by writers (see the module docs).
    pub view: ArcSwap<View>,
    /// Serialises writers of [`Shared::view`] (readers never take it). Lock order: last.
    pub view_writer: Mutex<()>,
    /// What the periodic persist last wrote (written by the driver only).
    pub persisted: Mutex<crate::persist::Persisted>,
    /// Freshness.
    pub status: Mutex<Status>,
    /// Commands to the driver.
    pub driver: mpsc::Sender<DriverCmd>,
    /// Our public node key (hex).
    pub node_key_hex: String,
    /// Our public node key, as the authority binds it into our records (ADR 0006).
    pub node_public_key: shoal_proto::NodeKey,
    /// Whether the authority has confirmed the binding of `node_public_key` since start.
    pub node_key_bound: std::sync::atomic::AtomicBool,
    /// The development authority's public key (hex) when it runs here.
    pub dev_authority_key_hex: Option<String>,
    /// Boot generation of this process.
    pub boot: Generation,
    /// Probe concurrency limit.
    pub probe_permits: Arc<tokio::sync::Semaphore>,
    /// Probe tasks of local instances.
    pub probe_tasks: Mutex<HashMap<(String, String), tokio::task::AbortHandle>>,
    /// Owners of local instances (persisted).
    pub owners: crate::access::Owners,
    /// Probe definitions of local instances, persisted so a restart resumes them.
    pub local_probes: crate::local_probes::LocalProbes,
    /// Refused writes already logged.
    pub refusals: crate::access::RefusalLog,
    /// When (monotonic ms, [`Shared::now_ms`]) each member last went up or down in our view,
    /// for `shoal members` ("last change"). At most [`MAX_MEMBER_CHANGES`] nodes; changes of
    /// nodes beyond that are not recorded (counted in `shoal_member_changes_dropped_total`).
    pub member_changes: Mutex<HashMap<shoal_proto::NodeId, u64>>,
    /// Global policy and remote summaries, beside the catalog (ADR 0013).
    pub failover: crate::failover::Failover,
    /// Reads the transport from outside the driver: why the last dial to a peer failed
    /// (`dial_failure`), named in an authority call's error instead of a bare timeout.
    pub transport_view: shoal_transport::transport::QuicCountersHandle,
    /// Which authority replica to try first, and which failed lately (`client::Route`).
    pub authority_route: Mutex<crate::client::Route>,
}

/// Bound of [`Shared::member_changes`] (a region is ~1,667 nodes; nodes that left stay listed).
pub const MAX_MEMBER_CHANGES: usize = 65_536;

impl Shared {
    /// Records a membership change of `node` at `now_ms` (see [`Shared::member_changes`]).
    pub fn record_member_change(&self, node: &shoal_proto::NodeId, now_ms: u64) {
        let mut m = self.member_changes.lock().expect("member changes");
        if m.len() >= MAX_MEMBER_CHANGES && !m.contains_key(node) {
            metrics::counter!("shoal_member_changes_dropped_total").increment(1);
            return;
        }
        m.insert(node.clone(), now_ms);
    }
}

impl Shared {
    /// Publishes a copy of the current view changed by `f` (writers only; readers keep the
    /// view they loaded). `f` must not take any lock of [`Shared`]: callers take theirs first.
    pub fn update_view(&self, f: impl FnOnce(&mut View)) {
        let _writer = self.view_writer.lock().expect("view writer");
        let mut v = View::clone(&self.view.load());
        f(&mut v);
        v.generation = View::next_generation();
        self.view.store(Arc::new(v));
    }

    /// Stamps the apply times of the lifecycle records in `events` (just drained from the mesh
    /// by the driver) and publishes the view when anything a reader sees may have changed: the
    /// catalog (its index or size) or any mesh event but a refusal (lifecycle, health,
    /// membership: then the down nodes too). The driver calls it before it handles `events`
    /// (which bumps the blocking-query indexes). Takes the mesh read lock: call it without the
    /// write lock.
    pub fn publish_view(&self, events: &[MeshEvent]) {
        let mesh = self.mesh.read().expect("mesh lock");
        let mut times = None;
        let mut membership = false;
        for e in events {
            match e {
                MeshEvent::LifecycleApplied(rec) => {
                    let times =
                        times.get_or_insert_with(|| self.apply_times.lock().expect("apply times"));
                    stamp_apply_time(times, &rec.record);
                }
                MeshEvent::Membership(_) | MeshEvent::SnapshotInstalled { .. } => membership = true,
                _ => {}
            }
        }
        // Refusals are answered at the call now (no event), so every event may change the view.
        let any_event = !events.is_empty();
        let current = self.view.load();
        let catalog_changed = current.catalog.index() != mesh.catalog().index()
            || current.catalog.len() != mesh.catalog().len();
        if !(catalog_changed || any_event) {
            return;
        }
        drop(current);
        let down = membership.then(|| DownNodes::of(&mesh));
        let times = times.as_deref().cloned();
        self.update_view(|v| {
            v.catalog = mesh.catalog().clone();
            if let Some(down) = down {
                v.down = down;
            }
            if let Some(times) = times {
                v.apply_times = times;
            }
        });
    }

    /// The driver's tick: drops apply times of endpoints `mesh` no longer holds, and
    /// republishes the view if its down nodes or catalog differ from `mesh`'s (nothing known
    /// changes them without an event; this bounds the staleness of an unknown path to a tick).
    pub fn tidy_view(&self, mesh: &Mesh<Keyring>) {
        {
            // Every live apply time belongs to a catalog entry: more means stale ones.
            let mut times = self.apply_times.lock().expect("apply times");
            if times.len() > mesh.catalog().len() {
                times.retain_held(mesh.catalog());
                let kept = times.clone();
                self.update_view(|v| v.apply_times = kept);
            }
        }
        let view = self.view.load();
        let down_stale = !view.down.matches(mesh);
        if down_stale || view.catalog.index() != mesh.catalog().index() {
            drop(view);
            tracing::debug!(down_stale, "view republished by the tick");
            let down = DownNodes::of(mesh);
            self.update_view(|v| {
                v.catalog = mesh.catalog().clone();
                v.down = down;
            });
        }
    }

    /// Publishes the local ejections `ej` (call with the [`Shared::ejections`] lock held).
    pub fn publish_ejections(&self, ej: &HashMap<(InstanceId, Generation), u64>) {
        let ej = Arc::new(ej.clone());
        self.update_view(|v| v.ejections = ej);
    }

    /// The freshness fields of an answer, under one take of the status lock.
    pub fn freshness(&self) -> Freshness {
        let now = self.now_ms();
        let budget = self.cfg.raw.api.staleness_budget_ms;
        let st = self.status.lock().expect("status lock");
        let fresh = |t: Option<u64>| t.is_some_and(|t| now.saturating_sub(t) <= budget);
        let peer_ok = fresh(st.last_peer_ms) || self.cfg.raw.seeds.is_empty();
        Freshness {
            snapshot_age_ms: snapshot_age(now, &st),
            authority_age_ms: st.last_authority_ms.map(|t| now.saturating_sub(t)),
            stale: !(fresh(st.last_authority_ms) && peer_ok),
        }
    }

    /// Monotonic ms since the agent started (tokio's clock, so tests may pause it).
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Bumps the whole-view index only (a change that touches no service or member list),
    /// waking blocking queries on `/v1/services` and `/v1/agent/self`.
    pub fn bump_index(&self) {
        self.index.bump();
    }

    /// Current whole-view index.
    pub fn view_index(&self) -> u64 {
        self.index.current()
    }

    /// `stale`: no authority contact or no mesh peer within the staleness budget.
    pub fn is_stale(&self) -> bool {
        let now = self.now_ms();
        let budget = self.cfg.raw.api.staleness_budget_ms;
        let st = self.status.lock().expect("status lock");
        let fresh = |t: Option<u64>| t.is_some_and(|t| now.saturating_sub(t) <= budget);
        let peer_ok = fresh(st.last_peer_ms) || self.cfg.raw.seeds.is_empty();
        !(fresh(st.last_authority_ms) && peer_ok)
    }

    /// Age of the data served, ms: 0 while peers are connected; else since the last peer
    /// contact, or since the persisted snapshot was written when none was ever reached.
    pub fn snapshot_age_ms(&self) -> u64 {
        let now = self.now_ms();
        let st = self.status.lock().expect("status lock");
        snapshot_age(now, &st)
    }

    /// Ms since the last authority contact (`None`: never).
    pub fn authority_age_ms(&self) -> Option<u64> {
        let now = self.now_ms();
        let st = self.status.lock().expect("status lock");
        st.last_authority_ms.map(|t| now.saturating_sub(t))
    }
}

/// [`Shared::snapshot_age_ms`] at `now` (monotonic ms) from `st`.
fn snapshot_age(now: u64, st: &Status) -> u64 {
    if let Some(t) = st.last_peer_ms {
        return now.saturating_sub(t);
    }
    if let Some(w) = st.loaded_snapshot_written {
        return SystemTime::now()
            .duration_since(w)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
    }
    now
}

/// Liveness for API views: SWIM-derived node liveness plus this agent's local ejections.
pub struct ViewLiveness<'a, L: Liveness> {
    /// Mesh liveness.
    pub mesh: L,
    /// Ejections.
    pub ejections: &'a HashMap<(InstanceId, Generation), u64>,
    /// Now, monotonic ms.
    pub now_ms: u64,
}

impl<L: Liveness> Liveness for ViewLiveness<'_, L> {
    fn is_down(&self, node: &NodeId) -> bool {
        self.mesh.is_down(node)
    }
    fn is_ejected(&self, instance: &InstanceId, generation: Generation) -> bool {
        // Usually empty: skip the key's clone and hash.
        !self.ejections.is_empty()
            && self
                .ejections
                .get(&(instance.clone(), generation))
                .is_some_and(|until| *until > self.now_ms)
    }
}

/// When this agent applied one endpoint's lifecycle record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApplyTime {
    /// Generation of the applied record.
    pub generation: Generation,
    /// Revision of the applied record.
    pub revision: Revision,
    /// This agent's wall clock (Unix ms) when the driver saw the record applied.
    pub applied_at_ms: u64,
}

/// Apply times of the endpoints' current lifecycle records, keyed by (service, instance).
///
/// Why: drain propagation is measured per agent as "authority commit -> this agent applied
/// it", and the commit time travels in the record but the apply time exists only here. The
/// sans-IO core never reads a clock, so the driver stamps each `LifecycleApplied` event.
///
/// Bounded twice: an entry goes when its endpoint becomes a tombstone (EXPIRED), the driver
/// drops entries the catalog no longer holds ([`ApplyTimes::retain_held`]), and inserts past
/// [`MAX_APPLY_TIMES`] are refused. Records installed from a full snapshot (join, boot from
/// disk) raise no per-record event and have no apply time.
///
/// Persistent maps (`imbl`), per service then per instance: [`Shared::view`] holds a copy
/// that costs O(1) to take, and a lookup borrows its keys (no clone per answered endpoint).
#[derive(Debug, Clone, Default)]
pub struct ApplyTimes {
    by_service: imbl::HashMap<ServiceKey, imbl::HashMap<InstanceId, ApplyTime>>,
    len: usize,
}

impl ApplyTimes {
    /// Records that `rec` was applied at `applied_at_ms` (Unix ms). EXPIRED removes the entry.
    /// Returns false when the map is full and the time was dropped.
    pub fn record(&mut self, rec: &LifecycleRecord, applied_at_ms: u64) -> bool {
        let held = self
            .by_service
            .get(&rec.key)
            .is_some_and(|m| m.contains_key(&rec.instance));
        if rec.state == LifecycleState::Expired {
            if held {
                let now_empty = self.by_service.get_mut(&rec.key).is_some_and(|m| {
                    m.remove(&rec.instance);
                    m.is_empty()
                });
                if now_empty {
                    self.by_service.remove(&rec.key);
                }
                self.len -= 1;
            }
            return true;
        }
        if self.len >= MAX_APPLY_TIMES && !held {
            return false;
        }
        let t = ApplyTime {
            generation: rec.generation,
            revision: rec.revision,
            applied_at_ms,
        };
        self.by_service
            .entry(rec.key.clone())
            .or_default()
            .insert(rec.instance.clone(), t);
        if !held {
            self.len += 1;
        }
        true
    }

    /// The apply time of the record `(generation, revision)` of an endpoint; `None` when this
    /// agent did not see that exact record applied (e.g. it came in a snapshot).
    pub fn applied_at_ms(
        &self,
        key: &ServiceKey,
        instance: &InstanceId,
        generation: Generation,
        revision: Revision,
    ) -> Option<u64> {
        let t = self.by_service.get(key)?.get(instance)?;
        (t.generation == generation && t.revision == revision).then_some(t.applied_at_ms)
    }

    /// Drops entries whose endpoint the catalog no longer holds (or holds as a tombstone).
    pub fn retain_held(&mut self, catalog: &Catalog) {
        let held = |key: &ServiceKey, instance: &InstanceId| {
            catalog
                .entry(key, instance)
                .is_some_and(|e| e.lifecycle().record.state != LifecycleState::Expired)
        };
        let mut len = 0;
        self.by_service = self
            .by_service
            .iter()
            .filter_map(|(key, times)| {
                let kept: imbl::HashMap<InstanceId, ApplyTime> = times
                    .iter()
                    .filter(|(instance, _)| held(key, instance))
                    .map(|(instance, t)| (instance.clone(), *t))
                    .collect();
                len += kept.len();
                (!kept.is_empty()).then(|| (key.clone(), kept))
            })
            .collect();
        self.len = len;
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Records when this agent applied `r` (wall clock, Unix ms) and the watch lag since the
/// authority committed it.
fn stamp_apply_time(times: &mut ApplyTimes, r: &LifecycleRecord) {
    let wall_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    if !times.record(r, wall_ms) {
        metrics::counter!("shoal_apply_times_dropped_total").increment(1);
    }
    let lag_ms = wall_ms.saturating_sub(r.committed_at_ms);
    metrics::histogram!("shoal_watch_lag_seconds").record(lag_ms as f64 / 1000.0);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use shoal_catalog::testkit::Fixture;

    use super::*;

    #[test]
    fn apply_times_follow_the_current_record_and_leave_with_the_endpoint() {
        let fx = Fixture::new();
        let web = InstanceId::new("web-1").unwrap();
        let ready = fx.lifecycle("web-1", 1, 1, LifecycleState::Ready);
        let draining = fx.lifecycle("web-1", 1, 2, LifecycleState::Draining);
        let mut times = ApplyTimes::default();
        assert!(times.record(&ready.record, 1_000));
        assert!(times.record(&draining.record, 1_250));
        // Only the exact record applied has a time; the superseded one has none.
        let at = |rev| times.applied_at_ms(&fx.key, &web, Generation(1), Revision(rev));
        assert_eq!((at(2), at(1)), (Some(1_250), None));

        // The catalog holds it: kept. The catalog lost it: dropped.
        let mut catalog = Catalog::new();
        let merged = catalog.apply_lifecycle(Arc::new(draining), &fx.keyring);
        assert_eq!(merged, shoal_catalog::MergeOutcome::Applied);
        times.retain_held(&catalog);
        assert_eq!(times.len(), 1);
        times.retain_held(&Catalog::new());
        assert!(times.is_empty());

        // EXPIRED (a tombstone, out of every view) removes the entry.
        assert!(times.record(&ready.record, 1_000));
        let expired = fx.lifecycle("web-1", 1, 3, LifecycleState::Expired);
        assert!(times.record(&expired.record, 2_000));
        assert!(times.is_empty());
    }
}
