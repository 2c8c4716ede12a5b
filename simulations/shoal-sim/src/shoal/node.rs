//! One simulated agent: a real `Mesh` and the event tap.

use super::*;

/// One simulated agent: a real [`Mesh`] plus an event tap. The mesh keeps its own timers; the
/// engine gets one event per armed timer ([`Mesh::poll_armed`]) and hands its token back, so
/// timers take their place in the engine's (time, sequence) order as they always did
/// (docs/adr/0021-core-owned-timers.md).
pub struct ShoalNode {
    pub(super) index: u32,
    pub(super) mesh: Mesh<SharedKeys>,
    pub(super) observer: Rc<RefCell<Observer>>,
}

impl ShoalNode {
    /// The mesh core.
    pub fn mesh(&self) -> &Mesh<SharedKeys> {
        &self.mesh
    }

    /// Runs a command and taps the resulting events; a refusal is the core's answer (also
    /// counted in its `MeshCounters::refused`).
    ///
    /// # Errors
    /// The core's [`shoal_mesh::Refusal`].
    pub fn command(&mut self, now_ms: u64, cmd: Command) -> Result<(), shoal_mesh::Refusal> {
        let r = self.mesh.handle_command(now_ms, cmd);
        self.tap(now_ms);
        r
    }

    pub(super) fn tap(&mut self, now_ms: u64) {
        let mut obs = self.observer.borrow_mut();
        while let Some(ev) = self.mesh.poll_event() {
            obs.on_event(self.index, now_ms, ev);
        }
    }
}

impl SimNode for ShoalNode {
    fn handle_datagram(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]) {
        self.mesh.handle_datagram(now_ms, from, bytes);
        self.tap(now_ms);
    }

    fn handle_stream_message(&mut self, now_ms: u64, from: SocketAddr, bytes: &[u8]) {
        self.mesh.handle_stream_message(now_ms, from, bytes);
        self.tap(now_ms);
    }

    fn handle_timer(&mut self, now_ms: u64, token: u64) {
        self.mesh.handle_timer(now_ms, TimerToken::from_u64(token));
        self.tap(now_ms);
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        let t = self.mesh.poll_transmit()?;
        Some(Transmit {
            to: t.to,
            channel: match t.channel {
                shoal_mesh::Channel::Datagram => Channel::Datagram,
                shoal_mesh::Channel::Stream => Channel::Stream,
            },
            bytes: t.bytes,
        })
    }

    fn poll_timer(&mut self) -> Option<(u64, u64)> {
        let (at, token) = self.mesh.poll_armed()?;
        Some((at, token.to_u64()))
    }
}
