//! The replica's embedded mesh member: an ordinary member of the region's SWIM mesh, driven
//! over its own shoal-transport endpoint (`mesh_addr`; SWIM as datagrams, records as stream
//! messages) by the same plumbing as the agent's (`shoal_runtime`: `MeshIo`, join backoff,
//! boot file, address book).
//!
//! It gives the replica two things:
//! - a **liveness view** ([`MeshView`]: which nodes are alive, which went down and when, on
//!   this process's monotonic clock) that the leader turns into `NodeDown` / `NodeUp`
//!   proposals (see `server`), so the lease safety net has an input;
//! - a **publishing path**: every signed lifecycle record the replica applies is handed to
//!   [`MemberHandle::publish`] and disseminated by the mesh even if the requesting agent died.
//!
//! Like an agent, the member persists its address book (`members.json` in the data dir, every
//! [`BOOK_PERSIST_MS`] and at shutdown) and reads it back at start, so a restarted replica
//! finds the region even when its configured seeds are gone.
//!
//! Every replica runs one (a new leader starts with a warm view). The member never signs
//! anything: its node key is random per process and it reports no health. It verifies
//! lifecycle records against the region key like any agent.
//!
//! Bounds: the command queue ([`MEMBER_QUEUE`]) drops and counts on overflow; the down map
//! holds at most [`MAX_TRACKED_DOWN`] nodes (further ones counted and ignored); the mesh core
//! bounds its own queues; bad input is counted by the mesh and the transport, never fatal.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use metrics::{counter, gauge};
use shoal_catalog::Keyring;
use shoal_mesh::{Command, MemberId, MembershipEvent, Mesh, MeshConfig, MeshEvent};
use shoal_proto::envelope::MAX_STREAM_MESSAGE_BYTES;
use shoal_proto::{NodeId, Region, SignedLifecycle, SigningKey, Zone};
use shoal_runtime::boot::{random_u64, BootFile, Jitter};
use shoal_runtime::clock::MonoClock;
use shoal_runtime::io::MeshIo;
use shoal_runtime::join::{resolve_seeds, Backoff};
use shoal_runtime::members_file;
use shoal_transport::transport::{Inbound, Transport, TransportConfig};
use tokio::sync::{mpsc, oneshot, Notify};

/// Capacity of the queue of commands (publishes, joins) to the member's driver.
pub const MEMBER_QUEUE: usize = 1_024;
/// Most down nodes tracked in the view.
pub const MAX_TRACKED_DOWN: usize = 65_536;
/// File in the data dir holding the member's last boot generation.
pub const BOOT_FILE: &str = "mesh.boot";
/// Period of the address-book write (`members.json`), ms; the agent's default snapshot period.
pub const BOOK_PERSIST_MS: u64 = 10_000;
/// Ceiling of the first join backoff, ms.
pub const JOIN_BASE_MS: u64 = 100;
/// Persisted members tried as extra join seeds at each attempt (the freshest first).
pub const BOOK_SEEDS: usize = 16;

/// What the leader reads of the member's view of the region.
#[derive(Debug, Clone, Default)]
pub struct MeshView {
    /// At least one live member knows us (SWIM `Active`, not `Idle`).
    pub active: bool,
    /// Monotonic ms (replica clock) since when `active` has held; `None` while not active.
    pub active_since_ms: Option<u64>,
    /// Nodes alive (or suspect) in our view.
    pub alive: BTreeSet<NodeId>,
    /// Nodes our view saw go down, with the replica-monotonic ms when it did.
    pub down: BTreeMap<NodeId, u64>,
}

/// Everything the member needs (built from the replica config by `server`).
#[derive(Debug, Clone)]
pub struct MemberSettings {
    /// Listen address of the member's transport.
    pub listen: SocketAddr,
    /// Seeds `host:port` (agent addresses), resolved at every join attempt.
    pub seeds: Vec<String>,
    /// Region.
    pub region: Region,
    /// Zone announced for this member.
    pub zone: Zone,
    /// Mesh tuning (must roughly match the agents' SWIM timings).
    pub mesh: MeshConfig,
    /// Trusted keys (the region key; node keys when configured).
    pub keyring: Keyring,
    /// Region CA, node certificate and key, shared with the replica's other transports (a
    /// SIGHUP reload applies to all of them).
    pub tls: shoal_transport::tls::TlsState,
    /// Longest pause between join attempts while not active, ms.
    pub join_max_ms: u64,
    /// Where the address book (`members.json`) is kept: the replica's data dir.
    pub data_dir: PathBuf,
}

