//! HELP and TYPE of every metric the agent emits (`metrics::describe_*`), zero values for the
//! metrics REQUIREMENTS.md names (so they exist from the first scrape, before their first
//! event; the list, per process, is `tests/callers/required_metrics.txt`, and the tests below
//! fail when one is missing), `shoal_build_info`, and the standard `process_*` metrics read
//! from `/proc/self`.
//!
//! `promtool check metrics` runs on a real scrape in CI (`tests/callers/run.sh`). A metric added
//! elsewhere without a line here shows up there without HELP and fails that check.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, Unit};

/// (name, help) of every counter.
const COUNTERS: &[(&str, &str)] = &[
    ("shoal_anti_entropy_rounds_total", "Anti-entropy rounds started with a random member."),
    ("shoal_api_accept_errors_total", "Local API accept() failures (e.g. EMFILE); the agent backs off 20 ms."),
    ("shoal_api_connections_closed_total", "Local API connections closed by the agent, by why (header_timeout, error)."),
    ("shoal_api_connections_refused_total", "Local API connections refused at accept, by why (per_uid 429, total 503, no_peer_cred)."),
    ("shoal_api_index_overflow_total", "Blocking queries that followed the whole-view index because the per-service index table was full."),
    ("shoal_api_refusal_logs_suppressed_total", "Refused local writes not logged again (logged once per caller, route and reason)."),
    ("shoal_api_refusals_total", "Local API requests refused by the [access] policy, by route and reason."),
    ("shoal_api_writes_total", "Local API writes by route and result (accepted, refused, invalid, failed)."),
    ("shoal_apply_times_dropped_total", "Apply times not recorded because the apply-time map was full."),
    ("shoal_audit_write_failures_total", "Development authority audit-log writes that failed."),
    ("shoal_authority_replays_total", "Development authority: retried writes answered from the replay cache instead of applied again, by outcome (answered)."),
    ("shoal_authority_writes_total", "Registration and lifecycle writes sent to the region authority, by op and result."),
    ("shoal_catalog_merges_total", "Catalog merges of received records, by outcome (applied, stale, duplicate)."),
    ("shoal_consul_accept_errors_total", "Consul-compatible port accept() failures."),
    ("shoal_consul_connections_closed_total", "Consul-compatible port connections closed by the agent, by why (header_timeout: no request head within 10 s, idle keep-alive included; error)."),
    ("shoal_consul_connections_refused_total", "Consul-compatible port connections closed at accept over [consul] max_connections."),
    ("shoal_dev_authority_floor_raises_total", "Development authority starts whose state was behind what the mesh holds (lost, set aside or an older copy): numbering raised above it."),
    ("shoal_dev_authority_save_failures_total", "Development authority writes refused (503, undone) because its state file could not be saved."),
    ("shoal_dns_queries_total", "DNS queries answered, by response code (NOERROR includes NODATA; FORMERR includes packets that did not decode)."),
    ("shoal_dns_tcp_accept_errors_total", "DNS TCP accept() failures (e.g. EMFILE); the loop backs off 20 ms."),
    ("shoal_dns_tcp_connections_refused_total", "DNS TCP connections closed at accept over [dns] max_tcp_connections."),
    ("shoal_dns_udp_receive_errors_total", "DNS UDP receive failures."),
    ("shoal_files_set_aside_total", "Unreadable data-dir files moved aside to <name>.corrupt-<unix ms> (kept, never overwritten), by file."),
    ("shoal_full_snapshot_fallbacks_total", "Full snapshots installed after a gap, failed validation or expired delta retention."),
    ("shoal_full_snapshots_refused_total", "Full snapshots refused (bad checksum, signature or heads)."),
    ("shoal_health_flaps_total", "Health records applied that report failing readiness."),
    ("shoal_idle_timers_skipped_total", "Mesh timers with nothing to do (gossip, IHAVE, an acked probe's indirect stage, the reconnect tick) handled without waking the agent."),
    ("shoal_lifecycle_transitions_total", "Lifecycle records applied to this agent's catalog, by target state."),
    ("shoal_liveness_failures_total", "Liveness probe failures of local instances (restart signals)."),
    ("shoal_local_ejection_logs_suppressed_total", "Local ejections or capped failure reports not logged because the ejection log's table of (caller, endpoint) pairs was full."),
    ("shoal_local_ejections_total", "Failure reports by outcome: ejected (a new local ejection), renewed (one in force extended), capped (not applied: [api] max_ejection_percent of the service's routable endpoints are ejected), table_full (not applied: the node-wide ejection table is full)."),
    ("shoal_mesh_bytes_total", "Mesh stream bytes by direction and message kind."),
    ("shoal_mesh_messages_total", "Mesh stream messages by direction and message kind."),
    ("shoal_mesh_overflow_total", "Mesh queue overflows by queue (outbox, transmit, event); the item is dropped."),
    ("shoal_metrics_accept_errors_total", "Metrics port accept() failures (e.g. EMFILE); the loop backs off 20 ms."),
    ("shoal_metrics_connections_closed_total", "Metrics port connections closed by the agent, by why (header_timeout: no request head within [api] header_read_timeout_ms, idle keep-alive included; error)."),
    ("shoal_metrics_connections_refused_total", "Metrics port connections closed at accept over metrics_max_connections."),
    ("shoal_no_backend_total", "Pick requests answered \"no backend\" (503), by service (\"_unknown\" for a service neither in the catalog nor in the policy; one series \"_withheld\" for all when service keys are withheld, see metrics_service_labels)."),
    ("shoal_persist_total", "Persistence attempts by result: the catalog snapshot; what=probes, local probe definitions; what=boot, a boot generation renewed by a rejoin written to <data_dir>/boot (on error the agent runs under the unwritten generation and retries every second)."),
    ("shoal_probe_exec_total", "Exec probe incidents by result (spawn_error, timeout_killed)."),
    ("shoal_probes_total", "Health probes run, by kind and result."),
    ("shoal_push_pull_lists_total", "Membership push-pull lists, by outcome (sent, limited)."),
    ("shoal_reconnects_total", "Reconnects, by what (mesh, rejoin, authority, join_attempt)."),
    ("shoal_rejected_inputs_total", "Inputs rejected, by source and reason; nothing of them is applied."),
    ("shoal_requests_to_removed_endpoints_total", "Failure or success reports about endpoints no longer routable or unknown here."),
    ("shoal_revision_gaps_total", "Revision gaps detected in an origin's sequence."),
    ("shoal_snapshot_load_refused_total", "Persisted snapshots refused at boot (torn, truncated or failing checksum)."),
    ("shoal_stale_endpoint_failures_total", "Connection failures reported against endpoints no longer routable or unknown here."),
    ("shoal_swim_bytes_total", "SWIM datagram bytes by direction."),
    ("shoal_swim_datagrams_total", "SWIM datagrams by direction."),
    ("shoal_swim_identity_conflicts_total", "SWIM identity conflicts (same node, different identity)."),
    ("shoal_swim_members_learned_total", "Members learned through membership push-pull."),
    ("shoal_swim_contested_down_notices_total", "TurnUndead notices sent to members SWIM holds down while a peer's member list shows them alive (at most one per member per 10 s; membership/partition.rs)."),
    ("shoal_swim_downs_relearned_total", "Members this agent still listed as down, but SWIM no longer did (its down list was not carried across an identity renewal), learned again from a peer's member list."),
    ("shoal_swim_rejoins_total", "Times this agent renewed its identity after being declared down."),
    ("shoal_mesh_send_errors_total", "Mesh transmits (SWIM datagrams and stream messages) the transport refused: queue full, oversize or shut down (the shoal_transport_* counters say which); SWIM and anti-entropy repair what is lost."),
    ("shoal_swim_downs_withheld_total", "Suspect-to-down decisions withheld because most of this agent's own probes failed (membership/accuser.rs)."),
    ("shoal_swim_downs_voided_total", "Withheld suspect-to-down decisions dropped once this agent's probes succeeded again."),
    ("shoal_swim_renewals_withheld_total", "Identity renewals (TurnUndead) not acted on because most of this agent's own probes failed."),
    ("shoal_swim_downs_dropped_total", "Piggybacked Down updates dropped before foca: refuted (stale incarnation) or our own while our probes fail."),
    ("shoal_swim_reconnect_announces_total", "Announces sent by the reconnect tick to addresses of the address book (ADR 0010)."),
    ("shoal_swim_known_evicted_total", "Address-book entries forgotten or refused because the book was full."),
    ("shoal_members_file_refused_total", "Persisted address books (members.json) refused as torn or malformed; the agent started from its seeds."),
    ("shoal_swim_updates_deduplicated_total", "Repeated SWIM updates dropped before foca."),
    ("shoal_tls_reloads_total", "TLS material reloads on SIGHUP, by result (ok, error)."),
    ("shoal_quic_frames_sent_total", "QUIC frames sent, by kind (ack, ping, datagram, stream, crypto), over all connections; read at scrape time."),
    ("shoal_quic_packets_total", "UDP packets of the QUIC transport, by direction, over all connections; read at scrape time."),
    ("shoal_quic_socket_datagrams_in_total", "UDP datagrams the mesh port's socket received, whatever they were (counted below quinn); read at scrape time."),
    ("shoal_quic_datagrams_unclaimed_total", "Mesh port datagrams no established connection took: undecodable, unknown connection ID, refused or failed handshakes (socket datagrams minus shoal_quic_packets_total{dir=\"in\"}; approximate: includes handshakes in progress at a scrape)."),
    ("shoal_transport_bytes_total", "QUIC transport bytes by direction."),
    ("shoal_transport_connects_failed_total", "QUIC connection attempts that failed."),
    ("shoal_transport_connections_established_total", "QUIC connections established, dialled or accepted: each one cost a TLS 1.3 handshake."),
    ("shoal_transport_dropped_total", "QUIC messages dropped, by why (oversize, queue, inbound)."),
    ("shoal_transport_messages_total", "Messages the QUIC transport sent and received, by channel (datagram, stream) and direction: SWIM, mesh and authority traffic together."),
    ("shoal_transport_handshakes_refused_total", "Inbound QUIC handshakes refused (mTLS verification failed)."),
];

