//! Boot sequence and the tasks around the driver.
//!
//! 1. data dir: node key (created once, 0600), boot generation (bumped on every start);
//! 2. transport (mTLS QUIC) bound; the certificate must name this node and region;
//! 3. keyring from `[trust]` (+ the dev authority key when asked, + our own node key);
//! 4. the persisted snapshot (newest valid generation) installed into the mesh's catalog;
//! 5. the soft `RLIMIT_NOFILE` raised to the hard limit and the local API's connection caps
//!    sized below it ([`crate::listener`]);
//! 6. tasks: the driver, auto-join (backoff with full jitter until Active, again after Idle),
//!    authority status ping, the local API on the unix socket (peer credentials, `[access]`
//!    policy, caps and timeouts), `/metrics`, the opt-in xDS server ([`crate::xds`]), and
//!    registration of the instances declared in the config file;
//! 7. on SIGHUP: the TLS certificate, key and CA bundle are read again and, if they pass every
//!    check, used for new connections (`shoal_transport::tls`); a bad file is refused and
//!    counted (`shoal_tls_reloads_total{result="error"}`), the old material stays;
//! 7. on SIGTERM / SIGINT: graceful leave, final snapshot, socket removed.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::{bail, Context};
use shoal_catalog::Keyring;
use shoal_mesh::{Command, MemberId, Mesh};
use shoal_proto::rpc::AuthorityRequestBody;
use shoal_proto::{
    Generation, HealthStatus, InstanceId, LifecycleState, ServiceKey, TransitionReason,
};
use shoal_transport::tls::{self, TlsState};
use shoal_transport::transport::{Transport, TransportConfig};
use tokio::sync::{mpsc, watch};

use crate::config::Validated;
use crate::dev_authority::{dev_key, DevAuthority};
use crate::driver::Driver;
use crate::keys::{self, Jitter};
use crate::probes::{ExecAs, ProbeSet, ProbeSignal};
use crate::state::{DriverCmd, Shared, Status};

/// Runs the agent until `shutdown` resolves (or SIGTERM/SIGINT when `None`).
///
/// # Errors
/// Start-up failures (config, certificates, data dir, socket). Once running, errors are
/// counted and logged, never fatal.
pub async fn run(cfg: Validated) -> anyhow::Result<()> {
    // Installed now, not when `shutdown` is first polled: that happens only after READY=1 is
    // sent, and a SIGTERM in between would kill the process with the default action, without
    // STOPPING=1 or the graceful leave (seen once in CI).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    run_until(cfg, shutdown).await
}

