//! From fault tables to typed, time-ordered faults: [`FaultAction`] (one fault with every field
//! checked) and [`TimedFault`] (when, what, and the rolling `spread_ms`), as the runner applies
//! them. Targets are kept as written; selectors are resolved when the fault fires.

use super::{FaultKind, FaultSpec, RumourState, Scenario, ScenarioError, Target};

/// A fault with every field checked, ready to apply.
#[derive(Clone, Debug, PartialEq)]
pub enum FaultAction {
    /// See [`FaultKind::Cut`].
    Cut {
        /// Side A.
        a: Target,
        /// Side B.
        b: Target,
    },
    /// See [`FaultKind::CutOneWay`].
    CutOneWay {
        /// Senders.
        from: Target,
        /// Receivers.
        to: Target,
    },
    /// See [`FaultKind::Isolate`].
    Isolate(Target),
    /// See [`FaultKind::IsolateExcept`].
    IsolateExcept {
        /// Isolated nodes.
        nodes: Target,
        /// The one peer still reachable.
        peer: Target,
    },
    /// See [`FaultKind::DropLink`].
    DropLink {
        /// Senders.
        from: Target,
        /// Receivers.
        to: Target,
    },
    /// See [`FaultKind::Heal`].
    Heal,
    /// See [`FaultKind::Recover`].
    Recover(Target),
    /// See [`FaultKind::Crash`].
    Crash(Target),
    /// See [`FaultKind::Restart`].
    Restart(Target),
    /// See [`FaultKind::Stall`].
    Stall {
        /// Stalled nodes.
        nodes: Target,
        /// Stall length, ms.
        stall_ms: u64,
        /// Period, ms.
        period_ms: u64,
        /// Total, ms.
        for_ms: Option<u64>,
    },
    /// See [`FaultKind::Unstall`].
    Unstall(Target),
    /// See [`FaultKind::Skew`].
    Skew {
        /// Skewed nodes.
        nodes: Target,
        /// Offset, ms.
        offset_ms: i64,
    },
    /// See [`FaultKind::SetNetwork`].
    SetNetwork {
        /// New loss, percent.
        loss_pct: Option<f64>,
        /// New duplication, percent.
        dup_pct: Option<f64>,
    },
    /// See [`FaultKind::RestartAtNewAddress`].
    RestartAtNewAddress(Target),
    /// See [`FaultKind::DuplicateId`].
    DuplicateId {
        /// The node whose id is claimed twice.
        node: Target,
        /// The machine that runs the second process.
        on: Target,
    },
    /// See [`FaultKind::InjectUpdate`].
    InjectUpdate {
        /// Receivers.
        to: Target,
        /// Claimed sender (one node).
        from: Target,
        /// Subject (one node).
        member: Target,
        /// Claimed state.
        state: RumourState,
        /// Added to the subject's current incarnation.
        incarnation_delta: i64,
        /// Added to the subject's current boot generation.
        boot_delta: i64,
    },
    /// See [`FaultKind::LinkMaxDatagram`].
    LinkMaxDatagram {
        /// Senders.
        from: Target,
        /// Receivers.
        to: Target,
        /// Limit, bytes.
        max_datagram_bytes: u32,
    },
    /// See [`FaultKind::CrashTornSnapshot`].
    CrashTornSnapshot(Target),
}

/// A validated, time-ordered fault.
#[derive(Clone, Debug, PartialEq)]
pub struct TimedFault {
    /// When, virtual ms.
    pub at_ms: u64,
    /// Kind, for reports.
    pub kind: FaultKind,
    /// What to do.
    pub action: FaultAction,
    /// `crash` / `restart` only: hit the targets one by one over this many ms (see the module
    /// docs).
    pub spread_ms: Option<u64>,
}

