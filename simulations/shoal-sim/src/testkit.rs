//! A toy node that exercises the engine end to end until the mesh adapter exists.
//!
//! [`PingNode`] pings a random peer every `interval_ms` (datagram), answers pings with pongs,
//! records round-trip times, and every `stream_every` ticks sends a sequenced stream message to
//! a random peer; receivers check per-sender order.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use rand::{RngExt, SeedableRng};

use crate::node::{Channel, NodeCtx, SimNode, Transmit};
use crate::report::{Check, Distribution, Report};
use crate::rng::SimRng;
use crate::runner::Harness;
use crate::scenario::ToySpec;
use crate::topology::Topology;
use crate::world::World;

/// RTT samples kept per node; more are counted, not stored (bounded memory).
pub const MAX_RTT_SAMPLES: usize = 4096;

const PING: u8 = 1;
const PONG: u8 = 2;
const SEQ: u8 = 3;

/// [`PingNode`] parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PingConfig {
    /// Ping period, ms.
    pub interval_ms: u64,
    /// Ping datagram size (>= 9).
    pub ping_bytes: usize,
    /// Every n-th tick also sends a stream message (0 = never).
    pub stream_every: u32,
    /// Stream message size (>= 9).
    pub stream_bytes: usize,
}

impl Default for PingConfig {
    fn default() -> Self {
        Self::from(&ToySpec::default())
    }
}

impl From<&ToySpec> for PingConfig {
    fn from(t: &ToySpec) -> Self {
        Self {
            interval_ms: t.ping_interval_ms,
            ping_bytes: t.ping_bytes as usize,
            stream_every: t.stream_every,
            stream_bytes: t.stream_bytes as usize,
        }
    }
}

/// The toy node.
#[derive(Debug)]
pub struct PingNode {
    me: u32,
    epoch: u32,
    topo: Arc<Topology>,
    rng: SimRng,
    cfg: PingConfig,
    out: VecDeque<Transmit>,
    timer: Option<(u64, u64)>,
    tick: u64,
    rtts_ms: Vec<u64>,
    rtt_overflow: u64,
    pings_sent: u64,
    stream_seq: u64,
    stream_last: BTreeMap<u32, u64>,
    stream_received: u64,
    stream_out_of_order: u64,
}

impl PingNode {
    /// A node for `ctx`; arms its first tick at a random offset within one interval.
    pub fn new(ctx: &NodeCtx, cfg: PingConfig) -> Self {
        let mut rng = SimRng::seed_from_u64(ctx.seed);
        let first = ctx.now_ms + rng.random_range(0..cfg.interval_ms.max(1));
        Self {
            me: ctx.index,
            epoch: ctx.epoch,
            topo: Arc::clone(&ctx.topology),
            rng,
            cfg,
            out: VecDeque::new(),
            timer: Some((first, 0)),
            tick: 0,
            rtts_ms: Vec::new(),
            rtt_overflow: 0,
            pings_sent: 0,
            stream_seq: 0,
            stream_last: BTreeMap::new(),
            stream_received: 0,
            stream_out_of_order: 0,
        }
    }

    /// Pings sent so far.
    pub fn pings_sent(&self) -> u64 {
        self.pings_sent
    }

    /// Stored RTT samples, ms.
    pub fn rtts_ms(&self) -> &[u64] {
        &self.rtts_ms
    }

    /// Stream messages received / received out of per-sender order.
    pub fn stream_stats(&self) -> (u64, u64) {
        (self.stream_received, self.stream_out_of_order)
    }

    /// Queues a datagram of `len` bytes to `to` (tests use this to probe the size limit).
    pub fn send_raw(&mut self, to: SocketAddr, channel: Channel, len: usize) {
        self.out.push_back(Transmit {
            to,
            channel,
            bytes: vec![0; len],
        });
    }

    fn random_peer(&mut self) -> SocketAddr {
        let n = self.topo.len() as u32;
        let mut p = self.rng.random_range(0..n.max(2) - 1);
        if p >= self.me {
            p += 1;
        }
        self.topo.node(p.min(n - 1)).addr
    }

