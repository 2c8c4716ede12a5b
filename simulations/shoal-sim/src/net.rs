//! The network model: per-class latency, loss, duplication, size limits, and link faults.
//!
//! Virtual time is kept in **microseconds** inside the engine so same-zone latencies of a
//! fraction of a millisecond are representable; nodes only ever see milliseconds.

use rand::{Rng, RngExt};

use crate::rng::SimRng;

/// Which latency distribution applies to a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkClass {
    /// Both nodes in the same zone.
    SameZone,
    /// Same region, different zones.
    SameRegion,
    /// Different regions.
    CrossRegion,
}

impl LinkClass {
    fn slot(self) -> usize {
        match self {
            LinkClass::SameZone => 0,
            LinkClass::SameRegion => 1,
            LinkClass::CrossRegion => 2,
        }
    }
}

/// Shape of the random part of a latency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JitterDist {
    /// Uniform in `[0, jitter]`.
    #[default]
    Uniform,
    /// Exponential with mean `jitter`, capped at `10 * jitter` (a long tail, bounded).
    Exponential,
}

/// One-way latency = `base_us` + a jitter draw. Jitter is what reorders datagrams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Latency {
    /// Fixed part, µs.
    pub base_us: u64,
    /// Scale of the random part, µs (uniform upper bound or exponential mean).
    pub jitter_us: u64,
    /// Distribution of the random part.
    pub dist: JitterDist,
}

impl Latency {
    /// A latency of `base_us` + uniform `[0, jitter_us]`.
    pub const fn uniform(base_us: u64, jitter_us: u64) -> Self {
        Self {
            base_us,
            jitter_us,
            dist: JitterDist::Uniform,
        }
    }

    /// Draws one latency in µs. Always consumes exactly one `u64` from `rng`, so changing a
    /// jitter setting never shifts later draws.
    pub fn sample(&self, rng: &mut SimRng) -> u64 {
        let r = rng.next_u64();
        if self.jitter_us == 0 {
            return self.base_us;
        }
        let jitter = match self.dist {
            JitterDist::Uniform => r % (self.jitter_us + 1),
            JitterDist::Exponential => {
                // u in (0, 1]: 53 random bits.
                let u = ((r >> 11) + 1) as f64 / (1u64 << 53) as f64;
                let x = -u.ln() * self.jitter_us as f64;
                (x as u64).min(self.jitter_us * 10)
            }
        };
        self.base_us + jitter
    }
}

/// A probability stored as a threshold on a uniform `u64` draw (exact, no float per event).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chance(u64);

impl Chance {
    /// From a percentage in `[0, 100]` (clamped).
    pub fn from_pct(pct: f64) -> Self {
        let p = (pct / 100.0).clamp(0.0, 1.0);
        if p >= 1.0 {
            Chance(u64::MAX)
        } else {
            Chance((p * 18_446_744_073_709_551_616.0) as u64)
        }
    }

    /// Never.
    pub const NEVER: Chance = Chance(0);

    /// True with this probability. Consumes exactly one `u64`.
    pub fn roll(self, rng: &mut SimRng) -> bool {
        let r = rng.next_u64();
        self.0 != 0 && (self.0 == u64::MAX || r < self.0)
    }
}

/// Network parameters. All sizes in bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConfig {
    /// Latency by [`LinkClass`]: same zone, same region, cross region.
    pub latency: [Latency; 3],
    /// Datagram loss.
    pub loss: Chance,
    /// Datagram duplication (the copy gets its own latency draw).
    pub dup: Chance,
    /// Larger datagrams are dropped and counted `oversize`.
    pub max_datagram_bytes: usize,
    /// Larger stream messages are dropped and counted `oversize` (bounded buffers).
    pub max_stream_message_bytes: usize,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            latency: [
                Latency::uniform(200, 100),
                Latency::uniform(1_000, 500),
                Latency::uniform(40_000, 10_000),
            ],
            loss: Chance::NEVER,
            dup: Chance::NEVER,
            max_datagram_bytes: 1_200,
            max_stream_message_bytes: 1 << 20,
        }
    }
}

