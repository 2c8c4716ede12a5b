//! A small authority RPC client over shoal-transport, for the admin CLI, tests and the bench.
//!
//! It binds its own transport (replies come back as stream messages to its listen address)
//! and correlates replies to calls by `request_id`; at most [`MAX_PENDING`] calls in flight.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use shoal_proto::envelope::{self, MessageKind, MAX_STREAM_MESSAGE_BYTES};
use shoal_proto::rpc::{
    AuthorityError, AuthorityOk, AuthorityReply, AuthorityRequest, AuthorityRequestBody,
};
use shoal_transport::certs::{parse_certs, NodeIdentity};
use shoal_transport::transport::{Transport, TransportConfig};
use tokio::sync::oneshot;

/// Most calls in flight per client.
pub const MAX_PENDING: usize = 4_096;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<AuthorityOk, AuthorityError>>>>>;

/// Why a call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No reply before the deadline.
    #[error("no reply from {0} in time")]
    Timeout(SocketAddr),
    /// The request could not be sent.
    #[error("send to {0}: {1}")]
    Send(SocketAddr, String),
    /// Too many calls in flight.
    #[error("too many calls in flight")]
    Busy,
}

/// An authority RPC client.
pub struct AuthorityClient {
    transport: Transport,
    pending: Pending,
    next_id: AtomicU64,
}

impl std::fmt::Debug for AuthorityClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityClient")
            .field("identity", self.transport.identity())
            .finish_non_exhaustive()
    }
}

impl AuthorityClient {
    /// Binds a client transport on `listen` with the given PEMs; the region is read from the
    /// certificate.
    ///
    /// # Errors
    /// Bad PEMs, or the address cannot be bound.
    pub fn connect(
        listen: SocketAddr,
        ca_pem: &str,
        cert_pem: &str,
        key_pem: &str,
    ) -> anyhow::Result<Self> {
        let der = parse_certs(cert_pem, "certificate")?
            .into_iter()
            .next()
            .context("empty certificate file")?;
        let ident = NodeIdentity::from_cert(&der)?;
        let mut cfg = TransportConfig::new(listen, ident.region, ca_pem, cert_pem, key_pem);
        cfg.max_stream_message_bytes = MAX_STREAM_MESSAGE_BYTES;
        let (transport, mut rx) = Transport::bind(cfg)?;
        let pending: Pending = Arc::default();
        let p = pending.clone();
        tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                let Ok(reply) = envelope::decode::<AuthorityReply>(
                    &msg.bytes,
                    MessageKind::AuthorityReply,
                    MAX_STREAM_MESSAGE_BYTES,
                ) else {
                    continue;
                };
                if let Some(tx) = p.lock().expect("pending").remove(&reply.request_id) {
                    let _ = tx.send(reply.result);
                }
            }
        });
        Ok(Self {
            transport,
            pending,
            next_id: AtomicU64::new(1),
        })
    }

    /// Sends one request to `to` and waits at most `timeout` for its reply.
    ///
    /// # Errors
    /// [`ClientError`] when nothing came back; the authority's own answer (including its
    /// errors) is the `Ok` value.
    pub async fn call(
        &self,
        to: SocketAddr,
        body: AuthorityRequestBody,
        timeout: Duration,
    ) -> Result<Result<AuthorityOk, AuthorityError>, ClientError> {
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock().expect("pending");
            if p.len() >= MAX_PENDING {
                return Err(ClientError::Busy);
            }
            p.insert(request_id, tx);
        }
        let bytes = envelope::encode(
            MessageKind::AuthorityRequest,
            &AuthorityRequest {
                request_id,
                body,
                on_behalf_of: None,
            },
            MAX_STREAM_MESSAGE_BYTES,
        )
        .map_err(|e| ClientError::Send(to, e.to_string()))?;
        if let Err(e) = self.transport.send_stream_message(to, bytes) {
            self.pending.lock().expect("pending").remove(&request_id);
            return Err(ClientError::Send(to, e.to_string()));
        }
        let res = tokio::time::timeout(timeout, rx).await;
        self.pending.lock().expect("pending").remove(&request_id);
        match res {
            Ok(Ok(r)) => Ok(r),
            _ => Err(ClientError::Timeout(to)),
        }
    }

    /// Sends a write to the leader among `addrs`: follows `NotLeader` redirects and retries
    /// unreachable replicas and `NoQuorum` until `budget` is spent. Returns the last answer
    /// (or `NoQuorum` when no replica answered at all).
    pub async fn write(
        &self,
        addrs: &[SocketAddr],
        body: AuthorityRequestBody,
        budget: Duration,
    ) -> Result<AuthorityOk, AuthorityError> {
        let deadline = Instant::now() + budget;
        let mut target = addrs[0];
        let mut i = 0usize;
        let mut last = Err(AuthorityError::NoQuorum);
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = left.min(Duration::from_millis(3_000));
            match self.call(target, body.clone(), attempt).await {
                Ok(Err(AuthorityError::NotLeader { leader })) => {
                    last = Err(AuthorityError::NotLeader {
                        leader: leader.clone(),
                    });
                    match leader.and_then(|l| l.parse().ok()) {
                        Some(l) if l != target => target = l,
                        _ => {
                            i += 1;
                            target = addrs[i % addrs.len()];
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                Ok(Err(AuthorityError::NoQuorum)) => {
                    last = Err(AuthorityError::NoQuorum);
                    i += 1;
                    target = addrs[i % addrs.len()];
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(other) => return other,
                Err(_) => {
                    i += 1;
                    target = addrs[i % addrs.len()];
                }
            }
        }
        last
    }

    /// The client's transport (e.g. [`Transport::peer_certificate`] of a replica).
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// Closes the transport.
    pub async fn shutdown(&self) {
        self.transport.shutdown().await;
    }
}
