//! The verification cache and record interning shared by all simulated agents.

use std::sync::{Mutex, MutexGuard};

use super::*;
use crate::world::{worker_index, MAX_THREADS};

/// Verifies each distinct signed record once (real ed25519) and shares one copy of it between
/// all simulated agents. Equal content gives equal results, so this changes cost, not outcome.
///
/// The caches are kept once per thread that handles nodes ([`worker_index`]): a parallel
/// window's workers never wait on each other or bounce a cache line between cores, at the
/// price of one verification and one interned copy per record per thread.
#[derive(Debug)]
pub struct SimKeys {
    pub(super) keyring: Keyring,
    caches: Box<[Mutex<Caches>]>,
}

impl SimKeys {
    /// Caches for up to [`MAX_THREADS`] worker threads and the engine's own.
    pub fn new(keyring: Keyring) -> Self {
        Self {
            keyring,
            caches: (0..=MAX_THREADS).map(|_| Mutex::default()).collect(),
        }
    }

    /// This thread's caches (uncontended: only this thread takes this lock).
    fn caches(&self) -> MutexGuard<'_, Caches> {
        self.shard(worker_index() % self.caches.len())
    }

    fn shard(&self, i: usize) -> MutexGuard<'_, Caches> {
        self.caches[i]
            .lock()
            .expect("a cache lock is never poisoned")
    }

    /// The engine thread's caches (shard 0), from a thread with another shard (`None` on
    /// shard 0's threads). The engine thread signs and verifies every initial record, so a
    /// worker finds most records verified there, and takes the same shared copy. Lock order: a worker's own shard, then
    /// shard 0; the engine thread never holds shard 0 while waiting for another.
    fn engine_caches(&self) -> Option<MutexGuard<'_, Caches>> {
        (!worker_index().is_multiple_of(self.caches.len())).then(|| self.shard(0))
    }
}

/// One thread's share of [`SimKeys`].
#[derive(Debug, Default)]
struct Caches {
    lifecycle: HashMap<SignatureBytes, Arc<SignedLifecycle>>,
    /// Verified health records with the owner key they verified against (the catalog picks
    /// the key from the lifecycle record, so a hit must match it too).
    health: HashMap<SignatureBytes, (Arc<SignedHealth>, NodeKey)>,
    lifecycle_encodings: Encodings<SignedLifecycle>,
    health_encodings: Encodings<SignedHealth>,
    lifecycle_bytes: Serialized<SignedLifecycle>,
    health_bytes: Serialized<SignedHealth>,
}

/// The postcard encoding of each shared record any simulated agent sent, by the record's
/// address. The map holds the `Arc` too, so the address cannot be reused by another record.
pub(super) type Serialized<T> = HashMap<usize, (Arc<T>, Box<[u8]>)>;

pub(super) fn append_serialized<T: serde::Serialize>(
    map: &mut Serialized<T>,
    record: &Arc<T>,
    out: &mut Vec<u8>,
) {
    let address = Arc::as_ptr(record) as usize;
    let (_, bytes) = map.entry(address).or_insert_with(|| {
        let bytes = postcard::to_allocvec(&**record).expect("plain data always serialises");
        (Arc::clone(record), bytes.into())
    });
    out.extend_from_slice(bytes);
}

/// How many leading bytes of an encoding key [`Encodings`]. Every signed record is longer (its
/// signature alone is 64 bytes, after the record), and the first 48 bytes already hold the
/// service key, instance and generation, so a bucket rarely holds more than one encoding.
pub(super) const ENCODING_PREFIX: usize = 48;

/// Record encodings seen by any simulated agent, with their decoded (shared) record: a push
/// is decoded once per distinct record instead of once per receiving agent. Keyed by the
/// first [`ENCODING_PREFIX`] bytes; a bucket lists whole encodings.
pub(super) type Encodings<T> = HashMap<[u8; ENCODING_PREFIX], Vec<(Box<[u8]>, Arc<T>)>>;

pub(super) fn find_encoding<T>(map: &Encodings<T>, input: &[u8]) -> Option<(Arc<T>, usize)> {
    let prefix: &[u8; ENCODING_PREFIX] = input.get(..ENCODING_PREFIX)?.try_into().ok()?;
    map.get(prefix)?
        .iter()
        .find(|(enc, _)| input.starts_with(enc))
        .map(|(enc, rec)| (Arc::clone(rec), enc.len()))
}

