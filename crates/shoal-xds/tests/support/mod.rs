//! What the xDS integration tests share: one Prometheus recorder per test process, counter
//! reads from its scrape, and a server on a loopback port with an empty view.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use shoal_proto::{Region, Zone};
use shoal_xds::{Ads, ConnLimits, Locality, View};

fn recorder() -> &'static PrometheusHandle {
    static H: OnceLock<PrometheusHandle> = OnceLock::new();
    H.get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
}

/// The value of the series `series` (name and labels exactly as rendered, without the
/// trailing space) in a scrape; 0 when absent.
pub fn counter(series: &str) -> u64 {
    recorder()
        .render()
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|v| v.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Starts an xDS server (locality eu/eu-a, `max_streams` ADS streams, `limits`) on a loopback
/// port and returns its address.
pub async fn start(limits: ConnLimits, max_streams: usize) -> SocketAddr {
    recorder();
    let (views, rx) = tokio::sync::watch::channel(Arc::new(View::default()));
    // Keep the sender alive for the whole test process: a closed channel ends every stream.
    std::mem::forget(views);
    let local = Locality {
        region: Region::new("eu").unwrap(),
        zone: Zone::new("eu-a").unwrap(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(shoal_xds::serve(
        listener,
        Ads::new(rx, local, max_streams),
        limits,
        std::future::pending(),
    ));
    addr
}
