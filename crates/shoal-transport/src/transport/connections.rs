//! The connection machinery behind [`super::Transport`]: the peer cache and its eviction,
//! dialling, the accept loop, one driver task per connection reading datagrams and streams, the
//! per-peer sender tasks, and the hello stream that names a dialler's listen address.

use super::*;
use crate::log_every::LogEvery;

impl Shared {
    /// Ended connections' counts plus the live ones' (each live connection's stats locked once).
    pub(super) fn quic_counters(&self) -> QuicCounters {
        let links: Vec<Arc<PeerLink>> = {
            let cache = self.cache.lock().expect("cache lock");
            cache.peers.values().map(|e| e.link.clone()).collect()
        };
        // The socket's count first: a datagram a connection takes after this read then shows
        // as claimed, never as dropped.
        let socket_datagrams_in = self.counters.socket_datagrams_in.load(Ordering::Relaxed);
        let mut sum = *self.counters.quic_ended.lock().expect("quic lock");
        sum.socket_datagrams_in = socket_datagrams_in;
        for link in links {
            let slot = live(&link.slot.lock().expect("slot lock"));
            let extra = live(&link.extra.lock().expect("extra lock"));
            for c in slot.iter().chain(extra.iter()) {
                sum.add(&QuicCounters::of(&c.stats()));
            }
        }
        sum
    }

    /// Marks the transport closed, drops the inbound sender, aborts peer tasks, closes the
    /// endpoint. Safe to call more than once.
    pub(super) fn close_now(&self) {
        self.closing.store(true, Ordering::Release);
        self.closed_tx.send_replace(true);
        self.inbound.lock().expect("inbound lock").take();
        let peers = std::mem::take(&mut self.cache.lock().expect("cache lock").peers);
        for (_, entry) in peers {
            entry.tasks.iter().for_each(JoinHandle::abort);
            entry.link.close_all(CLOSE_SHUTDOWN, b"shutdown");
        }
        self.endpoint
            .close(VarInt::from_u32(CLOSE_SHUTDOWN), b"shutdown");
    }

    /// The send queue of `channel` for `to`, creating the peer (and evicting the least recently
    /// used one when full) if needed. Marks the peer as used.
    ///
    /// Every datagram goes through the queue and the peer's sender task, even to a live
    /// connection: handing it to quinn from the caller saved a task wake-up per SWIM datagram,
    /// but made `authority_faults::restore_starts_a_new_cluster_above_every_acknowledged_revision`
    /// fail 3 times in 13 (0 in 11 without it; found by `git bisect`, 2026-12-02), so it was
    /// taken out until that race is understood.
    pub(super) fn queue(self: &Arc<Self>, to: SocketAddr, channel: Channel) -> mpsc::Sender<Bytes> {
        let mut cache = self.cache.lock().expect("cache lock");
        let entry = self.entry(&mut cache, to);
        match channel {
            Channel::Datagram => entry.datagrams.clone(),
            Channel::Stream => entry.streams.clone(),
        }
    }

    /// Hands one datagram to quinn on `conn`, checked against the path's current limit;
    /// every outcome is counted (`datagrams_out`, `oversize_dropped`, `send_errors`).
    pub(super) fn send_datagram_on(&self, conn: &Connection, bytes: Bytes) {
        let c = &self.counters;
        let len = bytes.len();
        match conn.max_datagram_size() {
            None => {
                inc(&c.send_errors);
                return;
            }
            Some(max) if len > max => {
                inc(&c.oversize_dropped);
                tracing::debug!(len, max, "datagram above the path limit dropped");
                return;
            }
            Some(_) => {}
        }
        match conn.send_datagram(bytes) {
            Ok(()) => {
                inc(&c.datagrams_out);
                add(&c.bytes_out, len);
            }
            Err(quinn::SendDatagramError::TooLarge) => inc(&c.oversize_dropped),
            Err(_) => inc(&c.send_errors),
        }
    }

    pub(super) fn link(self: &Arc<Self>, to: SocketAddr) -> Arc<PeerLink> {
        let mut cache = self.cache.lock().expect("cache lock");
        self.entry(&mut cache, to).link.clone()
    }

