//! The replica's embedded mesh member: an ordinary member of the region's SWIM mesh, driven by
//! a compact tokio driver over its own shoal-transport endpoint (`mesh_addr`; SWIM as
//! datagrams, records as stream messages).
//!
//! It gives the replica two things:
//! - a **liveness view** ([`MeshView`]: which nodes are alive, which went down and when, on
//!   this process's monotonic clock) that the leader turns into `NodeDown` / `NodeUp`
//!   proposals (see `server`), so the lease safety net has an input;
//! - a **publishing path**: every signed lifecycle record the replica applies is handed to
//!   [`MemberHandle::publish`] and disseminated by the mesh even if the requesting agent died.
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
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use metrics::{counter, gauge};
use shoal_catalog::Keyring;
use shoal_mesh::{
    Channel, Command, MemberId, MembershipEvent, Mesh, MeshConfig, MeshEvent, MeshTimer,
};
use shoal_proto::envelope::MAX_STREAM_MESSAGE_BYTES;
use shoal_proto::{Generation, NodeId, Region, SignedLifecycle, SigningKey, Zone};
use shoal_transport::transport::{Channel as TChannel, Inbound, Transport, TransportConfig};
use tokio::sync::{mpsc, oneshot, Notify};

/// Capacity of the queue of commands (publishes, joins) to the member's driver.
pub const MEMBER_QUEUE: usize = 1_024;
/// Most down nodes tracked in the view.
pub const MAX_TRACKED_DOWN: usize = 65_536;
/// File in the data dir holding the member's last boot generation.
pub const BOOT_FILE: &str = "mesh.boot";

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

