//! Routable views: what a caller may be handed for new traffic.
//!
//! **Routable = lifecycle READY and health passing and owner node not down and not locally
//! ejected** (invariant 5, docs/invariants.md). Owner liveness and local ejections are *inputs* (from
//! SWIM and from the agent's passive outcome reports), never stored in the catalog, so a node's
//! death changes every agent's view without a single per-instance message.

use serde::{Deserialize, Serialize};
use shoal_proto::{
    EndpointSpec, Generation, HealthStatus, InstanceId, LifecycleState, NodeId, Region, Revision,
    ServiceKey, TransitionReason, TransitionSource, Zone,
};

use crate::catalog::{Catalog, Entry};

/// The state an endpoint is reported in, combining lifecycle, health and owner liveness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EndpointState {
    /// Admitted, initialising.
    Starting,
    /// Takes new traffic (if not locally ejected).
    Ready,
    /// No new requests.
    Draining,
    /// READY, but readiness fails or the owner node is down.
    Unhealthy,
    /// Deregistered or lease expired (a tombstone).
    Expired,
}

impl EndpointState {
    /// Upper-case name, e.g. `"UNHEALTHY"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "STARTING",
            Self::Ready => "READY",
            Self::Draining => "DRAINING",
            Self::Unhealthy => "UNHEALTHY",
            Self::Expired => "EXPIRED",
        }
    }

    /// Parses an upper- or lower-case name.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Starting,
            Self::Ready,
            Self::Draining,
            Self::Unhealthy,
            Self::Expired,
        ]
        .into_iter()
        .find(|st| st.as_str().eq_ignore_ascii_case(s))
    }
}

/// Inputs a view needs that the catalog does not hold.
pub trait Liveness {
    /// True when SWIM currently considers `node` down (or it left).
    fn is_down(&self, node: &NodeId) -> bool;
    /// True when this agent has locally ejected the instance (passive failures).
    fn is_ejected(&self, instance: &InstanceId, generation: Generation) -> bool;
}

/// A [`Liveness`] with every node up and nothing ejected.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllAlive;

impl Liveness for AllAlive {
    fn is_down(&self, _: &NodeId) -> bool {
        false
    }
    fn is_ejected(&self, _: &InstanceId, _: Generation) -> bool {
        false
    }
}

impl<F: Fn(&NodeId) -> bool> Liveness for F {
    fn is_down(&self, node: &NodeId) -> bool {
        self(node)
    }
    fn is_ejected(&self, _: &InstanceId, _: Generation) -> bool {
        false
    }
}

/// Derives the reported state of one entry.
pub fn endpoint_state(entry: &Entry, owner_down: bool) -> EndpointState {
    let life = &entry.lifecycle().record;
    let failing = entry
        .health()
        .is_some_and(|h| h.record.status == HealthStatus::Failing);
    match life.state {
        LifecycleState::Starting => EndpointState::Starting,
        LifecycleState::Draining => EndpointState::Draining,
        LifecycleState::Expired => EndpointState::Expired,
        LifecycleState::Ready if failing || owner_down => EndpointState::Unhealthy,
        LifecycleState::Ready => EndpointState::Ready,
    }
}

/// True when the entry may be handed out for new traffic.
pub fn is_routable(entry: &Entry, liveness: &dyn Liveness) -> bool {
    let life = &entry.lifecycle().record;
    life.state == LifecycleState::Ready
        && entry
            .health()
            .is_none_or(|h| h.record.status == HealthStatus::Passing)
        && !liveness.is_down(&life.owner)
        && !liveness.is_ejected(&life.instance, life.generation)
}

/// One endpoint as reported to callers (owned, serialisable).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointView {
    /// Instance id.
    pub instance: InstanceId,
    /// Boot generation.
    pub generation: Generation,
    /// Region of the instance.
    pub region: Region,
    /// Owner node.
    pub node: NodeId,
    /// Address and metadata.
    pub endpoint: EndpointSpec,
    /// Reported state.
    pub state: EndpointState,
    /// Lifecycle revision of the record.
    pub revision: Revision,
    /// Reason of the last lifecycle transition.
    pub reason: TransitionReason,
    /// Source of the last lifecycle transition.
    pub source: TransitionSource,
    /// Health as signed by the owner (`None`: nothing reported for this generation yet).
    pub health: Option<HealthStatus>,
    /// SWIM considers the owner node down.
    pub owner_down: bool,
    /// Locally ejected by this agent.
    pub ejected: bool,
    /// May be handed out for new traffic.
    pub routable: bool,
}

