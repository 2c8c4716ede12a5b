//! The local API: HTTP/1.1 + JSON over a unix socket. `docs/api/openapi.json` is the
//! reference (served at `/v1/openapi.json`).
//!
//! Read paths build views under the mesh read lock and never wait on the authority. Bad input
//! (malformed JSON, unknown fields, invalid service keys or parameters) gets a 400 with
//! `{"error": ..., "reason": ...}` and is counted in `shoal_rejected_inputs_total{source="api"}`;
//! a body over `[api] max_body_bytes` gets 413, one slower than `body_read_timeout_ms` 408.
//!
//! Every request carries the caller's [`LocalCaller`] (peer credentials, see
//! [`crate::listener`]); writes are authorised by [`crate::access`] and refused with 403
//! `{"error": <sentence>, "reason": <code>}` unless granted. Every write, accepted or refused,
//! is counted in `shoal_api_writes_total{route,result}` (`result`: `accepted`, `refused` (403),
//! `invalid` (other 4xx), `failed` (authority refused or unavailable)); local refusals also in
//! `shoal_api_refusals_total{route,reason}` and logged once per caller, route and reason.
//! Writes that reach the authority name the caller in its audit log (`on_behalf_of`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use metrics::counter;
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_catalog::view::{self, EndpointState, EndpointView};
use shoal_mesh::Command;
use shoal_proto::rpc::{AuthorityOk, AuthorityRequestBody, LocalCaller};
use shoal_proto::{
    EndpointSpec, HealthStatus, InstanceId, LabelDimension, Labels, LifecycleState, ServiceKey,
    TransitionReason, Version, Zone,
};

use crate::access::{Action, Denied, Owner};
use crate::client::{self, CallError};
use crate::keys::Jitter;
use crate::probes::{ExecAs, ProbeSet};
use crate::state::{ApplyTimes, DriverCmd, Shared, ViewLiveness, MAX_EJECTIONS};

/// Default largest request body accepted (`[api] max_body_bytes`).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest local ejection a report may ask for, ms.
pub const MAX_EJECT_MS: u64 = 10 * 60 * 1000;
/// The OpenAPI document.
pub const OPENAPI: &str = include_str!("../../../docs/api/openapi.json");

type ApiResult = Result<Response, ApiError>;

/// An API error: status + JSON body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: Value,
}

impl ApiError {
    fn bad(reason: &'static str, message: impl Into<String>) -> Self {
        crate::metrics::rejected("api", reason);
        Self {
            status: StatusCode::BAD_REQUEST,
            body: json!({"error": message.into(), "reason": reason}),
        }
    }
    fn new(status: StatusCode, body: Value) -> Self {
        Self { status, body }
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
fn forbidden(shared: &Shared, who: &LocalCaller, route: &'static str, d: Denied) -> ApiError {
    counter!("shoal_api_refusals_total", "route" => route, "reason" => d.code).increment(1);
    shared.refusals.log(who, route, &d);
    ApiError::new(
        StatusCode::FORBIDDEN,
        json!({"error": d.reason, "reason": d.code, "uid": who.uid, "gid": who.gid}),
    )
}

/// Counts one write in `shoal_api_writes_total{route,result}`.
fn count_write<T>(route: &'static str, r: &Result<T, ApiError>) {
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
            CallError::Refused { code, reason } => Self::new(
                StatusCode::CONFLICT,
                json!({"error": "refused", "code": code, "detail": reason}),
            ),
            CallError::Invalid(m) => Self::new(
                StatusCode::BAD_REQUEST,
                json!({"error": "invalid request", "detail": m}),
            ),
        }
    }
}

/// The API router.
pub fn router(shared: Arc<Shared>) -> Router {
    let svc = "/v1/services/{ns}/{svc}/{port}";
    Router::new()
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
        .route("/v1/failover", get(crate::failover::status))
        .route("/v1/openapi.json", get(openapi))
        .fallback(not_found)
        .with_state(shared)
}

async fn not_found() -> Response {
    crate::metrics::rejected("api", "not_found");
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"error": "no such endpoint; see /v1/openapi.json"})),
    )
        .into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

fn service_key(ns: &str, svc: &str, port: &str) -> Result<ServiceKey, ApiError> {
    ServiceKey::new(ns, svc, port)
        .map_err(|e| ApiError::bad("bad_service_key", format!("invalid service key: {e}")))
}

