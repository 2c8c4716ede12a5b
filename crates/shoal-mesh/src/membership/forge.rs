//! Crafted SWIM datagrams, for fault injection (the simulator's `inject_update` fault and the
//! membership tests): a stale or forged rumour about a member, in another member's name. A
//! real agent never builds one; the functions are public so that a test can play a buggy or
//! hostile member without a second SWIM implementation.

use foca::{Codec, Header, Incarnation, Member, Message, PostcardCodec, State};
use shoal_proto::envelope::{MessageKind, MAGIC, PROTOCOL_VERSION};

use super::{MemberId, Membership};

/// The state a crafted update claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RumourState {
    /// Alive.
    Alive,
    /// Suspect.
    Suspect,
    /// Down.
    Down,
}

impl From<RumourState> for State {
    fn from(s: RumourState) -> Self {
        match s {
            RumourState::Alive => State::Alive,
            RumourState::Suspect => State::Suspect,
            RumourState::Down => State::Down,
        }
    }
}

/// One enveloped SWIM `Gossip` datagram from `src` to `dst` (which must be the receiver's
/// exact identity, or foca ignores the payload) carrying `updates`: `(member, incarnation,
/// state)`. The sender's incarnation is claimed as 0, which never changes what the receiver
/// holds about the sender.
///
/// # Panics
/// Never for identities that encode (every `MemberId` does); the buffer grows as needed.
#[must_use]
pub fn gossip_datagram(
    src: &MemberId,
    dst: &MemberId,
    updates: &[(MemberId, Incarnation, RumourState)],
) -> Vec<u8> {
    let updates: Vec<Member<MemberId>> = updates
        .iter()
        .map(|(id, incarnation, state)| Member::new(id.clone(), *incarnation, (*state).into()))
        .collect();
    swim_datagram(src, dst, Message::Gossip, &updates)
}

/// One enveloped SWIM datagram from `src` (claimed at incarnation 0, which never changes what
/// the receiver holds about the sender) to `dst` with `message` and `updates` piggybacked, in
/// foca's wire layout. Shared by the fault injection above and the contested-down notice
/// (`partition.rs`).
pub(super) fn swim_datagram(
    src: &MemberId,
    dst: &MemberId,
    message: Message<MemberId>,
    updates: &[Member<MemberId>],
) -> Vec<u8> {
    let mut body = Vec::new();
    let header = Header {
        src: src.clone(),
        src_incarnation: 0,
        dst: dst.clone(),
        message,
    };
    let mut codec = PostcardCodec;
    codec
        .encode_header(&header, &mut body)
        .expect("a header always encodes");
    let count = u16::try_from(updates.len()).expect("fewer than 65,536 updates");
    body.extend_from_slice(&count.to_be_bytes());
    for member in updates {
        codec
            .encode_member(member, &mut body)
            .expect("a member always encodes");
    }
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&MAGIC);
    out.push(PROTOCOL_VERSION);
    out.push(MessageKind::Swim as u8);
    out.extend_from_slice(&body);
    out
}

impl Membership {
    /// The incarnation we hold `id` at, if it is an active member in our view (the "current
    /// incarnation" a forged rumour about it would use).
    pub fn incarnation_of(&self, id: &MemberId) -> Option<Incarnation> {
        self.foca.active_member(id).map(|m| m.incarnation())
    }
}
