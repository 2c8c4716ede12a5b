//! The repeat filter. REREAD ON EVERY FOCA UPGRADE: it parses foca's private wire layout
//! (`foca::Member<MemberId>` under `PostcardCodec`, and the update count after the header) by
//! hand, and only the byte-for-byte unit test at the bottom of this file guards it.
//!
//! SWIM spreads every update about `max_transmissions` times to each member, and foca decodes
//! and applies each one; the filter remembers (by hash, bounded, for
//! `APPLIED_UPDATES_WINDOW_MS`) the updates foca took and drops repeats from payloads foca
//! would apply before foca sees them. Applying an update twice is a no-op, so this only saves
//! CPU (the simulator's reports are byte-identical with and without it).
//!
//! An update is remembered once foca took its datagram (`handle_data` returned `Ok`): a payload
//! foca refuses as a whole (one update of it does not decode by foca's stricter rules) teaches
//! nothing. One exception, kept for now: a `Down` that `drop_unfounded_downs` then removes
//! (refuted: we hold that member at a higher incarnation) is remembered although foca never saw
//! it. Harmless while that rule stands: incarnations only grow, so its repeats would be removed
//! again within the window, and once the member is down a `Down` changes nothing. Not
//! remembering them would move `updates_deduplicated` counts to `downs_dropped` in every
//! report with refuted downs.

use std::net::SocketAddr;

use foca::Message;
use serde::Deserialize;

use super::{MemberId, Membership};
use crate::hash::{fnv1a, FNV_OFFSET};

/// How long, ms, a piggybacked update is remembered as applied so that its repeats skip foca.
/// Repeats arrive within a few gossip rounds (`max_transmissions` sends per member that
/// learns it, every 200 ms); 10 s covers them with room to spare.
const APPLIED_UPDATES_WINDOW_MS: u64 = 10_000;

/// Bound on remembered applied updates (8-byte keys); the oldest are forgotten first.
const MAX_APPLIED_UPDATES: usize = 65_536;

impl Membership {
    /// Drops from a SWIM payload the piggybacked updates this member already applied in the
    /// last [`APPLIED_UPDATES_WINDOW_MS`]; `None` when nothing is dropped (pass `body` as is).
    ///
    /// SWIM dissemination is infection-style: every update reaches each member about
    /// `max_transmissions` times, so with 1,667 members the repeats cost most of a member's
    /// CPU when membership churns (a CPU-stalled peer is suspected and refutes every second;
    /// before foca's member index, each was also a linear scan). Applying an update twice is a
    /// no-op (a member's state only moves forward in (incarnation, state) order), so a repeat
    /// can be dropped before foca sees it. Only payloads foca would apply are filtered:
    /// addressed to our identity, from a sender foca holds active. The updates let through
    /// wait in `applied_pending` for [`Membership::remember_applied`]. Updates about our own
    /// address are never dropped.
    pub(super) fn drop_applied_updates(
        &mut self,
        now_ms: u64,
        header: &foca::Header<MemberId>,
        body: &[u8],
        header_len: usize,
    ) -> Option<Vec<u8>> {
        self.applied_pending.clear();
        if header.message == Message::Broadcast || header.message == Message::Announce {
            return None;
        }
        let count = body.get(header_len..header_len + 2)?;
        let count = u16::from_be_bytes([count[0], count[1]]);
        // Most datagrams carry no update: compare identities only when there is something to drop.
        // Addresses first: comparing them is cheap, and node ids are strings. The sender is
        // looked up in foca's address index (one hash probe), not in `active` (a B-tree of
        // node-id strings: 5.9 % of a `reference/cpu-stall` profile): foca applies the updates
        // of a sender it holds active, which is what remembering them requires.
        if count == 0
            || header.dst.addr != self.identity.addr
            || header.dst != self.identity
            || self.foca.active_member(&header.src).is_none()
        {
            return None;
        }
        // First find every update's bytes; a payload that does not decode goes to foca whole
        // (it refuses it) and nothing of it is remembered.
        let mut ranges = Vec::with_capacity(usize::from(count));
        let mut at = header_len + 2;
        for _ in 0..count {
            let (member, rest) = postcard::take_from_bytes::<RawMember<'_>>(&body[at..]).ok()?;
            let end = body.len() - rest.len();
            ranges.push((at, end, member.id.addr == self.identity.addr));
            at = end;
        }
        while let Some(&(t, key)) = self.applied_order.front() {
            let expired = t + APPLIED_UPDATES_WINDOW_MS <= now_ms;
            if !expired && self.applied_order.len() < MAX_APPLIED_UPDATES {
                break;
            }
            self.applied_order.pop_front();
            self.applied.remove(&key);
        }
        let mut kept = Vec::with_capacity(ranges.len());
        for (start, end, about_us) in ranges {
            if about_us {
                kept.push((start, end));
                continue;
            }
            let key = fnv1a(&body[start..end], FNV_OFFSET);
            // Also drops a repeat within this payload.
            if !self.applied.contains(&key) && !self.applied_pending.contains(&key) {
                self.applied_pending.push(key);
                kept.push((start, end));
            }
        }
        let dropped = usize::from(count) - kept.len();
        if dropped == 0 {
            return None;
        }
        self.counters.updates_deduplicated += dropped as u64;
        let mut out = Vec::with_capacity(body.len());
        out.extend_from_slice(&body[..header_len]);
        out.extend_from_slice(&(kept.len() as u16).to_be_bytes());
        for (start, end) in kept {
            out.extend_from_slice(&body[start..end]);
        }
        out.extend_from_slice(&body[at..]);
        Some(out)
    }
}