// ---- query strings ------------------------------------------------------------------------

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// Parsed `?…` parameters.
#[derive(Debug, Default)]
struct Query {
    states: Vec<EndpointState>,
    zone: Option<String>,
    region: Option<String>,
    version: Option<String>,
    labels: Vec<(LabelDimension, String)>,
    index: Option<u64>,
    wait_ms: Option<u64>,
}

fn parse_wait(v: &str) -> Option<u64> {
    let v = v.trim();
    if let Some(ms) = v.strip_suffix("ms") {
        return ms.parse().ok();
    }
    if let Some(s) = v.strip_suffix('s') {
        return s.parse::<u64>().ok().map(|s| s.saturating_mul(1000));
    }
    if let Some(m) = v.strip_suffix('m') {
        return m.parse::<u64>().ok().map(|m| m.saturating_mul(60_000));
    }
    v.parse::<u64>().ok().map(|s| s.saturating_mul(1000))
}

fn parse_query(raw: Option<String>) -> Result<Query, ApiError> {
    let mut q = Query::default();
    let raw = raw.unwrap_or_default();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v =
            percent_decode(v).ok_or_else(|| ApiError::bad("bad_query", "bad percent-encoding"))?;
        match k {
            "state" => {
                for s in v.split(',') {
                    q.states.push(EndpointState::parse(s).ok_or_else(|| {
                        ApiError::bad("bad_query", format!("unknown state `{s}`"))
                    })?);
                }
            }
            "zone" => q.zone = Some(v),
            "region" => q.region = Some(v),
            "version" => q.version = Some(v),
            "label" => {
                let (dim, val) = v.split_once(':').ok_or_else(|| {
                    ApiError::bad("bad_query", "label selector must be `dimension:value`")
                })?;
                let dim = LabelDimension::parse(dim).ok_or_else(|| {
                    ApiError::bad("bad_query", format!("unknown label dimension `{dim}`"))
                })?;
                q.labels.push((dim, val.to_owned()));
            }
            "index" => {
                q.index = Some(
                    v.parse()
                        .map_err(|_| ApiError::bad("bad_query", "index must be an integer"))?,
                )
            }
            "wait" => {
                q.wait_ms = Some(parse_wait(&v).ok_or_else(|| {
                    ApiError::bad("bad_query", "wait must look like 30s, 500ms or 2m")
                })?)
            }
            _ => {
                return Err(ApiError::bad(
                    "bad_query",
                    format!("unknown parameter `{k}`"),
                ))
            }
        }
    }
    Ok(q)
}

impl Query {
    fn matches(&self, e: &EndpointView) -> bool {
        (self.states.is_empty() || self.states.contains(&e.state))
            && self
                .zone
                .as_deref()
                .is_none_or(|z| e.endpoint.zone.as_str() == z)
            && self
                .region
                .as_deref()
                .is_none_or(|r| e.region.as_str() == r)
            && self
                .version
                .as_deref()
                .is_none_or(|v| e.endpoint.version.as_str() == v)
            && self
                .labels
                .iter()
                .all(|(d, v)| e.endpoint.labels.get(*d) == Some(v.as_str()))
    }
}

// ---- views --------------------------------------------------------------------------------

fn labels_json(labels: &Labels) -> Value {
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

fn freshness(shared: &Shared) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("index".into(), json!(shared.view_index()));
    m.insert("snapshot_age_ms".into(), json!(shared.snapshot_age_ms()));
    m.insert(
        "last_authority_contact_ms_ago".into(),
        json!(shared.authority_age_ms()),
    );
    m.insert("stale".into(), json!(shared.is_stale()));
    m
}

fn with_index(shared: &Shared, status: StatusCode, body: Value) -> Response {
    let mut r = (status, axum::Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&shared.view_index().to_string()) {
        r.headers_mut().insert("x-shoal-index", v);
    }
    if shared.is_stale() {
        r.headers_mut()
            .insert("x-shoal-stale", HeaderValue::from_static("true"));
    }
    r
}

/// One endpoint of a view with its record times.
type TimedView = (EndpointView, RecordTimes);