    pub(super) fn entry<'c>(
        self: &Arc<Self>,
        cache: &'c mut Cache,
        to: SocketAddr,
    ) -> &'c mut PeerEntry {
        cache.tick += 1;
        let tick = cache.tick;
        if !cache.peers.contains_key(&to) {
            if cache.peers.len() >= self.limits.max_connections {
                self.evict_lru(cache);
            }
            cache.peers.insert(to, self.new_entry(to));
        }
        debug_assert!(cache.peers.len() <= self.limits.max_connections);
        let entry = cache.peers.get_mut(&to).expect("just inserted");
        entry.last_used = tick;
        entry
    }

    /// O(n) scan for the least recently used peer: n is at most `max_connections` and this
    /// runs only when a new peer is added to a full cache.
    pub(super) fn evict_lru(&self, cache: &mut Cache) {
        let Some(victim) = cache
            .peers
            .iter()
            .min_by_key(|(_, e)| e.last_used)
            .map(|(addr, _)| *addr)
        else {
            return;
        };
        let entry = cache.peers.remove(&victim).expect("victim exists");
        entry.tasks.iter().for_each(JoinHandle::abort);
        entry.link.close_all(CLOSE_EVICTED, b"evicted");
        inc(&self.counters.connections_evicted);
        tracing::debug!(peer = %victim, "evicted from connection cache");
    }

    pub(super) fn new_entry(self: &Arc<Self>, addr: SocketAddr) -> PeerEntry {
        let link = Arc::new(PeerLink {
            addr,
            slot: Mutex::new(None),
            extra: Mutex::new(None),
            dial_lock: tokio::sync::Mutex::new(()),
            last_dial_failure: Mutex::new(None),
            dial_error: Mutex::new(None),
            dial_error_log: LogEvery::new(),
        });
        let (dtx, drx) = mpsc::channel(self.limits.peer_queue_len);
        let (stx, srx) = mpsc::channel(self.limits.peer_queue_len);
        let tasks = [
            tokio::spawn(datagram_sender(self.clone(), link.clone(), drx)),
            tokio::spawn(stream_sender(self.clone(), link.clone(), srx)),
        ];
        PeerEntry {
            link,
            datagrams: dtx,
            streams: stx,
            tasks,
            last_used: 0,
        }
    }

    /// Dials `addr`, checks the server's identity, and sends our hello.
    pub(super) async fn dial(
        &self,
        addr: SocketAddr,
    ) -> Result<(Connection, NodeIdentity), DialError> {
        let conn = self.endpoint.connect(addr, &self.server_name)?.await?;
        let peer = match self.check_peer(&conn) {
            Ok(peer) => peer,
            Err(e) => {
                inc(&self.counters.handshakes_refused);
                conn.close(VarInt::from_u32(CLOSE_REFUSED), b"identity refused");
                return Err(e.into());
            }
        };
        let mut hello = conn.open_uni().await?;
        hello.write_all(&encode_hello(self.listen)).await?;
        hello.finish()?;
        Ok((conn, peer))
    }

    /// The verified peer's identity, refused unless it is of our region.
    pub(super) fn check_peer(&self, conn: &Connection) -> Result<NodeIdentity, CertError> {
        let certs = conn
            .peer_identity()
            .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
            .ok_or_else(|| CertError::NoIdentity("peer presented no certificate".into()))?;
        let leaf = certs
            .first()
            .ok_or_else(|| CertError::NoIdentity("empty certificate chain".into()))?;
        let peer = NodeIdentity::from_cert(leaf)?;
        if peer.region != self.identity.region {
            return Err(CertError::WrongRegion {
                expected: self.identity.region.clone(),
                found: Some(peer.region),
            });
        }
        Ok(peer)
    }

    pub(super) fn spawn_driver(
        self: &Arc<Self>,
        conn: Connection,
        from: SocketAddr,
        peer: NodeIdentity,
    ) {
        let Some(tx) = self.inbound.lock().expect("inbound lock").clone() else {
            conn.close(VarInt::from_u32(CLOSE_SHUTDOWN), b"shutdown");
            return;
        };
        tokio::spawn(drive(self.clone(), conn, from, peer, tx));
    }
}

