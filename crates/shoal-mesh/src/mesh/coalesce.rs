//! Coalescing: records applied here wait in a bounded outbox and leave as eager pushes when the
//! flush window closes ([`MeshConfig::coalesce_ms`](super::MeshConfig::coalesce_ms) for ordinary
//! changes, [`MeshConfig::urgent_coalesce_ms`](super::MeshConfig::urgent_coalesce_ms) per hop
//! for withdrawals). Batching keeps a 10,000-endpoint rollout from becoming one stream message
//! per record per link without holding a drain back. The window itself is armed in
//! `Mesh::after_input` (`mesh.rs`); the push that follows is Plumtree's eager push
//! (`plumtree.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use shoal_catalog::Verifier;
use shoal_proto::envelope::MessageKind;
use shoal_proto::{HealthStatus, LifecycleState, SignedHealth, SignedLifecycle, TransitionReason};

use super::{Mesh, MeshEvent};
use crate::messages::{RecordPush, StreamMessage, MAX_RECORDS_PER_PUSH};
use crate::record_codec;

/// [`Mesh::is_urgent_lifecycle`] given the state of the record `rec` replaces (`None`: the
/// instance was not held), e.g. from [`shoal_catalog::Catalog::apply_lifecycle_replacing`].
pub(super) fn urgent_lifecycle(rec: &SignedLifecycle, replaced: Option<LifecycleState>) -> bool {
    let r = &rec.record;
    match r.state {
        LifecycleState::Draining => true,
        LifecycleState::Expired if r.reason == TransitionReason::LeaseExpired => false,
        LifecycleState::Expired => replaced.is_none_or(|s| s == LifecycleState::Ready),
        _ => false,
    }
}

pub(super) struct Outgoing {
    lifecycle: Option<Arc<SignedLifecycle>>,
    health: Option<Arc<SignedHealth>>,
    from: Option<SocketAddr>,
}

impl<V: Verifier> Mesh<V> {
    /// Whether `rec` may withdraw an endpoint that is routable somewhere: DRAINING always;
    /// EXPIRED unless it is the lease net's (the owner node has been down for a whole lease,
    /// so derived liveness withdrew its endpoints long ago) or this catalog held the endpoint
    /// in a state that was not routable (STARTING, DRAINING: the usual DRAINING -> EXPIRED of a
    /// rollout). Only these skip the ordinary coalescing window. Call before merging `rec`.
    pub(super) fn is_urgent_lifecycle(&self, rec: &SignedLifecycle) -> bool {
        let r = &rec.record;
        // Only an authority's EXPIRED depends on what is held: look the entry up for it alone.
        let held = (r.state == LifecycleState::Expired
            && r.reason != TransitionReason::LeaseExpired)
            .then(|| self.catalog.entry(&r.key, &r.instance))
            .flatten()
            .map(|e| e.lifecycle().record.state);
        urgent_lifecycle(rec, held)
    }

    pub(super) fn on_lifecycle_applied(
        &mut self,
        rec: Arc<SignedLifecycle>,
        from: Option<SocketAddr>,
        urgent: bool,
    ) {
        self.dirty_regions.insert(rec.record.region.clone());
        self.urgent |= urgent;
        if self.config.record_events {
            self.push_event(MeshEvent::LifecycleApplied(rec.clone()));
        }
        self.enqueue(Outgoing {
            lifecycle: Some(rec),
            health: None,
            from,
        });
    }

    pub(super) fn on_health_applied(&mut self, rec: Arc<SignedHealth>, from: Option<SocketAddr>) {
        self.dirty_owners.insert(rec.record.owner.clone());
        self.urgent |= rec.record.status == HealthStatus::Failing;
        if self.config.record_events {
            self.push_event(MeshEvent::HealthApplied(rec.clone()));
        }
        self.enqueue(Outgoing {
            lifecycle: None,
            health: Some(rec),
            from,
        });
    }

    fn enqueue(&mut self, out: Outgoing) {
        if self.outbox.len() >= self.config.max_outbox_records {
            self.counters.outbox_overflow += 1;
            return;
        }
        self.outbox.push(out);
    }

    /// Eager-pushes the outbox to every eager peer (except where a record came from).
    pub(super) fn flush(&mut self, _now_ms: u64) {
        self.urgent = false;
        if self.outbox.is_empty() {
            return;
        }
        if std::mem::take(&mut self.announce_now) {
            // A withdrawal published here (by the authority or our own health report) is also
            // announced to our lazy peers at once, so a member the eager tree misses grafts
            // after `graft_timeout_ms` instead of waiting for the IHAVE tick. Only the origin
            // does this: every forwarder doing it would multiply messages by the lazy fan-out.
            self.send_ihave();
        }
        let outbox = std::mem::take(&mut self.outbox);
        let peers: Vec<SocketAddr> = self.eager.iter().copied().collect();
        // Every peer that sent us none of these records gets the same pushes: encode them once.
        let mut to_all: Option<Vec<Option<Vec<u8>>>> = None;
        for peer in peers {
            let encoded = if outbox.iter().any(|o| o.from == Some(peer)) {
                self.encode_pushes(&outbox, Some(peer))
            } else {
                to_all
                    .get_or_insert_with(|| self.encode_pushes(&outbox, None))
                    .clone()
            };
            for bytes in encoded {
                self.send_encoded(peer, MessageKind::RecordPush, bytes);
            }
        }
    }

    /// The outbox as encoded pushes of at most [`MAX_RECORDS_PER_PUSH`] records each, leaving
    /// out the records that came from `peer` (`None`: an encoding that did not fit).
    fn encode_pushes(&self, outbox: &[Outgoing], peer: Option<SocketAddr>) -> Vec<Option<Vec<u8>>> {
        let max_bytes = self.config.max_stream_message_bytes;
        let mut out = Vec::new();
        let mut push = RecordPush::default();
        for o in outbox.iter().filter(|o| peer.is_none() || o.from != peer) {
            if let Some(l) = &o.lifecycle {
                push.lifecycle.push(l.clone());
            }
            if let Some(h) = &o.health {
                push.health.push(h.clone());
            }
            if push.lifecycle.len() + push.health.len() == MAX_RECORDS_PER_PUSH {
                out.push(self.encode_push(std::mem::take(&mut push), max_bytes));
            }
        }
        if !push.lifecycle.is_empty() || !push.health.is_empty() {
            out.push(self.encode_push(push, max_bytes));
        }
        out
    }

    /// One push, encoded through the verifier's record encodings where it keeps them (the
    /// same bytes either way).
    fn encode_push(&self, push: RecordPush, max_bytes: usize) -> Option<Vec<u8>> {
        if self.verifier.caches_encodings() {
            record_codec::encode_push(&push, &self.verifier, max_bytes)
        } else {
            StreamMessage::Push(push).encode(max_bytes)
        }
    }
}