fn service_view(shared: &Shared, key: &ServiceKey) -> (Vec<TimedView>, u64, u64) {
    let now = shared.now_ms();
    let mesh = shared.mesh.read().expect("mesh lock");
    let ej = shared.ejections.lock().expect("ejections");
    let times = shared.apply_times.lock().expect("apply times");
    let liveness = ViewLiveness {
        mesh: mesh.liveness(),
        ejections: &ej,
        now_ms: now,
    };
    let v = mesh.catalog().view(key, &liveness);
    let endpoints = v
        .endpoints
        .into_iter()
        .map(|e| {
            let t = mesh
                .catalog()
                .entry(key, &e.instance)
                .map(|entry| RecordTimes::of(key, entry, &times))
                .unwrap_or_default();
            (e, t)
        })
        .collect();
    (endpoints, v.modify_index, v.catalog_index)
}

async fn services(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<LocalCaller>,
) -> Response {
    let list: Vec<Value> = {
        let now = shared.now_ms();
        let mesh = shared.mesh.read().expect("mesh lock");
        let ej = shared.ejections.lock().expect("ejections");
        let liveness = ViewLiveness {
            mesh: mesh.liveness(),
            ejections: &ej,
            now_ms: now,
        };
        mesh.catalog()
            .service_keys()
            .filter(|k| shared.cfg.access.allows(&who, Action::Read, k))
            .map(|k| {
                let s = mesh.catalog().service(k);
                let total = s.map_or(0, |s| {
                    s.instances
                        .values()
                        .filter(|e| e.lifecycle().record.state != LifecycleState::Expired)
                        .count()
                });
                let routable = mesh.catalog().routable(k, &liveness).count();
                json!({"service": k.to_string(), "endpoints": total, "routable": routable})
            })
            .collect()
    };
    let mut body = freshness(&shared);
    body.insert("services".into(), Value::Array(list));
    with_index(&shared, StatusCode::OK, Value::Object(body))
}

/// Waits until the view index passes `index` or the (bounded, jittered) wait elapses.
async fn block(shared: &Shared, index: u64, wait_ms: Option<u64>) {
    let max = shared.cfg.raw.api.max_wait_ms;
    let wait = wait_ms.unwrap_or(300_000).min(max);
    // Consul adds up to wait/16 so watchers woken together do not return together.
    let wait = wait + Jitter::new().upto(wait / 16);
    let mut rx = shared.index.subscribe();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait);
    loop {
        if *rx.borrow_and_update() > index {
            return;
        }
        if tokio::time::timeout_at(deadline, rx.changed())
            .await
            .is_err()
        {
            return;
        }
    }
}

fn check_read(shared: &Shared, who: &LocalCaller, key: &ServiceKey) -> Result<(), ApiError> {
    shared
        .cfg
        .access
        .check(who, Action::Read, key)
        .map_err(|d| forbidden(shared, who, "read", d))
}

