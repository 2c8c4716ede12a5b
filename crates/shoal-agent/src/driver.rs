//! The driver: one tokio task feeds the sans-IO [`Mesh`](shoal_mesh::Mesh) and drains its outputs.
//!
//! The mesh plumbing is `shoal_runtime::io::MeshIo`, shared with the authority's embedded
//! member: every input is followed by draining transmits (send errors counted), timers (its
//! timer queue, on tokio's clock so tests can pause it) and events. What is the agent's own:
//! * transport inbound: authority RPC stream kinds are handled here (dev authority, replies to
//!   our calls); everything else goes to the mesh;
//! * [`DriverCmd`]s from the API, probes and the join task;
//! * what events do to the shared state: status, blocking-query indexes, metrics;
//! * persistence of the catalog snapshot and the address book (`members.json`).
//!
//! Monotonic ms are measured from `Shared::origin`, taken at start.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use metrics::counter;
use shoal_catalog::snapshot::{self, Snapshot, SnapshotScope};
use shoal_mesh::{Command, MembershipEvent, MeshEvent};
use shoal_proto::envelope::{self, MessageKind, MAX_STREAM_MESSAGE_BYTES};
use shoal_proto::rpc::{AuthorityError, AuthorityOk, AuthorityReply, AuthorityRequest};
use shoal_proto::{HealthStatus, InstanceId, LifecycleState};
use shoal_runtime::boot::BootFile;
use shoal_runtime::clock::MonoClock;
use shoal_runtime::io::MeshIo;
use shoal_runtime::members_file;
use shoal_transport::transport::{Channel as TChannel, Inbound, Transport};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::dev_authority::DevAuthority;
use crate::persist;
use crate::state::{DriverCmd, Shared};

/// Most authority RPCs in flight; more are refused at once.
pub const MAX_PENDING_RPCS: usize = 1_024;

type Pending = HashMap<u64, (u64, oneshot::Sender<Result<AuthorityOk, AuthorityError>>)>;

/// The driver task's state.
pub struct Driver {
    shared: Arc<Shared>,
    io: MeshIo,
    inbound: mpsc::Receiver<Inbound>,
    cmds: mpsc::Receiver<DriverCmd>,
    dev: Option<DevAuthority>,
    pending: Pending,
    persist_failed_logged: bool,
    join_wanted: tokio::sync::watch::Sender<u64>,
}

impl Driver {
    /// Builds the driver. `boot_file` is the agent's boot file as opened at start: every boot
    /// generation the mesh renews itself to is written to it before it is announced.
    /// `join_wanted` is bumped whenever the membership goes idle so the join task starts a new
    /// backoff series.
    pub fn new(
        shared: Arc<Shared>,
        transport: Transport,
        boot_file: BootFile,
        inbound: mpsc::Receiver<Inbound>,
        cmds: mpsc::Receiver<DriverCmd>,
        dev: Option<DevAuthority>,
        join_wanted: tokio::sync::watch::Sender<u64>,
    ) -> Self {
        let io = MeshIo::new(transport, MonoClock::new(shared.origin)).with_boot_file(boot_file);
        Self {
            shared,
            io,
            inbound,
            cmds,
            dev,
            pending: HashMap::new(),
            persist_failed_logged: false,
            join_wanted,
        }
    }

