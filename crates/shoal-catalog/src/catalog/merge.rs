//! Merging single records into a [`Catalog`]: verification, the lifecycle and health joins,
//! learning and revoking node keys from lifecycle records, and health records held until their
//! lifecycle record (or the record binding their signer) arrives.

use super::*;

impl Catalog {
    // ---- merging single records ----------------------------------------------------------

    /// Verifies and merges one lifecycle record. Returns what happened; only `Applied` changes
    /// the held records (the region's head may advance on `Stale`/`Duplicate` too, since the
    /// revision is then accounted for).
    pub fn apply_lifecycle(
        &mut self,
        record: Arc<SignedLifecycle>,
        verifier: &dyn Verifier,
    ) -> MergeOutcome {
        self.apply_lifecycle_replacing(record, verifier).0
    }

    /// [`Catalog::apply_lifecycle`], also telling the state of the record an `Applied` one
    /// replaced (`None`: the instance was not held). What a caller would otherwise learn by
    /// looking the entry up before merging, from the lookup the merge makes anyway (the mesh
    /// asks it of every EXPIRED record it is pushed, to judge its urgency). For any other
    /// outcome the state is not looked up and `None` is returned.
    pub fn apply_lifecycle_replacing(
        &mut self,
        record: Arc<SignedLifecycle>,
        verifier: &dyn Verifier,
    ) -> (MergeOutcome, Option<LifecycleState>) {
        let (outcome, replaced) = self.merge_lifecycle(record, verifier);
        self.counters.count(&outcome);
        (outcome, replaced)
    }

    pub(super) fn merge_lifecycle(
        &mut self,
        signed: Arc<SignedLifecycle>,
        verifier: &dyn Verifier,
    ) -> (MergeOutcome, Option<LifecycleState>) {
        let rec = &signed.record;
        // Fast path for the common repeat (Plumtree and anti-entropy deliver most records more
        // than once): the record held under this revision is this very record, so it was
        // verified and its revision observed when it was stored. Same outcome as the full
        // path below, with one lookup instead of several.
        //
        // One revision names one transition: a record reusing a revision held by another
        // instance is a fault (two leaders, a forged record), never a second truth. Decided
        // from the same lookup (nothing below changes the revision index before it is used).
        let reused = match self
            .regions
            .get(&rec.region)
            .and_then(|r| r.by_revision.get(&rec.revision))
        {
            Some(held) if Arc::ptr_eq(held, &signed) || **held == *signed => {
                return (MergeOutcome::Duplicate, None);
            }
            Some(held) => (&held.record.key, &held.record.instance) != (&rec.key, &rec.instance),
            None => false,
        };
        if let Err(e) = verifier.verify_lifecycle(&signed) {
            return (MergeOutcome::BadSignature(e), None);
        }
        let region = match self.regions.get_mut(&rec.region) {
            Some(region) => region,
            None => self.regions.entry(rec.region.clone()).or_default(),
        };
        let marker = rec.order();
        let held = self
            .services
            .get(&rec.key)
            .and_then(|s| s.instances.get(&rec.instance));
        let outcome = match held {
            None if rec.revision <= region.gc_floor => MergeOutcome::Stale,
            None if self.entries >= self.max_entries => return (MergeOutcome::Full, None),
            None => MergeOutcome::Applied,
            Some(entry) => {
                if entry.lifecycle.validate_update(&signed, &marker).is_err() {
                    MergeOutcome::Conflict
                } else if marker < entry.lifecycle.marker {
                    MergeOutcome::Stale
                } else if marker == entry.lifecycle.marker {
                    MergeOutcome::Duplicate
                } else {
                    MergeOutcome::Applied
                }
            }
        };
        let replaced = held.map(|e| e.lifecycle.val.record.state);
        let outcome = if outcome == MergeOutcome::Applied && reused {
            MergeOutcome::Conflict
        } else {
            outcome
        };
        if region.head.observe(0, rec.revision.0) == Observed::Overflow {
            self.counters.pending_overflow += 1;
        }
        // Every verified record teaches the owner's key, stale ones too: health signed by a
        // key an older record bound must be judged the same whatever the arrival order.
        let learnt = matches!(
            outcome,
            MergeOutcome::Applied | MergeOutcome::Stale | MergeOutcome::Duplicate
        ) && self.learn_keys(&signed);
        let owner = learnt.then(|| signed.record.owner.clone());
        if outcome == MergeOutcome::Applied {
            if self.early_count == 0 {
                // Nothing held early, so nothing to admit (and storing holds nothing).
                self.store_lifecycle(signed);
            } else {
                let (key, instance) = (signed.record.key.clone(), signed.record.instance.clone());
                self.store_lifecycle(signed);
                self.admit_early(&key, &instance, verifier);
            }
        }
        if let Some(owner) = owner {
            self.recheck_owner(&owner, verifier);
        }
        let replaced = if outcome == MergeOutcome::Applied {
            replaced
        } else {
            None
        };
        (outcome, replaced)
    }

