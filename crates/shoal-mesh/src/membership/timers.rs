//! Timers as data, and Lifeguard-style local health.
//!
//! Every timer is a [`MembershipTimer`] token the driver hands back at its deadline. foca
//! timers carry the epoch of foca's timer token when they were scheduled; when foca moves to a
//! new token the epoch is bumped and older timers become counted no-ops (after foca's own
//! `Timer` + `TimerToken` design), so drivers never cancel anything.
//!
//! Local health (Dadgar, Phillips, Currey, "Lifeguard: Local Health Awareness for More Accurate
//! Failure Detection", DSN 2018 workshops): a timer handled much later than it was due means
//! this process was stalled, so for a while it postpones its own suspect-to-down decisions (at
//! most `MAX_DOWN_POSTPONES` times each) instead of declaring members down on stale evidence.

use foca::Timer;

use super::{MemberId, Membership};

/// How many times a degraded member postpones declaring one suspect down (each time by one
/// suspicion window) before it lets foca decide.
const MAX_DOWN_POSTPONES: u8 = 3;

/// What an idle timer amounts to ([`Membership::idle_timer`]).
#[derive(Debug)]
pub(crate) enum IdleTimer {
    /// Firing it would only arm this timer at this deadline.
    Rearm(u64, MembershipTimer),
    /// Firing it would only update foca's bookkeeping: hand it to
    /// [`Membership::settle_idle`].
    Settle,
}

/// A timer token. Opaque: hand it back to [`Membership::handle_timer`] at its deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipTimer(TimerKind);

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum TimerKind {
    Foca {
        epoch: u64,
        timer: Timer<MemberId>,
        /// When it was due (ms), to measure how late we handle it (local health).
        deadline_ms: u64,
        /// How many times a suspect-to-down was postponed because we were degraded.
        postponed: u8,
        /// A suspect-to-down withheld because our probes were failing: the suspicion was
        /// formed on evidence we no longer trust, so once our probes succeed again it is
        /// dropped (the member stays suspect here until it refutes or others declare it).
        withheld: bool,
    },
    JoinRetry {
        seq: u64,
    },
    /// The address book's reconnect tick (`reconnect.rs`).
    Reconnect {
        seq: u64,
        /// When it is due (ms): an idle tick is re-armed one period after it.
        deadline_ms: u64,
    },
}

impl TimerKind {
    fn is_suspect_to_down(&self) -> bool {
        matches!(
            self,
            TimerKind::Foca {
                timer: Timer::ChangeSuspectToDown { .. },
                ..
            }
        )
    }

    /// Sets the deadline a timer carries (`JoinRetry` carries none).
    fn set_deadline_ms(&mut self, at: u64) {
        if let TimerKind::Foca { deadline_ms, .. } | TimerKind::Reconnect { deadline_ms, .. } = self
        {
            *deadline_ms = at;
        }
    }
}

impl Membership {
    /// Delivers a timer previously yielded by [`Membership::poll_timer`], at or after its
    /// deadline. Stale timers are counted in `stale_timers` and do nothing.
    pub fn handle_timer(&mut self, now_ms: u64, token: MembershipTimer) {
        self.observe_now(now_ms);
        if token.0.is_suspect_to_down() {
            self.suspicions_pending = self.suspicions_pending.saturating_sub(1);
        }
        match token.0 {
            TimerKind::Foca {
                epoch,
                timer,
                deadline_ms,
                postponed,
                withheld,
            } => {
                if epoch != self.timer_epoch && foca_token(&timer).is_some() {
                    self.counters.stale_timers += 1;
                    return;
                }
                // Lifeguard-style local health (Dadgar et al., "Lifeguard", DSN 2018): a timer
                // handled much later than due means this process was stalled (CPU starvation,
                // GC, swapping). Acks and refutations it has not processed yet may be queued,
                // so it must not declare anyone down on its own evidence right now.
                if now_ms.saturating_sub(deadline_ms) > self.config.probe_rtt_ms {
                    self.degraded_until_ms = now_ms + self.config.suspect_to_down_after_ms;
                }
                let degraded = now_ms < self.degraded_until_ms;
                // Probe health (`accuser.rs`): while most of our own probes fail we are the
                // likely problem, and our accusations wait for as long as that lasts.
                let failing = self.probes_failing();
                let suspect_to_down = matches!(timer, Timer::ChangeSuspectToDown { .. });
                if withheld && !failing && suspect_to_down {
                    self.counters.downs_voided += 1;
                    return;
                }
                let doubtful = degraded || self.probes_doubtful();
                if (failing || (doubtful && postponed < MAX_DOWN_POSTPONES)) && suspect_to_down {
                    if failing {
                        self.counters.downs_withheld += 1;
                    } else {
                        self.counters.downs_postponed += 1;
                    }
                    let at = now_ms + self.config.suspect_to_down_after_ms;
                    self.push_timer(
                        at,
                        TimerKind::Foca {
                            epoch,
                            timer,
                            deadline_ms: at,
                            postponed: postponed.saturating_add(1),
                            withheld: withheld || failing,
                        },
                    );
                    self.drain(now_ms);
                    return;
                }
                if self.foca.handle_timer(timer, &mut self.runtime).is_err() {
                    self.counters.timer_errors += 1;
                }
            }
            TimerKind::Reconnect { seq, .. } => self.on_reconnect_tick(now_ms, seq),
            TimerKind::JoinRetry { seq } => {
                if seq != self.join_seq {
                    self.counters.stale_timers += 1;
                    return;
                }
                self.join_armed = false;
                if !self.defunct && !self.connected {
                    self.announce_to_seeds();
                    self.arm_join_retry(now_ms);
                }
            }
        }
        self.drain(now_ms);
    }

