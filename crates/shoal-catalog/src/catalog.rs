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

    // ---- merging single records ----------------------------------------------------------

    /// Verifies and merges one lifecycle record. Returns what happened; only `Applied` changes
    /// the held records (the region's head may advance on `Stale`/`Duplicate` too, since the
    /// revision is then accounted for).
    pub fn apply_lifecycle(
        &mut self,
        record: Arc<SignedLifecycle>,
        verifier: &dyn Verifier,
    ) -> MergeOutcome {
        let outcome = self.merge_lifecycle(record, verifier);
        self.counters.count(&outcome);
        outcome
    }

    fn merge_lifecycle(
        &mut self,
        signed: Arc<SignedLifecycle>,
        verifier: &dyn Verifier,
    ) -> MergeOutcome {
        let rec = &signed.record;
        // Fast path for the common repeat (Plumtree and anti-entropy deliver most records more
        // than once): the record held under this revision is this very record, so it was
        // verified and its revision observed when it was stored. Same outcome as the full
        // path below, with one lookup instead of several.
        if let Some(held) = self
            .regions
            .get(&rec.region)
            .and_then(|r| r.by_revision.get(&rec.revision))
        {
            if Arc::ptr_eq(held, &signed) || **held == *signed {
                return MergeOutcome::Duplicate;
            }
        }
        if let Err(e) = verifier.verify_lifecycle(&signed) {
            return MergeOutcome::BadSignature(e);
        }
        let region = self.regions.entry(rec.region.clone()).or_default();
        let marker = rec.order();
        let held = self
            .services
            .get(&rec.key)
            .and_then(|s| s.instances.get(&rec.instance));
        let outcome = match held {
            None if rec.revision <= region.gc_floor => MergeOutcome::Stale,
            None if self.entries >= self.max_entries => return MergeOutcome::Full,
            None => MergeOutcome::Applied,
            Some(entry) => {
                if entry.lifecycle.validate_update(&signed, &marker).is_err() {
                    MergeOutcome::Conflict
                } else if marker < entry.lifecycle.marker {
                    MergeOutcome::Stale
                } else if marker == entry.lifecycle.marker {
                    MergeOutcome::Duplicate
                } else {
                    MergeOutcome::Applied
                }
            }
        };
        // One revision names one transition: a record reusing a revision held by another
        // instance is a fault (two leaders, a forged record), never a second truth.
        let reused = region
            .by_revision
            .get(&rec.revision)
            .is_some_and(|r| (&r.record.key, &r.record.instance) != (&rec.key, &rec.instance));
        let outcome = if outcome == MergeOutcome::Applied && reused {
            MergeOutcome::Conflict
        } else {
            outcome
        };
        if region.head.observe(0, rec.revision.0) == Observed::Overflow {
            self.counters.pending_overflow += 1;
        }
        // Every verified record teaches the owner's key, stale ones too: health signed by a
        // key an older record bound must be judged the same whatever the arrival order.
        let learnt = matches!(
            outcome,
            MergeOutcome::Applied | MergeOutcome::Stale | MergeOutcome::Duplicate
        ) && self.learn_keys(&signed);
        let owner = learnt.then(|| signed.record.owner.clone());
        if outcome == MergeOutcome::Applied {
            let (key, instance) = (signed.record.key.clone(), signed.record.instance.clone());
            self.store_lifecycle(signed);
            self.admit_early(&key, &instance, verifier);
        }
        if let Some(owner) = owner {
            self.recheck_owner(&owner, verifier);
        }
        outcome
    }

    /// Learns the owner key (or revocation) a verified lifecycle record carries; true when
    /// something new was learnt (held health of that node must then be judged again).
    fn learn_keys(&mut self, signed: &SignedLifecycle) -> bool {
        let rec = &signed.record;
        let revoked = rec.reason == TransitionReason::NodeRevoked;
        // Most records repeat what is known: decide that without copying anything.
        let news = match self.node_keys.get(&rec.owner) {
            None => revoked || rec.owner_key.is_some(),
            Some(known) => {
                (revoked && rec.revision > known.revoked_at)
                    || rec.owner_key.is_some_and(|b| {
                        known
                            .keys
                            .iter()
                            .find(|(k, _)| k.to_bytes() == b)
                            .is_none_or(|(_, first)| rec.revision < *first)
                    })
            }
        };
        if !news {
            return false;
        }
        if self.node_keys.len() >= MAX_NODES_WITH_KEYS && !self.node_keys.contains_key(&rec.owner) {
            self.counters.pending_overflow += 1;
            return false;
        }
        let mut keys = self.node_keys.get(&rec.owner).cloned().unwrap_or_default();
        if revoked {
            keys.revoke(rec.revision);
        }
        if let Some(k) = &rec.owner_key {
            keys.bind(k, rec.revision);
        }
        self.node_keys.insert(rec.owner.clone(), keys);
        true
    }

    fn store_lifecycle(&mut self, signed: Arc<SignedLifecycle>) {
        self.index += 1;
        let index = self.index;
        let rec = &signed.record;
        let key = rec.key.clone();
        let instance = rec.instance.clone();
        let marker = rec.order();
        let region = self
            .regions
            .get_mut(&rec.region)
            .expect("region created on merge");
        region.by_revision.insert(rec.revision, Arc::clone(&signed));
        let service = self.services.entry(key).or_default();
        service.modify_index = index;
        match service.instances.get_mut(&instance) {
            None => {
                service.instances.insert(
                    instance,
                    Entry {
                        lifecycle: LWWReg {
                            val: signed,
                            marker,
                        },
                        health: None,
                    },
                );
                self.entries += 1;
            }
            Some(entry) => {
                let old = &entry.lifecycle.val.record;
                if old.region == rec.region {
                    region.by_revision.remove(&old.revision);
                } else if let Some(r) = self.regions.get_mut(&old.region) {
                    r.by_revision.remove(&old.revision);
                }
                // Health stays only while it is of this generation and signed by the key this
                // record binds: a re-issue for a replaced key drops health of the old key.
                let drop_health = entry.health.as_ref().is_some_and(|h| {
                    h.marker.0 < marker.0 || Some(h.val.signer) != bound_key_id(rec)
                }) || rec.state == LifecycleState::Expired;
                if drop_health {
                    if let Some(h) = entry.health.take() {
                        let hr = &h.val.record;
                        if let Some(o) = self.owners.get_mut(&hr.owner) {
                            o.by_seq.remove(&(hr.owner_boot, hr.seq));
                        }
                    }
                }
                entry.lifecycle.update(signed, marker);
            }
        }
    }

    /// Verifies and merges one health record. Accepted only when the lifecycle register holds
    /// the same generation and names the signer's node as owner.
    pub fn apply_health(
        &mut self,
        record: Arc<SignedHealth>,
        verifier: &dyn Verifier,
    ) -> MergeOutcome {
        let outcome = self.merge_health(record, verifier);
        self.counters.count(&outcome);
        outcome
    }

    fn merge_health(&mut self, signed: Arc<SignedHealth>, verifier: &dyn Verifier) -> MergeOutcome {
        let rec = &signed.record;
        // Which key may have signed it: one a verified lifecycle record bound to its owner.
        let checked = match self
            .node_keys
            .get(&rec.owner)
            .map_or(KeyStatus::Unknown, |k| k.status(signed.signer))
        {
            KeyStatus::Unknown => Ok(None),
            KeyStatus::Revoked => Err(SignatureError::Revoked(signed.signer)),
            KeyStatus::Bound(key, first) => {
                verifier.verify_health(&signed, key).map(|()| Some(first))
            }
        };
        let first_bound = match checked {
            Err(e) => return MergeOutcome::BadSignature(e),
            Ok(None) => return self.hold_early(signed, false),
            Ok(Some(first)) => first,
        };
        let Some(entry) = self
            .services
            .get(&rec.key)
            .and_then(|s| s.instances.get(&rec.instance))
        else {
            return self.hold_early(signed, true);
        };
        let life = &entry.lifecycle.val.record;
        if life.generation < rec.generation {
            return self.hold_early(signed, true);
        }
        if life.generation > rec.generation || life.state == LifecycleState::Expired {
            self.observe_owner(rec.owner.clone(), rec.owner_boot, rec.seq);
            return MergeOutcome::Stale;
        }
        if life.owner != rec.owner {
            return MergeOutcome::NotOwner;
        }
        if bound_key_id(life) != Some(signed.signer) {
            // Signed by another key of the owner. One bound after this record was signed may
            // be re-bound to the instance by a re-issue on its way: wait for it. An older one
            // was replaced: its health is superseded (ADR 0006).
            if first_bound > life.revision {
                return self.hold_early(signed, true);
            }
            self.observe_owner(rec.owner.clone(), rec.owner_boot, rec.seq);
            return MergeOutcome::Stale;
        }
        let marker = rec.order();
        let outcome = match &entry.health {
            None => MergeOutcome::Applied,
            Some(h) if h.validate_update(&signed, &marker).is_err() => MergeOutcome::Conflict,
            Some(h) if marker < h.marker => MergeOutcome::Stale,
            Some(h) if marker == h.marker => MergeOutcome::Duplicate,
            Some(_) => MergeOutcome::Applied,
        };
        self.observe_owner(rec.owner.clone(), rec.owner_boot, rec.seq);
        if outcome == MergeOutcome::Applied {
            self.store_health(signed);
        }
        outcome
    }

    /// Keeps a health record that cannot be judged yet: its lifecycle record (generation) has
    /// not arrived (`verified`), or its signer is no key bound to its owner yet (not
    /// `verified`). Each record is held under its own marker and owner, so a forged record
    /// never displaces a genuine one; a held record counts nowhere until it is judged.
    fn hold_early(&mut self, signed: Arc<SignedHealth>, verified: bool) -> MergeOutcome {
        let outcome = if verified {
            MergeOutcome::Unadmitted
        } else {
            MergeOutcome::Unverified
        };
        let slot = (signed.record.key.clone(), signed.record.instance.clone());
        let at = (signed.record.order(), signed.record.owner.clone());
        let full = self.early_count >= MAX_EARLY_HEALTH;
        let held = self.early_health.get(&slot).and_then(|m| m.get(&at));
        match held {
            // A genuine record replaces a forged one held under its marker.
            Some(h) if !h.verified && verified && *h.record != *signed => {}
            Some(h) if h.verified && verified && *h.record != *signed => {
                return MergeOutcome::Conflict
            }
            Some(_) => return outcome,
            None if full => return outcome,
            None => self.early_count += 1,
        }
        self.early_health.entry(slot).or_default().insert(
            at,
            Held {
                record: signed,
                verified,
            },
        );
        outcome
    }

    /// After a lifecycle record of this slot is stored, judges the health records held for
    /// it again.
    fn admit_early(&mut self, key: &ServiceKey, instance: &InstanceId, verifier: &dyn Verifier) {
        if self.early_count == 0 {
            return;
        }
        let slot = (key.clone(), instance.clone());
        let Some(held) = self.early_health.remove(&slot) else {
            return;
        };
        self.early_count -= held.len();
        for (_, h) in held {
            self.rejudge(h.record, verifier);
        }
    }

    /// After something new was learnt about `owner`'s keys, judges every record held for the
    /// node again (unverified ones may verify now, verified ones may be revoked).
    fn recheck_owner(&mut self, owner: &NodeId, verifier: &dyn Verifier) {
        if self.early_count == 0 {
            return;
        }
        let mut again = Vec::new();
        let slots: Vec<(ServiceKey, InstanceId)> = self
            .early_health
            .iter()
            .filter(|(_, m)| m.keys().any(|(_, n)| n == owner))
            .map(|(s, _)| s.clone())
            .collect();
        for slot in slots {
            let m = self.early_health.get_mut(&slot).expect("listed");
            let ats: Vec<_> = m.keys().filter(|(_, n)| n == owner).cloned().collect();
            for at in ats {
                again.push(m.remove(&at).expect("listed").record);
                self.early_count -= 1;
            }
            if m.is_empty() {
                self.early_health.remove(&slot);
            }
        }
        for record in again {
            self.rejudge(record, verifier);
        }
    }

    fn rejudge(&mut self, record: Arc<SignedHealth>, verifier: &dyn Verifier) {
        let outcome = self.merge_health(record, verifier);
        if !matches!(
            outcome,
            MergeOutcome::Applied | MergeOutcome::Unadmitted | MergeOutcome::Unverified
        ) {
            self.counters.count(&outcome);
        }
    }

    fn observe_owner(&mut self, owner: NodeId, boot: Generation, seq: HealthSeq) {
        let state = self.owners.entry(owner).or_default();
        if state.head.observe(boot.0, seq.0) == Observed::Overflow {
            self.counters.pending_overflow += 1;
        }
    }

    fn store_health(&mut self, signed: Arc<SignedHealth>) {
        self.index += 1;
        let index = self.index;
        let rec = &signed.record;
        let marker = rec.order();
        let owner = self.owners.entry(rec.owner.clone()).or_default();
        owner
            .by_seq
            .insert((rec.owner_boot, rec.seq), Arc::clone(&signed));
        let service = self.services.get_mut(&rec.key).expect("checked in merge");
        service.modify_index = index;
        let entry = service
            .instances
            .get_mut(&rec.instance)
            .expect("checked in merge");
        match &mut entry.health {
            None => {
                entry.health = Some(LWWReg {
                    val: signed,
                    marker,
                })
            }
            Some(h) => {
                let old = &h.val.record;
                if let Some(o) = self.owners.get_mut(&old.owner) {
                    o.by_seq.remove(&(old.owner_boot, old.seq));
                }
                h.update(signed, marker);
            }
        }
    }

    // ---- merging whole catalogs ----------------------------------------------------------

    /// Merges every record of `other` into `self` (lifecycle first, so health finds its
    /// admission), then adopts `other`'s heads where they extend ours without a hole.
    pub fn merge_catalog(&mut self, other: &Catalog, verifier: &dyn Verifier) -> DeltaOutcome {
        let mut out = DeltaOutcome::default();
        // Keys `other` learnt from records it no longer holds (superseded ones) count here
        // too, or a merge would judge health differently from applying every record.
        let mut learnt = Vec::new();
        for (node, theirs) in &other.node_keys {
            let mut ours = self.node_keys.get(node).cloned().unwrap_or_default();
            let before = ours.clone();
            ours.revoke(theirs.revoked_at);
            for (k, first) in &theirs.keys {
                ours.bind(&k.to_bytes(), *first);
            }
            if ours != before {
                self.node_keys.insert(node.clone(), ours);
                learnt.push(node.clone());
            }
        }
        for node in &learnt {
            self.recheck_owner(node, verifier);
        }
        for (_, _, e) in other.entries() {
            tally(
                &mut out,
                &self.apply_lifecycle(e.lifecycle.val.clone(), verifier),
            );
        }
        for (_, _, e) in other.entries() {
            if let Some(h) = &e.health {
                tally(&mut out, &self.apply_health(h.val.clone(), verifier));
            }
        }
        for early in other.early_health.values().flat_map(|m| m.values()) {
            tally(&mut out, &self.apply_health(early.record.clone(), verifier));
        }
        if out.rejected == 0 {
            for (region, theirs) in &other.regions {
                // Their completeness covers ours only if they collected no tombstone we have
                // not seen: otherwise a record they dropped could still be live here.
                let ours = self.regions.entry(region.clone()).or_default();
                if ours.head.contiguous() >= theirs.gc_floor.0 {
                    let before = ours.head.contiguous();
                    ours.head.join(&theirs.head);
                    out.head_advanced |= ours.head.contiguous() > before;
                }
            }
            for (owner, theirs) in &other.owners {
                let ours = self.owners.entry(owner.clone()).or_default();
                let before = (ours.head.epoch(), ours.head.contiguous());
                ours.head.join(&theirs.head);
                out.head_advanced |= (ours.head.epoch(), ours.head.contiguous()) > before;
            }
        }
        out
    }

    // ---- deltas --------------------------------------------------------------------------

    /// Lifecycle records of `region` that changed after `since`, at most `max_records`.
    ///
    /// # Errors
    /// [`DeltaError::Compacted`] when `since` is below this catalog's GC floor.
    pub fn lifecycle_delta(
        &self,
        region: &Region,
        since: Revision,
        max_records: usize,
    ) -> Result<LifecycleDelta, DeltaError> {
        let empty = LifecycleDelta {
            region: region.clone(),
            from: since,
            complete_to: since,
            records: Vec::new(),
            also_seen: Vec::new(),
        };
        let Some(state) = self.regions.get(region) else {
            return Ok(empty);
        };
        if since < state.gc_floor {
            return Err(DeltaError::Compacted {
                since,
                gc_floor: state.gc_floor,
            });
        }
        let mut records = Vec::new();
        let mut truncated_at = None;
        for (rev, rec) in state.by_revision.range(since.next()..) {
            if records.len() == max_records {
                truncated_at = Some(Revision(rev.0 - 1));
                break;
            }
            records.push(Arc::clone(rec));
        }
        let contiguous = Revision(state.head.contiguous());
        let complete_to = truncated_at
            .unwrap_or(contiguous)
            .min(contiguous)
            .max(since);
        let last = truncated_at.map_or(u64::MAX, |r| r.0);
        let also_seen = state
            .head
            .pending()
            .filter(|p| *p > complete_to.0 && *p <= last)
            .map(Revision)
            .collect();
        Ok(LifecycleDelta {
            complete_to,
            records,
            also_seen,
            ..empty
        })
    }

    /// Health records of `owner` newer than `(boot, since)`, at most `max_records`. When this
    /// catalog knows a newer boot of the owner, the delta starts at 0 of that boot.
    pub fn health_delta(
        &self,
        owner: &NodeId,
        boot: Generation,
        since: HealthSeq,
        max_records: usize,
    ) -> HealthDelta {
        let Some(state) = self.owners.get(owner) else {
            return HealthDelta {
                owner: owner.clone(),
                boot,
                from: since,
                complete_to: since,
                records: Vec::new(),
                also_seen: Vec::new(),
            };
        };
        let our_boot = Generation(state.head.epoch());
        let from = if our_boot > boot { HealthSeq(0) } else { since };
        let mut records = Vec::new();
        let mut truncated_at = None;
        if our_boot >= boot {
            let start = (our_boot, from.next());
            let end = (our_boot.next(), HealthSeq(0));
            let candidates: Vec<(HealthSeq, &Arc<SignedHealth>)> = state
                .by_seq
                .range(start..end)
                .map(|((_, seq), rec)| (*seq, rec))
                .collect();
            // Records held early are counted in no head, so no delta claims them and none
            // needs to carry them: peers get them from the chains that hold them.
            for (seq, rec) in candidates {
                if records.len() == max_records {
                    truncated_at = Some(HealthSeq(seq.0 - 1));
                    break;
                }
                records.push(Arc::clone(rec));
            }
        }
        let contiguous = HealthSeq(state.head.contiguous());
        let complete_to = if our_boot < boot {
            since
        } else {
            truncated_at.unwrap_or(contiguous).min(contiguous).max(from)
        };
        let last = truncated_at.map_or(u64::MAX, |r| r.0);
        let also_seen = if our_boot < boot {
            Vec::new()
        } else {
            state
                .head
                .pending()
                .filter(|p| *p > complete_to.0 && *p <= last)
                .map(HealthSeq)
                .collect()
        };
        HealthDelta {
            owner: owner.clone(),
            boot: our_boot.max(boot),
            from,
            complete_to,
            records,
            also_seen,
        }
    }

    /// Applies a lifecycle delta; extends the head by its completeness claim when every record
    /// in it was accepted.
    pub fn apply_lifecycle_delta(
        &mut self,
        delta: &LifecycleDelta,
        verifier: &dyn Verifier,
    ) -> DeltaOutcome {
        self.apply_lifecycle_delta_observed(delta, verifier, |_, _| {})
    }

    /// [`Catalog::apply_lifecycle_delta`], calling `observe` with each record's outcome.
    pub fn apply_lifecycle_delta_observed(
        &mut self,
        delta: &LifecycleDelta,
        verifier: &dyn Verifier,
        mut observe: impl FnMut(&Arc<SignedLifecycle>, &MergeOutcome),
    ) -> DeltaOutcome {
        let mut out = DeltaOutcome::default();
        for rec in &delta.records {
            let o = self.apply_lifecycle(rec.clone(), verifier);
            observe(rec, &o);
            tally(&mut out, &o);
        }
        if out.rejected == 0 {
            let state = self.regions.entry(delta.region.clone()).or_default();
            out.head_advanced = state.head.cover(0, delta.from.0, delta.complete_to.0);
            for seen in delta.also_seen.iter().take(crate::heads::MAX_PENDING) {
                state.head.observe(0, seen.0);
            }
        }
        out
    }

    /// Applies a health delta; extends the owner's head like
    /// [`Catalog::apply_lifecycle_delta`]. Unadmitted records also block the extension (they
    /// will be asked for again once their lifecycle record arrives).
    pub fn apply_health_delta(
        &mut self,
        delta: &HealthDelta,
        verifier: &dyn Verifier,
    ) -> DeltaOutcome {
        self.apply_health_delta_observed(delta, verifier, |_, _| {})
    }

    /// [`Catalog::apply_health_delta`], calling `observe` with each record's outcome.
    pub fn apply_health_delta_observed(
        &mut self,
        delta: &HealthDelta,
        verifier: &dyn Verifier,
        mut observe: impl FnMut(&Arc<SignedHealth>, &MergeOutcome),
    ) -> DeltaOutcome {
        let mut out = DeltaOutcome::default();
        let mut unadmitted = false;
        for rec in &delta.records {
            let o = self.apply_health(rec.clone(), verifier);
            observe(rec, &o);
            unadmitted |= matches!(o, MergeOutcome::Unadmitted | MergeOutcome::Unverified);
            tally(&mut out, &o);
        }
        if out.rejected == 0 && !unadmitted {
            let state = self.owners.entry(delta.owner.clone()).or_default();
            out.head_advanced = state
                .head
                .cover(delta.boot.0, delta.from.0, delta.complete_to.0);
            if state.head.epoch() == delta.boot.0 {
                for seen in delta.also_seen.iter().take(crate::heads::MAX_PENDING) {
                    state.head.observe(delta.boot.0, seen.0);
                }
            }
        }
        out
    }

    // ---- garbage collection --------------------------------------------------------------

    /// Drops EXPIRED tombstones of `region` whose revision is `<= horizon` (clamped to the
    /// region's contiguous head, so nothing unseen is ever declared collected) and raises the
    /// region's GC floor. Returns how many were dropped.
    pub fn collect_garbage(&mut self, region: &Region, horizon: Revision) -> usize {
        let Some(state) = self.regions.get_mut(region) else {
            return 0;
        };
        let horizon = horizon.min(Revision(state.head.contiguous()));
        if horizon <= state.gc_floor {
            return 0;
        }
        let mut doomed = Vec::new();
        for (rev, rec) in state.by_revision.range(..=horizon) {
            if rec.record.state == LifecycleState::Expired {
                doomed.push((*rev, rec.record.key.clone(), rec.record.instance.clone()));
            }
        }
        for (rev, key, instance) in &doomed {
            state.by_revision.remove(rev);
            let service = self.services.get_mut(key).expect("indexed");
            service.instances.remove(instance);
            if service.instances.is_empty() {
                self.services.remove(key);
            }
        }
        state.gc_floor = horizon;
        self.entries -= doomed.len();
        self.counters.collected += doomed.len() as u64;
        doomed.len()
    }

    // ---- sharing -------------------------------------------------------------------------

    /// Replaces each per-service instance map, per-owner health index and per-region revision
    /// index of this catalog that is *equal* to `other`'s with a shared copy of `other`'s.
    /// Only equal maps are swapped, so contents are unchanged and no merge, view, delta or
    /// snapshot can tell; memory shrinks when many catalogs hold the same records (the
    /// simulator's agents of one region). Cost: one comparison per map that is not already
    /// shared. Returns how many maps were swapped.
    pub fn share_equal_maps(&mut self, other: &Catalog) -> usize {
        // Both key sets are sorted: walk them side by side instead of looking each key up.
        let services: Vec<(ServiceKey, OrdMap<InstanceId, Entry>)> =
            matching(&self.services, &other.services, |s, o| {
                (!s.instances.ptr_eq(&o.instances) && s.instances == o.instances)
                    .then(|| o.instances.clone())
            });
        for (k, shared) in &services {
            self.services.get_mut(k).expect("listed").instances = shared.clone();
        }
        let owners: Vec<(NodeId, HealthBySeq)> = matching(&self.owners, &other.owners, |s, o| {
            (!s.by_seq.ptr_eq(&o.by_seq) && s.by_seq == o.by_seq).then(|| o.by_seq.clone())
        });
        for (n, shared) in &owners {
            self.owners.get_mut(n).expect("listed").by_seq = shared.clone();
        }
        let keys_shared =
            !self.node_keys.ptr_eq(&other.node_keys) && self.node_keys == other.node_keys;
        if keys_shared {
            self.node_keys = other.node_keys.clone();
        }
        let regions: Vec<Region> = self
            .regions
            .iter()
            .filter(|(r, s)| {
                other.regions.get(*r).is_some_and(|o| {
                    !s.by_revision.ptr_eq(&o.by_revision) && s.by_revision == o.by_revision
                })
            })
            .map(|(r, _)| r.clone())
            .collect();
        for r in &regions {
            let shared = other.regions[r].by_revision.clone();
            self.regions.get_mut(r).expect("listed").by_revision = shared;
        }
        services.len() + owners.len() + regions.len() + usize::from(keys_shared)
    }

    // ---- snapshots -----------------------------------------------------------------------

    /// GC floor of a region.
    pub fn gc_floor(&self, region: &Region) -> Revision {
        self.regions.get(region).map_or(Revision(0), |r| r.gc_floor)
    }

    pub(crate) fn raw_heads(&self) -> (Vec<RegionHead>, Vec<OwnerHead>) {
        let h = self.heads();
        (h.regions, h.owners)
    }

    /// Replaces everything this catalog holds for the snapshot's scope with the snapshot's
    /// contents, keeping local records that are *newer* than the snapshot. The snapshot must
    /// already be decoded and verified ([`crate::snapshot::decode`]); this step cannot fail, so
    /// the replacement is atomic.
    pub fn install(
        &mut self,
        snap: &crate::snapshot::Snapshot,
        verifier: &dyn Verifier,
    ) -> DeltaOutcome {
        // Drop local entries in scope that the snapshot proves superseded or collected.
        let heads: BTreeMap<&Region, &RegionHead> =
            snap.regions.iter().map(|h| (&h.region, h)).collect();
        let in_snapshot: std::collections::BTreeSet<(&ServiceKey, &InstanceId)> = snap
            .lifecycle
            .iter()
            .map(|r| (&r.record.key, &r.record.instance))
            .collect();
        let mut doomed = Vec::new();
        for (key, instance, entry) in self.entries() {
            if !snap.scope.contains(key) {
                continue;
            }
            let rec = &entry.lifecycle.val.record;
            let Some(head) = heads.get(&rec.region) else {
                continue;
            };
            if rec.revision <= head.contiguous && !in_snapshot.contains(&(key, instance)) {
                doomed.push((
                    key.clone(),
                    instance.clone(),
                    rec.region.clone(),
                    rec.revision,
                ));
            }
        }
        for (key, instance, region, revision) in doomed {
            self.remove_entry(&key, &instance, &region, revision);
        }
        let mut out = DeltaOutcome::default();
        for rec in &snap.lifecycle {
            tally(&mut out, &self.apply_lifecycle(rec.clone(), verifier));
        }
        for rec in &snap.health {
            tally(&mut out, &self.apply_health(rec.clone(), verifier));
        }
        if snap.scope.is_catalog() {
            for h in &snap.regions {
                let state = self.regions.entry(h.region.clone()).or_default();
                state.gc_floor = state.gc_floor.max(h.gc_floor);
                if h.contiguous.0 > state.head.contiguous() {
                    out.head_advanced |=
                        state.head.cover(0, state.head.contiguous(), h.contiguous.0);
                }
            }
            for h in &snap.owners {
                let state = self.owners.entry(h.owner.clone()).or_default();
                out.head_advanced |= state.head.cover(h.boot.0, 0, h.contiguous.0);
            }
        }
        self.index += 1;
        out
    }

    fn remove_entry(
        &mut self,
        key: &ServiceKey,
        instance: &InstanceId,
        region: &Region,
        revision: Revision,
    ) {
        if let Some(r) = self.regions.get_mut(region) {
            r.by_revision.remove(&revision);
        }
        let service = self.services.get_mut(key).expect("entry exists");
        if let Some(entry) = service.instances.remove(instance) {
            self.entries -= 1;
            if let Some(h) = entry.health {
                if let Some(o) = self.owners.get_mut(&h.val.record.owner) {
                    o.by_seq
                        .remove(&(h.val.record.owner_boot, h.val.record.seq));
                }
            }
        }
        self.index += 1;
        service.modify_index = self.index;
        if service.instances.is_empty() {
            self.services.remove(key);
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

fn tally(out: &mut DeltaOutcome, o: &MergeOutcome) {
    match o {
        MergeOutcome::Applied => out.applied += 1,
        MergeOutcome::Stale
        | MergeOutcome::Duplicate
        | MergeOutcome::Unadmitted
        | MergeOutcome::Unverified => out.ignored += 1,
        MergeOutcome::Conflict
        | MergeOutcome::BadSignature(_)
        | MergeOutcome::NotOwner
        | MergeOutcome::Full => out.rejected += 1,
    }
}