impl Scenario {
    /// Converts one fault table into a typed action, or says what is wrong.
    pub fn check_fault(&self, f: &FaultSpec, n: u64) -> Result<FaultAction, String> {
        use FaultKind as K;
        let allowed: &[&str] = match f.action {
            K::Cut => &["a", "b"],
            K::CutOneWay | K::DropLink => &["from", "to"],
            K::IsolateExcept => &["nodes", "peer"],
            K::Heal => &[],
            K::Stall => &["nodes", "stall_ms", "period_ms", "for_ms"],
            K::Skew => &["nodes", "offset_ms"],
            K::SetNetwork => &["loss_pct", "dup_pct"],
            K::Crash | K::Restart => &["nodes", "spread_ms"],
            K::Isolate | K::Recover | K::Unstall => &["nodes"],
            K::RestartAtNewAddress | K::CrashTornSnapshot => &["nodes"],
            K::DuplicateId => &["nodes", "to"],
            K::InjectUpdate => &[
                "nodes",
                "from",
                "member",
                "state",
                "incarnation_delta",
                "boot_delta",
            ],
            K::LinkMaxDatagram => &["from", "to", "max_datagram_bytes"],
        };
        let present = [
            ("nodes", f.nodes.is_some()),
            ("a", f.a.is_some()),
            ("b", f.b.is_some()),
            ("from", f.from.is_some()),
            ("to", f.to.is_some()),
            ("peer", f.peer.is_some()),
            ("stall_ms", f.stall_ms.is_some()),
            ("period_ms", f.period_ms.is_some()),
            ("for_ms", f.for_ms.is_some()),
            ("offset_ms", f.offset_ms.is_some()),
            ("loss_pct", f.loss_pct.is_some()),
            ("dup_pct", f.dup_pct.is_some()),
            ("spread_ms", f.spread_ms.is_some()),
            ("member", f.member.is_some()),
            ("state", f.state.is_some()),
            ("incarnation_delta", f.incarnation_delta.is_some()),
            ("boot_delta", f.boot_delta.is_some()),
            ("max_datagram_bytes", f.max_datagram_bytes.is_some()),
        ];
        if let Some((name, _)) = present
            .iter()
            .find(|(name, set)| *set && !allowed.contains(name))
        {
            return Err(format!(
                "field `{name}` does not apply (allowed: {allowed:?})"
            ));
        }
        let a = match f.action {
            K::Cut => FaultAction::Cut {
                a: self.need(&f.a, "a", n)?.clone(),
                b: self.need(&f.b, "b", n)?.clone(),
            },
            K::CutOneWay => FaultAction::CutOneWay {
                from: self.need(&f.from, "from", n)?.clone(),
                to: self.need(&f.to, "to", n)?.clone(),
            },
            K::DropLink => FaultAction::DropLink {
                from: self.need(&f.from, "from", n)?.clone(),
                to: self.need(&f.to, "to", n)?.clone(),
            },
            K::Isolate => FaultAction::Isolate(self.need(&f.nodes, "nodes", n)?.clone()),
            K::IsolateExcept => FaultAction::IsolateExcept {
                nodes: self.need(&f.nodes, "nodes", n)?.clone(),
                peer: self.need(&f.peer, "peer", n)?.clone(),
            },
            K::Heal => FaultAction::Heal,
            K::Recover => FaultAction::Recover(self.need(&f.nodes, "nodes", n)?.clone()),
            K::Crash => FaultAction::Crash(self.need(&f.nodes, "nodes", n)?.clone()),
            K::Restart => FaultAction::Restart(self.need(&f.nodes, "nodes", n)?.clone()),
            K::Unstall => FaultAction::Unstall(self.need(&f.nodes, "nodes", n)?.clone()),
            K::Stall => {
                let stall_ms = f.stall_ms.ok_or("missing `stall_ms`")?;
                let period_ms = f.period_ms.ok_or("missing `period_ms`")?;
                if stall_ms == 0 || stall_ms >= period_ms {
                    return Err(format!(
                        "need 0 < stall_ms ({stall_ms}) < period_ms ({period_ms})"
                    ));
                }
                FaultAction::Stall {
                    nodes: self.need(&f.nodes, "nodes", n)?.clone(),
                    stall_ms,
                    period_ms,
                    for_ms: f.for_ms,
                }
            }
            K::Skew => FaultAction::Skew {
                nodes: self.need(&f.nodes, "nodes", n)?.clone(),
                offset_ms: f.offset_ms.ok_or("missing `offset_ms`")?,
            },
            K::SetNetwork => {
                for v in [f.loss_pct, f.dup_pct].into_iter().flatten() {
                    if !(0.0..=100.0).contains(&v) {
                        return Err(format!("percentages must be within 0..=100, got {v}"));
                    }
                }
                if f.loss_pct.is_none() && f.dup_pct.is_none() {
                    return Err("set at least one of `loss_pct`, `dup_pct`".into());
                }
                FaultAction::SetNetwork {
                    loss_pct: f.loss_pct,
                    dup_pct: f.dup_pct,
                }
            }
            K::RestartAtNewAddress => {
                FaultAction::RestartAtNewAddress(self.need(&f.nodes, "nodes", n)?.clone())
            }
            K::CrashTornSnapshot => {
                FaultAction::CrashTornSnapshot(self.need(&f.nodes, "nodes", n)?.clone())
            }
            K::DuplicateId => {
                let node = self.need(&f.nodes, "nodes", n)?.clone();
                let on = self.need(&f.to, "to", n)?.clone();
                for (name, t) in [("nodes", &node), ("to", &on)] {
                    one_node(name, t)?;
                }
                if node == on {
                    return Err("`nodes` and `to` must be different nodes".into());
                }
                FaultAction::DuplicateId { node, on }
            }
            K::InjectUpdate => {
                let from = self.need(&f.from, "from", n)?.clone();
                let member = self.need(&f.member, "member", n)?.clone();
                for (name, t) in [("from", &from), ("member", &member)] {
                    one_node(name, t)?;
                }
                FaultAction::InjectUpdate {
                    to: self.need(&f.nodes, "nodes", n)?.clone(),
                    from,
                    member,
                    state: f.state.ok_or("missing `state`")?,
                    incarnation_delta: f.incarnation_delta.unwrap_or(0),
                    boot_delta: f.boot_delta.unwrap_or(0),
                }
            }
            K::LinkMaxDatagram => {
                let max = f.max_datagram_bytes.ok_or("missing `max_datagram_bytes`")?;
                if max == 0 {
                    return Err("`max_datagram_bytes` must be > 0".into());
                }
                FaultAction::LinkMaxDatagram {
                    from: self.need(&f.from, "from", n)?.clone(),
                    to: self.need(&f.to, "to", n)?.clone(),
                    max_datagram_bytes: max,
                }
            }
        };
        if f.at_ms > self.duration_ms {
            return Err(format!(
                "at_ms {} is after duration_ms {}",
                f.at_ms, self.duration_ms
            ));
        }
        if let Some(spread) = f.spread_ms {
            if spread == 0 || f.at_ms + spread > self.duration_ms {
                return Err(format!(
                    "need 0 < spread_ms ({spread}) and at_ms + spread_ms <= duration_ms ({})",
                    self.duration_ms
                ));
            }
        }
        Ok(a)
    }

