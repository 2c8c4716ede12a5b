//! The ADS server over a real gRPC connection on loopback: subscribe, ACK, a pushed drain,
//! a NACK (counted, not resent), delta refused.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::rpc::Status;
use prost::Message;
use shoal_proto::{Region, ServiceKey, Zone};
use shoal_xds::resources::ResourceType;
use shoal_xds::{Ads, Endpoint, EndpointHealth, Locality, View};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// Bound on every wait for the server (never reached when it works).
const WAIT: Duration = Duration::from_secs(10);

fn view(version: u64, healths: &[EndpointHealth]) -> Arc<View> {
    let key: ServiceKey = "prod/web/grpc".parse().unwrap();
    let eps = healths
        .iter()
        .enumerate()
        .map(|(i, h)| Endpoint {
            instance: format!("web-{i}"),
            address: format!("127.0.0.1:{}", 9100 + i).parse().unwrap(),
            region: Region::new("eu").unwrap(),
            zone: Zone::new("eu-a").unwrap(),
            weight: 100,
            health: *h,
        })
        .collect();
    Arc::new(View {
        version,
        services: [(key, eps)].into_iter().collect(),
        ..View::default()
    })
}

fn eds_request(version: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: ResourceType::Endpoint.type_url(),
        resource_names: vec!["web.grpc.prod".into()],
        version_info: version.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

fn healths(resp: &DiscoveryResponse) -> Vec<(String, i32)> {
    let cla = ClusterLoadAssignment::decode(resp.resources[0].value.as_slice()).unwrap();
    cla.endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .map(|e| match &e.host_identifier {
            Some(lb_endpoint::HostIdentifier::Endpoint(p)) => (p.hostname.clone(), e.health_status),
            _ => panic!("endpoint without address"),
        })
        .collect()
}

async fn next(rx: &mut Streaming<DiscoveryResponse>) -> DiscoveryResponse {
    tokio::time::timeout(WAIT, rx.message())
        .await
        .expect("a response within the bound")
        .expect("stream open")
        .expect("a response")
}

#[tokio::test]
async fn subscribe_ack_push_nack_over_grpc() {
    let (views, rx) = tokio::sync::watch::channel(view(1, &[EndpointHealth::Healthy; 2]));
    let local = Locality {
        region: Region::new("eu").unwrap(),
        zone: Zone::new("eu-a").unwrap(),
    };
    let ads = Ads::new(rx, local, 4);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(shoal_xds::serve(listener, ads, Default::default(), async {
        let _ = stop_rx.await;
    }));

    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (req_tx, req_rx) = mpsc::channel(8);
    req_tx.send(eds_request("", "")).await.unwrap();
    let mut responses = client
        .stream_aggregated_resources(ReceiverStream::new(req_rx))
        .await
        .unwrap()
        .into_inner();

    let healthy = HealthStatus::Healthy as i32;
    let draining = HealthStatus::Draining as i32;
    let r1 = next(&mut responses).await;
    assert_eq!(r1.version_info, "1");
    assert_eq!(
        healths(&r1),
        vec![("web-0".into(), healthy), ("web-1".into(), healthy)]
    );
    req_tx.send(eds_request("1", &r1.nonce)).await.unwrap(); // ACK

    // web-1 drains: the change is pushed without a request.
    views.send_replace(view(
        2,
        &[EndpointHealth::Healthy, EndpointHealth::Draining],
    ));
    let r2 = next(&mut responses).await;
    assert_eq!(r2.version_info, "2");
    assert_ne!(r2.nonce, r1.nonce);
    assert_eq!(
        healths(&r2),
        vec![("web-0".into(), healthy), ("web-1".into(), draining)]
    );

    // NACK r2: nothing is resent; the next change is.
    let mut nack = eds_request("1", &r2.nonce);
    nack.error_detail = Some(Status {
        code: 3,
        message: "test rejects this assignment".into(),
        details: vec![],
    });
    req_tx.send(nack).await.unwrap();
    views.send_replace(view(
        3,
        &[EndpointHealth::Unhealthy, EndpointHealth::Draining],
    ));
    let r3 = next(&mut responses).await;
    assert_eq!(
        r3.version_info, "3",
        "the response after a NACK is the next view, not r2 again"
    );

    // Delta xDS is refused with UNIMPLEMENTED.
    let delta = client
        .delta_aggregated_resources(tokio_stream::iter(vec![DeltaDiscoveryRequest::default()]))
        .await
        .expect_err("delta is not served");
    assert_eq!(delta.code(), tonic::Code::Unimplemented);

    drop(req_tx);
    stop_tx.send(()).unwrap();
    tokio::time::timeout(WAIT, server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
}

/// (priority, region, hostnames, `filter_metadata["shoal"].read_only`) of a locality.
type Served = (u32, String, Vec<String>, Option<bool>);

fn localities(resp: &DiscoveryResponse) -> Vec<Served> {
    use envoy_types::pb::google::protobuf::value::Kind;
    let cla = ClusterLoadAssignment::decode(resp.resources[0].value.as_slice()).unwrap();
    cla.endpoints
        .iter()
        .map(|l| {
            let hosts = l
                .lb_endpoints
                .iter()
                .map(|e| match &e.host_identifier {
                    Some(lb_endpoint::HostIdentifier::Endpoint(p)) => p.hostname.clone(),
                    _ => panic!("endpoint without address"),
                })
                .collect();
            let read_only = l
                .metadata
                .as_ref()
                .and_then(|m| m.filter_metadata.get(shoal_xds::resources::METADATA_KEY))
                .and_then(|s| s.fields.get("read_only"))
                .and_then(|v| match v.kind {
                    Some(Kind::BoolValue(b)) => Some(b),
                    _ => None,
                });
            let region = l.locality.clone().unwrap().region;
            (l.priority, region, hosts, read_only)
        })
        .collect()
}

/// The local region (eu) with one endpoint of `health`, plus the policy's failover regions
/// us (writable) then ap (read-only) and an endpoint of sa, which no policy names.
fn failover_view(version: u64, health: EndpointHealth) -> Arc<View> {
    let key: ServiceKey = "prod/web/grpc".parse().unwrap();
    let ep = |name: &str, region: &str, health| Endpoint {
        instance: name.into(),
        address: "127.0.0.1:9200".parse().unwrap(),
        region: Region::new(region).unwrap(),
        zone: Zone::new(format!("{region}-a")).unwrap(),
        weight: 10,
        health,
    };
    let eps = vec![
        ep("eu-1", "eu", health),
        ep("us-1", "us", EndpointHealth::Healthy),
        ep("ap-1", "ap", EndpointHealth::Healthy),
        ep("sa-1", "sa", EndpointHealth::Healthy),
    ];
    let region = |r: &str, read_only| shoal_xds::FailoverRegion {
        region: Region::new(r).unwrap(),
        read_only,
        degraded: false,
    };
    Arc::new(View {
        version,
        services: [(key.clone(), eps)].into_iter().collect(),
        failover: [(key, vec![region("us", false), region("ap", true)])]
            .into_iter()
            .collect(),
        ..View::default()
    })
}

#[tokio::test]
async fn policy_failover_regions_are_pushed_when_the_region_empties_and_withdrawn_after() {
    let (views, rx) = tokio::sync::watch::channel(failover_view(1, EndpointHealth::Healthy));
    let local = Locality {
        region: Region::new("eu").unwrap(),
        zone: Zone::new("eu-a").unwrap(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(shoal_xds::serve(
        listener,
        Ads::new(rx, local, 4),
        Default::default(),
        async {
            let _ = stop_rx.await;
        },
    ));
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (req_tx, req_rx) = mpsc::channel(8);
    req_tx.send(eds_request("", "")).await.unwrap();
    let mut responses = client
        .stream_aggregated_resources(ReceiverStream::new(req_rx))
        .await
        .unwrap()
        .into_inner();
    let r1 = next(&mut responses).await;
    assert_eq!(
        localities(&r1),
        vec![(0, "eu".into(), vec!["eu-1".into()], None)],
        "a healthy region: no failover served"
    );
    req_tx.send(eds_request("1", &r1.nonce)).await.unwrap();

    // The region's only endpoint drains: zone 0, then us (1), then ap (2, read-only); never sa.
    views.send_replace(failover_view(2, EndpointHealth::Draining));
    let r2 = next(&mut responses).await;
    assert_eq!(
        localities(&r2),
        vec![
            (0, "eu".into(), vec!["eu-1".into()], None),
            (1, "us".into(), vec!["us-1".into()], Some(false)),
            (2, "ap".into(), vec!["ap-1".into()], Some(true)),
        ]
    );
    req_tx.send(eds_request("2", &r2.nonce)).await.unwrap();

    // Healthy again: the failover localities are withdrawn in the next push.
    views.send_replace(failover_view(3, EndpointHealth::Healthy));
    let r3 = next(&mut responses).await;
    assert_eq!(r3.version_info, "3");
    assert_eq!(localities(&r3), localities(&r1));

    drop(req_tx);
    stop_tx.send(()).unwrap();
    tokio::time::timeout(WAIT, server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
}

/// The local region (eu) with `healthy` of its 10 endpoints healthy (the rest UNHEALTHY) in two
/// zones, a threshold policy at `factor` % failing over to us.
fn threshold_view(version: u64, healthy: usize, factor: u32) -> Arc<View> {
    let key: ServiceKey = "prod/web/grpc".parse().unwrap();
    let mut eps: Vec<Endpoint> = (0..10)
        .map(|i| Endpoint {
            instance: format!("eu-{i}"),
            address: format!("127.0.0.1:{}", 9300 + i).parse().unwrap(),
            region: Region::new("eu").unwrap(),
            zone: Zone::new(if i % 2 == 0 { "eu-a" } else { "eu-b" }).unwrap(),
            weight: 10,
            health: if i < healthy {
                EndpointHealth::Healthy
            } else {
                EndpointHealth::Unhealthy
            },
        })
        .collect();
    eps.push(Endpoint {
        instance: "us-1".into(),
        address: "127.0.0.1:9400".parse().unwrap(),
        region: Region::new("us").unwrap(),
        zone: Zone::new("us-a").unwrap(),
        weight: 10,
        health: EndpointHealth::Healthy,
    });
    let us = shoal_xds::FailoverRegion {
        region: Region::new("us").unwrap(),
        read_only: false,
        degraded: false,
    };
    Arc::new(View {
        version,
        services: [(key.clone(), eps)].into_iter().collect(),
        failover: [(key.clone(), vec![us])].into_iter().collect(),
        overprovisioning_factor_pct: [(key, factor)].into_iter().collect(),
    })
}

/// (overprovisioning factor, per priority: (healthy, listed) endpoints) of an assignment.
fn priority_health(resp: &DiscoveryResponse) -> (Option<u32>, Vec<(u32, usize, usize)>) {
    let cla = ClusterLoadAssignment::decode(resp.resources[0].value.as_slice()).unwrap();
    let factor = cla
        .policy
        .as_ref()
        .and_then(|p| p.overprovisioning_factor.as_ref())
        .map(|v| v.value);
    let mut per: std::collections::BTreeMap<u32, (usize, usize)> = Default::default();
    for l in &cla.endpoints {
        let e = per.entry(l.priority).or_default();
        e.1 += l.lb_endpoints.len();
        e.0 += l
            .lb_endpoints
            .iter()
            .filter(|e| e.health_status == HealthStatus::Healthy as i32)
            .count();
    }
    (
        factor,
        per.into_iter().map(|(p, (h, n))| (p, h, n)).collect(),
    )
}

#[tokio::test]
async fn a_threshold_policy_is_served_as_envoy_priorities_with_its_overprovisioning_factor() {
    let (views, rx) = tokio::sync::watch::channel(threshold_view(1, 10, 140));
    let local = Locality {
        region: Region::new("eu").unwrap(),
        zone: Zone::new("eu-a").unwrap(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(shoal_xds::serve(
        listener,
        Ads::new(rx, local, 4),
        Default::default(),
        async {
            let _ = stop_rx.await;
        },
    ));
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (req_tx, req_rx) = mpsc::channel(8);
    req_tx.send(eds_request("", "")).await.unwrap();
    let mut responses = client
        .stream_aggregated_resources(ReceiverStream::new(req_rx))
        .await
        .unwrap()
        .into_inner();
    let r1 = next(&mut responses).await;
    // Healthy: the failover region is listed anyway (Envoy spills 0 % at 100 % health), the
    // whole region is priority 0.
    assert_eq!(
        priority_health(&r1),
        (Some(140), vec![(0, 10, 10), (1, 1, 1)])
    );
    req_tx.send(eds_request("1", &r1.nonce)).await.unwrap();

    // 7 of 10 go unhealthy: still listed (Envoy needs the denominator), 3 healthy.
    views.send_replace(threshold_view(2, 3, 140));
    let r2 = next(&mut responses).await;
    let (factor, per) = priority_health(&r2);
    assert_eq!(
        (factor, per.clone()),
        (Some(140), vec![(0, 3, 10), (1, 1, 1)])
    );
    // Envoy's priority load from what was served: P0 keeps min(100, 140 x 3 / 10) = 42 %,
    // the failover region takes 58 %, as a pick of the agent would.
    let (_, healthy, listed) = per[0];
    let keep = (140 * healthy / listed).min(100);
    assert_eq!(keep, 42);
    assert_eq!(localities(&r2)[2].1, "us");
    req_tx.send(eds_request("2", &r2.nonce)).await.unwrap();

    drop(req_tx);
    stop_tx.send(()).unwrap();
    tokio::time::timeout(WAIT, server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
}
