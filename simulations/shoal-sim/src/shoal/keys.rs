//! The verification cache and record interning shared by all simulated agents.

use super::*;

/// Verifies each distinct signed record once (real ed25519) and shares one copy of it between
/// all simulated agents. Equal content gives equal results, so this changes cost, not outcome.
#[derive(Debug, Default)]
pub struct SimKeys {
    pub(super) keyring: Keyring,
    pub(super) lifecycle: RefCell<HashMap<SignatureBytes, Arc<SignedLifecycle>>>,
    /// Verified health records with the owner key they verified against (the catalog picks
    /// the key from the lifecycle record, so a hit must match it too).
    pub(super) health: RefCell<HashMap<SignatureBytes, (Arc<SignedHealth>, NodeKey)>>,
    pub(super) lifecycle_encodings: RefCell<Encodings<SignedLifecycle>>,
    pub(super) health_encodings: RefCell<Encodings<SignedHealth>>,
    pub(super) lifecycle_bytes: RefCell<Serialized<SignedLifecycle>>,
    pub(super) health_bytes: RefCell<Serialized<SignedHealth>>,
}

/// The postcard encoding of each shared record any simulated agent sent, by the record's
/// address. The map holds the `Arc` too, so the address cannot be reused by another record.
pub(super) type Serialized<T> = HashMap<*const T, (Arc<T>, Box<[u8]>)>;

pub(super) fn append_serialized<T: serde::Serialize>(
    map: &mut Serialized<T>,
    record: &Arc<T>,
    out: &mut Vec<u8>,
) {
    let (_, bytes) = map.entry(Arc::as_ptr(record)).or_insert_with(|| {
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
pub struct SharedKeys(pub(super) Rc<SimKeys>);

impl Verifier for SharedKeys {
    fn verify_lifecycle(&self, signed: &SignedLifecycle) -> Result<(), SignatureError> {
        if let Some(c) = self.0.lifecycle.borrow().get(&signed.signature) {
            // The shared copy itself (most records are) needs no comparison.
            if std::ptr::eq(&**c, signed) || **c == *signed {
                return Ok(());
            }
        }
        self.0.keyring.verify_lifecycle(signed)?;
        self.0
            .lifecycle
            .borrow_mut()
            .insert(signed.signature, Arc::new(signed.clone()));
        Ok(())
    }

    fn verify_health(
        &self,
        signed: &SignedHealth,
        key: &VerifyingKey,
    ) -> Result<(), SignatureError> {
        if let Some((c, k)) = self.0.health.borrow().get(&signed.signature) {
            // The shared copy itself (most records are) needs no comparison.
            if (std::ptr::eq(&**c, signed) || **c == *signed) && *k == key.to_bytes() {
                return Ok(());
            }
        }
        key.verify_health(signed)?;
        self.0
            .health
            .borrow_mut()
            .insert(signed.signature, (Arc::new(signed.clone()), key.to_bytes()));
        Ok(())
    }
}

/// The simulator's caching layer: one interned copy and one decoding per distinct record.
impl RecordCache for SharedKeys {
    fn intern_lifecycle(&self, record: Arc<SignedLifecycle>) -> Arc<SignedLifecycle> {
        match self.0.lifecycle.borrow().get(&record.signature) {
            Some(c) if Arc::ptr_eq(c, &record) || **c == *record => Arc::clone(c),
            _ => record,
        }
    }

    fn intern_health(&self, record: Arc<SignedHealth>) -> Arc<SignedHealth> {
        match self.0.health.borrow().get(&record.signature) {
            Some((c, _)) if Arc::ptr_eq(c, &record) || **c == *record => Arc::clone(c),
            _ => record,
        }
    }

    fn caches_encodings(&self) -> bool {
        true
    }

    fn encoded_lifecycle(&self, input: &[u8]) -> Option<(Arc<SignedLifecycle>, usize)> {
        find_encoding(&self.0.lifecycle_encodings.borrow(), input)
    }

    fn remember_lifecycle_encoding(&self, encoding: &[u8], record: &Arc<SignedLifecycle>) {
        let record = self.intern_lifecycle(Arc::clone(record));
        add_encoding(
            &mut self.0.lifecycle_encodings.borrow_mut(),
            encoding,
            record,
        );
    }

    fn encoded_health(&self, input: &[u8]) -> Option<(Arc<SignedHealth>, usize)> {
        find_encoding(&self.0.health_encodings.borrow(), input)
    }

    fn remember_health_encoding(&self, encoding: &[u8], record: &Arc<SignedHealth>) {
        let record = self.intern_health(Arc::clone(record));
        add_encoding(&mut self.0.health_encodings.borrow_mut(), encoding, record);
    }

    fn append_lifecycle_encoding(&self, record: &Arc<SignedLifecycle>, out: &mut Vec<u8>) -> bool {
        append_serialized(&mut self.0.lifecycle_bytes.borrow_mut(), record, out);
        true
    }

    fn append_health_encoding(&self, record: &Arc<SignedHealth>, out: &mut Vec<u8>) -> bool {
        append_serialized(&mut self.0.health_bytes.borrow_mut(), record, out);
        true
    }
}