    /// The fault list, validated and stably sorted by time.
    pub fn timed_faults(&self) -> Result<Vec<TimedFault>, ScenarioError> {
        let n = self
            .topology
            .regions
            .iter()
            .map(|r| u64::from(r.agents_per_zone) * r.zones.len() as u64)
            .sum();
        let mut out = Vec::with_capacity(self.faults.len());
        let mut errs = Vec::new();
        for (i, f) in self.faults.iter().enumerate() {
            match self.check_fault(f, n) {
                Ok(action) => out.push(TimedFault {
                    at_ms: f.at_ms,
                    kind: f.action,
                    action,
                    spread_ms: f.spread_ms,
                }),
                Err(e) => errs.push(format!("faults[{i}]: {e}")),
            }
        }
        if !errs.is_empty() {
            return Err(ScenarioError::Invalid(errs));
        }
        out.sort_by_key(|f| f.at_ms);
        Ok(out)
    }
}

/// A target that must name exactly one node: an explicit list of one index (a selector may
/// resolve to any number, so it is refused here).
fn one_node(field: &str, t: &Target) -> Result<(), String> {
    match t {
        Target::Ids(ids) if ids.len() == 1 => Ok(()),
        _ => Err(format!(
            "`{field}` must name exactly one node, as `[index]`"
        )),
    }
}
