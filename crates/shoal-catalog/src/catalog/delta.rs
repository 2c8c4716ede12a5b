//! Whole-catalog merges and deltas: what one catalog sends another for a range of revisions or
//! health sequences, and applying what arrives (with the completeness claims that close gaps).

use super::*;

impl Catalog {
    // ---- merging whole catalogs ----------------------------------------------------------

    /// Merges every record of `other` into `self` (lifecycle first, so health finds its
    /// admission), then adopts `other`'s heads where they extend ours without a hole.
    pub fn merge_catalog(&mut self, other: &Catalog, verifier: &dyn Verifier) -> DeltaOutcome {
        let mut out = DeltaOutcome::default();
        // Keys `other` learnt from records it no longer holds (superseded ones) count here
        // too, or a merge would judge health differently from applying every record.
        let mut learnt = Vec::new();
        for (node, theirs) in &other.node_keys {
            let mut ours = self.node_keys.get(node).cloned().unwrap_or_default();
            let before = ours.clone();
            ours.revoke(theirs.revoked_at);
            for (k, first) in &theirs.keys {
                ours.bind(&k.to_bytes(), *first);
            }
            if ours != before {
                self.node_keys.insert(node.clone(), ours);
                learnt.push(node.clone());
            }
        }
        for node in &learnt {
            self.recheck_owner(node, verifier);
        }
        for (_, _, e) in other.entries() {
            tally(
                &mut out,
                &self.apply_lifecycle(e.lifecycle.val.clone(), verifier),
            );
        }
        for (_, _, e) in other.entries() {
            if let Some(h) = &e.health {
                tally(&mut out, &self.apply_health(h.val.clone(), verifier));
            }
        }
        for early in other.early_health.values().flat_map(|m| m.values()) {
            tally(&mut out, &self.apply_health(early.record.clone(), verifier));
        }
        if out.rejected == 0 {
            for (region, theirs) in &other.regions {
                // Their completeness covers ours only if they collected no tombstone we have
                // not seen: otherwise a record they dropped could still be live here.
                let ours = self.regions.entry(region.clone()).or_default();
                if ours.head.contiguous() >= theirs.gc_floor.0 {
                    let before = ours.head.contiguous();
                    ours.head.join(&theirs.head);
                    out.head_advanced |= ours.head.contiguous() > before;
                }
            }
            for (owner, theirs) in &other.owners {
                let ours = self.owners.entry(owner.clone()).or_default();
                let before = (ours.head.epoch(), ours.head.contiguous());
                ours.head.join(&theirs.head);
                out.head_advanced |= (ours.head.epoch(), ours.head.contiguous()) > before;
            }
        }
        out
    }

    // ---- deltas --------------------------------------------------------------------------

    /// Lifecycle records of `region` that changed after `since`, at most `max_records`.
    ///
    /// # Errors
    /// [`DeltaError::Compacted`] when `since` is below this catalog's GC floor.
    pub fn lifecycle_delta(
        &self,
        region: &Region,
        since: Revision,
        max_records: usize,
    ) -> Result<LifecycleDelta, DeltaError> {
        let empty = LifecycleDelta {
            region: region.clone(),
            from: since,
            complete_to: since,
            records: Vec::new(),
            also_seen: Vec::new(),
        };
        let Some(state) = self.regions.get(region) else {
            return Ok(empty);
        };
        if since < state.gc_floor {
            return Err(DeltaError::Compacted {
                since,
                gc_floor: state.gc_floor,
            });
        }
        let mut records = Vec::new();
        let mut truncated_at = None;
        for (rev, rec) in state.by_revision.range(since.next()..) {
            if records.len() == max_records {
                truncated_at = Some(Revision(rev.0 - 1));
                break;
            }
            records.push(Arc::clone(rec));
        }
        let contiguous = Revision(state.head.contiguous());
        let complete_to = truncated_at
            .unwrap_or(contiguous)
            .min(contiguous)
            .max(since);
        let last = truncated_at.map_or(u64::MAX, |r| r.0);
        let also_seen = state
            .head
            .pending()
            .filter(|p| *p > complete_to.0 && *p <= last)
            .map(Revision)
            .collect();
        Ok(LifecycleDelta {
            complete_to,
            records,
            also_seen,
            ..empty
        })
    }