async fn endpoints(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<LocalCaller>,
    Path((ns, svc, port)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let key = service_key(&ns, &svc, &port)?;
    check_read(&shared, &who, &key)?;
    let q = parse_query(raw)?;
    if let Some(index) = q.index {
        block(&shared, index, q.wait_ms).await;
    }
    let (eps, modify_index, catalog_index) = service_view(&shared, &key);
    let list: Vec<Value> = eps
        .iter()
        .filter(|(e, _)| q.matches(e))
        .map(|(e, t)| endpoint_json(e, *t))
        .collect();
    let mut body = freshness(&shared);
    body.insert("service".into(), json!(key.to_string()));
    body.insert("modify_index".into(), json!(modify_index));
    body.insert("catalog_index".into(), json!(catalog_index));
    body.insert("endpoints".into(), Value::Array(list));
    Ok(with_index(&shared, StatusCode::OK, Value::Object(body)))
}

async fn pick(
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
    let r = Jitter::new().next_u64();
    let picked = {
        let now = shared.now_ms();
        let mesh = shared.mesh.read().expect("mesh lock");
        let ej = shared.ejections.lock().expect("ejections");
        let times = shared.apply_times.lock().expect("apply times");
        let liveness = ViewLiveness {
            mesh: mesh.liveness(),
            ejections: &ej,
            now_ms: now,
        };
        let candidates = mesh
            .catalog()
            .routable(&key, &liveness)
            .filter(|e| q.matches(&EndpointView::of(e, &liveness)));
        view::pick(candidates, &shared.cfg.region, &shared.cfg.zone, false, r).map(|e| {
            (
                EndpointView::of(e, &liveness),
                RecordTimes::of(&key, e, &times),
            )
        })
    };
    let mut body = freshness(&shared);
    body.insert("service".into(), json!(key.to_string()));
    match picked {
        Some((e, t)) => {
            let tier = crate::failover::local_tier(&e.endpoint.zone, &shared.cfg.zone);
            body.insert("tier".into(), json!(tier.label()));
            body.insert("read_only".into(), json!(false));
            body.insert("endpoint".into(), endpoint_json(&e, t));
            Ok(with_index(&shared, StatusCode::OK, Value::Object(body)))
        }
        None => {
            let now_s = shared.now_ms() / 1_000;
            match shared.failover.pick_remote(&key, write_intent, now_s, r) {
                Ok(p) => {
                    crate::failover::answer_json(&mut body, &p);
                    Ok(with_index(&shared, StatusCode::OK, Value::Object(body)))
                }
                Err(why) => {
                    counter!("shoal_no_backend_total").increment(1);
                    let (error, detail) = why.message();
                    body.insert("error".into(), json!(error));
                    body.insert("reason".into(), json!(why.as_label()));
                    body.insert("detail".into(), json!(detail));
                    Ok(with_index(
                        &shared,
                        StatusCode::SERVICE_UNAVAILABLE,
                        Value::Object(body),
                    ))
                }
            }
        }
    }
}

/// Reads a request body within `[api] max_body_bytes` and `body_read_timeout_ms`.
async fn read_body(shared: &Shared, body: Body) -> Result<Bytes, ApiError> {
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

async fn read_json<T: serde::de::DeserializeOwned>(
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
struct ReportBody {
    instance: String,
    #[serde(default)]
    generation: Option<u64>,
    /// `connect_refused`, `timeout`, `http_5xx` or `ok`.
    outcome: String,
    #[serde(default)]
    eject_ms: Option<u64>,
}

async fn report(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<LocalCaller>,
    Path((ns, svc, port)): Path<(String, String, String)>,
    body: Body,
) -> ApiResult {
    let r = report_inner(&shared, &who, &ns, &svc, &port, body).await;
    count_write("report", &r);
    r
}

async fn report_inner(
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
            json!({"error": "unknown instance", "instance": instance.as_str()}),
        ));
    };
    let generation = b.generation.map_or(generation, shoal_proto::Generation);
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
            ejected_until = Some(ms);
            counter!("shoal_local_ejections_total", "outcome" => "ejected").increment(1);
        }
    }
    shared.bump_index();
    Ok(with_index(
        &shared,
        StatusCode::OK,
        json!({"instance": instance.as_str(), "generation": generation.0, "ejected_for_ms": ejected_until, "scope": "local"}),
    ))
}

/// `POST .../register` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterBody {
    /// Stable instance id.
    pub instance: String,
    /// `ip:port`.
    pub address: SocketAddr,
    /// Version.
    #[serde(default = "crate::config::default_version")]
    pub version: String,
    /// Weight.
    #[serde(default = "crate::config::default_weight")]
    pub weight: u32,
    /// Zone (default: the agent's).
    #[serde(default)]
    pub zone: Option<String>,
    /// Labels by dimension name.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Lease, ms (default from config).
    #[serde(default)]
    pub lease_ms: Option<u32>,
    /// Health probes.
    #[serde(default)]
    pub probes: ProbeSet,
}

fn endpoint_spec(shared: &Shared, b: &RegisterBody) -> Result<EndpointSpec, ApiError> {
    let zone = match &b.zone {
        Some(z) => Zone::new(z.clone()).map_err(|e| ApiError::bad("bad_zone", e.to_string()))?,
        None => shared.cfg.zone.clone(),
    };
    let mut labels = Vec::new();
    for (d, v) in &b.labels {
        let dim = LabelDimension::parse(d)
            .ok_or_else(|| ApiError::bad("bad_label", format!("unknown label dimension `{d}`")))?;
        labels.push((dim, v.clone()));
    }
    let spec = EndpointSpec {
        address: b.address,
        zone,
        version: Version::new(b.version.clone())
            .map_err(|e| ApiError::bad("bad_version", e.to_string()))?,
        weight: b.weight,
        labels: Labels::new(labels).map_err(|e| ApiError::bad("bad_label", e.to_string()))?,
    };
    spec.validate()
        .map_err(|e| ApiError::bad("bad_endpoint", e.to_string()))?;
    Ok(spec)
}

