//! # shoal-agent
//!
//! The node agent daemon: a tokio driver around the sans-IO [`shoal_mesh::Mesh`], mutual-TLS
//! QUIC transport (`shoal-transport`), auto-join with jittered backoff, a local HTTP/1.1 + JSON
//! API on a unix socket, health probes of local instances, atomic snapshot persistence,
//! Prometheus metrics, and a clearly-marked development authority.
//!
//! Modules, in boot order: [`config`] (TOML, validated), [`keys`] (data dir: node key, boot
//! generation), [`persist`] (snapshots), [`agent`] (boot and tasks), [`driver`] (the one task
//! that owns the mesh), [`client`] (authority RPC), [`dev_authority`], [`listener`] (local socket connections),
//! [`access`] (who may do what), [`api`], [`consul`] (a Consul-compatible read port), [`dns`],
//! [`health_endpoints`] (liveness, readiness), [`members_view`] (`/v1/agent/members` rows),
//! [`probes`], [`metrics`], [`xds`] (opt-in xDS server).

pub mod access;
pub mod agent;
pub mod api;
pub mod client;
pub mod config;
pub mod consul;
pub mod consul_filter;
pub mod consul_json;
pub mod dev_authority;
pub mod dns;
pub mod driver;
pub mod failover;
pub mod health_endpoints;
pub mod keys;
pub mod listener;
pub mod local_probes;
pub mod members_view;
pub mod metrics;
pub mod metrics_describe;
pub mod persist;
pub mod probes;
pub mod state;
pub mod xds;

pub use agent::{run, run_until};
pub use config::{load, AgentConfig, Overrides, Validated};