pub(super) async fn accept_loop(shared: Arc<Shared>) {
    while let Some(incoming) = shared.endpoint.accept().await {
        let pending = shared.handshakes_pending.load(Ordering::Acquire);
        if pending >= shared.limits.max_connections as u64 {
            inc(&shared.counters.handshakes_refused);
            log_refusal(incoming.remote_address(), "too many handshakes in progress");
            incoming.refuse();
            continue;
        }
        shared.handshakes_pending.fetch_add(1, Ordering::AcqRel);
        let s = shared.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            if let Err(reason) = accept_one(&s, incoming).await {
                inc(&s.counters.handshakes_refused);
                log_refusal(remote, &reason);
            }
            s.handshakes_pending.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// What a refusal reason is about (its text up to the first `:`); each is logged at most once
/// per [`LOG_INTERVAL`](crate::log_every::LOG_INTERVAL).
const REFUSAL_KINDS: [&str; 5] = [
    "handshake",
    "identity",
    "hello",
    "too many handshakes in progress",
    "other",
];

/// Logs an inbound refusal once per interval per kind (every refusal is counted in
/// `handshakes_refused`): a peer that redials with a foreign certificate would otherwise write
/// a line per attempt, for as long as it likes.
fn log_refusal(remote: SocketAddr, reason: &str) {
    static LOGS: [LogEvery; REFUSAL_KINDS.len()] = [
        LogEvery::new(),
        LogEvery::new(),
        LogEvery::new(),
        LogEvery::new(),
        LogEvery::new(),
    ];
    let head = reason.split(':').next().unwrap_or(reason);
    let kind = REFUSAL_KINDS
        .iter()
        .position(|k| head.starts_with(k) || (*k == "hello" && head.contains("hello")))
        .unwrap_or(REFUSAL_KINDS.len() - 1);
    if let Some(held) = LOGS[kind].check() {
        tracing::warn!(%remote, %reason, kind = REFUSAL_KINDS[kind], not_logged_since_last = held,
            "inbound connection refused (logged once a minute per kind; all are counted in handshakes_refused)");
    }
}

/// Completes one inbound handshake, checks identity, reads the hello, files the connection.
pub(super) async fn accept_one(
    shared: &Arc<Shared>,
    incoming: quinn::Incoming,
) -> Result<(), String> {
    let conn = incoming.await.map_err(|e| format!("handshake: {e}"))?;
    let refuse = |why: String| {
        conn.close(VarInt::from_u32(CLOSE_REFUSED), b"refused");
        why
    };
    let peer = shared
        .check_peer(&conn)
        .map_err(|e| refuse(format!("identity: {e}")))?;
    let hello = tokio::time::timeout(shared.limits.hello_timeout, async {
        let mut stream = conn.accept_uni().await.map_err(|e| e.to_string())?;
        stream
            .read_to_end(HELLO_MAX_BYTES)
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|_| "no hello in time".to_string())
    .and_then(|r| r)
    .map_err(|e| refuse(format!("hello: {e}")))?;
    let from = decode_hello(&hello).ok_or_else(|| refuse("malformed hello".into()))?;
    tracing::debug!(%from, %peer, "inbound connection");
    shared.link(from).install(conn.clone());
    shared.spawn_driver(conn, from, peer);
    Ok(())
}

/// Reads datagrams and streams of one connection until it closes.
pub(super) async fn drive(
    shared: Arc<Shared>,
    conn: Connection,
    from: SocketAddr,
    peer: NodeIdentity,
    tx: mpsc::Sender<Inbound>,
) {
    inc(&shared.counters.connections_open);
    inc(&shared.counters.connections_established);
    let mut closed = shared.closed_tx.subscribe();
    let datagrams = async {
        while let Ok(bytes) = conn.read_datagram().await {
            receive_datagram(&shared, &tx, from, &peer, bytes);
        }
    };
    let streams = async {
        while let Ok(recv) = conn.accept_uni().await {
            tokio::spawn(receive_stream(
                shared.clone(),
                tx.clone(),
                from,
                peer.clone(),
                recv,
            ));
        }
    };
    tokio::select! {
        () = datagrams => {}
        () = streams => {}
        _ = closed.wait_for(|c| *c) => {}
    }
    shared
        .counters
        .connections_open
        .fetch_sub(1, Ordering::Relaxed);
    let ended = QuicCounters::of(&conn.stats());
    shared
        .counters
        .quic_ended
        .lock()
        .expect("quic lock")
        .add(&ended);
    tracing::debug!(%from, %peer, reason = ?conn.close_reason(), "connection ended");
}

pub(super) fn receive_datagram(
    shared: &Shared,
    tx: &mpsc::Sender<Inbound>,
    from: SocketAddr,
    peer: &NodeIdentity,
    bytes: Bytes,
) {
    let c = &shared.counters;
    if bytes.len() > shared.limits.max_datagram_bytes {
        inc(&c.oversize_dropped);
        return;
    }
    inc(&c.datagrams_in);
    add(&c.bytes_in, bytes.len());
    let msg = Inbound {
        from,
        peer: peer.clone(),
        channel: Channel::Datagram,
        bytes: bytes.to_vec(),
    };
    if tx.try_send(msg).is_err() {
        inc(&c.inbound_dropped);
    }
}

pub(super) async fn receive_stream(
    shared: Arc<Shared>,
    tx: mpsc::Sender<Inbound>,
    from: SocketAddr,
    peer: NodeIdentity,
    mut recv: quinn::RecvStream,
) {
    let c = &shared.counters;
    let bytes = match recv
        .read_to_end(shared.limits.max_stream_message_bytes)
        .await
    {
        Ok(bytes) => bytes,
        Err(quinn::ReadToEndError::TooLong) => {
            inc(&c.oversize_dropped);
            let _ = recv.stop(VarInt::from_u32(STREAM_TOO_LARGE));
            tracing::debug!(%from, %peer, "oversize stream message dropped");
            return;
        }
        Err(e) => {
            tracing::debug!(%from, %peer, error = %e, "stream message lost");
            return;
        }
    };
    inc(&c.stream_msgs_in);
    add(&c.bytes_in, bytes.len());
    let msg = Inbound {
        from,
        peer,
        channel: Channel::Stream,
        bytes,
    };
    let mut closed = shared.closed_tx.subscribe();
    tokio::select! {
        _ = tx.send(msg) => {}
        _ = closed.wait_for(|c| *c) => {}
    }
}

pub(super) async fn datagram_sender(
    shared: Arc<Shared>,
    link: Arc<PeerLink>,
    mut rx: mpsc::Receiver<Bytes>,
) {
    while let Some(bytes) = rx.recv().await {
        let Some(conn) = link.connection(&shared).await else {
            inc(&shared.counters.send_errors);
            continue;
        };
        shared.send_datagram_on(&conn, bytes);
    }
}

pub(super) async fn stream_sender(
    shared: Arc<Shared>,
    link: Arc<PeerLink>,
    mut rx: mpsc::Receiver<Bytes>,
) {
    let c = &shared.counters;
    while let Some(bytes) = rx.recv().await {
        let Some(conn) = link.connection(&shared).await else {
            inc(&c.send_errors);
            continue;
        };
        let len = bytes.len();
        let sent = async {
            let mut send = conn.open_uni().await.map_err(|e| e.to_string())?;
            send.write_all(&bytes).await.map_err(|e| e.to_string())?;
            send.finish().map_err(|e| e.to_string())
        };
        match sent.await {
            Ok(()) => {
                inc(&c.stream_msgs_out);
                add(&c.bytes_out, len);
            }
            Err(e) => {
                inc(&c.send_errors);
                tracing::debug!(peer = %link.addr, error = %e, "stream message not sent");
            }
        }
    }
}

/// `"SH" version family ip port`: family 4 (4-byte ip) or 6 (16-byte ip), port big-endian.
pub(super) fn encode_hello(addr: SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(HELLO_MAX_BYTES);
    out.extend_from_slice(&HELLO_MAGIC);
    out.push(HELLO_VERSION);
    match addr.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&addr.port().to_be_bytes());
    debug_assert!(out.len() <= HELLO_MAX_BYTES);
    out
}

pub(super) fn decode_hello(bytes: &[u8]) -> Option<SocketAddr> {
    let rest = bytes.strip_prefix(&HELLO_MAGIC)?;
    let (&version, rest) = rest.split_first()?;
    if version != HELLO_VERSION {
        return None;
    }
    let (&family, rest) = rest.split_first()?;
    let (ip, rest): (IpAddr, &[u8]) = match family {
        4 => {
            let (ip, rest) = rest.split_first_chunk::<4>()?;
            (Ipv4Addr::from(*ip).into(), rest)
        }
        6 => {
            let (ip, rest) = rest.split_first_chunk::<16>()?;
            (Ipv6Addr::from(*ip).into(), rest)
        }
        _ => return None,
    };
    let port = u16::from_be_bytes(*<&[u8; 2]>::try_from(rest).ok()?);
    let addr = SocketAddr::new(ip, port);
    (!ip.is_unspecified() && port != 0).then_some(addr)
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_rejects_garbage() {
        for a in ["127.0.0.1:7946", "[::1]:9000", "10.1.2.3:1"] {
            let addr: SocketAddr = a.parse().unwrap();
            assert_eq!(decode_hello(&encode_hello(addr)), Some(addr));
        }
        let good = encode_hello("127.0.0.1:7946".parse().unwrap());
        assert_eq!(decode_hello(&good[..good.len() - 1]), None);
        let mut long = good.clone();
        long.push(0);
        assert_eq!(decode_hello(&long), None);
        assert_eq!(decode_hello(b"XX\x01\x04\x7f\x00\x00\x01\x1f\x0a"), None);
        assert_eq!(
            decode_hello(&encode_hello("0.0.0.0:1".parse().unwrap())),
            None
        );
        assert_eq!(
            decode_hello(&encode_hello("1.2.3.4:0".parse().unwrap())),
            None
        );
    }
}
