//! Views: routability, endpoint states, locality-aware picks.

use crate::support::*;

#[test]
fn routable_means_ready_and_passing_and_owner_up_and_not_ejected() {
    let fx = Fixture::new();
    let mut c = Catalog::new();
    let specs: [(&str, usize, LifecycleState, Option<HealthStatus>); 7] = [
        ("ready", 0, Ready, None),
        ("passing", 0, Ready, Some(Passing)),
        ("failing", 0, Ready, Some(Failing)),
        ("starting", 0, Starting, Some(Passing)),
        ("draining", 0, Draining, Some(Passing)),
        ("owner-down", 1, Ready, Some(Passing)),
        ("ejected", 2, Ready, Some(Passing)),
    ];
    for (i, (name, owner, state, h)) in specs.iter().enumerate() {
        let g = i as u64 + 1;
        let rec = fx.lifecycle_for(&fx.key, name, *owner, g, g, *state);
        seed(&mut c, &fx, &[Arc::new(rec)]);
        if let Some(status) = h {
            assert_eq!(
                c.apply_health(health(&fx, name, *owner, g, 1, g, *status), &fx.keyring),
                MergeOutcome::Applied
            );
        }
    }
    seed(&mut c, &fx, &[life(&fx, "expired", 99, 8, Expired)]);
    let mut net = Net::default();
    net.down.insert(fx.nodes[1].0.clone());
    net.ejected.insert((inst("ejected"), Generation(7)));

    let mut routable = routable_ids(&c, &fx, &net);
    routable.sort();
    assert_eq!(routable, ["passing", "ready"]);

    let view = c.view(&fx.key, &net);
    assert_eq!(view.catalog_index, c.index());
    assert_eq!(view.modify_index, c.service(&fx.key).unwrap().modify_index);
    let states: Vec<(String, EndpointState, bool)> = view
        .endpoints
        .iter()
        .map(|e| (e.instance.to_string(), e.state, e.routable))
        .collect();
    let expect = |s: &str, st, r| (s.to_string(), st, r);
    assert_eq!(
        states,
        vec![
            expect("draining", EndpointState::Draining, false),
            expect("ejected", EndpointState::Ready, false),
            expect("failing", EndpointState::Unhealthy, false),
            expect("owner-down", EndpointState::Unhealthy, false),
            expect("passing", EndpointState::Ready, true),
            expect("ready", EndpointState::Ready, true),
            expect("starting", EndpointState::Starting, false),
        ],
        "sorted by instance id, tombstone left out"
    );
    let ejected = view
        .endpoints
        .iter()
        .find(|e| e.instance == inst("ejected"))
        .unwrap();
    assert!(ejected.ejected && !ejected.owner_down);
    let down = view
        .endpoints
        .iter()
        .find(|e| e.instance == inst("owner-down"))
        .unwrap();
    assert!(down.owner_down && down.health == Some(Passing));

    // Everything alive: only the ejection and the lifecycle/health rules remain.
    assert_eq!(routable_ids(&c, &fx, &AllAlive).len(), 4);
    // A closure is a Liveness too (node down only).
    let node1_down = |n: &NodeId| *n == fx.nodes[1].0;
    assert_eq!(routable_ids(&c, &fx, &node1_down).len(), 3);
}

#[test]
fn endpoint_state_names_round_trip() {
    for st in [
        EndpointState::Starting,
        EndpointState::Ready,
        EndpointState::Draining,
        EndpointState::Unhealthy,
        EndpointState::Expired,
    ] {
        assert_eq!(EndpointState::parse(st.as_str()), Some(st));
        assert_eq!(EndpointState::parse(&st.as_str().to_lowercase()), Some(st));
    }
    assert_eq!(EndpointState::parse("GONE"), None);
}

/// Builds a READY entry with a chosen region, zone and weight (signed by the region's key).
fn placed(
    authority: &SigningKey,
    fx: &Fixture,
    name: &str,
    region: &str,
    zone: &str,
    weight: u32,
    revision: u64,
) -> Arc<SignedLifecycle> {
    let mut rec = fx.lifecycle(name, revision, revision, Ready).record;
    rec.region = Region::new(region).unwrap();
    rec.endpoint.zone = shoal_proto::Zone::new(zone).unwrap();
    rec.endpoint.weight = weight;
    Arc::new(authority.sign_lifecycle(rec))
}

#[test]
fn pick_prefers_the_zone_then_the_region_and_never_crosses_regions_unasked() {
    let fx = Fixture::new();
    let far_key = SigningKey::from_seed([9; 32]);
    let mut keyring = fx.keyring.clone();
    keyring.trust_authority(Region::new("far").unwrap(), far_key.verifying_key());
    let a = &fx.authority;
    let mut c = Catalog::new();
    for rec in [
        placed(a, &fx, "z1-a", "test", "zone-1", 100, 1),
        placed(a, &fx, "z1-b", "test", "zone-1", 300, 2),
        placed(a, &fx, "z2-a", "test", "zone-2", 100, 3),
        placed(&far_key, &fx, "far-a", "far", "far-1", 100, 1),
    ] {
        assert_eq!(c.apply_lifecycle(rec, &keyring), MergeOutcome::Applied);
    }
    let me = (
        Region::new("test").unwrap(),
        shoal_proto::Zone::new("zone-1").unwrap(),
    );
    let pick = |exclude: &[&str], allow: bool, r: u64| -> Option<String> {
        let cands = c
            .routable(&fx.key, &AllAlive)
            .filter(|e| !exclude.contains(&e.lifecycle().record.instance.as_str()));
        view::pick(cands, &me.0, &me.1, allow, r).map(|e| e.lifecycle().record.instance.to_string())
    };

    // Same zone first, weighted 100:300 in instance-id order.
    assert_eq!(pick(&[], false, 0).as_deref(), Some("z1-a"));
    assert_eq!(pick(&[], false, 99).as_deref(), Some("z1-a"));
    assert_eq!(pick(&[], false, 100).as_deref(), Some("z1-b"));
    assert_eq!(pick(&[], false, 399).as_deref(), Some("z1-b"));
    assert_eq!(
        pick(&[], false, 400).as_deref(),
        Some("z1-a"),
        "r wraps modulo 400"
    );
    let share_b = (0..4_000u64)
        .filter(|r| pick(&[], false, *r).as_deref() == Some("z1-b"))
        .count();
    assert_eq!(share_b, 3_000);
    // Then the same region.
    assert_eq!(pick(&["z1-a", "z1-b"], false, 7).as_deref(), Some("z2-a"));
    // Never another region without policy: "no backend".
    assert_eq!(pick(&["z1-a", "z1-b", "z2-a"], false, 7), None);
    assert_eq!(
        pick(&["z1-a", "z1-b", "z2-a"], true, 7).as_deref(),
        Some("far-a")
    );
    // Allowing other regions does not make them preferred.
    assert_eq!(pick(&["z1-a", "z1-b"], true, 7).as_deref(), Some("z2-a"));
    assert_eq!(view::pick(std::iter::empty(), &me.0, &me.1, true, 1), None);
}

#[test]
fn locality_tiers() {
    let r = |s: &str| Region::new(s).unwrap();
    let z = |s: &str| shoal_proto::Zone::new(s).unwrap();
    assert_eq!(view::locality_tier(&r("a"), &z("a1"), &r("a"), &z("a1")), 0);
    assert_eq!(view::locality_tier(&r("a"), &z("a2"), &r("a"), &z("a1")), 1);
    assert_eq!(view::locality_tier(&r("b"), &z("a1"), &r("a"), &z("a1")), 2);
}
