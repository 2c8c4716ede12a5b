//! An ADS stream whose client sends bytes that are not a `DiscoveryRequest`: the stream ends
//! with `INVALID_ARGUMENT` naming the cause (it used to end with no error status, as if the
//! server had finished), the refusal is counted, and the server keeps serving other streams.
//! Real gRPC over loopback; every wait is bounded.

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use prost::bytes::BufMut;
use prost::Message;
use shoal_xds::resources::ResourceType;
use shoal_xds::ConnLimits;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Code, Status};

/// Bound on every wait for the server (never reached when it works).
const WAIT: Duration = Duration::from_secs(10);
const UNDECODABLE: &str = "shoal_xds_requests_refused_total{reason=\"undecodable\"}";
const ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

mod support;
use support::{counter, start};

/// Sends each message's bytes as they are (a gRPC frame around arbitrary bytes) and decodes
/// responses as `DiscoveryResponse`.
#[derive(Clone, Copy)]
struct RawRequests;

impl Encoder for RawRequests {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawRequests {
    type Item = DiscoveryResponse;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<DiscoveryResponse>, Status> {
        DiscoveryResponse::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

impl Codec for RawRequests {
    type Encode = Vec<u8>;
    type Decode = DiscoveryResponse;
    type Encoder = Self;
    type Decoder = Self;
    fn encoder(&mut self) -> Self {
        *self
    }
    fn decoder(&mut self) -> Self {
        *self
    }
}

/// Opens an ADS stream that sends `frames` as raw messages; the request side stays open while
/// the returned sender lives, so only the server can end the call.
async fn open(
    addr: SocketAddr,
    frames: Vec<Vec<u8>>,
) -> (tonic::Streaming<DiscoveryResponse>, mpsc::Sender<Vec<u8>>) {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let (tx, rx) = mpsc::channel(8);
    for f in frames {
        tx.send(f).await.unwrap();
    }
    let call = grpc.streaming(
        tonic::Request::new(ReceiverStream::new(rx)),
        PathAndQuery::from_static(ADS_PATH),
        RawRequests,
    );
    let responses = tokio::time::timeout(WAIT, call)
        .await
        .expect("response headers within the bound")
        .expect("the call is accepted")
        .into_inner();
    (responses, tx)
}

/// The stream's next result; a stream that ends without an error status is `Status::ok`.
async fn next(
    responses: &mut tonic::Streaming<DiscoveryResponse>,
) -> Result<DiscoveryResponse, Status> {
    match tokio::time::timeout(WAIT, responses.message())
        .await
        .expect("the server answers within the bound")?
    {
        Some(r) => Ok(r),
        None => Err(Status::ok("the stream ended without an error status")),
    }
}

fn eds_subscribe() -> Vec<u8> {
    DiscoveryRequest {
        type_url: ResourceType::Endpoint.type_url(),
        resource_names: vec!["web.grpc.prod".into()],
        ..Default::default()
    }
    .encode_to_vec()
}

#[tokio::test]
async fn an_undecodable_request_ends_the_stream_invalid_argument_and_is_counted() {
    let addr = start(ConnLimits::default(), 8).await;
    let before = counter(UNDECODABLE);

    // Field 1 (version_info, a string) with bytes that are not UTF-8; then a truncated varint.
    for (what, bad) in [
        ("invalid UTF-8", vec![0x0a, 0x02, 0xff, 0xfe]),
        ("wrong wire type", vec![0x08, 0xff, 0x01]),
    ] {
        let (mut responses, _tx) = open(addr, vec![bad]).await;
        let status = next(&mut responses)
            .await
            .expect_err("an undecodable request is refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().contains("could not be decoded"),
            "{what}: {}",
            status.message()
        );
    }
    // A valid subscription, then garbage: the subscription is answered, then the refusal.
    let (mut responses, _tx) = open(addr, vec![eds_subscribe(), vec![0x0a, 0x01, 0xff]]).await;
    let r = next(&mut responses)
        .await
        .expect("the subscription's response");
    assert_eq!(r.type_url, ResourceType::Endpoint.type_url());
    let status = next(&mut responses).await.expect_err("then the refusal");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(counter(UNDECODABLE) - before, 3);

    // The server still serves a well-formed stream.
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(1);
    tx.send(DiscoveryRequest::decode(eds_subscribe().as_slice()).unwrap())
        .await
        .unwrap();
    let mut responses = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let r = tokio::time::timeout(WAIT, responses.message())
        .await
        .expect("a response within the bound")
        .unwrap()
        .expect("a response");
    assert_eq!(r.type_url, ResourceType::Endpoint.type_url());
}
