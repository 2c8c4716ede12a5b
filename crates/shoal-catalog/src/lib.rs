//! # shoal-catalog
//!
//! The endpoint catalog every agent holds: the lifecycle rules ([`lifecycle`]), the CRDT merge
//! of authority-signed lifecycle records and owner-signed health records ([`catalog`]), routable
//! views ([`view`]), per-origin heads and gap detection ([`heads`]), and checked snapshots
//! ([`snapshot`]). Pure code: no IO, no clock, no tokio.
//!
//! ```
//! use std::sync::Arc;
//! use shoal_catalog::{Catalog, Keyring, MergeOutcome, view::AllAlive};
//! use shoal_catalog::testkit::Fixture;
//!
//! let fx = Fixture::new();
//! let mut catalog = Catalog::new();
//! let ready = fx.lifecycle("a-1", 1, 2, shoal_proto::LifecycleState::Ready);
//! assert_eq!(catalog.apply_lifecycle(Arc::new(ready.clone()), &fx.keyring), MergeOutcome::Applied);
//! assert_eq!(catalog.apply_lifecycle(Arc::new(ready), &fx.keyring), MergeOutcome::Duplicate);
//! assert_eq!(catalog.routable(&fx.key, &AllAlive).count(), 1);
//! ```

pub mod catalog;
pub mod failover;
pub mod heads;
pub mod lifecycle;
pub mod remote;
pub mod snapshot;
pub mod testkit;
pub mod verify;
pub mod view;

pub use catalog::{
    Catalog, DeltaError, DeltaOutcome, Entry, Heads, HealthDelta, LifecycleDelta, MergeCounters,
    MergeOutcome, OwnerHead, RegionHead,
};
pub use heads::{ChainHead, Gap};
pub use lifecycle::{check_transition, IllegalTransition};
pub use snapshot::{Snapshot, SnapshotError, SnapshotScope};
pub use verify::{Keyring, RecordCache, Verifier};
pub use view::{EndpointState, EndpointView, Liveness, ServiceView};
