//! Read routes: services, endpoints, pick, agent self / members / health, the OpenAPI document.

use std::sync::Arc;

use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use metrics::counter;
use serde_json::{json, Value};
use shoal_catalog::view::{self, EndpointView};
use shoal_proto::rpc::LocalCaller;
use shoal_proto::{LifecycleState, ServiceKey};

use super::*;
use crate::access::Action;
use crate::state::Shared;

pub(super) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// One endpoint of a view with its record times.
pub(crate) type TimedView = (EndpointView, RecordTimes);

/// Every endpoint of `key` (tombstones excluded) with its record times, and the service's
/// modify index and the catalog index, from the current [`View`](crate::state::View) (no lock).
pub(crate) fn service_view(shared: &Shared, key: &ServiceKey) -> (Vec<TimedView>, u64, u64) {
    let now = shared.now_ms();
    let view = shared.view.load();
    let liveness = view.liveness(now);
    let v = view.catalog.view(key, &liveness);
    let endpoints = v
        .endpoints
        .into_iter()
        .map(|e| {
            let t = view
                .catalog
                .entry(key, &e.instance)
                .map(|entry| RecordTimes::of(key, entry, &view.apply_times))
                .unwrap_or_default();
            (e, t)
        })
        .collect();
    (endpoints, v.modify_index, v.catalog_index)
}

pub(super) async fn services(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<LocalCaller>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let q = parse_query(raw)?;
    if let Some(index) = q.index {
        block(&shared, Watched::All, index, q.wait_ms).await;
    }
    let index = shared.index.current();
    let list: Vec<Value> = {
        let view = shared.view.load();
        let liveness = view.liveness(shared.now_ms());
        let catalog = &view.catalog;
        catalog
            .service_keys()
            .filter(|k| shared.cfg.access.allows(&who, Action::Read, k))
            .map(|k| {
                let s = catalog.service(k);
                let total = s.map_or(0, |s| {
                    s.instances
                        .values()
                        .filter(|e| e.lifecycle().record.state != LifecycleState::Expired)
                        .count()
                });
                let routable = catalog.routable(k, &liveness).count();
                json!({"service": k.to_string(), "endpoints": total, "routable": routable})
            })
            .collect()
    };
    let mut body = freshness(&shared, index);
    body.insert("services".into(), Value::Array(list));
    Ok(with_index(
        &shared,
        index,
        StatusCode::OK,
        Value::Object(body),
    ))
}

pub(super) fn check_read(
    shared: &Shared,
    who: &LocalCaller,
    key: &ServiceKey,
) -> Result<(), ApiError> {
    shared
        .cfg
        .access
        .check(who, Action::Read, key)
        .map_err(|d| forbidden(shared, who, "read", d))
}

pub(super) async fn endpoints(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<LocalCaller>,
    Path((ns, svc, port)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let key = service_key(&ns, &svc, &port)?;
    check_read(&shared, &who, &key)?;
    let q = parse_query(raw)?;
    if let Some(index) = q.index {
        block(&shared, Watched::Service(&key), index, q.wait_ms).await;
    }
    // Read before the view: a change racing the read then shows up in the next answer.
    let index = shared.index.service(&key);
    let fresh = shared.freshness();
    let view = shared.view.load();
    let liveness = view.liveness(shared.now_ms());
    let service = view.catalog.service(&key);
    let render = || {
        let endpoints: Vec<EndpointOut<'_>> = service
            .into_iter()
            .flat_map(|s| s.instances.values())
            .filter(|e| e.lifecycle().record.state != LifecycleState::Expired)
            .map(|e| EndpointOut::of(&key, e, &liveness, &view.apply_times))
            .filter(|e| q.matches_parts(e.state(), &e.record().region, &e.record().endpoint))
            .collect();
        serde_json::value::to_raw_value(&endpoints)
    };
    let endpoints = if q.is_unfiltered() && rendered::cacheable(&view, &key) {
        rendered::endpoints_array(&view, &key, render)
    } else {
        render().map(std::rc::Rc::from)
    };
    let endpoints = endpoints.map_err(|e| {
        // Only a Serialize impl can fail here (writing to a String cannot).
        tracing::error!(error = %e, "endpoints not serialisable");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": "endpoints not serialisable", "reason": "internal"}),
        )
    })?;
    let answer = EndpointsAnswer {
        fresh,
        index,
        key: &key,
        modify_index: service.map_or(0, |s| s.modify_index),
        catalog_index: view.catalog.index(),
        endpoints: &endpoints,
    };
    Ok(json_answer(index, fresh.stale, StatusCode::OK, &answer))
}

