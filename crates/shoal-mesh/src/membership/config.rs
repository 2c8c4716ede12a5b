//! [`MembershipConfig`]: SWIM tuning (below the LAN defaults, so detection fits the budget in
//! `docs/slo-budget.md`), its validation ([`ConfigError`]), its translation into
//! `foca::Config`, and the [`DetectionBudget`] it implies for a cluster of `n` members.

use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

use foca::PeriodicParams;
use shoal_proto::envelope::{DEFAULT_MAX_DATAGRAM_BYTES, HEADER_BYTES};

// Named by intra-doc links only.
#[cfg(doc)]
use super::{Membership, MembershipCounters};

/// Why a [`MembershipConfig`] was refused. Nothing was constructed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `probe_rtt_ms` must be non-zero and strictly below `probe_period_ms`.
    #[error("probe_rtt_ms ({rtt}) must be in 1..probe_period_ms ({period})")]
    ProbeTiming {
        /// Configured probe period, ms.
        period: u64,
        /// Configured probe rtt, ms.
        rtt: u64,
    },
    /// A field that must be non-zero is zero.
    #[error("{0} must not be zero")]
    Zero(&'static str),
    /// `max_packet_bytes` leaves no room for a SWIM packet after the envelope header.
    #[error("max_packet_bytes ({0}) must be in 256..=65507")]
    PacketSize(usize),
}

/// SWIM tuning. All durations are milliseconds of the driver's monotonic clock.
///
/// Use [`MembershipConfig::for_cluster_size`]; `docs/slo-budget.md` explains every value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipConfig {
    /// How often this member probes the next member of its shuffled round-robin list, ms. A probe
    /// that got no direct or indirect ack is turned into a suspicion at the *next* period.
    pub probe_period_ms: u64,
    /// How long to wait for a direct ack before asking `num_indirect_probes` members to probe, ms.
    /// Must be below `probe_period_ms`; the indirect cycle gets `probe_period_ms - probe_rtt_ms`.
    pub probe_rtt_ms: u64,
    /// Members asked to probe indirectly after a missed direct ack (also the fan-out of the
    /// gossip sent after refuting a suspicion).
    pub num_indirect_probes: usize,
    /// How long a suspect stays active before the member that suspected it declares it down, ms.
    /// This is the window a falsely suspected (stalled, lossy) member has to refute.
    pub suspect_to_down_after_ms: u64,
    /// How many times each membership update is piggybacked before it is dropped from the
    /// backlog. Higher values make it unlikelier that some member never hears of a death.
    pub max_transmissions: u8,
    /// Largest datagram produced or accepted, bytes, *including* the 4-byte shoal envelope header.
    pub max_packet_bytes: usize,
    /// Period of asking `periodic_announce_members` random members for more members, ms.
    pub periodic_announce_ms: u64,
    /// Members asked per periodic announce.
    pub periodic_announce_members: usize,
    /// Period of re-announcing to members considered down, ms, so that an isolated member that
    /// still sees some of us as alive learns it was declared down and rejoins.
    pub periodic_announce_to_down_ms: u64,
    /// Down members announced to per period.
    pub periodic_announce_to_down_members: usize,
    /// Period of pushing pending updates to `periodic_gossip_members` random members, ms. Only
    /// sent while there are updates; this is what spreads a down notice in O(log n) rounds.
    pub periodic_gossip_ms: u64,
    /// Gossip fan-out per period.
    pub periodic_gossip_members: usize,
    /// How long foca remembers a down identity, ms (stops the very same identity rejoining).
    pub remove_down_after_ms: u64,
    /// While this member has no active peer (not joined yet, or idle after isolation), it
    /// re-announces to its seeds every `join_retry_ms`.
    pub join_retry_ms: u64,
    /// Bound on datagrams waiting in [`Membership::poll_transmit`]; overflow is dropped and
    /// counted in [`MembershipCounters::transmit_overflow`].
    pub max_pending_transmits: usize,
    /// Bound on timers waiting in [`Membership::poll_timer`]; overflow is counted in
    /// [`MembershipCounters::timer_overflow`] (a dropped timer can stall a probe cycle).
    pub max_pending_timers: usize,
    /// Bound on events waiting in [`Membership::poll_event`]; overflow is counted.
    pub max_pending_events: usize,
    /// Bound on down nodes remembered for [`Membership::is_down`]; the longest-down is forgotten.
    pub max_tracked_down: usize,
    /// Bound on seed addresses kept by [`Membership::join`].
    pub max_seeds: usize,
    /// Bound on the address book ([`Membership::known_addresses`]): seeds plus addresses of
    /// members that went down or were restored from disk. Seeds are never evicted; past the
    /// bound the address unseen for longest is forgotten (counted in
    /// [`MembershipCounters::known_evicted`]).
    pub max_known_addrs: usize,
    /// Period of the reconnect tick, ms: each tick announces to at most
    /// `reconnect_per_tick` book addresses whose backoff has expired.
    pub reconnect_tick_ms: u64,
    /// Most announces per reconnect tick (bounds the traffic to dead addresses). 0 turns
    /// reconnecting off (the book is still kept): only for measuring what it buys.
    pub reconnect_per_tick: usize,
    /// First backoff of an address after a knock went unanswered, ms; doubled per knock.
    pub reconnect_base_ms: u64,
    /// Ceiling of the per-address backoff, ms (each wait is drawn in `[b/2, b]` from the
    /// seeded RNG, so knocks of many members on one address spread out).
    pub reconnect_max_ms: u64,
    /// Probe health (`membership/accuser.rs`): while most of our own probes fail, withhold our
    /// suspect-to-down decisions and do not renew when told we are down. On by default; off
    /// only to measure what it buys (ADR 0010).
    pub probe_health: bool,
    /// Drop piggybacked `Down` updates of members we hold active at a higher incarnation
    /// (refuted accusations) before foca applies them. On by default; see ADR 0010.
    pub drop_refuted_downs: bool,
}