/// (name, help) of every gauge.
const GAUGES: &[(&str, &str)] = &[
    ("shoal_swim_known_addresses", "Addresses in the SWIM address book (seeds, members seen, restored; at most 512)."),
    ("shoal_swim_probes_failing", "1 while most of this agent's own probes fail (it withholds accusations and renewals), else 0."),
    (
        "shoal_api_connection_cap",
        "Local API connection caps in force, by scope (total, per_uid).",
    ),
    ("shoal_api_connections", "Open local API connections."),
    ("shoal_dns_tcp_connections", "Open DNS TCP connections."),
    (
        "shoal_authority_contact_age_seconds",
        "Seconds since the last answer of the region authority (+Inf until the first answer).",
    ),
    (
        "shoal_catalog_entries",
        "Catalog entries held (tombstones included).",
    ),
    (
        "shoal_members",
        "SWIM members by state (alive, suspect, down).",
    ),
    (
        "shoal_ready_endpoints",
        "Routable (READY, healthy, owner up, not ejected) endpoints per service (one series \"_withheld\", summed, when service keys are withheld: metrics_service_labels).",
    ),
    (
        "shoal_snapshot_age_seconds",
        "Age of the data served, seconds: since the last peer contact, else the persisted snapshot's age, else since start (+Inf before the first update).",
    ),
    (
        "shoal_tls_cert_expiry_seconds",
        "Seconds until the current certificate's notAfter.",
    ),
    ("shoal_transport_connections", "Open QUIC connections."),
    (
        "shoal_view_stale",
        "1 when the view is stale (no authority or peer contact within the staleness budget).",
    ),
    (
        "shoal_build_info",
        "Always 1; labels name the build (version).",
    ),
    (
        "process_resident_memory_bytes",
        "Resident memory size in bytes (/proc/self/statm).",
    ),
    (
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes (/proc/self/statm).",
    ),
    ("process_open_fds", "Open file descriptors (/proc/self/fd)."),
    (
        "process_max_fds",
        "Soft limit of open file descriptors (RLIMIT_NOFILE).",
    ),
    (
        "process_start_time_seconds",
        "Start time of the process since the Unix epoch, seconds.",
    ),
    (
        "process_threads",
        "Threads of the process (/proc/self/stat).",
    ),
];

