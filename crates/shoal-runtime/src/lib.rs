//! The tokio side of shoal that the agent and the authority's embedded mesh member share.
//!
//! Both daemons run the sans-IO [`shoal_mesh::Mesh`] over a [`shoal_transport`] endpoint. What
//! they do with the mesh's events differs (the agent serves an API and persists its catalog;
//! the member feeds the leader's liveness view); how the mesh is driven does not, and lives
//! here once (docs/adr/0020-shoal-runtime.md):
//!
//! * [`io`]: [`io::MeshIo`] — feed one input, drain transmits (send errors counted) and
//!   events, and wait for the core's next timer deadline ([`shoal_mesh::Mesh::poll_timeout`];
//!   the core keeps its timers itself) on the monotonic clock ([`clock::MonoClock`], tokio's
//!   clock so tests can pause it); the leave-then-close tail;
//! * [`join`]: the join backoff ([`join::Backoff`], one full-jitter formula) and seed
//!   resolution ([`join::resolve_seeds`]);
//! * [`boot`]: the persisted boot generation ([`boot::bump_boot`]), OS randomness and the
//!   jitter RNG;
//! * [`members_file`]: the address book persisted as `members.json` and read back at start;
//! * [`config`]: the `[tls]` section, hex public keys and the hex codec both config files
//!   share;
//! * [`knobs`]: the SWIM / anti-entropy overrides both config files accept
//!   ([`knobs::SwimKnobs`]);
//! * [`local_api`]: a blocking HTTP/1.1 client of the agent's unix-socket API (the demo and
//!   the cross-process tests).
//!
//! Nothing here reads configuration files or owns a task of its own: each daemon keeps its
//! select loop and wires these parts into it.

pub mod boot;
pub mod clock;
pub mod config;
pub mod io;
pub mod join;
pub mod knobs;
pub mod local_api;
pub mod members_file;