    fn msg(kind: u8, value: u64, len: usize) -> Vec<u8> {
        let mut b = Vec::with_capacity(len.max(9));
        b.push(kind);
        b.extend_from_slice(&value.to_le_bytes());
        b.resize(len.max(9), 0);
        b
    }

    fn value(bytes: &[u8]) -> Option<u64> {
        Some(u64::from_le_bytes(bytes.get(1..9)?.try_into().ok()?))
    }
}

impl SimNode for PingNode {
    type Note = ();

    fn handle_datagram(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]) {
        let Some(v) = Self::value(bytes) else { return };
        match bytes[0] {
            PING => self.out.push_back(Transmit {
                to: from,
                channel: Channel::Datagram,
                bytes: Self::msg(PONG, v, 9),
            }),
            PONG if self.rtts_ms.len() < MAX_RTT_SAMPLES => {
                self.rtts_ms.push(now_ms.saturating_sub(v))
            }
            PONG => self.rtt_overflow += 1,
            _ => {}
        }
    }

    fn handle_stream_message(&mut self, _now_ms: u64, from: SocketAddr, bytes: &[u8]) {
        let (Some(seq), Some(sender)) = (Self::value(bytes), self.topo.index_of(from)) else {
            return;
        };
        self.stream_received += 1;
        let last = self.stream_last.entry(sender).or_insert(0);
        if seq <= *last {
            self.stream_out_of_order += 1;
        }
        *last = seq;
    }

    fn handle_timer(&mut self, now_ms: u64, token: u64) {
        if token != self.tick {
            return;
        }
        self.tick += 1;
        let to = self.random_peer();
        self.out.push_back(Transmit {
            to,
            channel: Channel::Datagram,
            bytes: Self::msg(PING, now_ms, self.cfg.ping_bytes),
        });
        self.pings_sent += 1;
        if self.cfg.stream_every > 0 && self.tick.is_multiple_of(u64::from(self.cfg.stream_every)) {
            self.stream_seq += 1;
            let to = self.random_peer();
            // A restarted sender starts a new sequence; order is per (sender, boot).
            let seq = (u64::from(self.epoch) << 40) | self.stream_seq;
            let bytes = Self::msg(SEQ, seq, self.cfg.stream_bytes);
            self.out.push_back(Transmit {
                to,
                channel: Channel::Stream,
                bytes,
            });
        }
        self.timer = Some((now_ms + self.cfg.interval_ms, self.tick));
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }

    fn poll_timer(&mut self) -> Option<(u64, u64)> {
        self.timer.take()
    }
}

/// Runs [`PingNode`]s under the scenario runner and reports RTTs and stream order.
#[derive(Debug, Default)]
pub struct PingHarness {
    /// Node parameters.
    pub cfg: PingConfig,
}

impl Harness for PingHarness {
    type Node = PingNode;

    fn make_node(&mut self, ctx: &NodeCtx) -> PingNode {
        PingNode::new(ctx, self.cfg)
    }

    fn finish(
        &mut self,
        world: &World<PingNode>,
        report: &mut Report,
        samples: &mut BTreeMap<String, Vec<u64>>,
    ) {
        let mut rtts = Vec::new();
        let (mut received, mut out_of_order) = (0, 0);
        for (_, node) in world.nodes() {
            let Some(n) = node else { continue };
            rtts.extend_from_slice(n.rtts_ms());
            let (r, o) = n.stream_stats();
            received += r;
            out_of_order += o;
        }
        report
            .distributions
            .insert("ping_rtt_ms".into(), Distribution::of(&rtts));
        report.checks.insert(
            "stream_order_per_pair".into(),
            Check {
                ok: out_of_order == 0,
                detail: format!("{received} stream messages, {out_of_order} out of order"),
            },
        );
        samples.insert("ping_rtt_ms".into(), rtts);
    }
}