impl EndpointView {
    /// Builds the view of one entry.
    pub fn of(entry: &Entry, liveness: &dyn Liveness) -> Self {
        let life = &entry.lifecycle().record;
        let owner_down = liveness.is_down(&life.owner);
        Self {
            instance: life.instance.clone(),
            generation: life.generation,
            region: life.region.clone(),
            node: life.owner.clone(),
            endpoint: life.endpoint.clone(),
            state: endpoint_state(entry, owner_down),
            revision: life.revision,
            reason: life.reason,
            source: life.source,
            health: entry.health().map(|h| h.record.status),
            owner_down,
            ejected: liveness.is_ejected(&life.instance, life.generation),
            routable: is_routable(entry, liveness),
        }
    }
}

/// Every endpoint of one service key, with the catalog index it reflects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceView {
    /// The key.
    pub key: ServiceKey,
    /// Catalog index of the last change to this service (0: never seen).
    pub modify_index: u64,
    /// Catalog index when the view was taken.
    pub catalog_index: u64,
    /// Endpoints in instance-id order (tombstones excluded).
    pub endpoints: Vec<EndpointView>,
}

impl Catalog {
    /// The view of one service key. Tombstones are left out.
    pub fn view(&self, key: &ServiceKey, liveness: &dyn Liveness) -> ServiceView {
        let service = self.service(key);
        ServiceView {
            key: key.clone(),
            modify_index: service.map_or(0, |s| s.modify_index),
            catalog_index: self.index(),
            endpoints: service
                .into_iter()
                .flat_map(|s| s.instances.values())
                .filter(|e| e.lifecycle().record.state != LifecycleState::Expired)
                .map(|e| EndpointView::of(e, liveness))
                .collect(),
        }
    }

    /// Routable entries of one key, without allocation per entry.
    pub fn routable<'a>(
        &'a self,
        key: &ServiceKey,
        liveness: &'a dyn Liveness,
    ) -> impl Iterator<Item = &'a Entry> + 'a {
        self.service(key)
            .into_iter()
            .flat_map(|s| s.instances.values())
            .filter(move |e| is_routable(e, liveness))
    }
}

/// Locality tier of an endpoint relative to the caller: 0 same zone, 1 same region, 2 other.
pub fn locality_tier(
    endpoint_region: &Region,
    endpoint_zone: &Zone,
    my_region: &Region,
    my_zone: &Zone,
) -> u8 {
    match (endpoint_region == my_region, endpoint_zone == my_zone) {
        (true, true) => 0,
        (true, false) => 1,
        (false, _) => 2,
    }
}

/// Picks one entry: the best (lowest) locality tier that has any routable entry, then weighted
/// by `endpoint.weight` using the caller-supplied random number `r` (so picks are deterministic
/// in the simulator). Entries of other regions are only considered when `allow_other_regions`
/// (cross-region routing happens only by explicit policy). `None`: no backend.
pub fn pick<'a>(
    candidates: impl IntoIterator<Item = &'a Entry>,
    my_region: &Region,
    my_zone: &Zone,
    allow_other_regions: bool,
    r: u64,
) -> Option<&'a Entry> {
    let mut best_tier = u8::MAX;
    let mut tier: Vec<&Entry> = Vec::new();
    for e in candidates {
        let life = &e.lifecycle().record;
        let t = locality_tier(&life.region, &life.endpoint.zone, my_region, my_zone);
        if t == 2 && !allow_other_regions {
            continue;
        }
        if t < best_tier {
            best_tier = t;
            tier.clear();
        }
        if t == best_tier {
            tier.push(e);
        }
    }
    let total: u64 = tier
        .iter()
        .map(|e| u64::from(e.lifecycle().record.endpoint.weight))
        .sum();
    if total == 0 {
        return None;
    }
    let mut point = r % total;
    for e in tier {
        let w = u64::from(e.lifecycle().record.endpoint.weight);
        if point < w {
            return Some(e);
        }
        point -= w;
    }
    unreachable!("point < total")
}