    /// Runs until `shutdown` resolves, then leaves gracefully, persists and closes.
    ///
    /// One `Sleep` serves every deadline of the loop: it is re-armed only when the earliest
    /// deadline moved, not rebuilt on every input. The agent's housekeeping (the tick and the
    /// periodic persist) has no wake-up of its own while the mesh keeps waking the driver: it
    /// runs after whatever woke the driver once it is due, and the sleep waits for it alone
    /// only [`HOUSEKEEPING_SLACK`] past its due time (see [`Housekeeping`]).
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let now = self.shared.now_ms();
        self.with_mesh(|m| m.start(now));
        self.restore_known(now);
        let persist_every = Duration::from_millis(self.shared.cfg.raw.persist.interval_ms);
        let mut chores = Housekeeping::new(Instant::now(), persist_every);
        let sleep = tokio::time::sleep_until(Instant::now());
        tokio::pin!(sleep);
        // The deadline the sleep is armed for; `None` once it fired (it must be re-armed).
        let mut armed: Option<Instant> = None;
        loop {
            self.housekeeping(&mut chores);
            let mesh_at = self.io.next_deadline();
            let wake = mesh_at.map_or(chores.latest(), |at| at.min(chores.latest()));
            if armed != Some(wake) {
                sleep.as_mut().reset(wake);
                armed = Some(wake);
            }
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(msg) = self.inbound.recv() => self.on_inbound(msg),
                Some(cmd) = self.cmds.recv() => self.on_cmd(cmd),
                () = &mut sleep => {
                    armed = None;
                    if mesh_at.is_some_and(|at| at <= Instant::now()) {
                        self.fire_timers();
                    }
                }
            }
        }
        self.shutdown().await;
    }

    /// Runs the tick and the periodic persist when they are due.
    fn housekeeping(&mut self, chores: &mut Housekeeping) {
        let now = Instant::now();
        if chores.tick_due(now) {
            self.on_tick();
        }
        if chores.persist_due(now) {
            self.persist();
        }
    }

    /// Feeds one input to the shared mesh under its write lock, drains its outputs there and
    /// does the IO (sends, timers, events) after releasing the lock.
    fn with_mesh<R>(
        &mut self,
        f: impl FnOnce(&mut shoal_mesh::Mesh<shoal_catalog::Keyring>) -> R,
    ) -> R {
        let (r, out) = {
            let mut mesh = self.shared.mesh.write().expect("mesh lock");
            let r = f(&mut mesh);
            (r, MeshIo::collect(&mut mesh))
        };
        let events = self.io.dispatch(out);
        // Publish what changed before any index moves (in `on_event`), so a blocking query
        // woken by a change reads a view that holds it.
        self.shared.publish_view(&events);
        for e in events {
            self.on_event(e);
        }
        r
    }

    fn fire_timers(&mut self) {
        let now = self.shared.now_ms();
        self.with_mesh(|m| m.handle_timeout(now));
    }

    fn on_inbound(&mut self, msg: Inbound) {
        let now = self.shared.now_ms();
        if msg.channel == TChannel::Stream {
            match envelope::decode_header(&msg.bytes, MAX_STREAM_MESSAGE_BYTES) {
                Ok((MessageKind::AuthorityRequest, _)) => return self.on_authority_request(msg),
                Ok((MessageKind::AuthorityReply, _)) => return self.on_authority_reply(&msg.bytes),
                _ => {}
            }
        }
        self.with_mesh(|m| MeshIo::feed_inbound(m, now, &msg));
    }

    fn on_authority_request(&mut self, msg: Inbound) {
        let now = self.shared.now_ms();
        let req: AuthorityRequest = match envelope::decode(
            &msg.bytes,
            MessageKind::AuthorityRequest,
            MAX_STREAM_MESSAGE_BYTES,
        ) {
            Ok(r) => r,
            Err(e) => {
                crate::metrics::rejected("authority_rpc", e.as_label());
                return;
            }
        };
        if req.body.is_write() {
            self.dev_catch_up();
        }
        let result = match self.dev.as_mut() {
            Some(dev) => dev.handle_request(
                msg.peer.node_id.clone(),
                req.request_id,
                req.body,
                req.on_behalf_of.map(shoal_proto::rpc::LocalCaller::bounded),
                now,
            ),
            None => Err(AuthorityError::NotLeader { leader: None }),
        };
        if let Ok(AuthorityOk::Committed { records }) = &result {
            let lifecycle = records.iter().cloned().map(Arc::new).collect();
            let r = self.with_mesh(|m| m.handle_command(now, Command::Publish { lifecycle }));
            mesh_refused(r);
        }
        let reply = AuthorityReply {
            request_id: req.request_id,
            result,
        };
        if let Ok(bytes) = envelope::encode(
            MessageKind::AuthorityReply,
            &reply,
            MAX_STREAM_MESSAGE_BYTES,
        ) {
            let _ = self.io.send_stream(msg.from, bytes);
        }
    }

    /// Lets the dev authority (if any) see what the mesh holds of its region before a write
    /// (`DevAuthority::catch_up`; a pass over the catalog's entries, so writes only).
    fn dev_catch_up(&mut self) {
        let Some(dev) = self.dev.as_mut() else {
            return;
        };
        let mesh = self.shared.mesh.read().expect("mesh lock");
        dev.catch_up(crate::dev_authority::HeldByMesh::of(
            mesh.catalog(),
            &self.shared.cfg.region,
        ));
    }

    fn on_authority_reply(&mut self, bytes: &[u8]) {
        let reply: AuthorityReply =
            match envelope::decode(bytes, MessageKind::AuthorityReply, MAX_STREAM_MESSAGE_BYTES) {
                Ok(r) => r,
                Err(e) => {
                    crate::metrics::rejected("authority_rpc", e.as_label());
                    return;
                }
            };
        match self.pending.remove(&reply.request_id) {
            Some((_, tx)) => {
                let _ = tx.send(reply.result);
            }
            None => crate::metrics::rejected("authority_rpc", "unknown_request_id"),
        }
    }

    fn on_cmd(&mut self, cmd: DriverCmd) {
        let now = self.shared.now_ms();
        match cmd {
            DriverCmd::Mesh(c) => mesh_refused(self.with_mesh(|m| m.handle_command(now, c))),
            DriverCmd::MeshAck(c, done) => {
                mesh_refused(self.with_mesh(|m| m.handle_command(now, c)));
                let _ = done.send(());
            }
            DriverCmd::Join(seeds) => {
                if !seeds.is_empty() {
                    self.with_mesh(|m| m.join(now, &seeds));
                }
            }
            DriverCmd::PersistNow => self.persist(),
            DriverCmd::Authority {
                to,
                request_id,
                body,
                on_behalf_of,
                reply,
            } => match (to, self.dev.as_mut()) {
                (None, Some(_)) => {
                    if body.is_write() {
                        self.dev_catch_up();
                    }
                    let dev = self.dev.as_mut().expect("matched");
                    let result =
                        dev.handle_for(self.shared.cfg.node_id.clone(), body, on_behalf_of);
                    let _ = reply.send(result);
                }
                (None, None) => {
                    let _ = reply.send(Err(AuthorityError::Invalid(
                        "no authority configured".into(),
                    )));
                }
                (Some(addr), _) => self.send_rpc(addr, request_id, body, on_behalf_of, reply, now),
            },
        }
    }

    /// Sends one attempt of call `request_id`. A later attempt of the same call replaces an
    /// earlier one's waiter: a late reply to the earlier attempt answers the later one.
    fn send_rpc(
        &mut self,
        addr: SocketAddr,
        request_id: u64,
        body: shoal_proto::rpc::AuthorityRequestBody,
        on_behalf_of: Option<shoal_proto::rpc::LocalCaller>,
        reply: oneshot::Sender<Result<AuthorityOk, AuthorityError>>,
        now: u64,
    ) {
        if self.pending.len() >= MAX_PENDING_RPCS {
            crate::metrics::rejected("authority_rpc", "too_many_pending");
            return; // the caller's oneshot closes: it sees "unreachable"
        }
        let req = AuthorityRequest {
            request_id,
            body,
            on_behalf_of,
        };
        // On any failure the reply sender is dropped: the caller sees "unreachable".
        if let Ok(bytes) = envelope::encode(
            MessageKind::AuthorityRequest,
            &req,
            MAX_STREAM_MESSAGE_BYTES,
        ) {
            if self.io.send_stream(addr, bytes).is_ok() {
                self.pending.insert(request_id, (now, reply));
            }
        }
    }

    fn on_event(&mut self, e: MeshEvent) {
        let shared = self.shared.clone();
        let now = shared.now_ms();
        match e {
            MeshEvent::Membership(m) => {
                match &m {
                    MembershipEvent::Up(id) => {
                        tracing::info!(node = %id.node, addr = %id.addr, boot = id.boot.0, "member up");
                        shared.status.lock().expect("status").last_peer_ms = Some(now);
                        shared.record_member_change(&id.node, now);
                    }
                    MembershipEvent::Down(id) => {
                        tracing::info!(node = %id.node, addr = %id.addr, boot = id.boot.0, "member down");
                        shared.record_member_change(&id.node, now);
                    }
                    MembershipEvent::Active => {
                        tracing::info!("membership active");
                        let mut st = shared.status.lock().expect("status");
                        st.active = true;
                        st.last_peer_ms = Some(now);
                    }
                    MembershipEvent::Idle => {
                        tracing::warn!("membership idle: no live peer; rejoining");
                        shared.status.lock().expect("status").active = false;
                        counter!("shoal_reconnects_total", "what" => "mesh").increment(1);
                        self.join_wanted.send_modify(|v| *v += 1);
                    }
                    MembershipEvent::Rejoined { old, new } => {
                        tracing::warn!(
                            old = old.boot.0,
                            new = new.boot.0,
                            "declared down; rejoined"
                        );
                        counter!("shoal_reconnects_total", "what" => "rejoin").increment(1);
                    }
                    MembershipEvent::Defunct => tracing::info!("left the mesh"),
                }
                shared.index.bump_members();
                if let MembershipEvent::Up(id) | MembershipEvent::Down(id) = &m {
                    let keys = services_on_node(&shared, &id.node);
                    if !keys.is_empty() {
                        shared.index.bump_services(keys.iter());
                    }
                }
            }
            MeshEvent::LifecycleApplied(rec) => {
                // Its apply time was stamped and published by `publish_view`, before this bump.
                let r = &rec.record;
                counter!("shoal_lifecycle_transitions_total", "to" => r.state.as_str())
                    .increment(1);
                shared.index.bump_services([&r.key]);
            }
            MeshEvent::HealthApplied(h) => {
                if h.record.status == HealthStatus::Failing {
                    counter!("shoal_health_flaps_total").increment(1);
                }
                shared.index.bump_services([&h.record.key]);
            }
            MeshEvent::SnapshotInstalled { records } => {
                tracing::info!(records, "full snapshot installed");
                shared.index.bump_everything();
            }
        }
    }

    fn on_tick(&mut self) {
        let shared = self.shared.clone();
        let now = shared.now_ms();
        // Expired ejections change views.
        let expired: Vec<InstanceId> = {
            let mut ej = shared.ejections.lock().expect("ejections");
            let mut gone = Vec::new();
            ej.retain(|(instance, _), until| {
                let keep = *until > now;
                if !keep {
                    gone.push(instance.clone());
                }
                keep
            });
            if !gone.is_empty() {
                shared.publish_ejections(&ej);
            }
            gone
        };
        if !expired.is_empty() {
            let keys = services_of_instances(&shared, &expired);
            shared.index.bump_services(keys.iter());
        }
        // Expired RPCs.
        let timeout = shared.cfg.raw.authority.rpc_timeout_ms;
        self.pending
            .retain(|_, (at, _)| now.saturating_sub(*at) <= timeout * 2);
        let mesh = shared.mesh.read().expect("mesh lock");
        if mesh.membership().num_members() > 0 {
            shared.status.lock().expect("status").last_peer_ms = Some(now);
        }
        if self.dev.is_some() {
            shared.status.lock().expect("status").last_authority_ms = Some(now);
        }
        shared.tidy_view(&mesh);
        drop(mesh);
        // The other counters and gauges are copied at scrape time (`crate::metrics::render`).
        counter!("shoal_mesh_send_errors_total").absolute(self.io.send_errors());
        if let Some(boot) = self.io.boot_file() {
            let c = boot.counters();
            counter!("shoal_persist_total", "what" => "boot", "result" => "ok").absolute(c.writes);
            counter!("shoal_persist_total", "what" => "boot", "result" => "error")
                .absolute(c.write_errors);
        }
    }

    fn persist(&mut self) {
        let shared = self.shared.clone();
        let (bytes, members) = {
            let mesh = shared.mesh.read().expect("mesh lock");
            let snap = Snapshot::of(
                mesh.catalog(),
                SnapshotScope::Catalog,
                shared.cfg.region.clone(),
            );
            let members = members_file::export_book(&mesh, shared.now_ms());
            (snapshot::encode(&snap), members)
        };
        let dir = &shared.cfg.raw.data_dir;
        // Unchanged files are not rewritten (persist::Persisted).
        let result = shared
            .persisted
            .lock()
            .expect("persisted")
            .write(dir, &bytes, &members);
        let mut st = shared.status.lock().expect("status");
        match result {
            Ok(_) => {
                counter!("shoal_persist_total", "result" => "ok").increment(1);
                st.persisted_at = Some(SystemTime::now());
                st.persist_error = None;
                self.persist_failed_logged = false;
            }
            Err(e) => {
                counter!("shoal_persist_total", "result" => "error").increment(1);
                if !self.persist_failed_logged {
                    tracing::error!(error = %e, dir = %dir.display(), "cannot persist snapshot; still serving");
                    self.persist_failed_logged = true;
                }
                st.persist_error = Some(e.to_string());
            }
        }
    }

    /// Puts the address book the previous process persisted back into the membership. A torn
    /// or corrupt file is logged, counted and ignored (the seeds still work).
    fn restore_known(&mut self, now: u64) {
        let dir = self.shared.cfg.raw.data_dir.clone();
        match persist::read_members_checked(&dir) {
            Ok(members) if members.is_empty() => {}
            Ok(members) => {
                let addresses = members_file::to_known(&members);
                tracing::info!(
                    addresses = members.len(),
                    "address book restored from members.json"
                );
                self.with_mesh(|m| m.restore_known(now, &addresses));
            }
            Err(e) => {
                counter!("shoal_members_file_refused_total").increment(1);
                tracing::error!(error = %e, dir = %dir.display(), "persisted member list refused; starting from the seeds");
            }
        }
    }

    async fn shutdown(mut self) {
        tracing::info!("shutting down: leaving the mesh");
        let now = self.shared.now_ms();
        self.with_mesh(|m| m.leave(now));
        self.persist();
        self.io.close().await;
    }
}

