//! `shoal authority members list|add|remove`: changing the replica set through openraft 0.9's
//! membership API (docs/adr/0009-authority-membership-change.md).
//!
//! - **add**: `add_learner` (blocking until the learner has caught up, bounded by the
//!   request's `catch_up_ms`), then `change_membership(AddVoterIds)`: openraft commits a joint
//!   configuration (old and new voters each need a majority) and then the new one.
//! - **remove**: `change_membership(RemoveVoters)` (or `RemoveNodes` for a learner), not
//!   retained as a learner. A removed leader keeps leading until the configuration without it
//!   commits, then steps down and the remaining voters elect.
//!
//! Operators only (the same rule as `node revoke`). Refused with a clear error, before
//! anything is proposed: removing the last voter; a voter set whose live replicas (heard from
//! within `quorum_stale_ms`, see [`crate::network::RaftRpc::last_heard`]) are not a majority;
//! a change while another is in progress; an id or node id already used differently. Every
//! request is audited (`membership_change` line at the replica that handled it); every
//! membership entry is audited once per replica when applied (`membership` line, see
//! [`crate::storage`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use metrics::counter;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{ChangeMembers, ServerState};
use shoal_authority::Caller;
use shoal_proto::rpc::{AuthorityError, AuthorityOk, MemberInfo, MembersOp, MembersView};
use shoal_transport::certs::NodeIdentity;

use super::{wall_ms, Replica};
use crate::types::{Member, RaftId};

/// Longest `catch_up_ms` an `add` may ask for (10 minutes).
pub const MAX_CATCH_UP_MS: u64 = 600_000;

fn refused(code: &str, reason: String) -> AuthorityError {
    counter!("shoal_authority_refusals_total", "code" => code.to_owned()).increment(1);
    AuthorityError::Refused {
        code: code.to_owned(),
        reason,
    }
}

/// Whether `live` of `voters` replicas form a majority.
pub fn is_majority(live: usize, voters: usize) -> bool {
    voters > 0 && live * 2 > voters
}

impl Replica {
    /// Handles a `Members` request from `peer` (see the module docs).
    pub(super) async fn members(
        &self,
        peer: &NodeIdentity,
        caller: &Caller,
        op: MembersOp,
    ) -> Result<AuthorityOk, AuthorityError> {
        if !matches!(caller, Caller::Operator) {
            return Err(refused(
                "not_allowed",
                "changing or listing the replica set needs an operator certificate".into(),
            ));
        }
        if matches!(op, MembersOp::List) {
            return Ok(AuthorityOk::Members(self.members_view()));
        }
        let desc = format!("{op:?}");
        let res = match op {
            MembersOp::List => unreachable!("answered above"),
            MembersOp::Add {
                id,
                node,
                raft_addr,
                rpc_addr,
                catch_up_ms,
            } => {
                let member = Member {
                    node: node.as_str().to_owned(),
                    raft_addr,
                    rpc_addr,
                };
                self.add_member(id, member, catch_up_ms).await
            }
            MembersOp::Remove { id } => self.remove_member(id).await,
        };
        let outcome = match &res {
            Ok(()) => "committed".to_owned(),
            Err(e) => e.to_string(),
        };
        counter!("shoal_authority_membership_changes_total",
            "outcome" => if res.is_ok() { "committed" } else { "refused" })
        .increment(1);
        tracing::info!(peer = %peer.node_id, op = %desc, outcome = %outcome, "membership change");
        let view = self.members_view();
        self.audit_line(&serde_json::json!({
            "membership_change": {
                "at_ms": wall_ms(),
                "peer": peer.node_id.as_str(),
                "op": desc,
                "outcome": outcome,
                "voters": view.members.iter().filter(|m| m.voter).map(|m| m.id).collect::<Vec<_>>(),
                "learners": view.members.iter().filter(|m| !m.voter).map(|m| m.id).collect::<Vec<_>>(),
            }
        }));
        res.map(|()| AuthorityOk::Members(view))
    }

    /// The replica set as this replica sees it (replication details only on the leader).
    pub fn members_view(&self) -> MembersView {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<RaftId> = membership.voter_ids().collect();
        let leading = m.state == ServerState::Leader;
        let members = membership
            .nodes()
            .map(|(id, n)| {
                let me = *id == self.cfg.id;
                MemberInfo {
                    id: *id,
                    node: n.node.clone(),
                    raft_addr: n.raft_addr.clone(),
                    rpc_addr: n.rpc_addr.clone(),
                    voter: voters.contains(id),
                    matched_index: if me {
                        m.last_log_index
                    } else {
                        m.replication
                            .as_ref()
                            .and_then(|r| r.get(id).copied().flatten())
                            .map(|l| l.index)
                    },
                    last_heard_ms: match (leading, me) {
                        (_, true) => Some(0),
                        (false, false) => None,
                        (true, false) => self
                            .raft_rpc
                            .last_heard(&n.node)
                            .map(|d| d.as_millis() as u64),
                    },
                }
            })
            .collect();
        MembersView {
            answered_by: self.cfg.id,
            leader: m.current_leader,
            config_index: m.membership_config.log_id().map(|l| l.index),
            joint: membership.get_joint_config().len() > 1,
            members,
        }
    }

