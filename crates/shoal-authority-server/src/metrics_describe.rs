//! HELP and TYPE of every metric the authority replica emits (`metrics::describe_*`), so a
//! scrape of `metrics_addr` passes `promtool check metrics` like the agent's does
//! (`crates/shoal-agent/src/metrics_describe.rs`). A metric added elsewhere without a line here
//! renders without HELP; `tests/callers/run.sh` runs promtool on a live replica's scrape.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// (name, help) of every counter.
const COUNTERS: &[(&str, &str)] = &[
    (
        "shoal_authority_audit_append_failures_total",
        "Failed appends to audit.log (full disk, I/O error); the lines wait in memory (crate::audit_file).",
    ),
    (
        "shoal_authority_audit_gaps_total",
        "audit_gap lines written: audit lines that could not be kept (backlog full, or a snapshot's ring no longer holds them).",
    ),
    (
        "shoal_authority_leader_changes_total",
        "Leader changes this replica observed.",
    ),
    (
        "shoal_authority_liveness_proposals_total",
        "Lease safety-net proposals (expiries of instances whose node is down), by kind.",
    ),
    (
        "shoal_authority_liveness_suppressed_total",
        "Lease safety-net proposals withheld (e.g. during the takeover grace).",
    ),
    (
        "shoal_authority_membership_changes_total",
        "Replica-set changes (members add/remove) handled, by operation and result.",
    ),
    (
        "shoal_authority_mesh_boot_persist_total",
        "Writes of a boot generation the embedded member renewed itself to after being declared down (mesh.boot), by result; on error the member runs under the unwritten generation and retries every second.",
    ),
    (
        "shoal_authority_mesh_book_persist_total",
        "Writes of the embedded member's address book (members.json), by result.",
    ),
    (
        "shoal_authority_mesh_dropped_total",
        "Embedded mesh member work dropped because a bounded queue was full, by queue.",
    ),
    (
        "shoal_authority_mesh_members_file_refused_total",
        "Embedded member starts that refused a torn or corrupt members.json.",
    ),
    (
        "shoal_authority_mesh_overflow_total",
        "Embedded mesh member overflows of the core's bounded queues, by queue.",
    ),
    (
        "shoal_authority_mesh_publish_refused_total",
        "Committed records the embedded member refused to publish.",
    ),
    (
        "shoal_authority_mesh_published_total",
        "Committed records published into the region mesh by the embedded member.",
    ),
    (
        "shoal_authority_mesh_rejected_total",
        "Records the embedded member rejected, by reason (bad_signature, conflict).",
    ),
    (
        "shoal_authority_mesh_send_errors_total",
        "Embedded member mesh sends the transport refused (queue full, oversize, shut down).",
    ),
    (
        "shoal_authority_mesh_transport_dropped_total",
        "Embedded member datagrams/messages dropped by the transport, by why.",
    ),
    (
        "shoal_authority_records_signed_total",
        "Lifecycle records signed after commit.",
    ),
    (
        "shoal_authority_refusals_total",
        "Requests refused by the authority rules or access checks, by code.",
    ),
    (
        "shoal_authority_replays_total",
        "Retried writes (same caller and request id) not applied again, by outcome: in_flight (dropped, the first attempt's reply answers it), answered (the committed answer sent again).",
    ),
    (
        "shoal_authority_rpc_rejected_total",
        "Agent RPCs rejected before reaching the rules (malformed, oversize, overload), by reason.",
    ),
    (
        "shoal_authority_writes_total",
        "Agent and operator writes (registrations, transitions, ...) proposed to Raft, by outcome.",
    ),
    (
        "shoal_renewal_writes_total",
        "Lease renewal writes committed by this leader: NodeUp entries for a node held down and seen alive again (crate::renewals).",
    ),
    (
        "shoal_leases_renewed_total",
        "Live records whose lease the committed NodeUp entries renewed (one entry renews every lease of its node).",
    ),
    (
        "shoal_cross_region_bytes_total",
        "Bytes of remote-region summary replies received, by region.",
    ),
    (
        "shoal_global_policy_rejected_total",
        "Global policy documents refused (bad signature, unknown key, not newer).",
    ),
    (
        "shoal_region_pulls_total",
        "Summary pulls from remote regions, by region and result.",
    ),
    (
        "shoal_region_summaries_served_total",
        "Signed summaries served to other regions' gateways.",
    ),
    (
        "shoal_remote_summaries_rejected_total",
        "Remote summaries refused, by reason (unverified, wrong_region, older).",
    ),
    (
        "shoal_tls_reloads_total",
        "TLS material reloads (SIGHUP), by result.",
    ),
];

/// (name, help) of every gauge.
const GAUGES: &[(&str, &str)] = &[
    (
        "shoal_authority_audit_backlog_lines",
        "Audit lines waiting in memory because appending to audit.log failed (0 when healthy).",
    ),
    (
        "shoal_authority_applied_index",
        "Last Raft log index applied by this replica.",
    ),
    (
        "shoal_authority_is_leader",
        "1 while this replica is the Raft leader, else 0.",
    ),
    (
        "shoal_authority_mesh_catalog_entries",
        "Entries in the embedded mesh member's catalog.",
    ),
    (
        "shoal_authority_mesh_members",
        "Members in the embedded member's SWIM view, by state (alive, down).",
    ),
    (
        "shoal_authority_quorum",
        "1 while this replica knows a leader with a live majority, else 0.",
    ),
    ("shoal_authority_term", "Current Raft term."),
    (
        "shoal_remote_summaries",
        "Remote-region summaries held beside the catalog.",
    ),
    (
        "shoal_tls_cert_expiry_seconds",
        "Seconds until the presented certificate expires.",
    ),
];

/// (name, help) of every histogram (seconds).
const HISTOGRAMS: &[(&str, &str)] = &[(
    "shoal_authority_commit_latency_seconds",
    "Time from proposing a write to its commit and apply, seconds.",
)];

/// Describes every metric and registers the required ones at zero. Call once after the
/// recorder is installed.
pub fn describe_all() {
    for (name, help) in COUNTERS {
        describe_counter!(*name, *help);
    }
    for (name, help) in GAUGES {
        let unit = if name.ends_with("_seconds") {
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
    // The required counters (tests/callers/required_metrics.txt) exist from the first scrape.
    metrics::counter!("shoal_authority_writes_total", "outcome" => "committed").increment(0);
    crate::renewals::register_zero();
    metrics::gauge!("shoal_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    describe_gauge!(
        "shoal_build_info",
        "Always 1; the version label names the running build."
    );
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;

    #[test]
    fn every_required_authority_metric_has_help_type_and_a_series_before_any_event() {
        // Buckets as the real recorders set them (without, histograms render as summaries).
        let recorder = PrometheusBuilder::new()
            .set_buckets(&[0.001, 0.1, 1.0])
            .unwrap()
            .build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, super::describe_all);
        let text = handle.render();
        let wanted: Vec<&str> = include_str!("../../../tests/callers/required_metrics.txt")
            .lines()
            .filter(|l| l.starts_with("authority "))
            .filter_map(|l| l.split_whitespace().nth(1))
            .collect();
        assert!(wanted.len() >= 4, "the list was read: {wanted:?}");
        for name in wanted {
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name}: no HELP line in\n{text}"
            );
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}: no TYPE");
            let series = text
                .lines()
                .any(|l| !l.starts_with('#') && l.starts_with(name));
            assert!(series, "{name}: no series");
        }
    }
}
