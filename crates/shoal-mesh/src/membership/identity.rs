//! [`MemberId`], foca's [`Identity`]: (node id, address, boot generation). A restart bumps the
//! boot generation, so the restarted node is a new member whose identity supersedes the old one
//! (foca's generation-aware rejoin, `Identity::renew`).

use std::net::SocketAddr;

use foca::Identity;
use serde::{Deserialize, Serialize};
use shoal_proto::{Generation, NodeId};

/// foca identity: (node id, address, boot generation).
///
/// [`Identity::renew`] bumps `boot`; on an address conflict the higher boot generation wins
/// (ties broken by node id), so a restarted node is a new member and its old identity is declared
/// down, never kept beside it. Agents should persist `boot` and start every process with a
/// higher value than the last one they used.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MemberId {
    /// Stable node identifier (one agent per machine).
    pub node: NodeId,
    /// Address other members send SWIM datagrams to.
    pub addr: SocketAddr,
    /// Boot generation: bumped on every process start and on every automatic rejoin.
    pub boot: Generation,
}

impl MemberId {
    /// The identity used to announce to a seed we only know by address. foca accepts an
    /// `Announce` whose destination has the receiver's address, whatever the rest says.
    pub(super) fn placeholder(addr: SocketAddr) -> Self {
        Self {
            node: NodeId::new("seed").expect("`seed` is a valid node id"),
            addr,
            boot: Generation(0),
        }
    }

    /// `true` when `self` should replace `other` for the same node or address.
    pub(super) fn supersedes(&self, other: &Self) -> bool {
        (self.boot, &self.node, self.addr) > (other.boot, &other.node, other.addr)
    }
}

impl Identity for MemberId {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        (self.boot.0 < u64::MAX).then(|| Self {
            node: self.node.clone(),
            addr: self.addr,
            boot: self.boot.next(),
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.supersedes(adversary)
    }
}
