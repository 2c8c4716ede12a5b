//! The catalog: a plain map of CRDT registers keyed by (service key, instance id).
//!
//! Each entry holds two `crdts::LWWReg`s:
//! - the **lifecycle register**, authority-signed, marker `(generation, revision)`;
//! - the **health register**, owner-signed, marker `(generation, owner_boot, seq)`.
//!
//! Merge is a per-key join (highest marker wins), so delivery order and duplicates never change
//! the outcome. Two records with the *same* marker but different contents are a fault (two
//! authorities signing different things under one revision, or a forged record): the catalog
//! keeps what it has, reports [`MergeOutcome::Conflict`] and counts it (invariant 3, docs/invariants.md).
//!
//! A newer generation supersedes everything of older generations: a health record is only
//! accepted for the generation the lifecycle register holds, and replacing the lifecycle with a
//! newer generation drops the old health register. A delayed record of an old generation is
//! therefore always stale (invariant 2).
//!
//! **Tombstones.** EXPIRED records stay as tombstones until [`Catalog::collect_garbage`] drops
//! those at or below a revision horizon, which becomes the region's `gc_floor`. Because the
//! catalog is complete up to its contiguous head, a lifecycle record for an *absent* key with a
//! revision `<= gc_floor` can only be one that was collected (or superseded by one that was):
//! it is refused as stale, so a peer that has not collected yet cannot revive it. Deltas are
//! never served from below `gc_floor` ([`DeltaError::Compacted`]); the receiver needs a snapshot.

use std::collections::BTreeMap;
use std::sync::Arc;

use imbl::OrdMap;

use crdts::LWWReg;
use serde::{Deserialize, Serialize};
use shoal_proto::{
    Generation, HealthSeq, InstanceId, KeyId, LifecycleState, NodeId, Region, Revision, ServiceKey,
    SignatureError, SignedHealth, SignedLifecycle, TransitionReason, VerifyingKey,
};

use crate::heads::{ChainHead, Gap, Observed};
use crate::verify::Verifier;

mod delta;
mod gc;
mod merge;

use delta::tally;

/// Marker of the lifecycle register.
pub type LifecycleMarker = (Generation, Revision);
/// Marker of the health register.
pub type HealthMarker = (Generation, Generation, HealthSeq);

/// Default cap on the number of entries one catalog holds (a whole region is ~33,000; three
/// regions 100,000). Past it new keys are refused and counted; known keys still update.
pub const DEFAULT_MAX_ENTRIES: usize = 250_000;

/// Most health records held while waiting for their lifecycle record (or for a lifecycle
/// record that binds their signer's key); past it they are ignored (counted as unadmitted or
/// unverified) and anti-entropy brings them again later.
pub const MAX_EARLY_HEALTH: usize = 16_384;

/// Most keys remembered per node (the newest by binding revision). A node gets a new key
/// only when its data directory is replaced, so one or two is the normal case.
pub const MAX_KEYS_PER_NODE: usize = 4;

/// Most nodes whose keys one catalog remembers (a region has ~1,667 nodes). Past it keys of
/// further nodes are not learnt (counted in `MergeCounters::pending_overflow`), so their
/// health stays unverified.
pub const MAX_NODES_WITH_KEYS: usize = 65_536;

/// What merging one record did. Only `Applied` changed state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a refused or stale merge changed nothing; the caller decides what to count or send"]
pub enum MergeOutcome {
    /// The record was newer and is now held.
    Applied,
    /// The record is older than what is held (or was garbage-collected); ignored.
    Stale,
    /// The identical record is already held; ignored.
    Duplicate,
    /// Same ordering key, different contents: a fault. The held record is kept.
    Conflict,
    /// The signature did not verify; ignored.
    BadSignature(SignatureError),
    /// A health record for an instance (generation) the authority has not admitted here yet;
    /// ignored (anti-entropy brings it again after the lifecycle record).
    Unadmitted,
    /// A health record signed by a node that does not own the instance; ignored.
    NotOwner,
    /// The catalog is at its entry cap and the key is new; ignored.
    Full,
    /// A health record whose signer is not (yet) a key any verified lifecycle record bound to
    /// its owner node: held unverified, never counted in heads and never applied unless a
    /// lifecycle record binding that key arrives (ADR 0006).
    Unverified,
}

