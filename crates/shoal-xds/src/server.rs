//! The gRPC server: `envoy.service.discovery.v3.AggregatedDiscoveryService` over tonic.
//!
//! Each `StreamAggregatedResources` call gets one task that owns an [`AdsStream`] and selects
//! between the client's next request and the next view on the watch channel; responses go out
//! through a bounded channel (a client that stops reading blocks only its own task). Delta xDS
//! (`DeltaAggregatedResources`) answers `UNIMPLEMENTED`; clients fall back to state of the world
//! (gRPC and Envoy use it unless told otherwise).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use serde::Deserialize;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::conn::{ConnInfo, ConnLimits};
use crate::model::{Locality, View};
use crate::stream::{AdsStream, RequestKind};

/// Default address of the xDS server: loopback, port 18000 (the port Envoy's and gRPC's xDS
/// examples use).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:18000";
/// Default most concurrent ADS streams; past it a new stream is refused (`RESOURCE_EXHAUSTED`).
pub const DEFAULT_MAX_STREAMS: usize = 1_024;
/// Default most open TCP connections on the port; past it a new one is closed at accept.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Default longest wait from accept to a connection's first ADS call, ms.
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 5_000;
/// Default HTTP/2 keepalive PING interval, ms (unanswered for 10 s: the connection is closed).
pub const DEFAULT_KEEPALIVE_MS: u64 = 30_000;
/// Responses queued per stream before its task waits for the client to read.
const RESPONSE_QUEUE: usize = 16;
/// Admitted connections waiting for tonic to take them.
const ACCEPT_QUEUE: usize = 16;

/// `[xds]` of the agent's configuration. Off unless `enabled = true`.
///
/// ```toml
/// [xds]
/// enabled = true
/// listen = "127.0.0.1:18000"   # loopback unless allow_non_loopback = true
/// max_streams = 1024
/// max_connections = 256        # TCP connections; past it closed at accept (counted, logged)
/// handshake_timeout_ms = 5000  # accept -> first ADS call, else closed
/// keepalive_ms = 30000         # HTTP/2 PING interval; unanswered 10 s later: closed
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct XdsConfig {
    /// Serve xDS (default false).
    #[serde(default)]
    pub enabled: bool,
    /// TCP address of the gRPC server (default [`DEFAULT_LISTEN`]).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Allow a non-loopback `listen` (no authentication on the port; off by default).
    #[serde(default)]
    pub allow_non_loopback: bool,
    /// Most concurrent streams (default [`DEFAULT_MAX_STREAMS`], at least 1).
    #[serde(default = "default_max_streams")]
    pub max_streams: usize,
    /// Most open TCP connections (default [`DEFAULT_MAX_CONNECTIONS`], at least 1). Why: each
    /// holds a descriptor, and a local process opening thousands starved the agent's other
    /// ports and its snapshot writes (`crate::conn`).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Longest wait from accept to a connection's first ADS call, ms (default
    /// [`DEFAULT_HANDSHAKE_TIMEOUT_MS`], 100..=60,000).
    #[serde(default = "default_handshake_timeout_ms")]
    pub handshake_timeout_ms: u64,
    /// HTTP/2 keepalive PING interval, ms (default [`DEFAULT_KEEPALIVE_MS`], at least 1,000): a
    /// peer that does not answer one within 10 s is disconnected.
    #[serde(default = "default_keepalive_ms")]
    pub keepalive_ms: u64,
}

fn default_listen() -> SocketAddr {
    DEFAULT_LISTEN.parse().expect("valid default")
}
fn default_max_streams() -> usize {
    DEFAULT_MAX_STREAMS
}
fn default_max_connections() -> usize {
    DEFAULT_MAX_CONNECTIONS
}
fn default_handshake_timeout_ms() -> u64 {
    DEFAULT_HANDSHAKE_TIMEOUT_MS
}
fn default_keepalive_ms() -> u64 {
    DEFAULT_KEEPALIVE_MS
}

impl Default for XdsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            listen: default_listen(),
            allow_non_loopback: false,
            max_streams: DEFAULT_MAX_STREAMS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout_ms: DEFAULT_HANDSHAKE_TIMEOUT_MS,
            keepalive_ms: DEFAULT_KEEPALIVE_MS,
        }
    }
}

