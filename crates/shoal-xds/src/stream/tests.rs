//! The stream's protocol rules, one scenario per test: requests in, exact responses out.

use envoy_types::pb::envoy::config::core::v3::{Locality as PbLocality, Node};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::google::rpc::Status;
use prost::Message;
use shoal_proto::{Region, ServiceKey};

use super::*;
use crate::model::{Endpoint, EndpointHealth};

fn local() -> Locality {
    Locality {
        region: Region::new("eu").unwrap(),
        zone: Zone::new("eu-a").unwrap(),
    }
}

fn view(version: u64, web: &[(&str, &str, EndpointHealth)]) -> View {
    let key: ServiceKey = "prod/web/grpc".parse().unwrap();
    let other: ServiceKey = "prod/db/tcp".parse().unwrap();
    let eps = web
        .iter()
        .enumerate()
        .map(|(i, (inst, zone, h))| Endpoint {
            instance: inst.to_string(),
            address: format!("127.0.0.1:{}", 9000 + i).parse().unwrap(),
            region: Region::new("eu").unwrap(),
            zone: Zone::new(*zone).unwrap(),
            weight: 100,
            health: *h,
        })
        .collect();
    View {
        version,
        services: [(key, eps), (other, vec![])].into_iter().collect(),
        ..View::default()
    }
}

fn req(ty: ResourceType, names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: ty.type_url(),
        resource_names: names.iter().map(|s| s.to_string()).collect(),
        version_info: version.to_string(),
        response_nonce: nonce.to_string(),
        ..Default::default()
    }
}

fn healthy_hosts(resp: &DiscoveryResponse) -> Vec<(u32, String)> {
    let cla = ClusterLoadAssignment::decode(resp.resources[0].value.as_slice()).unwrap();
    cla.endpoints
        .iter()
        .flat_map(|l| {
            l.lb_endpoints.iter().filter_map(move |e| {
                let h = e.health_status
                    == envoy_types::pb::envoy::config::core::v3::HealthStatus::Healthy as i32;
                match &e.host_identifier {
                    Some(envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(p)) if h => {
                        Some((l.priority, p.hostname.clone()))
                    }
                    _ => None,
                }
            })
        })
        .collect()
}

use EndpointHealth::*;

#[test]
fn subscribe_ack_then_a_drain_is_pushed_with_a_new_version_and_nonce() {
    let mut s = AdsStream::new(local());
    let v1 = view(7, &[("a-1", "eu-a", Healthy), ("a-2", "eu-a", Healthy)]);
    let eds = ResourceType::Endpoint;
    let out = s
        .handle_request(&req(eds, &["web.grpc.prod"], "", ""), &v1)
        .unwrap();
    assert_eq!(out.kind, RequestKind::Subscribe);
    let r1 = out.response.expect("a subscription is answered");
    assert_eq!((r1.version_info.as_str(), r1.nonce.as_str()), ("7", "1"));
    assert_eq!(r1.type_url, eds.type_url());
    assert_eq!(
        healthy_hosts(&r1),
        vec![(0, "a-1".into()), (0, "a-2".into())]
    );

    // ACK: remembered, nothing sent.
    let ack = s
        .handle_request(&req(eds, &["web.grpc.prod"], "7", "1"), &v1)
        .unwrap();
    assert_eq!((ack.kind, ack.response), (RequestKind::Ack, None));
    assert_eq!(s.acked_version(eds), Some("7"));

    // A view change that does not touch the subscribed resource: nothing sent.
    let mut v2 = v1.clone();
    v2.version = 8;
    v2.services
        .insert("prod/cache/tcp".parse().unwrap(), Vec::new());
    assert!(s.handle_view(&v2).is_empty());

    // a-2 drains: pushed, new version and nonce, a-2 no longer HEALTHY.
    let v3 = view(9, &[("a-1", "eu-a", Healthy), ("a-2", "eu-a", Draining)]);
    let pushed = s.handle_view(&v3);
    assert_eq!(pushed.len(), 1);
    assert_eq!(
        (pushed[0].version_info.as_str(), pushed[0].nonce.as_str()),
        ("9", "2")
    );
    assert_eq!(healthy_hosts(&pushed[0]), vec![(0, "a-1".into())]);
}

