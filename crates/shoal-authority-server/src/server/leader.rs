//! Leader duties: `LeaderTakeover` once per term won, periodic `ExpireLeases` (the lease
//! safety net and its checkpoints), and the liveness reconciliation of the embedded member's
//! view with the state (see the `server` module docs, "Leader duties" and "Liveness").

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use openraft::ServerState;
use shoal_authority::AuthorityCommand;
use shoal_proto::NodeId;
use tokio::sync::watch;

use super::{wall_ms, Replica, LEASE_CREDIT_SKEW_MS};
use crate::member::MeshView;
use crate::storage::SNAPSHOT_REQUEST_FILE;
use crate::types::RaftId;

/// Most liveness commands proposed per reconciliation round.
pub const MAX_LIVENESS_PROPOSALS: usize = 256;

/// The liveness commands that bring the state in line with the member's view (see the
/// module docs). Pure; exposed for tests.
pub fn liveness_plan(
    state: &shoal_authority::AuthorityState,
    view: &MeshView,
    now_ms: u64,
    absent_grace_ms: u64,
    max_down_percent: u8,
) -> Vec<AuthorityCommand> {
    let mut out = Vec::new();
    for (node, _) in state.down_nodes() {
        if view.alive.contains(node) {
            out.push(AuthorityCommand::NodeUp { node: node.clone() });
        }
    }
    if !view.active {
        out.truncate(MAX_LIVENESS_PROPOSALS);
        return out;
    }
    let owners: BTreeSet<&NodeId> = state
        .bindings()
        .filter(|(_, _, b)| b.state() != shoal_proto::LifecycleState::Expired)
        .map(|(_, _, b)| b.node())
        .collect();
    let absent_ok = absent_grace_ms > 0
        && view
            .active_since_ms
            .is_some_and(|t| now_ms.saturating_sub(t) >= absent_grace_ms);
    let mut downs = Vec::new();
    let mut absent = 0usize;
    for node in &owners {
        if view.alive.contains(*node) {
            continue;
        }
        let at = match view.down.get(*node) {
            Some(at) => *at,
            None if absent_ok => {
                absent += 1;
                now_ms
            }
            None => continue,
        };
        if state.down_since_ms(node).is_none() {
            downs.push(AuthorityCommand::NodeDown {
                node: (*node).clone(),
                at_ms: at,
            });
        }
    }
    let known = view.alive.len() + view.down.len() + absent;
    let down = view.down.len() + absent;
    if down * 100 > known * usize::from(max_down_percent) {
        if !downs.is_empty() {
            counter!("shoal_authority_liveness_suppressed_total").increment(downs.len() as u64);
        }
        downs.clear();
    }
    out.extend(downs);
    out.truncate(MAX_LIVENESS_PROPOSALS);
    out
}

