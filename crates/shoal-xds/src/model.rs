//! What the xDS server serves: a plain snapshot of the agent's view, and the names it is served
//! under.
//!
//! The agent builds a [`View`] from its catalog whenever its view index moves and publishes it
//! on a `tokio::sync::watch` channel; every ADS stream turns the newest view into resources
//! ([`crate::resources`]). Keeping the input a plain value (not the catalog itself) lets the
//! stream logic be tested without an agent, and keeps the catalog's read lock out of gRPC code.
//!
//! ## Resource names
//!
//! One shoal service key `namespace/service/port` is served as one resource of each of the four
//! types, all under the same name `<service>.<port>.<namespace>` (the order of the DNS name
//! `<service>.<port>.<namespace>.service.<domain>`, without the suffix). Labels are
//! `[a-z0-9-]` ([`shoal_proto::Name`]), so the dots are unambiguous and the name is a valid
//! HTTP/2 `:authority`, which proxyless gRPC sends as the target's authority
//! (`xds:///web.grpc.prod`). See `docs/api/xds.md`.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use shoal_catalog::view::{EndpointState, EndpointView};
use shoal_proto::{Region, ServiceKey, Zone};

/// The xDS resource name of a service key: `<service>.<port>.<namespace>`.
///
/// ```
/// let key: shoal_proto::ServiceKey = "prod/web/grpc".parse().unwrap();
/// assert_eq!(shoal_xds::resource_name(&key), "web.grpc.prod");
/// ```
pub fn resource_name(key: &ServiceKey) -> String {
    format!("{}.{}.{}", key.service, key.port_name, key.namespace)
}

/// The service key a resource name stands for; `None` when the name is not of the form
/// `<service>.<port>.<namespace>` with three valid labels.
///
/// ```
/// let key = shoal_xds::parse_resource_name("web.grpc.prod").unwrap();
/// assert_eq!(key.to_string(), "prod/web/grpc");
/// assert!(shoal_xds::parse_resource_name("prod/web/grpc").is_none());
/// ```
pub fn parse_resource_name(name: &str) -> Option<ServiceKey> {
    let mut parts = name.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(service), Some(port), Some(namespace), None) => {
            ServiceKey::new(namespace, service, port).ok()
        }
        _ => None,
    }
}

/// How an endpoint is reported in a `ClusterLoadAssignment` (`envoy.config.core.v3.HealthStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EndpointHealth {
    /// Routable (READY, health passing, owner up, not ejected): `HEALTHY`.
    Healthy,
    /// Lifecycle DRAINING: `DRAINING` (Envoy and gRPC send it no new requests).
    Draining,
    /// Anything else that is not routable (STARTING, UNHEALTHY, owner down, locally ejected):
    /// `UNHEALTHY`.
    Unhealthy,
}

impl EndpointHealth {
    /// The health of one endpoint of the agent's view. Only a routable endpoint is healthy
    /// (invariant 5, docs/invariants.md): a READY endpoint whose owner is down or that this
    /// agent ejected is `Unhealthy`, never `Healthy`.
    pub fn of(view: &EndpointView) -> Self {
        match (view.routable, view.state) {
            (true, _) => Self::Healthy,
            (false, EndpointState::Draining) => Self::Draining,
            (false, _) => Self::Unhealthy,
        }
    }
}

/// One endpoint as served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Instance id (served as the endpoint's `hostname`, for logs and admin pages).
    pub instance: String,
    /// Where new connections go.
    pub address: SocketAddr,
    /// Region of the instance.
    pub region: Region,
    /// Zone of the instance.
    pub zone: Zone,
    /// Relative weight (`load_balancing_weight`; shoal's range is 1..=10 000, never 0).
    pub weight: u32,
    /// Reported health.
    pub health: EndpointHealth,
}

