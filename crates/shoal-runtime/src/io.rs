//! [`MeshIo`]: the one place a daemon's mesh core meets its transport.
//!
//! The loop every driver runs (agent `driver.rs`, authority `member.rs`):
//!
//! ```text
//!   transport inbound ──► feed_inbound ───┐
//!   timer_due()       ──► Mesh::handle_timeout ┤   Mesh::handle_*  ──►  collect  ──► dispatch
//!   host commands     ──► (host code) ────┘                           │            │
//!                                                   transmits ──────┘──► send (errors counted)
//!                                                   poll_timeout ───────► next deadline
//!                                                   events    ──────────► returned to the host
//! ```
//!
//! The core keeps its own timers (`shoal_mesh::mesh` module docs): all a driver holds is the
//! core's next deadline as of the last input, which [`MeshIo::collect`] reads with the outputs
//! and [`MeshIo::dispatch`] keeps for [`MeshIo::timer_due`].
//!
//! [`MeshIo::collect`] takes only the mesh, so a host that keeps its mesh behind a lock (the
//! agent) drains under the lock and sends after releasing it; a host that owns its mesh (the
//! authority member) calls [`MeshIo::pump`].
//!
//! Polling order: the outputs are independent queues; none has to be drained first.
//!
//! The boot file: a member declared down renews its SWIM identity (boot + 1) inside the core,
//! which then queues datagrams announcing it. With a [`BootFile`] attached
//! ([`MeshIo::with_boot_file`]), [`MeshIo::dispatch`] writes the identity's boot to the file
//! before it sends anything, so a later restart starts above every boot this life used.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use shoal_catalog::Verifier;
use shoal_mesh::{Channel, Mesh, MeshEvent, Transmit};
use shoal_proto::Generation;
use shoal_transport::transport::{Channel as TChannel, Inbound, Transport, TransportCounters};

use crate::boot::{BootFile, BootRecord};
use crate::clock::MonoClock;

/// How long the LEAVE announcement gets to go out before the transport closes, ms.
pub const LEAVE_GRACE_MS: u64 = 100;

/// Everything the core had queued after one input (see [`MeshIo::collect`]).
#[derive(Debug, Default)]
#[must_use = "outputs that are not dispatched are lost"]
pub struct Outputs {
    transmits: Vec<Transmit>,
    events: Vec<MeshEvent>,
    /// The core's next timer deadline after the input, monotonic ms.
    next_timeout_ms: Option<u64>,
    /// The boot of the core's SWIM identity after the input: what the transmits announce.
    boot: Generation,
}

impl Outputs {
    /// True when the core had nothing to send or report.
    pub fn is_empty(&self) -> bool {
        self.transmits.is_empty() && self.events.is_empty()
    }
}

/// The transport, the core's next timer deadline and the clock of one mesh member.
#[derive(Debug)]
pub struct MeshIo {
    transport: Transport,
    /// The core's earliest timer deadline as of the last [`MeshIo::dispatch`], ms.
    next_timeout_ms: Option<u64>,
    clock: MonoClock,
    send_errors: u64,
    /// Where the member's boot generation is persisted; `None`: not persisted (tests).
    boot_file: Option<BootFile>,
}

impl MeshIo {
    /// Wraps a bound transport; `clock` is the monotonic clock every input is stamped with.
    pub fn new(transport: Transport, clock: MonoClock) -> Self {
        Self {
            transport,
            next_timeout_ms: None,
            clock,
            send_errors: 0,
            boot_file: None,
        }
    }

    /// Attaches the member's boot file (opened at start with [`BootFile::bump`]): from now on
    /// [`MeshIo::dispatch`] writes every renewed boot generation to it before sending.
    #[must_use]
    pub fn with_boot_file(mut self, boot_file: BootFile) -> Self {
        self.boot_file = Some(boot_file);
        self
    }

    /// The boot file, when one is attached (its counters feed the metrics).
    pub fn boot_file(&self) -> Option<&BootFile> {
        self.boot_file.as_ref()
    }

    /// The transport (identity, counters, direct sends of non-mesh messages).
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// The transport's counters.
    pub fn transport_counters(&self) -> TransportCounters {
        self.transport.counters()
    }

    /// The clock.
    pub fn clock(&self) -> MonoClock {
        self.clock
    }

    /// Monotonic ms now.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Mesh transmits the transport refused since start (queue full, oversize, shut down;
    /// the transport's own counters say which).
    pub fn send_errors(&self) -> u64 {
        self.send_errors
    }

    /// The core's next timer deadline as of the last dispatch, monotonic ms.
    pub fn next_timeout_ms(&self) -> Option<u64> {
        self.next_timeout_ms
    }