/// Why an `[xds]` section is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XdsConfigError {
    /// `listen` is not loopback and `allow_non_loopback` is not set.
    #[error("xds.listen {0} is not a loopback address (set allow_non_loopback = true to force; the port has no authentication)")]
    NotLoopback(SocketAddr),
    /// `max_streams` is 0.
    #[error("xds.max_streams must be at least 1")]
    NoStreams,
    /// `max_connections` is 0.
    #[error("xds.max_connections must be at least 1")]
    NoConnections,
    /// `handshake_timeout_ms` is outside 100..=60,000.
    #[error("xds.handshake_timeout_ms must be within 100..=60000")]
    HandshakeTimeout,
    /// `keepalive_ms` is below 1,000.
    #[error("xds.keepalive_ms must be at least 1000")]
    Keepalive,
}

impl XdsConfig {
    /// Checks the section.
    ///
    /// # Errors
    /// [`XdsConfigError`] naming the bad field.
    pub fn validate(&self) -> Result<(), XdsConfigError> {
        if !self.listen.ip().is_loopback() && !self.allow_non_loopback {
            return Err(XdsConfigError::NotLoopback(self.listen));
        }
        if self.max_streams == 0 {
            return Err(XdsConfigError::NoStreams);
        }
        if self.max_connections == 0 {
            return Err(XdsConfigError::NoConnections);
        }
        if !(100..=60_000).contains(&self.handshake_timeout_ms) {
            return Err(XdsConfigError::HandshakeTimeout);
        }
        if self.keepalive_ms < 1_000 {
            return Err(XdsConfigError::Keepalive);
        }
        Ok(())
    }

    /// The connection limits `serve` enforces.
    pub fn limits(&self) -> ConnLimits {
        ConnLimits {
            max_connections: self.max_connections.max(1),
            handshake_timeout: Duration::from_millis(self.handshake_timeout_ms),
            keepalive: Duration::from_millis(self.keepalive_ms),
        }
    }
}

impl Default for ConnLimits {
    fn default() -> Self {
        XdsConfig::default().limits()
    }
}

/// The ADS service. Cheap to clone (shared parts are `Arc`s).
#[derive(Clone)]
pub struct Ads {
    views: watch::Receiver<Arc<View>>,
    local: Locality,
    streams: Arc<Semaphore>,
}

impl std::fmt::Debug for Ads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ads").field("local", &self.local).finish()
    }
}

impl Ads {
    /// A service serving the views published on `views` to callers next to an agent at `local`
    /// (failover regions by policy come with each view: [`View::failover`]).
    pub fn new(views: watch::Receiver<Arc<View>>, local: Locality, max_streams: usize) -> Self {
        crate::metrics::describe();
        Self {
            views,
            local,
            streams: Arc::new(Semaphore::new(max_streams.max(1))),
        }
    }

    /// The tonic service, to add to a `tonic::transport::Server`.
    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<Self> {
        AggregatedDiscoveryServiceServer::new(self)
    }
}

/// Serves `ads` on `listener` under `limits` (connection cap, first-request deadline, HTTP/2
/// keepalive: `crate::conn`) until `shutdown` resolves.
///
/// # Errors
/// The transport's error if serving fails (accept errors are counted and retried).
pub async fn serve(
    listener: tokio::net::TcpListener,
    ads: Ads,
    limits: ConnLimits,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    crate::metrics::describe();
    let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
    let accept = tokio::spawn(crate::conn::accept_loop(listener, limits, tx));
    let served = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(limits.keepalive))
        .http2_keepalive_timeout(Some(crate::conn::KEEPALIVE_TIMEOUT))
        .add_service(ads.into_service())
        .serve_with_incoming_shutdown(ReceiverStream::new(rx), shutdown)
        .await;
    accept.abort();
    served
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let conn = request.extensions().get::<ConnInfo>().cloned();
        if let Some(c) = &conn {
            c.requested();
        }
        let Ok(permit) = self.streams.clone().try_acquire_owned() else {
            crate::metrics::stream_refused();
            return Err(Status::resource_exhausted(
                "too many xDS streams on this agent (xds.max_streams)",
            ));
        };
        let peer = conn
            .and_then(|c| c.remote)
            .or_else(|| request.remote_addr());
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(RESPONSE_QUEUE);
        let task = StreamTask {
            stream: AdsStream::new(self.local.clone()),
            views: self.views.clone(),
            tx,
            peer,
        };
        tokio::spawn(async move {
            let _permit = permit;
            let _open = crate::metrics::StreamGauge::open();
            task.run(inbound).await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        // An ADS call all the same: the client is speaking xDS, so its connection stays.
        if let Some(c) = request.extensions().get::<ConnInfo>() {
            c.requested();
        }
        Err(Status::unimplemented(
            "delta xDS is not served; use state-of-the-world ADS",
        ))
    }
}

