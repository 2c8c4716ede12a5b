//! Plumtree peer sets and repair (Leitão, Pereira, Rodrigues, "Epidemic Broadcast Trees",
//! SRDS 2007): eager links carry full pushes and converge to a spanning tree (a redundant push
//! is answered by PRUNE, moving the link to lazy); lazy links get IHAVE announcements of
//! per-origin heads; a member that hears of records it lacks and does not receive them within
//! [`MeshConfig::graft_timeout_ms`](super::MeshConfig::graft_timeout_ms) GRAFTs the announcer.
//! Links are symmetric (an empty GRAFT asks the peer to push to us, as over HyParView's
//! symmetric active view) and at least
//! [`MeshConfig::min_eager`](super::MeshConfig::min_eager) are kept.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use rand_chacha::rand_core::Rng;
use shoal_catalog::{MergeOutcome, OwnerHead, RegionHead, Verifier};
use shoal_proto::{Generation, HealthSeq, NodeId, Region, Revision};

use super::{Mesh, MeshTimer};
use crate::messages::{DeltaBody, Graft, IHave, Prune, RecordPush, StreamMessage};

impl<V: Verifier> Mesh<V> {
    /// Keeps `eager + lazy` filled from the membership; new links start eager (Plumtree).
    pub(super) fn refill_peers(&mut self) {
        if !self.refill_wanted() {
            return;
        }
        let want = self.config.eager_fanout + self.config.lazy_fanout;
        let have = self.eager.len() + self.lazy.len();
        let candidates: Vec<SocketAddr> = self
            .members
            .values()
            .filter(|a| !self.eager.contains(a) && !self.lazy.contains(a))
            .copied()
            .collect();
        let mut candidates = candidates;
        for _ in have..want {
            if candidates.is_empty() {
                break;
            }
            let i = (self.rng.next_u64() % candidates.len() as u64) as usize;
            let addr = candidates.swap_remove(i);
            if self.eager.len() < self.config.eager_fanout {
                // Links are symmetric (Plumtree over HyParView's symmetric active view): an
                // empty GRAFT asks the peer to push to us as well.
                self.eager.insert(addr);
                self.send(addr, &StreamMessage::Graft(Graft::default()));
            } else {
                self.lazy.insert(addr);
            }
        }
    }

    /// `true` when [`Mesh::refill_peers`] would add links: fewer than `eager + lazy` fanout,
    /// and members without a link to take them from.
    fn refill_wanted(&self) -> bool {
        let want = self.config.eager_fanout + self.config.lazy_fanout;
        let have = self.eager.len() + self.lazy.len();
        have < want && self.members.len() > have
    }

    /// `true` when [`Mesh::promote_lazy`] would promote a link.
    fn promotion_wanted(&self) -> bool {
        self.eager.len() < self.config.min_eager && !self.lazy.is_empty()
    }

    /// `true` when an IHAVE tick would do nothing but re-arm itself: no head changed since the
    /// last announcement, and neither [`Mesh::refill_peers`] nor [`Mesh::promote_lazy`] has a
    /// link to add (so no RNG draw either).
    pub(super) fn ihave_idle(&self) -> bool {
        self.dirty_regions.is_empty()
            && self.dirty_owners.is_empty()
            && !self.refill_wanted()
            && !self.promotion_wanted()
    }

    /// Keeps at least `min_eager` eager links by promoting lazy ones (with an empty GRAFT, so
    /// the peer pushes to us too).
    pub(super) fn promote_lazy(&mut self) {
        while self.eager.len() < self.config.min_eager && !self.lazy.is_empty() {
            let i = (self.rng.next_u64() % self.lazy.len() as u64) as usize;
            let addr = *self.lazy.iter().nth(i).expect("non-empty");
            self.lazy.remove(&addr);
            self.eager.insert(addr);
            self.send(addr, &StreamMessage::Graft(Graft::default()));
        }
    }

    pub(super) fn on_push(&mut self, from: SocketAddr, push: RecordPush) {
        let mut new = false;
        for rec in push.lifecycle {
            let rec = self.verifier.intern_lifecycle(rec);
            // Urgency is judged from the record this one replaces, which the merge looks up
            // anyway: a lookup of its own before merging was 4 % of a full-scale rollout.
            let (outcome, replaced) = self
                .catalog
                .apply_lifecycle_replacing(rec.clone(), &self.verifier);
            if outcome == MergeOutcome::Applied {
                new = true;
                let urgent = super::coalesce::urgent_lifecycle(&rec, replaced);
                self.on_lifecycle_applied(rec, Some(from), urgent);
            }
        }
        for rec in push.health {
            let rec = self.verifier.intern_health(rec);
            if self.catalog.apply_health(rec.clone(), &self.verifier) == MergeOutcome::Applied {
                new = true;
                self.on_health_applied(rec, Some(from));
            }
        }
        self.clear_satisfied_missing();
        if new {
            self.lazy.remove(&from);
            self.eager.insert(from);
        } else if !self.eager.contains(&from) || self.eager.len() > self.config.min_eager {
            // Plumtree: a redundant eager push prunes the link on both ends. Answered even when
            // the sender is no longer our eager peer (we declared it down, or our earlier PRUNE
            // was lost with a connection): otherwise it pushes to us for nothing forever.
            // With several origins, each prunes different edges of the same loops; keeping at
            // least `min_eager` links stops the tree from falling apart under churn.
            if self.eager.remove(&from) {
                self.lazy.insert(from);
            }
            self.counters.prunes_sent += 1;
            self.send(from, &StreamMessage::Prune(Prune {}));
        }
    }

