//! Registration: the request body, ownership / address / probe checks, forwarding to the authority.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;
use shoal_proto::rpc::{AuthorityRequestBody, LocalCaller};
use shoal_proto::{
    EndpointSpec, InstanceId, LabelDimension, Labels, LifecycleState, ServiceKey, Version, Zone,
};

use super::*;
use crate::access::{Action, ClaimError, Denied, Owner, MAX_OWNED};
use crate::client::{self, CallError};
use crate::probes::{ExecAs, ProbeSet};
use crate::state::Shared;

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

/// Why `addr` cannot be an endpoint's address, if it cannot: callers would be sent to it
/// (QA: `0.0.0.0:0` was registered, `pick` returned it and DNS answered `A 0.0.0.0`).
/// Refused: port 0, the unspecified address (`0.0.0.0`, `::`), multicast (`224.0.0.0/4`,
/// `ff00::/8`), the IPv4 broadcast address and link-local addresses (`169.254.0.0/16`,
/// `fe80::/10`: reachable on one link only, and IPv6 ones need a zone the record cannot carry),
/// as Kubernetes' EndpointSlice validation refuses them. Loopback is allowed (local clusters
/// run on `127.0.x.y`). IPv4-mapped IPv6 addresses are judged as their IPv4 address.
pub fn endpoint_address_problem(addr: SocketAddr) -> Option<&'static str> {
    use std::net::IpAddr;
    if addr.port() == 0 {
        return Some("port 0 is not a port callers can connect to");
    }
    let ip = addr.ip().to_canonical();
    if ip.is_unspecified() {
        return Some("the unspecified address (0.0.0.0 / ::) is not an address callers can reach");
    }
    if ip.is_multicast() {
        return Some("a multicast address cannot be an endpoint");
    }
    match ip {
        IpAddr::V4(v4) if v4.is_broadcast() => {
            Some("the broadcast address 255.255.255.255 cannot be an endpoint")
        }
        IpAddr::V4(v4) if v4.is_link_local() => {
            Some("a link-local address (169.254.0.0/16) is reachable on one link only")
        }
        IpAddr::V6(v6) if v6.is_unicast_link_local() => {
            Some("a link-local address (fe80::/10) is reachable on one link only")
        }
        _ => None,
    }
}

/// Refuses a lease the authority would refuse (`shoal_authority::MIN_LEASE_MS..=MAX_LEASE_MS`)
/// before asking it: bad input is a 400 here, not the authority's 409.
pub(super) fn check_lease(lease_ms: u32) -> Result<(), ApiError> {
    use shoal_authority::{MAX_LEASE_MS, MIN_LEASE_MS};
    if (MIN_LEASE_MS..=MAX_LEASE_MS).contains(&lease_ms) {
        return Ok(());
    }
    Err(ApiError::bad(
        "bad_lease",
        format!("lease_ms {lease_ms} is out of range ({MIN_LEASE_MS}..={MAX_LEASE_MS})"),
    ))
}

/// `addr` with an IPv4-mapped IPv6 address (`[::ffff:a.b.c.d]:p`) written as the IPv4 address
/// it is (`a.b.c.d:p`); any other address unchanged. Registered addresses are stored in this
/// form, and compared in it (`check_address`, probe targets), so that one socket cannot be
/// claimed twice under two spellings (QA: `[::ffff:127.0.0.50]:8080` slipped past
/// `address_in_use` for another owner's `127.0.0.50:8080`, and DNS then served it).
pub fn canonical_endpoint_address(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

pub(super) fn endpoint_spec(shared: &Shared, b: &RegisterBody) -> Result<EndpointSpec, ApiError> {
    if let Some(why) = endpoint_address_problem(b.address) {
        return Err(ApiError::bad(
            "bad_address",
            format!("address {} refused: {why}", b.address),
        ));
    }
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
        address: canonical_endpoint_address(b.address),
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

pub(super) async fn register(
    State(shared): State<Arc<Shared>>,
    Extension(who): Extension<LocalCaller>,
    Path((ns, svc, port)): Path<(String, String, String)>,
    body: Body,
) -> ApiResult {
    let r = register_inner(&shared, &who, &ns, &svc, &port, body).await;
    count_write("register", &r);
    r
}

pub(super) async fn register_inner(
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
        shared.view_index(),
        StatusCode::OK,
        json!({"service": key.to_string(), "instance": b.instance, "generation": generation, "records": records}),
    ))
}

