//! `GET /v1/agent/members`: this agent's view of its region mesh, one row per node, like
//! `consul members`: `node`, `address`, `boot`, `state`, `zone`, `version`,
//! `last_change_ms_ago`.
//!
//! `state` is `self`, `alive`, `suspect` (SWIM: a probe failed, the suspicion is not refuted
//! yet; still routable until declared down) or `down` (declared down, or replaced by a newer
//! boot; its endpoints are not routable on this agent). A graceful leave shows as `down`: foca
//! gossips a leave as a down declaration, so receivers cannot tell the two apart (known gap,
//! docs/operations.md "Troubleshooting"). `zone` and `version` are known for this agent only
//! (`null` for others: SWIM identities carry node, address and boot, nothing else).
//! `last_change_ms_ago` is the time since this agent saw the node go up or down (`null` when
//! it has not seen a change since it started, e.g. for itself).

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::state::Shared;

/// The member rows (see the module docs); the handler with `index`/`wait` is
/// `crate::api` (`members` in `api/reads.rs`).
pub fn member_rows(shared: &Shared) -> Vec<Value> {
    let now = shared.now_ms();
    let changes = shared
        .member_changes
        .lock()
        .expect("member changes")
        .clone();
    let ago = |node: &shoal_proto::NodeId| changes.get(node).map(|t| now.saturating_sub(*t));
    let mesh = shared.mesh.read().expect("mesh lock");
    let ms = mesh.membership();
    let me = ms.identity();
    let suspects: BTreeSet<&shoal_proto::NodeId> = ms.suspects().collect();
    let mut rows = vec![json!({
        "node": me.node.as_str(), "address": me.addr.to_string(), "boot": me.boot.0,
        "state": "self", "zone": shared.cfg.zone.as_str(),
        "version": env!("CARGO_PKG_VERSION"), "last_change_ms_ago": Value::Null,
    })];
    rows.extend(ms.members().map(|m| {
        let state = if suspects.contains(&m.node) {
            "suspect"
        } else {
            "alive"
        };
        json!({
            "node": m.node.as_str(), "address": m.addr.to_string(), "boot": m.boot.0,
            "state": state, "zone": Value::Null, "version": Value::Null,
            "last_change_ms_ago": ago(&m.node),
        })
    }));
    rows.extend(
        ms.down_nodes()
            .filter_map(|n| ms.down_identity(n))
            .map(|(m, at)| {
                json!({
                    "node": m.node.as_str(), "address": m.addr.to_string(), "boot": m.boot.0,
                    "state": "down", "zone": Value::Null, "version": Value::Null,
                    "last_change_ms_ago": ago(&m.node).or(Some(now.saturating_sub(at))),
                })
            }),
    );
    rows
}
