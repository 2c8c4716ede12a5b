//! Consul-shaped JSON for [`crate::consul`]: field names and nesting as in Consul's HTTP API
//! reference (`/v1/agent/self`, `/v1/catalog/services`, `/v1/catalog/service/:name`,
//! `/v1/health/service/:name`, `/v1/catalog/nodes`). The mapping is in `docs/api/consul.md`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use serde_json::{json, Value};
use shoal_catalog::view::{EndpointState, EndpointView};
use shoal_proto::ServiceKey;

use crate::consul::consul_name;
use crate::state::{Shared, ViewLiveness};

/// Node name -> host address of every member this agent knows (itself included).
pub type MemberAddrs = HashMap<String, IpAddr>;

/// The addresses of the members this agent knows, by node name.
pub fn member_addrs(shared: &Shared) -> MemberAddrs {
    let mesh = shared.mesh.read().expect("mesh lock");
    let me = mesh.membership().identity();
    std::iter::once((me.node.as_str().to_owned(), me.addr.ip()))
        .chain(
            mesh.membership()
                .members()
                .map(|m| (m.node.as_str().to_owned(), m.addr.ip())),
        )
        .collect()
}

/// A stable UUID-shaped node id (Consul node ids are UUIDs): two 64-bit FNV-1a hashes of the
/// node name, formatted 8-4-4-4-12. Not random, so every agent derives the same one.
pub fn node_uuid(node: &str) -> String {
    use shoal_mesh::hash::{fnv1a, FNV_OFFSET};
    // The second hash starts from another basis so the two halves are independent.
    let (a, b) = (
        fnv1a(node.as_bytes(), FNV_OFFSET),
        fnv1a(node.as_bytes(), 0x6c62_272e_07bb_0142),
    );
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// One endpoint in Consul's terms.
#[derive(Debug, Clone)]
pub struct Instance {
    /// Consul service name.
    pub name: String,
    /// The view of the endpoint.
    pub view: EndpointView,
    /// Its tags (`zone=…`, `version=…`, `<dimension>=<value>`).
    pub tags: Vec<String>,
    /// Its service meta.
    pub meta: BTreeMap<String, String>,
    /// Host address of the owner node (its endpoint address when the node is not known).
    pub node_addr: IpAddr,
    /// Region of the endpoint (Consul's datacenter).
    pub datacenter: String,
}

/// The tags of an endpoint: `zone=<zone>`, `version=<version>` and one `<dimension>=<value>`
/// per label, sorted.
pub fn tags_of(e: &EndpointView) -> Vec<String> {
    let mut t = vec![
        format!("zone={}", e.endpoint.zone.as_str()),
        format!("version={}", e.endpoint.version.as_str()),
    ];
    t.extend(
        e.endpoint
            .labels
            .iter()
            .map(|(d, v)| format!("{}={v}", d.as_str())),
    );
    t.sort();
    t
}

impl Instance {
    /// Maps one endpoint of `key`.
    pub fn new(key: &ServiceKey, view: EndpointView, members: &MemberAddrs) -> Self {
        let tags = tags_of(&view);
        let mut meta = BTreeMap::new();
        meta.insert("shoal_namespace".into(), key.namespace.as_str().to_owned());
        meta.insert("shoal_service".into(), key.service.as_str().to_owned());
        meta.insert("shoal_port".into(), key.port_name.as_str().to_owned());
        meta.insert("shoal_state".into(), view.state.as_str().to_owned());
        meta.insert("shoal_zone".into(), view.endpoint.zone.as_str().to_owned());
        meta.insert("shoal_region".into(), view.region.as_str().to_owned());
        meta.insert(
            "shoal_version".into(),
            view.endpoint.version.as_str().to_owned(),
        );
        meta.insert("shoal_generation".into(), view.generation.0.to_string());
        meta.insert("shoal_revision".into(), view.revision.0.to_string());
        let node_addr = members
            .get(view.node.as_str())
            .copied()
            .unwrap_or_else(|| view.endpoint.address.ip());
        Self {
            name: consul_name(key),
            datacenter: view.region.as_str().to_owned(),
            view,
            tags,
            meta,
            node_addr,
        }
    }

    fn addr(&self) -> String {
        self.view.endpoint.address.ip().to_string()
    }

    fn port(&self) -> u16 {
        self.view.endpoint.address.port()
    }

    fn index(&self) -> u64 {
        // The lifecycle revision: the authority's monotonic counter of this record.
        self.view.revision.0.max(1)
    }

    fn tagged_addresses(&self) -> Value {
        let a = json!({"address": self.addr(), "port": self.port()});
        let key = if self.view.endpoint.address.is_ipv6() {
            "lan_ipv6"
        } else {
            "lan_ipv4"
        };
        json!({ "lan": a, key: a })
    }

    fn node_json(&self) -> Value {
        let node = self.view.node.as_str();
        let addr = self.node_addr.to_string();
        json!({
            "ID": node_uuid(node),
            "Node": node,
            "Address": addr,
            "Datacenter": self.datacenter,
            "TaggedAddresses": {"lan": addr, "wan": addr},
            "Meta": {},
            "CreateIndex": 1,
            "ModifyIndex": 1,
        })
    }

    /// An entry of `/v1/catalog/service/:name` (Consul's flat `CatalogService`).
    pub fn catalog_json(&self) -> Value {
        let node = self.view.node.as_str();
        let addr = self.node_addr.to_string();
        json!({
            "ID": node_uuid(node),
            "Node": node,
            "Address": addr,
            "Datacenter": self.datacenter,
            "TaggedAddresses": {"lan": addr, "wan": addr},
            "NodeMeta": {},
            "ServiceKind": "",
            "ServiceID": self.view.instance.as_str(),
            "ServiceName": self.name,
            "ServiceTags": self.tags,
            "ServiceAddress": self.addr(),
            "ServiceTaggedAddresses": self.tagged_addresses(),
            "ServiceWeights": {"Passing": self.view.endpoint.weight, "Warning": 1},
            "ServiceMeta": self.meta,
            "ServicePort": self.port(),
            "ServiceEnableTagOverride": false,
            "ServiceProxy": {},
            "ServiceConnect": {},
            "CreateIndex": self.index(),
            "ModifyIndex": self.index(),
        })
    }

    fn service_json(&self) -> Value {
        json!({
            "ID": self.view.instance.as_str(),
            "Service": self.name,
            "Tags": self.tags,
            "Address": self.addr(),
            "TaggedAddresses": self.tagged_addresses(),
            "Meta": self.meta,
            "Port": self.port(),
            "Weights": {"Passing": self.view.endpoint.weight, "Warning": 1},
            "EnableTagOverride": false,
            "Proxy": {},
            "Connect": {},
            "CreateIndex": self.index(),
            "ModifyIndex": self.index(),
        })
    }

    /// Consul's `Status` of the instance's service check and why: `passing` exactly when the
    /// endpoint is routable (READY, health passing, owner up, not ejected here).
    fn service_check(&self) -> (&'static str, String) {
        let v = &self.view;
        if v.routable {
            return ("passing", "READY: routable".into());
        }
        let why = match v.state {
            EndpointState::Starting => "STARTING: not ready for traffic yet".to_owned(),
            EndpointState::Draining => "DRAINING: no new requests".to_owned(),
            EndpointState::Expired => "EXPIRED".to_owned(),
            EndpointState::Unhealthy if v.owner_down => "UNHEALTHY: owner node down".to_owned(),
            EndpointState::Unhealthy => "UNHEALTHY: readiness failing".to_owned(),
            EndpointState::Ready if v.ejected => {
                "READY but locally ejected by this agent after failure reports".to_owned()
            }
            EndpointState::Ready => "READY but not routable".to_owned(),
        };
        ("critical", why)
    }

    /// An entry of `/v1/health/service/:name` (Consul's `ServiceEntry`): the node, the
    /// service and two checks, the node's `serfHealth` (SWIM liveness of the owner node) and
    /// `shoal:<instance>` (routability).
    pub fn health_json(&self) -> Value {
        let node = self.view.node.as_str();
        let (status, output) = self.service_check();
        let serf = if self.view.owner_down {
            "critical"
        } else {
            "passing"
        };
        let check = |id: String, name: &str, status: &str, output: String, svc: bool| {
            json!({
                "Node": node,
                "CheckID": id,
                "Name": name,
                "Status": status,
                "Notes": "",
                "Output": output,
                "ServiceID": if svc { self.view.instance.as_str() } else { "" },
                "ServiceName": if svc { self.name.as_str() } else { "" },
                "ServiceTags": if svc { self.tags.clone() } else { Vec::new() },
                "Type": if svc { "shoal" } else { "" },
                "Definition": {},
                "CreateIndex": self.index(),
                "ModifyIndex": self.index(),
            })
        };
        json!({
            "Node": self.node_json(),
            "Service": self.service_json(),
            "Checks": [
                check("serfHealth".into(), "Serf Health Status", serf,
                    format!("SWIM: owner node {}", if self.view.owner_down { "down" } else { "alive" }), false),
                check(format!("shoal:{}", self.view.instance.as_str()), "shoal routable", status, output, true),
            ],
        })
    }
}

/// `/v1/agent/self`: `Config` (what Prometheus reads: `Config.Datacenter`), `Member`, `Meta`.
pub fn agent_self(shared: &Shared) -> Value {
    let (node, addr) = {
        let mesh = shared.mesh.read().expect("mesh lock");
        let me = mesh.membership().identity();
        (me.node.as_str().to_owned(), me.addr)
    };
    let region = shared.cfg.region.as_str();
    json!({
        "Config": {
            "Datacenter": region,
            "PrimaryDatacenter": region,
            "NodeName": node,
            "NodeID": node_uuid(&node),
            "Revision": "",
            "Server": false,
            "Version": env!("CARGO_PKG_VERSION"),
        },
        "Member": {
            "Name": node,
            "Addr": addr.ip().to_string(),
            "Port": addr.port(),
            "Tags": {"dc": region, "role": "node", "shoal_zone": shared.cfg.zone.as_str()},
            "Status": 1,
        },
        "Meta": {"shoal_zone": shared.cfg.zone.as_str(), "shoal_region": region},
        "xDS": {},
    })
}

/// `/v1/catalog/services`: Consul service name -> the union of its endpoints' tags, for
/// every service with at least one endpoint that is not EXPIRED.
pub fn catalog_services(shared: &Shared) -> Value {
    let now = shared.now_ms();
    let mesh = shared.mesh.read().expect("mesh lock");
    let ej = shared.ejections.lock().expect("ejections");
    let liveness = ViewLiveness {
        mesh: mesh.liveness(),
        ejections: &ej,
        now_ms: now,
    };
    let mut out = serde_json::Map::new();
    for key in mesh.catalog().service_keys() {
        let Some(s) = mesh.catalog().service(key) else {
            continue;
        };
        let mut tags = BTreeSet::new();
        let mut any = false;
        for e in s.instances.values() {
            let v = EndpointView::of(e, &liveness);
            if v.state == EndpointState::Expired {
                continue;
            }
            any = true;
            tags.extend(tags_of(&v));
        }
        if any {
            out.insert(consul_name(key), json!(tags));
        }
    }
    Value::Object(out)
}

/// `/v1/catalog/nodes`: this agent and the members it holds alive.
pub fn catalog_nodes(shared: &Shared) -> Value {
    let region = shared.cfg.region.as_str();
    let mut list: Vec<(String, IpAddr)> = member_addrs(shared).into_iter().collect();
    list.sort();
    Value::Array(
        list.into_iter()
            .map(|(node, addr)| {
                let a = addr.to_string();
                json!({
                    "ID": node_uuid(&node),
                    "Node": node,
                    "Address": a,
                    "Datacenter": region,
                    "TaggedAddresses": {"lan": a, "wan": a},
                    "Meta": {},
                    "CreateIndex": 1,
                    "ModifyIndex": 1,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_stable_uuid_shaped_and_distinct() {
        let a = node_uuid("node-1");
        assert_eq!(a, node_uuid("node-1"));
        assert_ne!(a, node_uuid("node-2"));
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, vec![8, 4, 4, 4, 12]);
        // Pinned: Consul clients cache node ids, so the derivation must never change (this is
        // FNV-1a of the name from two bases, computed independently in Python).
        assert_eq!(a, "e696ecc2-2078-79c3-9b08-af0eece84688");
    }
}
