//! QUIC transport between the agents of one region: quinn + rustls with mutual TLS.
//!
//! # Shape
//! One task owns the protocol core. It calls the non-blocking [`Transport::send_datagram`] and
//! [`Transport::send_stream_message`] and reads [`Inbound`] messages from the bounded receiver
//! that [`Transport::bind`] returns. Everything else (dialling, the connection cache, reading
//! streams) runs in tasks spawned by the transport.
//!
//! # Trust
//! Both sides present a node certificate from the region CA (see [`crate::certs`]). The server
//! verifies the client with rustls' `WebPkiClientVerifier` rooted at the CA; the client verifies
//! the server against the same root under the fixed server name `shoal.<region>`. After the
//! handshake both sides parse the peer's identity out of its (verified) certificate and refuse
//! the connection if the region differs from ours. Inbound handshakes that fail for any reason
//! (other CA, expired, wrong region, garbage) are counted in
//! [`TransportCounters::handshakes_refused`]; nothing from such a peer is ever delivered.
//!
//! The certificate, key and CA bundle live in a [`TlsState`] that the rustls configs consult at
//! every handshake, so [`TlsState::reload`] (SIGHUP in the agent and the authority) changes what
//! new connections present and trust without touching established ones; see [`crate::tls`].
//!
//! # Addressing
//! Membership knows peers by their **listen** address, but a dialler's packets come from its
//! endpoint's address, and the receiver cannot tell that address is the one the dialler listens
//! on (certificates carry IPs but no ports). So the dialler opens a uni-directional *hello*
//! stream first on every connection it initiates, carrying its advertised listen address
//! ([`TransportConfig::advertise`], default: the bound address). The acceptor reads the hello
//! before anything else on that connection and files the connection in its cache under that
//! address, so a connection dialled by either side carries traffic both ways: a datagram reply
//! needs no second connection. The hello address is the peer's *claim*; its identity (node id,
//! region) comes from the certificate and is delivered next to it in [`Inbound::peer`].
//!
//! # Framing
//! Datagrams are QUIC DATAGRAM frames, one message each, checked against
//! [`TransportConfig::max_datagram_bytes`] and quinn's current `max_datagram_size()` before they
//! are sent. Stream messages use **one uni-directional stream per message**; the message ends at
//! the stream's FIN, so there is no length prefix. QUIC streams are cheap to open (no round
//! trip), a lost or reset message cannot desynchronise a long-lived framing, and the receiver
//! enforces [`TransportConfig::max_stream_message_bytes`] per stream: an oversize message is
//! counted, its stream is stopped (`STOP_SENDING`, code [`STREAM_TOO_LARGE`]), and the
//! connection stays up.
//!
//! # Bounds (invariant 8)
//! - Connection cache: at most [`TransportConfig::max_connections`] peers; the least recently
//!   used peer is evicted (its connections closed, counted) to make room. A peer has one
//!   connection used for sending, plus at most one extra inbound connection kept for receiving
//!   when both sides dialled each other at once.
//! - Per peer and per channel, a queue of [`TransportConfig::peer_queue_len`] messages;
//!   overflow is counted and dropped.
//! - Inbound: a channel of [`TransportConfig::inbound_queue_len`] messages. A full channel drops
//!   datagrams (counted) and back-pressures streams (QUIC flow control then slows the sender).
//! - Handshakes in progress: at most `max_connections`; more are refused (counted).
//! - QUIC: at most [`MAX_UNI_STREAMS`] concurrent inbound streams per connection, no bidi
//!   streams, a per-connection receive window of [`RECEIVE_WINDOW_BYTES`].

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Connection, Endpoint, VarInt};
use rustls::pki_types::CertificateDer;
use shoal_proto::Region;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::certs::{self, CertError, NodeIdentity};
use crate::tls::{CertInfo, TlsMaterial, TlsState};

mod connections;
use connections::*;

/// ALPN protocol id of the agent mesh.
pub const ALPN: &[u8] = b"shoal-mesh/1";
/// Maximum concurrent inbound uni-directional streams per connection.
pub const MAX_UNI_STREAMS: u32 = 64;
/// Per-connection QUIC receive window (bytes buffered across all streams of a connection).
pub const RECEIVE_WINDOW_BYTES: u32 = 8 << 20;
/// Application error code on a stream stopped because its message exceeded the limit.
pub const STREAM_TOO_LARGE: u32 = 1;
/// Connection close code: transport shutting down.
pub const CLOSE_SHUTDOWN: u32 = 0;
/// Connection close code: peer refused (identity or hello invalid).
pub const CLOSE_REFUSED: u32 = 1;
/// Connection close code: evicted from the connection cache.
pub const CLOSE_EVICTED: u32 = 2;
/// Connection close code: superseded by another connection to the same peer.
pub const CLOSE_SUPERSEDED: u32 = 3;
/// After a failed dial, messages to that peer are dropped (counted) for this long instead of
/// each one waiting for its own failing handshake.
pub const DIAL_BACKOFF: Duration = Duration::from_millis(500);

const HELLO_MAGIC: [u8; 2] = *b"SH";
const HELLO_VERSION: u8 = 1;
const HELLO_MAX_BYTES: usize = 32;