/// As [`run`], stopping when `shutdown` resolves.
///
/// # Errors
/// Start-up failures.
pub async fn run_until(
    cfg: Validated,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    crate::metrics::install();
    let raw = &cfg.raw;
    keys::ensure_dir(&raw.data_dir)
        .with_context(|| format!("data dir {}", raw.data_dir.display()))?;
    // Held until this function returns (the agent stops) or the process dies: a second agent
    // on this directory must not adopt our node key, bump our boot counter or overwrite our
    // files (QA: two agents on one data_dir both started).
    let _dir_lock = keys::lock_data_dir(&raw.data_dir)?;
    let node_key = keys::load_or_create_node_key(&raw.data_dir).context("node key")?;
    let boot_file = keys::open_boot(&raw.data_dir).context("boot counter")?;
    let boot = boot_file.generation();

    let tls_paths = raw.tls.paths();
    let tls = TlsState::from_files(&cfg.region, &tls_paths).context("TLS material")?;
    let mut tc = TransportConfig::with_tls(raw.listen, tls.clone());
    tc.advertise = raw.advertise;
    tc.max_stream_message_bytes = cfg.mesh.max_stream_message_bytes;
    let (transport, inbound) = Transport::bind(tc).context("transport")?;
    let quic = transport.quic_counters_handle();
    if transport.identity().node_id != cfg.node_id {
        bail!(
            "certificate is for node `{}`, config says `{}`",
            transport.identity().node_id,
            cfg.node_id
        );
    }

    let mut keyring = Keyring::new();
    for k in &cfg.authority_keys {
        keyring.trust_authority(cfg.region.clone(), *k);
    }
    let dev_pub = dev_key(&cfg.region).verifying_key();
    if raw.authority.dev || raw.trust.dev_authority {
        keyring.trust_authority(cfg.region.clone(), dev_pub);
    }
    // No node key is configured: every lifecycle record carries its owner's key as the
    // authority bound it, ours included (docs/adr/0006-node-keys-in-lifecycle-records.md).

    let identity = MemberId {
        node: cfg.node_id.clone(),
        addr: transport.listen_addr(),
        boot,
    };
    let mut mesh = Mesh::new(
        identity.clone(),
        cfg.region.clone(),
        cfg.zone.clone(),
        node_key.clone(),
        cfg.mesh.clone(),
        keyring.clone(),
        keys::random_u64(),
    );
    let mut status = Status::default();
    let (loaded, refused) = crate::persist::load_snapshot(&raw.data_dir, &keyring);
    for r in &refused {
        tracing::error!(file = %r.path.display(), reason = %r.reason, "persisted snapshot refused; skipped");
        metrics::counter!("shoal_snapshot_load_refused_total").increment(1);
        status
            .refused_snapshots
            .push(format!("{}: {}", r.path.display(), r.reason));
    }
    if let Some(l) = loaded {
        let out = mesh.restore(0, shoal_mesh::mesh::Restore::Snapshot(&l.snapshot));
        tracing::info!(file = %l.path.display(), records = l.snapshot.record_count(), ?out, "persisted snapshot loaded (stale until peers or the authority answer)");
        status.loaded_snapshot_written = Some(l.written);
    }

    let dev = raw.authority.dev.then(|| {
        tracing::warn!(
            "=== DEVELOPMENT AUTHORITY ENABLED: well-known INSECURE key; NOT FOR PRODUCTION ==="
        );
        let held = crate::dev_authority::HeldByMesh::of(mesh.catalog(), &cfg.region);
        DevAuthority::open(cfg.region.clone(), cfg.node_id.clone(), &raw.data_dir, held)
    });
    if cfg.access.dev_allow_all() {
        tracing::warn!(
            "=== DEVELOPMENT ACCESS POLICY ([access] dev_allow_all = true): EVERY local caller may register, change and eject ANY instance; NOT FOR PRODUCTION ==="
        );
    }
    let (nofile, nofile_hard) = crate::listener::raise_nofile_limit();
    let api_cfg = &raw.api;
    let port_fds = tcp_port_fds(raw);
    let (max_total, max_per_uid) = crate::listener::connection_caps(
        api_cfg.max_connections,
        api_cfg.max_connections_per_uid,
        nofile,
        api_cfg.fd_reserve.saturating_add(port_fds),
    );
    tracing::info!(
        nofile,
        nofile_hard,
        fd_reserve = api_cfg.fd_reserve,
        tcp_port_fds = port_fds,
        max_connections = max_total,
        max_connections_per_uid = max_per_uid,
        "local API connection caps"
    );
    metrics::gauge!("shoal_api_connection_cap", "scope" => "total").set(max_total as f64);
    metrics::gauge!("shoal_api_connection_cap", "scope" => "per_uid").set(max_per_uid as f64);
    let owners = crate::access::Owners::load(&raw.data_dir);
    let local_probes = crate::local_probes::LocalProbes::load(&raw.data_dir);
    let failover =
        crate::failover::Failover::new(cfg.region.clone(), cfg.policy_keys.clone(), &raw.data_dir);
    let (driver_tx, driver_rx) = mpsc::channel(4096);
    let shared = Arc::new(Shared {
        node_key_hex: keys::to_hex(&node_key.verifying_key().to_bytes()),
        node_public_key: node_key.verifying_key().to_bytes(),
        node_key_bound: std::sync::atomic::AtomicBool::new(false),
        dev_authority_key_hex: dev
            .as_ref()
            .map(|d| keys::to_hex(&d.verifying_key().to_bytes())),
        boot,
        probe_permits: Arc::new(tokio::sync::Semaphore::new(raw.probes.max_concurrent)),
        probe_tasks: Mutex::new(Default::default()),
        owners,
        local_probes,
        refusals: Default::default(),
        member_changes: Default::default(),
        failover,
        view: arc_swap::ArcSwap::from_pointee(crate::state::View {
            catalog: mesh.catalog().clone(),
            down: crate::state::DownNodes::of(&mesh),
            ejections: Default::default(),
            apply_times: Default::default(),
            generation: crate::state::View::next_generation(),
        }),
        view_writer: Mutex::new(()),
        persisted: Mutex::new(Default::default()),
        mesh: RwLock::new(mesh),
        origin: tokio::time::Instant::now(),
        index: crate::api::ViewIndex::new(boot),
        ejections: Mutex::new(Default::default()),
        apply_times: Mutex::new(Default::default()),
        status: Mutex::new(status),
        driver: driver_tx,
        transport_view: quic.clone(),
        authority_route: Mutex::new(Default::default()),
        cfg,
    });
    tracing::info!(node = %identity.node, addr = %identity.addr, boot = boot.0,
        node_key = %shared.node_key_hex, "agent starting");

    let (join_tx, join_rx) = watch::channel(0u64);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let driver = Driver::new(
        shared.clone(),
        transport,
        boot_file,
        inbound,
        driver_rx,
        dev,
        join_tx,
    );
    let driver_task = tokio::spawn(driver.run(async {
        let _ = stop_rx.await;
    }));
    restore_probes(&shared);
    let mut tasks = vec![
        tokio::spawn(join_loop(shared.clone(), join_rx)),
        tokio::spawn(status_loop(shared.clone())),
        tokio::spawn(bind_node_key(shared.clone())),
        tokio::spawn(register_configured(shared.clone())),
        tokio::spawn(crate::failover::pull_loop(shared.clone())),
        tls::spawn_reloader(tls, tls_paths, Duration::from_secs(10), tls::record_metrics)
            .context("SIGHUP handler")?,
    ];
    let socket = shared.cfg.raw.socket.clone();
    let listener = bind_socket(
        &socket,
        shared.cfg.raw.api.socket_mode,
        shared.cfg.socket_gid,
    )?;
    let bound = socket_inode(&socket);
    let app = crate::api::router(shared.clone());
    let limiter = crate::listener::ConnLimiter::new(max_total, max_per_uid);
    let serve_cfg = crate::listener::ServeConfig {
        header_read_timeout: Duration::from_millis(shared.cfg.raw.api.header_read_timeout_ms),
    };
    tasks.push(tokio::spawn(crate::listener::serve(
        listener, app, limiter, serve_cfg,
    )));
    if let Some(addr) = shared.cfg.raw.consul.listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("consul API listener {addr}"))?;
        tracing::warn!(addr = %l.local_addr().unwrap_or(addr), "Consul-compatible read API listening: anyone who can reach it can read the catalog");
        let app = crate::consul::router(shared.clone());
        let max = shared.cfg.raw.consul.max_connections;
        tasks.push(tokio::spawn(crate::consul::serve(l, app, max)));
    }
    if let Some(addr) = shared.cfg.raw.dns.listen {
        let t = crate::dns::serve(shared.clone(), addr)
            .await
            .with_context(|| format!("DNS listener {addr}"))?;
        tasks.push(t);
    }
    if let Some(addr) = shared.cfg.raw.metrics {
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "metrics served on a NON-LOOPBACK address (metrics_allow_non_loopback = true): unauthenticated");
        }
        let granted = shared.cfg.raw.access.reads == crate::access::ReadAccess::Granted;
        match (granted, shared.cfg.metrics_per_service) {
            (true, true) => {
                tracing::warn!(%addr, "metrics_service_labels = true with [access] reads = \"granted\": /metrics shows every service key to whoever can connect to it")
            }
            (_, false) => {
                tracing::info!(%addr, "per-service metric series withheld (service=\"_withheld\", summed): the metrics port has no caller identity ([access] reads = \"granted\" or metrics_service_labels = false)")
            }
            (false, true) => {}
        }
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("metrics listener {addr}"))?;
        let shared_for_metrics = shared.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let quic = quic.clone();
                let shared = shared_for_metrics.clone();
                async move { crate::metrics::render(&quic, &shared) }
            }),
        );
        // Capped and timed out like the other TCP ports (its cap is in `tcp_port_fds`): QA
        // filled an uncapped metrics port with half-sent requests until the agent hit EMFILE.
        let l = shoal_transport::capped_accept::CappedListener::new(
            l,
            shared.cfg.raw.metrics_max_connections,
            shoal_transport::capped_accept::PortNames {
                port: "metrics",
                setting: "metrics_max_connections",
                refused_metric: "shoal_metrics_connections_refused_total",
                accept_errors_metric: "shoal_metrics_accept_errors_total",
            },
        );
        let header_timeout = Duration::from_millis(shared.cfg.raw.api.header_read_timeout_ms);
        tasks.push(tokio::spawn(crate::tcp_http::serve(
            l,
            app,
            header_timeout,
            "shoal_metrics_connections_closed_total",
        )));
    }
    tasks.extend(crate::xds::spawn(shared.clone()).await?);
    tracing::info!(socket = %socket.display(), "local API listening");
    notify_service_manager(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status("local API listening"),
    ]);
    shutdown.await;
    notify_service_manager(&[sd_notify::NotifyState::Stopping]);
    for t in &tasks {
        t.abort();
    }
    let _ = stop_tx.send(());
    let _ = driver_task.await;
    // Only our own socket: a new agent started while this one was stopping has already
    // replaced the path (bind_socket removes a socket nobody listens on), and removing its
    // socket would leave it running but unreachable.
    if bound.is_some() && socket_inode(&socket) == bound {
        let _ = std::fs::remove_file(&socket);
    }
    tracing::info!("agent stopped");
    Ok(())
}