impl MembershipConfig {
    /// Tuned values for a region of `n` members (see `docs/slo-budget.md`).
    ///
    /// * probe period 500 ms, probe rtt 200 ms, 5 indirect probes;
    /// * suspicion `max(3 s, 1.6 s * log10(n))` (5.15 s at 1,667; foca's LAN default is
    ///   `4 s * log10(n)` = 12.9 s);
    /// * `max_transmissions = ceil(5 * log10(n + 1))` (17 at 1,667), so the chance that some
    ///   member never hears a down notice is about `n * e^-17`;
    /// * gossip every 200 ms to 3 members, announce every 5 s to 1 (membership anti-entropy:
    ///   the Feed reply repairs identities that rumour mongering missed, e.g. after a partition
    ///   heals and hundreds of members renew at once), announce to 2 down members
    ///   every 15 s, join retry every 1 s;
    /// * an address book of 512 entries, knocked on at most twice a second with a per-address
    ///   backoff of 1 s doubling to 30 s (heals splits longer than foca remembers a down
    ///   member, 24 h; see `membership/reconnect.rs`).
    pub fn for_cluster_size(n: usize) -> Self {
        let n = n.max(2) as f64;
        let suspicion_ms = (1_600.0 * n.log10()).max(3_000.0).round() as u64;
        let max_tx = (5.0 * (n + 1.0).log10()).ceil().clamp(6.0, 255.0) as u8;
        Self {
            probe_period_ms: 500,
            probe_rtt_ms: 200,
            num_indirect_probes: 5,
            suspect_to_down_after_ms: suspicion_ms,
            max_transmissions: max_tx,
            max_packet_bytes: DEFAULT_MAX_DATAGRAM_BYTES,
            periodic_announce_ms: 30_000,
            periodic_announce_members: 1,
            periodic_announce_to_down_ms: 15_000,
            periodic_announce_to_down_members: 2,
            periodic_gossip_ms: 200,
            periodic_gossip_members: 3,
            remove_down_after_ms: 24 * 3_600 * 1_000,
            join_retry_ms: 1_000,
            max_pending_transmits: 1_024,
            max_pending_timers: 8_192,
            max_pending_events: 8_192,
            max_tracked_down: 16_384,
            max_seeds: 64,
            max_known_addrs: 512,
            reconnect_tick_ms: 1_000,
            reconnect_per_tick: 2,
            reconnect_base_ms: 1_000,
            reconnect_max_ms: 30_000,
            probe_health: true,
            drop_refuted_downs: true,
        }
    }

