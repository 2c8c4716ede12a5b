//! Other writes: failure reports (local ejection), lifecycle transitions, request bodies, publishing
//! committed records to the mesh.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use metrics::counter;
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_catalog::view::{self};
use shoal_mesh::Command;
use shoal_proto::rpc::{AuthorityOk, AuthorityRequestBody, LocalCaller};
use shoal_proto::{InstanceId, LifecycleState, ServiceKey, TransitionReason};

use super::*;
use crate::access::Action;
use crate::client::{self};
use crate::state::{DriverCmd, Shared, MAX_EJECTIONS};

/// Reads a request body within `[api] max_body_bytes` and `body_read_timeout_ms`.
pub(super) async fn read_body(shared: &Shared, body: Body) -> Result<Bytes, ApiError> {
    let max = shared.cfg.raw.api.max_body_bytes;
    let timeout = Duration::from_millis(shared.cfg.raw.api.body_read_timeout_ms);
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, max)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(_)) => {
            crate::metrics::rejected("api", "body_too_large");
            Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": format!("body exceeds {max} bytes (or was cut off)"), "reason": "body_too_large"}),
            ))
        }
        Err(_) => {
            crate::metrics::rejected("api", "body_timeout");
            Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                json!({"error": format!("body not received within {} ms", timeout.as_millis()), "reason": "body_timeout"}),
            ))
        }
    }
}

pub(super) async fn read_json<T: serde::de::DeserializeOwned>(
    shared: &Shared,
    body: Body,
) -> Result<T, ApiError> {
    let bytes = read_body(shared, body).await?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad("bad_json", format!("invalid JSON body: {e}")))
}

/// `POST .../report` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReportBody {
    instance: String,
    #[serde(default)]
    generation: Option<u64>,
    /// `connect_refused`, `timeout`, `http_5xx` or `ok`.
    outcome: String,
    #[serde(default)]
    eject_ms: Option<u64>,
}

pub(super) async fn report(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<LocalCaller>,
    Path((ns, svc, port)): Path<(String, String, String)>,
    body: Body,
) -> ApiResult {
    let r = report_inner(&shared, &who, &ns, &svc, &port, body).await;
    count_write("report", &r);
    r
}

pub(super) async fn report_inner(
    shared: &Arc<Shared>,
    who: &LocalCaller,
    ns: &str,
    svc: &str,
    port: &str,
    body: Body,
) -> ApiResult {
    let shared = shared.clone();
    let key = service_key(ns, svc, port)?;
    shared
        .cfg
        .access
        .check(who, Action::Report, &key)
        .map_err(|d| forbidden(&shared, who, "report", d))?;
    let b: ReportBody = read_json(&shared, body).await?;
    let instance = InstanceId::new(b.instance)
        .map_err(|e| ApiError::bad("bad_instance", format!("invalid instance id: {e}")))?;
    let failed = match b.outcome.as_str() {
        "connect_refused" | "timeout" | "http_5xx" => true,
        "ok" => false,
        other => {
            return Err(ApiError::bad(
                "bad_outcome",
                format!("unknown outcome `{other}` (connect_refused, timeout, http_5xx, ok)"),
            ))
        }
    };
    let now = shared.now_ms();
    // What the view says about the instance right now.
    let current = {
        let mesh = shared.mesh.read().expect("mesh lock");
        mesh.catalog().entry(&key, &instance).map(|e| {
            let life = &e.lifecycle().record;
            let routable = view::is_routable(e, &mesh.liveness());
            (life.generation, life.state, routable)
        })
    };
    let Some((generation, state, routable)) = current else {
        counter!("shoal_requests_to_removed_endpoints_total").increment(1);
        if failed {
            counter!("shoal_stale_endpoint_failures_total").increment(1);
        }
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            json!({"error": "unknown instance", "reason": "unknown_instance", "instance": instance.as_str()}),
        ));
    };
    // Only the generation the catalog holds can be ejected: any other would take a slot of
    // the node-wide ejection table and change no routing (QA: a caller filled the table with
    // made-up generations and so disabled every other service's reports).
    if let Some(named) = b.generation.filter(|g| *g != generation.0) {
        if named < generation.0 {
            // A call to a replaced process.
            counter!("shoal_requests_to_removed_endpoints_total").increment(1);
            if failed {
                counter!("shoal_stale_endpoint_failures_total").increment(1);
            }
        }
        crate::metrics::rejected("api", "generation_mismatch");
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            json!({
                "error": format!(
                    "instance `{instance}` is at generation {} here, not {named}: only the current generation can be reported",
                    generation.0
                ),
                "reason": "generation_mismatch",
                "instance": instance.as_str(),
                "generation": generation.0,
            }),
        ));
    }
    if !routable || crate::driver::is_withdrawn(state) {
        counter!("shoal_requests_to_removed_endpoints_total").increment(1);
        if failed {
            counter!("shoal_stale_endpoint_failures_total").increment(1);
        }
    }
    let mut ejected_until = None;
    if failed {
        let ms = b
            .eject_ms
            .unwrap_or(shared.cfg.raw.api.eject_ms)
            .min(MAX_EJECT_MS);
        let mut ej = shared.ejections.lock().expect("ejections");
        if ej.len() >= MAX_EJECTIONS && !ej.contains_key(&(instance.clone(), generation)) {
            crate::metrics::rejected("api", "ejections_full");
        } else {
            ej.insert((instance.clone(), generation), now + ms);
            // Published before the index bump below, so a woken watcher sees it.
            shared.publish_ejections(&ej);
            ejected_until = Some(ms);
            counter!("shoal_local_ejections_total", "outcome" => "ejected").increment(1);
        }
    }
    shared.index.bump_services([&key]);
    Ok(with_index(
        &shared,
        shared.view_index(),
        StatusCode::OK,
        json!({"instance": instance.as_str(), "generation": generation.0, "ejected_for_ms": ejected_until, "scope": "local"}),
    ))
}

