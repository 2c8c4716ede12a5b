//! A Consul-compatible, read-only HTTP API on a loopback TCP port (opt-in: `[consul] listen`).
//!
//! Consul clients (py-consul, Consul's Go `api` package, Prometheus' `consul_sd_configs`) read
//! shoal's view through it without a shoal SDK. The mapping of shoal's catalog onto Consul's
//! names, tags, checks and indexes is documented in `docs/api/consul.md`; the JSON shapes
//! follow Consul's HTTP API reference (agent, catalog and health endpoints) and live in
//! [`crate::consul_json`].
//!
//! Routes: `GET /v1/agent/self`, `/v1/catalog/services`, `/v1/catalog/service/{name}`,
//! `/v1/health/service/{name}` (`?passing`, `?tag=`), `/v1/catalog/nodes`. Every answer
//! carries `X-Consul-Index` (> 0, see [`crate::api::ViewIndex`]), `X-Consul-KnownLeader`
//! (`true` while the region authority answered within `[api] staleness_budget_ms`) and
//! `X-Consul-LastContact` (ms since the last authority answer), which Consul's Go client
//! parses on every read. Blocking queries: `?index=N&wait=D` waits until the route's index
//! passes `N`, at most `wait` (Go duration, default 5 min, capped at 10 min) plus a random
//! jitter of up to `wait/16`, as Consul does.
//!
//! **Access.** TCP carries no peer credentials, so the port cannot tell callers apart:
//! anyone on the host can read. It is therefore off unless configured, must be loopback
//! unless `allow_non_loopback = true`, and cannot be enabled while `[access] reads =
//! "granted"` (the configuration is refused at start). Writes do not exist on this port.
//!
//! `filter` (Consul's filter expressions, the subset in [`crate::consul_filter`]) applies to
//! `/v1/health/service`, `/v1/catalog/service` (selectors of their element shapes) and
//! `/v1/catalog/services` (selectors of the catalog element: a service is listed when one of
//! its instances passes).
//!
//! Bad input (an unparsable `index` or `wait`, a bad `filter` expression or selector, a foreign
//! `dc`, a name that is not `<service>.<port>.<namespace>`) gets Consul's status with a
//! plain-text reason and is counted in `shoal_rejected_inputs_total{source="consul",reason}`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::Value;
use shoal_catalog::view::EndpointState;
use shoal_proto::ServiceKey;

use crate::api::{self, Watched};
use crate::consul_filter::{self as cf, Filter};
use crate::consul_json as cj;
use crate::state::Shared;

/// Consul's default blocking wait, ms.
pub const DEFAULT_WAIT_MS: u64 = 5 * 60 * 1000;
/// Consul's longest blocking wait, ms.
pub const MAX_WAIT_MS: u64 = 10 * 60 * 1000;
/// Default cap on open connections to the Consul port.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// `[consul]`: the Consul-compatible read API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsulConfig {
    /// TCP address to serve on (e.g. `127.0.0.1:8500`); unset = off.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Allow a non-loopback `listen` (unauthenticated reads from the network).
    #[serde(default)]
    pub allow_non_loopback: bool,
    /// Most open connections (blocking queries hold one each); over it, connections are
    /// closed at accept and counted in `shoal_consul_connections_refused_total`.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
}

fn default_max_connections() -> usize {
    DEFAULT_MAX_CONNECTIONS
}

