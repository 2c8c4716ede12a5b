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
    },
}

impl Membership {
    /// Delivers a timer previously yielded by [`Membership::poll_timer`], at or after its
    /// deadline. Stale timers are counted in `stale_timers` and do nothing.
    pub fn handle_timer(&mut self, now_ms: u64, token: MembershipTimer) {
        self.observe_now(now_ms);
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
            TimerKind::Reconnect { seq } => self.on_reconnect_tick(now_ms, seq),
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