    /// Learns the owner key (or revocation) a verified lifecycle record carries; true when
    /// something new was learnt (held health of that node must then be judged again).
    pub(super) fn learn_keys(&mut self, signed: &SignedLifecycle) -> bool {
        let rec = &signed.record;
        let revoked = rec.reason == TransitionReason::NodeRevoked;
        // Most records repeat what is known: decide that without copying anything.
        let news = match self.node_keys.get(&rec.owner) {
            None => revoked || rec.owner_key.is_some(),
            Some(known) => {
                (revoked && rec.revision > known.revoked_at)
                    || rec.owner_key.is_some_and(|b| {
                        known
                            .keys
                            .iter()
                            .find(|(k, _)| k.to_bytes() == b)
                            .is_none_or(|(_, first)| rec.revision < *first)
                    })
            }
        };
        if !news {
            return false;
        }
        if self.node_keys.len() >= MAX_NODES_WITH_KEYS && !self.node_keys.contains_key(&rec.owner) {
            self.counters.pending_overflow += 1;
            return false;
        }
        let mut keys = self.node_keys.get(&rec.owner).cloned().unwrap_or_default();
        if revoked {
            keys.revoke(rec.revision);
        }
        if let Some(k) = &rec.owner_key {
            keys.bind(k, rec.revision);
        }
        self.node_keys.insert(rec.owner.clone(), keys);
        true
    }

    pub(super) fn store_lifecycle(&mut self, signed: Arc<SignedLifecycle>) {
        self.index += 1;
        let index = self.index;
        let rec = &signed.record;
        let marker = rec.order();
        let region = self
            .regions
            .get_mut(&rec.region)
            .expect("region created on merge");
        region.by_revision.insert(rec.revision, Arc::clone(&signed));
        // One lookup when the service is known (the common case), not `entry`'s two.
        let service = match self.services.get_mut(&rec.key) {
            Some(service) => service,
            None => self.services.entry(rec.key.clone()).or_default(),
        };
        service.modify_index = index;
        match service.instances.get_mut(&rec.instance) {
            None => {
                service.instances.insert(
                    rec.instance.clone(),
                    Entry {
                        lifecycle: LWWReg {
                            val: signed,
                            marker,
                        },
                        health: None,
                    },
                );
                self.entries += 1;
            }
            Some(entry) => {
                let old = &entry.lifecycle.val.record;
                if old.region == rec.region {
                    region.by_revision.remove(&old.revision);
                } else if let Some(r) = self.regions.get_mut(&old.region) {
                    r.by_revision.remove(&old.revision);
                }
                // Health stays only while it is of this generation and signed by the key this
                // record binds: a re-issue for a replaced key drops health of the old key.
                let drop_health = entry.health.as_ref().is_some_and(|h| {
                    h.marker.0 < marker.0 || Some(h.val.signer) != bound_key_id(rec)
                }) || rec.state == LifecycleState::Expired;
                if drop_health {
                    if let Some(h) = entry.health.take() {
                        let hr = &h.val.record;
                        if let Some(o) = self.owners.get_mut(&hr.owner) {
                            o.by_seq.remove(&(hr.owner_boot, hr.seq));
                        }
                    }
                }
                entry.lifecycle.update(signed, marker);
            }
        }
    }