    /// Health records of `owner` newer than `(boot, since)`, at most `max_records`. When this
    /// catalog knows a newer boot of the owner, the delta starts at 0 of that boot.
    pub fn health_delta(
        &self,
        owner: &NodeId,
        boot: Generation,
        since: HealthSeq,
        max_records: usize,
    ) -> HealthDelta {
        let Some(state) = self.owners.get(owner) else {
            return HealthDelta {
                owner: owner.clone(),
                boot,
                from: since,
                complete_to: since,
                records: Vec::new(),
                also_seen: Vec::new(),
            };
        };
        let our_boot = Generation(state.head.epoch());
        let from = if our_boot > boot { HealthSeq(0) } else { since };
        let mut records = Vec::new();
        let mut truncated_at = None;
        if our_boot >= boot {
            let start = (our_boot, from.next());
            let end = (our_boot.next(), HealthSeq(0));
            let candidates: Vec<(HealthSeq, &Arc<SignedHealth>)> = state
                .by_seq
                .range(start..end)
                .map(|((_, seq), rec)| (*seq, rec))
                .collect();
            // Records held early are counted in no head, so no delta claims them and none
            // needs to carry them: peers get them from the chains that hold them.
            for (seq, rec) in candidates {
                if records.len() == max_records {
                    truncated_at = Some(HealthSeq(seq.0 - 1));
                    break;
                }
                records.push(Arc::clone(rec));
            }
        }
        let contiguous = HealthSeq(state.head.contiguous());
        let complete_to = if our_boot < boot {
            since
        } else {
            truncated_at.unwrap_or(contiguous).min(contiguous).max(from)
        };
        let last = truncated_at.map_or(u64::MAX, |r| r.0);
        let also_seen = if our_boot < boot {
            Vec::new()
        } else {
            state
                .head
                .pending()
                .filter(|p| *p > complete_to.0 && *p <= last)
                .map(HealthSeq)
                .collect()
        };
        HealthDelta {
            owner: owner.clone(),
            boot: our_boot.max(boot),
            from,
            complete_to,
            records,
            also_seen,
        }
    }

    /// Applies a lifecycle delta; extends the head by its completeness claim when every record
    /// in it was accepted.
    pub fn apply_lifecycle_delta(
        &mut self,
        delta: &LifecycleDelta,
        verifier: &dyn Verifier,
    ) -> DeltaOutcome {
        self.apply_lifecycle_delta_observed(delta, verifier, |_, _| {})
    }

    /// [`Catalog::apply_lifecycle_delta`], calling `observe` with each record's outcome.
    pub fn apply_lifecycle_delta_observed(
        &mut self,
        delta: &LifecycleDelta,
        verifier: &dyn Verifier,
        mut observe: impl FnMut(&Arc<SignedLifecycle>, &MergeOutcome),
    ) -> DeltaOutcome {
        let mut out = DeltaOutcome::default();
        for rec in &delta.records {
            let o = self.apply_lifecycle(rec.clone(), verifier);
            observe(rec, &o);
            tally(&mut out, &o);
        }
        if out.rejected == 0 {
            let state = self.regions.entry(delta.region.clone()).or_default();
            out.head_advanced = state.head.cover(0, delta.from.0, delta.complete_to.0);
            for seen in delta.also_seen.iter().take(crate::heads::MAX_PENDING) {
                state.head.observe(0, seen.0);
            }
        }
        out
    }

    /// Applies a health delta; extends the owner's head like
    /// [`Catalog::apply_lifecycle_delta`]. Unadmitted records also block the extension (they
    /// will be asked for again once their lifecycle record arrives).
    pub fn apply_health_delta(
        &mut self,
        delta: &HealthDelta,
        verifier: &dyn Verifier,
    ) -> DeltaOutcome {
        self.apply_health_delta_observed(delta, verifier, |_, _| {})
    }

    /// [`Catalog::apply_health_delta`], calling `observe` with each record's outcome.
    pub fn apply_health_delta_observed(
        &mut self,
        delta: &HealthDelta,
        verifier: &dyn Verifier,
        mut observe: impl FnMut(&Arc<SignedHealth>, &MergeOutcome),
    ) -> DeltaOutcome {
        let mut out = DeltaOutcome::default();
        let mut unadmitted = false;
        for rec in &delta.records {
            let o = self.apply_health(rec.clone(), verifier);
            observe(rec, &o);
            unadmitted |= matches!(o, MergeOutcome::Unadmitted | MergeOutcome::Unverified);
            tally(&mut out, &o);
        }
        if out.rejected == 0 && !unadmitted {
            let state = self.owners.entry(delta.owner.clone()).or_default();
            out.head_advanced = state
                .head
                .cover(delta.boot.0, delta.from.0, delta.complete_to.0);
            if state.head.epoch() == delta.boot.0 {
                for seen in delta.also_seen.iter().take(crate::heads::MAX_PENDING) {
                    state.head.observe(delta.boot.0, seen.0);
                }
            }
        }
        out
    }
}

pub(super) fn tally(out: &mut DeltaOutcome, o: &MergeOutcome) {
    match o {
        MergeOutcome::Applied => out.applied += 1,
        MergeOutcome::Stale
        | MergeOutcome::Duplicate
        | MergeOutcome::Unadmitted
        | MergeOutcome::Unverified => out.ignored += 1,
        MergeOutcome::Conflict
        | MergeOutcome::BadSignature(_)
        | MergeOutcome::NotOwner
        | MergeOutcome::Full => out.rejected += 1,
    }
}
