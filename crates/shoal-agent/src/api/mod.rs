//! The local API: HTTP/1.1 + JSON over a unix socket. `docs/api/openapi.json` is the
//! reference (served at `/v1/openapi.json`).
//!
//! Read paths build views under the mesh read lock and never wait on the authority. Bad input
//! (malformed JSON, unknown fields, invalid service keys or parameters) gets a 400 with
//! `{"error": ..., "reason": ...}` and is counted in `shoal_rejected_inputs_total{source="api"}`;
//! a body over `[api] max_body_bytes` gets 413, one slower than `body_read_timeout_ms` 408.
//!
//! Every request carries the caller's [`LocalCaller`](shoal_proto::rpc::LocalCaller) (peer credentials, see
//! [`crate::listener`]); writes are authorised by [`crate::access`] and refused with 403
//! `{"error": <sentence>, "reason": <code>}` unless granted. Every write, accepted or refused,
//! is counted in `shoal_api_writes_total{route,result}` (`result`: `accepted`, `refused` (403),
//! `invalid` (other 4xx), `failed` (authority refused or unavailable)); local refusals also in
//! `shoal_api_refusals_total{route,reason}` and logged once per caller, route and reason.
//! Writes that reach the authority name the caller in its audit log (`on_behalf_of`).

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;

use crate::state::Shared;

mod block;
mod error;
mod index;
mod json;
mod query;
mod reads;
mod register;
mod rendered;
mod rng;
mod writes;

pub(crate) use block::block_on;
pub use error::ApiError;
pub use index::{ViewIndex, Watched, MAX_WATCHED_SERVICES};
pub use json::{endpoint_json, RecordTimes};
pub(crate) use query::percent_decode;
pub(crate) use reads::service_view;
pub use register::{
    canonical_endpoint_address, endpoint_address_problem, ensure_node_key_bound, register_instance,
    RegisterBody,
};
pub use writes::transition;

use block::*;
use error::*;
use json::*;
use query::*;
use reads::*;
use register::*;
use writes::*;

/// Default largest request body accepted (`[api] max_body_bytes`).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest local ejection a report may ask for, ms.
pub const MAX_EJECT_MS: u64 = 10 * 60 * 1000;
/// The OpenAPI document.
pub const OPENAPI: &str = include_str!("../../../../docs/api/openapi.json");

/// The API router.
pub fn router(shared: Arc<Shared>) -> Router {
    let svc = "/v1/services/{ns}/{svc}/{port}";
    let api = Router::new()
        .route("/v1/services", get(services))
        .route(&format!("{svc}/endpoints"), get(endpoints))
        .route(&format!("{svc}/pick"), get(pick))
        .route(&format!("{svc}/report"), post(report))
        .route(&format!("{svc}/register"), post(register))
        .route(
            &format!("{svc}/instances/{{instance}}/{{action}}"),
            post(lifecycle),
        )
        .route("/v1/agent/self", get(agent_self))
        .route("/v1/agent/members", get(members))
        .route("/v1/agent/health", get(health))
        .route("/v1/agent/live", get(crate::health_endpoints::live))
        .route("/v1/agent/ready", get(crate::health_endpoints::ready))
        .route("/v1/failover", get(crate::failover::status))
        .route("/v1/openapi.json", get(openapi))
        .fallback(not_found)
        .with_state(shared);
    with_json_405(api)
}

/// `router` with its 405s given a JSON body ([`method_not_allowed_json`]). Wrapped around the
/// whole router, not layered on its routes: axum adds the `Allow` header outside a route's
/// layers, where the body is written from.
fn with_json_405(router: Router) -> Router {
    Router::new()
        .fallback_service(router)
        .layer(axum::middleware::map_response(method_not_allowed_json))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, Request, StatusCode};

    #[tokio::test]
    async fn a_405_has_a_json_body_naming_the_allowed_methods_and_the_allow_header() {
        let inner = Router::new()
            .route("/x", get(|| async { "x" }))
            .route("/y", post(|| async { "y" }));
        let app = with_json_405(inner);
        for (method, path, allow) in [("DELETE", "/x", "GET,HEAD"), ("GET", "/y", "POST")] {
            let req = Request::builder()
                .method(method)
                .uri(path)
                .body(axum::body::Body::empty())
                .unwrap();
            let resp = tower_service::Service::call(&mut app.clone(), req)
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
            assert_eq!(resp.headers()[header::ALLOW], allow);
            assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
            let body = axum::body::to_bytes(resp.into_body(), 4096).await.unwrap();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["reason"], "method_not_allowed", "{v}");
            let want: Vec<&str> = allow.split(',').collect();
            assert_eq!(v["allow"], serde_json::json!(want), "{v}");
            assert!(
                v["error"].as_str().unwrap().contains(&want.join(", ")),
                "{v}"
            );
        }
        // Other answers pass through untouched.
        let req = Request::builder()
            .uri("/x")
            .body(axum::body::Body::empty())
            .unwrap();
        let resp = tower_service::Service::call(&mut app.clone(), req)
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
}