/// Configuration of a [`Transport`].
#[derive(Clone)]
pub struct TransportConfig {
    /// UDP address to bind. Port 0 picks an ephemeral port (tests).
    pub listen: SocketAddr,
    /// The listen address announced to peers in the hello. `None`: the bound address, which
    /// must then not be unspecified (`0.0.0.0` / `::`).
    pub advertise: Option<SocketAddr>,
    /// PEM of the region CA: the only root trusted for peers.
    pub ca_pem: String,
    /// PEM of this node's certificate (leaf first, then any intermediates).
    pub cert_pem: String,
    /// PEM of this node's private key.
    pub key_pem: String,
    /// This node's region; its certificate must be for it, and so must every peer's.
    pub region: Region,
    /// Maximum number of peers in the connection cache (LRU eviction past it).
    pub max_connections: usize,
    /// Largest stream message accepted, in bytes; larger ones are dropped and counted.
    pub max_stream_message_bytes: usize,
    /// Largest datagram sent or accepted, in bytes (default 1200, which fits one QUIC packet on
    /// most paths once the path MTU is known; quinn's own current limit is also checked).
    pub max_datagram_bytes: usize,
    /// The UDP payload size QUIC assumes before path MTU discovery has probed (bytes, at least
    /// 1200). quinn's default of 1200 leaves room for only ~1160-byte datagrams on a fresh
    /// connection, less than `max_datagram_bytes`' default; 1280 (the IPv6 minimum MTU, below
    /// every datacenter and overlay MTU) lets a 1200-byte datagram through from the first
    /// packet. Lower it to 1200 only on paths with a smaller MTU than 1280.
    pub initial_mtu: u16,
    /// A connection without traffic for this long is closed (also bounds the handshake and
    /// the wait for a dialler's hello). Default 60 s: with keep-alives off, SWIM's own probes
    /// keep a connection open. Each member probes every other once per round of
    /// `members x probe_period_ms` (24.5 s at 50 members and 500 ms), so two probes of one
    /// pair are at most two rounds apart, and 60 s keeps every connection of a region of up
    /// to ~60 members open without a packet of its own; in larger regions a pair that goes
    /// quiet for 60 s pays one handshake when it next talks, instead of a ping and its ACK
    /// every `keep_alive_ms` all along.
    pub idle_timeout_ms: u64,
    /// Keep-alive PING interval for cached connections; 0 (the default) disables keep-alives.
    /// Off because they were the largest share of an idle agent's packets (issue 19): at 50
    /// members, 10 s keep-alives on each of ~49 cached connections were 2.1 PINGs per agent
    /// per second, plus an ACK each, in 14.8 packets sent per second. Peers that need a
    /// connection kept open without traffic (a client waiting for a server) set it on their
    /// side: QUIC uses the smaller idle timeout of the two sides, and a PING from either keeps
    /// it open.
    pub keep_alive_ms: u64,
    /// Per-peer, per-channel send queue length in messages.
    pub peer_queue_len: usize,
    /// Length of the inbound channel in messages.
    pub inbound_queue_len: usize,
    /// Shared, reloadable TLS material. When set, the transport uses it (and follows its
    /// reloads) and ignores `ca_pem`, `cert_pem` and `key_pem`; when `None`, [`Transport::bind`]
    /// builds a state of its own from those PEMs ([`Transport::tls`] reloads it).
    pub tls: Option<TlsState>,
}

impl std::fmt::Debug for TransportConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportConfig")
            .field("listen", &self.listen)
            .field("advertise", &self.advertise)
            .field("region", &self.region)
            .field("max_connections", &self.max_connections)
            .field("max_stream_message_bytes", &self.max_stream_message_bytes)
            .field("max_datagram_bytes", &self.max_datagram_bytes)
            .field("initial_mtu", &self.initial_mtu)
            .field("idle_timeout_ms", &self.idle_timeout_ms)
            .field("keep_alive_ms", &self.keep_alive_ms)
            .field("peer_queue_len", &self.peer_queue_len)
            .field("inbound_queue_len", &self.inbound_queue_len)
            .finish_non_exhaustive()
    }
}

impl TransportConfig {
    /// A configuration with default limits: 512 connections, 1 MiB stream messages, 1200-byte
    /// datagrams, 1280-byte initial MTU, 60 s idle timeout, no keep-alive, 256-message queues,
    /// 4096 inbound.
    pub fn new(
        listen: SocketAddr,
        region: Region,
        ca_pem: impl Into<String>,
        cert_pem: impl Into<String>,
        key_pem: impl Into<String>,
    ) -> Self {
        Self {
            listen,
            advertise: None,
            ca_pem: ca_pem.into(),
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
            region,
            max_connections: 512,
            max_stream_message_bytes: 1 << 20,
            max_datagram_bytes: 1200,
            initial_mtu: 1280,
            idle_timeout_ms: 60_000,
            keep_alive_ms: 0,
            peer_queue_len: 256,
            inbound_queue_len: 4096,
            tls: None,
        }
    }

