/* This Source Code Form is subject to the terms of the Mozilla Public
 * License, v. 2.0. If a copy of the MPL was not distributed with this
 * file, You can obtain one at https://mozilla.org/MPL/2.0/. */
extern crate alloc;
use alloc::vec::Vec;
use core::hash::{BuildHasherDefault, Hasher};

use hashbrown::HashMap;

use rand::{
    RngExt,
    prelude::{IteratorRandom, SliceRandom},
};

/// State describes how a Foca instance perceives a member of the cluster.
///
/// This is part of the Suspicion Mechanism described in section 4.2 of the
/// original SWIM paper.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum State {
    /// Member is active.
    Alive,
    /// Member is active, but at least one cluster member
    /// suspects its down. For all purposes, a `Suspect` member
    /// is treated as if it were `Alive` until either it
    /// refutes the suspicion (becoming `Alive`) or fails to
    /// do so (being declared `Down`).
    Suspect,
    /// Confirmed Down.
    /// A member that reaches this state can't join the cluster
    /// with the same identity until the cluster forgets
    /// this knowledge.
    Down,
}

/// Incarnation is a member-controlled cluster-global number attached
/// to a member identity.
/// A member M's incarnation starts with zero and can only be incremented
/// by said member M when refuting suspicion.
pub type Incarnation = u16;

/// A Cluster Member. Also often called "cluster update".
///
/// A [`Member`] represents Foca's snapshot knowledge about an
/// [`crate::Identity`]. An individual cluster update is simply a
/// serialized Member which other Foca instances receive and use to
/// update their own cluster state representation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Member<T> {
    id: T,
    incarnation: Incarnation,
    state: State,
}

impl<T> Member<T> {
    /// Initializes a new member.
    ///
    /// `id` is an identity used to uniquely identify an individual
    /// cluster member (say, a primary key).
    pub const fn new(id: T, incarnation: Incarnation, state: State) -> Self {
        Self {
            id,
            incarnation,
            state,
        }
    }

    /// Shortcut for initializing a member as [`State::Alive`].
    pub fn alive(id: T) -> Self {
        Self::new(id, Incarnation::default(), State::Alive)
    }

    #[cfg(test)]
    pub(crate) fn suspect(id: T) -> Self {
        Self::new(id, Incarnation::default(), State::Suspect)
    }

    /// Shortcut for initializing a member as [`State::Down`].
    pub fn down(id: T) -> Self {
        Self::new(id, Incarnation::default(), State::Down)
    }

    /// Getter for the member's Incarnation
    pub const fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// Getter for the member's State
    pub const fn state(&self) -> State {
        self.state
    }

    /// Getter for the member's identity
    pub const fn id(&self) -> &T {
        &self.id
    }

    pub(crate) const fn is_active(&self) -> bool {
        match self.state {
            State::Alive | State::Suspect => true,
            State::Down => false,
        }
    }

    pub(crate) const fn change_state(&mut self, incarnation: Incarnation, state: State) -> bool {
        if self.can_change(incarnation, state) {
            self.state = state;
            self.incarnation = incarnation;
            true
        } else {
            false
        }
    }

    const fn can_change(&self, other_incarnation: Incarnation, other: State) -> bool {
        // This implements the order of preference of the Suspicion subprotocol
        // outlined on section 4.2 of the paper.
        match self.state {
            State::Alive => match other {
                State::Alive => other_incarnation > self.incarnation,
                State::Suspect => other_incarnation >= self.incarnation,
                State::Down => true,
            },
            State::Suspect => match other {
                State::Alive | State::Suspect => other_incarnation > self.incarnation,
                State::Down => true,
            },
            State::Down => false,
        }
    }

    pub(crate) fn into_identity(self) -> T {
        self.id
    }
}

// shoal patch: `index` maps each member's address to its position in
// `inner`, so that finding the member of an update is a lookup instead
// of a linear scan. `inner` keeps exactly the order it had without the
// index (same pushes, swaps, shuffles and swap_removes, same RNG draws),
// so every output is unchanged. The index is only ever looked up, never
// iterated, so its (seedless) hash order cannot reach any output.
pub(crate) struct Members<T: crate::Identity> {
    pub(crate) inner: Vec<Member<T>>,
    index: HashMap<T::Addr, u32, BuildHasherDefault<AddrHasher>>,
    // shoal patch: bit `i` is set when `inner[i]` is active, so that the
    // reservoir sampling of `choose_active_members_except` and
    // `choose_down_members` counts its candidates without reading every
    // member (a 64-byte `Member<MemberId>` each, 1,667 per shoal region).
    active_bits: Vec<u64>,
    cursor: usize,
    num_active: usize,
}

#[cfg(test)]
impl<T: crate::Identity> Members<T> {
    pub(crate) fn len(&self) -> usize {
        self.inner.len()
    }
}

// shoal patch: a position in `inner` as the index stores it (4 bytes, not
// 8: the index is one of the larger per-member costs at 5,000 agents).
fn index_position(pos: usize) -> u32 {
    u32::try_from(pos).expect("fewer than 2^32 members")
}