/// Descriptors the agent's TCP ports may hold at their caps (xDS, the Consul port, DNS,
/// `/metrics`): taken out of the local API's budget with `fd_reserve`, so a caller filling
/// those ports cannot starve the unix socket, persistence or the mesh of descriptors.
fn tcp_port_fds(raw: &crate::config::AgentConfig) -> usize {
    let xds = if raw.xds.enabled {
        raw.xds.max_connections
    } else {
        0
    };
    let consul = raw.consul.listen.map_or(0, |_| raw.consul.max_connections);
    let dns = raw.dns.listen.map_or(0, |_| raw.dns.max_tcp_connections);
    let metrics = raw.metrics.map_or(0, |_| raw.metrics_max_connections);
    xds.saturating_add(consul)
        .saturating_add(dns)
        .saturating_add(metrics)
}

/// Tells systemd (`Type=notify`, `$NOTIFY_SOCKET`) about a state change: `READY=1` once the
/// local API listens, `STOPPING=1` at shutdown. Without `$NOTIFY_SOCKET` it does nothing; a
/// failed send is logged and changes nothing else (the agent serves either way).
fn notify_service_manager(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "sd_notify to $NOTIFY_SOCKET failed");
    }
}

/// `(device, inode)` of the file at `path`, to tell our socket from a successor's.
fn socket_inode(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn bind_socket(
    path: &std::path::Path,
    mode: u32,
    gid: Option<u32>,
) -> anyhow::Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("socket dir {}", dir.display()))?;
    }
    // lstat: a symlink at the path is itself replaced, never followed.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        let kind = meta.file_type();
        if !(kind.is_socket() || kind.is_symlink()) {
            // A mistyped `socket =` must not delete someone's file.
            bail!(
                "socket path {} exists and is not a socket: refusing to replace it (remove it or \
                 choose another path)",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("socket {} is in use by another agent", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("stale socket {}", path.display()))?;
    }
    let l = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("bind socket {}", path.display()))?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid))
            .with_context(|| format!("chown socket {} to gid {gid}", path.display()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(l)
}

async fn resolve_seeds(shared: &Shared) -> Vec<SocketAddr> {
    let me = shared
        .mesh
        .read()
        .expect("mesh lock")
        .membership()
        .identity()
        .addr;
    // The freshest persisted members (the file lists seeds, then by last sighting) as extra
    // join targets; the whole list goes back into the membership's address book at start.
    let extra: Vec<SocketAddr> = crate::persist::read_members(&shared.cfg.raw.data_dir)
        .into_iter()
        .take(16)
        .map(|m| m.addr)
        .collect();
    shoal_runtime::join::resolve_seeds(&shared.cfg.raw.seeds, &extra, me).await
}

/// Joins with exponential backoff and full jitter until the membership is Active; starts over
/// whenever the driver reports the membership idle. Never gives up.
async fn join_loop(shared: Arc<Shared>, mut wanted: watch::Receiver<u64>) {
    let backoff = shoal_runtime::join::Backoff {
        base_ms: shared.cfg.raw.join.base_ms,
        max_ms: shared.cfg.raw.join.max_ms,
    };
    let mut jitter = Jitter::new();
    loop {
        let mut attempt: u32 = 0;
        loop {
            if shared.status.lock().expect("status").active {
                break;
            }
            let seeds = resolve_seeds(&shared).await;
            if seeds.is_empty() && shared.cfg.raw.seeds.is_empty() {
                break; // the first node of a region: others join us
            }
            if attempt > 0 {
                metrics::counter!("shoal_reconnects_total", "what" => "join_attempt").increment(1);
            }
            tracing::debug!(attempt, ?seeds, "joining");
            let _ = shared.driver.send(DriverCmd::Join(seeds)).await;
            let pause = backoff.delay_ms(attempt, &mut jitter);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            attempt = attempt.saturating_add(1);
        }
        if wanted.changed().await.is_err() {
            return;
        }
    }
}

/// Pings the authority for "last authority contact" (the dev authority counts as contact).
async fn status_loop(shared: Arc<Shared>) {
    if shared.cfg.raw.authority.dev || shared.cfg.raw.authority.addresses.is_empty() {
        return;
    }
    let every = shared.cfg.raw.authority.status_interval_ms;
    let mut jitter = Jitter::new();
    loop {
        let _ = crate::client::call(&shared, AuthorityRequestBody::Status).await;
        tokio::time::sleep(Duration::from_millis(every / 2 + jitter.upto(every))).await;
    }
}

/// Binds this node's key at the region authority (ADR 0006), retrying with backoff until it
/// answers; the authority re-issues our live records if the key is new to it. Until then our
/// health records verify nowhere else (and our instances cannot be registered anyway).
async fn bind_node_key(shared: Arc<Shared>) {
    let mut jitter = Jitter::new();
    let mut attempt: u32 = 0;
    loop {
        match crate::api::ensure_node_key_bound(&shared).await {
            Ok(()) => return,
            Err(crate::client::CallError::Refused { code, reason }) => {
                tracing::error!(%code, %reason, "the authority refuses our node key: our health records verify nowhere (revoked?)");
                return;
            }
            Err(e) => tracing::debug!(error = %e, attempt, "node key not bound yet"),
        }
        let ceiling = 200u64.saturating_mul(1 << attempt.min(6)).min(10_000);
        tokio::time::sleep(Duration::from_millis(jitter.upto(ceiling))).await;
        attempt = attempt.saturating_add(1);
    }
}

/// Registers the `[[instances]]` of the config file, retrying until the authority accepts.
async fn register_configured(shared: Arc<Shared>) {
    let mut jitter = Jitter::new();
    for inst in shared.cfg.raw.instances.clone() {
        let Ok(key) = inst.service.parse::<ServiceKey>() else {
            tracing::error!(service = %inst.service, "invalid service key in [[instances]]");
            continue;
        };
        let body = crate::api::RegisterBody {
            instance: inst.instance.clone(),
            address: inst.address,
            version: inst.version.clone(),
            weight: inst.weight,
            zone: inst.zone.clone(),
            labels: inst.labels.clone(),
            lease_ms: None,
            probes: inst.probes.clone(),
        };
        let mut attempt = 0u32;
        loop {
            match crate::api::register_instance(&shared, key.clone(), &body, None).await {
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(instance = %inst.instance, ?e, "registration failed; retrying");
                    let ceiling = 500u64.saturating_mul(1 << attempt.min(6)).min(30_000);
                    tokio::time::sleep(Duration::from_millis(jitter.upto(ceiling))).await;
                    attempt += 1;
                }
            }
        }
    }
}