enum MemberCmd {
    Publish(Vec<Arc<SignedLifecycle>>),
    /// Summaries of these services for other regions (ADR 0013), built at this wall ms.
    Summaries(
        Vec<shoal_proto::ServiceKey>,
        u64,
        oneshot::Sender<Vec<shoal_proto::RegionSummary>>,
    ),
    Join(Vec<SocketAddr>),
    Stop(oneshot::Sender<()>),
}

/// A handle on the running member (cheap to clone).
#[derive(Clone, Debug)]
pub struct MemberHandle {
    tx: mpsc::Sender<MemberCmd>,
    view: Arc<Mutex<MeshView>>,
    changed: Arc<Notify>,
    node: NodeId,
    addr: SocketAddr,
}

impl std::fmt::Debug for MemberCmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Publish(r) => write!(f, "Publish({})", r.len()),
            Self::Join(s) => write!(f, "Join({s:?})"),
            Self::Summaries(k, _, _) => write!(f, "Summaries({})", k.len()),
            Self::Stop(_) => write!(f, "Stop"),
        }
    }
}

impl MemberHandle {
    /// Queues signed lifecycle records for dissemination. Never blocks: when the queue is full
    /// the batch is dropped and counted (`shoal_authority_mesh_dropped_total{queue="publish"}`;
    /// mesh anti-entropy and the requesting agent still carry the records). Returns whether
    /// the batch was queued.
    pub fn publish(&self, records: Vec<SignedLifecycle>) -> bool {
        if records.is_empty() {
            return true;
        }
        let n = records.len() as u64;
        let batch = records.into_iter().map(Arc::new).collect();
        match self.tx.try_send(MemberCmd::Publish(batch)) {
            Ok(()) => true,
            Err(_) => {
                counter!("shoal_authority_mesh_dropped_total", "queue" => "publish").increment(n);
                false
            }
        }
    }

    /// Summaries of `keys` in this region from the member's catalog (routable endpoints in
    /// its own SWIM view; see `shoal_catalog::remote::summarize`), built at wall ms
    /// `generated_at_ms`. Empty when the member has stopped or its queue is full (counted).
    pub async fn summaries(
        &self,
        keys: Vec<shoal_proto::ServiceKey>,
        generated_at_ms: u64,
    ) -> Vec<shoal_proto::RegionSummary> {
        let (tx, rx) = oneshot::channel();
        if self
            .tx
            .try_send(MemberCmd::Summaries(keys, generated_at_ms, tx))
            .is_err()
        {
            counter!("shoal_authority_mesh_dropped_total", "queue" => "summaries").increment(1);
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    /// Reads the current view.
    pub fn with_view<R>(&self, f: impl FnOnce(&MeshView) -> R) -> R {
        f(&self.view.lock().expect("mesh view lock"))
    }

    /// Resolves when the membership view changed (at most one wake-up is stored).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// This member's node id.
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// The member's transport address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Leaves the mesh gracefully and closes the transport (bounded wait).
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(MemberCmd::Stop(tx)).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(2), rx).await;
        }
    }
}

/// Bumps the member's boot generation, persisted in `dir/mesh.boot`
/// (`shoal_runtime::boot::bump_boot`: temp file + fsync + rename), so every restart rejoins
/// SWIM with a higher identity, and returns the file: [`start`] hands it to the member's
/// `MeshIo`, which writes every boot the member renews itself to when declared down before
/// announcing it.
///
/// # Errors
/// The file cannot be read as a number (or is larger than
/// `shoal_runtime::boot::MAX_BOOT_FILE_BYTES`, or holds `u64::MAX`) or written.
pub fn bump_boot(dir: &Path) -> anyhow::Result<BootFile> {
    shoal_transport::keyfile::ensure_private_dir(dir)?;
    BootFile::bump(dir, BOOT_FILE).with_context(|| format!("{}", dir.join(BOOT_FILE).display()))
}

