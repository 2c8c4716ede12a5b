//! JSON shapes shared by the read and write routes: endpoints, freshness, the index header.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::ser::{Serialize, SerializeStruct, Serializer};
use serde_json::{json, Value};
use shoal_catalog::view::EndpointView;
use shoal_proto::{HealthStatus, Labels, ServiceKey};

use crate::state::{ApplyTimes, Freshness, Shared};

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
    let f = shared.freshness();
    let mut m = serde_json::Map::new();
    m.insert("index".into(), json!(index));
    m.insert("snapshot_age_ms".into(), json!(f.snapshot_age_ms));
    m.insert(
        "last_authority_contact_ms_ago".into(),
        json!(f.authority_age_ms),
    );
    m.insert("stale".into(), json!(f.stale));
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

/// One endpoint serialised straight from its catalog entry: the same JSON as
/// [`endpoint_json`] (fields in the same, sorted, order), without an owned copy of the entry
/// or a `serde_json::Value` tree.
pub(crate) struct EndpointOut<'a> {
    life: &'a shoal_proto::LifecycleRecord,
    health: Option<HealthStatus>,
    state: shoal_catalog::view::EndpointState,
    owner_down: bool,
    ejected: bool,
    routable: bool,
    times: RecordTimes,
}

impl<'a> EndpointOut<'a> {
    /// The endpoint `entry` of `key` as `liveness` judges it, with its apply time from `times`.
    pub(crate) fn of(
        key: &ServiceKey,
        entry: &'a shoal_catalog::Entry,
        liveness: &dyn shoal_catalog::view::Liveness,
        times: &ApplyTimes,
    ) -> Self {
        let life = &entry.lifecycle().record;
        let owner_down = liveness.is_down(&life.owner);
        Self {
            life,
            health: entry.health().map(|h| h.record.status),
            state: shoal_catalog::view::endpoint_state(entry, owner_down),
            owner_down,
            ejected: liveness.is_ejected(&life.instance, life.generation),
            routable: shoal_catalog::view::is_routable(entry, liveness),
            times: RecordTimes::of(key, entry, times),
        }
    }

    /// The state callers see.
    pub(crate) fn state(&self) -> shoal_catalog::view::EndpointState {
        self.state
    }

    /// The lifecycle record.
    pub(crate) fn record(&self) -> &'a shoal_proto::LifecycleRecord {
        self.life
    }
}

struct LabelsOut<'a>(&'a Labels);

impl Serialize for LabelsOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(d, v)| (d.as_str(), v)))
    }
}

/// Display as a JSON string, without an intermediate `String`.
struct Str<T>(T);

impl<T: std::fmt::Display> Serialize for Str<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl Serialize for EndpointOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let l = self.life;
        let health = self.health.map(|h| match h {
            HealthStatus::Passing => "passing",
            HealthStatus::Failing => "failing",
        });
        let mut m = s.serialize_struct("Endpoint", 19)?;
        m.serialize_field("address", &Str(l.endpoint.address))?;
        m.serialize_field("applied_at_ms", &self.times.applied_at_ms)?;
        m.serialize_field("committed_at_ms", &self.times.committed_at_ms)?;
        m.serialize_field("ejected", &self.ejected)?;
        m.serialize_field("generation", &l.generation.0)?;
        m.serialize_field("health", &health)?;
        m.serialize_field("instance", l.instance.as_str())?;
        m.serialize_field("labels", &LabelsOut(&l.endpoint.labels))?;
        m.serialize_field("node", l.owner.as_str())?;
        m.serialize_field("owner_down", &self.owner_down)?;
        // Unit variants serialise as their name, as `{:?}` prints them.
        m.serialize_field("reason", &l.reason)?;
        m.serialize_field("region", l.region.as_str())?;
        m.serialize_field("revision", &l.revision.0)?;
        m.serialize_field("routable", &self.routable)?;
        m.serialize_field("source", &l.source)?;
        m.serialize_field("state", self.state.as_str())?;
        m.serialize_field("version", l.endpoint.version.as_str())?;
        m.serialize_field("weight", &l.endpoint.weight)?;
        m.serialize_field("zone", l.endpoint.zone.as_str())?;
        m.end()
    }
}

/// The answer of `GET .../endpoints` (fields sorted, as the `Value` answers were).
pub(super) struct EndpointsAnswer<'a> {
    pub(super) fresh: Freshness,
    pub(super) index: u64,
    pub(super) key: &'a ServiceKey,
    pub(super) modify_index: u64,
    pub(super) catalog_index: u64,
    /// The rendered array (api/rendered.rs: reused across reads of one view).
    pub(super) endpoints: &'a serde_json::value::RawValue,
}

impl Serialize for EndpointsAnswer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("Endpoints", 8)?;
        m.serialize_field("catalog_index", &self.catalog_index)?;
        m.serialize_field("endpoints", &self.endpoints)?;
        m.serialize_field("index", &self.index)?;
        m.serialize_field(
            "last_authority_contact_ms_ago",
            &self.fresh.authority_age_ms,
        )?;
        m.serialize_field("modify_index", &self.modify_index)?;
        m.serialize_field("service", &Str(self.key))?;
        m.serialize_field("snapshot_age_ms", &self.fresh.snapshot_age_ms)?;
        m.serialize_field("stale", &self.fresh.stale)?;
        m.end()
    }
}

