//! Tombstone garbage collection, sharing equal maps between catalogs, and installing
//! snapshots.

use super::*;

impl Catalog {
    // ---- garbage collection --------------------------------------------------------------

    /// Drops EXPIRED tombstones of `region` whose revision is `<= horizon` (clamped to the
    /// region's contiguous head, so nothing unseen is ever declared collected) and raises the
    /// region's GC floor. Returns how many were dropped.
    pub fn collect_garbage(&mut self, region: &Region, horizon: Revision) -> usize {
        let Some(state) = self.regions.get_mut(region) else {
            return 0;
        };
        let horizon = horizon.min(Revision(state.head.contiguous()));
        if horizon <= state.gc_floor {
            return 0;
        }
        let mut doomed = Vec::new();
        for (rev, rec) in state.by_revision.range(..=horizon) {
            if rec.record.state == LifecycleState::Expired {
                doomed.push((*rev, rec.record.key.clone(), rec.record.instance.clone()));
            }
        }
        for (rev, key, instance) in &doomed {
            state.by_revision.remove(rev);
            let service = self.services.get_mut(key).expect("indexed");
            service.instances.remove(instance);
            if service.instances.is_empty() {
                self.services.remove(key);
            }
        }
        state.gc_floor = horizon;
        self.entries -= doomed.len();
        self.counters.collected += doomed.len() as u64;
        doomed.len()
    }

    // ---- sharing -------------------------------------------------------------------------

    /// Replaces each per-service instance map, per-owner health index and per-region revision
    /// index of this catalog that is *equal* to `other`'s with a shared copy of `other`'s.
    /// Only equal maps are swapped, so contents are unchanged and no merge, view, delta or
    /// snapshot can tell; memory shrinks when many catalogs hold the same records (the
    /// simulator's agents of one region). Cost: one comparison per map that is not already
    /// shared. Returns how many maps were swapped.
    pub fn share_equal_maps(&mut self, other: &Catalog) -> usize {
        // Both key sets are sorted: walk them side by side instead of looking each key up.
        let services: Vec<(ServiceKey, OrdMap<InstanceId, Entry>)> =
            matching(&self.services, &other.services, |s, o| {
                (!s.instances.ptr_eq(&o.instances) && s.instances == o.instances)
                    .then(|| o.instances.clone())
            });
        for (k, shared) in &services {
            self.services.get_mut(k).expect("listed").instances = shared.clone();
        }
        let owners: Vec<(NodeId, HealthBySeq)> = matching(&self.owners, &other.owners, |s, o| {
            (!s.by_seq.ptr_eq(&o.by_seq) && s.by_seq == o.by_seq).then(|| o.by_seq.clone())
        });
        for (n, shared) in &owners {
            self.owners.get_mut(n).expect("listed").by_seq = shared.clone();
        }
        let keys_shared =
            !self.node_keys.ptr_eq(&other.node_keys) && self.node_keys == other.node_keys;
        if keys_shared {
            self.node_keys = other.node_keys.clone();
        }
        let regions: Vec<Region> = self
            .regions
            .iter()
            .filter(|(r, s)| {
                other.regions.get(*r).is_some_and(|o| {
                    !s.by_revision.ptr_eq(&o.by_revision) && s.by_revision == o.by_revision
                })
            })
            .map(|(r, _)| r.clone())
            .collect();
        for r in &regions {
            let shared = other.regions[r].by_revision.clone();
            self.regions.get_mut(r).expect("listed").by_revision = shared;
        }
        services.len() + owners.len() + regions.len() + usize::from(keys_shared)
    }

    // ---- snapshots -----------------------------------------------------------------------

    /// GC floor of a region.
    pub fn gc_floor(&self, region: &Region) -> Revision {
        self.regions.get(region).map_or(Revision(0), |r| r.gc_floor)
    }

    pub(crate) fn raw_heads(&self) -> (Vec<RegionHead>, Vec<OwnerHead>) {
        let h = self.heads();
        (h.regions, h.owners)
    }

    /// Replaces everything this catalog holds for the snapshot's scope with the snapshot's
    /// contents, keeping local records that are *newer* than the snapshot. The snapshot must
    /// already be decoded and verified ([`crate::snapshot::decode`]); this step cannot fail, so
    /// the replacement is atomic.
    pub fn install(
        &mut self,
        snap: &crate::snapshot::Snapshot,
        verifier: &dyn Verifier,
    ) -> DeltaOutcome {
        // Drop local entries in scope that the snapshot proves superseded or collected.
        let heads: BTreeMap<&Region, &RegionHead> =
            snap.regions.iter().map(|h| (&h.region, h)).collect();
        let in_snapshot: std::collections::BTreeSet<(&ServiceKey, &InstanceId)> = snap
            .lifecycle
            .iter()
            .map(|r| (&r.record.key, &r.record.instance))
            .collect();
        let mut doomed = Vec::new();
        for (key, instance, entry) in self.entries() {
            if !snap.scope.contains(key) {
                continue;
            }
            let rec = &entry.lifecycle.val.record;
            let Some(head) = heads.get(&rec.region) else {
                continue;
            };
            if rec.revision <= head.contiguous && !in_snapshot.contains(&(key, instance)) {
                doomed.push((
                    key.clone(),
                    instance.clone(),
                    rec.region.clone(),
                    rec.revision,
                ));
            }
        }
        for (key, instance, region, revision) in doomed {
            self.remove_entry(&key, &instance, &region, revision);
        }
        let mut out = DeltaOutcome::default();
        for rec in &snap.lifecycle {
            tally(&mut out, &self.apply_lifecycle(rec.clone(), verifier));
        }
        for rec in &snap.health {
            tally(&mut out, &self.apply_health(rec.clone(), verifier));
        }
        if snap.scope.is_catalog() {
            for h in &snap.regions {
                let state = self.regions.entry(h.region.clone()).or_default();
                state.gc_floor = state.gc_floor.max(h.gc_floor);
                if h.contiguous.0 > state.head.contiguous() {
                    out.head_advanced |=
                        state.head.cover(0, state.head.contiguous(), h.contiguous.0);
                }
            }
            for h in &snap.owners {
                let state = self.owners.entry(h.owner.clone()).or_default();
                out.head_advanced |= state.head.cover(h.boot.0, 0, h.contiguous.0);
            }
        }
        self.index += 1;
        out
    }

    pub(super) fn remove_entry(
        &mut self,
        key: &ServiceKey,
        instance: &InstanceId,
        region: &Region,
        revision: Revision,
    ) {
        if let Some(r) = self.regions.get_mut(region) {
            r.by_revision.remove(&revision);
        }
        let service = self.services.get_mut(key).expect("entry exists");
        if let Some(entry) = service.instances.remove(instance) {
            self.entries -= 1;
            if let Some(h) = entry.health {
                if let Some(o) = self.owners.get_mut(&h.val.record.owner) {
                    o.by_seq
                        .remove(&(h.val.record.owner_boot, h.val.record.seq));
                }
            }
        }
        self.index += 1;
        service.modify_index = self.index;
        if service.instances.is_empty() {
            self.services.remove(key);
        }
    }
}
