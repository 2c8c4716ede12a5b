//! # shoal-mesh
//!
//! One agent's protocol state as a sans-IO state machine: SWIM membership over foca
//! ([`membership`]), Plumtree record dissemination and anti-entropy ([`mesh`]), and their wire
//! messages ([`messages`]). No clock reads, no OS randomness, no sockets: the tokio agent and the
//! deterministic simulator drive the very same code.
//!
//! # Tutorial: two agents, one record, by hand
//!
//! 1. **Create** one [`Mesh`] per agent: its SWIM identity (node id, listen address, boot
//!    generation), region and zone, the node key that signs its own instances' health, a
//!    [`shoal_catalog::Verifier`] trusting the region authority and the node keys, and a seed
//!    for all of its randomness.
//! 2. **Form the region.** [`Mesh::bootstrap`] with known members (a new agent would send
//!    [`Command::Join`] with seed addresses instead).
//! 3. **Publish** an authority-signed lifecycle record at one agent with [`Command::Publish`].
//! 4. **Pump.** After *every* input drain [`Mesh::poll_transmit`], then [`Mesh::poll_event`].
//!    Hand each transmit to the agent listening at its address (datagrams to
//!    [`Mesh::handle_datagram`], stream messages to [`Mesh::handle_stream_message`]). The core
//!    keeps its own timers: [`Mesh::poll_timeout`] says when the next is due, and
//!    [`Mesh::handle_timeout`] fires what is due once the clock gets there. Time is an input:
//!    here the clock jumps from deadline to deadline.
//! 5. **Observe** [`MeshEvent::LifecycleApplied`] at the other agent: the READY record was held
//!    for [`MeshConfig::coalesce_ms`] and then pushed.
//! 6. **Read** a routable view from the catalog, with [`Mesh::liveness`] deriving "owner down"
//!    from SWIM.
//!
//! ```
//! use std::collections::VecDeque;
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//!
//! use shoal_catalog::testkit::Fixture;
//! use shoal_catalog::Keyring;
//! use shoal_mesh::{Channel, Command, MemberId, Mesh, MeshConfig, MeshEvent, Transmit};
//! use shoal_proto::{Generation, LifecycleState, Zone};
//!
//! // 1. Create: node-0 and node-1 of the fixture's region `test`.
//! let fx = Fixture::new();
//! let addr = |i: usize| -> SocketAddr { format!("127.0.0.{}:7946", i + 1).parse().unwrap() };
//! let id = |i: usize| MemberId { node: fx.nodes[i].0.clone(), addr: addr(i), boot: Generation(1) };
//! let config = MeshConfig::for_cluster_size(2);
//! let mut agents: Vec<Mesh<Keyring>> = (0..2)
//!     .map(|i| {
//!         let zone = Zone::new("zone-a").unwrap();
//!         let key = fx.nodes[i].1.clone();
//!         Mesh::new(id(i), fx.region.clone(), zone, key, config.clone(), fx.keyring.clone(), i as u64)
//!     })
//!     .collect();
//!
//! // Everything an agent sent or reported, waiting for the driver.
//! #[derive(Default)]
//! struct Outputs {
//!     in_flight: VecDeque<(usize, Transmit)>,
//!     events: Vec<(usize, MeshEvent)>,
//! }
//! fn drain(agents: &mut [Mesh<Keyring>], i: usize, out: &mut Outputs) {
//!     while let Some(t) = agents[i].poll_transmit() {
//!         out.in_flight.push_back((i, t));
//!     }
//!     while let Some(e) = agents[i].poll_event() {
//!         out.events.push((i, e));
//!     }
//! }
//! let mut out = Outputs::default();
//! let mut now = 0;
//!
//! // 2. Form the region.
//! agents[0].bootstrap(now, vec![id(1)]);
//! drain(&mut agents, 0, &mut out);
//! agents[1].bootstrap(now, vec![id(0)]);
//! drain(&mut agents, 1, &mut out);
//!
//! // 3. Publish instance `web-1` (owned by node-0) as READY at revision 1, at agent 0.
//! let record = Arc::new(fx.lifecycle("web-1", 1, 1, LifecycleState::Ready));
//! let published = agents[0].handle_command(now, Command::Publish { lifecycle: vec![record.clone()] });
//! assert_eq!(published, Ok(()), "a record the authority signed is never refused");
//! drain(&mut agents, 0, &mut out);
//!
//! // 4. Pump until agent 1 reports the record.
//! let arrived = |out: &Outputs| {
//!     out.events.iter().any(|(i, e)| *i == 1 && *e == MeshEvent::LifecycleApplied(record.clone()))
//! };
//! while !arrived(&out) {
//!     if let Some((from, t)) = out.in_flight.pop_front() {
//!         let to = if t.to == addr(0) { 0 } else { 1 };
//!         match t.channel {
//!             Channel::Datagram => agents[to].handle_datagram(now, addr(from), &t.bytes),
//!             Channel::Stream => agents[to].handle_stream_message(now, addr(from), &t.bytes),
//!         }
//!         drain(&mut agents, to, &mut out);
//!     } else {
//!         // Nothing in flight: move the clock to the earliest deadline and fire what is due.
//!         let (at, i) = (0..2)
//!             .filter_map(|i| Some((agents[i].poll_timeout()?, i)))
//!             .min()
//!             .expect("periodic timers are always armed");
//!         now = now.max(at);
//!         agents[i].handle_timeout(now);
//!         drain(&mut agents, i, &mut out);
//!     }
//!     assert!(now < 10_000, "the record should have arrived long ago");
//! }
//!
//! // 5. The READY record waited one coalescing window at agent 0, then was pushed.
//! assert_eq!(now, config.coalesce_ms);
//! assert_eq!(agents[1].catalog().heads(), agents[0].catalog().heads());
//!
//! // 6. Agent 1's routable view: web-1 is READY, its owner alive.
//! let view = agents[1].catalog().view(&fx.key, &agents[1].liveness());
//! assert_eq!(view.endpoints.len(), 1);
//! assert_eq!(view.endpoints[0].instance.as_str(), "web-1");
//! assert!(view.endpoints[0].routable);
//! ```

pub mod hash;
pub mod membership;
pub mod mesh;
pub mod messages;
mod queue;
mod record_codec;

pub use membership::{MemberId, Membership, MembershipConfig, MembershipEvent};
pub use mesh::{
    Channel, Command, Mesh, MeshConfig, MeshCounters, MeshEvent, MeshTimer, Refusal, TimerToken,
    Transmit,
};
