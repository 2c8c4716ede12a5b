//! A region's revision index: the current lifecycle record of every held entry, by revision,
//! kept in chunks of [`CHUNK`] consecutive revisions.
//!
//! One persistent map per chunk, so catalogs that hold the same records in a chunk can share
//! that chunk ([`RevisionIndex::share_equal_chunks`]) while they differ elsewhere. A region's
//! revisions only grow and a rollout replaces instances everywhere in the index, so two agents'
//! whole indexes are rarely equal while records are on their way (each has applied a different
//! few of the newest), but all chunks the newest records did not touch are.

use std::ops::Bound;
use std::sync::Arc;

use imbl::OrdMap;
use shoal_proto::{Revision, SignedLifecycle};

/// Revisions per chunk. 1,024 keeps a region of ~33,000 entries (whose revisions spread over
/// a few times that) in tens of chunks, each a three-level tree of 16-key nodes.
pub const CHUNK: u64 = 1_024;

/// One chunk: revisions `[k * CHUNK, (k + 1) * CHUNK)` for chunk number `k`.
type Chunk = OrdMap<Revision, Arc<SignedLifecycle>>;

/// A region's current lifecycle records by revision. No chunk is ever empty, so equal
/// contents compare equal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RevisionIndex {
    chunks: OrdMap<u64, Chunk>,
}

fn chunk_of(revision: Revision) -> u64 {
    revision.0 / CHUNK
}

impl RevisionIndex {
    /// The record held under `revision`.
    pub fn get(&self, revision: &Revision) -> Option<&Arc<SignedLifecycle>> {
        self.chunks.get(&chunk_of(*revision))?.get(revision)
    }

    /// Holds `record` under `revision` (replacing what was there).
    pub fn insert(&mut self, revision: Revision, record: Arc<SignedLifecycle>) {
        let k = chunk_of(revision);
        match self.chunks.get_mut(&k) {
            Some(chunk) => {
                chunk.insert(revision, record);
            }
            None => {
                self.chunks.insert(k, OrdMap::unit(revision, record));
            }
        }
    }

    /// Drops what is held under `revision`.
    pub fn remove(&mut self, revision: &Revision) {
        let k = chunk_of(*revision);
        let Some(chunk) = self.chunks.get_mut(&k) else {
            return;
        };
        if chunk.remove(revision).is_some() && chunk.is_empty() {
            self.chunks.remove(&k);
        }
    }

    /// Records with a revision in `(from, to]`-style bounds, ascending.
    pub fn range(
        &self,
        lower: Bound<Revision>,
        upper: Bound<Revision>,
    ) -> impl Iterator<Item = (&Revision, &Arc<SignedLifecycle>)> {
        let chunk_bound = |b: Bound<Revision>| match b {
            Bound::Included(r) | Bound::Excluded(r) => Bound::Included(chunk_of(r)),
            Bound::Unbounded => Bound::Unbounded,
        };
        self.chunks
            .range((chunk_bound(lower), chunk_bound(upper)))
            .flat_map(move |(_, chunk)| chunk.range((lower, upper)))
    }

    /// Whether both are the same shared tree (so certainly equal).
    pub fn ptr_eq(&self, other: &RevisionIndex) -> bool {
        self.chunks.ptr_eq(&other.chunks)
    }