/// Starts (or restarts) the probes of a local instance.
pub fn start_probes(
    shared: &Arc<Shared>,
    key: ServiceKey,
    instance: InstanceId,
    generation: Generation,
    addr: SocketAddr,
    set: ProbeSet,
    exec_as: Option<ExecAs>,
) {
    abort_probes(shared, &key, &instance);
    if set.is_empty() {
        shared.local_probes.remove(&key, &instance);
        return;
    }
    shared
        .local_probes
        .set(crate::local_probes::PersistedProbes {
            service: key.to_string(),
            instance: instance.to_string(),
            generation: generation.0,
            address: addr,
            probes: set.clone(),
            exec_as: exec_as.map(|e| (e.uid, e.gid)),
        });
    let task_key = (key.to_string(), instance.to_string());
    let s = shared.clone();
    let handle = tokio::spawn(async move {
        let (tx, mut rx) = mpsc::channel(16);
        // Aborted with this task (stop_probes): the guard's drop aborts the probe loop.
        let _probes =
            crate::probes::spawn_instance(set, addr, exec_as, s.probe_permits.clone(), tx);
        let mut reported_failing = false;
        while let Some(sig) = rx.recv().await {
            on_probe_signal(&s, &key, &instance, generation, sig, &mut reported_failing).await;
        }
    });
    shared
        .probe_tasks
        .lock()
        .expect("probe tasks")
        .insert(task_key, handle.abort_handle());
}