    /// Verifies and merges one health record. Accepted only when the lifecycle register holds
    /// the same generation and names the signer's node as owner.
    pub fn apply_health(
        &mut self,
        record: Arc<SignedHealth>,
        verifier: &dyn Verifier,
    ) -> MergeOutcome {
        let outcome = self.merge_health(record, verifier);
        self.counters.count(&outcome);
        outcome
    }

    pub(super) fn merge_health(
        &mut self,
        signed: Arc<SignedHealth>,
        verifier: &dyn Verifier,
    ) -> MergeOutcome {
        let rec = &signed.record;
        // Which key may have signed it: one a verified lifecycle record bound to its owner.
        let checked = match self
            .node_keys
            .get(&rec.owner)
            .map_or(KeyStatus::Unknown, |k| k.status(signed.signer))
        {
            KeyStatus::Unknown => Ok(None),
            KeyStatus::Revoked => Err(SignatureError::Revoked(signed.signer)),
            KeyStatus::Bound(key, first) => {
                verifier.verify_health(&signed, key).map(|()| Some(first))
            }
        };
        let first_bound = match checked {
            Err(e) => return MergeOutcome::BadSignature(e),
            Ok(None) => return self.hold_early(signed, false),
            Ok(Some(first)) => first,
        };
        let Some(entry) = self
            .services
            .get(&rec.key)
            .and_then(|s| s.instances.get(&rec.instance))
        else {
            return self.hold_early(signed, true);
        };
        let life = &entry.lifecycle.val.record;
        if life.generation < rec.generation {
            return self.hold_early(signed, true);
        }
        if life.generation > rec.generation || life.state == LifecycleState::Expired {
            self.observe_owner(rec.owner.clone(), rec.owner_boot, rec.seq);
            return MergeOutcome::Stale;
        }
        if life.owner != rec.owner {
            return MergeOutcome::NotOwner;
        }
        if bound_key_id(life) != Some(signed.signer) {
            // Signed by another key of the owner. One bound after this record was signed may
            // be re-bound to the instance by a re-issue on its way: wait for it. An older one
            // was replaced: its health is superseded (ADR 0006).
            if first_bound > life.revision {
                return self.hold_early(signed, true);
            }
            self.observe_owner(rec.owner.clone(), rec.owner_boot, rec.seq);
            return MergeOutcome::Stale;
        }
        let marker = rec.order();
        let outcome = match &entry.health {
            None => MergeOutcome::Applied,
            Some(h) if h.validate_update(&signed, &marker).is_err() => MergeOutcome::Conflict,
            Some(h) if marker < h.marker => MergeOutcome::Stale,
            Some(h) if marker == h.marker => MergeOutcome::Duplicate,
            Some(_) => MergeOutcome::Applied,
        };
        self.observe_owner(rec.owner.clone(), rec.owner_boot, rec.seq);
        if outcome == MergeOutcome::Applied {
            self.store_health(signed);
        }
        outcome
    }

