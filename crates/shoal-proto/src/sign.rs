//! ed25519 signatures over the canonical (postcard) encoding of records.
//!
//! Each signed payload is prefixed with a domain-separation context (`shoal/lifecycle/v1`,
//! `shoal/health/v1`) so a signature over one kind can never be replayed as another (RFC 8032
//! recommends context separation; Ed25519ctx is not in ed25519-dalek, so the prefix is explicit).

use std::collections::HashMap;
use std::fmt;

use ed25519_dalek::Signer;
use serde::{Deserialize, Serialize};

use crate::policy::{GlobalPolicy, PolicyRecord, SignedGlobalPolicy};
use crate::record::{HealthRecord, LifecycleRecord};
use crate::summary::{RegionSummary, SignedSummary};

const LIFECYCLE_CONTEXT: &[u8] = b"shoal/lifecycle/v1\0";
const HEALTH_CONTEXT: &[u8] = b"shoal/health/v1\0";
const POLICY_CONTEXT: &[u8] = b"shoal/policy/v1\0";
const GLOBAL_POLICY_CONTEXT: &[u8] = b"shoal/global-policy/v1\0";
const SUMMARY_CONTEXT: &[u8] = b"shoal/summary/v1\0";

/// Short id of a public key: its first 8 bytes. Lets a verifier pick the key without trying all.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct KeyId(pub [u8; 8]);

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId(")?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// A raw 64-byte ed25519 signature (serde needs the two halves for arrays over 32).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SignatureBytes(pub [u8; 32], pub [u8; 32]);

impl SignatureBytes {
    fn from_sig(sig: &ed25519_dalek::Signature) -> Self {
        let b = sig.to_bytes();
        let mut lo = [0u8; 32];
        let mut hi = [0u8; 32];
        lo.copy_from_slice(&b[..32]);
        hi.copy_from_slice(&b[32..]);
        Self(lo, hi)
    }

    fn to_sig(self) -> ed25519_dalek::Signature {
        let mut b = [0u8; 64];
        b[..32].copy_from_slice(&self.0);
        b[32..].copy_from_slice(&self.1);
        ed25519_dalek::Signature::from_bytes(&b)
    }
}

impl fmt::Debug for SignatureBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sig({:02x}{:02x}..)", self.0[0], self.0[1])
    }
}

/// A lifecycle record with the region authority's signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SignedLifecycle {
    /// The record.
    pub record: LifecycleRecord,
    /// Which authority key signed it.
    pub signer: KeyId,
    /// Signature over `LIFECYCLE_CONTEXT || postcard(record)`.
    pub signature: SignatureBytes,
}

/// A health record with its owner agent's signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SignedHealth {
    /// The record.
    pub record: HealthRecord,
    /// Which node key signed it.
    pub signer: KeyId,
    /// Signature over `HEALTH_CONTEXT || postcard(record)`.
    pub signature: SignatureBytes,
}

/// A service policy document with the region authority's signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SignedPolicy {
    /// The document and its policy revision.
    pub record: PolicyRecord,
    /// Which authority key signed it.
    pub signer: KeyId,
    /// Signature over `POLICY_CONTEXT || postcard(record)` (context `shoal/policy/v1`, so a
    /// policy signature can never be replayed as a lifecycle or health record, nor vice versa).
    pub signature: SignatureBytes,
}

/// Why a signature was not accepted. Nothing is applied on error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The signer's key id is not in the trusted set.
    #[error("signer key {0:?} is not trusted")]
    UnknownKey(KeyId),
    /// The key is trusted but not for this signer (e.g. a node key used for another node).
    #[error("key {0:?} is not allowed to sign this record")]
    WrongSigner(KeyId),
    /// The signature does not verify.
    #[error("signature does not verify")]
    Invalid,
    /// The key was bound to its node once, but the region authority has revoked the node
    /// since: nothing it signed is accepted.
    #[error("key {0:?} belongs to a revoked node")]
    Revoked(KeyId),
}

