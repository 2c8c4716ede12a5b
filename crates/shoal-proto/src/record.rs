//! Endpoint records: what the authority signs (lifecycle) and what an owner agent signs (health).
//!
//! A record is split in two registers so that the two writers never race on one value:
//! - [`LifecycleRecord`]: written only by the region authority, ordered by
//!   `(generation, revision)`. It carries the endpoint's address and metadata and its
//!   lifecycle state (STARTING, READY, DRAINING, EXPIRED).
//! - [`HealthRecord`]: written only by the agent on the instance's own node, ordered by
//!   `(generation, owner boot, health seq)`. It says whether readiness currently passes.
//!
//! The UNHEALTHY state of the requirements is the combination "lifecycle READY, health failing";
//! see `shoal_catalog::EndpointState`.

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::ids::{
    Generation, HealthSeq, IdError, InstanceId, NodeId, Region, Revision, ServiceKey, Version, Zone,
};

/// Maximum number of labels on one endpoint.
pub const MAX_LABELS: usize = 8;
/// Maximum length of one label value.
pub const MAX_LABEL_VALUE_BYTES: usize = 63;
/// Minimum endpoint weight. A weight of zero is not allowed: use DRAINING to stop traffic.
pub const MIN_WEIGHT: u32 = 1;
/// Maximum endpoint weight (Envoy's 1..=128 scaled; Consul allows any positive integer).
pub const MAX_WEIGHT: u32 = 10_000;

/// The predefined label dimensions. Labels describe capabilities, never identity, and are
/// **not** authorisation claims. Arbitrary keys are refused to keep cardinality bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LabelDimension {
    /// Application protocol spoken on the port, e.g. `http2`, `grpc`.
    Protocol,
    /// Service tier, e.g. `critical`, `batch`.
    Tier,
    /// Release track, e.g. `stable`, `canary`.
    Track,
    /// Data shard or partition served, e.g. `s07`.
    Shard,
    /// CPU architecture, e.g. `arm64`.
    Arch,
    /// An optional capability, e.g. `zstd`.
    Capability,
    /// Accelerator class, e.g. `gpu-a100`.
    Accelerator,
    /// Network class, e.g. `ipv6-only`.
    Network,
}

impl LabelDimension {
    /// Every dimension, in wire order.
    pub const ALL: [LabelDimension; 8] = [
        Self::Protocol,
        Self::Tier,
        Self::Track,
        Self::Shard,
        Self::Arch,
        Self::Capability,
        Self::Accelerator,
        Self::Network,
    ];

    /// The lowercase name used in APIs and label selectors, e.g. `"protocol"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Protocol => "protocol",
            Self::Tier => "tier",
            Self::Track => "track",
            Self::Shard => "shard",
            Self::Arch => "arch",
            Self::Capability => "capability",
            Self::Accelerator => "accelerator",
            Self::Network => "network",
        }
    }

    /// Parses the lowercase name; `None` for anything not predefined.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == s)
    }
}

/// Why a set of labels or an endpoint was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// More than [`MAX_LABELS`] labels.
    #[error("at most {MAX_LABELS} labels are allowed, got {0}")]
    TooManyLabels(usize),
    /// The same dimension appears twice.
    #[error("label dimension {0:?} appears more than once")]
    DuplicateLabel(LabelDimension),
    /// A label value is empty, too long or has a bad character.
    #[error("label value {0:?} must be 1..=63 bytes of [a-z0-9._-]")]
    LabelValue(String),
    /// The weight is outside `MIN_WEIGHT..=MAX_WEIGHT`.
    #[error("weight {0} is outside {MIN_WEIGHT}..={MAX_WEIGHT}")]
    Weight(u32),
    /// An identifier inside the record is invalid.
    #[error(transparent)]
    Id(#[from] IdError),
}

/// Capability labels: at most [`MAX_LABELS`], one value per [`LabelDimension`], kept sorted by
/// dimension so the encoding is canonical (signatures are over the encoding).
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(
    try_from = "Vec<(LabelDimension, String)>",
    into = "Vec<(LabelDimension, String)>"
)]
pub struct Labels(Vec<(LabelDimension, String)>);