    /// Keeps a health record that cannot be judged yet: its lifecycle record (generation) has
    /// not arrived (`verified`), or its signer is no key bound to its owner yet (not
    /// `verified`). Each record is held under its own marker and owner, so a forged record
    /// never displaces a genuine one; a held record counts nowhere until it is judged.
    pub(super) fn hold_early(&mut self, signed: Arc<SignedHealth>, verified: bool) -> MergeOutcome {
        let outcome = if verified {
            MergeOutcome::Unadmitted
        } else {
            MergeOutcome::Unverified
        };
        let slot = (signed.record.key.clone(), signed.record.instance.clone());
        let at = (signed.record.order(), signed.record.owner.clone());
        let full = self.early_count >= MAX_EARLY_HEALTH;
        let held = self.early_health.get(&slot).and_then(|m| m.get(&at));
        match held {
            // A genuine record replaces a forged one held under its marker.
            Some(h) if !h.verified && verified && *h.record != *signed => {}
            Some(h) if h.verified && verified && *h.record != *signed => {
                return MergeOutcome::Conflict
            }
            Some(_) => return outcome,
            None if full => return outcome,
            None => self.early_count += 1,
        }
        self.early_health.entry(slot).or_default().insert(
            at,
            Held {
                record: signed,
                verified,
            },
        );
        outcome
    }

    /// After a lifecycle record of this slot is stored, judges the health records held for
    /// it again.
    pub(super) fn admit_early(
        &mut self,
        key: &ServiceKey,
        instance: &InstanceId,
        verifier: &dyn Verifier,
    ) {
        if self.early_count == 0 {
            return;
        }
        let slot = (key.clone(), instance.clone());
        let Some(held) = self.early_health.remove(&slot) else {
            return;
        };
        self.early_count -= held.len();
        for (_, h) in held {
            self.rejudge(h.record, verifier);
        }
    }

    /// After something new was learnt about `owner`'s keys, judges every record held for the
    /// node again (unverified ones may verify now, verified ones may be revoked).
    pub(super) fn recheck_owner(&mut self, owner: &NodeId, verifier: &dyn Verifier) {
        if self.early_count == 0 {
            return;
        }
        let mut again = Vec::new();
        let slots: Vec<(ServiceKey, InstanceId)> = self
            .early_health
            .iter()
            .filter(|(_, m)| m.keys().any(|(_, n)| n == owner))
            .map(|(s, _)| s.clone())
            .collect();
        for slot in slots {
            let m = self.early_health.get_mut(&slot).expect("listed");
            let ats: Vec<_> = m.keys().filter(|(_, n)| n == owner).cloned().collect();
            for at in ats {
                again.push(m.remove(&at).expect("listed").record);
                self.early_count -= 1;
            }
            if m.is_empty() {
                self.early_health.remove(&slot);
            }
        }
        for record in again {
            self.rejudge(record, verifier);
        }
    }

    pub(super) fn rejudge(&mut self, record: Arc<SignedHealth>, verifier: &dyn Verifier) {
        let outcome = self.merge_health(record, verifier);
        if !matches!(
            outcome,
            MergeOutcome::Applied | MergeOutcome::Unadmitted | MergeOutcome::Unverified
        ) {
            self.counters.count(&outcome);
        }
    }

    pub(super) fn observe_owner(&mut self, owner: NodeId, boot: Generation, seq: HealthSeq) {
        let state = self.owners.entry(owner).or_default();
        if state.head.observe(boot.0, seq.0) == Observed::Overflow {
            self.counters.pending_overflow += 1;
        }
    }

    pub(super) fn store_health(&mut self, signed: Arc<SignedHealth>) {
        self.index += 1;
        let index = self.index;
        let rec = &signed.record;
        let marker = rec.order();
        let owner = self.owners.entry(rec.owner.clone()).or_default();
        owner
            .by_seq
            .insert((rec.owner_boot, rec.seq), Arc::clone(&signed));
        let service = self.services.get_mut(&rec.key).expect("checked in merge");
        service.modify_index = index;
        let entry = service
            .instances
            .get_mut(&rec.instance)
            .expect("checked in merge");
        match &mut entry.health {
            None => {
                entry.health = Some(LWWReg {
                    val: signed,
                    marker,
                })
            }
            Some(h) => {
                let old = &h.val.record;
                if let Some(o) = self.owners.get_mut(&old.owner) {
                    o.by_seq.remove(&(old.owner_boot, old.seq));
                }
                h.update(signed, marker);
            }
        }
    }
}