/// Who may change `instance` of `key`: its owner (with `change_own`, or `register` when
/// `action` is a re-registration), or an orchestrator / admin of `key`.
pub(super) fn check_owner(
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

/// Refuses an instance in another zone than this agent's, unless `who` is an orchestrator or
/// admin of `key`: an instance registered through the local agent runs on this node, so its
/// zone is the node's (as Kubernetes takes an endpoint's zone from its node, not its pod).
/// Without this, an app could claim the callers of another zone, whose picks prefer their own
/// zone first (QA: an instance registered as `zone-1` from a `zone-2` agent took 5 of 5 picks
/// on a `zone-1` agent).
fn check_zone(
    shared: &Shared,
    who: &LocalCaller,
    key: &ServiceKey,
    zone: &Zone,
) -> Result<(), ApiError> {
    let local = &shared.cfg.zone;
    if zone == local || shared.cfg.access.allows(who, Action::ChangeOthers, key) {
        return Ok(());
    }
    Err(forbidden(
        shared,
        who,
        "register",
        Denied {
            code: "zone_not_local",
            reason: format!(
                "this agent's instances run in its zone `{local}`; uid {} may not register one in zone `{zone}` (needs orchestrator/admin)",
                who.uid
            ),
        },
    ))
}

/// Refuses to register `addr` for `who` while a live (not EXPIRED) instance of this node at the
/// same address is owned by another uid or has no recorded owner (an unreadable owners file,
/// a full owner table), unless `who` may change that instance (orchestrator or admin of its
/// service). Without this, a caller allowed to register anything could take over another
/// application's traffic by registering a fresh instance id at that application's address. Instances of other nodes are not checked here: the agent cannot tell a moved
/// address from a stolen one (a region-wide check belongs to the authority; a known gap).
pub(super) fn check_address(
    shared: &Shared,
    who: &LocalCaller,
    key: &ServiceKey,
    instance: &InstanceId,
    addr: SocketAddr,
) -> Result<(), ApiError> {
    let addr = canonical_endpoint_address(addr);
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
                    && canonical_endpoint_address(r.endpoint.address) == addr
            })
            .find_map(|(k, i, _)| {
                // An instance whose owner is unknown (an unreadable owners file, a full owner
                // table) still holds its address: only an orchestrator or admin may reuse it.
                let uid = shared.owners.get(k, i.as_str()).map(|o| o.uid);
                (uid != Some(who.uid) && !shared.cfg.access.allows(who, Action::ChangeOthers, k))
                    .then(|| (k.clone(), i.clone(), uid))
            });
        found
    };
    match holder {
        None => Ok(()),
        Some((k, i, uid)) => {
            // Name the holder only to a caller who may read its service (reads may be
            // granted per service); the refusal itself must still say the address is taken.
            let holder = match uid {
                _ if !shared.cfg.access.allows(who, Action::Read, &k) => {
                    "another owner's instance".to_owned()
                }
                Some(uid) => format!("instance `{i}` of {k}, owned by uid {uid}"),
                None => format!("instance `{i}` of {k}, whose owner is not recorded on this agent"),
            };
            Err(forbidden(
                shared,
                who,
                "register",
                Denied {
                    code: "address_in_use",
                    reason: format!(
                        "address {addr} is registered by {holder}; uid {} may not register it (needs orchestrator/admin)",
                        who.uid
                    ),
                },
            ))
        }
    }
}

