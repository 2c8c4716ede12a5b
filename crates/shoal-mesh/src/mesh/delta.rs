//! Deltas and full snapshots: the repair replies shared by GRAFT (`plumtree.rs`) and
//! anti-entropy (`anti_entropy.rs`). A delta carries a peer's missing records of one origin and
//! the range it declares complete; when the asker is below our GC floor (tombstones already
//! collected) it gets a full snapshot instead, so a collected record cannot be revived.

use std::net::SocketAddr;

use shoal_catalog::snapshot::{self, Snapshot, SnapshotScope};
use shoal_catalog::{DeltaError, MergeOutcome, OwnerHead, Verifier};
use shoal_proto::{Region, Revision};

use super::{Mesh, MeshEvent};
use crate::messages::{DeltaBody, StreamMessage, MAX_RECORDS_PER_DELTA};

impl<V: Verifier> Mesh<V> {
    /// Adds the region delta for a peer at `since`; on `Compacted` sends a snapshot instead and
    /// returns false.
    pub(super) fn add_lifecycle_delta(
        &mut self,
        delta: &mut DeltaBody,
        region: &Region,
        since: Revision,
        peer: SocketAddr,
    ) -> bool {
        match self
            .catalog
            .lifecycle_delta(region, since, MAX_RECORDS_PER_DELTA)
        {
            Ok(d) if !d.records.is_empty() || d.complete_to > since => {
                delta.lifecycle.push(d);
                true
            }
            Ok(_) => true,
            Err(DeltaError::Compacted { .. }) => {
                self.send_snapshot(peer);
                false
            }
        }
    }

    pub(super) fn add_health_delta(&mut self, delta: &mut DeltaBody, theirs: &OwnerHead) {
        let d = self.catalog.health_delta(
            &theirs.owner,
            theirs.boot,
            theirs.contiguous,
            MAX_RECORDS_PER_DELTA,
        );
        if !d.records.is_empty() || (d.boot, d.complete_to) > (theirs.boot, theirs.contiguous) {
            delta.health.push(d);
        }
    }

    pub(super) fn send_delta(&mut self, to: SocketAddr, delta: DeltaBody) {
        if delta.lifecycle.is_empty() && delta.health.is_empty() {
            return;
        }
        self.counters.deltas_sent += 1;
        self.send(to, &StreamMessage::Delta(delta));
    }

    pub(super) fn send_snapshot(&mut self, to: SocketAddr) {
        let snap = Snapshot::of(&self.catalog, SnapshotScope::Catalog, self.region.clone());
        let bytes = snapshot::encode(&snap);
        self.counters.snapshots_sent += 1;
        self.send(to, &StreamMessage::Snapshot(bytes));
    }

    pub(super) fn on_snapshot(&mut self, bytes: &[u8]) {
        match snapshot::decode(bytes, &self.verifier) {
            Ok(snap) => {
                let out = self.catalog.install(&snap, &self.verifier);
                self.counters.snapshots_installed += 1;
                for rec in &snap.lifecycle {
                    self.dirty_regions.insert(rec.record.region.clone());
                }
                self.push_event(MeshEvent::SnapshotInstalled {
                    records: out.applied,
                });
            }
            Err(_) => self.counters.snapshots_refused += 1,
        }
    }

    pub(super) fn on_delta(&mut self, from: SocketAddr, delta: DeltaBody) {
        self.counters.deltas_received += 1;
        for mut d in delta.lifecycle {
            d.records = d
                .records
                .into_iter()
                .map(|r| self.verifier.intern_lifecycle(r))
                .collect();
            let urgent: Vec<bool> = d
                .records
                .iter()
                .map(|r| self.is_urgent_lifecycle(r))
                .collect();
            let mut applied = Vec::new();
            let mut i = 0;
            self.catalog
                .apply_lifecycle_delta_observed(&d, &self.verifier, |rec, outcome| {
                    if *outcome == MergeOutcome::Applied {
                        applied.push((rec.clone(), urgent[i]));
                    }
                    i += 1;
                });
            for (rec, urgent) in applied {
                self.on_lifecycle_applied(rec, Some(from), urgent);
            }
        }
        for mut d in delta.health {
            d.records = d
                .records
                .into_iter()
                .map(|r| self.verifier.intern_health(r))
                .collect();
            let mut applied = Vec::new();
            self.catalog
                .apply_health_delta_observed(&d, &self.verifier, |rec, outcome| {
                    if *outcome == MergeOutcome::Applied {
                        applied.push(rec.clone());
                    }
                });
            for rec in applied {
                self.on_health_applied(rec, Some(from));
            }
        }
        self.clear_satisfied_missing();
    }
}
