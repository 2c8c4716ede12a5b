//! The SWIM / dissemination overrides both daemons' config files accept: the agent's
//! `[membership]` section and the authority's `[mesh]` section (which adds its own liveness
//! rules beside these six).

use serde::Deserialize;
use shoal_mesh::MeshConfig;

/// Overrides of the tuned defaults of `MeshConfig::for_cluster_size` (ms; unset = default).
/// Both daemons must run roughly the same SWIM timings, so both read this one type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwimKnobs {
    /// SWIM probe period.
    pub probe_period_ms: Option<u64>,
    /// SWIM direct-ack wait.
    pub probe_rtt_ms: Option<u64>,
    /// Suspicion window.
    pub suspect_to_down_after_ms: Option<u64>,
    /// Gossip period.
    pub periodic_gossip_ms: Option<u64>,
    /// Join retry while not connected.
    pub join_retry_ms: Option<u64>,
    /// Anti-entropy period (at least 1 ms; a record-dissemination knob, not SWIM's, kept here
    /// because both files have always listed it with these).
    pub anti_entropy_interval_ms: Option<u64>,
}

impl SwimKnobs {
    /// Writes the set overrides into `mesh`; unset ones leave it as it was. The caller
    /// validates the result (`MembershipConfig::validate`).
    pub fn apply(&self, mesh: &mut MeshConfig) {
        let m = &mut mesh.membership;
        if let Some(v) = self.probe_period_ms {
            m.probe_period_ms = v;
        }
        if let Some(v) = self.probe_rtt_ms {
            m.probe_rtt_ms = v;
        }
        if let Some(v) = self.suspect_to_down_after_ms {
            m.suspect_to_down_after_ms = v;
        }
        if let Some(v) = self.periodic_gossip_ms {
            m.periodic_gossip_ms = v;
        }
        if let Some(v) = self.join_retry_ms {
            m.join_retry_ms = v;
        }
        if let Some(v) = self.anti_entropy_interval_ms {
            mesh.anti_entropy_interval_ms = v.max(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_knobs_override_and_unset_ones_keep_the_default() {
        let base = MeshConfig::for_cluster_size(64);
        let mut cfg = base.clone();
        SwimKnobs::default().apply(&mut cfg);
        assert_eq!(
            cfg.membership.probe_period_ms,
            base.membership.probe_period_ms
        );
        let k = SwimKnobs {
            probe_period_ms: Some(321),
            anti_entropy_interval_ms: Some(0),
            ..SwimKnobs::default()
        };
        k.apply(&mut cfg);
        assert_eq!(cfg.membership.probe_period_ms, 321);
        assert_eq!(cfg.membership.probe_rtt_ms, base.membership.probe_rtt_ms);
        assert_eq!(cfg.anti_entropy_interval_ms, 1);
    }
}