impl Endpoint {
    /// The served form of one endpoint of the agent's view.
    pub fn of(view: &EndpointView) -> Self {
        Self {
            instance: view.instance.to_string(),
            address: view.endpoint.address,
            region: view.region.clone(),
            zone: view.endpoint.zone.clone(),
            weight: view.endpoint.weight.max(1),
            health: EndpointHealth::of(view),
        }
    }
}

/// A snapshot of the agent's view: every service key it holds and their endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// The agent's view index this snapshot was taken at. Served as `version_info`; it only
    /// grows while the agent runs (it restarts with the agent, and so does every stream).
    pub version: u64,
    /// Endpoints per service key, in key order; tombstones (EXPIRED) left out. A key with no
    /// endpoint left is still served, as an empty assignment. Endpoints of other regions are
    /// the routable ones of the remote summaries the agent holds for the failover regions of
    /// [`View::failover`] (always [`EndpointHealth::Healthy`]); they are served only as that
    /// says.
    pub services: BTreeMap<ServiceKey, Vec<Endpoint>>,
    /// Per service, the failover regions its policy allows, in policy order. A service
    /// without an entry never leaves the caller's region.
    pub failover: BTreeMap<ServiceKey, Vec<FailoverRegion>>,
    /// Per service whose policy sets threshold failover, its `overprovisioning_factor_pct`
    /// (Envoy's `ClusterLoadAssignment.policy.overprovisioning_factor`, percent): its
    /// failover regions are then served always, and the client computes the spill from the
    /// region's health (see [`crate::resources::load_assignment`]).
    pub overprovisioning_factor_pct: BTreeMap<ServiceKey, u32>,
}

impl View {
    /// True when both views serve the same resources (the version is ignored).
    pub fn same_resources(&self, other: &View) -> bool {
        self.services == other.services
            && self.failover == other.failover
            && self.overprovisioning_factor_pct == other.overprovisioning_factor_pct
    }

    /// The failover regions of `key`, in policy order (empty: none).
    pub fn failover_of(&self, key: &ServiceKey) -> &[FailoverRegion] {
        self.failover.get(key).map_or(&[], Vec::as_slice)
    }

    /// The threshold-failover factor of `key` (`None`: all-or-nothing failover).
    pub fn overprovisioning_factor_of(&self, key: &ServiceKey) -> Option<u32> {
        self.overprovisioning_factor_pct.get(key).copied()
    }
}

/// One failover region of a service's policy (docs/adr/0013-global-policy-and-failover.md),
/// as the xDS assignment serves it. Its endpoints are served at the priorities after the
/// caller's region, and only while that region has no healthy endpoint of the service (the
/// rule of a local pick; cross-region routing happens only by explicit policy, REQUIREMENTS),
/// or always when the policy sets threshold failover ([`View::overprovisioning_factor_pct`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverRegion {
    /// The region.
    pub region: Region,
    /// The policy allows read-only failover only: served in the endpoints' metadata
    /// (`filter_metadata["shoal"].read_only`), since xDS has no write intent to refuse.
    pub read_only: bool,
    /// The region's summary is past the policy's `max_snapshot_age_s` and the policy says
    /// `degrade` (with `refuse` the region is left out): served as `degraded` in the metadata.
    pub degraded: bool,
}

/// Where the caller is: picks priority 0 (its zone) and 1 (the rest of its region).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locality {
    /// The caller's region (always the agent's: an agent serves its own region's view).
    pub region: Region,
    /// The caller's zone: the `node.locality.zone` of the caller's bootstrap when it names a
    /// valid zone, else the agent's zone (a caller runs next to its agent).
    pub zone: Zone,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_refuse_other_shapes() {
        let key: ServiceKey = "staging/api-v2/grpc".parse().unwrap();
        let name = resource_name(&key);
        assert_eq!(name, "api-v2.grpc.staging");
        assert_eq!(parse_resource_name(&name), Some(key));
        for bad in ["", "a.b", "a.b.c.d", "A.b.c", "a..c", "staging/api/grpc"] {
            assert_eq!(parse_resource_name(bad), None, "{bad:?}");
        }
    }
}
