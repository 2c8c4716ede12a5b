//! Who may sign what: the trusted authority keys per region. Node keys are not configured:
//! each lifecycle record carries the owner node's key as the authority bound it
//! (`LifecycleRecord::owner_key`), and the catalog verifies health records against that
//! (`docs/adr/0006-node-keys-in-lifecycle-records.md`).

use std::collections::BTreeMap;
use std::sync::Arc;

use shoal_proto::{
    Region, SignatureError, SignedHealth, SignedLifecycle, TrustedKeys, VerifyingKey,
};

/// Verifies signed records before they are merged (invariant 4, docs/invariants.md).
///
/// A trait so a simulator can share one verification cache between thousands of simulated
/// agents (each signature is checked once, with the same result); the agent uses [`Keyring`].
/// A verifier also carries the [`RecordCache`] the core decodes through (a no-op for the
/// agent).
pub trait Verifier: RecordCache {
    /// Verifies a lifecycle record against the trusted keys of the record's region.
    ///
    /// # Errors
    /// [`SignatureError`]: unknown key, a key of another region, or a bad signature.
    fn verify_lifecycle(&self, signed: &SignedLifecycle) -> Result<(), SignatureError>;

    /// Verifies a health record against `key`, the owner node's key as an authority-signed
    /// lifecycle record bound it (the catalog picks the key; the verifier only checks the
    /// signature). The default checks it with ed25519; a simulator may remember results.
    ///
    /// # Errors
    /// [`SignatureError`]: the record names another key, or the signature does not verify.
    fn verify_health(
        &self,
        signed: &SignedHealth,
        key: &VerifyingKey,
    ) -> Result<(), SignatureError> {
        key.verify_health(signed)
    }
}

/// Sharing and decoding shortcuts for records a process receives many times: the
/// simulator's caching layer, kept apart from [`Verifier`] (which only decides whether a
/// signature is good). Every method has a do-nothing default, which is what a real agent
/// uses (`impl RecordCache for Keyring {}`); the simulator's shared key store overrides them
/// so each distinct record is interned and decoded once for thousands of agents
/// (`simulations/shoal-sim/src/shoal/keys.rs`). None of them may change what a record
/// decodes to or whether it verifies.
pub trait RecordCache {
    /// Returns a shared copy of a just-decoded record. The default returns it unchanged; a
    /// simulator running thousands of agents in one process returns one shared `Arc` per
    /// distinct record, so memory grows with records, not with records x agents.
    fn intern_lifecycle(&self, record: Arc<SignedLifecycle>) -> Arc<SignedLifecycle> {
        record
    }

    /// As [`RecordCache::intern_lifecycle`], for health records.
    fn intern_health(&self, record: Arc<SignedHealth>) -> Arc<SignedHealth> {
        record
    }

    /// Whether this verifier keeps a cache of record encodings
    /// ([`RecordCache::encoded_lifecycle`] and friends). The default does not, and a receiver then
    /// decodes every record it receives. A simulator, where every agent receives every record
    /// of its region, keeps one so each distinct record is decoded once, not once per agent.
    fn caches_encodings(&self) -> bool {
        false
    }

    /// Looks for a remembered encoding that is a prefix of `input` and returns its record and
    /// length. A record's postcard encoding is self-delimiting and decoding reads it front to
    /// back without looking ahead, so any input that starts with an encoding that once decoded
    /// to `record` (consuming all of it) decodes to `record` again, consuming the same bytes.
    fn encoded_lifecycle(&self, _input: &[u8]) -> Option<(Arc<SignedLifecycle>, usize)> {
        None
    }

    /// Remembers that `encoding` decoded to `record`, consuming every byte of it.
    fn remember_lifecycle_encoding(&self, _encoding: &[u8], _record: &Arc<SignedLifecycle>) {}

    /// As [`RecordCache::encoded_lifecycle`], for health records.
    fn encoded_health(&self, _input: &[u8]) -> Option<(Arc<SignedHealth>, usize)> {
        None
    }

    /// As [`RecordCache::remember_lifecycle_encoding`], for health records.
    fn remember_health_encoding(&self, _encoding: &[u8], _record: &Arc<SignedHealth>) {}

    /// Appends a remembered encoding of this very `record` (the same `Arc`, as handed out
    /// by [`RecordCache::encoded_lifecycle`] or [`RecordCache::intern_lifecycle`]) to `out`; `false`
    /// when none is remembered, and the caller then serializes the record itself.
    fn append_lifecycle_encoding(
        &self,
        _record: &Arc<SignedLifecycle>,
        _out: &mut Vec<u8>,
    ) -> bool {
        false
    }

    /// As [`RecordCache::append_lifecycle_encoding`], for health records.
    fn append_health_encoding(&self, _record: &Arc<SignedHealth>, _out: &mut Vec<u8>) -> bool {
        false
    }
}

/// Trusted keys: authority keys per region (two during a rotation overlap).
#[derive(Clone, Debug, Default)]
pub struct Keyring {
    authorities: BTreeMap<Region, TrustedKeys>,
}

impl Keyring {
    /// An empty keyring: trusts nothing, so every record is refused.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts `key` to sign lifecycle records of `region`.
    pub fn trust_authority(&mut self, region: Region, key: VerifyingKey) {
        self.authorities.entry(region).or_default().insert(key);
    }
}

impl RecordCache for Keyring {}

impl Verifier for Keyring {
    fn verify_lifecycle(&self, signed: &SignedLifecycle) -> Result<(), SignatureError> {
        let key = self
            .authorities
            .get(&signed.record.region)
            .and_then(|keys| keys.get(signed.signer))
            .ok_or(SignatureError::UnknownKey(signed.signer))?;
        key.verify_lifecycle(signed)
    }
}