/// The agent's own periodic work, ms apart: `Driver::on_tick` (expired ejections and RPCs,
/// status, metrics, view tidying).
pub const TICK: Duration = Duration::from_millis(500);

/// How long past its due time housekeeping may wait for a wake-up it can share. An idle agent in
/// a region still wakes for every SWIM probe (500 ms) and for the probes and anti-entropy of
/// others, so the tick and the persist usually run right after one of those instead of waking
/// the process for themselves (issue 19: each idle wake-up costs ~35-40 us of CPU); the mesh's
/// idle timers (gossip, IHAVE, settled probes, the reconnect tick) no longer wake it at all
/// (`MeshConfig::park_idle_timers`). An agent with no member wakes for housekeeping on its own,
/// at most this much after it is due. Nothing in them is
/// timing-critical: an ejection ends, an RPC times out or the snapshot is written at most this
/// much later. The mesh's own timers are never delayed.
pub const HOUSEKEEPING_SLACK: Duration = Duration::from_millis(250);

/// Due times of the driver's housekeeping (see [`HOUSEKEEPING_SLACK`]).
#[derive(Debug, Clone, Copy)]
pub struct Housekeeping {
    tick_at: Instant,
    persist_at: Instant,
    persist_every: Duration,
}

impl Housekeeping {
    /// The first tick is due at `now`, the first persist one `persist_every` later.
    pub fn new(now: Instant, persist_every: Duration) -> Self {
        Self {
            tick_at: now,
            persist_at: now + persist_every,
            persist_every,
        }
    }

