//! Engine side of the membership fault menu (issue 15): nodes that move to a new address, and
//! links with a smaller datagram limit than the network's. Both are empty in every scenario
//! that does not use them, and the hot path checks that first (`is_empty`), so they cost
//! nothing there.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::{Core, World};
use crate::node::SimNode;
use crate::topology::SIM_PORT;

/// Where moved nodes live now, and per-link datagram limits.
#[derive(Debug, Default)]
pub(super) struct Relocations {
    /// Slot -> its current address, for slots that moved.
    addr_of: HashMap<u32, SocketAddr>,
    /// Current address -> slot, for slots that moved.
    slot_at: HashMap<SocketAddr, u32>,
    /// Addresses handed out so far (the next one is derived from it).
    handed_out: u32,
    /// (from, to) -> datagram limit, bytes.
    link_max_datagram: HashMap<(u32, u32), usize>,
}

impl Core {
    /// The address node `idx` is reachable at now.
    pub(super) fn addr_of(&self, idx: u32) -> SocketAddr {
        if self.moved.addr_of.is_empty() {
            return self.topo.node(idx).addr;
        }
        self.moved
            .addr_of
            .get(&idx)
            .copied()
            .unwrap_or_else(|| self.topo.node(idx).addr)
    }

    /// The node at `addr` now, if any: a moved node at its new address; nobody at the
    /// address a node moved away from.
    pub(super) fn route(&self, addr: SocketAddr) -> Option<u32> {
        if self.moved.addr_of.is_empty() {
            return self.topo.index_of(addr);
        }
        if let Some(&i) = self.moved.slot_at.get(&addr) {
            return Some(i);
        }
        self.topo
            .index_of(addr)
            .filter(|i| !self.moved.addr_of.contains_key(i))
    }

    /// Whether a datagram of `len` bytes exceeds the limit of link `from` -> `to`.
    pub(super) fn over_link_limit(&self, from: u32, to: u32, len: usize) -> bool {
        !self.moved.link_max_datagram.is_empty()
            && self
                .moved
                .link_max_datagram
                .get(&(from, to))
                .is_some_and(|&max| len > max)
    }
}

impl<N: SimNode> World<N> {
    /// Gives node `idx` (which must not be running: crash it first) a new address no node
    /// had before, in `10.255.0.0/16` (outside the topology's `127.x` scheme). Datagrams to
    /// its old address are dropped from now on (`unknown_addr`). Returns the new address.
    pub fn relocate(&mut self, idx: u32) -> SocketAddr {
        assert!(!self.core.alive[idx as usize], "node {idx} is running");
        let m = &mut self.core.moved;
        m.handed_out += 1;
        let n = m.handed_out;
        let addr = SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(10, 255, (n >> 8) as u8, n as u8)),
            SIM_PORT,
        );
        if let Some(old) = m.addr_of.insert(idx, addr) {
            m.slot_at.remove(&old);
        }
        m.slot_at.insert(addr, idx);
        addr
    }

    /// The address node `idx` is reachable at now (its topology address unless it moved).
    pub fn addr_of(&self, idx: u32) -> SocketAddr {
        self.core.addr_of(idx)
    }

    /// Datagrams larger than `max_bytes` are dropped (`oversize`) on link `from` -> `to`.
    pub fn set_link_max_datagram(&mut self, from: u32, to: u32, max_bytes: usize) {
        self.core
            .moved
            .link_max_datagram
            .insert((from, to), max_bytes);
    }

    /// Removes every per-link datagram limit.
    pub fn clear_link_max_datagram(&mut self) {
        self.core.moved.link_max_datagram.clear();
    }
}
