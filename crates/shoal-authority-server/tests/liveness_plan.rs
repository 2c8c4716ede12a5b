//! The leader's reconciliation of its mesh member's view into `NodeDown` / `NodeUp`.

use shoal_authority::{ApplyContext, AuthorityCommand, AuthorityState, Caller};
use shoal_authority_server::member::MeshView;
use shoal_authority_server::server::liveness_plan;
use shoal_proto::{NodeId, SigningKey};

fn node(s: &str) -> NodeId {
    s.parse().unwrap()
}

/// A state where node-0..node-3 each own one live instance.
fn state() -> AuthorityState {
    let key = SigningKey::from_seed([3; 32]);
    let mut s = AuthorityState::new("test".parse().unwrap());
    for i in 0..4u64 {
        s.apply(
            AuthorityCommand::Register {
                caller: Caller::Node(node(&format!("node-{i}"))),
                key: "prod/web/http".parse().unwrap(),
                instance: format!("web-{i}").parse().unwrap(),
                on_node: None,
                endpoint: shoal_catalog::testkit::Fixture::spec(i as u32 + 1),
                lease_ms: 5_000,
            },
            ApplyContext {
                log_index: i + 1,
                committed_at_ms: 0,
                signing_key: &key,
            },
        )
        .unwrap();
    }
    s
}

fn view(alive: &[&str], down: &[(&str, u64)], active_since: Option<u64>) -> MeshView {
    MeshView {
        active: active_since.is_some(),
        active_since_ms: active_since,
        alive: alive.iter().map(|n| node(n)).collect(),
        down: down.iter().map(|(n, t)| (node(n), *t)).collect(),
    }
}

#[test]
fn down_owner_is_proposed_once_and_up_clears_it() {
    let mut s = state();
    let v = view(
        &["node-0", "node-1", "node-2", "auth-1"],
        &[("node-3", 700)],
        Some(0),
    );
    let plan = liveness_plan(&s, &v, 1_000, 60_000, 50);
    assert_eq!(
        plan,
        vec![AuthorityCommand::NodeDown {
            node: node("node-3"),
            at_ms: 700
        }]
    );
    let key = SigningKey::from_seed([3; 32]);
    s.apply(
        plan[0].clone(),
        ApplyContext {
            log_index: 10,
            committed_at_ms: 0,
            signing_key: &key,
        },
    )
    .unwrap();
    assert!(
        liveness_plan(&s, &v, 1_100, 60_000, 50).is_empty(),
        "already tracked"
    );
    let back = view(&["node-0", "node-1", "node-2", "node-3"], &[], Some(0));
    assert_eq!(
        liveness_plan(&s, &back, 1_200, 60_000, 50),
        vec![AuthorityCommand::NodeUp {
            node: node("node-3")
        }]
    );
}

#[test]
fn nodes_owning_nothing_are_not_proposed() {
    let s = state();
    let v = view(
        &["node-0", "node-1", "node-2", "node-3"],
        &[("auth-2", 5)],
        Some(0),
    );
    assert!(liveness_plan(&s, &v, 1_000, 60_000, 50).is_empty());
}

#[test]
fn isolated_or_inactive_member_proposes_no_down() {
    let s = state();
    // Not active: nothing.
    let v = view(&[], &[("node-0", 1), ("node-1", 1)], None);
    assert!(liveness_plan(&s, &v, 1_000, 60_000, 50).is_empty());
    // Active but most of what it knows is down: a partition, not failures.
    let v = view(
        &["auth-1"],
        &[("node-0", 1), ("node-1", 1), ("node-2", 1)],
        Some(0),
    );
    assert!(liveness_plan(&s, &v, 1_000, 60_000, 50).is_empty());
}

#[test]
fn absent_owner_is_proposed_after_the_grace() {
    let s = state();
    let v = view(
        &["node-0", "node-1", "node-2", "auth-1", "auth-2"],
        &[],
        Some(1_000),
    );
    assert!(
        liveness_plan(&s, &v, 5_000, 10_000, 50).is_empty(),
        "within the grace"
    );
    assert_eq!(
        liveness_plan(&s, &v, 11_000, 10_000, 50),
        vec![AuthorityCommand::NodeDown {
            node: node("node-3"),
            at_ms: 11_000
        }]
    );
    assert!(
        liveness_plan(&s, &v, 11_000, 0, 50).is_empty(),
        "0 disables"
    );
}