impl NetConfig {
    /// The latency distribution for a class.
    pub fn latency(&self, class: LinkClass) -> &Latency {
        &self.latency[class.slot()]
    }
}

/// A set of node indices as a bitset (O(1) membership, `n/8` bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSet {
    bits: Vec<u64>,
}

impl NodeSet {
    /// The empty set over `n` nodes.
    pub fn empty(n: usize) -> Self {
        Self {
            bits: vec![0; n.div_ceil(64)],
        }
    }

    /// Every node of `n`.
    pub fn all(n: usize) -> Self {
        let mut s = Self::empty(n);
        for i in 0..n as u32 {
            s.insert(i);
        }
        s
    }

    /// The given nodes over `n` nodes.
    pub fn of(n: usize, nodes: &[u32]) -> Self {
        let mut s = Self::empty(n);
        for &i in nodes {
            s.insert(i);
        }
        s
    }

    /// Adds `i`.
    pub fn insert(&mut self, i: u32) {
        self.bits[(i / 64) as usize] |= 1 << (i % 64);
    }

    /// Removes `i`.
    pub fn remove(&mut self, i: u32) {
        self.bits[(i / 64) as usize] &= !(1 << (i % 64));
    }

    /// Membership.
    pub fn contains(&self, i: u32) -> bool {
        self.bits
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// True if no member.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|w| *w == 0)
    }
}

/// Identifies one link fault so it can be healed alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CutId(pub u32);

#[derive(Clone, Debug)]
struct Rule {
    id: CutId,
    from: NodeSet,
    to: NodeSet,
}

/// Directed link faults: a message from `a` to `b` is blocked if any rule has `a` in `from`
/// and `b` in `to`. A symmetric cut is two rules with one id. Checked at send time: a message
/// already in flight when a cut starts is still delivered (except a stream message to a
/// crashed/restarted node).
#[derive(Clone, Debug, Default)]
pub struct LinkFaults {
    rules: Vec<Rule>,
    next_id: u32,
}

impl LinkFaults {
    /// True if a -> b is currently blocked.
    #[inline]
    pub fn blocked(&self, a: u32, b: u32) -> bool {
        self.rules
            .iter()
            .any(|r| r.from.contains(a) && r.to.contains(b))
    }

    /// Adds one directed rule per (from, to) pair under a fresh id.
    pub fn add(&mut self, pairs: Vec<(NodeSet, NodeSet)>) -> CutId {
        let id = CutId(self.next_id);
        self.next_id += 1;
        for (from, to) in pairs {
            self.rules.push(Rule { id, from, to });
        }
        id
    }

    /// Removes every rule of `id`. Returns whether any existed.
    pub fn remove(&mut self, id: CutId) -> bool {
        let before = self.rules.len();
        self.rules.retain(|r| r.id != id);
        before != self.rules.len()
    }

    /// Restores every link of `node` (removes it from all rules; drops rules left empty).
    pub fn release(&mut self, node: u32) {
        for r in &mut self.rules {
            r.from.remove(node);
            r.to.remove(node);
        }
        self.rules
            .retain(|r| !r.from.is_empty() && !r.to.is_empty());
    }

    /// Removes every rule.
    pub fn clear(&mut self) {
        self.rules.clear();
    }

    /// Number of directed rules in force.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// True if no link fault is in force.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// Messages and bytes on one channel in one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Flow {
    /// Message count.
    pub msgs: u64,
    /// Payload bytes.
    pub bytes: u64,
}

impl Flow {
    fn add(&mut self, other: &Flow) {
        self.msgs += other.msgs;
        self.bytes += other.bytes;
    }
}

/// Why the engine dropped a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Random datagram loss.
    Loss,
    /// Link cut by a partition / isolate / drop_link.
    Partition,
    /// Destination crashed, or (stream) either end restarted while in flight.
    Crashed,
    /// Larger than the channel's limit.
    Oversize,
    /// Destination is not a topology address.
    UnknownAddr,
    /// A stalled node's backlog hit its bound.
    StallOverflow,
}