impl Replica {
    /// Leader duties: `LeaderTakeover` once per term won, periodic `ExpireLeases`, metrics.
    pub(super) async fn leader_duties(self: Arc<Self>) {
        let mut metrics: watch::Receiver<_> = self.raft.metrics();
        let mut tick = tokio::time::interval(Duration::from_millis(self.cfg.expire_interval_ms));
        let mut last_leader: Option<RaftId> = None;
        let member = self.member.clone();
        loop {
            tokio::select! {
                r = metrics.changed() => if r.is_err() { return },
                _ = tick.tick() => {},
                () = async { match &member { Some(m) => m.changed().await, None => std::future::pending().await } } => {},
            }
            let m = metrics.borrow().clone();
            // Audit lines kept in memory after failed appends: written as soon as it works.
            self.sm.retry_audit();
            gauge!("shoal_authority_term").set(m.current_term as f64);
            gauge!("shoal_authority_applied_index")
                .set(m.last_applied.map_or(0, |l| l.index) as f64);
            let is_leader = m.state == ServerState::Leader;
            gauge!("shoal_authority_is_leader").set(if is_leader { 1.0 } else { 0.0 });
            let quorum = m.current_leader.is_some()
                && (!is_leader
                    || m.millis_since_quorum_ack
                        .is_some_and(|ms| ms <= self.cfg.quorum_stale_ms));
            gauge!("shoal_authority_quorum").set(if quorum { 1.0 } else { 0.0 });
            let request = self.cfg.data_dir.join(SNAPSHOT_REQUEST_FILE);
            if request.exists() {
                // An operator's `snapshot save` found no snapshot: build one now.
                let _ = std::fs::remove_file(&request);
                tracing::info!("snapshot requested by an operator");
                if let Err(e) = self.snapshot_now().await {
                    tracing::warn!(error = %e, "requested snapshot");
                }
            }
            if m.current_leader != last_leader {
                if m.current_leader.is_some() {
                    counter!("shoal_authority_leader_changes_total").increment(1);
                }
                last_leader = m.current_leader;
            }
            if !is_leader {
                continue;
            }
            let term = m.current_term;
            if self.takeover_term.load(Ordering::Acquire) < term {
                // Apply the log this replica held when it became leader of `term` first, so the
                // lease credit refers to the checkpoint the takeover will follow (a credit for
                // an older one credits nothing). That log ends with an entry of `term` (the
                // blank entry of the election, or, for a process that restarted into its old
                // term, openraft 0.9 resuming its committed vote, the previous process's
                // entries of the term), which commits without a new proposal once a quorum
                // holds it. Waiting only one election timeout, a resumed leader whose
                // followers were slow to answer proposed with nothing applied and its takeover
                // forgot the time since the latest checkpoint (docs/adr/0024); past
                // `write_timeout_ms` it proposes anyway (the takeover commits the rest).
                let applied = m.last_applied.map(|l| l.index);
                let since = {
                    let mut g = self.leader_since.lock().expect("leader_since");
                    match *g {
                        Some(s) if s.0 == term => s,
                        _ => *g.insert((term, Instant::now(), m.last_log_index)),
                    }
                };
                if applied < since.2
                    && since.1.elapsed() < Duration::from_millis(self.cfg.write_timeout_ms)
                {
                    continue;
                }
                self.takeover_term.store(term, Ordering::Release);
                let this = self.clone();
                tokio::spawn(async move {
                    let now_ms = this.mono_ms();
                    // Wall-clock part of the credit: assume replicas' clocks within
                    // LEASE_CREDIT_SKEW_MS; cap it at a checkpoint interval plus two maximal
                    // elections (docs/adr/0008-lease-checkpoints.md).
                    let cap = this.cfg.lease_checkpoint_ms + 4 * this.cfg.election_timeout_ms;
                    let credit = Some(this.sm.lease_credit(wall_ms(), LEASE_CREDIT_SKEW_MS, cap));
                    let (credit_checkpoint, credit_ms) =
                        credit.map_or((0, 0), |c| (c.checkpoint, c.elapsed_ms));
                    tracing::info!(
                        term,
                        now_ms,
                        credit_checkpoint,
                        credit_ms,
                        "leader takeover proposed"
                    );
                    match this
                        .write(AuthorityCommand::LeaderTakeover { now_ms, credit }, None)
                        .await
                    {
                        Ok(_) => {
                            this.takeover_done.fetch_max(term, Ordering::AcqRel);
                            tracing::info!(
                                term,
                                now_ms,
                                credit_checkpoint,
                                credit_ms,
                                "leader takeover committed"
                            );
                        }
                        Err(e) => {
                            tracing::warn!(term, error = %e, "leader takeover not committed");
                            // Retry at the next tick.
                            this.takeover_term
                                .store(term.saturating_sub(1), Ordering::Release);
                        }
                    }
                });
                continue;
            }
            if self.takeover_done.load(Ordering::Acquire) < term {
                continue; // the takeover is in flight: no lease or liveness entry before it
            }
            self.reconcile_liveness();
            let now_ms = self.mono_ms();
            let (due, any_down) = self.sm.with_state(|s| {
                (
                    s.next_lease_deadline_ms().is_some_and(|d| d <= now_ms),
                    s.down_nodes().next().is_some(),
                )
            });
            // While nodes are down, an ExpireLeases every lease_checkpoint_ms is also the lease
            // checkpoint a later leader resumes from (docs/adr/0008-lease-checkpoints.md).
            let checkpoint_due = any_down
                && now_ms.saturating_sub(self.last_checkpoint_ms.load(Ordering::Acquire))
                    >= self.cfg.lease_checkpoint_ms;
            let due = due || checkpoint_due;
            // One batch in flight at a time (the state is re-read after it applied).
            if due && !self.expire_busy.swap(true, Ordering::AcqRel) {
                let this = self.clone();
                this.last_checkpoint_ms.store(now_ms, Ordering::Release);
                tokio::spawn(async move {
                    match this
                        .write(AuthorityCommand::ExpireLeases { now_ms }, None)
                        .await
                    {
                        Ok(recs) if recs.is_empty() => {
                            tracing::debug!("lease checkpoint committed")
                        }
                        Ok(recs) => tracing::info!(expired = recs.len(), "lease safety net"),
                        Err(e) => tracing::warn!(error = %e, "expire leases not committed"),
                    }
                    this.expire_busy.store(false, Ordering::Release);
                });
            }
        }
    }
}

impl Replica {
    /// Leader only: proposes the liveness commands of [`liveness_plan`], one round at a time.
    pub(super) fn reconcile_liveness(self: &Arc<Self>) {
        let Some(member) = &self.member else {
            return;
        };
        if self.liveness_busy.load(Ordering::Acquire) {
            return;
        }
        let now_ms = self.mono_ms();
        let knobs = &self.cfg.mesh;
        let plan = member.with_view(|view| {
            self.sm.with_state(|s| {
                liveness_plan(
                    s,
                    view,
                    now_ms,
                    knobs.absent_grace_ms,
                    knobs.max_down_percent,
                )
            })
        });
        if plan.is_empty() || self.liveness_busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            for cmd in plan {
                let (kind, up) = match &cmd {
                    AuthorityCommand::NodeDown { .. } => ("node_down", None),
                    AuthorityCommand::NodeUp { node } => ("node_up", Some(node.clone())),
                    _ => ("other", None),
                };
                let desc = format!("{cmd:?}");
                match this.write(cmd, None).await {
                    Ok(_) => {
                        counter!("shoal_authority_liveness_proposals_total", "kind" => kind)
                            .increment(1);
                        if let Some(node) = up {
                            let leases =
                                this.sm.with_state(|s| crate::renewals::leases_of(s, &node));
                            crate::renewals::record_node_up(leases);
                        }
                        tracing::info!(command = %desc, "liveness committed");
                    }
                    Err(e) => {
                        tracing::warn!(command = %desc, error = %e, "liveness not committed");
                        break;
                    }
                }
            }
            this.liveness_busy.store(false, Ordering::Release);
        });
    }
}