/// Whether `status`, an error of the request stream, comes from decoding the client's bytes
/// (protobuf that does not parse, a bad compression flag, a message cut off by the end of the
/// stream, one over the size limit) rather than from the connection. tonic makes the former
/// itself, without a source; transport errors (HTTP/2 resets, a closed connection) carry the
/// h2 or hyper error as their source.
fn is_undecodable(status: &Status) -> bool {
    use std::error::Error as _;
    status.source().is_none()
        && matches!(
            status.code(),
            tonic::Code::Internal | tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        )
}

struct StreamTask {
    stream: AdsStream,
    views: watch::Receiver<Arc<View>>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    peer: Option<SocketAddr>,
}

impl StreamTask {
    async fn run(mut self, mut inbound: Streaming<DiscoveryRequest>) {
        let mut refused_logged = false;
        loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => {
                        // `borrow`, not `borrow_and_update`: a view that arrived with this
                        // request must still be pushed to the stream's other types.
                        let view = self.views.borrow().clone();
                        if !self.on_request(&req, &view, &mut refused_logged).await {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(status) if is_undecodable(&status) => {
                        self.refuse_undecodable(&status).await;
                        return;
                    }
                    Err(status) => {
                        tracing::debug!(peer = ?self.peer, %status, "xDS stream ended");
                        return;
                    }
                },
                changed = self.views.changed() => {
                    if changed.is_err() {
                        return; // the agent is stopping
                    }
                    let view = self.views.borrow_and_update().clone();
                    for resp in self.stream.handle_view(&view) {
                        if !self.send(resp).await {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Handles one request; false when the client is gone.
    async fn on_request(
        &mut self,
        req: &DiscoveryRequest,
        view: &View,
        refused_logged: &mut bool,
    ) -> bool {
        match self.stream.handle_request(req, view) {
            Ok(out) => {
                crate::metrics::request(out.ty, &out.kind);
                if let RequestKind::Nack { message } = &out.kind {
                    tracing::warn!(peer = ?self.peer, node = ?self.stream.node_id(),
                        type_url = %req.type_url, version = %req.version_info,
                        nonce = %req.response_nonce, %message,
                        "xDS client rejected (NACKed) a response; it keeps its previous config");
                }
                match out.response {
                    Some(resp) => self.send(resp).await,
                    None => true,
                }
            }
            Err(e) => {
                crate::metrics::refused(&e);
                if !std::mem::replace(refused_logged, true) {
                    tracing::warn!(peer = ?self.peer, node = ?self.stream.node_id(), error = %e,
                        "xDS request refused (further refusals on this stream are only counted)");
                }
                true
            }
        }
    }

    /// Ends the stream with `INVALID_ARGUMENT` for a request that did not decode (the gRPC
    /// call then fails with a status that says why, instead of ending as if the server had
    /// nothing more to say); counted, and logged once a minute.
    async fn refuse_undecodable(&self, status: &Status) {
        static LOG: shoal_transport::log_every::LogEvery =
            shoal_transport::log_every::LogEvery::new();
        crate::metrics::undecodable();
        if let Some(held) = LOG.check() {
            tracing::warn!(peer = ?self.peer, node = ?self.stream.node_id(), error = %status.message(),
                not_logged_since_last = held,
                "xDS request did not decode; stream ended INVALID_ARGUMENT (logged once a minute)");
        }
        let refusal = Status::invalid_argument(format!(
            "xDS request could not be decoded as a DiscoveryRequest: {}",
            status.message()
        ));
        // The client may be gone already: nothing else to do then.
        let _ = self.tx.send(Err(refusal)).await;
    }

    async fn send(&self, resp: DiscoveryResponse) -> bool {
        if let Some(ty) = crate::resources::ResourceType::from_type_url(&resp.type_url) {
            crate::metrics::response(ty);
        }
        self.tx.send(Ok(resp)).await.is_ok()
    }
}