    /// Replaces every chunk equal to `other`'s (and not already shared) with a shared copy of
    /// it; the whole index too when all of it is equal. Contents are unchanged. Returns how
    /// many maps were swapped.
    pub fn share_equal_chunks(&mut self, other: &RevisionIndex) -> usize {
        if self.chunks.ptr_eq(&other.chunks) {
            return 0;
        }
        let mut swapped = 0;
        let equal: Vec<(u64, Chunk)> = self
            .chunks
            .iter()
            .filter_map(|(k, mine)| {
                let theirs = other.chunks.get(k)?;
                (!mine.ptr_eq(theirs) && mine == theirs).then(|| (*k, theirs.clone()))
            })
            .collect();
        for (k, shared) in equal {
            *self.chunks.get_mut(&k).expect("listed") = shared;
            swapped += 1;
        }
        if self.chunks == other.chunks {
            self.chunks = other.chunks.clone();
            swapped += 1;
        }
        swapped
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use shoal_proto::LifecycleState;

    use super::*;
    use crate::testkit::Fixture;

    /// Revisions on both sides of chunk edges, and far apart.
    const REVISIONS: [u64; 9] = [
        1,
        CHUNK - 1,
        CHUNK,
        CHUNK + 1,
        2 * CHUNK - 1,
        5 * CHUNK,
        5 * CHUNK + 7,
        40 * CHUNK,
        u64::MAX / 2,
    ];

    fn record(f: &Fixture, revision: u64) -> Arc<SignedLifecycle> {
        let instance = format!("i-{}", revision % 1_000);
        Arc::new(f.lifecycle(&instance, 1, revision, LifecycleState::Ready))
    }

    fn index_of(f: &Fixture, revisions: &[u64]) -> RevisionIndex {
        let mut index = RevisionIndex::default();
        for &r in revisions {
            index.insert(Revision(r), record(f, r));
        }
        index
    }

    fn listed(index: &RevisionIndex, lower: Bound<Revision>, upper: Bound<Revision>) -> Vec<u64> {
        index.range(lower, upper).map(|(r, _)| r.0).collect()
    }

    #[test]
    fn ranges_across_chunks_are_those_of_one_sorted_map() {
        let f = Fixture::new();
        let index = index_of(&f, &REVISIONS);
        let model: BTreeMap<u64, ()> = REVISIONS.iter().map(|r| (*r, ())).collect();
        for &a in &REVISIONS {
            for &b in &REVISIONS {
                let bounds = [
                    (Bound::Included(a), Bound::Included(b)),
                    (Bound::Excluded(a), Bound::Included(b)),
                    (Bound::Included(a), Bound::Unbounded),
                    (Bound::Unbounded, Bound::Included(b)),
                ];
                for (lo, hi) in bounds {
                    if a > b && !matches!((lo, hi), (_, Bound::Unbounded) | (Bound::Unbounded, _)) {
                        continue;
                    }
                    let want: Vec<u64> = model.range((lo, hi)).map(|(r, _)| *r).collect();
                    let got = listed(&index, lo.map(Revision), hi.map(Revision));
                    assert_eq!(got, want, "{lo:?}..{hi:?}");
                }
            }
        }
    }

    #[test]
    fn removing_the_last_record_of_a_chunk_leaves_no_empty_chunk() {
        let f = Fixture::new();
        let mut index = index_of(&f, &REVISIONS);
        for &r in &REVISIONS[..4] {
            index.remove(&Revision(r));
        }
        index.remove(&Revision(3 * CHUNK)); // never held: nothing happens
        assert_eq!(
            index,
            index_of(&f, &REVISIONS[4..]),
            "equal contents compare equal"
        );
        assert!(index.get(&Revision(CHUNK)).is_none());
        assert_eq!(
            index.get(&Revision(5 * CHUNK)).map(|r| r.record.revision.0),
            Some(5 * CHUNK)
        );
        assert!(!index.chunks.values().any(|c| c.is_empty()));
    }

    #[test]
    fn sharing_swaps_equal_chunks_only_and_changes_no_content() {
        let f = Fixture::new();
        let reference = index_of(&f, &REVISIONS);
        let mut mine = index_of(&f, &REVISIONS);
        mine.remove(&Revision(5 * CHUNK + 7)); // chunk 5 differs; the others are equal
        let before = mine.clone();
        let swapped = mine.share_equal_chunks(&reference);
        assert_eq!(mine, before, "contents unchanged");
        assert_eq!(
            swapped, 4,
            "chunks 0, 1, 40 and the far one; not chunk 5, nor the whole"
        );
        let shared = |k: u64| mine.chunks[&k].ptr_eq(&reference.chunks[&k]);
        assert!(shared(0) && shared(1) && shared(40) && shared((u64::MAX / 2) / CHUNK));
        assert!(!shared(5));
        assert!(!mine.ptr_eq(&reference));
        assert_eq!(
            mine.share_equal_chunks(&reference),
            0,
            "nothing left to share"
        );

        mine.insert(Revision(5 * CHUNK + 7), record(&f, 5 * CHUNK + 7));
        assert_eq!(
            mine.share_equal_chunks(&reference),
            2,
            "chunk 5, then the whole index"
        );
        assert!(mine.ptr_eq(&reference));
    }
}
