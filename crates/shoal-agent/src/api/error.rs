//! API errors: the JSON error shape, refusals (403, counted and logged once), write counting.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use metrics::counter;
use serde_json::{json, Value};
use shoal_proto::rpc::LocalCaller;
use shoal_proto::ServiceKey;

use crate::access::Denied;
use crate::client::CallError;
use crate::state::Shared;

pub(super) type ApiResult = Result<Response, ApiError>;

/// An API error: status + JSON body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: Value,
}

impl ApiError {
    pub(crate) fn bad(reason: &'static str, message: impl Into<String>) -> Self {
        crate::metrics::rejected("api", reason);
        Self {
            status: StatusCode::BAD_REQUEST,
            body: json!({"error": message.into(), "reason": reason}),
        }
    }
    pub(crate) fn new(status: StatusCode, body: Value) -> Self {
        Self { status, body }
    }
    /// Adds `field` to the JSON body.
    pub(crate) fn insert(&mut self, field: &str, value: Value) {
        if let Some(o) = self.body.as_object_mut() {
            o.insert(field.to_owned(), value);
        }
    }
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }
    /// The JSON body.
    pub fn body(&self) -> &Value {
        &self.body
    }
}

/// A local refusal: counted, logged once per (caller, route, reason), 403 with the reason.
pub(super) fn forbidden(
    shared: &Shared,
    who: &LocalCaller,
    route: &'static str,
    d: Denied,
) -> ApiError {
    refused(shared, who, route, StatusCode::FORBIDDEN, d)
}

/// A refusal answered with `status` (403, 429, 503): counted in
/// `shoal_api_refusals_total{route,reason}`, logged once per (caller, route, reason).
pub(super) fn refused(
    shared: &Shared,
    who: &LocalCaller,
    route: &'static str,
    status: StatusCode,
    d: Denied,
) -> ApiError {
    counter!("shoal_api_refusals_total", "route" => route, "reason" => d.code).increment(1);
    shared.refusals.log(who, route, &d);
    ApiError::new(
        status,
        json!({"error": d.reason, "reason": d.code, "uid": who.uid, "gid": who.gid}),
    )
}

/// Counts one write in `shoal_api_writes_total{route,result}`.
pub(super) fn count_write<T>(route: &'static str, r: &Result<T, ApiError>) {
    let result = match r {
        Ok(_) => "accepted",
        Err(e) if e.status == StatusCode::FORBIDDEN => "refused",
        Err(e) if e.status == StatusCode::CONFLICT => "failed",
        Err(e) if e.status.is_client_error() => "invalid",
        Err(_) => "failed",
    };
    counter!("shoal_api_writes_total", "route" => route, "result" => result).increment(1);
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}

impl From<CallError> for ApiError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Unavailable(m) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "authority unavailable", "detail": m}),
            ),
            // The authority judged the request itself malformed: bad input, 400 (QA: a
            // `lease_ms` of 0 was a 409 "refused"). `code` and `detail` are kept for callers
            // that read them; `reason` is the documented field.
            CallError::Refused { code, reason } if code == "invalid_request" => {
                crate::metrics::rejected("api", "invalid_request");
                Self::new(
                    StatusCode::BAD_REQUEST,
                    json!({"error": format!("invalid request: {reason}"), "reason": "invalid_request", "code": code, "detail": reason}),
                )
            }
            CallError::Refused { code, reason } => Self::new(
                StatusCode::CONFLICT,
                json!({"error": "refused", "reason": code, "code": code, "detail": reason}),
            ),
            CallError::Invalid(m) => Self::new(
                StatusCode::BAD_REQUEST,
                json!({"error": "invalid request", "reason": "invalid_request", "detail": m}),
            ),
        }
    }
}

/// Gives axum's bodiless `405 Method Not Allowed` (a known path, another method) a JSON body
/// naming the allowed methods; axum's `Allow` header is kept.
pub(super) async fn method_not_allowed_json(resp: Response) -> Response {
    if resp.status() != StatusCode::METHOD_NOT_ALLOWED {
        return resp;
    }
    crate::metrics::rejected("api", "method_not_allowed");
    let allow: Vec<String> = resp
        .headers()
        .get(axum::http::header::ALLOW)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(',')
                .map(|m| m.trim().to_owned())
                .filter(|m| !m.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let (mut parts, _) = resp.into_parts();
    let body = json!({
        "error": format!("method not allowed here; allowed: {}", allow.join(", ")),
        "reason": "method_not_allowed",
        "allow": allow,
    });
    parts.headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body.to_string()))
}

pub(super) async fn not_found() -> Response {
    crate::metrics::rejected("api", "not_found");
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"error": "no such endpoint; see /v1/openapi.json"})),
    )
        .into_response()
}

pub(super) fn service_key(ns: &str, svc: &str, port: &str) -> Result<ServiceKey, ApiError> {
    ServiceKey::new(ns, svc, port)
        .map_err(|e| ApiError::bad("bad_service_key", format!("invalid service key: {e}")))
}