    pub(super) fn send_ihave(&mut self) {
        if self.dirty_regions.is_empty() && self.dirty_owners.is_empty() {
            return;
        }
        let heads = self.catalog.heads();
        let regions = std::mem::take(&mut self.dirty_regions);
        let owners = std::mem::take(&mut self.dirty_owners);
        let ihave = IHave {
            regions: heads
                .regions
                .iter()
                .filter(|h| regions.contains(&h.region))
                .map(|h| (h.region.clone(), h.max_seen))
                .collect(),
            owners: heads
                .owners
                .iter()
                .filter(|h| owners.contains(&h.owner))
                .map(|h| (h.owner.clone(), h.boot, h.contiguous))
                .collect(),
        };
        let msg = StreamMessage::IHave(ihave);
        let lazy: Vec<SocketAddr> = self.lazy.iter().copied().collect();
        for peer in lazy {
            self.send(peer, &msg);
        }
    }

    pub(super) fn on_ihave(&mut self, now_ms: u64, from: SocketAddr, ihave: IHave) {
        let deadline = now_ms + self.config.graft_timeout_ms;
        for (region, rev) in ihave.regions {
            if self.catalog.region_head(&region) < rev {
                self.missing_regions
                    .entry(region)
                    .or_insert((from, deadline, rev));
            }
        }
        let heads: BTreeMap<NodeId, (Generation, HealthSeq)> = if ihave.owners.is_empty() {
            BTreeMap::new()
        } else {
            self.catalog
                .heads()
                .owners
                .into_iter()
                .map(|h| (h.owner, (h.boot, h.contiguous)))
                .collect()
        };
        for (owner, boot, seq) in ihave.owners {
            if heads.get(&owner).copied().unwrap_or_default() < (boot, seq) {
                self.missing_owners
                    .entry(owner)
                    .or_insert((from, deadline, (boot, seq)));
            }
        }
        if !self.graft_armed
            && (!self.missing_regions.is_empty() || !self.missing_owners.is_empty())
        {
            self.graft_armed = true;
            self.push_timer(deadline, MeshTimer::Graft);
        }
    }

    pub(super) fn clear_satisfied_missing(&mut self) {
        if self.missing_regions.is_empty() && self.missing_owners.is_empty() {
            return;
        }
        let catalog = &self.catalog;
        self.missing_regions
            .retain(|region, (_, _, rev)| catalog.region_head(region) < *rev);
        if !self.missing_owners.is_empty() {
            let heads: BTreeMap<NodeId, (Generation, HealthSeq)> = catalog
                .heads()
                .owners
                .into_iter()
                .map(|h| (h.owner, (h.boot, h.contiguous)))
                .collect();
            self.missing_owners.retain(|owner, (_, _, want)| {
                heads.get(owner).copied().unwrap_or_default() < *want
            });
        }
    }

    pub(super) fn check_grafts(&mut self, now_ms: u64) {
        self.clear_satisfied_missing();
        let heads = self.catalog.heads();
        let mut by_peer: BTreeMap<SocketAddr, Graft> = BTreeMap::new();
        let due_regions: Vec<Region> = self
            .missing_regions
            .iter()
            .filter(|(_, (_, at, _))| *at <= now_ms)
            .map(|(r, _)| r.clone())
            .collect();
        for region in due_regions {
            let (peer, _, _) = self.missing_regions.remove(&region).expect("listed");
            let head = heads
                .regions
                .iter()
                .find(|h| h.region == region)
                .cloned()
                .unwrap_or(RegionHead {
                    region,
                    contiguous: Revision(0),
                    max_seen: Revision(0),
                    gc_floor: Revision(0),
                    pending_hash: 0,
                });
            by_peer.entry(peer).or_default().regions.push(head);
        }
        let due_owners: Vec<NodeId> = self
            .missing_owners
            .iter()
            .filter(|(_, (_, at, _))| *at <= now_ms)
            .map(|(o, _)| o.clone())
            .collect();
        for owner in due_owners {
            let (peer, _, _) = self.missing_owners.remove(&owner).expect("listed");
            let head = heads
                .owners
                .iter()
                .find(|h| h.owner == owner)
                .cloned()
                .unwrap_or(OwnerHead {
                    owner,
                    boot: Generation(0),
                    contiguous: HealthSeq(0),
                    pending_hash: 0,
                });
            by_peer.entry(peer).or_default().owners.push(head);
        }
        for (peer, graft) in by_peer {
            self.lazy.remove(&peer);
            self.eager.insert(peer);
            self.counters.grafts_sent += 1;
            self.send(peer, &StreamMessage::Graft(graft));
        }
        let next = self
            .missing_regions
            .values()
            .map(|(_, at, _)| *at)
            .chain(self.missing_owners.values().map(|(_, at, _)| *at))
            .min();
        if let Some(at) = next {
            self.graft_armed = true;
            self.push_timer(at, MeshTimer::Graft);
        }
    }

    pub(super) fn on_graft(&mut self, from: SocketAddr, graft: Graft) {
        self.lazy.remove(&from);
        self.eager.insert(from);
        let mut delta = DeltaBody::default();
        for h in &graft.regions {
            if !self.add_lifecycle_delta(&mut delta, &h.region, h.contiguous, from) {
                return;
            }
        }
        for h in &graft.owners {
            self.add_health_delta(&mut delta, h);
        }
        self.send_delta(from, delta);
    }
}