/// Refuses probes the caller may not register: exec probes while disabled or for another uid
/// on a non-root agent, HTTP/TCP probes aimed anywhere but the instance's own address.
pub(super) fn check_probes(
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
        check_zone(shared, who, &key, &endpoint.zone)?;
        check_address(shared, who, &key, &instance, addr)?;
    }
    // Our records must carry our key, or our health verifies nowhere else. If binding fails
    // now, the registration is still tried; the background binder re-issues it later.
    if let Err(e) = ensure_node_key_bound(shared).await {
        tracing::warn!(error = %e, "node key not bound yet; registering anyway");
    }
    let lease_ms = b.lease_ms.unwrap_or(shared.cfg.raw.authority.lease_ms);
    check_lease(lease_ms)?;
    let body = AuthorityRequestBody::Register {
        key: key.clone(),
        instance: instance.clone(),
        on_node: None,
        endpoint,
        lease_ms,
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
    // The agent's own `[[instances]]` are not capped; every local caller is.
    let per_uid_limit = who.map_or(usize::MAX, |_| shared.cfg.raw.api.max_instances_per_caller);
    let claim = shared
        .owners
        .claim(&key, instance.as_str(), owner, may_take_over, per_uid_limit)
        .map_err(|e| claim_refused(shared, who, &key, &instance, e))?;
    let records = match client::call_for(shared, body, who.cloned()).await {
        Ok(ok) => publish(shared, ok).await,
        // A refusal committed nothing: give the claim back. No answer (503) may still commit
        // (a stalled replica applies it when it resumes): the claim is kept, so the caller
        // still owns the instance if it appears, and may retry or deregister it (QA: the
        // claim given back on a 503 left a registration that committed later with no owner,
        // `owner_unknown` for its caller and `address_in_use` for the rest).
        Err(e @ CallError::Unavailable(_)) => return Err(e.into()),
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

/// The answer to a refused [`crate::access::Owners::claim`]: nothing was registered.
fn claim_refused(
    shared: &Shared,
    who: Option<&LocalCaller>,
    key: &ServiceKey,
    instance: &InstanceId,
    e: ClaimError,
) -> ApiError {
    let (status, code, reason) = match e {
        ClaimError::NotOwner(other) => {
            let who = who.expect("the agent itself may always take over");
            (
                StatusCode::FORBIDDEN,
                "not_owner",
                format!(
                    "instance `{instance}` of {key} is owned by uid {}; uid {} may not change it (needs ownership, or orchestrator/admin)",
                    other.uid, who.uid
                ),
            )
        }
        ClaimError::TableFull => (
            StatusCode::SERVICE_UNAVAILABLE,
            "owner_table_full",
            format!(
                "not registered: this agent's owner table is full ({MAX_OWNED} instances); deregister instances first"
            ),
        ),
        ClaimError::CallerLimit { limit } => (
            StatusCode::TOO_MANY_REQUESTS,
            "instance_limit",
            format!(
                "not registered: this uid owns {limit} instances on this node already, the most one caller may ([api] max_instances_per_caller = {limit}); deregister some first"
            ),
        ),
        ClaimError::NotPersisted(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "owner_not_persisted",
            format!(
                "not registered: the instance's owner could not be saved ({why}); without it the instance could not be changed by its owner after a restart"
            ),
        ),
    };
    let d = Denied { code, reason };
    match who {
        Some(who) => refused(shared, who, "register", status, d),
        // The agent's own instance: no caller to log against.
        None => {
            metrics::counter!("shoal_api_refusals_total", "route" => "register", "reason" => code)
                .increment(1);
            tracing::error!(%key, %instance, reason = %d.reason, "configured instance not registered");
            ApiError::new(status, json!({"error": d.reason, "reason": code}))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_addresses_are_stored_as_ipv4() {
        for (given, stored) in [
            ("[::ffff:127.0.0.50]:8080", "127.0.0.50:8080"),
            ("[::ffff:7f00:32]:8080", "127.0.0.50:8080"),
            ("127.0.0.50:8080", "127.0.0.50:8080"),
            ("[2001:db8::1]:80", "[2001:db8::1]:80"),
            ("[::1]:80", "[::1]:80"),
        ] {
            let given: SocketAddr = given.parse().unwrap();
            assert_eq!(canonical_endpoint_address(given).to_string(), stored);
        }
    }

    #[test]
    fn unroutable_endpoint_addresses_are_refused_and_loopback_is_not() {
        let refused = [
            "0.0.0.0:0",
            "0.0.0.0:80",
            "10.0.0.7:0",
            "[::]:80",
            "255.255.255.255:53",
            "224.0.0.1:80",
            "239.1.2.3:80",
            "[ff02::1]:53",
            "[ff05::2]:80",
            "169.254.169.254:80",
            "[fe80::1]:80",
            "[::ffff:0.0.0.0]:80",
            "[::ffff:169.254.1.1]:80",
            "[::ffff:224.0.0.1]:80",
        ];
        for a in refused {
            let addr: SocketAddr = a.parse().unwrap();
            assert!(endpoint_address_problem(addr).is_some(), "{a} accepted");
        }
        let allowed = [
            "10.0.0.7:8080",
            "127.0.0.1:80",
            "127.0.42.3:8080",
            "[::1]:80",
            "192.168.1.1:443",
            "8.8.8.8:53",
            "[2001:db8::1]:80",
            "[fd00::1]:80",
            "[::ffff:10.0.0.7]:80",
            "255.255.255.254:80",
        ];
        for a in allowed {
            let addr: SocketAddr = a.parse().unwrap();
            assert_eq!(endpoint_address_problem(addr), None, "{a} refused");
        }
    }

    #[test]
    fn leases_the_authority_refuses_are_bad_input() {
        use shoal_authority::{MAX_LEASE_MS, MIN_LEASE_MS};
        for bad in [0, MIN_LEASE_MS - 1, MAX_LEASE_MS + 1] {
            let e = check_lease(bad).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST);
            assert_eq!(e.body()["reason"], "bad_lease", "{}", e.body());
        }
        for good in [MIN_LEASE_MS, 300_000, MAX_LEASE_MS] {
            assert!(check_lease(good).is_ok());
        }
    }
}