/// The `service` label of `shoal_no_backend_total` for a service neither in the catalog nor in
/// the global policy.
pub const UNKNOWN_SERVICE_LABEL: &str = "_unknown";

pub(super) async fn pick(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<LocalCaller>,
    Path((ns, svc, port)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let key = service_key(&ns, &svc, &port)?;
    check_read(&shared, &who, &key)?;
    let (write_intent, raw) =
        crate::failover::take_intent(raw).map_err(|e| ApiError::bad("bad_query", e))?;
    let q = parse_query(raw)?;
    let r = super::rng::next_u64();
    let index = shared.index.service(&key);
    let spill_factor = shared.failover.overprovisioning_factor_pct(&key);
    let fresh = shared.freshness();
    let known = {
        let snap = shared.view.load();
        let liveness = snap.liveness(shared.now_ms());
        let unfiltered = q.is_unfiltered();
        let candidates = snap.catalog.routable(&key, &liveness).filter(|e| {
            unfiltered || {
                let life = &e.lifecycle().record;
                // Routable entries are READY (view::is_routable).
                q.matches_parts(view::EndpointState::Ready, &life.region, &life.endpoint)
            }
        });
        let picked = view::pick(candidates, &shared.cfg.region, &shared.cfg.zone, false, r);
        if let Some(e) = picked {
            // Threshold failover only: the region's routable / registered counts decide
            // whether this pick spills to the policy's regions (ADR 0013).
            if spill_factor.is_some() {
                let capacity = crate::failover::LocalCapacity::of(
                    &snap.catalog,
                    &key,
                    &shared.cfg.region,
                    &liveness,
                );
                let now_s = shared.now_ms() / 1_000;
                if let Some(p) =
                    shared
                        .failover
                        .spill_remote(&key, capacity, write_intent, now_s, r)
                {
                    let mut body = freshness(&shared, index);
                    body.insert("service".into(), json!(key.to_string()));
                    crate::failover::answer_json(&mut body, &p);
                    return Ok(with_index(
                        &shared,
                        index,
                        StatusCode::OK,
                        Value::Object(body),
                    ));
                }
            }
            let endpoint = EndpointOut::of(&key, e, &liveness, &snap.apply_times);
            let zone = &e.lifecycle().record.endpoint.zone;
            let answer = PickAnswer {
                fresh,
                index,
                key: &key,
                tier: crate::failover::local_tier(zone, &shared.cfg.zone).label(),
                endpoint,
            };
            return Ok(json_answer(index, fresh.stale, StatusCode::OK, &answer));
        }
        snap.catalog.service(&key).is_some()
    };
    // No local backend: a remote region's, if policy allows failover (ADR 0013).
    let mut body = freshness(&shared, index);
    body.insert("service".into(), json!(key.to_string()));
    let now_s = shared.now_ms() / 1_000;
    match shared.failover.pick_remote(&key, write_intent, now_s, r) {
        Ok(p) => {
            crate::failover::answer_json(&mut body, &p);
            Ok(with_index(
                &shared,
                index,
                StatusCode::OK,
                Value::Object(body),
            ))
        }
        Err(why) => {
            // A caller may name any service: only one the catalog or the policy knows gets its
            // own label, so requests cannot grow the label set without bound.
            let label = if !shared.cfg.metrics_per_service {
                crate::metrics::WITHHELD_SERVICE_LABEL.to_owned()
            } else if known || shared.failover.has_policy(&key) {
                key.to_string()
            } else {
                UNKNOWN_SERVICE_LABEL.to_owned()
            };
            counter!("shoal_no_backend_total", "service" => label).increment(1);
            let (error, detail) = crate::failover::message(&why);
            body.insert("error".into(), json!(error));
            body.insert("reason".into(), json!(why.as_label()));
            body.insert("detail".into(), json!(detail));
            Ok(with_index(
                &shared,
                index,
                StatusCode::SERVICE_UNAVAILABLE,
                Value::Object(body),
            ))
        }
    }
}

pub(super) async fn agent_self(State(shared): State<Arc<Shared>>) -> Response {
    let (identity, members, catalog_len, catalog_index) = {
        let mesh = shared.mesh.read().expect("mesh lock");
        (
            mesh.membership().identity().clone(),
            mesh.membership().num_members(),
            mesh.catalog().len(),
            mesh.catalog().index(),
        )
    };
    let st = shared.status.lock().expect("status").clone();
    let mut body = freshness(&shared, shared.view_index());
    body.insert("node".into(), json!(identity.node.as_str()));
    body.insert("region".into(), json!(shared.cfg.region.as_str()));
    body.insert("zone".into(), json!(shared.cfg.zone.as_str()));
    body.insert("address".into(), json!(identity.addr.to_string()));
    body.insert("boot".into(), json!(identity.boot.0));
    body.insert("node_key".into(), json!(shared.node_key_hex));
    body.insert(
        "node_key_bound".into(),
        json!(shared
            .node_key_bound
            .load(std::sync::atomic::Ordering::Acquire)),
    );
    body.insert("active".into(), json!(st.active));
    body.insert("members".into(), json!(members));
    body.insert("catalog_entries".into(), json!(catalog_len));
    body.insert("catalog_index".into(), json!(catalog_index));
    body.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
    body.insert("dev_authority".into(), json!(shared.cfg.raw.authority.dev));
    if shared.cfg.access.dev_allow_all() {
        body.insert(
            "dev_access_warning".into(),
            json!("DEVELOPMENT ACCESS POLICY IN USE ([access] dev_allow_all): every local caller may write anything"),
        );
    }
    if let Some(k) = &shared.dev_authority_key_hex {
        body.insert(
            "dev_authority_warning".into(),
            json!("DEVELOPMENT AUTHORITY IN USE: well-known INSECURE key, not for production"),
        );
        body.insert("dev_authority_key".into(), json!(k));
    }
    with_index(
        &shared,
        shared.view_index(),
        StatusCode::OK,
        Value::Object(body),
    )
}

pub(super) async fn members(
    State(shared): State<Arc<Shared>>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let q = parse_query(raw)?;
    if let Some(index) = q.index {
        block(&shared, Watched::Members, index, q.wait_ms).await;
    }
    let index = shared.index.members();
    let list = crate::members_view::member_rows(&shared);
    let mut body = freshness(&shared, index);
    body.insert("members".into(), Value::Array(list));
    Ok(with_index(
        &shared,
        index,
        StatusCode::OK,
        Value::Object(body),
    ))
}

pub(super) async fn health(State(shared): State<Arc<Shared>>) -> Response {
    let st = shared.status.lock().expect("status").clone();
    let stale = shared.is_stale();
    let members = shared
        .mesh
        .read()
        .expect("mesh lock")
        .membership()
        .num_members();
    // An owners file that cannot be written refuses every new registration (503
    // `owner_not_persisted`), so it degrades the agent as a failing snapshot write does.
    let owners_error = shared.owners.persist_error();
    let ok = !stale
        && st.authority_error.is_none()
        && st.persist_error.is_none()
        && owners_error.is_none();
    let mut body = freshness(&shared, shared.view_index());
    body.insert("status".into(), json!(if ok { "ok" } else { "degraded" }));
    body.insert("active".into(), json!(st.active));
    body.insert("members".into(), json!(members));
    body.insert("authority_error".into(), json!(st.authority_error));
    body.insert("persist_error".into(), json!(st.persist_error));
    body.insert("owners_error".into(), json!(owners_error));
    body.insert("refused_snapshots".into(), json!(st.refused_snapshots));
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    with_index(&shared, shared.view_index(), code, Value::Object(body))
}
