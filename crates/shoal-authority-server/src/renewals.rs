//! Lease renewal writes: the only renewals that reach the region authority.
//!
//! REQUIREMENTS asks for the "renewal write rate" and for renewals aggregated by node agents
//! instead of 100k instances writing every 10 s. In shoal an instance never renews its own
//! lease: a record's lease runs only while its owner node is down in the leader's mesh view
//! (`shoal_authority::AuthorityState`, "Leases and leader changes"), so a live node renews every
//! lease it holds, locally and peer to peer, each time it answers a SWIM probe; nothing is
//! written for that. A renewal reaches the authority only when a node the state holds **down**
//! is seen alive again: the leader commits one `NodeUp`, which stops the lease clock of every
//! live record the node owns (docs/adr/0018-renewal-writes-and-xds-failover.md).
//!
//! Two counters make the aggregation visible, both counted by the leader once the entry has
//! committed (a follower never proposes one):
//! - `shoal_renewal_writes_total`: committed `NodeUp` entries (Raft writes that renew leases);
//! - `shoal_leases_renewed_total`: live (non-EXPIRED) records whose lease those entries
//!   renewed. `leases / writes` is the aggregation factor; 10,000 writes/s of per-instance
//!   renewals would show here as 10,000 leases/s at a handful of writes.

use shoal_authority::AuthorityState;
use shoal_proto::{LifecycleState, NodeId};

/// Live (non-EXPIRED) records `node` owns: the leases one `NodeUp` of it renews.
pub fn leases_of(state: &AuthorityState, node: &NodeId) -> u64 {
    state
        .bindings()
        .filter(|(_, _, b)| b.node() == node && b.state() != LifecycleState::Expired)
        .count() as u64
}

/// Counts one committed `NodeUp` of `node` that renewed `leases` leases.
pub fn record_node_up(leases: u64) {
    metrics::counter!("shoal_renewal_writes_total").increment(1);
    metrics::counter!("shoal_leases_renewed_total").increment(leases);
}

/// Registers both counters at zero (so they exist from the first scrape).
pub fn register_zero() {
    metrics::counter!("shoal_renewal_writes_total").increment(0);
    metrics::counter!("shoal_leases_renewed_total").increment(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    fn value(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    #[test]
    fn a_node_up_counts_one_write_and_the_leases_it_renewed() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            register_zero();
            let first = handle.render();
            assert_eq!(value(&first, "shoal_renewal_writes_total"), Some(0.0));
            assert_eq!(value(&first, "shoal_leases_renewed_total"), Some(0.0));
            record_node_up(3);
            record_node_up(0);
        });
        let text = handle.render();
        assert_eq!(value(&text, "shoal_renewal_writes_total"), Some(2.0));
        assert_eq!(value(&text, "shoal_leases_renewed_total"), Some(3.0));
    }

    #[test]
    fn an_empty_state_has_no_leases_to_renew() {
        let state = AuthorityState::new(shoal_proto::Region::new("dev").unwrap());
        assert_eq!(leases_of(&state, &NodeId::new("node-a").unwrap()), 0);
    }
}
