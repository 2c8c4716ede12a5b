//! Prometheus metrics: a process-wide `metrics` recorder rendered as text by the agent's own
//! loopback HTTP listener (no exporter HTTP server, no HTTP client, no TLS stack).
//!
//! The REQUIREMENTS list, by name:
//!
//! | requirement | metric |
//! | --- | --- |
//! | registration / renewal write rate | `shoal_authority_writes_total{op,result}`; renewals are not the agent's writes: a live node renews its instances' leases by answering SWIM probes, and the only renewal that reaches the authority (a `NodeUp` after the node was held down) is counted by the authority replica, `shoal_renewal_writes_total` / `shoal_leases_renewed_total` (`crates/shoal-authority-server/src/renewals.rs`) |
//! | catalog write latency | `shoal_authority_rpc_seconds{op}` (histogram) |
//! | READY count per service | `shoal_ready_endpoints{service}` (with `[access] reads = "granted"`, one series `service="_withheld"` summed over services unless `metrics_service_labels = true`; the same for `shoal_no_backend_total`) |
//! | state flapping | `shoal_lifecycle_transitions_total{to}`, `shoal_health_flaps_total` |
//! | probe latency | `shoal_probe_duration_seconds{kind}` |
//! | watch lag | `shoal_watch_lag_seconds` (authority commit -> applied here; per endpoint: `committed_at_ms` / `applied_at_ms` in the API, `shoal_apply_times_dropped_total` when that map is full) |
//! | snapshot age | `shoal_snapshot_age_seconds`, `shoal_authority_contact_age_seconds` |
//! | revision gaps | `shoal_revision_gaps_total` |
//! | full-snapshot fallbacks | `shoal_full_snapshot_fallbacks_total` |
//! | agent reconnects | `shoal_reconnects_total{what}` |
//! | new requests to removed endpoints | `shoal_requests_to_removed_endpoints_total` |
//! | stale-endpoint connection failures | `shoal_stale_endpoint_failures_total` |
//! | no-backend results | `shoal_no_backend_total{service}` |
//!
//! plus TLS material (`shoal_tls_cert_expiry_seconds`: seconds until the current certificate's
//! notAfter, set at start, on every reload and every 10 s; `shoal_tls_reloads_total{result}`:
//! SIGHUP reloads by `ok` / `error`), membership (`shoal_members{state}`), mesh flows (`shoal_mesh_messages_total`,
//! `shoal_mesh_bytes_total`), transport counters (`shoal_transport_*`), persistence
//! (`shoal_persist_total{result}`, `shoal_snapshot_load_refused_total`) and rejected inputs by
//! reason (`shoal_rejected_inputs_total{source,reason}`).
//!
//! The local socket: `shoal_api_writes_total{route,result}` (every write, `result` one of
//! `accepted`, `refused` (403 by the `[access]` policy), `invalid`, `failed`),
//! `shoal_api_refusals_total{route,reason}`, `shoal_api_refusal_logs_suppressed_total`,
//! `shoal_api_connections` (open), `shoal_api_connection_cap{scope}`,
//! `shoal_api_connections_refused_total{why}` (`per_uid` 429, `total` 503, `no_peer_cred`),
//! `shoal_api_connections_closed_total{why}` (`header_timeout`, `error`),
//! `shoal_api_accept_errors_total`; blocking queries `shoal_api_index_overflow_total`; the
//! Consul port `shoal_consul_connections_refused_total`, `shoal_consul_accept_errors_total`,
//! `shoal_consul_connections_closed_total{why}`; the metrics port itself (capped at
//! `metrics_max_connections`, heads within `[api] header_read_timeout_ms`)
//! `shoal_metrics_connections_refused_total`, `shoal_metrics_accept_errors_total`,
//! `shoal_metrics_connections_closed_total{why}`;
//! `shoal_build_info{version}` and `process_*` (`crate::metrics_describe`, which also holds the
//! HELP text of every metric); exec probes: `shoal_probe_exec_total{result}`
//! (`spawn_error`, `timeout_killed`); the dev authority's `shoal_audit_write_failures_total`
//! `shoal_dev_authority_save_failures_total` and `shoal_dev_authority_floor_raises_total`.

use std::sync::OnceLock;

use metrics::{counter, gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use shoal_catalog::view::is_routable;
use shoal_catalog::Keyring;
use shoal_mesh::Mesh;
use shoal_proto::envelope::MessageKind;
use shoal_transport::transport::{QuicCounters, QuicCountersHandle, TransportCounters};

use crate::state::Shared;

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The `service` label of the per-service families when the agent withholds service keys
/// from `/metrics` (`metrics_service_labels`, by default with `[access] reads = "granted"`):
/// one series summed over every service.
pub const WITHHELD_SERVICE_LABEL: &str = "_withheld";

/// Installs the process-wide recorder (idempotent) and returns its handle.
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ])
                .ok()?
                .build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            crate::metrics_describe::describe_all();
            Some(handle)
        })
        .clone()
}

