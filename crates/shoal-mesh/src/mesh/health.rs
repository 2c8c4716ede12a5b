//! This node's own health chain: health reports for instances the catalog binds to this node
//! (and to the reported generation), signed with the node key and numbered
//! `(process boot generation, seq)` so every agent can order them and detect gaps. An agent may
//! only sign health for its own instances (`docs/invariants.md`, invariant 4).

use std::sync::Arc;

use shoal_catalog::{MergeOutcome, Verifier};
use shoal_proto::{
    Generation, HealthRecord, HealthSeq, HealthStatus, InstanceId, ServiceKey, TransitionReason,
};

use super::{Mesh, Refusal};

impl<V: Verifier> Mesh<V> {
    pub(super) fn report_health(
        &mut self,
        key: ServiceKey,
        instance: InstanceId,
        generation: Generation,
        status: HealthStatus,
        reason: TransitionReason,
    ) -> Result<(), Refusal> {
        let me = self.membership.identity().node.clone();
        let owned = self.catalog.entry(&key, &instance).is_some_and(|e| {
            let r = &e.lifecycle().record;
            r.owner == me && r.generation == generation
        });
        if !owned {
            self.counters.refused += 1;
            return Err(Refusal::NotOwnInstance { key, instance });
        }
        self.health_seq += 1;
        let signed = Arc::new(self.node_key.sign_health(HealthRecord {
            key,
            instance,
            generation,
            owner: me,
            owner_boot: self.health_boot,
            seq: HealthSeq(self.health_seq),
            status,
            reason,
        }));
        match self.catalog.apply_health(signed.clone(), &self.verifier) {
            MergeOutcome::Applied => {
                self.announce_now |= signed.record.status == HealthStatus::Failing;
                self.on_health_applied(signed, None);
                Ok(())
            }
            other => {
                self.counters.refused += 1;
                Err(Refusal::Health {
                    instance: signed.record.instance.clone(),
                    outcome: other.as_label(),
                })
            }
        }
    }
}
