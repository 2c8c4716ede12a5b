//! The shoal node agent.
//!
//! This crate will hold the daemon that runs on every machine (see the architecture brief). So
//! far it has the pieces every other part of the agent stands on:
//!
//! - [`certs`]: per-region development CA and node certificates (rcgen), and parsing a verified
//!   peer certificate back into a [`certs::NodeIdentity`].
//! - [`transport`]: QUIC (quinn) with mutual TLS (rustls, ring) between the agents of one
//!   region: datagrams for SWIM, one uni-directional stream per bulk message, a bounded
//!   connection cache, bounded queues, and counters for everything dropped or refused.

pub mod certs;
pub mod transport;