impl Labels {
    /// Validates, sorts and wraps the labels.
    ///
    /// # Errors
    /// [`RecordError::TooManyLabels`], [`RecordError::DuplicateLabel`] or
    /// [`RecordError::LabelValue`].
    pub fn new(mut labels: Vec<(LabelDimension, String)>) -> Result<Self, RecordError> {
        if labels.len() > MAX_LABELS {
            return Err(RecordError::TooManyLabels(labels.len()));
        }
        labels.sort_by_key(|(d, _)| *d);
        for pair in labels.windows(2) {
            if pair[0].0 == pair[1].0 {
                return Err(RecordError::DuplicateLabel(pair[0].0));
            }
        }
        for (_, v) in &labels {
            let ok = !v.is_empty()
                && v.len() <= MAX_LABEL_VALUE_BYTES
                && v.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
                });
            if !ok {
                return Err(RecordError::LabelValue(v.chars().take(80).collect()));
            }
        }
        Ok(Self(labels))
    }

    /// The value for one dimension, if set.
    pub fn get(&self, dim: LabelDimension) -> Option<&str> {
        self.0
            .iter()
            .find(|(d, _)| *d == dim)
            .map(|(_, v)| v.as_str())
    }

    /// Iterates `(dimension, value)` in dimension order.
    pub fn iter(&self) -> impl Iterator<Item = (LabelDimension, &str)> {
        self.0.iter().map(|(d, v)| (*d, v.as_str()))
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are no labels.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl TryFrom<Vec<(LabelDimension, String)>> for Labels {
    type Error = RecordError;
    fn try_from(v: Vec<(LabelDimension, String)>) -> Result<Self, RecordError> {
        Self::new(v)
    }
}

impl From<Labels> for Vec<(LabelDimension, String)> {
    fn from(l: Labels) -> Self {
        l.0
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(d, v)| (d.as_str(), v)))
            .finish()
    }
}

/// Where and what an instance serves: the part of the record that callers route on.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EndpointSpec {
    /// IP and port new connections go to.
    pub address: SocketAddr,
    /// Zone of the instance (the region is in the record).
    pub zone: Zone,
    /// Software version the instance runs.
    pub version: Version,
    /// Relative weight for weighted picks, `MIN_WEIGHT..=MAX_WEIGHT`.
    pub weight: u32,
    /// Capability labels from the predefined dimensions.
    pub labels: Labels,
}

impl EndpointSpec {
    /// Checks the fields that types alone cannot (the weight range).
    ///
    /// # Errors
    /// [`RecordError::Weight`] when the weight is out of range.
    pub fn validate(&self) -> Result<(), RecordError> {
        if !(MIN_WEIGHT..=MAX_WEIGHT).contains(&self.weight) {
            return Err(RecordError::Weight(self.weight));
        }
        Ok(())
    }
}

/// Lifecycle state, as ordered by the region authority. Only READY is routable, and only when
/// health passes and the owner node is alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LifecycleState {
    /// Admitted, initialising: no traffic.
    Starting,
    /// Takes new traffic.
    Ready,
    /// No new requests; existing connections finish.
    Draining,
    /// Terminal: deregistered or lease not renewed. A tombstone.
    Expired,
}

impl LifecycleState {
    /// Upper-case name as used in the requirements and the API, e.g. `"READY"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "STARTING",
            Self::Ready => "READY",
            Self::Draining => "DRAINING",
            Self::Expired => "EXPIRED",
        }
    }
}

/// Who asked for a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TransitionSource {
    /// The region authority itself (e.g. the lease safety net).
    Authority,
    /// The agent on the instance's own node (probes, local API).
    OwnerAgent,
    /// An orchestrator controller with an identity allowed for the service.
    Orchestrator,
}