    /// True (and the next tick scheduled [`TICK`] from `now`) when the tick is due.
    pub fn tick_due(&mut self, now: Instant) -> bool {
        let due = now >= self.tick_at;
        if due {
            self.tick_at = now + TICK;
        }
        due
    }

    /// True (and the next persist scheduled) when the periodic persist is due.
    pub fn persist_due(&mut self, now: Instant) -> bool {
        let due = now >= self.persist_at;
        if due {
            self.persist_at = now + self.persist_every;
        }
        due
    }

    /// The latest the driver may sleep until: the earliest due time plus the slack.
    pub fn latest(&self) -> Instant {
        self.tick_at.min(self.persist_at) + HOUSEKEEPING_SLACK
    }
}

/// True when a lifecycle state withdraws an endpoint from new traffic (DRAINING, EXPIRED);
/// used for metrics of removed endpoints.
pub fn is_withdrawn(state: LifecycleState) -> bool {
    matches!(state, LifecycleState::Draining | LifecycleState::Expired)
}

/// The services with endpoints owned by `node` (their views change when it goes up or down).
fn services_on_node(shared: &Shared, node: &shoal_proto::NodeId) -> Vec<shoal_proto::ServiceKey> {
    let mesh = shared.mesh.read().expect("mesh lock");
    let mut keys: Vec<_> = mesh
        .catalog()
        .entries()
        .filter(|(_, _, e)| e.lifecycle().record.owner == *node)
        .map(|(k, _, _)| k.clone())
        .collect();
    keys.dedup();
    keys
}