    /// Leader only; `Err(NotLeader)` otherwise, `Err(NoQuorum)` when the leader has not heard
    /// from a quorum recently.
    fn check_leading(&self) -> Result<openraft::RaftMetrics<RaftId, Member>, AuthorityError> {
        let m = self.raft.metrics().borrow().clone();
        if m.state != ServerState::Leader {
            return Err(AuthorityError::NotLeader {
                leader: self.leader_rpc_addr(),
            });
        }
        if m.millis_since_quorum_ack
            .is_none_or(|ms| ms > self.cfg.quorum_stale_ms)
        {
            return Err(AuthorityError::NoQuorum);
        }
        if m.membership_config.membership().get_joint_config().len() > 1 {
            return Err(refused(
                "change_in_progress",
                "a membership change is in progress (joint configuration); retry when \
                 `members list` shows it finished"
                    .into(),
            ));
        }
        Ok(m)
    }

    /// Live replicas among `voters`: this replica, and every other heard from within
    /// `quorum_stale_ms`. Returns (live, not live by node name).
    fn live_among(
        &self,
        voters: &BTreeSet<RaftId>,
        nodes: &BTreeMap<RaftId, Member>,
    ) -> (usize, Vec<String>) {
        let stale = Duration::from_millis(self.cfg.quorum_stale_ms);
        let mut live = 0;
        let mut dead = Vec::new();
        for id in voters {
            let ok = *id == self.cfg.id
                || nodes
                    .get(id)
                    .and_then(|n| self.raft_rpc.last_heard(&n.node))
                    .is_some_and(|d| d <= stale);
            if ok {
                live += 1;
            } else {
                dead.push(format!(
                    "{id} ({})",
                    nodes.get(id).map_or("?", |n| n.node.as_str())
                ));
            }
        }
        (live, dead)
    }

    fn check_quorum_after(
        &self,
        voters: &BTreeSet<RaftId>,
        nodes: &BTreeMap<RaftId, Member>,
        what: &str,
    ) -> Result<(), AuthorityError> {
        let (live, dead) = self.live_among(voters, nodes);
        if is_majority(live, voters.len()) {
            return Ok(());
        }
        Err(refused(
            "would_lose_quorum",
            format!(
                "{what} would leave voters {voters:?} with {live} live of {} (a majority needs {}); \
                 not live within quorum_stale_ms ({} ms): {}. Bring them back first",
                voters.len(),
                voters.len() / 2 + 1,
                self.cfg.quorum_stale_ms,
                dead.join(", ")
            ),
        ))
    }

    async fn add_member(
        &self,
        id: RaftId,
        member: Member,
        catch_up_ms: u64,
    ) -> Result<(), AuthorityError> {
        if id == 0 {
            return Err(AuthorityError::Invalid(
                "members add: id 0 is reserved".into(),
            ));
        }
        if catch_up_ms == 0 || catch_up_ms > MAX_CATCH_UP_MS {
            return Err(AuthorityError::Invalid(format!(
                "members add: catch_up_ms must be 1..={MAX_CATCH_UP_MS}"
            )));
        }
        for (what, a) in [
            ("raft_addr", &member.raft_addr),
            ("rpc_addr", &member.rpc_addr),
        ] {
            crate::config::check_host_port(what, a)
                .map_err(|e| AuthorityError::Invalid(format!("members add: {e}")))?;
        }
        let m = self.check_leading()?;
        let membership = m.membership_config.membership();
        let nodes: BTreeMap<RaftId, Member> =
            membership.nodes().map(|(i, n)| (*i, n.clone())).collect();
        let mut voters: BTreeSet<RaftId> = membership.voter_ids().collect();
        if let Some((other, _)) = nodes
            .iter()
            .find(|(i, n)| **i != id && n.node == member.node)
        {
            return Err(refused(
                "member_exists",
                format!("node {} is already member {other}", member.node),
            ));
        }
        match nodes.get(&id) {
            Some(n) if n != &member => {
                return Err(refused(
                    "member_exists",
                    format!("id {id} is already {n}; remove it first or use another id"),
                ))
            }
            Some(_) if voters.contains(&id) => return Ok(()), // already done: idempotent
            _ => {}
        }
        // 1. Learner: receives the log (or a snapshot) and has no vote; wait until caught up.
        let deadline = Duration::from_millis(catch_up_ms);
        let learner_entry =
            match tokio::time::timeout(deadline, self.raft.add_learner(id, member.clone(), true))
                .await
            {
                Err(_) => {
                    return Err(refused(
                        "catch_up_timeout",
                        format!(
                            "learner {id} ({member}) did not catch up within {catch_up_ms} ms; it \
                         stays a learner (no vote, quorum unchanged): check that it runs and is \
                         reachable, then retry `members add`, or `members remove {id}`"
                        ),
                    ))
                }
                Ok(Err(e)) => return Err(self.map_change_error(e)),
                Ok(Ok(resp)) => resp.log_id.index,
            };
        // openraft's blocking add counts a learner within `replication_lag_threshold` (5,000
        // entries by default) of the leader as caught up, even one that never answered. Wait
        // (within the same deadline) until it holds the learner entry itself and has answered
        // recently, so it can vote at once and the liveness check below judges it fairly.
        let started = tokio::time::Instant::now();
        let stale = Duration::from_millis(self.cfg.quorum_stale_ms);
        let mut metrics = self.raft.metrics();
        loop {
            let matched = metrics
                .borrow()
                .replication
                .as_ref()
                .and_then(|r| r.get(&id).copied().flatten())
                .map(|l| l.index);
            let heard = self
                .raft_rpc
                .last_heard(&member.node)
                .is_some_and(|d| d <= stale);
            if heard && matched.is_some_and(|i| i >= learner_entry) {
                break;
            }
            if started.elapsed() >= deadline {
                return Err(refused(
                    "catch_up_timeout",
                    format!(
                        "learner {id} ({member}) holds index {matched:?} of {learner_entry} after \
                         {catch_up_ms} ms; it stays a learner (no vote, quorum unchanged): check \
                         that it runs and is reachable, then retry `members add`, or \
                         `members remove {id}`"
                    ),
                ));
            }
            // Woken by replication progress, at the latest every heartbeat.
            let _ = tokio::time::timeout(
                Duration::from_millis(self.cfg.heartbeat_ms),
                metrics.changed(),
            )
            .await;
        }
        // 2. Voter, through joint consensus.
        voters.insert(id);
        let mut nodes = nodes;
        nodes.insert(id, member);
        self.check_quorum_after(&voters, &nodes, &format!("adding voter {id}"))?;
        self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
            .await
    }