    /// As [`TransportConfig::new`], using (and following the reloads of) a shared TLS state.
    pub fn with_tls(listen: SocketAddr, tls: TlsState) -> Self {
        let mut c = Self::new(listen, tls.region().clone(), "", "", "");
        c.tls = Some(tls);
        c
    }
}

impl From<CertError> for TransportError {
    fn from(e: CertError) -> Self {
        Self::Cert(e)
    }
}

/// Why [`Transport::bind`] failed. Nothing is bound on error.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The CA, certificate or key is missing, malformed, of another CA or region, or expired.
    /// The [`CertError`] is in the message and deliberately not the `source()`: a binary's
    /// `{:#}` chain would print it twice ("not signed by the given CA: not signed by ...").
    #[error("certificate: {0}")]
    Cert(CertError),
    /// rustls refused the configuration (e.g. the key does not match the certificate).
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// A limit or address in the configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// Binding the UDP socket failed.
    #[error("bind {addr}: {source}")]
    Bind {
        /// The address that could not be bound.
        addr: SocketAddr,
        /// The IO error.
        source: std::io::Error,
    },
}

/// Why a send was not enqueued. Every case is also counted in [`TransportCounters`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The message is larger than the configured limit (`oversize_dropped`).
    #[error("message of {len} bytes exceeds the limit of {max}")]
    Oversize {
        /// Message length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The peer's queue is full (`queue_overflow`).
    #[error("send queue full")]
    QueueFull,
    /// The transport is shutting down.
    #[error("transport is shut down")]
    ShutDown,
}

/// Which channel a message came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// A QUIC datagram: unreliable, unordered, at most `max_datagram_bytes`.
    Datagram,
    /// A uni-directional QUIC stream: reliable, one message per stream.
    Stream,
}

/// A message received from a verified peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    /// The peer's listen address: the address we dialled, or the one it announced in its hello.
    pub from: SocketAddr,
    /// The peer's identity, from its verified certificate.
    pub peer: NodeIdentity,
    /// Datagram or stream.
    pub channel: Channel,
    /// The message.
    pub bytes: Vec<u8>,
}

/// A snapshot of the transport's counters (monotonic except `connections_open`, a gauge).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportCounters {
    /// Inbound handshakes that failed (bad or missing cert, other CA, expired, wrong region,
    /// no or bad hello) plus dialled peers whose verified identity was of another region, plus
    /// inbound connection attempts refused because too many handshakes were in progress.
    pub handshakes_refused: u64,
    /// Outbound dials that failed (unreachable, timeout, server cert refused).
    pub connects_failed: u64,
    /// Datagrams received and delivered (or dropped on a full inbound channel).
    pub datagrams_in: u64,
    /// Datagrams handed to quinn.
    pub datagrams_out: u64,
    /// Payload bytes received (datagrams + stream messages).
    pub bytes_in: u64,
    /// Payload bytes sent (datagrams + stream messages).
    pub bytes_out: u64,
    /// Stream messages received completely.
    pub stream_msgs_in: u64,
    /// Stream messages written completely.
    pub stream_msgs_out: u64,
    /// Messages dropped for size, on send or on receive.
    pub oversize_dropped: u64,
    /// Messages dropped because a peer's send queue was full.
    pub queue_overflow: u64,
    /// Datagrams dropped because the inbound channel was full.
    pub inbound_dropped: u64,
    /// Connections currently open (gauge).
    pub connections_open: u64,
    /// Peers evicted from the connection cache.
    pub connections_evicted: u64,
    /// Messages that could not be sent (no connection, stream or datagram error).
    pub send_errors: u64,
    /// Connections established (completed handshakes, dialled or accepted, identity and
    /// hello checked). Its rate is the handshake cost: each one is a full TLS 1.3 handshake.
    pub connections_established: u64,
}

/// QUIC packet and frame counts of this transport, summed over its connections: quinn's
/// per-connection statistics, read from the live ones when asked and added from the others
/// when they end. They say what the UDP packets are for (issue 19: an idle agent's packet
/// rate is its CPU cost), which the message counters of [`TransportCounters`] cannot: a
/// keep-alive PING, its ACK, and the ACK-only packet that answers a datagram carry no
/// message. Monotonic, except that a connection that ends between two reads can be missed
/// by one of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuicCounters {
    /// UDP datagrams sent (each one QUIC packet, or a few coalesced during a handshake).
    pub packets_out: u64,
    /// UDP datagrams received.
    pub packets_in: u64,
    /// ACK frames sent, alone or alongside other frames.
    pub ack_frames_out: u64,
    /// PING frames sent: keep-alives, loss-detection probes and MTU probes.
    pub ping_frames_out: u64,
    /// DATAGRAM frames sent (one per [`Transport::send_datagram`] that reached quinn).
    pub datagram_frames_out: u64,
    /// STREAM frames sent (stream messages, hellos, retransmissions).
    pub stream_frames_out: u64,
    /// CRYPTO frames sent (TLS handshakes).
    pub crypto_frames_out: u64,
    /// UDP datagrams the endpoint's socket received, whatever they were (counted below quinn:
    /// `CountingSocket`). quinn counts no datagram it drops, so `socket_datagrams_in -
    /// packets_in` is what reached no established connection: undecodable datagrams, unknown
    /// connection IDs, and refused, ignored or failed handshakes (QA sent 86,000 random
    /// datagrams and nothing counted them). Approximate by the datagrams in flight at the read.
    pub socket_datagrams_in: u64,
}

