//! The four resource types built from a [`View`]: Listener, RouteConfiguration, Cluster and
//! ClusterLoadAssignment, each named [`resource_name`] of its service key.
//!
//! Shapes follow what proxyless gRPC accepts (gRFC A27 "xDS-Based Global Load Balancing"):
//! the Listener is an `api_listener` holding an `HttpConnectionManager` that fetches its routes
//! over ADS (RDS) and ends with the router filter; the route configuration has one virtual host
//! (`domains: ["*"]`) whose default route goes to the cluster of the same name; the Cluster is
//! of type EDS with its endpoints over ADS; the assignment groups endpoints by locality with
//! contiguous priorities from 0. Envoy accepts the same resources.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::config::core::v3::{
    address, config_source, socket_address, Address, AggregatedConfigSource, ApiVersion,
    ConfigSource, HealthStatus, Locality as PbLocality, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    cluster_load_assignment, lb_endpoint, ClusterLoadAssignment, Endpoint as PbEndpoint,
    LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    route, route_action, route_match, Route, RouteAction, RouteConfiguration, RouteMatch,
    VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager, http_filter, HttpConnectionManager, HttpFilter, Rds,
};
use envoy_types::pb::google::protobuf::{value, Any, Duration, Struct, UInt32Value, Value};
use envoy_types::util::pack_any;
use prost::Name;
use shoal_proto::{Region, ServiceKey, Zone};

use crate::model::{resource_name, Endpoint, EndpointHealth, FailoverRegion, Locality, View};

/// The resource types served, by their type URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceType {
    /// `envoy.config.listener.v3.Listener` (LDS).
    Listener,
    /// `envoy.config.route.v3.RouteConfiguration` (RDS).
    Route,
    /// `envoy.config.cluster.v3.Cluster` (CDS).
    Cluster,
    /// `envoy.config.endpoint.v3.ClusterLoadAssignment` (EDS).
    Endpoint,
}

impl ResourceType {
    /// Every type, in the order a client subscribes to them (LDS, RDS, CDS, EDS).
    pub const ALL: [ResourceType; 4] = [Self::Listener, Self::Route, Self::Cluster, Self::Endpoint];

    /// The type URL, e.g. `type.googleapis.com/envoy.config.listener.v3.Listener`.
    pub fn type_url(self) -> String {
        match self {
            Self::Listener => Listener::type_url(),
            Self::Route => RouteConfiguration::type_url(),
            Self::Cluster => Cluster::type_url(),
            Self::Endpoint => ClusterLoadAssignment::type_url(),
        }
    }

    /// The type of a type URL; `None` for a type this server does not serve.
    pub fn from_type_url(url: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.type_url() == url)
    }

    /// Short label for logs and metrics: `lds`, `rds`, `cds`, `eds`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Listener => "lds",
            Self::Route => "rds",
            Self::Cluster => "cds",
            Self::Endpoint => "eds",
        }
    }

    /// True for the types where an empty subscription means "everything" (the legacy wildcard
    /// of LDS and CDS); for RDS and EDS it means nothing.
    pub fn empty_means_wildcard(self) -> bool {
        matches!(self, Self::Listener | Self::Cluster)
    }
}

/// Connect timeout served in every Cluster, ms (Envoy's default is 5 s; gRPC ignores it).
pub const CONNECT_TIMEOUT_MS: u32 = 1_000;

fn ads() -> Option<ConfigSource> {
    Some(ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        ..Default::default()
    })
}

/// The Listener of one service: an `api_listener` whose `HttpConnectionManager` takes its
/// routes from RDS over ADS (route configuration of the same name) and ends with the router
/// filter, as proxyless gRPC requires.
pub fn listener(key: &ServiceKey) -> Listener {
    let name = resource_name(key);
    let hcm = HttpConnectionManager {
        stat_prefix: name.clone(),
        route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: ads(),
            route_config_name: name.clone(),
        })),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".to_string(),
            config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
                Router::default(),
            ))),
            ..Default::default()
        }],
        ..Default::default()
    };
    Listener {
        name,
        api_listener: Some(ApiListener {
            api_listener: Some(pack_any(hcm)),
        }),
        ..Default::default()
    }
}