    /// Checks the invariants foca relies on.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.probe_rtt_ms == 0 || self.probe_rtt_ms >= self.probe_period_ms {
            return Err(ConfigError::ProbeTiming {
                period: self.probe_period_ms,
                rtt: self.probe_rtt_ms,
            });
        }
        let nonzero = [
            ("num_indirect_probes", self.num_indirect_probes as u64),
            ("suspect_to_down_after_ms", self.suspect_to_down_after_ms),
            ("max_transmissions", u64::from(self.max_transmissions)),
            ("periodic_announce_ms", self.periodic_announce_ms),
            (
                "periodic_announce_members",
                self.periodic_announce_members as u64,
            ),
            (
                "periodic_announce_to_down_ms",
                self.periodic_announce_to_down_ms,
            ),
            (
                "periodic_announce_to_down_members",
                self.periodic_announce_to_down_members as u64,
            ),
            ("periodic_gossip_ms", self.periodic_gossip_ms),
            (
                "periodic_gossip_members",
                self.periodic_gossip_members as u64,
            ),
            ("join_retry_ms", self.join_retry_ms),
            ("max_known_addrs", self.max_known_addrs as u64),
            ("reconnect_tick_ms", self.reconnect_tick_ms),
            ("reconnect_base_ms", self.reconnect_base_ms),
            ("reconnect_max_ms", self.reconnect_max_ms),
            ("max_pending_transmits", self.max_pending_transmits as u64),
            ("max_pending_timers", self.max_pending_timers as u64),
            ("max_pending_events", self.max_pending_events as u64),
        ];
        if let Some((name, _)) = nonzero.iter().find(|(_, v)| *v == 0) {
            return Err(ConfigError::Zero(name));
        }
        if !(256..=65_507).contains(&self.max_packet_bytes) {
            return Err(ConfigError::PacketSize(self.max_packet_bytes));
        }
        Ok(())
    }

    pub(super) fn to_foca(&self) -> Result<foca::Config, ConfigError> {
        self.validate()?;
        let nz = |v: usize| NonZeroUsize::new(v).expect("validated non-zero");
        let ms = Duration::from_millis;
        Ok(foca::Config {
            probe_period: ms(self.probe_period_ms),
            probe_rtt: ms(self.probe_rtt_ms),
            num_indirect_probes: nz(self.num_indirect_probes),
            max_transmissions: NonZeroU8::new(self.max_transmissions).expect("validated"),
            suspect_to_down_after: ms(self.suspect_to_down_after_ms),
            remove_down_after: Some(ms(self.remove_down_after_ms.max(1))),
            max_packet_size: nz(self.max_packet_bytes - HEADER_BYTES),
            notify_down_members: true,
            periodic_announce: Some(PeriodicParams {
                frequency: ms(self.periodic_announce_ms),
                num_members: nz(self.periodic_announce_members),
            }),
            periodic_announce_to_down_members: Some(PeriodicParams {
                frequency: ms(self.periodic_announce_to_down_ms),
                num_members: nz(self.periodic_announce_to_down_members),
            }),
            periodic_gossip: Some(PeriodicParams {
                frequency: ms(self.periodic_gossip_ms),
                num_members: nz(self.periodic_gossip_members),
            }),
        })
    }

    /// The detection budget implied by this config for a region of `n` members: an estimate of
    /// the p99.9 time from a member's death until *every* other member has declared it down,
    /// assuming no loss beyond a few percent. `docs/slo-budget.md` derives each term.
    pub fn detection_budget(&self, n: usize) -> DetectionBudget {
        let n = n.max(2) as f64;
        let period = self.probe_period_ms as f64;
        // n-1 members each probe one of n-1 targets per period in shuffled round-robin, so the
        // wait until somebody probes the dead member is ~Exp(mean = period): p99.9 = ln(1000) T.
        let first_probe_ms = (1_000f64.ln() * period).ceil() as u64;
        // foca turns a failed probe into a suspicion when the next probe period starts.
        let suspect_raise_ms = self.probe_period_ms;
        // Push gossip with fan-out f reaches everyone in about log_{f+1}(n) + ln(n)/f rounds;
        // +2 rounds of slack for loss and for the update competing for packet space.
        let f = self.periodic_gossip_members.max(1) as f64;
        let rounds = (n.ln() / (f + 1.0).ln() + n.ln() / f).ceil() + 2.0;
        let dissemination_ms = (rounds * self.periodic_gossip_ms as f64).ceil() as u64;
        DetectionBudget {
            first_probe_ms,
            suspect_raise_ms,
            suspicion_ms: self.suspect_to_down_after_ms,
            dissemination_ms,
            total_ms: first_probe_ms
                + suspect_raise_ms
                + self.suspect_to_down_after_ms
                + dissemination_ms,
        }
    }
}

impl Default for MembershipConfig {
    /// [`MembershipConfig::for_cluster_size`] for 1,667 members (one region of 5,000 agents).
    fn default() -> Self {
        Self::for_cluster_size(1_667)
    }
}

/// The terms of the hard-failure detection budget, ms. See [`MembershipConfig::detection_budget`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetectionBudget {
    /// Until the first member probes the dead one (p99.9 of ~Exp(probe period)).
    pub first_probe_ms: u64,
    /// From that probe until foca raises the suspicion (one probe period).
    pub suspect_raise_ms: u64,
    /// Suspicion window before the suspecting member declares the member down.
    pub suspicion_ms: u64,
    /// Until the down notice has reached every member by gossip.
    pub dissemination_ms: u64,
    /// Sum of the terms: the bound tests assert against.
    pub total_ms: u64,
}
