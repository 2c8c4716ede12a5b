//! The lifecycle transition table.

use crate::support::*;

#[test]
fn check_transition_accepts_exactly_the_table() {
    use shoal_catalog::check_transition;
    use shoal_proto::TransitionReason::{self, *};
    let states = [Starting, Ready, Draining, Expired];
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
    // Written out independently of LEGAL_TRANSITIONS.
    let legal: Vec<(Option<LifecycleState>, LifecycleState, TransitionReason)> = vec![
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
        (Some(Starting), Starting, NodeKeyChanged),
        (Some(Ready), Ready, NodeKeyChanged),
        (Some(Draining), Draining, NodeKeyChanged),
        (Some(Starting), Expired, NodeRevoked),
        (Some(Ready), Expired, NodeRevoked),
        (Some(Draining), Expired, NodeRevoked),
    ];

    let mut accepted = 0;
    for from in std::iter::once(None).chain(states.iter().copied().map(Some)) {
        for to in states {
            for reason in reasons {
                let got = check_transition(from, to, reason);
                if legal.contains(&(from, to, reason)) {
                    assert_eq!(got, Ok(()), "{from:?} -> {to:?} ({reason:?})");
                    accepted += 1;
                } else {
                    let err = got.expect_err("must be illegal");
                    assert_eq!((err.from, err.to, err.reason), (from, to, reason));
                }
            }
        }
    }
    assert_eq!(accepted, legal.len());
    assert_eq!(
        shoal_catalog::lifecycle::LEGAL_TRANSITIONS.len(),
        legal.len()
    );
}
