//! Member buckets and membership push-pull (memberlist's periodic state exchange, here riding
//! on the mesh's anti-entropy). The member set is hashed into [`MEMBER_BUCKETS`] buckets kept
//! up to date on every change; peers compare buckets in the anti-entropy digest, exchange the
//! identities of the buckets that differ, and learn the ones new to them. A list never brings
//! back an identity we saw go down.

use std::collections::BTreeMap;

use foca::Member;
use shoal_proto::{Generation, NodeId};

use super::{MemberId, Membership};
use crate::hash::{fnv1a, FNV_OFFSET};

/// Number of buckets the member set is hashed into for push-pull comparison
/// ([`Membership::member_buckets`]). A crash or a join changes one bucket, so peers exchange
/// about 1/32 of the member list to repair it, not all of it.
pub const MEMBER_BUCKETS: usize = 32;

impl Membership {
    /// The member set hashed into [`MEMBER_BUCKETS`] buckets, for push-pull comparison with a
    /// peer: bucket `b` is the XOR of a 64-bit FNV-1a fingerprint of (node, address, boot) of
    /// every active member whose node id falls in bucket `b`, ourselves included, folded to 32
    /// bits (at most 5 bytes each on the wire; a false match needs a 2^-32 coincidence in a
    /// bucket that differs). Two members with the same view have equal buckets. O(1): the
    /// hashes are kept up to date on every change.
    pub fn member_buckets(&self) -> [u32; MEMBER_BUCKETS] {
        let mut full = self.member_buckets;
        full[member_bucket(&self.identity.node)] ^= member_fingerprint(&self.identity);
        full.map(|h| (h ^ (h >> 32)) as u32)
    }

    /// Our active identities (ourselves included) whose node ids fall in `buckets`, in node
    /// order: the list a push-pull exchange sends for the buckets that differed.
    pub fn members_in_buckets(&self, buckets: &[u16]) -> Vec<MemberId> {
        let wanted = |node: &NodeId| buckets.contains(&(member_bucket(node) as u16));
        let mut out: Vec<MemberId> = self
            .active
            .values()
            .filter(|m| wanted(&m.node))
            .cloned()
            .collect();
        if wanted(&self.identity.node) {
            let at = out.partition_point(|m| m.node < self.identity.node);
            out.insert(at, self.identity.clone());
        }
        out
    }

    /// Whether `theirs` (a peer's list for `buckets`, from [`Membership::members_in_buckets`])
    /// misses an identity we hold active, or holds an older one: then the peer should get our
    /// list back.
    pub fn peer_lacks(&self, buckets: &[u16], theirs: &[MemberId]) -> bool {
        let known: BTreeMap<&NodeId, Generation> =
            theirs.iter().map(|m| (&m.node, m.boot)).collect();
        self.members_in_buckets(buckets)
            .iter()
            .any(|m| known.get(&m.node).is_none_or(|boot| *boot < m.boot))
    }

    /// Push-pull (memberlist's periodic state exchange, Das et al.'s SWIM leaves it to
    /// rumour mongering): applies the identities of a peer's member list that are new to us as
    /// alive, so a member that missed the gossip of a join, a restart or a healed partition
    /// still learns it. An identity is skipped when it is ours, when we hold the same or a newer
    /// identity of its node active, or when we saw the same or a newer one go down (a list
    /// never brings a dead identity back). New identities then prove themselves by answering
    /// probes like any other. Nothing is re-gossiped: the next push-pull spreads it.
    /// Returns how many identities were applied.
    pub fn learn_members(&mut self, now_ms: u64, theirs: &[MemberId]) -> usize {
        self.observe_now(now_ms);
        if self.defunct {
            return 0;
        }
        let newer =
            |id: &MemberId, current: Option<&MemberId>| current.is_none_or(|c| id.boot > c.boot);
        let updates: Vec<Member<MemberId>> = theirs
            .iter()
            .filter(|id| id.node != self.identity.node && id.addr != self.identity.addr)
            .filter(|id| newer(id, self.active.get(&id.node)))
            .filter(|id| newer(id, self.down.get(&id.node).map(|(m, _)| m)))
            .cloned()
            .map(Member::alive)
            .collect();
        let n = updates.len();
        if n > 0 {
            self.counters.members_learned += n as u64;
            if self
                .foca
                .apply_many(updates.into_iter(), false, &mut self.runtime)
                .is_err()
            {
                self.counters.foca_errors += 1;
            }
            self.drain(now_ms);
        }
        n
    }
}

impl Membership {
    /// `member_buckets` recomputed from the active set, for debug assertions: the
    /// incrementally kept hashes must always equal it.
    pub(super) fn computed_member_buckets(&self) -> [u64; MEMBER_BUCKETS] {
        let mut out = [0; MEMBER_BUCKETS];
        for id in self.active.values() {
            out[member_bucket(&id.node)] ^= member_fingerprint(id);
        }
        out
    }
}

/// Bucket of a node's identities in [`Membership::member_buckets`] (all identities of one node
/// share a bucket, so a restart changes one bucket).
pub(super) fn member_bucket(node: &NodeId) -> usize {
    (fnv1a(node.as_str().as_bytes(), FNV_OFFSET) % MEMBER_BUCKETS as u64) as usize
}

/// 64-bit FNV-1a over (node, ip, port, boot).
pub(super) fn member_fingerprint(id: &MemberId) -> u64 {
    let mut h = fnv1a(id.node.as_str().as_bytes(), FNV_OFFSET);
    h = match id.addr.ip() {
        std::net::IpAddr::V4(ip) => fnv1a(&ip.octets(), h),
        std::net::IpAddr::V6(ip) => fnv1a(&ip.octets(), h),
    };
    h = fnv1a(&id.addr.port().to_le_bytes(), h);
    fnv1a(&id.boot.0.to_le_bytes(), h)
}