/// The RouteConfiguration of one service: one virtual host matching any authority, whose
/// default route (prefix `""`) goes to the cluster of the same name.
pub fn route_configuration(key: &ServiceKey) -> RouteConfiguration {
    let name = resource_name(key);
    RouteConfiguration {
        name: name.clone(),
        virtual_hosts: vec![VirtualHost {
            name: name.clone(),
            domains: vec!["*".to_string()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(route_match::PathSpecifier::Prefix(String::new())),
                    ..Default::default()
                }),
                action: Some(route::Action::Route(RouteAction {
                    cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(name)),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The Cluster of one service: type EDS, endpoints over ADS under the same name, round robin.
pub fn cluster(key: &ServiceKey) -> Cluster {
    let name = resource_name(key);
    Cluster {
        name: name.clone(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: ads(),
            service_name: name,
        }),
        lb_policy: cluster::LbPolicy::RoundRobin as i32,
        connect_timeout: Some(Duration {
            seconds: 0,
            nanos: (CONNECT_TIMEOUT_MS * 1_000_000) as i32,
        }),
        ..Default::default()
    }
}

/// Locality tier of an endpoint for a caller: 0 the caller's zone, 1 the rest of its region,
/// `2 + i` the `i`-th failover region; `None`: not served (another region, not a failover).
fn tier(ep: &Endpoint, caller: &Locality, failover: &[&FailoverRegion]) -> Option<usize> {
    if ep.region == caller.region {
        return Some(if ep.zone == caller.zone { 0 } else { 1 });
    }
    failover
        .iter()
        .position(|f| f.region == ep.region)
        .map(|i| 2 + i)
}

/// Key of the endpoint metadata shoal serves (`filter_metadata["shoal"]`).
pub const METADATA_KEY: &str = "shoal";

/// `filter_metadata["shoal"]` of a failover endpoint or locality: `tier`
/// (`failover:<region>`, as a pick names it), `read_only` and `degraded` (booleans).
fn failover_metadata(f: &FailoverRegion) -> Metadata {
    let field = |k: &str, v: value::Kind| (k.to_string(), Value { kind: Some(v) });
    let fields = [
        field(
            "tier",
            value::Kind::StringValue(format!("failover:{}", f.region)),
        ),
        field("read_only", value::Kind::BoolValue(f.read_only)),
        field("degraded", value::Kind::BoolValue(f.degraded)),
    ]
    .into_iter()
    .collect();
    Metadata {
        filter_metadata: [(METADATA_KEY.to_string(), Struct { fields })]
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

fn health_status(h: EndpointHealth) -> HealthStatus {
    match h {
        EndpointHealth::Healthy => HealthStatus::Healthy,
        EndpointHealth::Draining => HealthStatus::Draining,
        EndpointHealth::Unhealthy => HealthStatus::Unhealthy,
    }
}

fn lb_endpoint(ep: &Endpoint, failover: Option<&FailoverRegion>) -> LbEndpoint {
    LbEndpoint {
        metadata: failover.map(failover_metadata),
        health_status: health_status(ep.health) as i32,
        load_balancing_weight: Some(UInt32Value { value: ep.weight }),
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(PbEndpoint {
            address: Some(Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: ep.address.ip().to_string(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                        ep.address.port(),
                    ))),
                    ..Default::default()
                })),
            }),
            hostname: ep.instance.clone(),
            ..Default::default()
        })),
    }
}

