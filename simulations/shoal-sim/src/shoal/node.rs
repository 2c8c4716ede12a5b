//! One simulated agent: a real `Mesh`, its timer-token table and the event tap.

use super::*;

/// One simulated agent: a real [`Mesh`] plus a timer-token table and an event tap.
pub struct ShoalNode {
    pub(super) index: u32,
    pub(super) mesh: Mesh<SharedKeys>,
    pub(super) timers: TimerSlots,
    pub(super) observer: Rc<RefCell<Observer>>,
}

/// Pending mesh timers by token. A token is a slot number (low 32 bits) and the slot's use
/// count (high 32 bits), so a slot is reused once its timer fired and a token that is no longer
/// pending finds nothing, as with a map from never-reused tokens. Cheaper than hashing: every
/// mesh timer is one insert and one take.
#[derive(Default)]
pub(super) struct TimerSlots {
    pub(super) slots: Vec<(u32, Option<MeshTimer>)>,
    pub(super) free: Vec<u32>,
}

impl TimerSlots {
    pub(super) fn insert(&mut self, timer: MeshTimer) -> u64 {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push((0, None));
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 pending timers")
            }
        };
        let (uses, t) = &mut self.slots[slot as usize];
        debug_assert!(t.is_none(), "a free slot is empty");
        *uses = uses.wrapping_add(1);
        *t = Some(timer);
        (u64::from(*uses) << 32) | u64::from(slot)
    }

    pub(super) fn take(&mut self, token: u64) -> Option<MeshTimer> {
        let slot = token as u32;
        let (uses, t) = self.slots.get_mut(slot as usize)?;
        if u64::from(*uses) != token >> 32 {
            return None;
        }
        let timer = t.take()?;
        self.free.push(slot);
        Some(timer)
    }
}

impl ShoalNode {
    /// The mesh core.
    pub fn mesh(&self) -> &Mesh<SharedKeys> {
        &self.mesh
    }

    /// Runs a command and taps the resulting events.
    pub fn command(&mut self, now_ms: u64, cmd: Command) {
        self.mesh.handle_command(now_ms, cmd);
        self.tap(now_ms);
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
        if let Some(t) = self.timers.take(token) {
            self.mesh.handle_timer(now_ms, t);
            self.tap(now_ms);
        }
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
        let (at, t) = self.mesh.poll_timer()?;
        Some((at, self.timers.insert(t)))
    }
}