    /// What firing `token` at its own deadline would amount to, if it would amount to nothing
    /// that leaves this module: `None` when it could send, schedule anything new, draw from an
    /// RNG or change what an input sees. Three timers can be idle:
    /// - foca's **periodic gossip** of the current timer token while connected, with no
    ///   membership update and no custom broadcast to send: foca's handler only schedules the
    ///   next round (`Timer::PeriodicGossip` in foca 2.0's `handle_timer`) -> [`IdleTimer::Rearm`]
    ///   one `periodic_gossip_ms` after the old deadline. Not while a suspect-to-down decision
    ///   is pending (`suspicions_pending`): then each round still wakes the driver, because a
    ///   round handled late is the local-health signal that postpones that decision, and
    ///   without it only the probe timer (every `probe_period_ms`) would notice a stall;
    /// - foca's **indirect probe** of a probe that already got its ack: the handler only records
    ///   that the probe reached that stage ([`foca::Foca::indirect_probe_settled`], a shoal
    ///   patch) -> [`IdleTimer::Settle`];
    /// - the address book's **reconnect tick** with no address due at its deadline -> re-armed
    ///   one `reconnect_tick_ms` later (its sequence number stays: it is the one armed tick).
    ///
    /// Used by [`crate::Mesh`]'s deadline-driven path so an idle agent does not wake for them
    /// (`docs/adr/0021-core-owned-timers.md`, addendum of issue 19 session 10).
    pub(crate) fn idle_timer(&self, token: &MembershipTimer) -> Option<IdleTimer> {
        // What a timely firing would arm: the same timer, one period after its deadline.
        let rearm = |deadline_ms: u64, period_ms: u64| {
            let at = deadline_ms.saturating_add(period_ms);
            let mut next = token.0.clone();
            next.set_deadline_ms(at);
            IdleTimer::Rearm(at, MembershipTimer(next))
        };
        match &token.0 {
            TimerKind::Foca {
                epoch,
                timer,
                deadline_ms,
                ..
            } => {
                if *epoch != self.timer_epoch || !self.connected || self.defunct {
                    return None;
                }
                match timer {
                    Timer::PeriodicGossip(foca_token) => {
                        let idle = self.last_foca_token == Some(*foca_token)
                            && self.suspicions_pending == 0
                            && self.foca.updates_backlog() == 0
                            && self.foca.custom_broadcast_backlog() == 0;
                        idle.then(|| rearm(*deadline_ms, self.config.periodic_gossip_ms))
                    }
                    Timer::SendIndirectProbe { .. } => self
                        .foca
                        .indirect_probe_settled(timer)
                        .then_some(IdleTimer::Settle),
                    _ => None,
                }
            }
            TimerKind::Reconnect { seq, deadline_ms } => {
                let idle = *seq == self.reconnect_seq
                    && !self.defunct
                    && !self.book.is_empty()
                    && !self.any_address_due(*deadline_ms);
                idle.then(|| rearm(*deadline_ms, self.config.reconnect_tick_ms))
            }
            TimerKind::JoinRetry { .. } => None,
        }
    }

    /// Hands over a timer [`Membership::idle_timer`] called [`IdleTimer::Settle`]: foca's
    /// handler runs as it would have at the deadline, minus the local-health lateness check (a
    /// timely driver would not have been late), and produces nothing.
    pub(crate) fn settle_idle(&mut self, token: MembershipTimer) {
        let TimerKind::Foca { timer, .. } = token.0 else {
            debug_assert!(false, "only foca timers settle");
            return;
        };
        if self.foca.handle_timer(timer, &mut self.runtime).is_err() {
            self.counters.timer_errors += 1;
        }
        debug_assert_eq!(self.runtime.backlog(), 0, "a settled timer produced output");
    }

    pub(super) fn arm_join_retry(&mut self, now_ms: u64) {
        if self.join_armed || self.seeds.is_empty() || self.defunct {
            return;
        }
        self.join_seq += 1;
        self.join_armed = true;
        let deadline = now_ms.saturating_add(self.config.join_retry_ms);
        self.push_timer(deadline, TimerKind::JoinRetry { seq: self.join_seq });
    }

    pub(super) fn push_timer(&mut self, deadline_ms: u64, kind: TimerKind) {
        debug_assert!(
            deadline_ms >= self.last_now_ms,
            "membership timer armed in the past: {deadline_ms} < {}",
            self.last_now_ms
        );
        if self.timers.len() >= self.config.max_pending_timers {
            self.counters.timer_overflow += 1;
            return;
        }
        if kind.is_suspect_to_down() {
            self.suspicions_pending += 1;
        }
        self.timers.push_back((deadline_ms, MembershipTimer(kind)));
    }
}

/// The foca token a timer carries, if any (`RemoveDown` carries none and is never stale).
pub(super) fn foca_token(timer: &Timer<MemberId>) -> Option<u8> {
    match timer {
        Timer::ProbeRandomMember(t)
        | Timer::PeriodicAnnounce(t)
        | Timer::PeriodicAnnounceDown(t)
        | Timer::PeriodicGossip(t) => Some(*t),
        Timer::SendIndirectProbe { token, .. } | Timer::ChangeSuspectToDown { token, .. } => {
            Some(*token)
        }
        Timer::RemoveDown(_) => None,
    }
}