/// Binds the transport, creates the mesh core with `identity = (node, listen, boot)` and spawns
/// the driver and join tasks. `origin` is the replica's monotonic clock origin (the view's
/// times are on it, so the leader can propose them as `NodeDown { at_ms }`).
///
/// # Errors
/// The transport cannot be bound (address in use, bad certificates).
pub fn start(
    s: MemberSettings,
    node: NodeId,
    boot_file: BootFile,
    origin: Instant,
) -> anyhow::Result<MemberHandle> {
    let boot = boot_file.generation();
    let mut tc = TransportConfig::with_tls(s.listen, s.tls.clone());
    tc.max_stream_message_bytes = s
        .mesh
        .max_stream_message_bytes
        .min(MAX_STREAM_MESSAGE_BYTES);
    let (transport, inbound) =
        Transport::bind(tc).with_context(|| format!("binding the mesh member on {}", s.listen))?;
    if transport.identity().node_id != node {
        anyhow::bail!(
            "mesh certificate is for {}, expected {node}",
            transport.identity().node_id
        );
    }
    let mut seed = [0u8; 32];
    rand::fill(&mut seed);
    let identity = MemberId {
        node: node.clone(),
        addr: transport.listen_addr(),
        boot,
    };
    let mut mesh_cfg = s.mesh.clone();
    mesh_cfg.record_events = false;
    let mesh = Mesh::new(
        identity.clone(),
        s.region.clone(),
        s.zone.clone(),
        SigningKey::from_seed(seed),
        mesh_cfg,
        s.keyring.clone(),
        random_u64(),
    );
    let (tx, rx) = mpsc::channel(MEMBER_QUEUE);
    let handle = MemberHandle {
        tx: tx.clone(),
        view: Arc::new(Mutex::new(MeshView::default())),
        changed: Arc::new(Notify::new()),
        node,
        addr: identity.addr,
    };
    let driver = MemberDriver {
        mesh,
        io: MeshIo::new(
            transport,
            MonoClock::new(tokio::time::Instant::from_std(origin)),
        )
        .with_boot_file(boot_file),
        view: handle.view.clone(),
        changed: handle.changed.clone(),
        data_dir: s.data_dir.clone(),
        persist_failed_logged: false,
    };
    tokio::spawn(driver.run(inbound, rx));
    let backoff = Backoff {
        base_ms: JOIN_BASE_MS,
        max_ms: s.join_max_ms,
    };
    tokio::spawn(join_loop(
        s.seeds,
        s.data_dir,
        identity.addr,
        backoff,
        tx,
        handle.view.clone(),
    ));
    tracing::info!(node = %identity.node, addr = %identity.addr, boot = boot.0, "embedded mesh member started");
    Ok(handle)
}

