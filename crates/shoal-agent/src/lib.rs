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
//! [`access`] (who may do what), [`api`], [`consul`] (a Consul-compatible read port), [`dns`]
//! and [`dns_io`] (its sockets), [`tcp_http`] (HTTP on the capped TCP ports: Consul, `/metrics`),
//! [`http1`] (one HTTP/1.1 connection, as the socket and the TCP ports serve it),
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
pub mod dns_io;
pub mod driver;
pub mod failover;
pub mod health_endpoints;
pub mod http1;
pub mod keys;
pub mod listener;
pub mod local_probes;
pub mod members_view;
pub mod metrics;
pub mod metrics_describe;
pub mod persist;
pub mod probes;
pub mod state;
pub mod tcp_http;
pub mod xds;

pub use agent::{run, run_until};
pub use config::{load, AgentConfig, Overrides, Validated};

/// Targets of dependencies that log once per request at INFO: hickory-server wrote a line for
/// every DNS query (147,000 lines, 24 MB, in a 5 s flood of random packets). They log at
/// `warn` unless the filter names them.
pub const QUIET_TARGETS: &[&str] = &["hickory_server", "hickory_proto"];

/// The agent's log filter (RUST_LOG syntax) for the operator's `spec`: `spec`, plus
/// `<target>=warn` for each of [`QUIET_TARGETS`] that `spec` does not mention (so
/// `SHOAL_LOG=info,hickory_server=debug` or the same in `RUST_LOG` still shows hickory's lines).
pub fn log_filter(spec: &str) -> String {
    let mut out = spec.trim().to_string();
    for t in QUIET_TARGETS {
        if !spec.contains(t) {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(t);
            out.push_str("=warn");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn hickory_is_quiet_unless_named() {
        assert_eq!(
            super::log_filter("info"),
            "info,hickory_server=warn,hickory_proto=warn"
        );
        assert_eq!(
            super::log_filter("debug,hickory_server=info"),
            "debug,hickory_server=info,hickory_proto=warn"
        );
        assert_eq!(
            super::log_filter(""),
            "hickory_server=warn,hickory_proto=warn"
        );
    }
}