impl MergeOutcome {
    /// A short stable label for metrics, e.g. `"applied"`.
    pub fn as_label(&self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Stale => "stale",
            Self::Duplicate => "duplicate",
            Self::Conflict => "conflict",
            Self::BadSignature(_) => "bad_signature",
            Self::Unadmitted => "unadmitted",
            Self::NotOwner => "not_owner",
            Self::Full => "full",
            Self::Unverified => "unverified",
        }
    }
}

/// Counts of merge outcomes since the catalog was created.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeCounters {
    /// Records applied.
    pub applied: u64,
    /// Stale records ignored.
    pub stale: u64,
    /// Duplicates ignored.
    pub duplicate: u64,
    /// Conflicting records rejected.
    pub conflict: u64,
    /// Records with a bad or unknown signature rejected.
    pub bad_signature: u64,
    /// Health records for unadmitted instances ignored.
    pub unadmitted: u64,
    /// Health records signed by a non-owner rejected.
    pub not_owner: u64,
    /// New keys refused at the entry cap.
    pub full: u64,
    /// Health records whose signer no verified lifecycle record bound (held unverified).
    pub unverified: u64,
    /// Tombstones garbage-collected.
    pub collected: u64,
    /// Sequence numbers not remembered because a pending set was full.
    pub pending_overflow: u64,
}

impl MergeCounters {
    fn count(&mut self, outcome: &MergeOutcome) {
        let slot = match outcome {
            MergeOutcome::Applied => &mut self.applied,
            MergeOutcome::Stale => &mut self.stale,
            MergeOutcome::Duplicate => &mut self.duplicate,
            MergeOutcome::Conflict => &mut self.conflict,
            MergeOutcome::BadSignature(_) => &mut self.bad_signature,
            MergeOutcome::Unadmitted => &mut self.unadmitted,
            MergeOutcome::NotOwner => &mut self.not_owner,
            MergeOutcome::Full => &mut self.full,
            MergeOutcome::Unverified => &mut self.unverified,
        };
        *slot += 1;
    }
}

/// One instance's two registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Authority-signed lifecycle register.
    pub lifecycle: LWWReg<Arc<SignedLifecycle>, LifecycleMarker>,
    /// Owner-signed health register, if the owner has reported for this generation.
    pub health: Option<LWWReg<Arc<SignedHealth>, HealthMarker>>,
}

impl Entry {
    /// The lifecycle record.
    pub fn lifecycle(&self) -> &SignedLifecycle {
        &self.lifecycle.val
    }

    /// The health record, if any.
    pub fn health(&self) -> Option<&SignedHealth> {
        self.health.as_ref().map(|h| &*h.val)
    }
}

/// All instances of one service key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceEntries {
    /// Catalog index of the last change to this service (for blocking queries).
    pub modify_index: u64,
    /// Instances by id.
    pub instances: OrdMap<InstanceId, Entry>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct RegionState {
    head: ChainHead,
    gc_floor: Revision,
    /// Current record of every held entry, by its revision (the record names its key).
    by_revision: OrdMap<Revision, Arc<SignedLifecycle>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct OwnerState {
    head: ChainHead,
    /// Current health record of every held entry of this owner, by (boot, seq).
    by_seq: HealthBySeq,
}

/// An owner's health records by (boot, seq).
type HealthBySeq = OrdMap<(Generation, HealthSeq), Arc<SignedHealth>>;

/// Head of one region's authority chain, as exchanged in anti-entropy and stored in snapshots.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RegionHead {
    /// Region.
    pub region: Region,
    /// Complete up to this revision.
    pub contiguous: Revision,
    /// Highest revision seen at all.
    pub max_seen: Revision,
    /// Tombstones at or below this revision were collected.
    pub gc_floor: Revision,
    /// Digest of the revisions seen above `contiguous` (0: none); see
    /// [`ChainHead::pending_hash`].
    pub pending_hash: u64,
}

/// Head of one owner agent's health chain.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OwnerHead {
    /// Owner node.
    pub owner: NodeId,
    /// Owner agent boot generation (the chain's epoch).
    pub boot: Generation,
    /// Complete up to this sequence number.
    pub contiguous: HealthSeq,
    /// Digest of the sequence numbers seen above `contiguous` (0: none).
    pub pending_hash: u64,
}

/// Per-origin version heads of a whole catalog, sorted by origin.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heads {
    /// One per region seen.
    pub regions: Vec<RegionHead>,
    /// One per owner node seen.
    pub owners: Vec<OwnerHead>,
}