/// Stops the probes of a local instance and forgets them (they are not resumed after a
/// restart).
pub fn stop_probes(shared: &Shared, key: &ServiceKey, instance: &InstanceId) {
    abort_probes(shared, key, instance);
    shared.local_probes.remove(key, instance);
}

/// Restarts the persisted probes of local instances, unless the loaded catalog shows the
/// instance gone (EXPIRED, bound elsewhere, or replaced by a newer generation); forgets those
/// ([`crate::local_probes`]).
pub fn restore_probes(shared: &Arc<Shared>) {
    for e in shared.local_probes.entries() {
        let Some((key, instance, generation)) = e.ids() else {
            crate::metrics::rejected("probes_file", "bad_entry");
            continue;
        };
        // Entries written before the API bounded probe timings (or edited by hand) are held to
        // the same rules as a registration: a bad one is forgotten, not run.
        if let Err(why) = e.probes.validate() {
            crate::metrics::rejected("probes_file", "bad_probe");
            tracing::error!(%key, %instance, error = %why, "persisted probes refused; not resumed");
            shared.local_probes.remove(&key, &instance);
            continue;
        }
        let live = {
            let mesh = shared.mesh.read().expect("mesh lock");
            // Absent, or an older generation: the persisted snapshot predates the
            // registration, so the probes resume (health for a generation the region no
            // longer holds is refused by the catalogs anyway).
            mesh.catalog().entry(&key, &instance).is_none_or(|c| {
                let r = &c.lifecycle().record;
                r.generation < generation
                    || (r.owner == shared.cfg.node_id
                        && r.generation == generation
                        && r.state != LifecycleState::Expired)
            })
        };
        if live {
            tracing::info!(%key, %instance, generation = generation.0, "probes resumed after restart");
            let exec_as = e.exec_as();
            start_probes(
                shared, key, instance, generation, e.address, e.probes, exec_as,
            );
        } else {
            shared.local_probes.remove(&key, &instance);
        }
    }
}