/// (name, help) of every histogram (seconds).
const HISTOGRAMS: &[(&str, &str)] = &[
    (
        "shoal_authority_rpc_seconds",
        "Latency of authority RPCs (catalog write latency), by op.",
    ),
    (
        "shoal_probe_duration_seconds",
        "Health probe latency, by kind.",
    ),
    (
        "shoal_watch_lag_seconds",
        "Authority commit (its wall clock) to applied on this agent (ours).",
    ),
];

/// Counters REQUIREMENTS.md names, with the label sets registered at zero.
const REQUIRED_ZERO: &[(&str, &[(&str, &str)])] = &[
    ("shoal_health_flaps_total", &[]),
    ("shoal_revision_gaps_total", &[]),
    ("shoal_full_snapshot_fallbacks_total", &[]),
    ("shoal_requests_to_removed_endpoints_total", &[]),
    ("shoal_stale_endpoint_failures_total", &[]),
    ("shoal_reconnects_total", &[("what", "mesh")]),
    ("shoal_reconnects_total", &[("what", "authority")]),
    (
        "shoal_authority_writes_total",
        &[("op", "register"), ("result", "ok")],
    ),
    ("shoal_lifecycle_transitions_total", &[("to", "READY")]),
    ("shoal_lifecycle_transitions_total", &[("to", "DRAINING")]),
    // Refusals a local caller can cause at will: a series from the first scrape, so an alert
    // on their rate needs no "absent" clause.
    ("shoal_metrics_connections_refused_total", &[]),
];