/// The services holding any of `instances` (their views change when an ejection ends).
fn services_of_instances(
    shared: &Shared,
    instances: &[InstanceId],
) -> Vec<shoal_proto::ServiceKey> {
    let mesh = shared.mesh.read().expect("mesh lock");
    let mut keys: Vec<_> = mesh
        .catalog()
        .entries()
        .filter(|(_, i, _)| instances.contains(i))
        .map(|(k, _, _)| k.clone())
        .collect();
    keys.dedup();
    keys
}

/// A command the core refused: logged at debug (callers see the outcome in the catalog) and
/// counted in `shoal_rejected_inputs_total{source="mesh_command",reason="refused"}`.
fn mesh_refused(r: Result<(), shoal_mesh::Refusal>) {
    if let Err(r) = r {
        tracing::debug!(?r, "mesh refused a command");
        crate::metrics::rejected("mesh_command", "refused");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn housekeeping_is_due_on_time_and_never_waits_past_its_slack() {
        let t0 = Instant::now();
        let persist_every = Duration::from_secs(10);
        let mut h = Housekeeping::new(t0, persist_every);
        // The first tick is due at once; the persist only after its interval.
        assert!(h.tick_due(t0));
        assert!(!h.tick_due(t0), "a tick runs once per period");
        assert!(!h.persist_due(t0));
        assert_eq!(h.latest(), t0 + TICK + HOUSEKEEPING_SLACK);
        // A wake-up inside the slack runs the tick and schedules the next from then.
        let late = t0 + TICK + Duration::from_millis(100);
        assert!(h.tick_due(late));
        assert_eq!(h.latest(), late + TICK + HOUSEKEEPING_SLACK);
        let at = t0 + persist_every;
        assert!(h.persist_due(at));
        assert!(!h.persist_due(at));
    }
}
