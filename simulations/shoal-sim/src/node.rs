//! The interface the engine drives: a sans-IO node.
//!
//! Modelled on quinn-proto and foca: the engine feeds inputs (`handle_*`, each carrying the
//! node's local `now_ms`) and after every input drains outputs, first [`SimNode::poll_transmit`]
//! until it returns `None`, then [`SimNode::poll_timer`] until it returns `None`.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::topology::Topology;

/// How bytes travel between two nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    /// Unreliable, unordered, size-limited (QUIC datagram). Subject to loss, duplication,
    /// reordering (via jitter) and the max datagram size.
    Datagram,
    /// Reliable and ordered per (from, to) pair (a QUIC stream). Not lost or duplicated, but
    /// dropped across a cut link, to a crashed node, or when either end restarted while the
    /// message was in flight (the connection was reset).
    Stream,
}

/// One message a node wants sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Destination address; must be one of the topology's synthetic addresses, anything else
    /// is dropped and counted as `unknown_addr`.
    pub to: SocketAddr,
    /// Which channel carries it.
    pub channel: Channel,
    /// The payload. Moved into the engine, never copied except for a duplicated datagram.
    pub bytes: Vec<u8>,
}

/// A sans-IO node the engine can drive.
///
/// Times are the node's local clock in milliseconds (virtual time plus this node's clock skew).
/// Timer tokens are opaque to the engine; a node must treat a token it no longer expects as a
/// no-op (timers are never cancelled by the engine).
///
/// Nodes are `Send` because the engine may handle several nodes' events at once on worker
/// threads ([`crate::World::set_threads`]). A node that reports to state shared with other
/// nodes (an observer) keeps what it has to say as [`SimNode::Note`]s: the engine hands them
/// back in the order one-event-at-a-time handling would have produced them
/// ([`SimNode::apply_note`]), so shared state sees the same sequence either way.
pub trait SimNode: Send {
    /// What the node reports to shared state after an input (`()` for none).
    type Note: Send;
    /// A datagram from `from` arrived.
    fn handle_datagram(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]);
    /// A stream message from `from` arrived (in order for that sender).
    fn handle_stream_message(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]);
    /// A timer the node asked for via [`SimNode::poll_timer`] fired.
    fn handle_timer(&mut self, now_ms: u64, token: u64);
    /// Next message to send, if any.
    fn poll_transmit(&mut self) -> Option<Transmit>;
    /// Next timer to arm: (deadline in local ms, token). A deadline in the past fires now.
    fn poll_timer(&mut self) -> Option<(u64, u64)>;

    /// Applies the notes of the input just handled to shared state at once (one event at a
    /// time). Called after every input, after the outputs are drained.
    fn publish_notes(&mut self) {}

    /// Moves the notes of the input just handled into `out` instead (a worker thread).
    fn take_notes(&mut self, _out: &mut Vec<Self::Note>) {}

    /// Applies one note taken by [`SimNode::take_notes`] (back on the engine's thread, in
    /// the sequential order).
    fn apply_note(&mut self, _note: Self::Note) {}
}

/// Everything a node factory needs to build a node for slot `index`.
#[derive(Clone, Debug)]
pub struct NodeCtx {
    /// Node index in the topology (0-based, region-major).
    pub index: u32,
    /// Boot epoch: 0 at first start, +1 on every restart. A mesh adapter maps this to the
    /// node's boot generation.
    pub epoch: u32,
    /// The node's synthetic address.
    pub addr: SocketAddr,
    /// Region index into [`Topology::region_names`].
    pub region: u16,
    /// Global zone index into [`Topology::zone_names`].
    pub zone: u16,
    /// Seed for the node's own RNG (from [`crate::rng::RngTree::node_seed`]).
    pub seed: u64,
    /// Virtual time of the (re)start in ms (global clock, no skew).
    pub now_ms: u64,
    /// The whole topology, shared.
    pub topology: Arc<Topology>,
}
