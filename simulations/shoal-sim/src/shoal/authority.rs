//! The region authority model: the shared `shoal-authority` rules, a log index standing in
//! for Raft's, and the outage windows.

use super::*;

/// One region's authority: the shared `shoal-authority` rules (the same state machine the
/// replicated authority runs under Raft), a log index standing in for Raft's, and the key.
pub(super) struct RegionAuthority {
    pub(super) key: SigningKey,
    pub(super) state: AuthorityState,
    pub(super) log_index: u64,
}

impl ShoalHarness {
    /// Runs one write through the region's authority rules, as the leader would after a Raft
    /// commit. `Starting` registers (a new generation = the log index); anything else is a
    /// transition of the instance's current generation. On success the instance's ground truth
    /// follows the signed record; a refusal is counted and changes nothing.
    pub(super) fn commit(
        &mut self,
        idx: usize,
        to: LifecycleState,
        reason: TransitionReason,
        now_ms: u64,
    ) -> Option<SignedLifecycle> {
        let inst = &self.instances[idx];
        let caller = Caller::Node(node_id(inst.owner));
        if to == LifecycleState::Starting {
            self.bind_node_key(inst.region as usize, inst.owner, now_ms);
        }
        let inst = &self.instances[idx];
        let cmd = if to == LifecycleState::Starting {
            AuthorityCommand::Register {
                caller,
                key: inst.key.clone(),
                instance: inst.id.clone(),
                on_node: None,
                endpoint: inst.spec.clone(),
                lease_ms: 300_000,
            }
        } else {
            AuthorityCommand::Transition {
                caller,
                key: inst.key.clone(),
                instance: inst.id.clone(),
                generation: inst.generation,
                to,
                reason,
            }
        };
        let a = &mut self.authorities[inst.region as usize];
        a.log_index += 1;
        let ctx = ApplyContext {
            log_index: a.log_index,
            committed_at_ms: now_ms,
            signing_key: &a.key,
        };
        match a.state.apply(cmd, ctx) {
            Ok(mut records) if records.len() == 1 => {
                let rec = records.pop().expect("one record");
                let inst = &mut self.instances[idx];
                inst.generation = rec.record.generation;
                inst.state = rec.record.state;
                Some(rec)
            }
            Ok(_) | Err(_) => {
                self.authority_refusals += 1;
                None
            }
        }
    }

    /// As an agent does before its first registration: binds its node key at its region's
    /// authority (ADR 0006), so every record of its instances carries the key its health
    /// verifies against. A key already bound emits nothing and costs no log entry (the real
    /// replicated authority answers that from its state without proposing).
    pub(super) fn bind_node_key(&mut self, region: usize, owner: u32, now_ms: u64) {
        let key = self.node_keys[owner as usize].verifying_key().to_bytes();
        let a = &mut self.authorities[region];
        let node = node_id(owner);
        if a.state.node_key(&node) == Some(key) {
            return;
        }
        a.log_index += 1;
        let ctx = ApplyContext {
            log_index: a.log_index,
            committed_at_ms: now_ms,
            signing_key: &a.key,
        };
        let cmd = AuthorityCommand::BindNodeKey {
            caller: Caller::Node(node),
            key,
        };
        if !matches!(a.state.apply(cmd, ctx), Ok(r) if r.is_empty()) {
            self.authority_refusals += 1;
        }
    }

    /// If `region`'s authority is down at `now_ms`, when it comes back.
    pub(super) fn in_outage(&self, region: u16, now_ms: u64) -> Option<u64> {
        let name = self.region_names[region as usize].as_str();
        self.spec
            .outages
            .iter()
            .find(|w| {
                (w.from_ms..w.to_ms).contains(&now_ms)
                    && w.region.as_deref().is_none_or(|r| r == name)
            })
            .map(|w| w.to_ms)
    }
}