impl QuicCounters {
    fn of(stats: &quinn::ConnectionStats) -> Self {
        Self {
            packets_out: stats.udp_tx.datagrams,
            packets_in: stats.udp_rx.datagrams,
            ack_frames_out: stats.frame_tx.acks,
            ping_frames_out: stats.frame_tx.ping,
            datagram_frames_out: stats.frame_tx.datagram,
            stream_frames_out: stats.frame_tx.stream,
            crypto_frames_out: stats.frame_tx.crypto,
            socket_datagrams_in: 0,
        }
    }

    fn add(&mut self, o: &Self) {
        self.packets_out += o.packets_out;
        self.packets_in += o.packets_in;
        self.ack_frames_out += o.ack_frames_out;
        self.ping_frames_out += o.ping_frames_out;
        self.datagram_frames_out += o.datagram_frames_out;
        self.stream_frames_out += o.stream_frames_out;
        self.crypto_frames_out += o.crypto_frames_out;
    }
}

/// Reads a transport's [`QuicCounters`] from elsewhere (a metrics endpoint) without owning
/// the transport; reads zeros once the transport is gone.
#[derive(Debug, Clone)]
pub struct QuicCountersHandle(Weak<Shared>);

impl QuicCountersHandle {
    /// The current counts. Locks each live connection once: call it when they are wanted
    /// (a metrics scrape), not on a timer.
    pub fn read(&self) -> QuicCounters {
        self.0
            .upgrade()
            .map_or_else(QuicCounters::default, |s| s.quic_counters())
    }

    /// The transport's [`TransportCounters`] (zeros once the transport is gone).
    pub fn transport_counters(&self) -> TransportCounters {
        self.0
            .upgrade()
            .map_or_else(TransportCounters::default, |s| s.counters.snapshot())
    }

    /// Why the last dial to `to` failed, if it did within [`DIAL_ERROR_MAX_AGE`] and no dial
    /// has succeeded since: for a caller whose message to `to` was dropped and who would
    /// otherwise only see a timeout (e.g. `quinn` / `rustls` text such as
    /// `handshake: the cryptographic handshake failed: error 42: invalid peer certificate: BadSignature`).
    pub fn dial_failure(&self, to: SocketAddr) -> Option<String> {
        let shared = self.0.upgrade()?;
        let cache = shared.cache.lock().expect("cache lock");
        let entry = cache.peers.get(&to)?;
        let err = entry.link.dial_error.lock().expect("dial error lock");
        err.as_ref()
            .filter(|(at, _)| at.elapsed() < DIAL_ERROR_MAX_AGE)
            .map(|(_, text)| text.clone())
    }
}

/// How long [`QuicCountersHandle::dial_failure`] reports a failed dial.
pub const DIAL_ERROR_MAX_AGE: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Counters {
    handshakes_refused: AtomicU64,
    connects_failed: AtomicU64,
    datagrams_in: AtomicU64,
    datagrams_out: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    stream_msgs_in: AtomicU64,
    stream_msgs_out: AtomicU64,
    oversize_dropped: AtomicU64,
    queue_overflow: AtomicU64,
    inbound_dropped: AtomicU64,
    connections_open: AtomicU64,
    connections_evicted: AtomicU64,
    send_errors: AtomicU64,
    connections_established: AtomicU64,
    /// [`QuicCounters`] of the connections that ended.
    quic_ended: Mutex<QuicCounters>,
    /// Datagrams the endpoint's socket received ([`CountingSocket`]).
    socket_datagrams_in: Arc<AtomicU64>,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn add(c: &AtomicU64, n: usize) {
    c.fetch_add(n as u64, Ordering::Relaxed);
}

impl Counters {
    fn snapshot(&self) -> TransportCounters {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TransportCounters {
            handshakes_refused: g(&self.handshakes_refused),
            connects_failed: g(&self.connects_failed),
            datagrams_in: g(&self.datagrams_in),
            datagrams_out: g(&self.datagrams_out),
            bytes_in: g(&self.bytes_in),
            bytes_out: g(&self.bytes_out),
            stream_msgs_in: g(&self.stream_msgs_in),
            stream_msgs_out: g(&self.stream_msgs_out),
            oversize_dropped: g(&self.oversize_dropped),
            queue_overflow: g(&self.queue_overflow),
            inbound_dropped: g(&self.inbound_dropped),
            connections_open: g(&self.connections_open),
            connections_evicted: g(&self.connections_evicted),
            send_errors: g(&self.send_errors),
            connections_established: g(&self.connections_established),
        }
    }
}

/// The agent's QUIC endpoint: dials and accepts mutually authenticated connections to the
/// region's other agents. See the [module docs](self) for framing, addressing and bounds.
///
/// Must be created and used inside a tokio runtime. Dropping it closes the endpoint abruptly;
/// prefer [`Transport::shutdown`].
pub struct Transport {
    shared: Arc<Shared>,
    accept_task: JoinHandle<()>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("listen", &self.shared.listen)
            .field("identity", &self.shared.identity)
            .finish_non_exhaustive()
    }
}

