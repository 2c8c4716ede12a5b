//! # shoal-proto
//!
//! The wire vocabulary of shoal: identifiers ([`ids`]), endpoint records ([`record`]), service
//! policy documents ([`policy`]), the versioned message envelope ([`envelope`]) and ed25519
//! signatures ([`sign`]).
//!
//! This crate does no IO and reads no clock. Everything it decodes is bounded: identifiers
//! validate charset and length while deserialising, label sets are capped, and every message is
//! size-checked before its body is parsed, so arbitrary bytes produce a typed error, never a
//! panic and never an allocation past the message limit.
//!
//! ```
//! use shoal_proto::ids::ServiceKey;
//! use shoal_proto::envelope::{encode, decode, MessageKind, DEFAULT_MAX_DATAGRAM_BYTES};
//!
//! let key: ServiceKey = "prod/payments/http".parse().unwrap();
//! let bytes = encode(MessageKind::Heads, &key, DEFAULT_MAX_DATAGRAM_BYTES).unwrap();
//! let back: ServiceKey = decode(&bytes, MessageKind::Heads, DEFAULT_MAX_DATAGRAM_BYTES).unwrap();
//! assert_eq!(key, back);
//! ```

pub mod envelope;
pub mod ids;
pub mod policy;
pub mod record;
pub mod rpc;
pub mod sign;
pub mod summary;

pub use ids::{
    Generation, HealthSeq, InstanceId, Name, NodeId, Region, Revision, ServiceKey, Version, Zone,
};
pub use policy::{
    FailoverMode, GlobalPolicy, GlobalServicePolicy, PolicyError, PolicyRecord, RegionKeys,
    ServicePolicy, SignedGlobalPolicy, StaleAction, ENVOY_DEFAULT_OVERPROVISIONING_FACTOR_PCT,
    MAX_OVERPROVISIONING_FACTOR_PCT, MIN_OVERPROVISIONING_FACTOR_PCT,
};
pub use record::{
    EndpointSpec, HealthRecord, HealthStatus, LabelDimension, Labels, LifecycleRecord,
    LifecycleState, NodeKey, TransitionReason, TransitionSource,
};
pub use sign::{
    KeyId, SignatureBytes, SignatureError, SignedHealth, SignedLifecycle, SignedPolicy, SigningKey,
    TrustedKeys, VerifyingKey,
};
pub use summary::{RegionSummary, SignedSummary, SummaryEndpoint};
