//! Other writes: failure reports (local ejection), lifecycle transitions, request bodies, publishing
//! committed records to the mesh.

use std::collections::HashMap;
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
use shoal_proto::{Generation, InstanceId, LifecycleState, ServiceKey, TransitionReason};

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
    // What the view says about the instance right now, and which endpoints of the service are
    // routable but for local ejections (what the ejection cap is a share of).
    let (current, routable_endpoints) = {
        let mesh = shared.mesh.read().expect("mesh lock");
        let liveness = mesh.liveness();
        let current = mesh.catalog().entry(&key, &instance).map(|e| {
            let life = &e.lifecycle().record;
            let routable = view::is_routable(e, &liveness);
            (life.generation, life.state, routable)
        });
        let routable: Vec<(InstanceId, Generation)> = if failed {
            mesh.catalog().service(&key).map_or_else(Vec::new, |s| {
                s.instances
                    .values()
                    .filter(|e| view::is_routable(e, &liveness))
                    .map(|e| {
                        let life = &e.lifecycle().record;
                        (life.instance.clone(), life.generation)
                    })
                    .collect()
            })
        } else {
            Vec::new()
        };
        (current, routable)
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
        let pct = shared.cfg.raw.api.max_ejection_percent;
        let mut ej = shared.ejections.lock().expect("ejections");
        let slot = (instance.clone(), generation);
        let in_force = |k: &(InstanceId, Generation)| ej.get(k).is_some_and(|until| *until > now);
        let renewal = in_force(&slot);
        let ejected = routable_endpoints.iter().filter(|k| in_force(k)).count();
        let limit = ejection_limit(routable_endpoints.len(), pct);
        if !renewal && ejected >= limit {
            // Envoy's max_ejection_percent: reports alone never take a whole service (or
            // most of it) out of rotation (QA: one report per endpoint made `pick` answer
            // "no backend" for 10 minutes; one report emptied a one-endpoint service).
            drop(ej);
            counter!("shoal_local_ejections_total", "outcome" => "capped").increment(1);
            crate::metrics::rejected("api", "ejection_cap");
            if EJECTION_LOG.should_log(who.uid, &key, &instance, false) {
                tracing::warn!(caller = %who, service = %key, %instance, ejected,
                    routable = routable_endpoints.len(), max_ejection_percent = pct,
                    "failure report not applied: the service's ejection cap is reached (logged once a minute per caller and endpoint)");
            }
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                json!({
                    "error": format!(
                        "not applied: {ejected} of the {} routable endpoints of {key} are ejected here already, the most reports may eject at once ([api] max_ejection_percent = {pct}, at least one, never the last routable endpoint not ejected)",
                        routable_endpoints.len()
                    ),
                    "reason": "ejection_cap",
                    "instance": instance.as_str(),
                    "generation": generation.0,
                    "ejected": ejected,
                    "routable": routable_endpoints.len(),
                    "limit": limit,
                }),
            ));
        }
        if ej.len() >= MAX_EJECTIONS && !ej.contains_key(&slot) {
            crate::metrics::rejected("api", "ejections_full");
            counter!("shoal_local_ejections_total", "outcome" => "table_full").increment(1);
        } else {
            ej.insert(slot, now + ms);
            // Published before the index bump below, so a woken watcher sees it.
            shared.publish_ejections(&ej);
            drop(ej);
            ejected_until = Some(ms);
            let outcome = if renewal { "renewed" } else { "ejected" };
            counter!("shoal_local_ejections_total", "outcome" => outcome).increment(1);
            if !renewal && EJECTION_LOG.should_log(who.uid, &key, &instance, true) {
                tracing::warn!(caller = %who, service = %key, %instance,
                    generation = generation.0, eject_ms = ms, report = %b.outcome,
                    "endpoint ejected locally after a failure report (logged once a minute per caller and endpoint)");
            }
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

/// How many of a service's `routable` endpoints reports may hold ejected at once:
/// `max_ejection_percent` of them, rounded down, at least one (as Envoy's outlier detection
/// allows one ejection), but always fewer than all of them: reports cannot empty a service, so
/// the last routable endpoint that is not ejected never is (a one-endpoint service: none).
pub(crate) fn ejection_limit(routable: usize, max_ejection_percent: u8) -> usize {
    (routable.saturating_mul(usize::from(max_ejection_percent)) / 100)
        .max(1)
        .min(routable.saturating_sub(1))
}

/// Log lines of local ejections (applied or refused by the cap): at most one a minute per
/// (caller uid, service, instance, applied), so a caller reporting in a loop writes one line
/// per endpoint, not one per report. Bounded; past the bound lines are counted in
/// `shoal_local_ejection_logs_suppressed_total` instead.
pub(crate) struct EjectionLog {
    last: std::sync::Mutex<HashMap<(u32, ServiceKey, InstanceId, bool), std::time::Instant>>,
}

/// Most (caller, endpoint) pairs [`EjectionLog`] remembers.
const MAX_EJECTION_LOG_ENTRIES: usize = 4_096;
const EJECTION_LOG_INTERVAL: Duration = Duration::from_secs(60);

static EJECTION_LOG: std::sync::LazyLock<EjectionLog> = std::sync::LazyLock::new(EjectionLog::new);

impl EjectionLog {
    pub(crate) fn new() -> Self {
        Self {
            last: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Whether to log this ejection (`applied`) or cap refusal now.
    pub(crate) fn should_log(
        &self,
        uid: u32,
        key: &ServiceKey,
        instance: &InstanceId,
        applied: bool,
    ) -> bool {
        let now = std::time::Instant::now();
        let mut last = self.last.lock().expect("ejection log");
        let id = (uid, key.clone(), instance.clone(), applied);
        if last
            .get(&id)
            .is_some_and(|t| now.duration_since(*t) < EJECTION_LOG_INTERVAL)
        {
            return false;
        }
        if last.len() >= MAX_EJECTION_LOG_ENTRIES && !last.contains_key(&id) {
            last.retain(|_, t| now.duration_since(*t) < EJECTION_LOG_INTERVAL);
            if last.len() >= MAX_EJECTION_LOG_ENTRIES {
                counter!("shoal_local_ejection_logs_suppressed_total").increment(1);
                return false;
            }
        }
        last.insert(id, now);
        true
    }
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
        crate::metrics::rejected("api", "unknown_instance");
        // A registration that answered 503 keeps its owner entry (it may still commit); a
        // deregistration of it gives the entry back, so the caller's count drops again.
        if action == "deregister" && shared.owners.get(key, instance.as_str()).is_some() {
            if let Err(e) = shared.owners.remove(key, instance.as_str()) {
                tracing::error!(%key, %instance, error = %e, "instance owner removal not persisted");
            }
        }
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            json!({
                "error": format!("unknown instance: the catalog here holds no instance `{instance}` of {key}"),
                "reason": "unknown_instance",
                "instance": instance.as_str(),
            }),
        ));
    };
    if rec.owner != shared.cfg.node_id {
        let denied = crate::access::Denied {
            code: "not_local",
            reason: format!(
                "instance is not on this node: `{instance}` of {key} is owned by node {}; ask that node's agent",
                rec.owner
            ),
        };
        let mut e = match who {
            Some(who) => forbidden(shared, who, route_of(action), denied),
            None => ApiError::new(
                StatusCode::FORBIDDEN,
                json!({"error": denied.reason, "reason": denied.code}),
            ),
        };
        e.insert("owner", json!(rec.owner.as_str()));
        return Err(e);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ejection_limit_is_a_share_of_the_routable_endpoints_and_at_least_one() {
        // The 50 % default: half, rounded down; one of two or three.
        assert_eq!(ejection_limit(2, 50), 1);
        assert_eq!(ejection_limit(3, 50), 1);
        assert_eq!(ejection_limit(4, 50), 2);
        assert_eq!(ejection_limit(10, 50), 5);
        // Envoy's 10 % default.
        assert_eq!(ejection_limit(10, 10), 1);
        assert_eq!(ejection_limit(25, 10), 2);
        // Reports cannot empty a service (QA: one report emptied a one-endpoint service for
        // up to 10 minutes): the last routable endpoint not ejected stays, at any percent.
        for pct in [0, 1, 10, 50, 100] {
            assert_eq!(ejection_limit(0, pct), 0, "{pct} %");
            assert_eq!(ejection_limit(1, pct), 0, "{pct} %");
        }
        assert_eq!(ejection_limit(2, 100), 1);
        assert_eq!(ejection_limit(7, 100), 6);
        assert_eq!(ejection_limit(usize::MAX, 100), usize::MAX / 100);
    }

    #[test]
    fn ejection_log_once_a_minute_per_caller_and_endpoint() {
        let log = EjectionLog::new();
        let key = ServiceKey::new("prod", "web", "http").unwrap();
        let web1 = InstanceId::new("web-1").unwrap();
        let web2 = InstanceId::new("web-2").unwrap();
        assert!(log.should_log(1000, &key, &web1, true));
        assert!(
            !log.should_log(1000, &key, &web1, true),
            "same caller and endpoint"
        );
        assert!(
            log.should_log(1000, &key, &web1, false),
            "a refusal is its own line"
        );
        assert!(log.should_log(1000, &key, &web2, true), "another endpoint");
        assert!(log.should_log(1001, &key, &web1, true), "another caller");
        // Bounded: past the bound, new pairs are suppressed, not remembered.
        for i in 0..MAX_EJECTION_LOG_ENTRIES {
            let _ = log.should_log(5000 + i as u32, &key, &web1, true);
        }
        assert!(log.last.lock().unwrap().len() <= MAX_EJECTION_LOG_ENTRIES);
        assert!(!log.should_log(u32::MAX, &key, &web1, true));
    }
}