/// Describes every metric and registers the required ones at zero. Call once after the
/// recorder is installed.
pub fn describe_all() {
    for (name, help) in COUNTERS {
        describe_counter!(*name, *help);
    }
    for (name, help) in GAUGES {
        let unit = if name.ends_with("_bytes") {
            Unit::Bytes
        } else if name.ends_with("_seconds") {
            Unit::Seconds
        } else {
            Unit::Count
        };
        describe_gauge!(*name, unit, *help);
    }
    for (name, help) in HISTOGRAMS {
        describe_histogram!(*name, Unit::Seconds, *help);
        // A registered histogram renders (empty buckets) before its first observation.
        let _ = metrics::histogram!(*name);
    }
    for (name, labels) in REQUIRED_ZERO {
        let labels: Vec<metrics::Label> = labels
            .iter()
            .map(|(k, v)| metrics::Label::new(*k, *v))
            .collect();
        counter!(*name, labels).increment(0);
    }
    // Ages before their first measurement: unknown, so +Inf (an alert on "older than N s"
    // fires, where an absent series would keep it silent). The driver overwrites them.
    gauge!("shoal_snapshot_age_seconds").set(f64::INFINITY);
    gauge!("shoal_authority_contact_age_seconds").set(f64::INFINITY);
    gauge!("shoal_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    record_process();
}

/// Sets the `process_*` gauges from `/proc/self` (Linux); leaves them unset elsewhere.
pub fn record_process() {
    let page = 4096.0;
    if let Ok(statm) = std::fs::read_to_string("/proc/self/statm") {
        let mut it = statm
            .split_whitespace()
            .map(|v| v.parse::<f64>().unwrap_or(0.0));
        let (size, resident) = (it.next().unwrap_or(0.0), it.next().unwrap_or(0.0));
        gauge!("process_virtual_memory_bytes").set(size * page);
        gauge!("process_resident_memory_bytes").set(resident * page);
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        gauge!("process_open_fds").set(dir.count() as f64);
    }
    if let Ok((soft, _)) = rlimit::getrlimit(rlimit::Resource::NOFILE) {
        gauge!("process_max_fds").set(soft as f64);
    }
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the parenthesised command name; `threads` is field 20, `starttime`
        // (clock ticks after boot) field 22 (proc(5)).
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            if let Some(t) = f.get(17).and_then(|v| v.parse::<f64>().ok()) {
                gauge!("process_threads").set(t);
            }
            if let (Some(start), Some(btime)) =
                (f.get(19).and_then(|v| v.parse::<f64>().ok()), boot_time())
            {
                // USER_HZ is 100 on every Linux ABI the agent targets.
                gauge!("process_start_time_seconds").set(btime + start / 100.0);
            }
        }
    }
}

fn boot_time() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;

    /// `tests/callers/required_metrics.txt`: (process, metric, scope) per line.
    pub(crate) fn required() -> Vec<(&'static str, &'static str, &'static str)> {
        include_str!("../../../tests/callers/required_metrics.txt")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let mut f = l.split_whitespace();
                (f.next().unwrap(), f.next().unwrap(), f.next().unwrap())
            })
            .collect()
    }

    #[test]
    fn every_required_agent_metric_has_help_type_and_a_series_before_any_event() {
        // Buckets as the real recorders set them (without, histograms render as summaries).
        let recorder = PrometheusBuilder::new()
            .set_buckets(&[0.001, 0.1, 1.0])
            .unwrap()
            .build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, super::describe_all);
        let text = handle.render();
        let wanted: Vec<_> = required()
            .into_iter()
            .filter(|(p, _, scope)| *p == "agent" && *scope == "always")
            .collect();
        assert!(wanted.len() >= 10, "the list was read: {wanted:?}");
        for (_, name, _) in wanted {
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name}: no HELP line in\n{text}"
            );
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name}: no TYPE line"
            );
            let series = text
                .lines()
                .any(|l| !l.starts_with('#') && l.starts_with(name));
            assert!(series, "{name}: no series");
        }
    }

    #[test]
    fn per_service_families_are_described_and_have_no_unlabelled_series() {
        // The per-service families have a HELP text waiting for their first series.
        for (p, name, scope) in required() {
            if p == "agent" && scope == "per_service" {
                let described = super::COUNTERS
                    .iter()
                    .chain(super::GAUGES)
                    .any(|(n, _)| *n == name);
                assert!(described, "{name} has no HELP text");
                assert!(
                    !super::REQUIRED_ZERO.iter().any(|(n, _)| *n == name),
                    "{name} is per service: no unlabelled zero series"
                );
            }
        }
    }
}
