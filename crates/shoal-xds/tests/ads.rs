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
use shoal_xds::{Ads, Endpoint, EndpointHealth, Locality, NoFailover, View};
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
    let ads = Ads::new(rx, local, Arc::new(NoFailover), 4);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(shoal_xds::serve(listener, ads, async {
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
