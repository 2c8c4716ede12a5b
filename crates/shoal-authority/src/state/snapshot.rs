//! The state as a Raft snapshot: encoding, and the consistency checks every decoded (possibly
//! corrupt or hostile) snapshot passes before it is installed.

use std::collections::BTreeSet;

use super::{
    AuthorityState, StateError, MAX_BINDINGS, MAX_DOWN_NODES, MAX_NODE_KEYS, MAX_POLICIES,
    MAX_REVOKED_KEYS,
};

impl AuthorityState {
    /// Encodes the whole state (postcard) as a Raft snapshot.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("the state is plain data and always serialises")
    }

    /// Decodes a snapshot and checks its invariants before handing it out, so a corrupt or
    /// hostile snapshot is never installed.
    ///
    /// # Errors
    /// [`StateError::Decode`] for bytes that are not a state, [`StateError::Invariant`] for a
    /// state that breaks one of the checks of [`AuthorityState::check_invariants`].
    pub fn decode(bytes: &[u8]) -> Result<Self, StateError> {
        let state: Self =
            postcard::from_bytes(bytes).map_err(|e| StateError::Decode(e.to_string()))?;
        state.check_invariants()?;
        Ok(state)
    }

    /// Checks the state's internal consistency: counters start at 1, every binding sits under
    /// its own key, belongs to this region, has a unique revision below the next one and a
    /// generation no newer than the last applied index; policies likewise; bounds hold.
    ///
    /// # Errors
    /// [`StateError::Invariant`] naming the first broken rule.
    pub fn check_invariants(&self) -> Result<(), StateError> {
        let fail = |what| Err(StateError::Invariant(what));
        if self.next_revision.0 == 0 || self.next_policy_revision.0 == 0 {
            return fail("revision counters start at 1");
        }
        if self.binding_count() > MAX_BINDINGS || self.down_nodes.len() > MAX_DOWN_NODES {
            return fail("bindings or down nodes over their bound");
        }
        if self.policies.len() > MAX_POLICIES || self.audit.len() > self.audit.capacity() {
            return fail("policies or audit log over their bound");
        }
        if self.node_keys.len() > MAX_NODE_KEYS {
            return fail("node keys over their bound");
        }
        for n in self.node_keys.values() {
            if (n.revoked && n.key.is_some()) || n.revoked_keys.len() > MAX_REVOKED_KEYS {
                return fail("a revoked node with a key, or too many revoked keys");
            }
        }
        if self
            .down_carried_ms
            .keys()
            .any(|n| !self.down_nodes.contains_key(n))
        {
            return fail("carried downtime for a node that is not down");
        }
        let mut revisions = BTreeSet::new();
        for (key, instance, b) in self.bindings() {
            let rec = &b.current.record;
            if &rec.key != key || &rec.instance != instance {
                return fail("binding filed under another key");
            }
            if rec.region != self.region {
                return fail("binding of another region");
            }
            if rec.revision >= self.next_revision || !revisions.insert(rec.revision) {
                return fail("binding revision not below next or not unique");
            }
            if rec.generation > self.generation_at(self.last_applied_index) {
                return fail("generation newer than the last applied index");
            }
        }
        for (key, p) in &self.policies {
            if &p.record.key != key || p.record.region != self.region {
                return fail("policy filed under another key or region");
            }
            if p.record.revision >= self.next_policy_revision {
                return fail("policy revision not below next");
            }
        }
        Ok(())
    }
}
