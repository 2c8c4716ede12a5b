//! Member buckets and membership push-pull (memberlist's periodic state exchange, here riding
//! on the mesh's anti-entropy). The member set is hashed into [`MEMBER_BUCKETS`] buckets kept
//! up to date on every change; peers compare buckets in the anti-entropy digest, exchange the
//! identities of the buckets that differ, and learn the ones new to them. A list never brings
//! back an identity we saw go down.

use std::collections::{BTreeMap, HashSet};

use foca::{Member, State};
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
    /// identity of its node active, or when we saw a newer one go down or foca still holds this
    /// very one down (a list never brings a dead identity back). New identities then prove
    /// themselves by answering probes like any other. Nothing is re-gossiped: the next
    /// push-pull spreads it. Returns how many identities were applied.
    ///
    /// Our down list outlives foca's: a rebuild after a renewal that does not carry it
    /// (`partition.rs`: our probes had been failing, or we saw almost everyone down) leaves
    /// downs in it that the fresh foca does not hold. Such a down must not block the identity
    /// for ever: the fresh foca never hears of a member that did not change (rumours carry
    /// changes), so only a list, or the member's own packets (one probe round later, 14 min at
    /// 1,667 members), could bring it back. `reference/partition` ended with live members held
    /// down by part of their region for good this way. Those downs are counted in
    /// [`MembershipCounters::downs_relearned`](super::MembershipCounters::downs_relearned).
    /// An identity foca does hold down while the peer lists it alive is a contested down: we
    /// tell the member (`partition.rs`).
    pub fn learn_members(&mut self, now_ms: u64, theirs: &[MemberId]) -> usize {
        self.observe_now(now_ms);
        if self.defunct {
            return 0;
        }
        // foca's downs, collected once, only when a listed identity is one we hold down.
        let mut foca_downs: Option<HashSet<MemberId>> = None;
        let mut updates: Vec<Member<MemberId>> = Vec::new();
        for id in theirs {
            if id.node == self.identity.node || id.addr == self.identity.addr {
                continue;
            }
            if self.active.get(&id.node).is_some_and(|c| id.boot <= c.boot) {
                continue;
            }
            match self.down.get(&id.node) {
                Some((down, since)) if down == id => {
                    let since = *since;
                    let held = foca_downs.get_or_insert_with(|| {
                        self.foca
                            .iter_membership_state()
                            .filter(|m| m.state() == State::Down)
                            .map(|m| m.id().clone())
                            .collect()
                    });
                    if held.contains(id) {
                        self.note_contested_down(now_ms, id, since);
                        continue;
                    }
                    self.counters.downs_relearned += 1;
                }
                Some((down, _)) if id.boot <= down.boot => continue,
                _ => {}
            }
            updates.push(Member::alive(id.clone()));
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::forge::{self, gossip_datagram, RumourState};
    use crate::membership::MembershipConfig;

    fn id(i: u8) -> MemberId {
        MemberId {
            node: NodeId::new(format!("n{i}")).expect("valid"),
            addr: format!("10.0.0.{i}:7946").parse().expect("addr"),
            boot: Generation(1),
        }
    }

    #[test]
    fn a_down_the_rebuilt_foca_dropped_is_learned_again_from_a_peer_list() {
        let me = id(1);
        let mut m = Membership::new(me.clone(), MembershipConfig::for_cluster_size(8), 7);
        m.bootstrap(0, (2..=5).map(id).collect());
        // Member 2 tells us 3, 4 and 5 are down.
        let downs: Vec<_> = (3..=5).map(|i| (id(i), 0, RumourState::Down)).collect();
        m.handle_datagram(10, id(2).addr, &gossip_datagram(&id(2), &me, &downs));
        assert!(m.is_down(&id(3).node));
        // A list never brings back an identity foca holds down.
        assert_eq!(m.learn_members(20, &[id(3)]), 0);
        assert!(m.is_down(&id(3).node));
        // We renew; one active member against three down: the rebuilt foca does not carry
        // the down list (`partition.rs`), ours still lists them.
        let renewed = MemberId {
            boot: Generation(2),
            ..me
        };
        m.identity = renewed.clone();
        m.rebuild_after_rejoin(&renewed);
        assert!(m.is_down(&id(3).node), "our down list outlives the rebuild");
        // A peer's list shows 3 alive at the identity only our list holds down: learned again.
        assert_eq!(m.learn_members(30, &[id(3), id(4)]), 2);
        assert!(!m.is_down(&id(3).node) && !m.is_down(&id(4).node));
        assert!(m.is_down(&id(5).node), "not listed, still down");
        assert_eq!(m.counters().downs_relearned, 2);
    }

    /// The message of an enveloped SWIM datagram.
    fn message_of(datagram: &[u8]) -> foca::Message<MemberId> {
        let (header, _) = postcard::take_from_bytes::<foca::Header<MemberId>>(&datagram[4..])
            .expect("a SWIM header");
        header.message
    }

    #[test]
    fn a_contested_down_is_told_to_the_member_and_makes_its_turn_undead_trusted() {
        let me = id(1);
        let mut m = Membership::new(me.clone(), MembershipConfig::for_cluster_size(10), 7);
        m.bootstrap(0, (2..=9).map(id).collect());
        m.handle_datagram(
            10,
            id(2).addr,
            &gossip_datagram(&id(2), &me, &[(id(3), 0, RumourState::Down)]),
        );
        assert!(m.is_down(&id(3).node));
        while m.poll_transmit().is_some() {}
        // Member 3 (down here, 1 of 9 known: no partition verdict) says we are down: ignored.
        let turn_undead = forge::swim_datagram(&id(3), &me, foca::Message::TurnUndead, &[]);
        m.handle_datagram(20, id(3).addr, &turn_undead);
        assert_eq!(m.counters().ignored_turn_undead, 1);
        assert_eq!(m.identity().boot, Generation(1));
        // A peer lists 3 alive at the identity foca holds down, but the down is young (a
        // death the peer has not heard of yet): not learned, nobody told.
        assert_eq!(m.learn_members(30, &[id(3)]), 0);
        assert!(m.poll_transmit().is_none());
        // A minute on: not learned, but 3 is told.
        assert_eq!(m.learn_members(60_010, &[id(3)]), 0);
        let sent: Vec<_> = std::iter::from_fn(|| m.poll_transmit()).collect();
        assert_eq!(sent.len(), 1, "one notice");
        assert_eq!(sent[0].0, id(3).addr);
        assert_eq!(message_of(&sent[0].1), foca::Message::TurnUndead);
        // At most one notice per member per CONTESTED_NOTICE_MS.
        assert_eq!(m.learn_members(65_000, &[id(3)]), 0);
        assert!(m.poll_transmit().is_none());
        assert_eq!(m.counters().contested_down_notices, 1);
        // Now our down of 3 is contested: its TurnUndead is trusted and we renew.
        m.handle_datagram(66_000, id(3).addr, &turn_undead);
        assert_eq!(m.counters().ignored_turn_undead, 1);
        assert!(m.identity().boot > Generation(1), "renewed");
    }
}