/// Lifecycle records of one region that changed in `(from, complete_to]`, plus possibly newer
/// ones above `complete_to` (not covered by the completeness claim).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleDelta {
    /// Region.
    pub region: Region,
    /// Exclusive lower bound: the receiver's head when it asked.
    pub from: Revision,
    /// Every record whose current revision is in `(from, complete_to]` is included.
    pub complete_to: Revision,
    /// The records, ascending by revision.
    pub records: Vec<Arc<SignedLifecycle>>,
    /// Revisions above `complete_to` the sender had accounted for (a held record or one that
    /// supersedes it, all included in `records`). The receiver accounts for them too: this is
    /// how knowledge of superseded revisions spreads, so gaps close even when no single member
    /// ever held every revision (e.g. after a partition).
    pub also_seen: Vec<Revision>,
}

/// Health records of one owner chain in `(from, complete_to]` of epoch `boot`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthDelta {
    /// Owner node.
    pub owner: NodeId,
    /// Chain epoch (owner agent boot generation).
    pub boot: Generation,
    /// Exclusive lower bound.
    pub from: HealthSeq,
    /// Every current record of the chain with seq in `(from, complete_to]` is included.
    pub complete_to: HealthSeq,
    /// The records, ascending by seq.
    pub records: Vec<Arc<SignedHealth>>,
    /// Sequence numbers above `complete_to` the sender had accounted for (see
    /// [`LifecycleDelta::also_seen`]).
    pub also_seen: Vec<HealthSeq>,
}

/// Why a delta could not be served. The catalog is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaError {
    /// Tombstones above `since` were already collected: the asker needs a full snapshot.
    #[error("delta since {since} impossible: tombstones up to {gc_floor} were collected")]
    Compacted {
        /// What was asked for.
        since: Revision,
        /// This catalog's GC floor for the region.
        gc_floor: Revision,
    },
}

/// Summary of applying a delta.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeltaOutcome {
    /// Records applied.
    pub applied: usize,
    /// Records not applied (stale, duplicate, rejected).
    pub ignored: usize,
    /// Records rejected as faults (conflict, bad signature, not owner, full).
    pub rejected: usize,
    /// Whether the completeness claim moved this catalog's head.
    pub head_advanced: bool,
}

/// A region-scoped or service-scoped change notice produced by every applied merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The service that changed.
    pub key: ServiceKey,
    /// The instance that changed.
    pub instance: InstanceId,
    /// Catalog index after the change.
    pub index: u64,
}

/// The endpoint catalog of one agent. See the module docs for the merge rules.
///
/// Every map is a persistent B-tree ([`imbl::OrdMap`], 16 keys per node): `clone` is O(1) and
/// shares structure, and a write copies only the path to the changed leaf of a shared tree.
/// Blocking queries and snapshot writers can therefore take a consistent copy without locking
/// out merges (the approach of Consul's go-memdb immutable radix trees), and the simulator's
/// agents, seeded from one catalog, hold only what they changed since (ADR 0005).
#[derive(Debug, Clone)]
pub struct Catalog {
    services: OrdMap<ServiceKey, ServiceEntries>,
    regions: OrdMap<Region, RegionState>,
    owners: OrdMap<NodeId, OwnerState>,
    /// Health records that cannot be judged yet: their lifecycle record (generation) has not
    /// arrived, or no lifecycle record binding their signer's key has (yet). Every record is
    /// kept under its own marker, so an unverified one never displaces a genuine one; only
    /// verified ones ever reach the registers or the heads. Bounded by [`MAX_EARLY_HEALTH`].
    early_health: OrdMap<(ServiceKey, InstanceId), OrdMap<(HealthMarker, NodeId), Held>>,
    /// How many records `early_health` holds in all.
    early_count: usize,
    /// Node keys learnt from verified lifecycle records (ADR 0006): a grow-only record of
    /// bindings and revocations, so health verification does not depend on delivery order.
    node_keys: OrdMap<NodeId, NodeKeys>,
    entries: usize,
    max_entries: usize,
    index: u64,
    counters: MergeCounters,
}

/// A health record waiting in the early hold.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    record: Arc<SignedHealth>,
    /// Its signature verified against a key bound to its owner node.
    verified: bool,
}

/// What a catalog learnt about one node's keys from verified lifecycle records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct NodeKeys {
    /// Keys bound to the node, each with the lowest revision of a record that bound it (when
    /// it became the node's key); at most [`MAX_KEYS_PER_NODE`], the newest.
    keys: Vec<(VerifyingKey, Revision)>,
    /// Highest revision of a record that revoked the node (0: never). Every key first bound
    /// below it is revoked for good: a readmitted node must present a new key (the authority
    /// refuses a revoked one).
    revoked_at: Revision,
}

