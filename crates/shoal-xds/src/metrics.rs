//! The server's metrics (recorded through the process-wide `metrics` recorder the agent
//! installs; described once so every one has a HELP line).
//!
//! | metric | what |
//! | --- | --- |
//! | `shoal_xds_streams` | open ADS streams (gauge) |
//! | `shoal_xds_streams_refused_total` | streams refused past `xds.max_streams` |
//! | `shoal_xds_requests_total{type,kind}` | requests by type (`lds`, `rds`, `cds`, `eds`) and kind (`subscribe`, `ack`, `nack`, `stale`) |
//! | `shoal_xds_nacks_total{type}` | responses a client rejected (each is also logged) |
//! | `shoal_xds_responses_total{type}` | responses sent |
//! | `shoal_xds_requests_refused_total{reason}` | requests refused (`unknown_type`, `too_many_names`; `undecodable`: not a `DiscoveryRequest`, the stream is ended `INVALID_ARGUMENT`) |
//! | `shoal_xds_connections` | open TCP connections (gauge) |
//! | `shoal_xds_connections_refused_total` | connections closed at accept past `xds.max_connections` |
//! | `shoal_xds_connections_closed_total{why}` | connections closed by the server (`handshake_timeout`) |
//! | `shoal_xds_accept_errors_total` | failed accepts (`EMFILE`, ...) |

use std::sync::Once;

use metrics::{counter, describe_counter, describe_gauge, gauge};

use crate::resources::ResourceType;
use crate::stream::{RequestError, RequestKind};

/// Describes every metric (idempotent).
pub fn describe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        describe_gauge!("shoal_xds_streams", "Open xDS (ADS) streams.");
        describe_counter!(
            "shoal_xds_streams_refused_total",
            "xDS streams refused because xds.max_streams were open."
        );
        describe_counter!(
            "shoal_xds_requests_total",
            "xDS discovery requests by resource type and kind (subscribe, ack, nack, stale)."
        );
        describe_counter!(
            "shoal_xds_nacks_total",
            "xDS responses rejected (NACKed) by a client, by resource type."
        );
        describe_counter!(
            "shoal_xds_responses_total",
            "xDS discovery responses sent, by resource type."
        );
        describe_counter!(
            "shoal_xds_requests_refused_total",
            "xDS requests refused, by reason (unknown_type, too_many_names; undecodable: the stream is ended INVALID_ARGUMENT)."
        );
        describe_gauge!("shoal_xds_connections", "Open TCP connections on the xDS port.");
        describe_counter!(
            "shoal_xds_connections_refused_total",
            "xDS connections closed at accept because xds.max_connections were open."
        );
        describe_counter!(
            "shoal_xds_connections_closed_total",
            "xDS connections closed by the server, by reason (handshake_timeout: no ADS call within xds.handshake_timeout_ms)."
        );
        describe_counter!(
            "shoal_xds_accept_errors_total",
            "Failed accepts on the xDS port (EMFILE and the like); the loop backs off 20 ms."
        );
        // Present from the first scrape, so "no NACK" reads as 0, not as a missing series.
        gauge!("shoal_xds_streams").set(0.0);
        counter!("shoal_xds_streams_refused_total").absolute(0);
        gauge!("shoal_xds_connections").set(0.0);
        counter!("shoal_xds_connections_refused_total").absolute(0);
        counter!("shoal_xds_connections_closed_total", "why" => "handshake_timeout").absolute(0);
        counter!("shoal_xds_accept_errors_total").absolute(0);
        for ty in ResourceType::ALL {
            counter!("shoal_xds_nacks_total", "type" => ty.label()).absolute(0);
            counter!("shoal_xds_responses_total", "type" => ty.label()).absolute(0);
        }
    });
}

fn kind_label(kind: &RequestKind) -> &'static str {
    match kind {
        RequestKind::Subscribe => "subscribe",
        RequestKind::Ack => "ack",
        RequestKind::Nack { .. } => "nack",
        RequestKind::Stale => "stale",
    }
}

/// Counts one accepted request (and a NACK).
pub fn request(ty: ResourceType, kind: &RequestKind) {
    counter!("shoal_xds_requests_total", "type" => ty.label(), "kind" => kind_label(kind))
        .increment(1);
    if matches!(kind, RequestKind::Nack { .. }) {
        counter!("shoal_xds_nacks_total", "type" => ty.label()).increment(1);
    }
}

/// Counts one refused request.
pub fn refused(e: &RequestError) {
    let reason = match e {
        RequestError::UnknownType(_) => "unknown_type",
        RequestError::TooManyNames(_) => "too_many_names",
    };
    counter!("shoal_xds_requests_refused_total", "reason" => reason).increment(1);
}

/// Counts one request that did not decode (its stream is ended `INVALID_ARGUMENT`).
pub fn undecodable() {
    counter!("shoal_xds_requests_refused_total", "reason" => "undecodable").increment(1);
}

/// Counts one response sent.
pub fn response(ty: ResourceType) {
    counter!("shoal_xds_responses_total", "type" => ty.label()).increment(1);
}

/// Counts one refused stream.
pub fn stream_refused() {
    counter!("shoal_xds_streams_refused_total").increment(1);
}

/// Holds `shoal_xds_streams` up by one while alive.
#[derive(Debug)]
pub struct StreamGauge(());

impl StreamGauge {
    /// One more open stream.
    pub fn open() -> Self {
        gauge!("shoal_xds_streams").increment(1.0);
        Self(())
    }
}

impl Drop for StreamGauge {
    fn drop(&mut self) {
        gauge!("shoal_xds_streams").decrement(1.0);
    }
}