async fn register(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<LocalCaller>,
    Path((ns, svc, port)): Path<(String, String, String)>,
    body: Body,
) -> ApiResult {
    let r = register_inner(&shared, &who, &ns, &svc, &port, body).await;
    count_write("register", &r);
    r
}

async fn register_inner(
    shared: &Arc<Shared>,
    who: &LocalCaller,
    ns: &str,
    svc: &str,
    port: &str,
    body: Body,
) -> ApiResult {
    let key = service_key(ns, svc, port)?;
    shared
        .cfg
        .access
        .check(who, Action::Register, &key)
        .map_err(|d| forbidden(shared, who, "register", d))?;
    let b: RegisterBody = read_json(shared, body).await?;
    b.probes
        .validate()
        .map_err(|e| ApiError::bad("bad_probe", e))?;
    let (records, generation) = register_instance(shared, key.clone(), &b, Some(who)).await?;
    Ok(with_index(
        shared,
        StatusCode::OK,
        json!({"service": key.to_string(), "instance": b.instance, "generation": generation, "records": records}),
    ))
}

/// Who may change `instance` of `key`: its owner (with `change_own`, or `register` when
/// `action` is a re-registration), or an orchestrator / admin of `key`.
fn check_owner(
    shared: &Shared,
    who: &LocalCaller,
    key: &ServiceKey,
    instance: &InstanceId,
    own_action: Action,
    route: &'static str,
) -> Result<(), ApiError> {
    let policy = &shared.cfg.access;
    let deny = |d| Err(forbidden(shared, who, route, d));
    let on_this_node = || {
        let mesh = shared.mesh.read().expect("mesh lock");
        mesh.catalog().entry(key, instance).is_some_and(|e| {
            let r = &e.lifecycle().record;
            r.owner == shared.cfg.node_id && r.state != LifecycleState::Expired
        })
    };
    match shared.owners.get(key, instance.as_str()) {
        Some(o) if o.uid == who.uid => policy
            .check(who, own_action, key)
            .or_else(deny),
        Some(o) if !policy.allows(who, Action::ChangeOthers, key) => deny(Denied {
            code: "not_owner",
            reason: format!(
                "instance `{instance}` of {key} is owned by uid {}; uid {} may not change it (needs ownership, or orchestrator/admin)",
                o.uid, who.uid
            ),
        }),
        None if own_action == Action::ChangeOwn || on_this_node() => {
            if policy.allows(who, Action::ChangeOthers, key) {
                Ok(())
            } else {
                deny(Denied {
                    code: "owner_unknown",
                    reason: format!(
                        "instance `{instance}` of {key} has no recorded owner on this agent; only an orchestrator or admin may change it"
                    ),
                })
            }
        }
        _ => Ok(()),
    }
}

/// Refuses to register `addr` for `who` while a live (not EXPIRED) instance of this node at the
/// same address is owned by another uid, unless `who` may change that instance (orchestrator or
/// admin of its service). Without this, a caller allowed to register anything could take over
/// another application's traffic by registering a fresh instance id at that application's
/// address. Instances of other nodes are not checked here: the agent cannot tell a moved
/// address from a stolen one (a region-wide check belongs to the authority; a known gap).
fn check_address(
    shared: &Shared,
    who: &LocalCaller,
    key: &ServiceKey,
    instance: &InstanceId,
    addr: std::net::SocketAddr,
) -> Result<(), ApiError> {
    let holder = {
        let mesh = shared.mesh.read().expect("mesh lock");
        let found = mesh
            .catalog()
            .entries()
            .filter(|(k, i, _)| !(*k == key && *i == instance))
            .filter(|(_, _, e)| {
                let r = &e.lifecycle().record;
                r.owner == shared.cfg.node_id
                    && r.state != LifecycleState::Expired
                    && r.endpoint.address == addr
            })
            .find_map(|(k, i, _)| {
                let o = shared.owners.get(k, i.as_str())?;
                (o.uid != who.uid && !shared.cfg.access.allows(who, Action::ChangeOthers, k))
                    .then(|| (k.clone(), i.clone(), o.uid))
            });
        found
    };
    match holder {
        None => Ok(()),
        Some((k, i, uid)) => Err(forbidden(
            shared,
            who,
            "register",
            Denied {
                code: "address_in_use",
                reason: format!(
                    "address {addr} is registered by instance `{i}` of {k}, owned by uid {uid}; uid {} may not register it (needs orchestrator/admin)",
                    who.uid
                ),
            },
        )),
    }
}