/// The ClusterLoadAssignment of one service for one caller.
///
/// Endpoints are grouped by locality (region, zone). Priorities follow the locality tiers
/// (caller's zone, rest of the region, then the failover regions in policy order) but are
/// **compacted**: the tiers that have endpoints get 0, 1, 2, ... in that order, because gRPC
/// refuses an assignment whose priorities have a gap (so with no endpoint in the caller's zone,
/// the rest of the region is priority 0). A locality's `load_balancing_weight` is the sum of its
/// healthy endpoints' weights, at least 1 (gRPC drops localities without a weight). Every
/// endpoint is listed with its health: only `HEALTHY` ones take traffic.
///
/// `failover` is the service's policy (its regions in order, [`View::failover`]); endpoints
/// of a region it does not list are never served. The failover regions are served only while
/// the caller's region has no healthy endpoint, as a local pick fails over only then: with
/// them always present, Envoy's priority spill-over (overprovisioning factor 1.4) would send a
/// share of the traffic across regions as soon as the region is below ~71 % healthy.
/// Failover endpoints and localities carry `filter_metadata["shoal"]` = `{tier, read_only,
/// degraded}`; xDS has no write intent, so a writer must honour `read_only` itself.
///
/// **Threshold failover** (`overprovisioning_factor_pct` set, [`View::overprovisioning_factor_pct`]):
/// that spill is what the policy asks for, so the failover regions are served always, the
/// assignment's `policy.overprovisioning_factor` is the policy's, and the caller's whole
/// region is **one** priority (0; its zones are localities of it), the failover regions 1, 2,
/// ... Envoy then computes priority 0's health as healthy / listed endpoints x factor (by
/// count, `weighted_priority_health = false`), exactly the share a pick keeps
/// (`shoal_catalog::failover::LocalCapacity`): every non-expired endpoint of the region is
/// listed, the non-routable ones `UNHEALTHY` or `DRAINING`. The cost: for such a service the
/// caller's zone is no longer a priority of its own (zone and rest of the region would be
/// two priorities whose healths Envoy adds up, spilling far less than the policy says).
pub fn load_assignment(
    key: &ServiceKey,
    endpoints: &[Endpoint],
    caller: &Locality,
    failover: &[FailoverRegion],
    overprovisioning_factor_pct: Option<u32>,
) -> ClusterLoadAssignment {
    let threshold = overprovisioning_factor_pct.is_some();
    let region_healthy = endpoints
        .iter()
        .any(|e| e.region == caller.region && e.health == EndpointHealth::Healthy);
    let regions: Vec<&FailoverRegion> = if region_healthy && !threshold {
        Vec::new()
    } else {
        failover
            .iter()
            .filter(|f| f.region != caller.region)
            .collect()
    };
    let mut groups: BTreeMap<(usize, Region, Zone), Vec<&Endpoint>> = BTreeMap::new();
    for ep in endpoints {
        if let Some(t) = tier(ep, caller, &regions) {
            // Threshold failover: the caller's zone and the rest of its region share one tier.
            let t = if threshold && t == 1 { 0 } else { t };
            groups
                .entry((t, ep.region.clone(), ep.zone.clone()))
                .or_default()
                .push(ep);
        }
    }
    let mut priority = 0u32;
    let mut last_tier = None;
    let mut out = Vec::with_capacity(groups.len());
    for ((t, region, zone), mut eps) in groups {
        if last_tier.is_some_and(|l| l != t) {
            priority += 1;
        }
        last_tier = Some(t);
        let policy = t.checked_sub(2).map(|i| regions[i]);
        eps.sort_by(|a, b| a.instance.cmp(&b.instance));
        let healthy_weight: u64 = eps
            .iter()
            .filter(|e| e.health == EndpointHealth::Healthy)
            .map(|e| u64::from(e.weight))
            .sum();
        out.push(LocalityLbEndpoints {
            locality: Some(PbLocality {
                region: region.to_string(),
                zone: zone.to_string(),
                sub_zone: String::new(),
            }),
            lb_endpoints: eps.into_iter().map(|e| lb_endpoint(e, policy)).collect(),
            load_balancing_weight: Some(UInt32Value {
                value: u32::try_from(healthy_weight.max(1)).unwrap_or(u32::MAX),
            }),
            priority,
            metadata: policy.map(failover_metadata),
            ..Default::default()
        });
    }
    ClusterLoadAssignment {
        cluster_name: resource_name(key),
        endpoints: out,
        policy: overprovisioning_factor_pct.map(|f| cluster_load_assignment::Policy {
            overprovisioning_factor: Some(UInt32Value { value: f }),
            weighted_priority_health: false,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The resources of one type for the subscribed names (`None`: every resource of the view,
/// the LDS/CDS wildcard), packed as `Any`, in name order. Names that the view does not hold
/// are left out (for LDS and CDS the client then knows the resource does not exist).
pub fn build(
    ty: ResourceType,
    view: &View,
    names: Option<&std::collections::BTreeSet<String>>,
    caller: &Locality,
) -> Vec<(String, Any)> {
    let wanted = |n: &str| names.is_none_or(|set| set.contains(n));
    let mut out: Vec<(String, Any)> = view
        .services
        .iter()
        .map(|(key, eps)| (resource_name(key), key, eps))
        .filter(|(name, _, _)| wanted(name))
        .map(|(name, key, eps)| {
            let any = match ty {
                ResourceType::Listener => pack_any(listener(key)),
                ResourceType::Route => pack_any(route_configuration(key)),
                ResourceType::Cluster => pack_any(cluster(key)),
                ResourceType::Endpoint => pack_any(load_assignment(
                    key,
                    eps,
                    caller,
                    view.failover_of(key),
                    view.overprovisioning_factor_of(key),
                )),
            };
            (name, any)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(instance: &str, region: &str, zone: &str, health: EndpointHealth) -> Endpoint {
        Endpoint {
            instance: instance.to_string(),
            address: "127.0.0.1:9000".parse().unwrap(),
            region: Region::new(region).unwrap(),
            zone: Zone::new(zone).unwrap(),
            weight: 100,
            health,
        }
    }

    fn caller() -> Locality {
        Locality {
            region: Region::new("eu").unwrap(),
            zone: Zone::new("eu-a").unwrap(),
        }
    }

    fn to(region: &str, read_only: bool) -> FailoverRegion {
        FailoverRegion {
            region: Region::new(region).unwrap(),
            read_only,
            degraded: false,
        }
    }

    /// (priority, zone, [(hostname, health)], locality weight) per locality.
    type Summary = Vec<(u32, String, Vec<(String, i32)>, u32)>;

    fn summary(cla: &ClusterLoadAssignment) -> Summary {
        cla.endpoints
            .iter()
            .map(|l| {
                let loc = l.locality.clone().unwrap();
                let eps = l
                    .lb_endpoints
                    .iter()
                    .map(|e| match &e.host_identifier {
                        Some(lb_endpoint::HostIdentifier::Endpoint(p)) => {
                            (p.hostname.clone(), e.health_status)
                        }
                        _ => panic!("no endpoint"),
                    })
                    .collect();
                (
                    l.priority,
                    loc.zone,
                    eps,
                    l.load_balancing_weight.unwrap().value,
                )
            })
            .collect()
    }

    #[test]
    fn caller_zone_is_priority_0_rest_of_region_1_and_health_is_reported() {
        use EndpointHealth::*;
        let key: ServiceKey = "prod/web/grpc".parse().unwrap();
        let eps = vec![
            ep("b-1", "eu", "eu-b", Healthy),
            ep("a-2", "eu", "eu-a", Draining),
            ep("a-1", "eu", "eu-a", Healthy),
            ep("a-3", "eu", "eu-a", Unhealthy),
            ep("us-1", "us", "us-a", Healthy),
        ];
        let cla = load_assignment(&key, &eps, &caller(), &[], None);
        assert_eq!(cla.cluster_name, "web.grpc.prod");
        let (h, d, u) = (
            HealthStatus::Healthy as i32,
            HealthStatus::Draining as i32,
            HealthStatus::Unhealthy as i32,
        );
        assert_eq!(
            summary(&cla),
            vec![
                (
                    0,
                    "eu-a".to_string(),
                    vec![("a-1".into(), h), ("a-2".into(), d), ("a-3".into(), u)],
                    100
                ),
                (1, "eu-b".to_string(), vec![("b-1".into(), h)], 100),
            ],
            "another region is not served without a failover policy"
        );
    }

    #[test]
    fn priorities_are_compacted_and_failover_regions_come_last() {
        use EndpointHealth::*;
        let key: ServiceKey = "prod/web/grpc".parse().unwrap();
        let eps = vec![
            ep("b-1", "eu", "eu-b", Draining),
            ep("us-1", "us", "us-a", Healthy),
        ];
        let cla = load_assignment(&key, &eps, &caller(), &[to("us", false)], None);
        let got: Vec<(u32, String, u32)> = summary(&cla)
            .into_iter()
            .map(|(p, z, _, w)| (p, z, w))
            .collect();
        // No endpoint in the caller's zone: the region is priority 0, the failover region 1.
        // A locality with no healthy endpoint keeps weight 1 (gRPC drops weightless ones).
        assert_eq!(
            got,
            vec![(0, "eu-b".to_string(), 1), (1, "us-a".to_string(), 100)]
        );
    }

    /// (priority, region, `filter_metadata["shoal"]` as (tier, read_only, degraded)) of a locality.
    type Tiered = (u32, String, Option<(String, bool, bool)>);

    fn tiers(cla: &ClusterLoadAssignment) -> Vec<Tiered> {
        cla.endpoints
            .iter()
            .map(|l| {
                let meta = |m: &Option<Metadata>| {
                    let f = &m.as_ref()?.filter_metadata.get(METADATA_KEY)?.fields;
                    let s = |k: &str| match f.get(k)?.kind.as_ref()? {
                        value::Kind::StringValue(v) => Some(v.clone()),
                        _ => None,
                    };
                    let b = |k: &str| match f.get(k)?.kind.as_ref()? {
                        value::Kind::BoolValue(v) => Some(*v),
                        _ => None,
                    };
                    Some((s("tier")?, b("read_only")?, b("degraded")?))
                };
                let m = meta(&l.metadata);
                for e in &l.lb_endpoints {
                    assert_eq!(
                        meta(&e.metadata),
                        m,
                        "endpoint metadata = locality metadata"
                    );
                }
                (l.priority, l.locality.clone().unwrap().region, m)
            })
            .collect()
    }

    #[test]
    fn failover_regions_follow_the_policy_order_only_while_the_region_has_no_healthy_endpoint() {
        use EndpointHealth::*;
        let key: ServiceKey = "prod/web/grpc".parse().unwrap();
        let policy = [to("us", false), to("ap", true)];
        let mut eps = vec![
            ep("a-1", "eu", "eu-a", Draining),
            ep("b-1", "eu", "eu-b", Healthy),
            ep("ap-1", "ap", "ap-a", Healthy),
            ep("us-1", "us", "us-a", Healthy),
            ep("sa-1", "sa", "sa-a", Healthy),
        ];
        let cla = load_assignment(&key, &eps, &caller(), &policy, None);
        assert_eq!(
            tiers(&cla),
            vec![(0, "eu".into(), None), (1, "eu".into(), None)],
            "a region with a healthy endpoint never fails over"
        );
        eps[1].health = Unhealthy;
        let cla = load_assignment(&key, &eps, &caller(), &policy, None);
        assert_eq!(
            tiers(&cla),
            vec![
                (0, "eu".into(), None),
                (1, "eu".into(), None),
                (2, "us".into(), Some(("failover:us".into(), false, false))),
                (3, "ap".into(), Some(("failover:ap".into(), true, false))),
            ],
            "zone, region, then the policy's regions in order; sa has no policy"
        );
        let cla = load_assignment(&key, &eps, &caller(), &[], None);
        assert_eq!(tiers(&cla).len(), 2, "no policy: the region only");
        let degraded = [FailoverRegion {
            degraded: true,
            ..to("ap", true)
        }];
        let cla = load_assignment(&key, &eps[2..], &caller(), &degraded, None);
        assert_eq!(
            tiers(&cla),
            vec![(0, "ap".into(), Some(("failover:ap".into(), true, true)))],
            "an unknown region has no healthy endpoint either; priorities stay compacted"
        );
    }

    #[test]
    fn threshold_failover_serves_the_region_as_one_priority_then_the_policy_regions_always() {
        use EndpointHealth::*;
        let key: ServiceKey = "prod/web/grpc".parse().unwrap();
        let policy = [to("us", false), to("ap", true)];
        // 3 of the region's 10 endpoints healthy, in two zones; us and ap healthy.
        let mut eps: Vec<Endpoint> = (0..10)
            .map(|i| {
                let zone = if i % 2 == 0 { "eu-a" } else { "eu-b" };
                let h = match i {
                    0..=2 => Healthy,
                    3..=5 => Draining,
                    _ => Unhealthy,
                };
                ep(&format!("eu-{i}"), "eu", zone, h)
            })
            .collect();
        eps.push(ep("us-1", "us", "us-a", Healthy));
        eps.push(ep("ap-1", "ap", "ap-a", Healthy));
        eps.push(ep("sa-1", "sa", "sa-a", Healthy));
        let cla = load_assignment(&key, &eps, &caller(), &policy, Some(140));
        let p = cla.policy.clone().expect("a policy");
        assert_eq!(p.overprovisioning_factor, Some(UInt32Value { value: 140 }));
        assert!(!p.weighted_priority_health, "health by count, as a pick");
        assert_eq!(
            tiers(&cla),
            vec![
                (0, "eu".into(), None),
                (0, "eu".into(), None),
                (1, "us".into(), Some(("failover:us".into(), false, false))),
                (2, "ap".into(), Some(("failover:ap".into(), true, false))),
            ],
            "both zones of the region at priority 0, the policy's regions after; sa never"
        );
        // Envoy's priority-0 health from what is listed: healthy / listed x factor.
        let local: Vec<&LbEndpoint> = cla
            .endpoints
            .iter()
            .filter(|l| l.priority == 0)
            .flat_map(|l| &l.lb_endpoints)
            .collect();
        let healthy = local
            .iter()
            .filter(|e| e.health_status == HealthStatus::Healthy as i32)
            .count() as u32;
        assert_eq!(
            (healthy, local.len()),
            (3, 10),
            "every endpoint listed with its health"
        );
        assert_eq!((140 * healthy / local.len() as u32).min(100), 42);
        let shared = shoal_catalog_share(healthy, local.len() as u32, 140);
        assert_eq!(shared, 42, "the share a pick keeps, from the same counts");
        // A fully healthy region still lists the failover regions (Envoy spills nothing at
        // 100 % health), and without the factor nothing changes from all-or-nothing.
        for e in eps.iter_mut().filter(|e| e.region.as_str() == "eu") {
            e.health = Healthy;
        }
        let cla = load_assignment(&key, &eps, &caller(), &policy, Some(140));
        assert_eq!(tiers(&cla).len(), 4);
        let cla = load_assignment(&key, &eps, &caller(), &policy, None);
        assert_eq!(
            tiers(&cla),
            vec![(0, "eu".into(), None), (1, "eu".into(), None)]
        );
        assert!(cla.policy.is_none());
    }

    /// The pick's formula (`shoal_catalog::failover::LocalCapacity::local_share_pct`).
    fn shoal_catalog_share(routable: u32, registered: u32, factor: u32) -> u32 {
        shoal_catalog::failover::LocalCapacity {
            routable,
            registered,
        }
        .local_share_pct(factor)
    }

    #[test]
    fn listener_is_an_api_listener_with_rds_over_ads_and_the_router_last() {
        use prost::Message;
        let key: ServiceKey = "prod/web/grpc".parse().unwrap();
        let l = listener(&key);
        assert_eq!(l.name, "web.grpc.prod");
        let any = l.api_listener.unwrap().api_listener.unwrap();
        assert_eq!(any.type_url, HttpConnectionManager::type_url());
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        match hcm.route_specifier {
            Some(http_connection_manager::RouteSpecifier::Rds(rds)) => {
                assert_eq!(rds.route_config_name, "web.grpc.prod");
                assert!(matches!(
                    rds.config_source.unwrap().config_source_specifier,
                    Some(config_source::ConfigSourceSpecifier::Ads(_))
                ));
            }
            other => panic!("expected RDS, got {other:?}"),
        }
        let last = hcm.http_filters.last().unwrap();
        assert_eq!(last.name, "envoy.filters.http.router");
        let c = cluster(&key);
        assert_eq!(
            c.eds_cluster_config.unwrap().service_name,
            "web.grpc.prod",
            "the cluster's EDS name is the assignment's name"
        );
    }
}
