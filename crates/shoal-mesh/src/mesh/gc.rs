//! Tombstone garbage collection: the region heads sampled every
//! [`MeshConfig::gc_interval_ms`](super::MeshConfig::gc_interval_ms); the newest sample older
//! than [`MeshConfig::tombstone_retention_ms`](super::MeshConfig::tombstone_retention_ms) is
//! the horizon up to which EXPIRED records are collected (it becomes the region's GC floor).

use shoal_catalog::Verifier;
use shoal_proto::{Region, Revision};

use super::Mesh;

impl<V: Verifier> Mesh<V> {
    pub(super) fn collect_garbage(&mut self, now_ms: u64) {
        let heads: Vec<(Region, Revision)> = self
            .catalog
            .heads()
            .regions
            .into_iter()
            .map(|h| (h.region, h.contiguous))
            .collect();
        self.gc_samples.push_back((now_ms, heads));
        let cutoff = now_ms.saturating_sub(self.config.tombstone_retention_ms);
        let mut horizon = None;
        while self.gc_samples.front().is_some_and(|(t, _)| *t <= cutoff) {
            horizon = self.gc_samples.pop_front();
        }
        if let Some((t, heads)) = horizon {
            for (region, rev) in &heads {
                let n = self.catalog.collect_garbage(region, *rev);
                self.counters.tombstones_collected += n as u64;
            }
            // Keep the sample so the next round's horizon never moves backwards.
            self.gc_samples.push_front((t, heads));
        }
    }
}