/// How a health record's signer relates to its owner node's bound keys.
enum KeyStatus<'a> {
    /// No verified lifecycle record bound this key to the node (yet).
    Unknown,
    /// Bound once, but the node was revoked after its last binding.
    Revoked,
    /// Bound: the key and the lowest revision that bound it.
    Bound(&'a VerifyingKey, Revision),
}

impl NodeKeys {
    fn status(&self, signer: KeyId) -> KeyStatus<'_> {
        match self.keys.iter().find(|(k, _)| k.id() == signer) {
            None => KeyStatus::Unknown,
            Some((_, first)) if *first < self.revoked_at => KeyStatus::Revoked,
            Some((k, first)) => KeyStatus::Bound(k, *first),
        }
    }

    /// Remembers that `key` was bound at `revision`; true when the key is new here.
    fn bind(&mut self, key: &[u8; 32], revision: Revision) -> bool {
        if let Some((_, first)) = self.keys.iter_mut().find(|(k, _)| k.to_bytes() == *key) {
            *first = (*first).min(revision);
            return false;
        }
        let Ok(key) = VerifyingKey::from_bytes(*key) else {
            // Not a curve point: nothing can verify against it.
            return false;
        };
        self.keys.push((key, revision));
        if self.keys.len() > MAX_KEYS_PER_NODE {
            let oldest = self
                .keys
                .iter()
                .enumerate()
                .min_by_key(|(_, (k, first))| (*first, k.to_bytes()))
                .map(|(i, _)| i)
                .expect("not empty");
            self.keys.swap_remove(oldest);
        }
        // Canonical order, so equal knowledge compares equal whatever the arrival order.
        self.keys.sort_by_key(|(k, _)| k.to_bytes());
        true
    }

    /// Remembers a revocation at `revision`; true when it revokes something new.
    fn revoke(&mut self, revision: Revision) -> bool {
        if revision <= self.revoked_at {
            return false;
        }
        self.revoked_at = revision;
        true
    }
}

/// The key id of the owner key a lifecycle record binds, if any.
fn bound_key_id(rec: &shoal_proto::LifecycleRecord) -> Option<KeyId> {
    let k = rec.owner_key?;
    let mut id = [0u8; 8];
    id.copy_from_slice(&k[..8]);
    Some(KeyId(id))
}

/// Walks two maps with sorted keys side by side and collects `(key, x)` for every key of
/// `mine` also in `theirs` where `f(mine_value, theirs_value)` gives `Some(x)`, in key order.
/// One pass over both, instead of one lookup in `theirs` per key of `mine`.
fn matching<K: Ord + Clone, V: Clone, X>(
    mine: &OrdMap<K, V>,
    theirs: &OrdMap<K, V>,
    mut f: impl FnMut(&V, &V) -> Option<X>,
) -> Vec<(K, X)> {
    let mut out = Vec::new();
    let mut theirs = theirs.iter().peekable();
    for (k, v) in mine {
        while theirs.next_if(|(tk, _)| *tk < k).is_some() {}
        let Some((tk, tv)) = theirs.peek() else {
            break;
        };
        if *tk == k {
            if let Some(x) = f(v, tv) {
                out.push((k.clone(), x));
            }
        }
    }
    out
}

impl Default for Catalog {
    fn default() -> Self {
        Self::new()
    }
}

impl PartialEq for Catalog {
    /// Two catalogs are equal when they hold the same records and heads (indices, counters
    /// and the node keys learnt are local bookkeeping and do not count: a catalog filled by a
    /// delta never saw the superseded records another one learnt a key from first).
    fn eq(&self, other: &Self) -> bool {
        self.services.len() == other.services.len()
            && self
                .services
                .iter()
                .zip(other.services.iter())
                .all(|((ka, a), (kb, b))| ka == kb && a.instances == b.instances)
            && self.regions == other.regions
            && self.owners == other.owners
            && self.early_health == other.early_health
    }
}

impl Catalog {
    /// An empty catalog with [`DEFAULT_MAX_ENTRIES`].
    pub fn new() -> Self {
        Self::with_max_entries(DEFAULT_MAX_ENTRIES)
    }

    /// An empty catalog holding at most `max_entries` instances.
    pub fn with_max_entries(max_entries: usize) -> Self {
        Self {
            services: OrdMap::new(),
            regions: OrdMap::new(),
            owners: OrdMap::new(),
            early_health: OrdMap::new(),
            early_count: 0,
            node_keys: OrdMap::new(),
            entries: 0,
            max_entries,
            index: 0,
            counters: MergeCounters::default(),
        }
    }