#[test]
fn a_nack_is_reported_and_the_rejected_content_is_not_resent() {
    let mut s = AdsStream::new(local());
    let v1 = view(3, &[("a-1", "eu-a", Healthy)]);
    let cds = ResourceType::Cluster;
    let r = s.handle_request(&req(cds, &[], "", ""), &v1).unwrap();
    let r = r.response.unwrap();
    assert_eq!(
        r.resources.len(),
        2,
        "empty CDS names = wildcard: both services"
    );
    let mut nack = req(cds, &[], "", &r.nonce);
    nack.error_detail = Some(Status {
        code: 3,
        message: "bad cluster".into(),
        details: vec![],
    });
    let out = s.handle_request(&nack, &v1).unwrap();
    assert_eq!(
        out.kind,
        RequestKind::Nack {
            message: "bad cluster".into()
        }
    );
    assert_eq!(out.response, None, "the same content is not sent again");
    assert_eq!(s.acked_version(cds), None);
    // The same view again: still nothing; a changed one: sent.
    assert!(s.handle_view(&v1).is_empty());
    let mut v2 = view(4, &[]);
    v2.services.insert("prod/new/grpc".parse().unwrap(), vec![]);
    assert_eq!(s.handle_view(&v2).len(), 1);
}

#[test]
fn stale_nonces_are_ignored_and_name_changes_are_answered() {
    let mut s = AdsStream::new(local());
    let v = view(5, &[("a-1", "eu-a", Healthy)]);
    let lds = ResourceType::Listener;
    let r1 = s
        .handle_request(&req(lds, &["web.grpc.prod"], "", ""), &v)
        .unwrap()
        .response
        .unwrap();
    let r2 = s.handle_view(&view(6, &[]));
    assert!(r2.is_empty(), "listeners do not change with endpoints");
    // The client subscribes to a second listener, acking r1.
    let out = s
        .handle_request(
            &req(lds, &["web.grpc.prod", "db.tcp.prod"], "5", &r1.nonce),
            &v,
        )
        .unwrap();
    assert_eq!(out.kind, RequestKind::Ack);
    let r3 = out.response.expect("a name change is answered");
    assert_eq!(r3.resources.len(), 2);
    // A late request carrying r1's nonce (older than r3's): ignored.
    let stale = s
        .handle_request(&req(lds, &["nope.x.y"], "5", &r1.nonce), &v)
        .unwrap();
    assert_eq!((stale.kind, stale.response), (RequestKind::Stale, None));
    // An unknown name is simply absent (for LDS the client learns it does not exist).
    let out = s
        .handle_request(&req(lds, &["nope.x.y"], "5", &r3.nonce), &v)
        .unwrap();
    assert!(out.response.unwrap().resources.is_empty());
}

#[test]
fn the_callers_zone_comes_from_its_node_locality() {
    let mut s = AdsStream::new(local());
    let v = view(1, &[("a-1", "eu-a", Healthy), ("b-1", "eu-b", Healthy)]);
    let mut r = req(ResourceType::Endpoint, &["web.grpc.prod"], "", "");
    r.node = Some(Node {
        id: "client-1".into(),
        locality: Some(PbLocality {
            region: "eu".into(),
            zone: "eu-b".into(),
            sub_zone: String::new(),
        }),
        ..Default::default()
    });
    let resp = s.handle_request(&r, &v).unwrap().response.unwrap();
    assert_eq!(s.node_id(), Some("client-1"));
    assert_eq!(
        healthy_hosts(&resp),
        vec![(0, "b-1".into()), (1, "a-1".into())]
    );
}

#[test]
fn unknown_types_and_oversized_requests_are_refused_without_state_change() {
    let mut s = AdsStream::new(local());
    let v = view(1, &[]);
    let mut r = req(ResourceType::Endpoint, &[], "", "");
    r.type_url = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret".into();
    assert!(matches!(
        s.handle_request(&r, &v),
        Err(RequestError::UnknownType(_))
    ));
    let many: Vec<String> = (0..=MAX_RESOURCE_NAMES)
        .map(|i| format!("s{i}.p.n"))
        .collect();
    let mut r = req(ResourceType::Endpoint, &[], "", "");
    r.resource_names = many;
    assert_eq!(
        s.handle_request(&r, &v),
        Err(RequestError::TooManyNames(MAX_RESOURCE_NAMES + 1))
    );
    assert!(s
        .handle_view(&view(2, &[("a-1", "eu-a", Healthy)]))
        .is_empty());
}