struct Limits {
    max_connections: usize,
    max_stream_message_bytes: usize,
    max_datagram_bytes: usize,
    peer_queue_len: usize,
    hello_timeout: Duration,
}

struct Shared {
    endpoint: Endpoint,
    listen: SocketAddr,
    identity: NodeIdentity,
    tls: TlsState,
    server_name: String,
    limits: Limits,
    counters: Counters,
    cache: Mutex<Cache>,
    /// Taken on shutdown so the receiver sees the end once in-flight deliveries finish.
    inbound: Mutex<Option<mpsc::Sender<Inbound>>>,
    closing: AtomicBool,
    closed_tx: watch::Sender<bool>,
    handshakes_pending: AtomicU64,
}

#[derive(Default)]
struct Cache {
    peers: HashMap<SocketAddr, PeerEntry>,
    tick: u64,
}

struct PeerEntry {
    link: Arc<PeerLink>,
    datagrams: mpsc::Sender<Bytes>,
    streams: mpsc::Sender<Bytes>,
    tasks: [JoinHandle<()>; 2],
    last_used: u64,
}

/// The connections to one peer, shared by its two sender tasks and the accept path.
struct PeerLink {
    addr: SocketAddr,
    /// The connection used for sending.
    slot: Mutex<Option<Connection>>,
    /// At most one extra, receive-only connection (both sides dialled at once).
    extra: Mutex<Option<Connection>>,
    /// Serialises dials so two sender tasks never dial the same peer twice.
    dial_lock: tokio::sync::Mutex<()>,
    last_dial_failure: Mutex<Option<Instant>>,
    /// Why the last dial failed and when (cleared by a successful dial), for callers whose
    /// messages it dropped ([`QuicCountersHandle::dial_failure`]).
    dial_error: Mutex<Option<(Instant, String)>>,
    /// Failed handshakes to this peer are logged at most once a minute.
    dial_error_log: crate::log_every::LogEvery,
}

fn live(c: &Option<Connection>) -> Option<Connection> {
    c.as_ref().filter(|c| c.close_reason().is_none()).cloned()
}

impl PeerLink {
    /// The live sending connection; when it has closed (idle timeout, stateless reset of a
    /// restarted peer) but the peer's own inbound connection is live, that one is promoted.
    fn current(&self) -> Option<Connection> {
        let mut slot = self.slot.lock().expect("slot lock");
        if let Some(c) = live(&slot) {
            return Some(c);
        }
        let extra = self.extra.lock().expect("extra lock").take();
        if let Some(c) = live(&extra) {
            *slot = Some(c.clone());
            return Some(c);
        }
        None
    }

    /// Files a newly established connection: it becomes the sending connection unless a live
    /// one exists, in which case it is kept (receive-only) as the extra, closing an older extra.
    fn install(&self, conn: Connection) {
        let mut slot = self.slot.lock().expect("slot lock");
        if live(&slot).is_none() {
            *slot = Some(conn);
            return;
        }
        drop(slot);
        let old = self.extra.lock().expect("extra lock").replace(conn);
        if let Some(old) = old {
            old.close(VarInt::from_u32(CLOSE_SUPERSEDED), b"superseded");
        }
    }

    fn close_all(&self, code: u32, reason: &[u8]) {
        for c in [
            self.slot.lock().expect("slot lock").take(),
            self.extra.lock().expect("extra lock").take(),
        ]
        .into_iter()
        .flatten()
        {
            c.close(VarInt::from_u32(code), reason);
        }
    }

    /// The sending connection, dialling if there is none.
    async fn connection(&self, shared: &Arc<Shared>) -> Option<Connection> {
        if let Some(c) = self.current() {
            return Some(c);
        }
        let _dialling = self.dial_lock.lock().await;
        if let Some(c) = self.current() {
            return Some(c);
        }
        let failed = *self.last_dial_failure.lock().expect("failure lock");
        if failed.is_some_and(|t| t.elapsed() < DIAL_BACKOFF) {
            return None;
        }
        match shared.dial(self.addr).await {
            Ok((conn, peer)) => {
                *self.dial_error.lock().expect("dial error lock") = None;
                self.install(conn.clone());
                shared.spawn_driver(conn.clone(), self.addr, peer);
                Some(self.current().unwrap_or(conn))
            }
            Err(e) => {
                inc(&shared.counters.connects_failed);
                let now = Instant::now();
                *self.last_dial_failure.lock().expect("failure lock") = Some(now);
                let text = e.to_string();
                if e.is_refusal() {
                    // A peer that answers but refuses us (another CA, an expired certificate,
                    // another region) would otherwise go unexplained on this side: only the
                    // refusing peer logged it (QA: an agent with a certificate of another CA
                    // logged nothing for 70 s and said only "not yet joined").
                    if let Some(held) = self.dial_error_log.check() {
                        tracing::warn!(peer = %self.addr, error = %text, not_logged_since_last = held,
                            "cannot connect to peer: TLS handshake or identity check failed (a certificate of another CA, expired, or of another region?); logged once a minute per peer");
                    }
                } else {
                    tracing::debug!(peer = %self.addr, error = %text, "dial failed");
                }
                *self.dial_error.lock().expect("dial error lock") = Some((now, text));
                None
            }
        }
    }
}