/// Bumps and returns the member's boot generation, persisted in `dir/mesh.boot` (temp file +
/// fsync + rename), so every restart rejoins SWIM with a higher identity.
///
/// # Errors
/// The file cannot be read as a number or written.
pub fn bump_boot(dir: &Path) -> anyhow::Result<Generation> {
    let path = dir.join(BOOT_FILE);
    let last = match std::fs::read_to_string(&path) {
        Ok(t) => t
            .trim()
            .parse::<u64>()
            .with_context(|| format!("{} is not a number", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let next = last.saturating_add(1);
    shoal_transport::keyfile::ensure_private_dir(dir)?;
    shoal_transport::keyfile::replace_atomic(&path, next.to_string().as_bytes(), 0o600)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(Generation(next))
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    rand::fill(&mut b);
    u64::from_le_bytes(b)
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
    boot: Generation,
    origin: Instant,
) -> anyhow::Result<MemberHandle> {
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
        transport,
        origin,
        timers: BTreeMap::new(),
        timer_seq: 0,
        view: handle.view.clone(),
        changed: handle.changed.clone(),
    };
    tokio::spawn(driver.run(inbound, rx));
    tokio::spawn(join_loop(
        s.seeds,
        identity.addr,
        s.join_max_ms,
        tx,
        handle.view.clone(),
    ));
    tracing::info!(node = %identity.node, addr = %identity.addr, boot = boot.0, "embedded mesh member started");
    Ok(handle)
}

/// Joins through the seeds with exponential backoff and full jitter whenever the member is
/// not active (at start, and again after `Idle`).
async fn join_loop(
    seeds: Vec<String>,
    me: SocketAddr,
    max_ms: u64,
    tx: mpsc::Sender<MemberCmd>,
    view: Arc<Mutex<MeshView>>,
) {
    if seeds.is_empty() {
        return; // nothing to join: agents that list us as a seed join us
    }
    let mut attempt: u32 = 0;
    loop {
        let active = view.lock().expect("mesh view lock").active;
        if active {
            attempt = 0;
        } else {
            let mut addrs = Vec::new();
            for s in &seeds {
                if let Ok(Ok(a)) = tokio::time::timeout(
                    Duration::from_secs(2),
                    tokio::net::lookup_host(s.as_str()),
                )
                .await
                {
                    addrs.extend(a);
                }
            }
            addrs.retain(|a| *a != me);
            addrs.sort();
            addrs.dedup();
            if !addrs.is_empty() && tx.send(MemberCmd::Join(addrs)).await.is_err() {
                return;
            }
            attempt = attempt.saturating_add(1);
        }
        let ceiling = 100u64
            .saturating_mul(1 << attempt.min(16))
            .clamp(100, max_ms.max(100));
        let pause = if active {
            1_000
        } else {
            ceiling / 2 + random_u64() % (ceiling / 2 + 1)
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if tx.is_closed() {
            return;
        }
    }
}

struct MemberDriver {
    mesh: Mesh<Keyring>,
    transport: Transport,
    origin: Instant,
    timers: BTreeMap<(u64, u64), MeshTimer>,
    timer_seq: u64,
    view: Arc<Mutex<MeshView>>,
    changed: Arc<Notify>,
}

impl MemberDriver {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    async fn run(
        mut self,
        mut inbound: mpsc::Receiver<Inbound>,
        mut cmds: mpsc::Receiver<MemberCmd>,
    ) {
        let now = self.now_ms();
        self.pump(|m| m.start(now));
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let stop = loop {
            let next = self.timers.keys().next().map(|(at, _)| *at);
            let wake = tokio::time::Instant::from_std(
                self.origin + Duration::from_millis(next.unwrap_or(u64::MAX / 4)),
            );
            tokio::select! {
                msg = inbound.recv() => match msg {
                    Some(m) => self.on_inbound(m),
                    None => break None,
                },
                cmd = cmds.recv() => match cmd {
                    Some(MemberCmd::Publish(lifecycle)) => {
                        let now = self.now_ms();
                        self.pump(|m| m.handle_command(now, Command::Publish { lifecycle }));
                    }
                    Some(MemberCmd::Join(seeds)) => {
                        let now = self.now_ms();
                        self.pump(|m| m.handle_command(now, Command::Join { seeds }));
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
                () = tokio::time::sleep_until(wake), if next.is_some() => self.fire_timers(),
                _ = tick.tick() => self.export_metrics(),
            }
        };
        let now = self.now_ms();
        self.pump(|m| m.handle_command(now, Command::Leave));
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.transport.shutdown().await;
        if let Some(done) = stop {
            let _ = done.send(());
        }
    }

    fn on_inbound(&mut self, msg: Inbound) {
        let now = self.now_ms();
        match msg.channel {
            TChannel::Datagram => self.pump(|m| m.handle_datagram(now, msg.from, &msg.bytes)),
            TChannel::Stream => self.pump(|m| m.handle_stream_message(now, msg.from, &msg.bytes)),
        }
    }

    fn fire_timers(&mut self) {
        let now = self.now_ms();
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let token = entry.remove();
            self.pump(|m| m.handle_timer(now, token));
        }
    }

    /// Feeds one input, then drains transmits, timers and events.
    fn pump(&mut self, f: impl FnOnce(&mut Mesh<Keyring>)) {
        f(&mut self.mesh);
        while let Some(t) = self.mesh.poll_transmit() {
            let r = match t.channel {
                Channel::Datagram => self.transport.send_datagram(t.to, t.bytes),
                Channel::Stream => self.transport.send_stream_message(t.to, t.bytes),
            };
            if r.is_err() {
                counter!("shoal_authority_mesh_send_errors_total").increment(1);
            }
        }
        while let Some((at, token)) = self.mesh.poll_timer() {
            self.timer_seq += 1;
            self.timers.insert((at, self.timer_seq), token);
        }
        let mut changed = false;
        while let Some(e) = self.mesh.poll_event() {
            changed |= self.on_event(e);
        }
        if changed {
            self.changed.notify_one();
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
            MeshEvent::Refused(r) => {
                tracing::debug!(?r, "mesh refused a publish");
                counter!("shoal_authority_mesh_publish_refused_total").increment(1);
                false
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
        let t = self.transport.counters();
        counter!("shoal_authority_mesh_transport_dropped_total", "why" => "inbound")
            .absolute(t.inbound_dropped);
        counter!("shoal_authority_mesh_transport_dropped_total", "why" => "queue")
            .absolute(t.queue_overflow);
    }
}

/// Applies `[mesh]` knob overrides to a [`MeshConfig`].
pub fn apply_knobs(mesh: &mut MeshConfig, k: &crate::config::MeshKnobs) {
    let m = &mut mesh.membership;
    if let Some(v) = k.probe_period_ms {
        m.probe_period_ms = v;
    }
    if let Some(v) = k.probe_rtt_ms {
        m.probe_rtt_ms = v;
    }
    if let Some(v) = k.suspect_to_down_after_ms {
        m.suspect_to_down_after_ms = v;
    }
    if let Some(v) = k.periodic_gossip_ms {
        m.periodic_gossip_ms = v;
    }
    if let Some(v) = k.join_retry_ms {
        m.join_retry_ms = v;
    }
    if let Some(v) = k.anti_entropy_interval_ms {
        mesh.anti_entropy_interval_ms = v.max(1);
    }
}