/// An ed25519 signing key with its [`KeyId`]. Used by authorities (lifecycle) and agents
/// (health of their own instances).
#[derive(Clone)]
pub struct SigningKey {
    key: ed25519_dalek::SigningKey,
    id: KeyId,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({:?})", self.id)
    }
}

/// A public key with its [`KeyId`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct VerifyingKey {
    key: ed25519_dalek::VerifyingKey,
    id: KeyId,
}

impl fmt::Debug for VerifyingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VerifyingKey({:?})", self.id)
    }
}

fn key_id(public: &ed25519_dalek::VerifyingKey) -> KeyId {
    let mut id = [0u8; 8];
    id.copy_from_slice(&public.as_bytes()[..8]);
    KeyId(id)
}

fn canonical(context: &[u8], value: &impl Serialize) -> Vec<u8> {
    let mut buf = context.to_vec();
    // Serialising an in-memory record cannot fail: every type is plain data.
    let body = postcard::to_allocvec(value).expect("records always serialise");
    buf.extend_from_slice(&body);
    buf
}

impl SigningKey {
    /// Builds a key from a 32-byte secret seed (from a key file, or a seeded RNG in the sim).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        let id = key_id(&key.verifying_key());
        Self { key, id }
    }

    /// The secret seed, for writing key files.
    pub fn to_seed(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// The public half.
    pub fn verifying_key(&self) -> VerifyingKey {
        VerifyingKey {
            key: self.key.verifying_key(),
            id: self.id,
        }
    }

    /// This key's id.
    pub fn id(&self) -> KeyId {
        self.id
    }

    /// Signs a lifecycle record (authority keys only, by convention).
    pub fn sign_lifecycle(&self, record: LifecycleRecord) -> SignedLifecycle {
        let sig = self.key.sign(&canonical(LIFECYCLE_CONTEXT, &record));
        SignedLifecycle {
            record,
            signer: self.id,
            signature: SignatureBytes::from_sig(&sig),
        }
    }

    /// Signs a service policy document (authority keys only, by convention).
    pub fn sign_policy(&self, record: PolicyRecord) -> SignedPolicy {
        let sig = self.key.sign(&canonical(POLICY_CONTEXT, &record));
        SignedPolicy {
            record,
            signer: self.id,
            signature: SignatureBytes::from_sig(&sig),
        }
    }

    /// Signs a global policy document (the global policy key only, by convention).
    pub fn sign_global_policy(&self, policy: GlobalPolicy) -> SignedGlobalPolicy {
        let sig = self.key.sign(&canonical(GLOBAL_POLICY_CONTEXT, &policy));
        SignedGlobalPolicy {
            policy,
            signer: self.id,
            signature: SignatureBytes::from_sig(&sig),
        }
    }

    /// Signs a remote endpoint summary (region authority keys only, by convention).
    pub fn sign_summary(&self, summary: RegionSummary) -> SignedSummary {
        let sig = self.key.sign(&canonical(SUMMARY_CONTEXT, &summary));
        SignedSummary {
            summary,
            signer: self.id,
            signature: SignatureBytes::from_sig(&sig),
        }
    }

    /// Signs a health record (node keys only, by convention).
    pub fn sign_health(&self, record: HealthRecord) -> SignedHealth {
        let sig = self.key.sign(&canonical(HEALTH_CONTEXT, &record));
        SignedHealth {
            record,
            signer: self.id,
            signature: SignatureBytes::from_sig(&sig),
        }
    }
}

impl VerifyingKey {
    /// Parses 32 public-key bytes.
    ///
    /// # Errors
    /// [`SignatureError::Invalid`] if the bytes are not a valid curve point.
    pub fn from_bytes(bytes: [u8; 32]) -> Result<Self, SignatureError> {
        let key =
            ed25519_dalek::VerifyingKey::from_bytes(&bytes).map_err(|_| SignatureError::Invalid)?;
        Ok(Self {
            id: key_id(&key),
            key,
        })
    }