/// Drop counts by reason (attributed to the **sender**).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Drops {
    /// See [`DropReason::Loss`].
    pub loss: u64,
    /// See [`DropReason::Partition`].
    pub partition: u64,
    /// See [`DropReason::Crashed`].
    pub crashed: u64,
    /// See [`DropReason::Oversize`].
    pub oversize: u64,
    /// See [`DropReason::UnknownAddr`].
    pub unknown_addr: u64,
    /// See [`DropReason::StallOverflow`].
    pub stall_overflow: u64,
}

impl Drops {
    /// Increments one reason.
    pub fn count(&mut self, reason: DropReason) {
        match reason {
            DropReason::Loss => self.loss += 1,
            DropReason::Partition => self.partition += 1,
            DropReason::Crashed => self.crashed += 1,
            DropReason::Oversize => self.oversize += 1,
            DropReason::UnknownAddr => self.unknown_addr += 1,
            DropReason::StallOverflow => self.stall_overflow += 1,
        }
    }

    /// Sum over reasons.
    pub fn total(&self) -> u64 {
        self.loss
            + self.partition
            + self.crashed
            + self.oversize
            + self.unknown_addr
            + self.stall_overflow
    }

    fn add(&mut self, o: &Drops) {
        self.loss += o.loss;
        self.partition += o.partition;
        self.crashed += o.crashed;
        self.oversize += o.oversize;
        self.unknown_addr += o.unknown_addr;
        self.stall_overflow += o.stall_overflow;
    }
}

/// Per-node traffic counters. `*_out` counts every message the node emitted (including ones
/// later dropped); `*_in` counts messages actually handed to the node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NodeCounters {
    /// Datagrams sent.
    pub datagram_out: Flow,
    /// Datagrams delivered.
    pub datagram_in: Flow,
    /// Stream messages sent.
    pub stream_out: Flow,
    /// Stream messages delivered.
    pub stream_in: Flow,
    /// Extra datagram copies created by duplication.
    pub duplicated: u64,
    /// Messages this node sent that were dropped, by reason.
    pub dropped: Drops,
}

impl NodeCounters {
    /// Adds `other` into `self` (for totals).
    pub fn add(&mut self, other: &NodeCounters) {
        self.datagram_out.add(&other.datagram_out);
        self.datagram_in.add(&other.datagram_in);
        self.stream_out.add(&other.stream_out);
        self.stream_in.add(&other.stream_in);
        self.duplicated += other.duplicated;
        self.dropped.add(&other.dropped);
    }
}

/// Draws a uniform index in `0..n` (n > 0).
pub fn pick_index(rng: &mut SimRng, n: usize) -> usize {
    rng.random_range(0..n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn chance_edges() {
        let mut rng = SimRng::seed_from_u64(1);
        assert!(!(0..1000).any(|_| Chance::NEVER.roll(&mut rng)));
        assert!((0..1000).all(|_| Chance::from_pct(100.0).roll(&mut rng)));
    }

    #[test]
    fn latency_bounds() {
        let mut rng = SimRng::seed_from_u64(1);
        let l = Latency::uniform(100, 50);
        for _ in 0..1000 {
            let x = l.sample(&mut rng);
            assert!((100..=150).contains(&x));
        }
        let e = Latency {
            base_us: 10,
            jitter_us: 5,
            dist: JitterDist::Exponential,
        };
        for _ in 0..1000 {
            assert!((10..=60).contains(&e.sample(&mut rng)));
        }
    }

    #[test]
    fn faults_release() {
        let mut f = LinkFaults::default();
        let id = f.add(vec![(NodeSet::of(4, &[0]), NodeSet::of(4, &[1, 2]))]);
        assert!(f.blocked(0, 1));
        assert!(!f.blocked(1, 0));
        f.release(1);
        assert!(!f.blocked(0, 1));
        assert!(f.blocked(0, 2));
        assert!(f.remove(id));
        assert!(f.is_empty());
    }
}