impl Membership {
    /// Remembers the updates [`Membership::drop_applied_updates`] let through, now that foca
    /// took their datagram.
    pub(super) fn remember_applied(&mut self, now_ms: u64) {
        for key in self.applied_pending.drain(..) {
            if self.applied.insert(key) {
                self.applied_order.push_back((now_ms, key));
            }
        }
    }
}

/// The wire layout of `foca::Member<MemberId>` under foca's `PostcardCodec`, borrowed: finds
/// an update's length and address without allocating (the `membership` unit tests check it
/// against foca's own encoding).
#[derive(Deserialize)]
struct RawMember<'a> {
    #[serde(borrow)]
    id: RawMemberId<'a>,
    _incarnation: foca::Incarnation,
    /// `foca::State`, an enum: postcard writes its variant index as a varint.
    _state: u32,
}

/// The wire layout of [`MemberId`], borrowed.
#[derive(Deserialize)]
struct RawMemberId<'a> {
    _node: &'a str,
    addr: SocketAddr,
    _boot: u64,
}

#[cfg(test)]
mod tests {
    use foca::{Member, PostcardCodec, State};
    use shoal_proto::{Generation, NodeId};

    use super::*;

    #[test]
    fn raw_member_reads_foca_encoded_updates_to_the_byte() {
        let id = MemberId {
            node: NodeId::new("node-17.zone-a").expect("valid"),
            addr: "[2001:db8::7]:7946".parse().expect("addr"),
            boot: Generation(300),
        };
        for member in [
            Member::alive(id.clone()),
            Member::new(id.clone(), 40_000, State::Suspect),
            Member::down(MemberId {
                addr: "10.1.2.3:7946".parse().expect("addr"),
                ..id.clone()
            }),
        ] {
            let mut bytes = Vec::new();
            foca::Codec::encode_member(&mut PostcardCodec, &member, &mut bytes).expect("encodes");
            bytes.extend_from_slice(&[0xAB, 0xCD]);
            let (raw, rest) = postcard::take_from_bytes::<RawMember<'_>>(&bytes).expect("reads");
            assert_eq!(rest, &[0xAB, 0xCD], "consumed exactly the update");
            assert_eq!(raw.id.addr, member.id().addr);
            assert_eq!(raw.id._node, member.id().node.as_str());
            assert_eq!(raw.id._boot, member.id().boot.0);
            assert_eq!(raw._incarnation, member.incarnation());
        }
    }
}