/// `Endpoint::server` with the stateless-reset key and the connection-ID key derived from the
/// node key ([`TlsState::reset_secret`]) instead of random ones: a peer's connection to this node's
/// previous process (killed without a CONNECTION_CLOSE, restarted at the same address) is
/// reset by its first packet here, so the peer dials again at once instead of sending into a
/// dead connection until its idle timeout (issue 15: a kill -9'd agent's new boot took 30-60 s
/// and more to be accepted).
fn bind_endpoint(
    tls: &TlsState,
    server: quinn::ServerConfig,
    listen: SocketAddr,
    received: Arc<AtomicU64>,
) -> std::io::Result<Endpoint> {
    let secret = tls.reset_secret();
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret);
    let mut config = quinn::EndpointConfig::new(Arc::new(key));
    // A stateless reset is only sent for a connection ID this endpoint recognises as one it
    // could have issued (quinn validates the hashed ID first), so the ID generator's key must
    // survive restarts too: derived from the same secret, under its own label.
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(&secret);
    ctx.update(b"connection ids");
    let digest = ctx.finish();
    let mut cid_key = [0u8; 8];
    cid_key.copy_from_slice(&digest.as_ref()[..8]);
    let cid_key = u64::from_le_bytes(cid_key);
    config.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    let socket = std::net::UdpSocket::bind(listen)?;
    let runtime =
        quinn::default_runtime().ok_or_else(|| std::io::Error::other("no async runtime found"))?;
    let socket = Arc::new(CountingSocket {
        inner: runtime.wrap_udp_socket(socket)?,
        received,
    });
    Endpoint::new_with_abstract_socket(config, Some(server), socket, runtime)
}

/// quinn's UDP socket with a count of the datagrams it receives: quinn drops what it cannot
/// use (undecodable, unknown connection IDs) without counting it, so the count has to be taken
/// below it. One relaxed add per receive call.
#[derive(Debug)]
struct CountingSocket {
    inner: Arc<dyn quinn::AsyncUdpSocket>,
    received: Arc<AtomicU64>,
}

impl quinn::AsyncUdpSocket for CountingSocket {
    fn create_io_poller(self: Arc<Self>) -> std::pin::Pin<Box<dyn quinn::UdpPoller>> {
        self.inner.clone().create_io_poller()
    }
    fn try_send(&self, transmit: &quinn::udp::Transmit<'_>) -> std::io::Result<()> {
        self.inner.try_send(transmit)
    }
    fn poll_recv(
        &self,
        cx: &mut std::task::Context<'_>,
        bufs: &mut [std::io::IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = self.inner.poll_recv(cx, bufs, meta);
        if let std::task::Poll::Ready(Ok(n)) = &polled {
            // With GRO one buffer holds several datagrams of `stride` bytes (the last shorter).
            let datagrams: usize = meta[..*n]
                .iter()
                .map(|m| m.len.div_ceil(m.stride.max(1)))
                .sum();
            self.received.fetch_add(datagrams as u64, Ordering::Relaxed);
        }
        polled
    }
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }
    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }
    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