    /// The 32 public-key bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// This key's id.
    pub fn id(&self) -> KeyId {
        self.id
    }

    /// Verifies a signed lifecycle record against this key (strict RFC 8032 verification).
    ///
    /// # Errors
    /// [`SignatureError::WrongSigner`] if the record names another key, `Invalid` if the
    /// signature does not verify.
    pub fn verify_lifecycle(&self, signed: &SignedLifecycle) -> Result<(), SignatureError> {
        if signed.signer != self.id {
            return Err(SignatureError::WrongSigner(signed.signer));
        }
        self.key
            .verify_strict(
                &canonical(LIFECYCLE_CONTEXT, &signed.record),
                &signed.signature.to_sig(),
            )
            .map_err(|_| SignatureError::Invalid)
    }

    /// Verifies a signed policy document against this key.
    ///
    /// # Errors
    /// As [`VerifyingKey::verify_lifecycle`].
    pub fn verify_policy(&self, signed: &SignedPolicy) -> Result<(), SignatureError> {
        if signed.signer != self.id {
            return Err(SignatureError::WrongSigner(signed.signer));
        }
        self.key
            .verify_strict(
                &canonical(POLICY_CONTEXT, &signed.record),
                &signed.signature.to_sig(),
            )
            .map_err(|_| SignatureError::Invalid)
    }

    /// Verifies a signed global policy document against this key.
    ///
    /// # Errors
    /// As [`VerifyingKey::verify_lifecycle`].
    pub fn verify_global_policy(&self, signed: &SignedGlobalPolicy) -> Result<(), SignatureError> {
        self.verify_ctx(
            signed.signer,
            &canonical(GLOBAL_POLICY_CONTEXT, &signed.policy),
            signed.signature,
        )
    }

    /// Verifies a signed remote endpoint summary against this key.
    ///
    /// # Errors
    /// As [`VerifyingKey::verify_lifecycle`].
    pub fn verify_summary(&self, signed: &SignedSummary) -> Result<(), SignatureError> {
        self.verify_ctx(
            signed.signer,
            &canonical(SUMMARY_CONTEXT, &signed.summary),
            signed.signature,
        )
    }

    fn verify_ctx(
        &self,
        signer: KeyId,
        message: &[u8],
        signature: SignatureBytes,
    ) -> Result<(), SignatureError> {
        if signer != self.id {
            return Err(SignatureError::WrongSigner(signer));
        }
        self.key
            .verify_strict(message, &signature.to_sig())
            .map_err(|_| SignatureError::Invalid)
    }

    /// Verifies a signed health record against this key.
    ///
    /// # Errors
    /// As [`VerifyingKey::verify_lifecycle`].
    pub fn verify_health(&self, signed: &SignedHealth) -> Result<(), SignatureError> {
        if signed.signer != self.id {
            return Err(SignatureError::WrongSigner(signed.signer));
        }
        self.key
            .verify_strict(
                &canonical(HEALTH_CONTEXT, &signed.record),
                &signed.signature.to_sig(),
            )
            .map_err(|_| SignatureError::Invalid)
    }
}

/// A set of trusted public keys indexed by [`KeyId`]. Two keys of one region during a rotation
/// overlap is the normal case.
#[derive(Clone, Debug, Default)]
pub struct TrustedKeys {
    keys: HashMap<KeyId, VerifyingKey>,
}

impl TrustedKeys {
    /// An empty set (trusts nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a key.
    pub fn insert(&mut self, key: VerifyingKey) {
        self.keys.insert(key.id(), key);
    }

    /// Looks a key up by id.
    pub fn get(&self, id: KeyId) -> Option<&VerifyingKey> {
        self.keys.get(&id)
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when no key is trusted.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}