// shoal patch: the index's hasher, seedless (foca takes no OS randomness)
// and cheap: FxHash's rotate-xor-multiply (rustc's `FxHasher`) per word.
// Addresses come from authenticated peers; colliding ones would only slow
// lookups, never change what they find.
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl AddrHasher {
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

/// shoal patch: `rng.random_range(0..n)` for `n >= 1`, drawing exactly the
/// words rand 0.10 draws and giving exactly its value, for the reservoir
/// sampling of `choose_by_bits` (one draw per candidate: 1,666 per gossip
/// round at 1,667 members, ~10 % of a `reference/cpu-stall` profile as
/// rand's generic `UniformUsize::sample_single`, which did not inline).
///
/// rand 0.10 without its `unbiased` feature samples a `usize` range that
/// fits in `u32` with Canon's method on `u32` words
/// (`UniformInt::<u32>::sample_single_inclusive`): the high half of
/// `x * n` for one word `x`; if the low half is above `2^32 - n`, a second
/// word `y` decides whether the high half of `y * n` carries into it.
/// Ranges past `u32::MAX` go to rand itself. Checked against
/// `random_range` word for word in `reservoir_draw_is_random_range`.
#[inline]
fn reservoir_draw(rng: &mut impl RngExt, n: usize) -> usize {
    debug_assert!(n >= 1, "empty range");
    let Ok(range) = u32::try_from(n) else {
        return rng.random_range(0..n);
    };
    let wide = u64::from(rng.next_u32()) * u64::from(range);
    let (mut result, lo) = ((wide >> 32) as u32, wide as u32);
    if lo > range.wrapping_neg() {
        let carry_in = ((u64::from(rng.next_u32()) * u64::from(range)) >> 32) as u32;
        if lo.checked_add(carry_in).is_none() {
            result += 1;
        }
    }
    result as usize
}

impl<T> Members<T>
where
    T: PartialEq + Clone + crate::Identity,
{
    pub(crate) const fn num_active(&self) -> usize {
        self.num_active
    }

    pub(crate) fn new(inner: Vec<Member<T>>) -> Self {
        // XXX This doesn't prevent someone initializing with
        //     duplicated members... Not a problem (yet?) since
        //     inner is always empty outside of tests
        let num_active = inner.iter().filter(|member| member.is_active()).count();

        let mut members = Self {
            cursor: 0,
            num_active,
            inner,
            index: HashMap::default(),
            active_bits: Vec::new(),
        };
        members.rebuild_index();
        members
    }

    // shoal patch: the activeness bitmap's word and mask for a position.
    const fn bit(pos: usize) -> (usize, u64) {
        (pos / 64, 1 << (pos % 64))
    }

    fn is_active_at(&self, pos: usize) -> bool {
        let (word, mask) = Self::bit(pos);
        self.active_bits[word] & mask != 0
    }

    fn set_active_at(&mut self, pos: usize, active: bool) {
        let (word, mask) = Self::bit(pos);
        if active {
            self.active_bits[word] |= mask;
        } else {
            self.active_bits[word] &= !mask;
        }
    }

    // shoal patch: `inner` grew by one (its last member): the bitmap too.
    fn push_active_bit(&mut self) {
        let pos = self.inner.len() - 1;
        if pos / 64 >= self.active_bits.len() {
            self.active_bits.push(0);
        }
        self.set_active_at(pos, self.inner[pos].is_active());
    }

    // shoal patch: `inner` lost its last position (after a `swap_remove`,
    // which moved the last member to `pos`): the bitmap too.
    fn swap_remove_active_bit(&mut self, pos: usize) {
        let last = self.inner.len();
        let moved = self.is_active_at(last);
        self.set_active_at(last, false);
        if pos < last {
            self.set_active_at(pos, moved);
        }
        self.active_bits.truncate(last.div_ceil(64));
    }

    #[cfg(test)]
    pub(crate) fn check_active_bits(&self) {
        assert_eq!(self.active_bits.len(), self.inner.len().div_ceil(64), "bitmap length");
        for (pos, member) in self.inner.iter().enumerate() {
            assert_eq!(self.is_active_at(pos), member.is_active(), "bit {pos}");
        }
        let tail = self.active_bits.iter().map(|w| w.count_ones() as usize).sum::<usize>();
        assert_eq!(tail, self.num_active, "no bit set past the end");
    }

    // shoal patch: positions of every member, after `inner` was reordered.
    // With duplicated addresses (only possible through `new`), the first
    // position wins, as the linear scan it replaces found the first one.
    // The activeness bitmap is rebuilt along with it.
    fn rebuild_index(&mut self) {
        self.index.clear();
        for (pos, member) in self.inner.iter().enumerate() {
            self.index.entry(member.id.addr()).or_insert(index_position(pos));
        }
        self.active_bits.clear();
        self.active_bits.resize(self.inner.len().div_ceil(64), 0);
        for pos in 0..self.inner.len() {
            if self.inner[pos].is_active() {
                self.set_active_at(pos, true);
            }
        }
    }

    // shoal patch: swap two positions of `inner` and keep the index in step.
    fn swap_positions(&mut self, a: usize, b: usize) {
        if a == b {
            return;
        }
        self.inner.swap(a, b);
        self.index.insert(self.inner[a].id.addr(), index_position(a));
        self.index.insert(self.inner[b].id.addr(), index_position(b));
        let (bit_a, bit_b) = (self.is_active_at(a), self.is_active_at(b));
        self.set_active_at(a, bit_b);
        self.set_active_at(b, bit_a);
    }

    // shoal patch: the position of the member with this address.
    fn position_of(&self, addr: &T::Addr) -> Option<usize> {
        let pos = self.index.get(addr).map(|&pos| pos as usize);
        debug_assert!(pos.is_none_or(|pos| &self.inner[pos].id.addr() == addr));
        pos
    }

    // Next member that's considered active
    // Chosen at random (shuffle + round-robin)
    pub(crate) fn next(&mut self, mut rng: impl RngExt) -> Option<&Member<T>> {
        // Round-robin with a shuffle at the end
        if self.cursor >= self.inner.len() {
            self.inner.shuffle(&mut rng);
            self.rebuild_index();
            self.cursor = 0;
        }

        // Find an active member from cursor..len()
        let position = self
            .inner
            .iter()
            .skip(self.cursor)
            .position(|m| m.is_active())
            // Since we skip(), position() will start counting from zero
            // this ensures it's actually the index of the chosen member
            .map(|pos| pos + self.cursor);

        // And if we don't find any: try from 0..cursor
        let position = position.or_else(|| {
            self.inner
                .iter()
                .take(self.cursor)
                .position(|m| m.is_active())
        });

        if let Some(pos) = position {
            if pos < self.cursor {
                // We wrapped around the list to find a member. A shuffle
                // is needed, so we set it to MAX. Any other value could
                // cause the shuffle to not happen since members may join
                // in-between probes
                self.cursor = usize::MAX;
            } else {
                self.cursor = pos.saturating_add(1);
            }
            self.inner.get(pos)
        } else {
            None
        }
    }

    fn choose_members<F>(
        &self,
        wanted: usize,
        output: &mut Vec<Member<T>>,
        mut rng: impl RngExt,
        picker: F,
    ) where
        F: Fn(&Member<T>) -> bool,
    {
        // Basic reservoir sampling
        let mut num_chosen = 0;
        let mut num_seen = 0;

        for member in &self.inner {
            if !picker(member) {
                continue;
            }

            num_seen += 1;
            if num_chosen < wanted {
                num_chosen += 1;
                output.push(member.clone());
            } else {
                let replace_at = rng.random_range(0..num_seen);
                if replace_at < wanted {
                    output[replace_at] = member.clone();
                }
            }
        }
    }

    pub(crate) fn choose_down_members(
        &self,
        wanted: usize,
        output: &mut Vec<Member<T>>,
        rng: impl RngExt,
    ) {
        self.choose_by_bits(wanted, output, rng, false, None);
    }

    /// shoal patch: `choose_active_members(wanted, output, rng, |id| id
    /// != except)` (every active member when `except` is `None`), with
    /// exactly its RNG draws and its result, but without reading the
    /// members that are not chosen: see `choose_by_bits`.
    pub(crate) fn choose_active_members_except(
        &self,
        wanted: usize,
        output: &mut Vec<Member<T>>,
        rng: impl RngExt,
        except: Option<&T>,
    ) {
        // Addresses are unique in `inner`, so at most one member has the
        // identity `except`: the one at its address, if the rest matches.
        let excluded = except.and_then(|id| {
            self.position_of(&id.addr())
                .filter(|&pos| &self.inner[pos].id == id)
        });
        self.choose_by_bits(wanted, output, rng, true, excluded);
    }

    /// shoal patch: `choose_members` over the members whose activeness is
    /// `active` (but the one at position `excluded`), read from the
    /// bitmap. The reservoir sampling only depends on how many candidates
    /// came before each one, so it runs on candidate ordinals (the same
    /// draw, `random_range(0..num_seen)`, for every candidate past the
    /// `wanted`-th, as in `choose_members`), and only the ordinals that
    /// end up chosen are mapped back to members, in one pass over the
    /// bitmap's words. Same RNG draws, same result, same output order.
    fn choose_by_bits(
        &self,
        wanted: usize,
        output: &mut Vec<Member<T>>,
        mut rng: impl RngExt,
        active: bool,
        excluded: Option<usize>,
    ) {
        if !output.is_empty() {
            // `choose_members` replaces at absolute positions of `output`;
            // every caller passes it empty, but stay exact if one does not.
            match excluded {
                Some(ex) => self.choose_members(wanted, output, rng, |member| {
                    member.is_active() == active && !core::ptr::eq(member, &self.inner[ex])
                }),
                None => {
                    self.choose_members(wanted, output, rng, |member| member.is_active() == active);
                }
            }
            return;
        }
        let len = self.inner.len();
        // The candidates' bits of word `w` (no bit past `len`).
        let word = |w: usize| -> u64 {
            let mut bits = if active {
                self.active_bits[w]
            } else {
                !self.active_bits[w]
            };
            if (w + 1) * 64 > len {
                bits &= (1u64 << (len - w * 64)) - 1;
            }
            if let Some(ex) = excluded
                && ex / 64 == w
            {
                bits &= !(1u64 << (ex % 64));
            }
            bits
        };
        let words = self.active_bits.len();
        let candidates: usize = (0..words).map(|w| word(w).count_ones() as usize).sum();

        // Reservoir sampling of candidate ordinals.
        let mut chosen: Vec<(usize, usize)> = (0..wanted.min(candidates)).map(|o| (o, 0)).collect();
        let mut num_seen = wanted.min(candidates);
        while num_seen < candidates {
            num_seen += 1;
            let replace_at = reservoir_draw(&mut rng, num_seen);
            if replace_at < wanted {
                chosen[replace_at].0 = num_seen - 1;
            }
        }

        // Map the chosen ordinals to positions (`chosen[i].1`), in
        // ascending order of ordinal, in one pass over the words.
        let mut by_ordinal: Vec<usize> = (0..chosen.len()).collect();
        by_ordinal.sort_unstable_by_key(|&slot| chosen[slot].0);
        let mut pending = by_ordinal.into_iter().peekable();
        let mut before = 0; // candidates in the words already passed
        for w in 0..words {
            if pending.peek().is_none() {
                break;
            }
            let bits = word(w);
            let here = bits.count_ones() as usize;
            while let Some(slot) = pending.next_if(|&slot| chosen[slot].0 < before + here) {
                // The (ordinal - before)-th set bit of `bits`.
                let mut rest = bits;
                for _ in 0..chosen[slot].0 - before {
                    rest &= rest - 1;
                }
                chosen[slot].1 = w * 64 + rest.trailing_zeros() as usize;
            }
            before += here;
        }
        output.extend(chosen.iter().map(|&(_, pos)| self.inner[pos].clone()));
    }

    pub(crate) fn choose_active_members<F>(
        &self,
        wanted: usize,
        output: &mut Vec<Member<T>>,
        rng: impl RngExt,
        picker: F,
    ) where
        F: Fn(&T) -> bool,
    {
        self.choose_members(wanted, output, rng, |member| {
            member.is_active() && picker(member.id())
        });
    }

    pub(crate) fn remove_if_down(&mut self, id: &T) -> Option<Member<T>> {
        let position = self.position_of(&id.addr()).filter(|&pos| {
            let member = &self.inner[pos];
            &member.id == id && member.state == State::Down
        });

        position.map(|pos| {
            let removed = self.inner.swap_remove(pos);
            self.index.remove(&removed.id.addr());
            if let Some(moved) = self.inner.get(pos) {
                self.index.insert(moved.id.addr(), index_position(pos));
            }
            self.swap_remove_active_bit(pos);
            removed
        })
    }

    pub(crate) fn iter_active(&self) -> impl Iterator<Item = &Member<T>> {
        self.inner.iter().filter(|m| m.is_active())
    }

    pub(crate) fn is_active(&self, id: &T) -> bool {
        self.active_member(id).is_some()
    }

    // shoal patch: the active member with exactly this identity, found through the index;
    // the same member `iter_active().find(|m| m.id == *id)` finds (addresses are unique).
    pub(crate) fn active_member(&self, id: &T) -> Option<&Member<T>> {
        self.position_of(&id.addr())
            .map(|pos| &self.inner[pos])
            .filter(|member| &member.id == id && member.is_active())
    }

    pub(crate) fn apply_existing_if<F: Fn(&Member<T>) -> bool>(
        &mut self,
        mut update: Member<T>,
        condition: F,
    ) -> Option<ApplySummary<T>> {
        if let Some(known_pos) = self.position_of(&update.id().addr()) {
            let known_member = &mut self.inner[known_pos];
            let id_conflict = known_member.id != update.id;

            // If the update wins the conflict, the full member
            // state is replaced (it's essentially a rejoin)
            // If it doesn't, it gets discarded
            if id_conflict && known_member.id.win_addr_conflict(&update.id) {
                return Some(ApplySummary {
                    is_active_now: known_member.is_active(),
                    apply_successful: false,
                    changed_active_set: false,
                    conflict: ConflictResult::Lost,
                });
            }

            if !condition(known_member) {
                return Some(ApplySummary {
                    is_active_now: known_member.is_active(),
                    apply_successful: false,
                    changed_active_set: false,
                    conflict: if id_conflict {
                        ConflictResult::FailedCondition
                    } else {
                        ConflictResult::NoConflict
                    },
                });
            }
            let was_active = known_member.is_active();

            let (apply_successful, conflict) = if id_conflict {
                core::mem::swap(&mut known_member.id, &mut update.id);
                known_member.state = update.state;
                known_member.incarnation = update.incarnation;
                (true, ConflictResult::Replaced(update.id))
            } else {
                (
                    known_member.change_state(update.incarnation, update.state),
                    ConflictResult::NoConflict,
                )
            };

            let is_active_now = known_member.is_active();
            let changed_active_set = is_active_now != was_active;

            if changed_active_set {
                self.set_active_at(known_pos, is_active_now);
                // XXX Overzealous checking
                if is_active_now {
                    self.num_active = self.num_active.saturating_add(1);
                } else {
                    self.num_active = self.num_active.saturating_sub(1);
                }
            }

            Some(ApplySummary {
                is_active_now,
                apply_successful,
                changed_active_set,
                conflict,
            })
        } else {
            None
        }
    }

    pub(crate) fn apply(&mut self, update: Member<T>, mut rng: impl RngExt) -> ApplySummary<T> {
        self.apply_existing_if(update.clone(), |_member| true)
            .unwrap_or_else(|| {
                // Unknown member, we'll register it
                let is_active_now = update.is_active();

                // Insert at the end and swap with a random position.
                let addr = update.id.addr();
                self.inner.push(update);
                let inserted_at = self.inner.len() - 1;
                self.index.insert(addr, index_position(inserted_at));
                self.push_active_bit();

                let swap_idx = (0..self.inner.len())
                    .choose(&mut rng)
                    .unwrap_or(inserted_at);

                self.swap_positions(swap_idx, inserted_at);

                if is_active_now {
                    self.num_active = self.num_active.saturating_add(1);
                }

                ApplySummary {
                    is_active_now,
                    apply_successful: true,
                    // Registering a new active member changes the active set
                    changed_active_set: is_active_now,
                    conflict: ConflictResult::NoConflict,
                }
            })
    }
}

#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub(crate) struct ApplySummary<T> {
    pub(crate) is_active_now: bool,
    pub(crate) apply_successful: bool,
    pub(crate) changed_active_set: bool,
    pub(crate) conflict: ConflictResult<T>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ConflictResult<T> {
    NoConflict,
    Replaced(T),
    Lost,
    FailedCondition,
}

// shoal patch: foca 2.0.0's `Members` as released, for the equivalence test.
#[cfg(test)]
#[path = "member_scan_reference.rs"]
mod scan_reference;

#[cfg(test)]
mod tests {

    use crate::Identity;

    use super::*;

    use alloc::vec;
    use rand::{SeedableRng, rngs::SmallRng};

    #[derive(Clone, Debug, PartialEq, Eq, Copy, PartialOrd, Ord)]
    struct Id(&'static str);
    impl crate::Identity for Id {
        type Addr = &'static str;

        fn renew(&self) -> Option<Self> {
            None
        }

        fn addr(&self) -> Self::Addr {
            self.0
        }

        fn win_addr_conflict(&self, _adversary: &Self) -> bool {
            panic!("addr is self, there'll never be a conflict");
        }
    }

    use State::*;

    #[test]
    fn alive_transitions() {
        let mut member = Member::new(Id("a"), 0, Alive);

        // Alive => Alive
        assert!(
            member.change_state(member.incarnation + 1, Alive),
            "can transition to a higher incarnation"
        );

        assert_eq!(1, member.incarnation);
        assert_eq!(Alive, member.state);

        assert!(
            !member.change_state(member.incarnation - 1, Alive),
            "cannot transition to a lower incarnation"
        );

        assert!(
            !member.change_state(member.incarnation, Alive),
            "cannot transition to same state and incarnation {:?}",
            member
        );

        // Alive => Suspect
        assert!(
            !member.change_state(member.incarnation - 1, Suspect),
            "lower suspect incarnation shouldn't transition"
        );

        assert!(
            member.change_state(member.incarnation, Suspect),
            "transition to suspect with same incarnation"
        );
        assert_eq!(Suspect, member.state);

        member = Member::new(Id("b"), 0, Alive);
        assert!(
            member.change_state(member.incarnation + 1, Suspect),
            "transition to suspect with higher incarnation"
        );
        assert_eq!(1, member.incarnation);
        assert_eq!(Suspect, member.state);

        // Alive => Down, always works
        assert!(
            Member::new("c", 1, Alive).change_state(0, Down),
            "transitions to down on lower incarnation"
        );
        assert!(
            Member::new("c", 0, Alive).change_state(0, Down),
            "transitions to down on same incarnation"
        );
        assert!(
            Member::new("c", 0, Alive).change_state(1, Down),
            "transitions to down on higher incarnation"
        );
    }

    #[test]
    fn suspect_transitions() {
        let mut member = Member::new(Id("a"), 0, Suspect);

        // Suspect => Suspect
        assert!(
            member.change_state(member.incarnation + 1, Suspect),
            "can transition to a higher incarnation"
        );

        assert_eq!(1, member.incarnation);
        assert_eq!(Suspect, member.state);

        assert!(
            !member.change_state(member.incarnation - 1, Suspect),
            "cannot transition to a lower incarnation"
        );

        assert!(
            !member.change_state(member.incarnation, Suspect),
            "cannot transition to same state and incarnation {:?}",
            member
        );

        // Suspect => Alive
        assert!(
            !member.change_state(member.incarnation - 1, Alive),
            "lower alive incarnation shouldn't transition"
        );
        assert!(
            !member.change_state(member.incarnation, Alive),
            "same alive incarnation shouldn't transition"
        );

        assert!(
            member.change_state(member.incarnation + 1, Alive),
            "can transition to alive with higher incarnation"
        );
        assert_eq!(Alive, member.state);

        // Suspect => Down, always works
        assert!(
            Member::new("c", 1, Suspect).change_state(0, Down),
            "transitions to down on lower incarnation"
        );
        assert!(
            Member::new("c", 0, Suspect).change_state(0, Down),
            "transitions to down on same incarnation"
        );
        assert!(
            Member::new("c", 0, Suspect).change_state(1, Down),
            "transitions to down on higher incarnation"
        );
    }

    #[test]
    fn down_never_transitions() {
        let mut member = Member::new("dead", 1, Down);

        for incarnation in 0..=2 {
            assert!(!member.change_state(incarnation, Alive));
            assert!(!member.change_state(incarnation, Suspect));
            assert!(!member.change_state(incarnation, Down));
        }
    }

    #[test]
    fn next_walks_sequentially_then_shuffles() {
        let ordered_ids = vec![Id("1"), Id("2"), Id("3"), Id("4"), Id("5")];
        let mut members = Members::new(ordered_ids.iter().cloned().map(Member::alive).collect());

        let mut rng = SmallRng::seed_from_u64(0xF0CA);

        for wanted in ordered_ids.iter() {
            let got = members
                .next(&mut rng)
                .expect("Non-empty set of Alive members should always yield Some()")
                .id;
            assert_eq!(wanted, &got);
        }

        // By now we walked through all known live members so
        // the internal state should've shuffled.
        // We'll verify that by calling `next()` multiple
        // times and comparing with the original `ordered_ids`
        let mut after_shuffle = (0..ordered_ids.len())
            .map(|_| members.next(&mut rng).unwrap().id)
            .collect::<Vec<_>>();
        assert_ne!(ordered_ids, after_shuffle);

        // The shuffle only happens once the cursor walks
        // through the whole set, so `after_shuffle` should
        // contain every member, like `ordered_ids`, but in
        // a distinct order
        after_shuffle.sort_unstable();
        assert_eq!(ordered_ids, after_shuffle);
    }

    #[test]
    fn apply_existing_if_behaviour() {
        let mut members = Members::new(Vec::new());

        assert_eq!(
            None,
            members.apply_existing_if(Member::alive(Id("1")), |_member| true),
            "Only yield None only if member is not found"
        );

        let mut rng = SmallRng::seed_from_u64(0xF0CA);
        let _ = members.apply(Member::alive(Id("1")), &mut rng);

        assert_ne!(
            None,
            members.apply_existing_if(Member::alive(Id("1")), |_member| true),
            "Must yield Some() if existing, regardless of condition"
        );

        assert_ne!(
            None,
            members.apply_existing_if(Member::alive(Id("1")), |_member| false),
            "Must yield Some() if existing, regardless of condition"
        );
    }

    #[test]
    fn apply_summary_behaviour() {
        let mut members = Members::new(Vec::new());
        let mut rng = SmallRng::seed_from_u64(0xF0CA);

        // New and active member
        let res = members.apply(Member::suspect(Id("1")), &mut rng);
        assert_eq!(
            ApplySummary {
                is_active_now: true,
                apply_successful: true,
                changed_active_set: true,
                conflict: ConflictResult::NoConflict,
            },
            res,
        );
        assert_eq!(1, members.len());
        assert_eq!(1, members.num_active());

        // Failed attempt to change member id=1 to alive
        // (since it's already suspect with same incarnation)
        let res = members.apply(Member::alive(Id("1")), &mut rng);
        assert_eq!(
            ApplySummary {
                is_active_now: true,
                apply_successful: false,
                changed_active_set: false,
                conflict: ConflictResult::NoConflict,
            },
            res,
        );
        assert_eq!(1, members.len());

        // Successful attempt at changing member id=1 to
        // alive by using a higher incarnation
        let res = members.apply(Member::new(Id("1"), 1, State::Alive), &mut rng);
        assert_eq!(
            ApplySummary {
                is_active_now: true,
                apply_successful: true,
                changed_active_set: false,
                conflict: ConflictResult::NoConflict,
            },
            res,
        );
        assert_eq!(1, members.len());

        // Change existing member to down
        let res = members.apply(Member::down(Id("1")), &mut rng);
        assert_eq!(
            ApplySummary {
                is_active_now: false,
                apply_successful: true,
                changed_active_set: true,
                conflict: ConflictResult::NoConflict,
            },
            res,
        );
        assert_eq!(1, members.len());
        assert_eq!(0, members.num_active());

        // New and inactive member
        let res = members.apply(Member::down(Id("2")), &mut rng);
        assert_eq!(
            ApplySummary {
                is_active_now: false,
                apply_successful: true,
                changed_active_set: false,
                conflict: ConflictResult::NoConflict,
            },
            res,
        );
        assert_eq!(2, members.len());
        assert_eq!(0, members.num_active());
    }

    #[test]
    fn remove_if_down_works() {
        let mut members = Members::new(Vec::new());
        let mut rng = SmallRng::seed_from_u64(0xF0CA);

        assert_eq!(
            None,
            members.remove_if_down(&Id("1")),
            "cant remove member that does not exist"
        );
        let _ = members.apply(Member::alive(Id("1")), &mut rng);

        assert_eq!(
            None,
            members.remove_if_down(&Id("1")),
            "cant remove member that isnt down"
        );
        let _ = members.apply(Member::down(Id("1")), &mut rng);

        assert_eq!(
            Some(Member::down(Id("1"))),
            members.remove_if_down(&Id("1")),
            "must return the removed member"
        );
    }

    #[test]
    fn next_yields_none_with_no_active_members() {
        let mut members = Members::new(Vec::new());
        let mut rng = SmallRng::seed_from_u64(0xF0CA);

        assert_eq!(
            None,
            members.next(&mut rng),
            "next() should yield None when there are no members"
        );

        let _ = members.apply(Member::down(Id("-1")), &mut rng);
        let _ = members.apply(Member::down(Id("-2")), &mut rng);
        let _ = members.apply(Member::down(Id("-3")), &mut rng);

        assert_eq!(
            None,
            members.next(&mut rng),
            "next() should yield None when there are no active members"
        );

        let _ = members.apply(Member::alive(Id("1")), &mut rng);

        for _i in 0..10 {
            assert_eq!(
                Some(Id("1")),
                members.next(&mut rng).map(|m| m.id),
                "next() should yield the same member if its the only active"
            );
        }
    }

    #[test]
    fn choose_active_members_behaviour() {
        let members = Members::new(Vec::from([
            // 5 active members
            Member::alive(Id("1")),
            Member::alive(Id("2")),
            Member::alive(Id("3")),
            Member::suspect(Id("4")),
            Member::suspect(Id("5")),
            // 2 down
            Member::down(Id("6")),
            Member::down(Id("7")),
        ]));

        assert_eq!(7, members.len());
        assert_eq!(5, members.num_active());

        let mut out = Vec::new();
        let mut rng = SmallRng::seed_from_u64(0xF0CA);

        out.clear();
        members.choose_active_members(0, &mut out, &mut rng, |_| true);
        assert_eq!(0, out.len(), "Can pointlessly choose 0 members");

        out.clear();
        members.choose_active_members(10, &mut out, &mut rng, |_| false);
        assert_eq!(0, out.len(), "Filtering works");

        out.clear();
        members.choose_active_members(members.len(), &mut out, &mut rng, |_| true);
        assert_eq!(
            members.num_active(),
            out.len(),
            "Only chooses active members"
        );

        out.clear();
        members.choose_active_members(2, &mut out, &mut rng, |_| true);
        assert_eq!(2, out.len(), "Respects `wanted` even if we have more");

        out.clear();
        members.choose_active_members(usize::MAX, &mut out, &mut rng, |&member_id| {
            member_id.0.parse::<usize>().expect("number") > 4
        });
        assert_eq!(vec![Member::suspect(Id("5"))], out);

        out.clear();
        members.choose_down_members(3, &mut out, &mut rng);
        assert_eq!(2, out.len());
        assert!(out.iter().any(|m| m.id == Id("7")));
        assert!(out.iter().any(|m| m.id == Id("6")));
    }

    #[test]
    fn sets_replaced_id_on_addr_conflict() {
        let id = crate::testing::ID::new(1).rejoinable();
        let mut members = Members::new(Vec::from([
            // 5 active members
            Member::alive(id),
        ]));

        let renewed = id.renew().unwrap();
        let summary = members
            .apply_existing_if(Member::alive(renewed), |_| true)
            .expect("member found");

        assert!(summary.apply_successful);
        assert_eq!(ConflictResult::Replaced(id), summary.conflict);

        let another = renewed.renew().unwrap();
        let summary = members
            .apply_existing_if(Member::alive(another), |_| false)
            .expect("member found");

        assert!(!summary.apply_successful);
        assert_eq!(
            ConflictResult::FailedCondition,
            summary.conflict,
            "must not apply if condition fails"
        );

        // trying to go back to the past leads to
        // conflict resolution failure
        let summary = members
            .apply_existing_if(Member::alive(id), |_| true)
            .expect("member found");

        assert_eq!(ConflictResult::Lost, summary.conflict,);
        assert!(!summary.apply_successful, "must not apply if conflict lost");
    }

    // shoal patch: the indexed `Members` must behave exactly like the
    // released one (`ScanMembers`): same results, same member order, same
    // RNG draws, through random sequences of every operation, including
    // address conflicts (identities that share an address).
    #[derive(Clone, Debug, PartialEq, Eq, Copy, PartialOrd, Ord)]
    struct GenId {
        addr: u16,
        generation: u8,
    }
    impl crate::Identity for GenId {
        type Addr = u16;

        fn renew(&self) -> Option<Self> {
            None
        }

        fn addr(&self) -> Self::Addr {
            self.addr
        }

        fn win_addr_conflict(&self, adversary: &Self) -> bool {
            self.generation > adversary.generation
        }
    }

    use rand::Rng as _;

    /// SmallRng's words, but every third one aimed (for the range `n`
    /// about to be drawn) where Canon's method needs a second word: a word
    /// `x` whose `x * n` ends just below a multiple of `2^32`.
    #[derive(Clone)]
    struct SkewedWords {
        rng: SmallRng,
        n: u64,
    }

    impl rand::TryRng for SkewedWords {
        type Error = core::convert::Infallible;
        fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
            let x = self.rng.next_u32();
            if x % 3 != 0 || self.n == 0 || self.n > u64::from(u32::MAX) {
                return Ok(x);
            }
            let k = 1 + u64::from(x) % self.n;
            Ok((((k << 32) - 1 - u64::from(x >> 28)) / self.n) as u32)
        }
        fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
            let lo = u64::from(self.try_next_u32()?);
            Ok((u64::from(self.try_next_u32()?) << 32) | lo)
        }
        fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
            for chunk in dst.chunks_mut(4) {
                let w = self.try_next_u32()?.to_le_bytes();
                chunk.copy_from_slice(&w[..chunk.len()]);
            }
            Ok(())
        }
    }

    #[test]
    fn reservoir_draw_is_random_range() {
        // Same value and same words consumed as rand's `random_range`, for
        // small, member-sized and huge ranges (the last go to rand itself),
        // with many draws taking the second-word path.
        let mut ranges: Vec<usize> = (1..2_000).collect();
        ranges.extend([
            65_535,
            1 << 20,
            (u32::MAX as usize) - 1,
            u32::MAX as usize,
            (u32::MAX as usize) + 1,
            usize::MAX,
        ]);
        let mut second_words = 0;
        for seed in 0..4u64 {
            let mut ours = SkewedWords { rng: SmallRng::seed_from_u64(seed), n: 0 };
            let mut theirs = ours.clone();
            for _ in 0..8 {
                for &n in &ranges {
                    (ours.n, theirs.n) = (n as u64, n as u64);
                    let before = ours.clone().next_u32();
                    let got = reservoir_draw(&mut ours, n);
                    assert_eq!(got, theirs.random_range(0..n), "seed {seed} n {n}");
                    assert!(got < n);
                    let mut probe = ours.clone();
                    assert_eq!(probe.next_u32(), theirs.clone().next_u32(), "words, n {n}");
                    let Ok(range) = u32::try_from(n) else { continue };
                    let low_half = (u64::from(before) * u64::from(range)) as u32;
                    if low_half > range.wrapping_neg() {
                        second_words += 1;
                    }
                }
            }
        }
        assert!(second_words > 1_000, "second-word path taken {second_words} times");
    }

    #[test]
    fn indexed_members_behave_like_linear_scans() {
        // 24 addresses: conflicts and renames are frequent; 300: the
        // activeness bitmap spans several words (and a partial last one).
        for (addrs, seeds) in [(24, 0..64u64), (300, 64..80u64)] {
            members_behave_like_linear_scans(addrs, seeds);
        }
    }

    fn members_behave_like_linear_scans(addrs: u16, seeds: core::ops::Range<u64>) {
        use super::scan_reference::ScanMembers;

        for seed in seeds {
            let mut ops = SmallRng::seed_from_u64(seed);
            let mut rng_indexed = SmallRng::seed_from_u64(seed ^ 0xF0CA);
            let mut rng_scan = rng_indexed.clone();
            let mut indexed = Members::new(Vec::new());
            let mut scan = ScanMembers::new(Vec::new());
            let random_id = |ops: &mut SmallRng| GenId {
                addr: ops.random_range(0..addrs),
                generation: ops.random_range(0..3),
            };

            for step in 0..2_000 {
                let what = ops.random_range(0..11);
                match what {
                    0..=3 => {
                        let state = [State::Alive, State::Suspect, State::Down]
                            [ops.random_range(0..3)];
                        let update =
                            Member::new(random_id(&mut ops), ops.random_range(0..4), state);
                        assert_eq!(
                            indexed.apply(update.clone(), &mut rng_indexed),
                            scan.apply(update, &mut rng_scan),
                            "seed {seed} step {step}: apply"
                        );
                    }
                    4 => {
                        let update = Member::alive(random_id(&mut ops));
                        let limit = ops.random_range(0..4);
                        assert_eq!(
                            indexed.apply_existing_if(update.clone(), |m| m.incarnation < limit),
                            scan.apply_existing_if(update, |m| m.incarnation < limit),
                            "seed {seed} step {step}: apply_existing_if"
                        );
                    }
                    5 => {
                        let id = random_id(&mut ops);
                        assert_eq!(
                            indexed.remove_if_down(&id),
                            scan.remove_if_down(&id),
                            "seed {seed} step {step}: remove_if_down"
                        );
                    }
                    6 => {
                        let id = random_id(&mut ops);
                        assert_eq!(
                            indexed.is_active(&id),
                            scan.is_active(&id),
                            "seed {seed} step {step}: is_active"
                        );
                        assert_eq!(
                            indexed.active_member(&id),
                            scan.iter_active().find(|m| m.id == id),
                            "seed {seed} step {step}: active_member"
                        );
                    }
                    7 => {
                        assert_eq!(
                            indexed.next(&mut rng_indexed).cloned(),
                            scan.next(&mut rng_scan).cloned(),
                            "seed {seed} step {step}: next"
                        );
                    }
                    10 => {
                        // What foca's callers ask: every active member
                        // but one identity (or none), including wanted
                        // counts above the number of candidates.
                        let wanted = ops.random_range(0..8);
                        let except = random_id(&mut ops);
                        let except = ops.random_bool(0.8).then_some(except);
                        // Usually a member's exact identity.
                        let except = match except {
                            Some(_) if ops.random_bool(0.7) && !scan.inner.is_empty() => {
                                Some(scan.inner[ops.random_range(0..scan.inner.len())].id)
                            }
                            other => other,
                        };
                        let (mut got_indexed, mut got_scan) = (Vec::new(), Vec::new());
                        indexed.choose_active_members_except(
                            wanted,
                            &mut got_indexed,
                            &mut rng_indexed,
                            except.as_ref(),
                        );
                        scan.choose_active_members(wanted, &mut got_scan, &mut rng_scan, |id| {
                            Some(id) != except.as_ref()
                        });
                        assert_eq!(got_indexed, got_scan, "seed {seed} step {step}: except");
                        // A non-empty output takes the exact fallback.
                        let (mut got_indexed, mut got_scan) =
                            (vec![Member::alive(except.unwrap_or(GenId { addr: 0, generation: 0 }))], Vec::new());
                        got_scan.clone_from(&got_indexed);
                        indexed.choose_active_members_except(
                            wanted,
                            &mut got_indexed,
                            &mut rng_indexed,
                            except.as_ref(),
                        );
                        scan.choose_active_members(wanted, &mut got_scan, &mut rng_scan, |id| {
                            Some(id) != except.as_ref()
                        });
                        assert_eq!(got_indexed, got_scan, "seed {seed} step {step}: except, fallback");
                    }
                    _ => {
                        let wanted = ops.random_range(0..6);
                        let skip = ops.random_range(0..addrs);
                        let (mut got_indexed, mut got_scan) = (Vec::new(), Vec::new());
                        if what == 8 {
                            indexed.choose_active_members(
                                wanted,
                                &mut got_indexed,
                                &mut rng_indexed,
                                |id| id.addr != skip,
                            );
                            scan.choose_active_members(
                                wanted,
                                &mut got_scan,
                                &mut rng_scan,
                                |id| id.addr != skip,
                            );
                        } else {
                            indexed.choose_down_members(wanted, &mut got_indexed, &mut rng_indexed);
                            scan.choose_down_members(wanted, &mut got_scan, &mut rng_scan);
                        }
                        assert_eq!(got_indexed, got_scan, "seed {seed} step {step}: choose");
                    }
                }
                assert_eq!(indexed.inner, scan.inner, "seed {seed} step {step}: order");
                indexed.check_active_bits();
                assert_eq!(indexed.num_active(), scan.num_active(), "seed {seed} step {step}");
                assert_eq!(indexed.cursor, scan.cursor, "seed {seed} step {step}: cursor");
            }
            // The RNGs were drawn from exactly as often.
            assert_eq!(
                rng_indexed.random::<u64>(),
                rng_scan.random::<u64>(),
                "seed {seed}: rng"
            );
        }
    }
}
