//! Liveness and readiness of the agent process, for supervisors (Kubernetes probes, Docker
//! `HEALTHCHECK`, systemd): `GET /v1/agent/live` and `GET /v1/agent/ready` on the local socket.
//!
//! They answer different questions (REQUIREMENTS "Health": liveness failure triggers a
//! restart, readiness failure only stops traffic), and neither depends on the authority:
//!
//! - **live**: the process is serving and its mesh driver task is running. 200
//!   `{"status":"live", ...}`; 503 `{"status":"dead", "reason": ...}` only when the driver
//!   task has stopped (its command channel is closed): the agent then cannot apply records
//!   any more and a restart is the cure. An authority outage, a stale view or a failed
//!   persistence never fail liveness (invariant 6: the agent must keep serving its last view
//!   through a control-plane outage; restarting it would throw the view away).
//! - **ready**: the agent serves a view: it has been active in its region mesh at least once,
//!   or it booted from a persisted snapshot, or it runs without seeds (a one-node mesh). 200
//!   `{"status":"ready", ...}`, else 503 `{"status":"starting", "reason": ...}`. A stale view is
//!   still ready (it is served, with `stale: true`); `/v1/agent/health` is the one that turns
//!   503 on staleness or authority errors, for dashboards.
//!
//! Both bodies carry the freshness fields of every read (`snapshot_age_ms`,
//! `last_authority_contact_ms_ago`, `stale`) so a probe log shows why a view is old.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::state::Shared;

/// Why readiness is not reached yet, or `None` when the agent serves a view.
fn not_ready_reason(shared: &Shared) -> Option<&'static str> {
    let st = shared.status.lock().expect("status");
    let joined_once = st.last_peer_ms.is_some();
    let has_snapshot = st.loaded_snapshot_written.is_some();
    let alone = shared.cfg.raw.seeds.is_empty();
    (!(joined_once || has_snapshot || alone))
        .then_some("not yet joined the region mesh and no persisted snapshot loaded")
}

fn body(shared: &Shared, status: &str) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("status".into(), json!(status));
    m.insert("uptime_ms".into(), json!(shared.now_ms()));
    m.insert("boot".into(), json!(shared.boot.0));
    m.insert("snapshot_age_ms".into(), json!(shared.snapshot_age_ms()));
    m.insert(
        "last_authority_contact_ms_ago".into(),
        json!(shared.authority_age_ms()),
    );
    m.insert("stale".into(), json!(shared.is_stale()));
    m
}

/// `GET /v1/agent/live`: 200 while the process serves and its mesh driver runs, else 503.
pub async fn live(State(shared): State<Arc<Shared>>) -> Response {
    if shared.driver.is_closed() {
        let mut b = body(&shared, "dead");
        b.insert("reason".into(), json!("the mesh driver task has stopped"));
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(Value::Object(b)),
        )
            .into_response();
    }
    (
        StatusCode::OK,
        axum::Json(Value::Object(body(&shared, "live"))),
    )
        .into_response()
}

/// `GET /v1/agent/ready`: 200 once the agent serves a view (see the module docs), else 503.
pub async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    match not_ready_reason(&shared) {
        None => (
            StatusCode::OK,
            axum::Json(Value::Object(body(&shared, "ready"))),
        )
            .into_response(),
        Some(reason) => {
            let mut b = body(&shared, "starting");
            b.insert("reason".into(), json!(reason));
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(Value::Object(b)),
            )
                .into_response()
        }
    }
}
