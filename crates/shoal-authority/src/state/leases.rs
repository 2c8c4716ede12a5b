//! Down nodes and lease clocks: a node reported down starts the lease clock of its
//! instances; checkpoints carry downtime across leader changes (docs/adr/0008-lease-checkpoints.md);
//! a takeover credits what the previous leader could not record.

use std::collections::BTreeSet;

use shoal_proto::{LifecycleState, NodeId};

use super::{AuthorityState, MAX_DOWN_NODES};
use crate::command::LeaseCredit;
use crate::refusal::Refusal;

impl AuthorityState {
    pub(super) fn node_down(&mut self, node: NodeId, at_ms: u64) -> Result<(), Refusal> {
        if self.down_nodes.contains_key(&node) {
            // The first report started the clock; repeats must not restart or rewind it.
            return Ok(());
        }
        if self.down_nodes.len() >= MAX_DOWN_NODES {
            return Err(Refusal::CapacityExhausted {
                limit: MAX_DOWN_NODES as u64,
            });
        }
        self.down_nodes.insert(node, at_ms.max(self.lease_floor_ms));
        Ok(())
    }

    /// Drops down nodes that own no live record: nothing is left for their lease to expire.
    pub(super) fn forget_idle_down_nodes(&mut self) {
        if self.down_nodes.is_empty() {
            return;
        }
        let busy: BTreeSet<&NodeId> = self
            .bindings()
            .filter(|(_, _, b)| b.state() != LifecycleState::Expired)
            .map(|(_, _, b)| b.node())
            .collect();
        let idle: Vec<NodeId> = self
            .down_nodes
            .keys()
            .filter(|n| !busy.contains(n))
            .cloned()
            .collect();
        for n in idle {
            self.down_nodes.remove(&n);
            self.down_carried_ms.remove(&n);
        }
    }

    /// Records every down node's downtime at `now_ms` (this leader's clock) and restarts its
    /// lease clock there: a later leader resumes from it. Bumps the checkpoint counter when
    /// anything is down.
    pub(super) fn checkpoint_leases(&mut self, now_ms: u64) {
        if self.down_nodes.is_empty() {
            return;
        }
        for (node, since) in &mut self.down_nodes {
            let carried = self.down_carried_ms.entry(node.clone()).or_insert(0);
            *carried = carried.saturating_add(now_ms.saturating_sub(*since));
            *since = (*since).max(now_ms);
        }
        self.lease_checkpoint += 1;
    }

    /// Rebases lease clocks onto the new leader's clock (see the type docs for why), keeping
    /// checkpointed downtime and adding `credit` when it refers to the latest checkpoint.
    pub(super) fn take_over(&mut self, now_ms: u64, credit: Option<LeaseCredit>) {
        let credit_ms = credit
            .filter(|c| c.checkpoint == self.lease_checkpoint)
            .map_or(0, |c| c.elapsed_ms);
        for (node, since) in &mut self.down_nodes {
            // Only nodes the latest checkpoint counted get the credit: one reported down after
            // it has been down for less than `credit_ms`, by an unknown amount.
            let carried = match self.down_carried_ms.get(node) {
                Some(c) => c.saturating_add(credit_ms),
                None => 0,
            };
            self.down_carried_ms.insert(node.clone(), carried);
            *since = now_ms;
        }
        self.lease_floor_ms = now_ms;
        self.lease_checkpoint += 1;
    }
}
