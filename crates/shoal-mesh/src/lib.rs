//! # shoal-mesh
//!
//! One agent's protocol state as a sans-IO state machine: SWIM membership over foca
//! ([`membership`]), Plumtree record dissemination and anti-entropy ([`mesh`]), and their wire
//! messages ([`messages`]). No clock reads, no OS randomness, no sockets: the tokio agent and the
//! deterministic simulator drive the very same code.

pub mod membership;
pub mod mesh;
pub mod messages;

pub use membership::{MemberId, Membership, MembershipConfig, MembershipEvent};
pub use mesh::{Channel, Command, Mesh, MeshConfig, MeshCounters, MeshEvent, MeshTimer, Transmit};