impl Default for ConsulConfig {
    fn default() -> Self {
        Self {
            listen: None,
            allow_non_loopback: false,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Checks a TCP read port's settings (the Consul port and the DNS port share the rules):
/// loopback unless forced, and only with open reads.
///
/// # Errors
/// `(field, problem)` for the first bad setting; `field` is e.g. `consul.listen`.
pub fn validate_read_port(
    field: &'static str,
    listen: Option<SocketAddr>,
    allow_non_loopback: bool,
    reads: crate::access::ReadAccess,
) -> Result<(), (&'static str, String)> {
    let Some(addr) = listen else { return Ok(()) };
    if !addr.ip().is_loopback() && !allow_non_loopback {
        return Err((
            field,
            format!("{addr} is not a loopback address (set allow_non_loopback = true to force: anyone who can reach it can read the catalog)"),
        ));
    }
    if reads != crate::access::ReadAccess::Open {
        return Err((
            field,
            "cannot be enabled while [access] reads = \"granted\": this port has no peer credentials, so anyone on the host could read".into(),
        ));
    }
    Ok(())
}

/// The Consul service name of a shoal key: `<service>.<port>.<namespace>`, the same labels
/// as shoal's DNS names (`<service>.<port>.<namespace>.service.<domain>`).
pub fn consul_name(key: &ServiceKey) -> String {
    format!("{}.{}.{}", key.service, key.port_name, key.namespace)
}

/// The shoal key of a Consul service name (see [`consul_name`]); `None` when it does not
/// have three valid dot-separated parts.
pub fn parse_consul_name(name: &str) -> Option<ServiceKey> {
    let mut parts = name.split('.');
    let (svc, port, ns) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    ServiceKey::new(ns, svc, port).ok()
}

/// A Consul-style error: status and plain text, counted.
struct ConsulError(StatusCode, &'static str, String);

impl ConsulError {
    fn bad(reason: &'static str, msg: impl Into<String>) -> Self {
        Self(StatusCode::BAD_REQUEST, reason, msg.into())
    }
}

impl IntoResponse for ConsulError {
    fn into_response(self) -> Response {
        crate::metrics::rejected("consul", self.1);
        (
            self.0,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            self.2,
        )
            .into_response()
    }
}

/// Parsed query string of a Consul read.
#[derive(Debug, Default, PartialEq, Eq)]
struct ConsulQuery {
    index: Option<u64>,
    wait_ms: Option<u64>,
    passing: bool,
    tags: Vec<String>,
    filter: Option<Filter>,
}

/// Parses a Go duration (`300ms`, `10s`, `5m`, `1m30s`, `1h`) into ms; a bare number is
/// seconds (Consul's api accepts both).
fn parse_go_duration_ms(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Some(secs.saturating_mul(1000));
    }
    let mut total_ns: f64 = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let ns_per = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total_ns += num * ns_per;
        rest = &rest[unit_end..];
    }
    Some((total_ns / 1e6) as u64)
}

fn parse_query(raw: Option<&str>) -> Result<ConsulQuery, ConsulError> {
    let mut q = ConsulQuery::default();
    for pair in raw.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = api::percent_decode(v)
            .ok_or_else(|| ConsulError::bad("bad_query", "bad percent-encoding"))?;
        match k {
            "index" => {
                q.index = Some(
                    v.parse()
                        .map_err(|_| ConsulError::bad("bad_index", "Invalid index"))?,
                )
            }
            "wait" => {
                q.wait_ms = Some(
                    parse_go_duration_ms(&v)
                        .ok_or_else(|| ConsulError::bad("bad_wait", "Invalid wait time"))?,
                )
            }
            "passing" => {
                q.passing = !matches!(v.as_str(), "0" | "false" | "False" | "FALSE");
            }
            "tag" => q.tags.push(v),
            // An empty filter is no filter, as in Consul.
            "filter" if v.trim().is_empty() => {}
            "filter" => {
                q.filter = Some(Filter::parse(&v).map_err(|e| {
                    ConsulError::bad(
                        "bad_filter",
                        format!("Failed to create boolean expression evaluator: {e}"),
                    )
                })?)
            }
            // Consul ignores what it does not know for a route (stale, consistent, cached,
            // near, ns, partition, dc is checked by the caller); so do we.
            _ => {}
        }
    }
    Ok(q)
}

/// Refuses a `dc` other than our region, as Consul does for an unknown datacenter.
fn check_dc(shared: &Shared, raw: Option<&str>) -> Result<(), ConsulError> {
    for pair in raw.unwrap_or_default().split('&') {
        if let Some(dc) = pair.strip_prefix("dc=") {
            if !dc.is_empty() && dc != shared.cfg.region.as_str() {
                return Err(ConsulError(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "unknown_dc",
                    "No path to datacenter".into(),
                ));
            }
        }
    }
    Ok(())
}

/// Parses, checks `dc` and the filter's selectors against `shape` (the route's element; `None`:
/// the route takes no filter), and blocks when asked. Returns the query.
async fn prepare(
    shared: &Shared,
    raw: Option<String>,
    watched: Watched<'_>,
    shape: Option<fn() -> Value>,
) -> Result<ConsulQuery, ConsulError> {
    check_dc(shared, raw.as_deref())?;
    let q = parse_query(raw.as_deref())?;
    if let Some(f) = &q.filter {
        let shape = shape.ok_or_else(|| {
            ConsulError::bad("bad_filter", "this endpoint does not support filtering")
        })?;
        f.check_selectors(&shape()).map_err(|e| {
            ConsulError::bad(
                "bad_filter",
                format!("Failed to create boolean expression evaluator: {e}"),
            )
        })?;
    }
    if let Some(index) = q.index {
        let wait = q.wait_ms.unwrap_or(DEFAULT_WAIT_MS).min(MAX_WAIT_MS);
        api::block_on(shared, watched, index, wait).await;
    }
    Ok(q)
}

/// A JSON answer with Consul's query-meta headers.
fn answer(shared: &Shared, index: u64, body: Value) -> Response {
    let mut r = (StatusCode::OK, axum::Json(body)).into_response();
    let h = r.headers_mut();
    let authority_age = shared.authority_age_ms();
    let known_leader = authority_age.is_some_and(|a| a <= shared.cfg.raw.api.staleness_budget_ms);
    // Consul's X-Consul-Index is never 0 (its clients treat 0 as "no index"); ours starts at
    // (boot << 32) + 1.
    let index = index.max(1);
    if let Ok(v) = HeaderValue::from_str(&index.to_string()) {
        h.insert("x-consul-index", v);
    }
    h.insert(
        "x-consul-knownleader",
        HeaderValue::from_static(if known_leader { "true" } else { "false" }),
    );
    let last_contact = authority_age.unwrap_or_else(|| shared.now_ms());
    if let Ok(v) = HeaderValue::from_str(&last_contact.to_string()) {
        h.insert("x-consul-lastcontact", v);
    }
    h.insert(
        "x-consul-effective-consistency",
        HeaderValue::from_static("stale"),
    );
    r
}

/// The Consul router (GET only; everything else is Consul's 404 or 405).
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/agent/self", get(agent_self))
        .route("/v1/catalog/services", get(catalog_services))
        .route("/v1/catalog/service/{name}", get(catalog_service))
        .route("/v1/health/service/{name}", get(health_service))
        .route("/v1/catalog/nodes", get(catalog_nodes))
        .fallback(not_found)
        .with_state(shared)
}

