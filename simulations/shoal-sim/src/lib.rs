//! # shoal-sim
//!
//! A deterministic discrete-event simulator for shoal. One seed drives thousands of sans-IO
//! nodes over a modelled network with partitions, loss, duplication, crashes, CPU stalls and
//! clock skew; the same seed and scenario always produce a byte-identical report.
//!
//! Layers, bottom up:
//! 1. [`node`]: the [`node::SimNode`] trait a node implements (sans-IO: `handle_*` inputs,
//!    `poll_*` outputs, time as an input).
//! 2. [`rng`]: one seeded ChaCha tree; each purpose gets an independent child.
//! 3. [`topology`] and [`net`]: regions/zones/addresses; latency, loss, duplication, size
//!    limits, link faults, counters.
//! 4. [`world`]: the engine: virtual clock (µs), event queue ordered by (time, seq), routing,
//!    node faults, and `with_node` for scenario layers.
//! 5. [`scenario`]: the TOML schema; [`runner`]: applies a scenario through a
//!    [`runner::Harness`]; [`report`] and [`plot`]: JSON, markdown and SVG output.
//! 6. [`sweep`]: many seeds in parallel processes, merged distributions and pass counts.
//! 7. [`testkit`]: a toy `PingNode` that exercises everything until the mesh adapter lands.

pub mod net;
pub mod node;
pub mod plot;
pub mod report;
pub mod rng;
pub mod runner;
pub mod scenario;
pub mod shoal;
pub mod sweep;
pub mod testkit;
pub mod topology;
pub mod world;

pub use node::{Channel, NodeCtx, SimNode, Transmit};
pub use world::World;
