//! # shoal-transport
//!
//! Every byte between shoal processes (agent to agent, agent to authority, authority to
//! authority) travels through this crate. It is split from the agent so the authority replicas
//! use the very same mutual-TLS QUIC setup (docs/adr/0002-transport-crate.md).
//!
//! - [`certs`]: per-region development CA and node certificates (rcgen), and parsing a verified
//!   peer certificate back into a [`certs::NodeIdentity`].
//! - [`transport`]: QUIC (quinn) with mutual TLS (rustls, ring) between the agents of one
//!   region: datagrams for SWIM, one uni-directional stream per bulk message, a bounded
//!   connection cache, bounded queues, and counters for everything dropped or refused.
//! - [`tls`]: the TLS material a transport presents and trusts, swappable at run time
//!   (certificate rotation on SIGHUP without a restart).
//! - [`capped_accept`]: a TCP listener with a cap on open connections, for the agent's local
//!   TCP ports; [`log_every`]: a warning at most once per interval.
//! - [`keyfile`]: creating (0600 / 0700, atomically), replacing and loading secret files.

pub mod capped_accept;
pub mod certs;
pub mod keyfile;
pub mod log_every;
pub mod tls;
pub mod transport;