/// The answer of a local `GET .../pick` (fields sorted, as the `Value` answers were).
pub(super) struct PickAnswer<'a> {
    pub(super) fresh: Freshness,
    pub(super) index: u64,
    pub(super) key: &'a ServiceKey,
    pub(super) tier: String,
    pub(super) endpoint: EndpointOut<'a>,
}

impl Serialize for PickAnswer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("Pick", 8)?;
        m.serialize_field("endpoint", &self.endpoint)?;
        m.serialize_field("index", &self.index)?;
        m.serialize_field(
            "last_authority_contact_ms_ago",
            &self.fresh.authority_age_ms,
        )?;
        m.serialize_field("read_only", &false)?;
        m.serialize_field("service", &Str(self.key))?;
        m.serialize_field("snapshot_age_ms", &self.fresh.snapshot_age_ms)?;
        m.serialize_field("stale", &self.fresh.stale)?;
        m.serialize_field("tier", &self.tier)?;
        m.end()
    }
}

/// A JSON answer serialised straight into its body, with `X-Shoal-Index: index` (and
/// `X-Shoal-Stale` when `stale`).
pub(super) fn json_answer<T: Serialize>(
    index: u64,
    stale: bool,
    status: StatusCode,
    body: &T,
) -> Response {
    let mut bytes = Vec::with_capacity(4096);
    if let Err(e) = serde_json::to_writer(&mut bytes, body) {
        // Only a Serialize impl can fail here (writing to a Vec cannot).
        tracing::error!(error = %e, "answer not serialisable");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let mut r = Response::new(axum::body::Body::from(bytes));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert("x-shoal-index", HeaderValue::from(index));
    if stale {
        h.insert("x-shoal-stale", HeaderValue::from_static("true"));
    }
    r
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::sync::Arc;

    use shoal_catalog::testkit::Fixture;
    use shoal_catalog::view::Liveness;
    use shoal_catalog::Catalog;
    use shoal_proto::{Generation, InstanceId, LifecycleState, NodeId};

    use super::*;
    use crate::state::ViewLiveness;

    /// Down nodes for the test, as a `Liveness`.
    struct Down(HashSet<NodeId>);

    impl Liveness for Down {
        fn is_down(&self, node: &NodeId) -> bool {
            self.0.contains(node)
        }
        fn is_ejected(&self, _: &InstanceId, _: Generation) -> bool {
            false
        }
    }

    #[test]
    fn borrowed_endpoints_serialise_as_the_value_built_ones() {
        let fx = Fixture::new();
        let mut catalog = Catalog::new();
        let records = [
            fx.lifecycle("web-1", 1, 1, LifecycleState::Ready),
            fx.lifecycle_for(&fx.key, "web-2", 1, 1, 2, LifecycleState::Ready),
            fx.lifecycle("web-3", 1, 3, LifecycleState::Draining),
            fx.lifecycle("web-4", 2, 4, LifecycleState::Ready),
        ];
        for r in &records {
            let merged = catalog.apply_lifecycle(Arc::new(r.clone()), &fx.keyring);
            assert_eq!(merged, shoal_catalog::MergeOutcome::Applied);
        }
        let failing = fx.health("web-4", 0, 2, 1, 1, HealthStatus::Failing);
        let merged = catalog.apply_health(Arc::new(failing), &fx.keyring);
        assert_eq!(merged, shoal_catalog::MergeOutcome::Applied);
        let mut times = ApplyTimes::default();
        assert!(times.record(&records[0].record, 1_234));
        // node-1 (owner of web-2) down; web-1 ejected until 500.
        let ejections: HashMap<_, _> = [((InstanceId::new("web-1").unwrap(), Generation(1)), 500)]
            .into_iter()
            .collect();
        let liveness = ViewLiveness {
            mesh: Down([fx.nodes[1].0.clone()].into_iter().collect()),
            ejections: &ejections,
            now_ms: 100,
        };
        let service = catalog.service(&fx.key).unwrap();
        let mut seen = Vec::new();
        for entry in service.instances.values() {
            let borrowed =
                serde_json::to_value(EndpointOut::of(&fx.key, entry, &liveness, &times)).unwrap();
            let built = endpoint_json(
                &EndpointView::of(entry, &liveness),
                RecordTimes::of(&fx.key, entry, &times),
            );
            assert_eq!(borrowed, built);
            seen.push((
                built["instance"].as_str().unwrap().to_owned(),
                built["state"].as_str().unwrap().to_owned(),
                built["routable"].as_bool().unwrap(),
            ));
        }
        // The cases above are really exercised: ejected, owner down, draining, failing health.
        assert_eq!(
            seen,
            [
                ("web-1".into(), "READY".into(), false),
                ("web-2".into(), "UNHEALTHY".into(), false),
                ("web-3".into(), "DRAINING".into(), false),
                ("web-4".into(), "UNHEALTHY".into(), false),
            ]
        );
        let first = serde_json::to_value(EndpointOut::of(
            &fx.key,
            service.instances.values().next().unwrap(),
            &liveness,
            &times,
        ))
        .unwrap();
        assert_eq!(
            (first["applied_at_ms"].as_u64(), first["ejected"].as_bool()),
            (Some(1_234), Some(true))
        );
    }
}