/// Why a transition happened. Part of every lifecycle and health record (and the audit log).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TransitionReason {
    /// A new instance (or a new generation of one) was admitted: -> STARTING.
    Registered,
    /// Startup and readiness probes passed: STARTING -> READY.
    ReadinessPassed,
    /// Deliberate withdrawal (deploy, scale-in, operator): -> DRAINING.
    DrainRequested,
    /// A drain was cancelled: DRAINING -> READY.
    DrainCancelled,
    /// The owner deregistered the instance: -> EXPIRED.
    Deregistered,
    /// The owner node stayed down longer than the lease: -> EXPIRED.
    LeaseExpired,
    /// Health: the readiness probe failed `failure_threshold` times.
    ReadinessFailed,
    /// Health: the readiness probe recovered after failing.
    ReadinessRecovered,
    /// Health: the liveness probe failed (reported; restarts are the orchestrator's business).
    LivenessFailed,
    /// The owner node presented a new node key (its data directory was replaced): the
    /// authority re-issued the record, same state, bound to the new key
    /// (`docs/adr/0006-node-keys-in-lifecycle-records.md`).
    NodeKeyChanged,
    /// An operator revoked the owner node's key: -> EXPIRED, and nothing signed by the node
    /// verifies any more.
    NodeRevoked,
}

/// The authority-signed half of an endpoint: identity, address, lifecycle state.
///
/// Ordered by `(generation, revision)`. Revisions are region-wide and gap-free, so an agent can
/// tell from revision numbers alone whether it has missed something.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LifecycleRecord {
    /// Catalog key.
    pub key: ServiceKey,
    /// Stable instance id.
    pub instance: InstanceId,
    /// Boot generation this record is about.
    pub generation: Generation,
    /// Region whose authority signed the record; the instance lives in this region.
    pub region: Region,
    /// Region revision assigned at commit.
    pub revision: Revision,
    /// Node whose agent owns the instance (and alone may sign its health).
    pub owner: NodeId,
    /// The owner node's ed25519 public key as the authority knows it when signing: health
    /// records of this instance verify only against it. `None` when the node has not
    /// presented a key yet (or was revoked); its health then verifies nowhere.
    /// See `docs/adr/0006-node-keys-in-lifecycle-records.md`.
    pub owner_key: Option<NodeKey>,
    /// Address and routing metadata.
    pub endpoint: EndpointSpec,
    /// Lifecycle state after this transition.
    pub state: LifecycleState,
    /// Why the transition happened.
    pub reason: TransitionReason,
    /// Who asked for it.
    pub source: TransitionSource,
    /// Lease in milliseconds: how long the owner node may stay down before the authority expires
    /// the record. Renewal is implicit while the owner is alive in the mesh.
    pub lease_ms: u32,
    /// Authority wall-clock commit time in Unix milliseconds; informational (measuring drain
    /// propagation), never used for ordering.
    pub committed_at_ms: u64,
}

/// The 32 bytes of an owner node's ed25519 public key, as bound into lifecycle records.
pub type NodeKey = [u8; 32];

/// Health status signed by the owner agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HealthStatus {
    /// Readiness passes: the instance may take traffic if its lifecycle is READY.
    Passing,
    /// Readiness failed: no new traffic (UNHEALTHY).
    Failing,
}

/// The owner-signed half of an endpoint: whether readiness passes now.
///
/// Ordered by `(generation, owner_boot, seq)`. `seq` is gap-free per `(owner, owner_boot)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HealthRecord {
    /// Catalog key.
    pub key: ServiceKey,
    /// Stable instance id.
    pub instance: InstanceId,
    /// Boot generation of the instance this status is about.
    pub generation: Generation,
    /// The signing agent's node; must equal the lifecycle record's owner.
    pub owner: NodeId,
    /// Boot generation of the signing agent (agents restart; their sequences restart with them).
    pub owner_boot: Generation,
    /// Per-(owner, owner_boot) sequence number, starting at 1.
    pub seq: HealthSeq,
    /// Current status.
    pub status: HealthStatus,
    /// Why the status is what it is.
    pub reason: TransitionReason,
}

impl HealthRecord {
    /// The ordering key of the health register.
    pub fn order(&self) -> (Generation, Generation, HealthSeq) {
        (self.generation, self.owner_boot, self.seq)
    }
}

impl LifecycleRecord {
    /// The ordering key of the lifecycle register.
    pub fn order(&self) -> (Generation, Revision) {
        (self.generation, self.revision)
    }
}