/// Renders the text exposition, sampling the `process_*` gauges from `/proc/self` first (at
/// scrape time only: sampling them on every driver tick cost ~30 syscalls a second on an idle
/// agent, issue 19).
///
/// The QUIC packet and frame counters are read from `quic` here too: reading them locks every
/// live connection once, which a scrape can afford and a timer would pay for all the time.
///
/// The mesh, catalog and transport counters and the view gauges are copied in here as well,
/// not on the driver's 500 ms tick: ~80 registry updates twice a second were a measurable share
/// of an idle agent's CPU (issue 19), and a scrape now sees them as of the scrape.
pub fn render(quic: &QuicCountersHandle, shared: &Shared) -> String {
    crate::metrics_describe::record_process();
    export_quic(&quic.read());
    export_state(shared, &quic.transport_counters());
    install().map(|h| h.render()).unwrap_or_default()
}

/// The counters of the mesh, the catalog and the transport, ready endpoints per service,
/// and the freshness gauges.
fn export_state(shared: &Shared, transport: &TransportCounters) {
    {
        let mesh = shared.mesh.read().expect("mesh lock");
        export_counters(&mesh, transport);
        let liveness = mesh.liveness();
        let per_service = shared.cfg.metrics_per_service;
        let mut withheld = 0usize;
        for key in mesh.catalog().service_keys() {
            let ready = mesh.catalog().service(key).map_or(0, |s| {
                s.instances
                    .values()
                    .filter(|e| is_routable(e, &liveness))
                    .count()
            });
            if !per_service {
                withheld += ready;
                continue;
            }
            gauge!("shoal_ready_endpoints", "service" => key.to_string()).set(ready as f64);
            // The no-backend series of every known service exists before its first 503.
            counter!("shoal_no_backend_total", "service" => key.to_string()).increment(0);
        }
        if !per_service {
            // No service key on the metrics port (see `metrics_service_labels`): one series.
            gauge!("shoal_ready_endpoints", "service" => WITHHELD_SERVICE_LABEL)
                .set(withheld as f64);
            counter!("shoal_no_backend_total", "service" => WITHHELD_SERVICE_LABEL).increment(0);
        }
    }
    gauge!("shoal_snapshot_age_seconds").set(shared.snapshot_age_ms() as f64 / 1000.0);
    if let Some(age) = shared.authority_age_ms() {
        gauge!("shoal_authority_contact_age_seconds").set(age as f64 / 1000.0);
    }
    gauge!("shoal_view_stale").set(if shared.is_stale() { 1.0 } else { 0.0 });
}

fn export_quic(q: &QuicCounters) {
    counter!("shoal_quic_packets_total", "dir" => "out").absolute(q.packets_out);
    counter!("shoal_quic_packets_total", "dir" => "in").absolute(q.packets_in);
    counter!("shoal_quic_socket_datagrams_in_total").absolute(q.socket_datagrams_in);
    // `absolute` never lowers a counter, so a read racing a datagram in flight cannot make it
    // go backwards.
    counter!("shoal_quic_datagrams_unclaimed_total")
        .absolute(q.socket_datagrams_in.saturating_sub(q.packets_in));
    for (kind, n) in [
        ("ack", q.ack_frames_out),
        ("ping", q.ping_frames_out),
        ("datagram", q.datagram_frames_out),
        ("stream", q.stream_frames_out),
        ("crypto", q.crypto_frames_out),
    ] {
        counter!("shoal_quic_frames_sent_total", "kind" => kind).absolute(n);
    }
}

/// Counts one rejected input.
pub fn rejected(source: &'static str, reason: &'static str) {
    counter!("shoal_rejected_inputs_total", "source" => source, "reason" => reason).increment(1);
}