async fn not_found() -> Response {
    ConsulError(
        StatusCode::NOT_FOUND,
        "not_found",
        "shoal's Consul API serves GET /v1/agent/self, /v1/catalog/services, /v1/catalog/service/<name>, /v1/health/service/<name>, /v1/catalog/nodes".into(),
    )
    .into_response()
}

async fn agent_self(State(shared): State<Arc<Shared>>, RawQuery(raw): RawQuery) -> Response {
    if let Err(e) = check_dc(&shared, raw.as_deref()) {
        return e.into_response();
    }
    let body = cj::agent_self(&shared);
    answer(&shared, shared.index.current(), body)
}

async fn catalog_services(State(shared): State<Arc<Shared>>, RawQuery(raw): RawQuery) -> Response {
    let q = match prepare(&shared, raw, Watched::All, Some(cf::catalog_shape)).await {
        Ok(q) => q,
        Err(e) => return e.into_response(),
    };
    let index = shared.index.current();
    let body = match &q.filter {
        None => cj::catalog_services(&shared),
        Some(f) => filtered_services(&shared, f),
    };
    answer(&shared, index, body)
}

/// `/v1/catalog/services` with a filter: each service one of whose instances (as
/// `/v1/catalog/service` shows it) passes, with the tags of the instances that pass.
fn filtered_services(shared: &Shared, f: &Filter) -> Value {
    let keys: Vec<ServiceKey> = {
        let mesh = shared.mesh.read().expect("mesh lock");
        mesh.catalog().service_keys().cloned().collect()
    };
    let all = ConsulQuery::default();
    let mut out = serde_json::Map::new();
    for key in keys {
        let passing: Vec<Value> = listed(shared, &key, &all)
            .iter()
            .map(|i| i.catalog_json())
            .filter(|j| f.matches(j))
            .collect();
        if passing.is_empty() {
            continue;
        }
        let tags: std::collections::BTreeSet<&str> = passing
            .iter()
            .filter_map(|j| j["ServiceTags"].as_array())
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        out.insert(consul_name(&key), serde_json::json!(tags));
    }
    Value::Object(out)
}

fn key_of(name: &str) -> Result<ServiceKey, ConsulError> {
    // Consul answers an unknown service with an empty list, not 404; a name that cannot be a
    // shoal service is still worth telling apart.
    parse_consul_name(name).ok_or_else(|| {
        ConsulError::bad(
            "bad_service_name",
            format!("`{name}` is not a shoal service name: expected <service>.<port>.<namespace> (docs/api/consul.md)"),
        )
    })
}

/// The endpoints of a service that Consul would list: everything but EXPIRED tombstones,
/// filtered by `tag`s and, with `passing`, by routability.
fn listed(shared: &Shared, key: &ServiceKey, q: &ConsulQuery) -> Vec<cj::Instance> {
    let members = cj::member_addrs(shared);
    api::service_view(shared, key)
        .0
        .into_iter()
        .filter(|(e, _)| e.state != EndpointState::Expired)
        .filter(|(e, _)| !q.passing || e.routable)
        .map(|(e, _)| cj::Instance::new(key, e, &members))
        .filter(|i| q.tags.iter().all(|t| i.tags.contains(t)))
        .collect()
}