/// Refuses probes the caller may not register: exec probes while disabled or for another uid
/// on a non-root agent, HTTP/TCP probes aimed anywhere but the instance's own address.
fn check_probes(
    shared: &Shared,
    who: Option<&LocalCaller>,
    b: &RegisterBody,
) -> Result<(), ApiError> {
    b.probes
        .check_targets(b.address)
        .map_err(|e| ApiError::bad("probe_target", e))?;
    if !b.probes.has_exec() {
        return Ok(());
    }
    let Some(who) = who else { return Ok(()) }; // the agent's own config (checked at load)
    if !shared.cfg.raw.probes.allow_exec {
        return Err(forbidden(
            shared,
            who,
            "register",
            Denied {
                code: "exec_probes_disabled",
                reason: "exec probes are disabled on this agent ([probes] allow_exec = false); use an http or tcp probe".into(),
            },
        ));
    }
    if shared.cfg.agent_uid != 0 && who.uid != shared.cfg.agent_uid {
        return Err(forbidden(
            shared,
            who,
            "register",
            Denied {
                code: "exec_probe_uid",
                reason: format!(
                    "this agent runs as uid {} (not root) and cannot run an exec probe as uid {}",
                    shared.cfg.agent_uid, who.uid
                ),
            },
        ));
    }
    Ok(())
}

/// Makes sure the authority has bound this node's key (ADR 0006) since start; publishes the
/// records it re-issued, if any. Cheap once bound.
///
/// # Errors
/// [`CallError`] when the authority is unavailable or refuses (a revoked node).
pub async fn ensure_node_key_bound(shared: &Arc<Shared>) -> Result<(), CallError> {
    use std::sync::atomic::Ordering;
    if shared.node_key_bound.load(Ordering::Acquire) {
        return Ok(());
    }
    let body = AuthorityRequestBody::BindNodeKey {
        key: shared.node_public_key,
    };
    let reissued = publish(shared, client::call(shared, body).await?)
        .await
        .len();
    if !shared.node_key_bound.swap(true, Ordering::AcqRel) {
        tracing::info!(
            reissued,
            node_key = %shared.node_key_hex,
            "node key bound at the authority"
        );
    }
    Ok(())
}

/// Registers an instance through the authority, publishes the result and starts its probes.
/// `who`: the local caller (`None`: the agent itself, for `[[instances]]` of its config); the
/// caller becomes the instance's owner.
///
/// # Errors
/// [`ApiError`] for bad input, a refusal of the local policy, or an unavailable / refusing
/// authority.
pub async fn register_instance(
    shared: &Arc<Shared>,
    key: ServiceKey,
    b: &RegisterBody,
    who: Option<&LocalCaller>,
) -> Result<(usize, u64), ApiError> {
    let instance = InstanceId::new(b.instance.clone())
        .map_err(|e| ApiError::bad("bad_instance", format!("invalid instance id: {e}")))?;
    if let Some(who) = who {
        check_owner(shared, who, &key, &instance, Action::Register, "register")?;
    }
    check_probes(shared, who, b)?;
    let endpoint = endpoint_spec(shared, b)?;
    let addr = endpoint.address;
    if let Some(who) = who {
        check_address(shared, who, &key, &instance, addr)?;
    }
    // Our records must carry our key, or our health verifies nowhere else. If binding fails
    // now, the registration is still tried; the background binder re-issues it later.
    if let Err(e) = ensure_node_key_bound(shared).await {
        tracing::warn!(error = %e, "node key not bound yet; registering anyway");
    }
    let body = AuthorityRequestBody::Register {
        key: key.clone(),
        instance: instance.clone(),
        on_node: None,
        endpoint,
        lease_ms: b.lease_ms.unwrap_or(shared.cfg.raw.authority.lease_ms),
    };
    let owner = who.map_or(
        Owner {
            uid: shared.cfg.agent_uid,
            gid: nix::unistd::getegid().as_raw(),
        },
        |w| Owner {
            uid: w.uid,
            gid: w.gid,
        },
    );
    // Claim the instance id before forwarding, so two callers racing for one id cannot both
    // pass the ownership check; a failed registration gives the claim back.
    let may_take_over = who.is_none_or(|w| shared.cfg.access.allows(w, Action::ChangeOthers, &key));
    let claim = match shared
        .owners
        .claim(&key, instance.as_str(), owner, may_take_over)
    {
        Ok(c) => c,
        Err(other) => {
            let who = who.expect("the agent itself may always take over");
            return Err(forbidden(
                shared,
                who,
                "register",
                Denied {
                    code: "not_owner",
                    reason: format!(
                        "instance `{instance}` of {key} is owned by uid {}; uid {} may not change it (needs ownership, or orchestrator/admin)",
                        other.uid, who.uid
                    ),
                },
            ));
        }
    };
    let records = match client::call_for(shared, body, who.cloned()).await {
        Ok(ok) => publish(shared, ok).await,
        Err(e) => {
            shared.owners.release(&key, instance.as_str(), claim);
            return Err(e.into());
        }
    };
    let generation = records
        .iter()
        .rev()
        .find(|r| r.record.instance == instance)
        .map(|r| r.record.generation);
    let exec_as = who
        .filter(|w| w.uid != shared.cfg.agent_uid)
        .map(|w| ExecAs {
            uid: w.uid,
            gid: w.gid,
        });
    if let Some(g) = generation {
        crate::agent::start_probes(shared, key, instance, g, addr, b.probes.clone(), exec_as);
    }
    Ok((records.len(), generation.map_or(0, |g| g.0)))
}

