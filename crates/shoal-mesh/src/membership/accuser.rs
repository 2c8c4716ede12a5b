//! Partial reachability must blame only the unreachable (issue 15, ADR 0010).
//!
//! A member that can exchange packets with only one peer fails almost every probe it sends. In
//! plain SWIM (and foca 2.0.0) it still suspects, then declares down, every member it cannot
//! reach; its `Down` rumours leave through the one peer and, because `Down` overrides any
//! incarnation, healthy members that had refuted long before are forced to renew their
//! identities (the simulator measured 940-1,927 false downs in 10 minutes at 50 agents). Two
//! pieces here stop that:
//!
//! * **Probe health** (Lifeguard's local health multiplier, Dadgar et al., DSN 2018, fed by its
//!   "failed probe" signal): the outcome of our last [`PROBE_WINDOW`] probes is kept. While at
//!   least [`FAILING_PROBES`] of them, or the [`FAILING_RUN`] latest in a row, went unanswered
//!   (directly, indirectly, or by a `TurnUndead` from the probed member, which proves the
//!   path works), this member is the likely problem: it withholds its own suspect-to-down
//!   decisions (they wait, one suspicion window at a time; once its probes succeed again they
//!   are dropped, the evidence being untrustworthy), and it does not renew its identity when
//!   told it is down (so it settles as down in everyone else's view instead of flapping back
//!   in and out). Once probes succeed again (the partition healed), the next `TurnUndead`
//!   renews it as usual, and the down list it formed while failing is not carried into the
//!   renewed identity (`partition.rs`).
//! * **Stale accusations are dropped**: a piggybacked `Down` of a member at an incarnation
//!   below the one we hold it active at is an accusation the member has already refuted; it is
//!   removed from the payload before foca (which would apply it: `Down` is terminal there).
//!
//! REREAD ON EVERY FOCA UPGRADE: the payload filter uses the wire layout checked in
//! `repeat_filter.rs`.

use std::net::SocketAddr;

use foca::{Message, ProbeNumber, State};
use serde::Deserialize;
use shoal_proto::NodeId;

use super::{MemberId, Membership};

/// How many of our latest probes the probe health looks at.
pub(super) const PROBE_WINDOW: u32 = 8;

/// Failed probes (of the last [`PROBE_WINDOW`]) from which this member distrusts its own
/// accusations and does not renew. 6 of 8: a member of one half of a 50/50 split fails about
/// half of its probes until the other half is down, and should keep judging; a member reachable
/// by one peer in fifty fails all of them.
pub(super) const FAILING_PROBES: u32 = 6;

/// Consecutive failed probes that also count as failing: a member cut off from all but one
/// peer must stop trusting itself before its first suspicion window ends (~3.5 s at 50
/// members); four in a row take ~2 s. A healthy member fails a probe only when the direct and
/// all indirect paths are lost (~1e-9 at 1% loss), or when the probed member is really gone.
pub(super) const FAILING_RUN: u32 = 4;

/// How long after its probes last failed a member still counts as recently failing when it
/// renews (its down list is then not carried over), ms.
pub(super) const RECENTLY_FAILING_MS: u64 = 600_000;

/// Outcomes of our own probes (Lifeguard's failed-probe signal).
#[derive(Debug, Default, Clone)]
pub(super) struct ProbeHealth {
    /// The probe in flight: (target address, probe number, answered).
    pending: Option<(SocketAddr, ProbeNumber, bool)>,
    /// Bit `i` set = the `i`-th latest completed probe failed.
    failed_bits: u32,
    /// Completed probes recorded, up to [`PROBE_WINDOW`].
    recorded: u32,
    /// Last time (ms) a recorded outcome left us failing.
    last_failing_ms: Option<u64>,
}

impl ProbeHealth {
    fn record(&mut self, now_ms: u64, failed: bool) {
        let mask = (1u32 << PROBE_WINDOW) - 1;
        self.failed_bits = ((self.failed_bits << 1) | u32::from(failed)) & mask;
        self.recorded = (self.recorded + 1).min(PROBE_WINDOW);
        if self.is_failing() {
            self.last_failing_ms = Some(now_ms);
        }
    }

    /// We sent `Ping(number)` to `to` at `now_ms`: the previous probe is over.
    pub(super) fn on_ping(&mut self, now_ms: u64, to: SocketAddr, number: ProbeNumber) {
        if let Some((_, _, answered)) = self.pending.take() {
            self.record(now_ms, !answered);
        }
        self.pending = Some((to, number, false));
    }

    /// A reply that shows the probed member heard us.
    fn on_answer(&mut self, from: SocketAddr, number: Option<ProbeNumber>) {
        if let Some((to, n, answered)) = self.pending.as_mut() {
            if *to == from && number.is_none_or(|x| x == *n) {
                *answered = true;
            }
        }
    }