    /// Takes every queued output of `mesh` and its next timer deadline. No IO: cheap enough
    /// to call under a lock.
    pub fn collect<V: Verifier>(mesh: &mut Mesh<V>) -> Outputs {
        let mut out = Outputs::default();
        while let Some(t) = mesh.poll_transmit() {
            out.transmits.push(t);
        }
        while let Some(e) = mesh.poll_event() {
            out.events.push(e);
        }
        out.next_timeout_ms = mesh.poll_timeout();
        out.boot = mesh.membership().identity().boot;
        out
    }

    /// Sends the transmits (a refused send is counted in [`send_errors`](Self::send_errors);
    /// SWIM and anti-entropy repair what is lost), keeps the core's next deadline for
    /// [`MeshIo::timer_due`] and returns the events for the host, in the order the core
    /// produced them.
    ///
    /// First, when the core renewed its identity (declared down, it rejoins under boot + 1)
    /// and a boot file is attached, the new boot is written to it ([`BootFile::record`]:
    /// atomic write and fsync), so nothing goes out under a generation the file does not hold.
    /// If that write fails the transmits are sent all the same, the failure logged and
    /// counted, and the write retried by a later dispatch (see [`BootFile::record`] for why).
    #[must_use = "the events are the host's to handle"]
    pub fn dispatch(&mut self, out: Outputs) -> Vec<MeshEvent> {
        if let Some(file) = self.boot_file.as_mut() {
            // Failures are logged and counted by the file itself.
            let _: BootRecord = file.record(self.clock.now_ms(), out.boot);
        }
        for t in out.transmits {
            let sent = match t.channel {
                Channel::Datagram => self.transport.send_datagram(t.to, t.bytes),
                Channel::Stream => self.transport.send_stream_message(t.to, t.bytes),
            };
            if sent.is_err() {
                self.send_errors += 1;
            }
        }
        self.next_timeout_ms = out.next_timeout_ms;
        out.events
    }

    /// Feeds one input to an owned mesh at the current time and dispatches what it produced:
    /// `(input's result, events)`.
    pub fn pump<V: Verifier, R>(
        &mut self,
        mesh: &mut Mesh<V>,
        input: impl FnOnce(&mut Mesh<V>, u64) -> R,
    ) -> (R, Vec<MeshEvent>) {
        let r = input(mesh, self.now_ms());
        let out = Self::collect(mesh);
        (r, self.dispatch(out))
    }

    /// Hands one inbound transport message to the mesh (datagrams are SWIM, stream messages
    /// are records). The caller has already taken out any stream kind that is not the mesh's.
    pub fn feed_inbound<V: Verifier>(mesh: &mut Mesh<V>, now_ms: u64, msg: &Inbound) {
        match msg.channel {
            TChannel::Datagram => mesh.handle_datagram(now_ms, msg.from, &msg.bytes),
            TChannel::Stream => mesh.handle_stream_message(now_ms, msg.from, &msg.bytes),
        }
    }

    /// The core's next timer deadline as of the last dispatch, on tokio's clock: for a driver
    /// that keeps one `Sleep` and re-arms it only when this moves (the agent), instead of
    /// building a new one per input as [`MeshIo::timer_due`] does.
    pub fn next_deadline(&self) -> Option<tokio::time::Instant> {
        self.next_timeout_ms.map(|ms| self.clock.at(ms))
    }

    /// Resolves at the core's next timer deadline (as of the last dispatch); never while none
    /// is armed. Then feed `Mesh::handle_timeout(now)` like any input. For a `tokio::select!`
    /// branch (it borrows `self` only until it is polled to completion).
    pub fn timer_due(&self) -> impl Future<Output = ()> {
        let at = self.next_timeout_ms.map(|ms| self.clock.at(ms));
        async move {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        }
    }

    /// Sends a non-mesh stream message (the agent's authority RPC) on the same endpoint.
    ///
    /// # Errors
    /// The transport's [`SendError`](shoal_transport::transport::SendError).
    pub fn send_stream(
        &self,
        to: SocketAddr,
        bytes: Vec<u8>,
    ) -> Result<(), shoal_transport::transport::SendError> {
        self.transport.send_stream_message(to, bytes)
    }

    /// The tail of a graceful leave: the host has fed `Command::Leave` and dispatched its
    /// outputs; this gives the LEAVE datagrams [`LEAVE_GRACE_MS`] to go out, then closes the
    /// transport.
    pub async fn close(self) {
        tokio::time::sleep(Duration::from_millis(LEAVE_GRACE_MS)).await;
        self.transport.shutdown().await;
    }
}
