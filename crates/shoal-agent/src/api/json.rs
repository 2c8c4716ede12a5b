//! JSON shapes shared by the read and write routes: endpoints, freshness, the index header.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use shoal_catalog::view::EndpointView;
use shoal_proto::{HealthStatus, Labels, ServiceKey};

use crate::state::{ApplyTimes, Shared};

pub(super) fn labels_json(labels: &Labels) -> Value {
    let m: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(d, v)| (d.as_str().to_owned(), Value::String(v.to_owned())))
        .collect();
    Value::Object(m)
}

/// When an endpoint's current lifecycle record was committed and applied here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordTimes {
    /// Authority wall clock at commit (Unix ms), carried in the signed record; informational.
    pub committed_at_ms: u64,
    /// This agent's wall clock (Unix ms) when it applied the record; `None` when it did not see
    /// the record applied (installed from a snapshot) or the apply-time map was full.
    pub applied_at_ms: Option<u64>,
}

impl RecordTimes {
    /// The times of `entry`'s current lifecycle record under `key`.
    pub fn of(key: &ServiceKey, entry: &shoal_catalog::Entry, times: &ApplyTimes) -> Self {
        let r = &entry.lifecycle().record;
        Self {
            committed_at_ms: r.committed_at_ms,
            applied_at_ms: times.applied_at_ms(key, &r.instance, r.generation, r.revision),
        }
    }
}

/// JSON of one endpoint (the API's shape, documented in openapi.json).
pub fn endpoint_json(e: &EndpointView, t: RecordTimes) -> Value {
    json!({
        "instance": e.instance.as_str(),
        "generation": e.generation.0,
        "address": e.endpoint.address.to_string(),
        "region": e.region.as_str(),
        "zone": e.endpoint.zone.as_str(),
        "node": e.node.as_str(),
        "version": e.endpoint.version.as_str(),
        "weight": e.endpoint.weight,
        "labels": labels_json(&e.endpoint.labels),
        "state": e.state.as_str(),
        "revision": e.revision.0,
        "committed_at_ms": t.committed_at_ms,
        "applied_at_ms": t.applied_at_ms,
        "reason": format!("{:?}", e.reason),
        "source": format!("{:?}", e.source),
        "health": e.health.map(|h| match h { HealthStatus::Passing => "passing", HealthStatus::Failing => "failing" }),
        "owner_down": e.owner_down,
        "ejected": e.ejected,
        "routable": e.routable,
    })
}

/// The freshness fields of every answer; `index` is the index of what the route follows
/// (a service, the member list, or the whole view: ADR 0011).
pub(super) fn freshness(shared: &Shared, index: u64) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("index".into(), json!(index));
    m.insert("snapshot_age_ms".into(), json!(shared.snapshot_age_ms()));
    m.insert(
        "last_authority_contact_ms_ago".into(),
        json!(shared.authority_age_ms()),
    );
    m.insert("stale".into(), json!(shared.is_stale()));
    m
}

/// A JSON answer with `X-Shoal-Index: index` (and `X-Shoal-Stale` when stale).
pub(super) fn with_index(shared: &Shared, index: u64, status: StatusCode, body: Value) -> Response {
    let mut r = (status, axum::Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&index.to_string()) {
        r.headers_mut().insert("x-shoal-index", v);
    }
    if shared.is_stale() {
        r.headers_mut()
            .insert("x-shoal-stale", HeaderValue::from_static("true"));
    }
    r
}