    /// At least [`FAILING_PROBES`] of the last [`PROBE_WINDOW`] probes failed, or the
    /// [`FAILING_RUN`] latest did.
    pub(super) fn is_failing(&self) -> bool {
        let run = (1u32 << FAILING_RUN) - 1;
        self.failed_bits.count_ones() >= FAILING_PROBES || self.failed_bits & run == run
    }

    /// At least half of the last [`PROBE_WINDOW`] probes failed: not clearly failing yet
    /// (a member of one half of a split is here half the time), but our accusations get one
    /// more suspicion window, up to three times (Lifeguard's local health multiplier applied
    /// to the suspicion timeout).
    pub(super) fn is_doubtful(&self) -> bool {
        self.failed_bits.count_ones() * 2 >= PROBE_WINDOW
    }

    /// Our probes were failing at some time in the last [`RECENTLY_FAILING_MS`].
    pub(super) fn failed_recently(&self, now_ms: u64) -> bool {
        self.last_failing_ms
            .is_some_and(|t| now_ms.saturating_sub(t) <= RECENTLY_FAILING_MS)
    }
}

impl Membership {
    /// Notes what an incoming header says about our probe in flight.
    pub(super) fn observe_probe_answer(&mut self, header: &foca::Header<MemberId>) {
        match &header.message {
            Message::Ack(n) => self.probe_health.on_answer(header.src.addr, Some(*n)),
            Message::ForwardedAck {
                origin,
                probe_number,
            } => self
                .probe_health
                .on_answer(origin.addr, Some(*probe_number)),
            Message::TurnUndead => self.probe_health.on_answer(header.src.addr, None),
            _ => {}
        }
    }

    /// Notes an outgoing probe (called for every datagram foca sends).
    pub(super) fn observe_outgoing(&mut self, now_ms: u64, to: SocketAddr, body: &[u8]) {
        // Only the header is decoded; a body foca produced always has one.
        if let Ok((header, _)) = postcard::take_from_bytes::<foca::Header<MemberId>>(body) {
            if let Message::Ping(n) = header.message {
                self.probe_health.on_ping(now_ms, to, n);
            }
        }
    }

    /// `true` while most of our own probes fail: our accusations wait and we do not renew
    /// (always `false` with [`MembershipConfig::probe_health`] off).
    ///
    /// [`MembershipConfig::probe_health`]: super::MembershipConfig::probe_health
    pub fn probes_failing(&self) -> bool {
        self.config.probe_health && self.probe_health.is_failing()
    }

    /// Half or more of our latest probes failed (see `ProbeHealth::is_doubtful`).
    pub(super) fn probes_doubtful(&self) -> bool {
        self.config.probe_health && self.probe_health.is_doubtful()
    }

    /// Removes from a SWIM payload the updates that must not reach foca: `Down` of a member we
    /// hold active at a higher incarnation (a refuted, stale accusation), and, while our probes
    /// fail, `Down` of ourselves (see the module docs). `None` when nothing is removed.
    pub(super) fn drop_unfounded_downs(
        &mut self,
        header: &foca::Header<MemberId>,
        body: &[u8],
        header_len: usize,
    ) -> Option<Vec<u8>> {
        if header.message == Message::Broadcast || header.message == Message::Announce {
            return None;
        }
        let count = body.get(header_len..header_len + 2)?;
        let count = u16::from_be_bytes([count[0], count[1]]);
        if count == 0 {
            return None;
        }
        let failing = self.probes_failing();
        let refuted_checks = self.config.drop_refuted_downs;
        if !failing && !refuted_checks {
            return None;
        }
        let mut kept = Vec::with_capacity(usize::from(count));
        let mut at = header_len + 2;
        let mut dropped = 0u64;
        for _ in 0..count {
            let (m, rest) = postcard::take_from_bytes::<DownProbe<'_>>(&body[at..]).ok()?;
            let end = body.len() - rest.len();
            let is_down = m.state == State::Down as u32;
            let drop = is_down
                && if m.id.addr == self.identity.addr {
                    failing && m.id.boot == self.identity.boot.0
                } else {
                    refuted_checks
                        && self.holds_newer_incarnation(
                            m.id.node,
                            m.id.addr,
                            m.id.boot,
                            m.incarnation,
                        )
                };
            if drop {
                dropped += 1;
            } else {
                kept.push((at, end));
            }
            at = end;
        }
        if dropped == 0 {
            return None;
        }
        self.counters.downs_dropped += dropped;
        let mut out = Vec::with_capacity(body.len());
        out.extend_from_slice(&body[..header_len]);
        out.extend_from_slice(&(kept.len() as u16).to_be_bytes());
        for (start, end) in kept {
            out.extend_from_slice(&body[start..end]);
        }
        out.extend_from_slice(&body[at..]);
        Some(out)
    }