impl DialError {
    /// The peer answered but the connection was refused: a failed TLS handshake (either
    /// side's certificate check, a TLS alert from the peer), an identity we refuse, a close
    /// by the peer. Not a peer that is down or silent (timeouts, resets), which is ordinary.
    fn is_refusal(&self) -> bool {
        match self {
            Self::Handshake(e) => !matches!(
                e,
                quinn::ConnectionError::TimedOut
                    | quinn::ConnectionError::Reset
                    | quinn::ConnectionError::LocallyClosed
            ),
            Self::Identity(_) => true,
            Self::Connect(_) | Self::Hello(_) | Self::HelloClosed(_) => false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum DialError {
    #[error("connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    #[error("handshake: {0}")]
    Handshake(#[from] quinn::ConnectionError),
    #[error("peer identity: {0}")]
    Identity(#[from] CertError),
    #[error("hello: {0}")]
    Hello(#[from] quinn::WriteError),
    #[error("hello: stream closed")]
    HelloClosed(#[from] quinn::ClosedStream),
}

impl Transport {
    /// Binds the endpoint and starts accepting connections.
    ///
    /// Returns the transport and the receiver of every message from verified peers. The
    /// receiver yields `None` after [`Transport::shutdown`] once in-flight deliveries end.
    ///
    /// # Errors
    /// [`TransportError::Cert`] if our certificate is not from `ca_pem`, not for `region`,
    /// expired, or any PEM is malformed; [`TransportError::Tls`] if rustls refuses the key;
    /// [`TransportError::Config`] for a zero limit or an unspecified advertise address;
    /// [`TransportError::Bind`] if the socket cannot be bound.
    ///
    /// # Panics
    /// If called outside a tokio runtime.
    pub fn bind(
        config: TransportConfig,
    ) -> Result<(Self, mpsc::Receiver<Inbound>), TransportError> {
        check_limits(&config)?;
        let tls = match &config.tls {
            Some(t) => {
                if t.region() != &config.region {
                    return Err(TransportError::Cert(CertError::WrongRegion {
                        expected: config.region.clone(),
                        found: Some(t.region().clone()),
                    }));
                }
                t.clone()
            }
            None => TlsState::new(
                &config.region,
                &TlsMaterial {
                    ca_pem: config.ca_pem.clone(),
                    cert_pem: config.cert_pem.clone(),
                    key_pem: config.key_pem.clone(),
                },
            )?,
        };
        let identity = tls.identity().clone();
        let (server, client) = tls_configs(&config, &tls)?;
        let counters = Counters::default();
        let mut endpoint = bind_endpoint(
            &tls,
            server,
            config.listen,
            counters.socket_datagrams_in.clone(),
        )
        .map_err(|source| TransportError::Bind {
            addr: config.listen,
            source,
        })?;
        endpoint.set_default_client_config(client);
        let bound = endpoint
            .local_addr()
            .map_err(|source| TransportError::Bind {
                addr: config.listen,
                source,
            })?;
        let listen = config.advertise.unwrap_or(bound);
        if listen.ip().is_unspecified() || listen.port() == 0 {
            return Err(TransportError::Config(format!(
                "advertise address {listen} is not routable; set `advertise`"
            )));
        }
        let (inbound_tx, inbound_rx) = mpsc::channel(config.inbound_queue_len);
        let shared = Arc::new(Shared {
            endpoint,
            listen,
            identity,
            tls,
            server_name: certs::server_name(&config.region),
            limits: Limits {
                max_connections: config.max_connections,
                max_stream_message_bytes: config.max_stream_message_bytes,
                max_datagram_bytes: config.max_datagram_bytes,
                peer_queue_len: config.peer_queue_len,
                hello_timeout: Duration::from_millis(config.idle_timeout_ms),
            },
            counters,
            cache: Mutex::new(Cache::default()),
            inbound: Mutex::new(Some(inbound_tx)),
            closing: AtomicBool::new(false),
            closed_tx: watch::channel(false).0,
            handshakes_pending: AtomicU64::new(0),
        });
        let accept_task = tokio::spawn(accept_loop(shared.clone()));
        tracing::info!(%listen, identity = %shared.identity, "transport bound");
        Ok((
            Self {
                shared,
                accept_task,
            },
            inbound_rx,
        ))
    }

    /// The listen address announced to peers (what membership should gossip).
    pub fn listen_addr(&self) -> SocketAddr {
        self.shared.listen
    }

    /// This node's identity, from its own certificate.
    pub fn identity(&self) -> &NodeIdentity {
        &self.shared.identity
    }

    /// The TLS material this transport presents and trusts; [`TlsState::reload`] on it
    /// changes what new connections use.
    pub fn tls(&self) -> &TlsState {
        &self.shared.tls
    }

    /// The certificate the peer at `to` presented on the connection this transport currently
    /// sends to it on (`None` without a live connection). A diagnostic: after a peer rotated
    /// its certificate, an old connection still shows the old one.
    pub fn peer_certificate(&self, to: SocketAddr) -> Option<CertInfo> {
        let link = self
            .shared
            .cache
            .lock()
            .expect("cache lock")
            .peers
            .get(&to)?
            .link
            .clone();
        let conn = link.current()?;
        let certs = conn
            .peer_identity()?
            .downcast::<Vec<CertificateDer<'static>>>()
            .ok()?;
        CertInfo::from_der(certs.first()?).ok()
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> TransportCounters {
        self.shared.counters.snapshot()
    }

    /// QUIC packet and frame counts over all connections; see [`QuicCounters`].
    pub fn quic_counters(&self) -> QuicCounters {
        self.shared.quic_counters()
    }

    /// A handle that reads [`Transport::quic_counters`] without owning the transport.
    pub fn quic_counters_handle(&self) -> QuicCountersHandle {
        QuicCountersHandle(Arc::downgrade(&self.shared))
    }

    /// Number of peers in the connection cache (at most `max_connections`).
    pub fn cached_peers(&self) -> usize {
        self.shared.cache.lock().expect("cache lock").peers.len()
    }

    /// Enqueues one datagram to the peer listening at `to`, dialling on demand. Never blocks.
    ///
    /// Delivery is best-effort, as for UDP: a datagram that quinn's current path limit cannot
    /// carry, or that finds no connection, is dropped and counted after it was enqueued.
    ///
    /// # Errors
    /// [`SendError::Oversize`] above `max_datagram_bytes`, [`SendError::QueueFull`],
    /// [`SendError::ShutDown`]. Each is counted; nothing is enqueued.
    pub fn send_datagram(&self, to: SocketAddr, bytes: impl Into<Bytes>) -> Result<(), SendError> {
        self.enqueue(to, bytes.into(), Channel::Datagram)
    }

    /// Enqueues one stream message to the peer listening at `to`, dialling on demand. Never
    /// blocks. The message travels on its own uni-directional stream.
    ///
    /// # Errors
    /// [`SendError::Oversize`] above `max_stream_message_bytes`, [`SendError::QueueFull`],
    /// [`SendError::ShutDown`]. Each is counted; nothing is enqueued.
    pub fn send_stream_message(
        &self,
        to: SocketAddr,
        bytes: impl Into<Bytes>,
    ) -> Result<(), SendError> {
        self.enqueue(to, bytes.into(), Channel::Stream)
    }

    fn enqueue(&self, to: SocketAddr, bytes: Bytes, channel: Channel) -> Result<(), SendError> {
        let shared = &self.shared;
        if shared.closing.load(Ordering::Acquire) {
            return Err(SendError::ShutDown);
        }
        let max = match channel {
            Channel::Datagram => shared.limits.max_datagram_bytes,
            Channel::Stream => shared.limits.max_stream_message_bytes,
        };
        if bytes.len() > max {
            inc(&shared.counters.oversize_dropped);
            return Err(SendError::Oversize {
                len: bytes.len(),
                max,
            });
        }
        let queue = shared.queue(to, channel);
        queue.try_send(bytes).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                inc(&shared.counters.queue_overflow);
                SendError::QueueFull
            }
            mpsc::error::TrySendError::Closed(_) => SendError::ShutDown,
        })
    }

    /// Closes every connection and the endpoint, and waits (at most one second) for the close
    /// to reach peers. Idempotent. Sends fail with [`SendError::ShutDown`] afterwards.
    pub async fn shutdown(&self) {
        self.shared.close_now();
        self.accept_task.abort();
        let idle = self.shared.endpoint.wait_idle();
        if tokio::time::timeout(Duration::from_secs(1), idle)
            .await
            .is_err()
        {
            tracing::debug!("transport shutdown: endpoint not idle after 1 s");
        }
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.shared.close_now();
        self.accept_task.abort();
    }
}

fn check_limits(c: &TransportConfig) -> Result<(), TransportError> {
    let zero = [
        ("max_connections", c.max_connections),
        ("max_stream_message_bytes", c.max_stream_message_bytes),
        ("max_datagram_bytes", c.max_datagram_bytes),
        ("peer_queue_len", c.peer_queue_len),
        ("inbound_queue_len", c.inbound_queue_len),
        ("idle_timeout_ms", c.idle_timeout_ms as usize),
    ];
    if let Some((name, _)) = zero.iter().find(|(_, v)| *v == 0) {
        return Err(TransportError::Config(format!("{name} must be > 0")));
    }
    if c.keep_alive_ms >= c.idle_timeout_ms {
        return Err(TransportError::Config(format!(
            "keep_alive_ms ({}) must be below idle_timeout_ms ({})",
            c.keep_alive_ms, c.idle_timeout_ms
        )));
    }
    Ok(())
}

fn tls_configs(
    config: &TransportConfig,
    tls: &TlsState,
) -> Result<(quinn::ServerConfig, quinn::ClientConfig), TransportError> {
    let provider = tls.provider();
    let dynamic = tls.dynamic();
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(dynamic.clone())
        .with_cert_resolver(dynamic.clone());
    server.alpn_protocols = vec![ALPN.to_vec()];
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(dynamic.clone())
        .with_client_cert_resolver(dynamic);
    client.alpn_protocols = vec![ALPN.to_vec()];

    let transport = Arc::new(transport_config(config)?);
    let server_crypto = QuicServerConfig::try_from(server)
        .map_err(|e| TransportError::Config(format!("QUIC server TLS: {e}")))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto));
    server.transport_config(transport.clone());
    let client_crypto = QuicClientConfig::try_from(client)
        .map_err(|e| TransportError::Config(format!("QUIC client TLS: {e}")))?;
    let mut client = quinn::ClientConfig::new(Arc::new(client_crypto));
    client.transport_config(transport);
    Ok((server, client))
}

fn transport_config(config: &TransportConfig) -> Result<quinn::TransportConfig, TransportError> {
    let mut t = quinn::TransportConfig::default();
    let idle = quinn::IdleTimeout::try_from(Duration::from_millis(config.idle_timeout_ms))
        .map_err(|_| TransportError::Config("idle_timeout_ms too large".into()))?;
    t.max_idle_timeout(Some(idle));
    t.keep_alive_interval(
        (config.keep_alive_ms > 0).then(|| Duration::from_millis(config.keep_alive_ms)),
    );
    if config.initial_mtu < 1200 {
        return Err(TransportError::Config("initial_mtu must be >= 1200".into()));
    }
    t.initial_mtu(config.initial_mtu);
    t.max_concurrent_bidi_streams(VarInt::from_u32(0));
    t.max_concurrent_uni_streams(VarInt::from_u32(MAX_UNI_STREAMS));
    t.receive_window(VarInt::from_u32(RECEIVE_WINDOW_BYTES));
    // Room for a burst of SWIM datagrams; quinn also advertises this as the largest datagram
    // frame it accepts, so it must be at least one max-size datagram.
    t.datagram_receive_buffer_size(Some((config.max_datagram_bytes * 64).max(64 << 10)));
    Ok(t)
}
