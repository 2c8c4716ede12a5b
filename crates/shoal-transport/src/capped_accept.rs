//! A TCP port that admits at most a fixed number of open connections.
//!
//! The agent's local TCP ports (the Consul-compatible API, xDS, DNS over TCP) serve callers it
//! cannot identify, so one local process could hold idle connections until the agent has no
//! descriptors left (QA, 2026-12-02: 20,000 idle xDS connections, then the unix-socket API, the
//! metrics port and the snapshot writes failed with `EMFILE`). [`CappedListener::accept`]
//! closes a connection over the cap at once, counts it and warns at most once per
//! [`LOG_INTERVAL`](crate::log_every::LOG_INTERVAL); a failed `accept()` backs off
//! [`ACCEPT_BACKOFF`] instead of spinning.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics::counter;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::log_every::LogEvery;

/// Pause after a failed `accept()` (`EMFILE` would otherwise spin the loop).
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// How one port names itself in its metrics and log lines.
#[derive(Debug, Clone, Copy)]
pub struct PortNames {
    /// The port in log lines, e.g. `"xDS"`.
    pub port: &'static str,
    /// The config key of its cap, for log lines, e.g. `"xds.max_connections"`.
    pub setting: &'static str,
    /// Counter of connections closed at accept over the cap.
    pub refused_metric: &'static str,
    /// Counter of failed `accept()` calls.
    pub accept_errors_metric: &'static str,
}

/// A listener with at most `max` connections open at once (see the module docs).
#[derive(Debug)]
pub struct CappedListener {
    listener: TcpListener,
    max: usize,
    slots: Arc<Semaphore>,
    names: PortNames,
    refused_log: LogEvery,
    error_log: LogEvery,
}

impl CappedListener {
    /// Caps `listener` at `max` open connections (at least one).
    pub fn new(listener: TcpListener, max: usize, names: PortNames) -> Self {
        let max = max.max(1);
        Self {
            listener,
            max,
            slots: Arc::new(Semaphore::new(max)),
            names,
            refused_log: LogEvery::new(),
            error_log: LogEvery::new(),
        }
    }

    /// The next connection under the cap, with its slot: the connection counts against the cap
    /// until the slot is dropped. Connections over the cap are closed here. Cancel-safe.
    pub async fn accept(&self) -> (TcpStream, SocketAddr, OwnedSemaphorePermit) {
        loop {
            let (stream, remote) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    counter!(self.names.accept_errors_metric).increment(1);
                    if let Some(held) = self.error_log.check() {
                        tracing::error!(port = self.names.port, error = %e,
                            not_logged_since_last = held,
                            "accept failed; backing off (logged once a minute)");
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            match self.slots.clone().try_acquire_owned() {
                Ok(slot) => return (stream, remote, slot),
                Err(_) => {
                    counter!(self.names.refused_metric).increment(1);
                    if let Some(held) = self.refused_log.check() {
                        tracing::warn!(port = self.names.port, peer = %remote,
                            setting = self.names.setting, max = self.max,
                            not_logged_since_last = held,
                            "connection refused: the port's connection cap is reached (logged once a minute)");
                    }
                    drop(stream);
                }
            }
        }
    }
}
