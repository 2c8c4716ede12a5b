//! The lifecycle state machine: which transitions the authority may sign.
//!
//! ```text
//!              register
//!   (none) ----------------> STARTING --ready--> READY --drain--> DRAINING
//!                               |                  |  ^              |
//!                               |                  |  +--undrain-----+
//!                               +------drain-------|--------------->-+
//!                               |                  |                 |
//!                               +---deregister / lease expiry ------>+--> EXPIRED (terminal)
//! ```
//!
//! A new boot generation of an instance is a *new registration* (`None -> STARTING`) that
//! supersedes every record of older generations; it is not a transition of the old one.
//! UNHEALTHY is not a lifecycle state: it is "READY but health failing" (see [`crate::view`]).
//!
//! The catalog itself does not enforce this table on merge (records arrive in any order and the
//! highest `(generation, revision)` wins); the authority enforces it when it signs.

use shoal_proto::{LifecycleState, TransitionReason};

/// A transition the table does not allow. Nothing is signed or changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal transition {from:?} -> {to:?} ({reason:?})")]
pub struct IllegalTransition {
    /// Current state (`None`: not registered).
    pub from: Option<LifecycleState>,
    /// Requested state.
    pub to: LifecycleState,
    /// The reason given for it.
    pub reason: TransitionReason,
}

/// The legal transitions, as `(from, to, reason)` rows. `from = None` means "not registered
/// (or only an older generation is)".
pub const LEGAL_TRANSITIONS: &[(Option<LifecycleState>, LifecycleState, TransitionReason)] = {
    use LifecycleState::*;
    use TransitionReason::*;
    &[
        (None, Starting, Registered),
        (Some(Starting), Ready, ReadinessPassed),
        (Some(Starting), Draining, DrainRequested),
        (Some(Starting), Expired, Deregistered),
        (Some(Starting), Expired, LeaseExpired),
        (Some(Ready), Draining, DrainRequested),
        (Some(Ready), Expired, Deregistered),
        (Some(Ready), Expired, LeaseExpired),
        (Some(Draining), Ready, DrainCancelled),
        (Some(Draining), Expired, Deregistered),
        (Some(Draining), Expired, LeaseExpired),
        // The owner node presented a new key: the authority re-issues the record unchanged
        // but for the key (ADR 0006). Authority only.
        (Some(Starting), Starting, NodeKeyChanged),
        (Some(Ready), Ready, NodeKeyChanged),
        (Some(Draining), Draining, NodeKeyChanged),
        // An operator revoked the owner node. Authority only.
        (Some(Starting), Expired, NodeRevoked),
        (Some(Ready), Expired, NodeRevoked),
        (Some(Draining), Expired, NodeRevoked),
    ]
};

/// Checks one transition against [`LEGAL_TRANSITIONS`].
///
/// # Errors
/// [`IllegalTransition`] when the row is not in the table (including any transition out of
/// EXPIRED, and health-only reasons such as `ReadinessFailed`).
pub fn check_transition(
    from: Option<LifecycleState>,
    to: LifecycleState,
    reason: TransitionReason,
) -> Result<(), IllegalTransition> {
    if LEGAL_TRANSITIONS
        .iter()
        .any(|&(f, t, r)| f == from && t == to && r == reason)
    {
        Ok(())
    } else {
        Err(IllegalTransition { from, to, reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LifecycleState::*;
    use TransitionReason::*;

    #[test]
    fn happy_path_is_legal() {
        check_transition(None, Starting, Registered).unwrap();
        check_transition(Some(Starting), Ready, ReadinessPassed).unwrap();
        check_transition(Some(Ready), Draining, DrainRequested).unwrap();
        check_transition(Some(Draining), Expired, Deregistered).unwrap();
    }

    #[test]
    fn expired_is_terminal() {
        // Every reason, every target: nothing leaves EXPIRED (the whole table is checked in
        // `tests/catalog_events/transitions.rs`).
        let reasons = [
            Registered,
            ReadinessPassed,
            DrainRequested,
            DrainCancelled,
            Deregistered,
            LeaseExpired,
            ReadinessFailed,
            ReadinessRecovered,
            LivenessFailed,
            NodeKeyChanged,
            NodeRevoked,
        ];
        for to in [Starting, Ready, Draining, Expired] {
            for reason in reasons {
                assert!(
                    check_transition(Some(Expired), to, reason).is_err(),
                    "EXPIRED -> {to:?} by {reason:?} must be refused"
                );
            }
        }
    }

    #[test]
    fn cannot_skip_startup() {
        let err = check_transition(None, Ready, ReadinessPassed).unwrap_err();
        assert_eq!(err.from, None);
        assert!(check_transition(Some(Ready), Ready, ReadinessPassed).is_err());
        assert!(check_transition(Some(Ready), Starting, Registered).is_err());
        assert!(check_transition(Some(Ready), Draining, ReadinessFailed).is_err());
    }
}
