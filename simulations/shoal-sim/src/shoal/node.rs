//! One simulated agent: a real `Mesh` and the event tap.

use super::*;

/// One simulated agent: a real [`Mesh`] plus an event tap. The mesh keeps its own timers; the
/// engine gets one event per armed timer ([`Mesh::poll_armed`]) and hands its token back, so
/// timers take their place in the engine's (time, sequence) order as they always did
/// (docs/adr/0021-core-owned-timers.md).
pub struct ShoalNode {
    pub(super) index: u32,
    pub(super) mesh: Mesh<SharedKeys>,
    pub(super) observer: SharedObserver,
    /// Events of the input being handled, with the node's time, not yet given to the
    /// observer ([`SimNode::Note`]).
    pub(super) notes: Vec<(u64, MeshEvent)>,
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
        self.publish_notes();
        r
    }

    pub(super) fn tap(&mut self, now_ms: u64) {
        while let Some(ev) = self.mesh.poll_event() {
            self.notes.push((now_ms, ev));
        }
    }
}

/// Slots an emptied note buffer keeps: a node's ordinary input makes a few notes, so this
/// spares the allocator on the common path.
const NOTES_SPARE: usize = 64;

/// Gives back what a burst grew in an emptied note buffer. Bootstrapping makes one note per
/// member (1,666 in a reference region), and a `Vec` keeps its largest capacity: kept, the
/// bursts held ~1 GiB across 5,001 agents of `reference/rollout` (a jemalloc heap profile,
/// session 12), which is what put it over 8 GiB.
fn trim_notes<T>(notes: &mut Vec<T>) {
    if notes.capacity() > NOTES_SPARE {
        notes.shrink_to(NOTES_SPARE);
    }
}

impl SimNode for ShoalNode {
    type Note = (u64, MeshEvent);

    fn publish_notes(&mut self) {
        if self.notes.is_empty() {
            return;
        }
        let mut obs = self.observer.borrow_mut();
        for (now_ms, ev) in self.notes.drain(..) {
            obs.on_event(self.index, now_ms, ev);
        }
        trim_notes(&mut self.notes);
    }

    fn take_notes(&mut self, out: &mut Vec<Self::Note>) {
        out.append(&mut self.notes);
        trim_notes(&mut self.notes);
    }

    fn apply_note(&mut self, (now_ms, ev): Self::Note) {
        self.observer.borrow_mut().on_event(self.index, now_ms, ev);
    }

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