    /// We hold exactly this identity active, at an incarnation above `incarnation`.
    fn holds_newer_incarnation(
        &self,
        node: &str,
        addr: SocketAddr,
        boot: u64,
        incarnation: foca::Incarnation,
    ) -> bool {
        let Some(active) = NodeId::new(node).ok().and_then(|n| self.active.get(&n)) else {
            return false;
        };
        if active.addr != addr || active.boot.0 != boot {
            return false;
        }
        self.foca
            .active_member(active)
            .is_some_and(|m| m.incarnation() > incarnation && m.state() != State::Down)
    }

    /// Whether an incoming `TurnUndead` must be withheld from foca because our probes fail
    /// (renewing now would only make us flap; see the module docs).
    pub(super) fn withhold_renewal(&mut self) -> bool {
        if self.probes_failing() {
            self.counters.renewals_withheld += 1;
            return true;
        }
        false
    }
}

/// Borrowed wire layout of `foca::Member<MemberId>` (see `repeat_filter.rs`), with the fields
/// the filter reads.
#[derive(Deserialize)]
struct DownProbe<'a> {
    #[serde(borrow)]
    id: DownProbeId<'a>,
    incarnation: foca::Incarnation,
    /// `foca::State` variant index.
    state: u32,
}

#[derive(Deserialize)]
struct DownProbeId<'a> {
    node: &'a str,
    addr: SocketAddr,
    boot: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_health_fails_after_four_in_a_row_or_six_of_eight_and_recovers() {
        let a: SocketAddr = "10.0.0.1:1".parse().expect("addr");
        let mut h = ProbeHealth::default();
        for n in 0..4u8 {
            h.on_ping(n.into(), a, n);
        }
        // Three completed probes, all failed: not yet.
        assert!(!h.is_failing());
        h.on_ping(4, a, 4);
        assert!(h.is_failing(), "four failed probes in a row");
        assert!(h.failed_recently(4) && !h.failed_recently(4 + RECENTLY_FAILING_MS + 1));
        // One answer breaks the run; four failures of the last five are not six of eight.
        h.on_answer(a, Some(4));
        h.on_ping(5, a, 5);
        assert!(!h.is_failing(), "{:b}", h.failed_bits);
        // Fail, answer, fail, fail: six of the last eight failed, no run of four.
        for (n, answer) in [(5u8, false), (6, true), (7, false), (8, false)] {
            if answer {
                h.on_answer(a, Some(n));
            }
            h.on_ping(n.into(), a, n + 1);
        }
        assert_eq!(h.failed_bits.count_ones(), 6, "{:b}", h.failed_bits);
        assert!(h.is_failing());
        // Answered probes bring it back.
        for n in 9..12u8 {
            h.on_answer(a, Some(n));
            h.on_ping(n.into(), a, n + 1);
        }
        assert!(!h.is_failing(), "{:b}", h.failed_bits);
    }

    #[test]
    fn an_answer_for_another_probe_or_member_does_not_count() {
        let a: SocketAddr = "10.0.0.1:1".parse().expect("addr");
        let b: SocketAddr = "10.0.0.2:1".parse().expect("addr");
        let mut h = ProbeHealth::default();
        h.on_ping(0, a, 1);
        h.on_answer(b, Some(1));
        h.on_answer(a, Some(2));
        h.on_ping(1, a, 2);
        assert_eq!(h.failed_bits, 1, "the first probe failed");
    }

    #[test]
    fn down_probe_reads_state_and_incarnation() {
        use foca::{Member, PostcardCodec};
        use shoal_proto::{Generation, NodeId};
        let id = MemberId {
            node: NodeId::new("n3").expect("valid"),
            addr: "10.1.2.3:7946".parse().expect("addr"),
            boot: Generation(4),
        };
        for (member, state) in [
            (Member::new(id.clone(), 9, State::Down), State::Down),
            (Member::new(id.clone(), 2, State::Suspect), State::Suspect),
            (Member::alive(id.clone()), State::Alive),
        ] {
            let mut bytes = Vec::new();
            foca::Codec::encode_member(&mut PostcardCodec, &member, &mut bytes).expect("encodes");
            let (raw, rest) = postcard::take_from_bytes::<DownProbe<'_>>(&bytes).expect("reads");
            assert!(rest.is_empty());
            assert_eq!(raw.state, state as u32);
            assert_eq!(raw.incarnation, member.incarnation());
            assert_eq!(raw.id.node, "n3");
            assert_eq!(raw.id.boot, 4);
        }
    }
}