    // ---- getters -------------------------------------------------------------------------

    /// Number of instances held (tombstones included).
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Number of owner nodes with a health head or health records here (an owner is added on
    /// the first health record or head observed for it, and never removed).
    pub fn owner_count(&self) -> usize {
        self.owners.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// The catalog index: bumped by every applied change; Consul's `X-Consul-Index` analogue.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Merge outcome counters.
    pub fn counters(&self) -> &MergeCounters {
        &self.counters
    }

    /// Zeroes the merge outcome counters (e.g. for a copy of another agent's catalog, whose
    /// counters describe that agent's merges, not this one's).
    pub fn reset_counters(&mut self) {
        self.counters = MergeCounters::default();
    }

    /// All service keys held, sorted.
    pub fn service_keys(&self) -> impl Iterator<Item = &ServiceKey> {
        self.services.keys()
    }

    /// True when both catalogs hold the very same entry tree (one was cloned from the other
    /// and neither changed an entry since): then they hold the same entries. O(1); `false`
    /// says nothing.
    pub fn shares_entries_with(&self, other: &Catalog) -> bool {
        self.services.ptr_eq(&other.services)
    }

    /// The entries of one service, if any.
    pub fn service(&self, key: &ServiceKey) -> Option<&ServiceEntries> {
        self.services.get(key)
    }

    /// One entry.
    pub fn entry(&self, key: &ServiceKey, instance: &InstanceId) -> Option<&Entry> {
        self.services.get(key)?.instances.get(instance)
    }

    /// Iterates every entry in key order.
    pub fn entries(&self) -> impl Iterator<Item = (&ServiceKey, &InstanceId, &Entry)> {
        self.services
            .iter()
            .flat_map(|(k, s)| s.instances.iter().map(move |(i, e)| (k, i, e)))
    }

    /// Contiguous head of a region's authority chain (0 if never seen).
    pub fn region_head(&self, region: &Region) -> Revision {
        self.regions
            .get(region)
            .map_or(Revision(0), |r| Revision(r.head.contiguous()))
    }

    /// The first missing revision range of a region, if a gap is open.
    pub fn region_gap(&self, region: &Region) -> Option<Gap> {
        self.regions.get(region)?.head.gap()
    }

    /// The first missing range of an owner's health chain, if a gap is open.
    pub fn owner_gap(&self, owner: &NodeId) -> Option<Gap> {
        self.owners.get(owner)?.head.gap()
    }

    /// Every open gap: `(Some(region), gap)` for authority chains, `(None, gap)` with the owner
    /// for health chains. Sorted by origin.
    pub fn gaps(&self) -> Vec<(GapOrigin, Gap)> {
        let regions = self
            .regions
            .iter()
            .filter_map(|(r, s)| Some((GapOrigin::Region(r.clone()), s.head.gap()?)));
        let owners = self
            .owners
            .iter()
            .filter_map(|(n, s)| Some((GapOrigin::Owner(n.clone()), s.head.gap()?)));
        regions.chain(owners).collect()
    }

    /// Number of open gaps (authority and owner chains), without allocating.
    pub fn open_gaps(&self) -> usize {
        self.regions
            .values()
            .filter(|s| s.head.gap().is_some())
            .count()
            + self
                .owners
                .values()
                .filter(|s| s.head.gap().is_some())
                .count()
    }

    /// Per-origin heads, sorted.
    pub fn heads(&self) -> Heads {
        Heads {
            regions: self
                .regions
                .iter()
                .map(|(region, s)| RegionHead {
                    region: region.clone(),
                    contiguous: Revision(s.head.contiguous()),
                    max_seen: Revision(s.head.max_seen()),
                    gc_floor: s.gc_floor,
                    pending_hash: s.head.pending_hash(),
                })
                .collect(),
            owners: self
                .owners
                .iter()
                .map(|(owner, s)| OwnerHead {
                    owner: owner.clone(),
                    boot: Generation(s.head.epoch()),
                    contiguous: HealthSeq(s.head.contiguous()),
                    pending_hash: s.head.pending_hash(),
                })
                .collect(),
        }
    }
}

/// Where a gap is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum GapOrigin {
    /// In a region's authority revision chain.
    Region(Region),
    /// In an owner agent's health chain.
    Owner(NodeId),
}
