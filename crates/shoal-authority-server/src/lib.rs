//! # shoal-authority-server
//!
//! One replica of a region's authority: the pure rules of `shoal-authority` replicated with
//! openraft 0.9 over shoal-transport (QUIC + mutual TLS). See docs/adr/0004-authority-raft.md.
//!
//! - [`types`]: the openraft type configuration; a log entry is a [`types::Proposal`]
//!   (command + the leader's proposal wall time, so applying never reads a clock).
//! - [`backup`]: the data-directory lock, `snapshot save` and `snapshot restore`.
//! - [`storage`]: fsync'd, checksummed log/vote files and snapshots; torn or corrupt files
//!   are refused.
//! - [`lease_clock`], [`host_clock`]: when this host first applied the latest lease
//!   checkpoint, on the host's monotonic clock, kept across restarts of the replica
//!   (docs/adr/0024-lease-credit-across-process-restarts.md).
//! - [`audit_file`]: the replica's `audit.log` writer (a failed append is kept and written
//!   later, or named by an `audit_gap` line; never dropped silently).
//! - [`network`]: Raft RPCs over a dedicated transport, correlated by id, bounded, with
//!   deadlines; only configured members may speak Raft.
//! - [`server`]: the replica: agent RPC (leader-only writes, `NotLeader`, bounded
//!   `NoQuorum`), leader takeover, the lease safety net, audit log, metrics.
//! - [`member`]: the embedded mesh member (liveness view for the lease safety net,
//!   dissemination of every applied record).
//! - [`client`]: an RPC client for the CLI, tests and benches.
//! - [`cli`]: `shoal authority run|status|snapshot|keygen`.
//! - [`config`]: the `authority.toml` file.

pub mod audit_file;
pub mod backup;
pub mod cli;
pub mod client;
pub mod config;
pub mod files;
pub mod host_clock;
pub mod lease_clock;
pub mod member;
pub mod metrics_describe;
pub mod network;
pub mod policy_cli;
pub mod regions;
pub mod renewals;
pub mod server;
pub mod storage;
pub mod types;