pub(super) async fn publish(
    shared: &Arc<Shared>,
    ok: AuthorityOk,
) -> Vec<Arc<shoal_proto::SignedLifecycle>> {
    let AuthorityOk::Committed { records } = ok else {
        return Vec::new();
    };
    let lifecycle: Vec<_> = records.into_iter().map(Arc::new).collect();
    let (done, applied) = tokio::sync::oneshot::channel();
    let cmd = Command::Publish {
        lifecycle: lifecycle.clone(),
    };
    if shared
        .driver
        .send(DriverCmd::MeshAck(cmd, done))
        .await
        .is_ok()
    {
        // Read-your-writes: the caller's next read sees the records.
        let _ = applied.await;
    }
    lifecycle
}

/// Requests a lifecycle transition of a local instance (`ready`, `drain`, `deregister`) for
/// `who` (`None`: the agent itself, e.g. READY after probes passed).
///
/// # Errors
/// [`ApiError`]: refused by the local policy, unknown / not-local instance, unavailable or
/// refusing authority.
pub async fn transition(
    shared: &Arc<Shared>,
    key: &ServiceKey,
    instance: &InstanceId,
    action: &str,
    who: Option<&LocalCaller>,
) -> Result<Value, ApiError> {
    if let Some(who) = who {
        let route = route_of(action);
        let policy = &shared.cfg.access;
        if !policy.allows(who, Action::ChangeOwn, key)
            && !policy.allows(who, Action::ChangeOthers, key)
        {
            let d = policy.check(who, Action::ChangeOwn, key).unwrap_err();
            return Err(forbidden(shared, who, route, d));
        }
        check_owner(shared, who, key, instance, Action::ChangeOwn, route)?;
    }
    let current = {
        let mesh = shared.mesh.read().expect("mesh lock");
        mesh.catalog()
            .entry(key, instance)
            .map(|e| e.lifecycle().record.clone())
    };
    let Some(rec) = current else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            json!({"error": "unknown instance", "instance": instance.as_str()}),
        ));
    };
    if rec.owner != shared.cfg.node_id {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            json!({"error": "instance is not on this node", "owner": rec.owner.as_str()}),
        ));
    }
    let (to, reason) = match action {
        "ready" if rec.state == LifecycleState::Draining => {
            (LifecycleState::Ready, TransitionReason::DrainCancelled)
        }
        "ready" => (LifecycleState::Ready, TransitionReason::ReadinessPassed),
        "drain" => (LifecycleState::Draining, TransitionReason::DrainRequested),
        "deregister" => (LifecycleState::Expired, TransitionReason::Deregistered),
        other => {
            return Err(ApiError::bad(
                "bad_action",
                format!("unknown action `{other}` (ready, drain, deregister)"),
            ))
        }
    };
    let body = AuthorityRequestBody::Transition {
        key: key.clone(),
        instance: instance.clone(),
        generation: rec.generation,
        to,
        reason,
    };
    let records = publish(shared, client::call_for(shared, body, who.cloned()).await?).await;
    if to == LifecycleState::Expired {
        crate::agent::stop_probes(shared, key, instance);
        if let Err(e) = shared.owners.remove(key, instance.as_str()) {
            tracing::error!(%key, %instance, error = %e, "instance owner removal not persisted");
        }
    }
    Ok(json!({
        "service": key.to_string(),
        "instance": instance.as_str(),
        "generation": rec.generation.0,
        "state": to.as_str(),
        "revision": records.last().map(|r| r.record.revision.0),
    }))
}

/// The metric route label of a lifecycle action.
pub(super) fn route_of(action: &str) -> &'static str {
    match action {
        "ready" => "ready",
        "drain" => "drain",
        "deregister" => "deregister",
        _ => "lifecycle",
    }
}

pub(super) async fn lifecycle(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<LocalCaller>,
    Path((ns, svc, port, instance, action)): Path<(String, String, String, String, String)>,
    body: Body,
) -> ApiResult {
    let r = async {
        let key = service_key(&ns, &svc, &port)?;
        let instance = InstanceId::new(instance)
            .map_err(|e| ApiError::bad("bad_instance", format!("invalid instance id: {e}")))?;
        if route_of(&action) == "lifecycle" {
            return Err(ApiError::bad(
                "bad_action",
                format!("unknown action `{action}` (ready, drain, deregister)"),
            ));
        }
        // Bodies are not used, but still bounded in size and time.
        read_body(&shared, body).await?;
        let out = transition(&shared, &key, &instance, &action, Some(&who)).await?;
        Ok(with_index(
            &shared,
            shared.view_index(),
            StatusCode::OK,
            out,
        ))
    }
    .await;
    count_write(route_of(&action), &r);
    r
}
