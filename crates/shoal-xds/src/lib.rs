//! # shoal-xds
//!
//! An xDS control plane inside the agent: an aggregated discovery service (ADS, state of the
//! world) that serves the agent's current view of its region to Envoy and to proxyless gRPC
//! (`xds:///<service>.<port>.<namespace>` targets) as four resource types per service key:
//!
//! | type | resource |
//! | --- | --- |
//! | Listener | an `api_listener` with an `HttpConnectionManager` taking routes from RDS over ADS |
//! | RouteConfiguration | one virtual host, default route to the cluster |
//! | Cluster | type EDS, endpoints over ADS, round robin |
//! | ClusterLoadAssignment | endpoints by locality: caller's zone priority 0, rest of the region 1, then, while the region has no healthy endpoint, the policy's failover regions in order (read-only / degraded in `filter_metadata["shoal"]`); only routable endpoints `HEALTHY`, DRAINING ones `DRAINING` |
//!
//! Modules: [`model`] (the input [`View`] with its policy failover regions, resource naming), [`resources`]
//! (protobuf resources from a view), [`stream`] (one ADS stream's protocol rules without IO:
//! versions, nonces, ACK/NACK), [`server`] (the tonic service and `[xds]` config), [`metrics`].
//!
//! ```
//! use std::sync::Arc;
//! use shoal_xds::{Ads, Locality, View};
//!
//! let local = Locality { region: "eu".parse().unwrap(), zone: "eu-a".parse().unwrap() };
//! let (views, rx) = tokio::sync::watch::channel(Arc::new(View::default()));
//! let ads = Ads::new(rx, local, 16);
//! // tonic::transport::Server::builder().add_service(ads.into_service()) ...; then publish:
//! views.send_replace(Arc::new(View { version: 2, ..View::default() }));
//! # drop(ads);
//! ```
//!
//! Naming, behaviour and how to point a gRPC client at it: `docs/api/xds.md`; design:
//! `docs/adr/0014-xds.md`.

pub mod conn;
pub mod metrics;
pub mod model;
pub mod resources;
pub mod server;
pub mod stream;

pub use conn::ConnLimits;
pub use model::{
    parse_resource_name, resource_name, Endpoint, EndpointHealth, FailoverRegion, Locality, View,
};
pub use server::{serve, Ads, XdsConfig, XdsConfigError};
