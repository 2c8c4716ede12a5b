//! The opt-in xDS server (`[xds] enabled = true`): publishes the agent's view to `shoal-xds`.
//!
//! One task rebuilds a [`shoal_xds::View`] from the catalog each time the view index moves
//! (changes that arrive during a rebuild are folded into the next one) and at least once a
//! second (local ejections end by time, without an index bump), and publishes it only when
//! the resources it serves changed. Each ADS stream then pushes what changed for its
//! subscriptions (`crates/shoal-xds/src/stream.rs`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use shoal_xds::{Ads, Endpoint, EndpointHealth, FailoverRegion, Locality, View};
use tokio::sync::watch;

use crate::state::{Shared, ViewLiveness};

/// Longest a view stays unrebuilt without an index change, ms (ejection expiry).
pub const REFRESH_MS: u64 = 1_000;

/// The xDS view of everything the agent holds right now: its region's catalog, plus, for each
/// service whose global policy allows failover, the policy's regions in order with the
/// endpoints of their held summaries (`shoal-xds` serves them only while the region has no
/// healthy endpoint, or always with the policy's `overprovisioning_factor_pct`, which it
/// serves as the assignment's overprovisioning factor; docs/api/xds.md).
pub fn build_view(shared: &Shared) -> View {
    let remote = shared.failover.xds_regions();
    let now = shared.now_ms();
    let version = shared.view_index();
    let mesh = shared.mesh.read().expect("mesh lock");
    let ej = shared.ejections.lock().expect("ejections");
    let liveness = ViewLiveness {
        mesh: mesh.liveness(),
        ejections: &ej,
        now_ms: now,
    };
    let catalog = mesh.catalog();
    let mut services: std::collections::BTreeMap<_, Vec<Endpoint>> = catalog
        .service_keys()
        .map(|k| {
            let eps = catalog
                .view(k, &liveness)
                .endpoints
                .iter()
                .map(Endpoint::of)
                .collect();
            (k.clone(), eps)
        })
        .collect();
    drop(ej);
    drop(mesh);
    let mut failover = std::collections::BTreeMap::new();
    let mut overprovisioning_factor_pct = std::collections::BTreeMap::new();
    for s in remote {
        let (key, regions) = (s.key, s.regions);
        if let Some(f) = s.overprovisioning_factor_pct {
            overprovisioning_factor_pct.insert(key.clone(), f);
        }
        let eps = services.entry(key.clone()).or_default();
        for r in &regions {
            eps.extend(r.endpoints.iter().map(|e| remote_endpoint(&r.region, e)));
        }
        let served = regions
            .into_iter()
            .map(|r| FailoverRegion {
                region: r.region,
                read_only: r.read_only,
                degraded: r.degraded,
            })
            .collect();
        failover.insert(key, served);
    }
    View {
        version,
        services,
        failover,
        overprovisioning_factor_pct,
    }
}

/// A remote summary's endpoint as served: routable in its region when the summary was built.
fn remote_endpoint(
    region: &shoal_proto::Region,
    e: &shoal_proto::summary::SummaryEndpoint,
) -> Endpoint {
    Endpoint {
        instance: e.instance.to_string(),
        address: e.endpoint.address,
        region: region.clone(),
        zone: e.endpoint.zone.clone(),
        weight: e.endpoint.weight.max(1),
        health: EndpointHealth::Healthy,
    }
}

/// Binds the xDS port and starts the server and the view publisher, when enabled.
///
/// # Errors
/// The port cannot be bound.
pub async fn spawn(shared: Arc<Shared>) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let cfg = shared.cfg.raw.xds.clone();
    if !cfg.enabled {
        return Ok(Vec::new());
    }
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("xds listener {}", cfg.listen))?;
    if !cfg.listen.ip().is_loopback() {
        tracing::warn!(addr = %cfg.listen, "xDS served on a NON-LOOPBACK address (allow_non_loopback = true): unauthenticated");
    }
    let (tx, rx) = watch::channel(Arc::new(build_view(&shared)));
    let local = Locality {
        region: shared.cfg.region.clone(),
        zone: shared.cfg.zone.clone(),
    };
    let ads = Ads::new(rx, local, cfg.max_streams);
    let limits = cfg.limits();
    tracing::info!(addr = %listener.local_addr()?, max_connections = limits.max_connections,
        "xDS (ADS) listening");
    let server = tokio::spawn(async move {
        if let Err(e) = shoal_xds::serve(listener, ads, limits, std::future::pending()).await {
            tracing::error!(error = %e, "xDS server stopped");
        }
    });
    let publisher = tokio::spawn(publish(shared, tx));
    Ok(vec![server, publisher])
}

async fn publish(shared: Arc<Shared>, tx: watch::Sender<Arc<View>>) {
    let mut index = shared.index.subscribe(crate::api::Watched::All);
    loop {
        let _ = tokio::time::timeout(Duration::from_millis(REFRESH_MS), index.changed()).await;
        index.borrow_and_update();
        let view = build_view(&shared);
        tx.send_if_modified(|cur| {
            if cur.same_resources(&view) {
                return false;
            }
            *cur = Arc::new(view);
            true
        });
    }
}