/// Aborts the running probe task of a local instance, if any.
fn abort_probes(shared: &Shared, key: &ServiceKey, instance: &InstanceId) {
    if let Some(h) = shared
        .probe_tasks
        .lock()
        .expect("probe tasks")
        .remove(&(key.to_string(), instance.to_string()))
    {
        h.abort();
    }
}

async fn on_probe_signal(
    shared: &Arc<Shared>,
    key: &ServiceKey,
    instance: &InstanceId,
    generation: Generation,
    sig: ProbeSignal,
    reported_failing: &mut bool,
) {
    let health = |status, reason| {
        DriverCmd::Mesh(Command::ReportHealth {
            key: key.clone(),
            instance: instance.clone(),
            generation,
            status,
            reason,
        })
    };
    match sig {
        ProbeSignal::Started => {
            let starting = shared
                .mesh
                .read()
                .expect("mesh lock")
                .catalog()
                .entry(key, instance)
                .is_some_and(|e| {
                    let r = &e.lifecycle().record;
                    r.generation == generation && r.state == LifecycleState::Starting
                });
            if starting {
                tracing::info!(%key, %instance, "startup and readiness passed: requesting READY");
                if let Err(e) = crate::api::transition(shared, key, instance, "ready", None).await {
                    tracing::warn!(%key, %instance, ?e, "automatic READY failed");
                }
            }
        }
        ProbeSignal::ReadinessFailing => {
            tracing::warn!(%key, %instance, "readiness failing: signing UNHEALTHY");
            *reported_failing = true;
            let _ = shared
                .driver
                .send(health(
                    HealthStatus::Failing,
                    TransitionReason::ReadinessFailed,
                ))
                .await;
        }
        ProbeSignal::ReadinessPassing if *reported_failing => {
            tracing::info!(%key, %instance, "readiness recovered");
            *reported_failing = false;
            let _ = shared
                .driver
                .send(health(
                    HealthStatus::Passing,
                    TransitionReason::ReadinessRecovered,
                ))
                .await;
        }
        ProbeSignal::ReadinessPassing => {}
        ProbeSignal::LivenessFailing => {
            tracing::error!(%key, %instance, "liveness probe failing (reported only; shoal never restarts)");
            metrics::counter!("shoal_liveness_failures_total").increment(1);
        }
        ProbeSignal::LivenessPassing => {
            tracing::info!(%key, %instance, "liveness probe passing");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_path_that_is_a_regular_file_is_refused_and_the_file_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("important.txt");
        std::fs::write(&path, "important data").unwrap();
        let err = bind_socket(&path, 0o660, None).unwrap_err();
        assert!(err.to_string().contains("is not a socket"), "{err:#}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "important data");
    }

    #[test]
    fn every_enabled_tcp_port_cap_is_kept_out_of_the_fd_budget() {
        let text = |extra: &str| {
            format!(
                "node_id = \"n\"\nregion = \"r\"\nzone = \"z\"\ndata_dir = \"d\"\nlisten = \"127.0.0.1:1\"\n{extra}\n[tls]\nca = \"c\"\ncert = \"c\"\nkey = \"k\"\n"
            )
        };
        let cfg =
            |extra: &str| -> crate::config::AgentConfig { toml::from_str(&text(extra)).unwrap() };
        assert_eq!(tcp_port_fds(&cfg("")), 0);
        assert_eq!(
            tcp_port_fds(&cfg("metrics = \"127.0.0.1:9464\"\n")),
            crate::config::DEFAULT_METRICS_MAX_CONNECTIONS
        );
        assert_eq!(
            tcp_port_fds(&cfg(
                "metrics = \"127.0.0.1:9464\"\nmetrics_max_connections = 3\n[consul]\nlisten = \"127.0.0.1:8500\"\nmax_connections = 5\n"
            )),
            8
        );
    }

    #[tokio::test]
    async fn a_stale_socket_nobody_listens_on_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(std::os::unix::net::UnixStream::connect(&path).is_err());
        let _l = bind_socket(&path, 0o660, None).unwrap();
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
    }
}
