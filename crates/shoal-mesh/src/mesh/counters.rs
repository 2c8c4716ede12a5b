//! [`MeshCounters`]: plain counters of one core for metrics, and [`Flow`] (messages and bytes
//! of one stream message kind). Overflow of every bounded queue is counted here
//! (`docs/invariants.md`, invariant 8).

use std::collections::BTreeMap;

use shoal_proto::envelope::MessageKind;

/// Messages and bytes of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flow {
    /// Messages.
    pub messages: u64,
    /// Bytes, envelope included.
    pub bytes: u64,
}

/// Plain counters for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeshCounters {
    /// Stream messages received, by [`MessageKind`] as index.
    pub stream_in: [Flow; 12],
    /// Stream messages sent, by kind.
    pub stream_out: [Flow; 12],
    /// Stream messages rejected (decode, limits), by reason label.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Anti-entropy rounds started.
    pub anti_entropy_rounds: u64,
    /// Membership lists sent in push-pull (openers and answers).
    pub push_pull_lists_sent: u64,
    /// Push-pull openers not sent because of
    /// [`MeshConfig::push_pull_min_interval_ms`](super::MeshConfig::push_pull_min_interval_ms).
    pub push_pull_limited: u64,
    /// Deltas sent / received.
    pub deltas_sent: u64,
    /// Deltas applied.
    pub deltas_received: u64,
    /// Revision or sequence gaps observed open after an input (counted once per opening).
    pub gaps_detected: u64,
    /// Grafts sent.
    pub grafts_sent: u64,
    /// Prunes sent.
    pub prunes_sent: u64,
    /// Full snapshots sent.
    pub snapshots_sent: u64,
    /// Full snapshots installed.
    pub snapshots_installed: u64,
    /// Full snapshots refused (corrupt, bad signature).
    pub snapshots_refused: u64,
    /// Records dropped because the outbox was full.
    pub outbox_overflow: u64,
    /// Transmits dropped because the queue was full.
    pub transmit_overflow: u64,
    /// Events dropped because the queue was full.
    pub event_overflow: u64,
    /// Messages that could not be encoded within the size limit.
    pub oversize: u64,
    /// Commands refused.
    pub refused: u64,
    /// Idle timers (a gossip round with nothing to send, an IHAVE tick with nothing to
    /// announce, the indirect stage of an acked probe, a reconnect tick with nothing due)
    /// handled without firing or waking the driver; deadline-driven cores only
    /// ([`Mesh::poll_timeout`](crate::Mesh::poll_timeout)).
    pub idle_timers_skipped: u64,
    /// Tombstones collected.
    pub tombstones_collected: u64,
}

// `stream_in`/`stream_out` are indexed by `MessageKind as usize`; the largest kind must fit.
const _: () = assert!((MessageKind::AuthorityReply as usize) < 12);