async fn publish(shared: &Arc<Shared>, ok: AuthorityOk) -> Vec<Arc<shoal_proto::SignedLifecycle>> {
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
fn route_of(action: &str) -> &'static str {
    match action {
        "ready" => "ready",
        "drain" => "drain",
        "deregister" => "deregister",
        _ => "lifecycle",
    }
}

async fn lifecycle(
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
        Ok(with_index(&shared, StatusCode::OK, out))
    }
    .await;
    count_write(route_of(&action), &r);
    r
}

async fn agent_self(State(shared): State<Arc<Shared>>) -> Response {
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
    let mut body = freshness(&shared);
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
    with_index(&shared, StatusCode::OK, Value::Object(body))
}

async fn members(State(shared): State<Arc<Shared>>) -> Response {
    let list: Vec<Value> = {
        let mesh = shared.mesh.read().expect("mesh lock");
        let me = mesh.membership().identity();
        std::iter::once(json!({"node": me.node.as_str(), "address": me.addr.to_string(), "boot": me.boot.0, "state": "self"}))
            .chain(mesh.membership().members().map(|m| {
                json!({"node": m.node.as_str(), "address": m.addr.to_string(), "boot": m.boot.0, "state": "alive"})
            }))
            .collect()
    };
    let mut body = freshness(&shared);
    body.insert("members".into(), Value::Array(list));
    with_index(&shared, StatusCode::OK, Value::Object(body))
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    let st = shared.status.lock().expect("status").clone();
    let stale = shared.is_stale();
    let members = shared
        .mesh
        .read()
        .expect("mesh lock")
        .membership()
        .num_members();
    let ok = !stale && st.authority_error.is_none() && st.persist_error.is_none();
    let mut body = freshness(&shared);
    body.insert("status".into(), json!(if ok { "ok" } else { "degraded" }));
    body.insert("active".into(), json!(st.active));
    body.insert("members".into(), json!(members));
    body.insert("authority_error".into(), json!(st.authority_error));
    body.insert("persist_error".into(), json!(st.persist_error));
    body.insert("refused_snapshots".into(), json!(st.refused_snapshots));
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    with_index(&shared, code, Value::Object(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parsing() {
        let q = parse_query(Some(
            "state=ready,DRAINING&label=protocol:http2&index=7&wait=30s&zone=a%2Db".into(),
        ))
        .unwrap();
        assert_eq!(
            q.states,
            vec![EndpointState::Ready, EndpointState::Draining]
        );
        assert_eq!(q.labels, vec![(LabelDimension::Protocol, "http2".into())]);
        assert_eq!((q.index, q.wait_ms), (Some(7), Some(30_000)));
        assert_eq!(q.zone.as_deref(), Some("a-b"));
        assert!(parse_query(Some("label=nope:x".into())).is_err());
        assert!(parse_query(Some("bogus=1".into())).is_err());
        assert!(parse_query(Some("index=x".into())).is_err());
        assert!(parse_query(Some("zone=%zz".into())).is_err());
        assert_eq!(parse_wait("500ms"), Some(500));
        assert_eq!(parse_wait("2m"), Some(120_000));
    }
}
