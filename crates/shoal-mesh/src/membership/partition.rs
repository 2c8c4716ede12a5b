//! Partition healing on top of foca's `TurnUndead` handling. foca trusts `TurnUndead` even
//! from a member it considers down; shoal ignores it while it still has active peers (which
//! protects healthy members from one member that was isolated alone), except after holding a
//! partition's worth of members down (then both halves of a split renew and re-merge). After a
//! renewal ("rejoin") foca is rebuilt from our active view, keeping the down list when we still
//! see a real part of the cluster, so both halves keep knocking on each other. See
//! `docs/architecture.md` (membership beyond foca) and `docs/slo-budget.md`.

use foca::{Foca, Member, PostcardCodec};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{MemberId, Membership};

/// Holding at least 1 / `PARTITION_DOWN_DIVISOR` of the known members as down is taken as a
/// partition (not a lone isolated peer) when deciding whether to trust `TurnUndead`.
const PARTITION_DOWN_DIVISOR: usize = 5;

/// How long, ms, a partition verdict keeps `TurnUndead` from down members trusted.
const PARTITION_GRACE_MS: u64 = 120_000;

/// At most one contested-down notice per member per this many ms.
const CONTESTED_NOTICE_MS: u64 = 10_000;

/// A down we have held for less than this many ms is not contested: after a real death,
/// peers that have not heard of it yet list the member alive for about the detection time
/// (p99 <= 15 s, `docs/slo-budget.md`), and telling a dead member it is down only costs
/// datagrams. The downs this repairs are minutes old.
const CONTESTED_AFTER_MS: u64 = 60_000;

impl Membership {
    /// foca trusts `TurnUndead` even from a member it considers down; see the module docs.
    ///
    /// The guard protects healthy members from one member that was isolated alone: it considers
    /// everyone down, and would otherwise make every healthy member renew. It must not hold
    /// when *we* hold a large part of the cluster as down (a 50/50 partition healing): then
    /// both sides ignore each other for ever. Past `PARTITION_DOWN_FRACTION` of the known
    /// members down, a `TurnUndead` from a down member is trusted and we renew; the other side
    /// does the same, and both halves re-merge with new boot generations.
    ///
    /// The partition verdict is sticky for `PARTITION_GRACE_MS`: while the halves re-merge,
    /// the fraction of down members falls below the threshold long before every member has
    /// renewed, and a member that stopped trusting too early would stay down for the other
    /// half for ever.
    pub(super) fn is_untrusted_turn_undead(&mut self, now_ms: u64, src: &MemberId) -> bool {
        let known = self.active.len() + self.down.len();
        if self.down.len() * PARTITION_DOWN_DIVISOR >= known.max(1) {
            self.partition_seen_ms = Some(now_ms);
        }
        let partitioned = self
            .partition_seen_ms
            .is_some_and(|t| now_ms.saturating_sub(t) <= PARTITION_GRACE_MS);
        // We hold `src` down but a peer's list showed it alive: our down is the odd one out,
        // and renewing resolves it from our side (see `note_contested_down`).
        let contested = self
            .contested
            .get(&src.node)
            .is_some_and(|(id, t)| id == src && now_ms.saturating_sub(*t) <= PARTITION_GRACE_MS);
        self.foca.num_members() > 0
            && !partitioned
            && !contested
            && self.foca.active_member(src).is_none()
    }

    /// A peer's member list shows `id` alive at the very identity foca holds down (a contested
    /// down). foca treats down as final for an identity, and rumours carry only changes, so
    /// nothing repairs this by itself: a live member that never renewed (it was not told it
    /// was down while the partition verdict lasted) stays down here for good while everyone
    /// else routes to it (`reference/partition` at 5,001 agents, 2026-12-02). We tell it with a
    /// `TurnUndead`, as foca does when a down member talks to us, at most once per
    /// [`CONTESTED_NOTICE_MS`] and only for a down held [`CONTESTED_AFTER_MS`]; it renews if
    /// it trusts us. If it holds us down too (both were
    /// on opposite sides of a split), it trusts a `TurnUndead` from us anyway when its own
    /// down of us is contested: then both renew and re-merge (`is_untrusted_turn_undead`).
    pub(super) fn note_contested_down(&mut self, now_ms: u64, id: &MemberId, down_since_ms: u64) {
        if now_ms.saturating_sub(down_since_ms) < CONTESTED_AFTER_MS {
            return;
        }
        if let Some((held, last)) = self.contested.get(&id.node) {
            if held == id && now_ms.saturating_sub(*last) < CONTESTED_NOTICE_MS {
                return;
            }
        }
        if self.contested.len() >= self.config.max_tracked_down
            && !self.contested.contains_key(&id.node)
        {
            super::evict_oldest(&mut self.contested);
        }
        self.contested.insert(id.node.clone(), (id.clone(), now_ms));
        if self.transmits.len() >= self.config.max_pending_transmits {
            self.counters.transmit_overflow += 1;
            return;
        }
        let notice =
            super::forge::swim_datagram(&self.identity, id, foca::Message::TurnUndead, &[]);
        self.counters.contested_down_notices += 1;
        self.transmits.push_back((id.addr, notice));
    }

    /// foca renewed our identity after the cluster declared us down. Its state was formed
    /// while we were cut off (suspicions and downs of healthy members, queued for gossip), so
    /// we replace it with a fresh instance that keeps only our current active view, with no
    /// pending updates, and then announce the new identity.
    pub(super) fn rebuild_after_rejoin(&mut self, new: &MemberId) {
        let mix = new.boot.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let rng = ChaCha8Rng::seed_from_u64(self.seed ^ mix);
        self.foca = Foca::new(new.clone(), self.foca_config.clone(), rng, PostcardCodec);
        // The fresh instance has applied nothing yet.
        self.applied.clear();
        self.applied_order.clear();
        self.applied_pending.clear();
        self.timer_epoch += 1;
        self.last_foca_token = None;
        let view: Vec<Member<MemberId>> =
            self.active.values().cloned().map(Member::alive).collect();
        if self
            .foca
            .apply_many(view.into_iter(), false, &mut self.runtime)
            .is_err()
        {
            self.counters.foca_errors += 1;
        }
        // Remember who we held as down, without spreading it: foca's periodic announce to down
        // members then keeps knocking on the other half of a healed partition, which is how both
        // halves learn each other's renewed identities (a fresh instance that forgot them
        // would never talk across again).
        // Only a member that still sees a real part of the cluster (one side of a split: at
        // least half as many active as down) does this; a member that was isolated alone, or
        // nearly alone, sees almost everyone as down, and carrying that would make it tell
        // every healthy member "you are down" once they accept its renewed identity.
        // A member whose own probes failed recently (reachable by few, `accuser.rs`) formed
        // its down list on evidence it does not trust: carrying it would tell the members in
        // it "you are down" once they accept the renewed identity. The address book keeps
        // knocking on real down members either way (`reconnect.rs`).
        let distrusted =
            self.config.probe_health && self.probe_health.failed_recently(self.last_now_ms);
        let downs: Vec<Member<MemberId>> = if distrusted || self.active.len() * 2 < self.down.len()
        {
            Vec::new()
        } else {
            self.down
                .values()
                .map(|(m, _)| Member::down(m.clone()))
                .collect()
        };
        if self
            .foca
            .apply_many(downs.into_iter(), false, &mut self.runtime)
            .is_err()
        {
            self.counters.foca_errors += 1;
        }
        if self.foca.gossip(&mut self.runtime).is_err() {
            self.counters.foca_errors += 1;
        }
        self.announce_to_seeds();
    }
}