async fn catalog_service(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let key = match key_of(&name) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    let q = match prepare(
        &shared,
        raw,
        Watched::Service(&key),
        Some(cf::catalog_shape),
    )
    .await
    {
        Ok(q) => q,
        Err(e) => return e.into_response(),
    };
    let index = shared.index.service(&key);
    let list: Vec<Value> = listed(&shared, &key, &q)
        .iter()
        .map(|i| i.catalog_json())
        .filter(|j| q.filter.as_ref().is_none_or(|f| f.matches(j)))
        .collect();
    answer(&shared, index, Value::Array(list))
}

async fn health_service(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let key = match key_of(&name) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    let q = match prepare(&shared, raw, Watched::Service(&key), Some(cf::health_shape)).await {
        Ok(q) => q,
        Err(e) => return e.into_response(),
    };
    let index = shared.index.service(&key);
    let list: Vec<Value> = listed(&shared, &key, &q)
        .iter()
        .map(|i| i.health_json())
        .filter(|j| q.filter.as_ref().is_none_or(|f| f.matches(j)))
        .collect();
    answer(&shared, index, Value::Array(list))
}

async fn catalog_nodes(State(shared): State<Arc<Shared>>, RawQuery(raw): RawQuery) -> Response {
    if let Err(e) = prepare(&shared, raw, Watched::Members, None).await {
        return e.into_response();
    }
    let index = shared.index.members();
    answer(&shared, index, cj::catalog_nodes(&shared))
}

/// Serves `router` on `listener` with at most `max_connections` open connections (the rest
/// are closed at accept, counted in `shoal_consul_connections_refused_total` and logged once a
/// minute: `shoal_transport::capped_accept`); a request head must arrive within 10 s, idle
/// keep-alive connections are closed after 10 s (`crate::tcp_http`).
pub async fn serve(listener: tokio::net::TcpListener, router: Router, max_connections: usize) {
    let listener = shoal_transport::capped_accept::CappedListener::new(
        listener,
        max_connections,
        shoal_transport::capped_accept::PortNames {
            port: "Consul API",
            setting: "consul.max_connections",
            refused_metric: "shoal_consul_connections_refused_total",
            accept_errors_metric: "shoal_consul_accept_errors_total",
        },
    );
    crate::tcp_http::serve(
        listener,
        router,
        std::time::Duration::from_secs(10),
        "shoal_consul_connections_closed_total",
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_refuse_garbage() {
        let k = ServiceKey::new("prod", "web", "http").unwrap();
        assert_eq!(consul_name(&k), "web.http.prod");
        assert_eq!(parse_consul_name("web.http.prod"), Some(k));
        assert_eq!(parse_consul_name("web.http"), None);
        assert_eq!(parse_consul_name("a.b.c.d"), None);
        assert_eq!(parse_consul_name("WEB.http.prod"), None);
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration_ms("10s"), Some(10_000));
        assert_eq!(parse_go_duration_ms("5m"), Some(300_000));
        assert_eq!(parse_go_duration_ms("1m30s"), Some(90_000));
        assert_eq!(parse_go_duration_ms("250ms"), Some(250));
        assert_eq!(parse_go_duration_ms("1.5s"), Some(1_500));
        assert_eq!(parse_go_duration_ms("7"), Some(7_000));
        assert_eq!(parse_go_duration_ms("10x"), None);
        assert_eq!(parse_go_duration_ms(""), None);
    }

    #[test]
    fn query_flags() {
        let q = parse_query(Some("index=9&wait=30s&passing&tag=zone%3Da&stale&dc=x")).ok();
        let q = q.unwrap();
        assert_eq!(
            q,
            ConsulQuery {
                index: Some(9),
                wait_ms: Some(30_000),
                passing: true,
                tags: vec!["zone=a".into()],
                filter: None,
            }
        );
        assert!(!parse_query(Some("passing=false")).ok().unwrap().passing);
        assert!(parse_query(Some("index=-1")).is_err());
        assert!(parse_query(Some("wait=forever")).is_err());
        assert_eq!(
            parse_query(Some("filter=Service.Port%3D%3D80"))
                .ok()
                .unwrap()
                .filter,
            Some(Filter::parse("Service.Port == 80").unwrap())
        );
        assert!(parse_query(Some("filter=Service.Port%3D%3D")).is_err());
        assert!(parse_query(Some("filter=")).ok().unwrap().filter.is_none());
    }
}