/// Joins through the seeds (and the freshest persisted members) with exponential backoff and
/// full jitter ([`Backoff`], as agents do) whenever the member is not active (at start, and
/// again after `Idle`).
async fn join_loop(
    seeds: Vec<String>,
    data_dir: PathBuf,
    me: SocketAddr,
    backoff: Backoff,
    tx: mpsc::Sender<MemberCmd>,
    view: Arc<Mutex<MeshView>>,
) {
    let book_empty = members_file::read_members(&data_dir).is_empty();
    if seeds.is_empty() && book_empty {
        return; // nothing to join: agents that list us as a seed join us
    }
    let mut jitter = Jitter::new();
    let mut attempt: u32 = 0;
    loop {
        let active = view.lock().expect("mesh view lock").active;
        let pause = if active {
            attempt = 0;
            1_000
        } else {
            let extra: Vec<SocketAddr> = members_file::read_members(&data_dir)
                .into_iter()
                .take(BOOK_SEEDS)
                .map(|m| m.addr)
                .collect();
            let addrs = resolve_seeds(&seeds, &extra, me).await;
            if !addrs.is_empty() && tx.send(MemberCmd::Join(addrs)).await.is_err() {
                return;
            }
            let pause = backoff.delay_ms(attempt, &mut jitter);
            attempt = attempt.saturating_add(1);
            pause
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if tx.is_closed() {
            return;
        }
    }
}

struct MemberDriver {
    mesh: Mesh<Keyring>,
    io: MeshIo,
    view: Arc<Mutex<MeshView>>,
    changed: Arc<Notify>,
    data_dir: PathBuf,
    persist_failed_logged: bool,
}

impl MemberDriver {
    fn now_ms(&self) -> u64 {
        self.io.now_ms()
    }

    async fn run(
        mut self,
        mut inbound: mpsc::Receiver<Inbound>,
        mut cmds: mpsc::Receiver<MemberCmd>,
    ) {
        self.pump(|m, now| m.start(now));
        self.restore_book();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let every = Duration::from_millis(BOOK_PERSIST_MS);
        let mut persist = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let stop = loop {
            tokio::select! {
                msg = inbound.recv() => match msg {
                    Some(m) => self.pump(|mesh, now| MeshIo::feed_inbound(mesh, now, &m)),
                    None => break None,
                },
                cmd = cmds.recv() => match cmd {
                    Some(MemberCmd::Publish(lifecycle)) => {
                        self.pump(|m, now| {
                            if let Err(r) = m.handle_command(now, Command::Publish { lifecycle }) {
                                tracing::debug!(?r, "mesh refused a publish");
                                counter!("shoal_authority_mesh_publish_refused_total").increment(1);
                            }
                        });
                    }
                    Some(MemberCmd::Join(seeds)) => {
                        self.pump(|m, now| m.join(now, &seeds));
                    }
                    Some(MemberCmd::Summaries(keys, at_ms, reply)) => {
                        let region = self.mesh.region().clone();
                        let liveness = self.mesh.liveness();
                        let out = keys
                            .iter()
                            .map(|k| shoal_catalog::remote::summarize(
                                self.mesh.catalog(), &region, k, &liveness, at_ms,
                            ))
                            .collect();
                        let _ = reply.send(out);
                    }
                    Some(MemberCmd::Stop(done)) => break Some(done),
                    None => break None,
                },
                () = self.io.timer_due() => self.fire_timers(),
                _ = tick.tick() => self.export_metrics(),
                _ = persist.tick() => self.persist_book(),
            }
        };
        self.pump(|m, now| m.leave(now));
        self.persist_book();
        self.io.close().await;
        if let Some(done) = stop {
            let _ = done.send(());
        }
    }

    fn fire_timers(&mut self) {
        let now = self.now_ms();
        self.pump(|m, _| m.handle_timeout(now));
    }

    /// Feeds one input at the current time, then drains transmits, timers and events.
    fn pump(&mut self, f: impl FnOnce(&mut Mesh<Keyring>, u64)) {
        let ((), events) = self.io.pump(&mut self.mesh, f);
        let mut changed = false;
        for e in events {
            changed |= self.on_event(e);
        }
        if changed {
            self.changed.notify_one();
        }
    }

    /// Puts the address book the previous process persisted back into the membership. A torn
    /// or corrupt file is logged, counted and ignored (the seeds still work).
    fn restore_book(&mut self) {
        match members_file::read_members_checked(&self.data_dir) {
            Ok(members) if members.is_empty() => {}
            Ok(members) => {
                let addresses = members_file::to_known(&members);
                tracing::info!(
                    addresses = members.len(),
                    "embedded member: address book restored from members.json"
                );
                self.pump(|m, now| m.restore_known(now, &addresses));
            }
            Err(e) => {
                counter!("shoal_authority_mesh_members_file_refused_total").increment(1);
                tracing::error!(error = %e, dir = %self.data_dir.display(), "embedded member: persisted member list refused; starting from the seeds");
            }
        }
    }

    /// Writes the address book (`members.json`); a failure is counted and logged once per
    /// failure streak, and never stops the member.
    fn persist_book(&mut self) {
        let members = members_file::export_book(&self.mesh, self.now_ms());
        match members_file::write_book(&self.data_dir, &members) {
            Ok(()) => {
                counter!("shoal_authority_mesh_book_persist_total", "result" => "ok").increment(1);
                self.persist_failed_logged = false;
            }
            Err(e) => {
                counter!("shoal_authority_mesh_book_persist_total", "result" => "error")
                    .increment(1);
                if !self.persist_failed_logged {
                    tracing::error!(error = %e, dir = %self.data_dir.display(), "embedded member: cannot write members.json");
                    self.persist_failed_logged = true;
                }
            }
        }
    }

    /// Applies an event to the view; true when the liveness view changed.
    fn on_event(&mut self, e: MeshEvent) -> bool {
        let now = self.now_ms();
        let mut v = self.view.lock().expect("mesh view lock");
        match e {
            MeshEvent::Membership(MembershipEvent::Up(id)) => {
                tracing::debug!(node = %id.node, addr = %id.addr, "mesh member up");
                v.down.remove(&id.node);
                v.alive.insert(id.node);
                true
            }
            MeshEvent::Membership(MembershipEvent::Down(id)) => {
                tracing::info!(node = %id.node, addr = %id.addr, boot = id.boot.0, "mesh member down");
                // A replacement identity (Down(old) then Up(new)) is still alive.
                if self.mesh.membership().is_down(&id.node)
                    || !self.mesh.membership().members().any(|m| m.node == id.node)
                {
                    v.alive.remove(&id.node);
                    if v.down.contains_key(&id.node) || v.down.len() < MAX_TRACKED_DOWN {
                        v.down.entry(id.node).or_insert(now);
                    } else {
                        counter!("shoal_authority_mesh_dropped_total", "queue" => "down_view")
                            .increment(1);
                    }
                }
                true
            }
            MeshEvent::Membership(MembershipEvent::Active) => {
                tracing::info!("embedded mesh member active");
                v.active = true;
                v.active_since_ms.get_or_insert(now);
                true
            }
            MeshEvent::Membership(MembershipEvent::Idle) => {
                tracing::warn!("embedded mesh member idle: no live peer; rejoining");
                v.active = false;
                v.active_since_ms = None;
                true
            }
            MeshEvent::Membership(MembershipEvent::Rejoined { old, new }) => {
                tracing::warn!(
                    old = old.boot.0,
                    new = new.boot.0,
                    "embedded member declared down; rejoined"
                );
                false
            }
            MeshEvent::Membership(MembershipEvent::Defunct) => {
                v.active = false;
                v.active_since_ms = None;
                true
            }
            MeshEvent::LifecycleApplied(_)
            | MeshEvent::HealthApplied(_)
            | MeshEvent::SnapshotInstalled { .. } => false,
        }
    }

    fn export_metrics(&self) {
        let m = self.mesh.membership().counters();
        gauge!("shoal_authority_mesh_members", "state" => "alive").set(m.members_alive as f64);
        gauge!("shoal_authority_mesh_members", "state" => "down").set(m.members_down as f64);
        gauge!("shoal_authority_mesh_catalog_entries").set(self.mesh.catalog().len() as f64);
        let c = self.mesh.counters();
        counter!("shoal_authority_mesh_overflow_total", "queue" => "outbox")
            .absolute(c.outbox_overflow);
        counter!("shoal_authority_mesh_overflow_total", "queue" => "transmit")
            .absolute(c.transmit_overflow);
        counter!("shoal_authority_mesh_overflow_total", "queue" => "event")
            .absolute(c.event_overflow);
        let merge = self.mesh.catalog().counters();
        counter!("shoal_authority_mesh_rejected_total", "reason" => "bad_signature")
            .absolute(merge.bad_signature);
        counter!("shoal_authority_mesh_rejected_total", "reason" => "conflict")
            .absolute(merge.conflict);
        counter!("shoal_authority_mesh_send_errors_total").absolute(self.io.send_errors());
        if let Some(boot) = self.io.boot_file() {
            let b = boot.counters();
            counter!("shoal_authority_mesh_boot_persist_total", "result" => "ok")
                .absolute(b.writes);
            counter!("shoal_authority_mesh_boot_persist_total", "result" => "error")
                .absolute(b.write_errors);
        }
        let t = self.io.transport_counters();
        counter!("shoal_authority_mesh_transport_dropped_total", "why" => "inbound")
            .absolute(t.inbound_dropped);
        counter!("shoal_authority_mesh_transport_dropped_total", "why" => "queue")
            .absolute(t.queue_overflow);
    }
}
