//! Anti-entropy and membership push-pull. Every
//! [`MeshConfig::anti_entropy_interval_ms`](super::MeshConfig::anti_entropy_interval_ms)
//! (jittered) a member sends a random peer a digest: its region heads and one hash per bucket
//! of owner heads; the peer answers with the deltas the sender lacks, asks back for what it
//! lacks itself, and exchanges owner heads only for buckets whose hashes differ. The opening
//! digest also carries the member set hashed into buckets, which starts a membership push-pull
//! (memberlist's periodic state exchange) for the buckets that differ. This repairs lost pushes,
//! partitions, revision gaps and missed SWIM rumours (see `docs/architecture.md`).

use std::net::SocketAddr;

use rand_chacha::rand_core::Rng;
use shoal_catalog::{OwnerHead, RegionHead, Verifier};
use shoal_proto::{Generation, HealthSeq, NodeId, Revision};

use super::Mesh;
use crate::hash::{fnv1a, FNV_OFFSET};
use crate::membership::MemberId;
use crate::messages::{
    AntiEntropy, DeltaBody, StreamMessage, DIGEST_BUCKETS, MAX_MEMBERS_PER_MESSAGE,
};

impl<V: Verifier> Mesh<V> {
    fn random_member(&mut self) -> Option<SocketAddr> {
        if self.members.is_empty() {
            return None;
        }
        let i = (self.rng.next_u64() % self.members.len() as u64) as usize;
        self.members.values().nth(i).copied()
    }

    pub(super) fn start_anti_entropy(&mut self) {
        let Some(peer) = self.random_member() else {
            return;
        };
        self.counters.anti_entropy_rounds += 1;
        let msg = self.digest(true);
        self.send(peer, &msg);
    }

    fn digest(&self, reply: bool) -> StreamMessage {
        let heads = self.catalog.heads();
        StreamMessage::AntiEntropy(AntiEntropy::Digest {
            regions: heads.regions,
            buckets: bucket_hashes(&heads.owners).to_vec(),
            members: if reply {
                self.membership.member_buckets().to_vec()
            } else {
                Vec::new()
            },
            reply,
        })
    }

    pub(super) fn on_anti_entropy(&mut self, now_ms: u64, from: SocketAddr, ae: AntiEntropy) {
        match ae {
            AntiEntropy::Digest {
                regions,
                buckets,
                members,
                reply,
            } => {
                self.on_digest(from, regions, &buckets, reply);
                if reply {
                    self.open_push_pull(now_ms, from, &members);
                }
            }
            AntiEntropy::BucketHeads {
                buckets,
                owners,
                reply,
            } => self.on_bucket_heads(from, &buckets, owners, reply),
            AntiEntropy::Members {
                buckets,
                members,
                reply,
            } => self.on_members(now_ms, from, &buckets, &members, reply),
        }
    }

    /// A peer's digest named its member buckets: when some differ from ours, send our list of
    /// those buckets (at most once per [`MeshConfig::push_pull_min_interval_ms`]); the peer
    /// learns what it lacks and answers with what we lack. SWIM spreads a join only by
    /// piggyback (`max_transmissions` sends) and probes; without this, a member that missed
    /// the rumour of a restart or of a healed partition could go minutes without it
    /// (memberlist runs a full state push-pull every 30 s for the same reason).
    fn open_push_pull(&mut self, now_ms: u64, to: SocketAddr, theirs: &[u32]) {
        let ours = self.membership.member_buckets();
        let differing: Vec<u16> = (0..ours.len())
            .filter(|&b| theirs.get(b).copied().unwrap_or(0) != ours[b])
            .map(|b| b as u16)
            .collect();
        if differing.is_empty() {
            return;
        }
        if self
            .push_pull_at
            .is_some_and(|at| now_ms < at + self.config.push_pull_min_interval_ms)
        {
            self.counters.push_pull_limited += 1;
            return;
        }
        self.push_pull_at = Some(now_ms);
        self.send_member_list(to, differing, true);
    }

    fn send_member_list(&mut self, to: SocketAddr, buckets: Vec<u16>, reply: bool) {
        let mut members = self.membership.members_in_buckets(&buckets);
        members.truncate(MAX_MEMBERS_PER_MESSAGE);
        self.counters.push_pull_lists_sent += 1;
        let msg = StreamMessage::AntiEntropy(AntiEntropy::Members {
            buckets,
            members,
            reply,
        });
        self.send(to, &msg);
    }

    fn on_members(
        &mut self,
        now_ms: u64,
        from: SocketAddr,
        buckets: &[u16],
        theirs: &[MemberId],
        reply: bool,
    ) {
        self.membership.learn_members(now_ms, theirs);
        if reply && self.membership.peer_lacks(buckets, theirs) {
            self.send_member_list(from, buckets.to_vec(), false);
        }
    }