    async fn remove_member(&self, id: RaftId) -> Result<(), AuthorityError> {
        let m = self.check_leading()?;
        let membership = m.membership_config.membership();
        let nodes: BTreeMap<RaftId, Member> =
            membership.nodes().map(|(i, n)| (*i, n.clone())).collect();
        let voters: BTreeSet<RaftId> = membership.voter_ids().collect();
        if !nodes.contains_key(&id) {
            return Err(refused(
                "unknown_member",
                format!("{id} is neither a voter nor a learner"),
            ));
        }
        if !voters.contains(&id) {
            return self
                .change(ChangeMembers::RemoveNodes(BTreeSet::from([id])))
                .await;
        }
        let mut rest = voters.clone();
        rest.remove(&id);
        if rest.is_empty() {
            return Err(refused(
                "last_voter",
                format!("{id} is the last voter; a region needs at least one"),
            ));
        }
        self.check_quorum_after(&rest, &nodes, &format!("removing voter {id}"))?;
        self.change(ChangeMembers::RemoveVoters(BTreeSet::from([id])))
            .await
    }

    /// Proposes a change (joint, then final) and waits for it, bounded by
    /// 4 x `write_timeout_ms`.
    async fn change(&self, change: ChangeMembers<RaftId, Member>) -> Result<(), AuthorityError> {
        let bound = Duration::from_millis(self.cfg.write_timeout_ms * 4);
        match tokio::time::timeout(bound, self.raft.change_membership(change, false)).await {
            Err(_) => Err(refused(
                "change_timeout",
                format!(
                    "the membership change did not commit within {} ms; it may still \
                     complete: check `members list`",
                    bound.as_millis()
                ),
            )),
            Ok(Err(e)) => Err(self.map_change_error(e)),
            Ok(Ok(_)) => Ok(()),
        }
    }

    fn map_change_error(
        &self,
        e: RaftError<RaftId, ClientWriteError<RaftId, Member>>,
    ) -> AuthorityError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                AuthorityError::NotLeader {
                    leader: f.leader_node.map(|n| n.rpc_addr),
                }
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
                let code = match &c {
                    ChangeMembershipError::InProgress(_) => "change_in_progress",
                    ChangeMembershipError::EmptyMembership(_) => "last_voter",
                    ChangeMembershipError::LearnerNotFound(_) => "unknown_member",
                };
                refused(code, c.to_string())
            }
            RaftError::Fatal(f) => {
                tracing::error!(error = %f, "raft fatal during a membership change");
                AuthorityError::NoQuorum
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_majority;

    #[test]
    fn majority_needs_more_than_half() {
        assert!(!is_majority(0, 0));
        assert!(is_majority(1, 1));
        assert!(!is_majority(1, 2));
        assert!(is_majority(2, 3));
        assert!(!is_majority(2, 4));
        assert!(is_majority(3, 5));
        assert!(!is_majority(2, 5));
    }
}