pub(super) fn add_encoding<T>(map: &mut Encodings<T>, encoding: &[u8], record: Arc<T>) {
    let Some(prefix) = encoding.get(..ENCODING_PREFIX) else {
        return;
    };
    let prefix: [u8; ENCODING_PREFIX] = prefix.try_into().expect("prefix length");
    let bucket = map.entry(prefix).or_default();
    if bucket.iter().all(|(enc, _)| **enc != *encoding) {
        bucket.push((encoding.into(), record));
    }
}

/// Cheap handle to [`SimKeys`], the verifier every simulated mesh uses.
#[derive(Debug, Clone)]
pub struct SharedKeys(pub(super) Arc<SimKeys>);

impl Verifier for SharedKeys {
    fn verify_lifecycle(&self, signed: &SignedLifecycle) -> Result<(), SignatureError> {
        let same = |c: &Arc<SignedLifecycle>| std::ptr::eq(&**c, signed) || **c == *signed;
        let mut caches = self.0.caches();
        // The shared copy itself (most records are) needs no comparison.
        if caches.lifecycle.get(&signed.signature).is_some_and(same) {
            return Ok(());
        }
        let known = self.0.engine_caches().and_then(|engine| {
            engine
                .lifecycle
                .get(&signed.signature)
                .filter(|c| same(c))
                .cloned()
        });
        if let Some(c) = known {
            caches.lifecycle.insert(signed.signature, c);
            return Ok(());
        }
        self.0.keyring.verify_lifecycle(signed)?;
        caches
            .lifecycle
            .insert(signed.signature, Arc::new(signed.clone()));
        Ok(())
    }

    fn verify_health(
        &self,
        signed: &SignedHealth,
        key: &VerifyingKey,
    ) -> Result<(), SignatureError> {
        let same = |(c, k): &(Arc<SignedHealth>, NodeKey)| {
            (std::ptr::eq(&**c, signed) || **c == *signed) && *k == key.to_bytes()
        };
        let mut caches = self.0.caches();
        // The shared copy itself (most records are) needs no comparison.
        if caches.health.get(&signed.signature).is_some_and(same) {
            return Ok(());
        }
        let known = self.0.engine_caches().and_then(|engine| {
            engine
                .health
                .get(&signed.signature)
                .filter(|e| same(e))
                .cloned()
        });
        if let Some(e) = known {
            caches.health.insert(signed.signature, e);
            return Ok(());
        }
        key.verify_health(signed)?;
        caches
            .health
            .insert(signed.signature, (Arc::new(signed.clone()), key.to_bytes()));
        Ok(())
    }
}

/// The simulator's caching layer: one interned copy and one decoding per distinct record.
impl RecordCache for SharedKeys {
    fn intern_lifecycle(&self, record: Arc<SignedLifecycle>) -> Arc<SignedLifecycle> {
        match self.0.caches().lifecycle.get(&record.signature) {
            Some(c) if Arc::ptr_eq(c, &record) || **c == *record => Arc::clone(c),
            _ => record,
        }
    }

    fn intern_health(&self, record: Arc<SignedHealth>) -> Arc<SignedHealth> {
        match self.0.caches().health.get(&record.signature) {
            Some((c, _)) if Arc::ptr_eq(c, &record) || **c == *record => Arc::clone(c),
            _ => record,
        }
    }

    fn caches_encodings(&self) -> bool {
        true
    }

    fn encoded_lifecycle(&self, input: &[u8]) -> Option<(Arc<SignedLifecycle>, usize)> {
        find_encoding(&self.0.caches().lifecycle_encodings, input)
    }

    fn remember_lifecycle_encoding(&self, encoding: &[u8], record: &Arc<SignedLifecycle>) {
        let record = self.intern_lifecycle(Arc::clone(record));
        add_encoding(&mut self.0.caches().lifecycle_encodings, encoding, record);
    }

    fn encoded_health(&self, input: &[u8]) -> Option<(Arc<SignedHealth>, usize)> {
        find_encoding(&self.0.caches().health_encodings, input)
    }

    fn remember_health_encoding(&self, encoding: &[u8], record: &Arc<SignedHealth>) {
        let record = self.intern_health(Arc::clone(record));
        add_encoding(&mut self.0.caches().health_encodings, encoding, record);
    }

    fn append_lifecycle_encoding(&self, record: &Arc<SignedLifecycle>, out: &mut Vec<u8>) -> bool {
        append_serialized(&mut self.0.caches().lifecycle_bytes, record, out);
        true
    }

    fn append_health_encoding(&self, record: &Arc<SignedHealth>, out: &mut Vec<u8>) -> bool {
        append_serialized(&mut self.0.caches().health_bytes, record, out);
        true
    }
}