    fn on_digest(
        &mut self,
        from: SocketAddr,
        theirs: Vec<RegionHead>,
        buckets: &[u64],
        reply: bool,
    ) {
        let ours = self.catalog.heads();
        let mut delta = DeltaBody::default();
        let mut want = false;
        for mine in &ours.regions {
            let their = theirs.iter().find(|h| h.region == mine.region);
            let (their_c, their_max, their_p) = their.map_or((Revision(0), Revision(0), 0), |h| {
                (h.contiguous, h.max_seen, h.pending_hash)
            });
            // Pending sets that differ mean each side may have accounted for revisions the
            // other has not (superseded ones included): exchange them too.
            let pending_differ = their_p != mine.pending_hash;
            let ahead = mine.contiguous > their_c
                || mine.max_seen > their_max
                || (pending_differ && mine.pending_hash != 0);
            if ahead && !self.add_lifecycle_delta(&mut delta, &mine.region, their_c, from) {
                return;
            }
            if their_c > mine.contiguous
                || their_max > mine.max_seen
                || (pending_differ && their_p != 0)
            {
                want = true;
            }
        }
        want |= theirs
            .iter()
            .any(|h| !ours.regions.iter().any(|m| m.region == h.region) && h.max_seen.0 > 0);
        self.send_delta(from, delta);
        if want && reply {
            let msg = self.digest(false);
            self.send(from, &msg);
        }
        if reply {
            let mine = bucket_hashes(&ours.owners);
            let differing: Vec<u16> = (0..DIGEST_BUCKETS)
                .filter(|&b| buckets.get(b).copied().unwrap_or(0) != mine[b])
                .map(|b| b as u16)
                .collect();
            if !differing.is_empty() {
                let owners = owners_in_buckets(&ours.owners, &differing);
                self.send(
                    from,
                    &StreamMessage::AntiEntropy(AntiEntropy::BucketHeads {
                        buckets: differing,
                        owners,
                        reply: true,
                    }),
                );
            }
        }
    }

    fn on_bucket_heads(
        &mut self,
        from: SocketAddr,
        buckets: &[u16],
        theirs: Vec<OwnerHead>,
        reply: bool,
    ) {
        let ours = self.catalog.heads();
        let mine = owners_in_buckets(&ours.owners, buckets);
        let mut delta = DeltaBody::default();
        let mut want = false;
        for m in &mine {
            let their = theirs.iter().find(|h| h.owner == m.owner);
            let their_head =
                their.map_or((Generation(0), HealthSeq(0)), |h| (h.boot, h.contiguous));
            let their_pending = their.map_or(0, |h| h.pending_hash);
            let pending_differ = m.boot == their_head.0 && m.pending_hash != their_pending;
            if (m.boot, m.contiguous) > their_head || (pending_differ && m.pending_hash != 0) {
                let h = their.cloned().unwrap_or(OwnerHead {
                    owner: m.owner.clone(),
                    boot: Generation(0),
                    contiguous: HealthSeq(0),
                    pending_hash: 0,
                });
                self.add_health_delta(&mut delta, &h);
            } else if their_head > (m.boot, m.contiguous) || (pending_differ && their_pending != 0)
            {
                want = true;
            }
        }
        want |= theirs
            .iter()
            .any(|h| !mine.iter().any(|m| m.owner == h.owner));
        self.send_delta(from, delta);
        if want && reply {
            self.send(
                from,
                &StreamMessage::AntiEntropy(AntiEntropy::BucketHeads {
                    buckets: buckets.to_vec(),
                    owners: mine,
                    reply: false,
                }),
            );
        }
    }
}

fn bucket_of(owner: &NodeId) -> usize {
    (fnv1a(owner.as_str().as_bytes(), FNV_OFFSET) % DIGEST_BUCKETS as u64) as usize
}

/// One order-independent hash per bucket of owner heads (xor of per-head hashes).
fn bucket_hashes(owners: &[OwnerHead]) -> [u64; DIGEST_BUCKETS] {
    let mut out = [0u64; DIGEST_BUCKETS];
    for h in owners {
        let mut x = fnv1a(h.owner.as_str().as_bytes(), FNV_OFFSET);
        x = fnv1a(&h.boot.0.to_le_bytes(), x);
        x = fnv1a(&h.contiguous.0.to_le_bytes(), x);
        x = fnv1a(&h.pending_hash.to_le_bytes(), x);
        out[bucket_of(&h.owner)] ^= x;
    }
    out
}

fn owners_in_buckets(owners: &[OwnerHead], buckets: &[u16]) -> Vec<OwnerHead> {
    owners
        .iter()
        .filter(|h| buckets.contains(&(bucket_of(&h.owner) as u16)))
        .cloned()
        .collect()
}