/// Copies the mesh and transport counters into the recorder (at scrape time).
pub fn export_counters(mesh: &Mesh<Keyring>, transport: &TransportCounters) {
    let m = mesh.membership().counters();
    gauge!("shoal_members", "state" => "alive").set(m.members_alive as f64);
    gauge!("shoal_members", "state" => "suspect").set(m.members_suspect as f64);
    gauge!("shoal_members", "state" => "down").set(m.members_down as f64);
    counter!("shoal_swim_datagrams_total", "dir" => "in").absolute(m.datagrams_in);
    counter!("shoal_swim_datagrams_total", "dir" => "out").absolute(m.datagrams_out);
    counter!("shoal_swim_bytes_total", "dir" => "in").absolute(m.bytes_in);
    counter!("shoal_swim_bytes_total", "dir" => "out").absolute(m.bytes_out);
    counter!("shoal_rejected_inputs_total", "source" => "swim", "reason" => "decode")
        .absolute(m.rejected_decode);
    counter!("shoal_rejected_inputs_total", "source" => "swim", "reason" => "foca")
        .absolute(m.rejected_foca);
    counter!("shoal_swim_rejoins_total").absolute(m.rejoins);
    counter!("shoal_swim_identity_conflicts_total").absolute(m.identity_conflicts);
    counter!("shoal_swim_members_learned_total").absolute(m.members_learned);
    counter!("shoal_swim_downs_relearned_total").absolute(m.downs_relearned);
    counter!("shoal_swim_contested_down_notices_total").absolute(m.contested_down_notices);
    counter!("shoal_swim_updates_deduplicated_total").absolute(m.updates_deduplicated);
    // Issue 15 / ADR 0010: probe health, refuted downs, the address book.
    counter!("shoal_swim_downs_withheld_total").absolute(m.downs_withheld);
    counter!("shoal_swim_downs_voided_total").absolute(m.downs_voided);
    counter!("shoal_swim_renewals_withheld_total").absolute(m.renewals_withheld);
    counter!("shoal_swim_downs_dropped_total").absolute(m.downs_dropped);
    counter!("shoal_swim_reconnect_announces_total").absolute(m.reconnect_announces);
    counter!("shoal_swim_known_evicted_total").absolute(m.known_evicted);
    gauge!("shoal_swim_known_addresses").set(mesh.membership().num_known() as f64);
    gauge!("shoal_swim_probes_failing").set(if mesh.membership().probes_failing() {
        1.0
    } else {
        0.0
    });
    let c = mesh.counters();
    for kind in MessageKind::ALL {
        let i = kind as usize;
        if i >= c.stream_in.len() {
            continue;
        }
        let k = kind.as_str();
        counter!("shoal_mesh_messages_total", "dir" => "in", "kind" => k)
            .absolute(c.stream_in[i].messages);
        counter!("shoal_mesh_messages_total", "dir" => "out", "kind" => k)
            .absolute(c.stream_out[i].messages);
        counter!("shoal_mesh_bytes_total", "dir" => "in", "kind" => k)
            .absolute(c.stream_in[i].bytes);
        counter!("shoal_mesh_bytes_total", "dir" => "out", "kind" => k)
            .absolute(c.stream_out[i].bytes);
    }
    for (reason, n) in &c.rejected {
        counter!("shoal_rejected_inputs_total", "source" => "mesh", "reason" => *reason)
            .absolute(*n);
    }
    counter!("shoal_revision_gaps_total").absolute(c.gaps_detected);
    counter!("shoal_full_snapshot_fallbacks_total").absolute(c.snapshots_installed);
    counter!("shoal_full_snapshots_refused_total").absolute(c.snapshots_refused);
    counter!("shoal_anti_entropy_rounds_total").absolute(c.anti_entropy_rounds);
    counter!("shoal_idle_timers_skipped_total").absolute(c.idle_timers_skipped);
    counter!("shoal_push_pull_lists_total", "outcome" => "sent").absolute(c.push_pull_lists_sent);
    counter!("shoal_push_pull_lists_total", "outcome" => "limited").absolute(c.push_pull_limited);
    counter!("shoal_mesh_overflow_total", "queue" => "outbox").absolute(c.outbox_overflow);
    counter!("shoal_mesh_overflow_total", "queue" => "transmit").absolute(c.transmit_overflow);
    counter!("shoal_mesh_overflow_total", "queue" => "event").absolute(c.event_overflow);
    let merge = mesh.catalog().counters();
    counter!("shoal_catalog_merges_total", "outcome" => "applied").absolute(merge.applied);
    counter!("shoal_catalog_merges_total", "outcome" => "stale").absolute(merge.stale);
    counter!("shoal_catalog_merges_total", "outcome" => "duplicate").absolute(merge.duplicate);
    counter!("shoal_rejected_inputs_total", "source" => "catalog", "reason" => "conflict")
        .absolute(merge.conflict);
    counter!("shoal_rejected_inputs_total", "source" => "catalog", "reason" => "bad_signature")
        .absolute(merge.bad_signature);
    gauge!("shoal_catalog_entries").set(mesh.catalog().len() as f64);
    let t = transport;
    counter!("shoal_transport_handshakes_refused_total").absolute(t.handshakes_refused);
    counter!("shoal_transport_connects_failed_total").absolute(t.connects_failed);
    counter!("shoal_transport_connections_established_total").absolute(t.connections_established);
    for (channel, dir, n) in [
        ("datagram", "in", t.datagrams_in),
        ("datagram", "out", t.datagrams_out),
        ("stream", "in", t.stream_msgs_in),
        ("stream", "out", t.stream_msgs_out),
    ] {
        counter!("shoal_transport_messages_total", "channel" => channel, "dir" => dir).absolute(n);
    }
    counter!("shoal_transport_bytes_total", "dir" => "in").absolute(t.bytes_in);
    counter!("shoal_transport_bytes_total", "dir" => "out").absolute(t.bytes_out);
    counter!("shoal_transport_dropped_total", "why" => "oversize").absolute(t.oversize_dropped);
    counter!("shoal_transport_dropped_total", "why" => "queue").absolute(t.queue_overflow);
    counter!("shoal_transport_dropped_total", "why" => "inbound").absolute(t.inbound_dropped);
    gauge!("shoal_transport_connections").set(t.connections_open as f64);
}
