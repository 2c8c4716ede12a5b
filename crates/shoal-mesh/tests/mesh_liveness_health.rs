//! Specification of derived liveness and owner-signed health in `shoal_mesh::Mesh`: a dead node's
//! endpoints stop being routable everywhere with nothing sent per instance, and only the owner of
//! an instance may sign its health.

mod support;

use shoal_catalog::view::EndpointState;
use shoal_catalog::Liveness;
use shoal_mesh::mesh::Refusal;
use shoal_mesh::{Channel, Command, MeshEvent};
use shoal_proto::LifecycleState::Ready;
use shoal_proto::{Generation, HealthStatus, InstanceId, TransitionReason};
use support::{config, node_id, Cluster, SentExt};

const N: usize = 12;

fn routable_instances(c: &Cluster, i: usize) -> Vec<String> {
    let m = c.mesh(i);
    let liveness = m.liveness();
    m.catalog()
        .routable(&c.fixture.key, &liveness)
        .map(|e| e.lifecycle().record.instance.as_str().to_owned())
        .collect()
}

#[test]
fn a_crashed_nodes_endpoints_become_unroutable_everywhere_with_nothing_sent_per_instance() {
    let mut c = Cluster::formed(N, 11, config(N, |_| {}), 2_000);
    const DEAD: usize = 4;
    let mut records = Vec::new();
    for (r, owner) in [DEAD, DEAD, DEAD, 7].into_iter().enumerate() {
        records.push(c.record(&format!("x{r}"), owner, Ready));
    }
    c.publish(0, records);
    c.run_for(1_000);
    for i in 0..N {
        assert_eq!(routable_instances(&c, i), ["x0", "x1", "x2", "x3"]);
    }

    let crashed_at = c.now;
    let sent_before = c.sent.len();
    c.crash(DEAD);
    let dead = node_id(DEAD);
    let budget = c.config.membership.detection_budget(N).total_ms;
    let detected = c.run_until_true(crashed_at + 2 * budget, 100, |c| {
        c.live().all(|i| c.mesh(i).liveness().is_down(&dead))
    });
    let detected = detected.expect("SWIM declares the crashed node down") - crashed_at;
    eprintln!("every live node saw the crash after {detected} ms (budget {budget} ms)");
    assert!(detected <= budget);

    for i in c.live().collect::<Vec<_>>() {
        assert_eq!(routable_instances(&c, i), ["x3"], "node {i}");
        let m = c.mesh(i);
        let view = m.catalog().view(&c.fixture.key, &m.liveness());
        for e in view.endpoints.iter().filter(|e| e.node == dead) {
            assert!(e.owner_down);
            assert_eq!(e.state, EndpointState::Unhealthy);
        }
    }
    let carrying: usize = c.sent[sent_before..]
        .iter()
        .map(|s| s.lifecycle_records())
        .sum();
    assert_eq!(
        carrying, 0,
        "no lifecycle record needed to travel for the death"
    );
}

#[test]
fn health_for_another_nodes_instance_is_refused() {
    let mut c = Cluster::formed(N, 12, config(N, |_| {}), 2_000);
    let rec = c.record("h", 3, Ready);
    c.publish(3, vec![rec]);
    c.run_for(1_000);

    let sent_before = c.sent.len();
    let events_before = c.events.len();
    let at = c.now;
    let refused = c.command(
        5,
        Command::ReportHealth {
            key: c.fixture.key.clone(),
            instance: InstanceId::new("h").unwrap(),
            generation: Generation(1),
            status: HealthStatus::Failing,
            reason: TransitionReason::ReadinessFailed,
        },
    );
    assert_eq!(
        refused,
        Err(Refusal::NotOwnInstance {
            key: c.fixture.key.clone(),
            instance: InstanceId::new("h").unwrap(),
        })
    );
    assert_eq!(c.events.len(), events_before, "nothing reported");
    assert_eq!(c.mesh(5).counters().refused, 1);
    assert!(c.sent[sent_before..]
        .iter()
        .all(|s| s.at > at || s.channel == Channel::Datagram));
    c.run_for(2_000);
    for i in 0..N {
        assert!(c
            .mesh(i)
            .catalog()
            .entry(&c.fixture.key, &InstanceId::new("h").unwrap())
            .unwrap()
            .health()
            .is_none());
        assert_eq!(routable_instances(&c, i), ["h"]);
    }
}

#[test]
fn health_for_an_own_instance_of_another_generation_is_refused() {
    let mut c = Cluster::formed(4, 13, config(4, |_| {}), 1_000);
    let rec = c.record("h", 2, Ready);
    c.publish(2, vec![rec]);
    let refused = c.command(
        2,
        Command::ReportHealth {
            key: c.fixture.key.clone(),
            instance: InstanceId::new("h").unwrap(),
            generation: Generation(2),
            status: HealthStatus::Failing,
            reason: TransitionReason::ReadinessFailed,
        },
    );
    assert_eq!(
        refused,
        Err(Refusal::NotOwnInstance {
            key: c.fixture.key.clone(),
            instance: InstanceId::new("h").unwrap(),
        })
    );
    assert_eq!(c.mesh(2).counters().refused, 1);
}

#[test]
fn failing_health_from_the_owner_reaches_every_node_and_makes_the_endpoint_unhealthy() {
    let mut c = Cluster::formed(N, 14, config(N, |_| {}), 2_000);
    let recs = vec![c.record("h", 3, Ready), c.record("k", 3, Ready)];
    c.publish(0, recs);
    c.run_for(1_000);

    let at = c.now;
    let reported = c.command(
        3,
        Command::ReportHealth {
            key: c.fixture.key.clone(),
            instance: InstanceId::new("h").unwrap(),
            generation: Generation(1),
            status: HealthStatus::Failing,
            reason: TransitionReason::ReadinessFailed,
        },
    );
    assert_eq!(reported, Ok(()));
    c.run_for(1_000);

    let mut arrivals = Vec::new();
    for i in 0..N {
        let t = c
            .events
            .iter()
            .find_map(|(t, n, e)| match e {
                MeshEvent::HealthApplied(h) if *n == i => Some(*t),
                _ => None,
            })
            .expect("every node applies the health record");
        arrivals.push(t - at);
        let m = c.mesh(i);
        let view = m.catalog().view(&c.fixture.key, &m.liveness());
        let h = &view.endpoints[0];
        assert_eq!(h.instance.as_str(), "h");
        assert_eq!(h.health, Some(HealthStatus::Failing));
        assert_eq!(h.state, EndpointState::Unhealthy);
        assert!(!h.routable);
        let signed = m
            .catalog()
            .entry(&c.fixture.key, &h.instance)
            .unwrap()
            .health()
            .unwrap();
        assert_eq!(signed.record.owner, node_id(3));
        assert_eq!(routable_instances(&c, i), ["k"], "node {i}");
    }
    eprintln!("failing health arrivals {arrivals:?}");
    // Failing health is a withdrawal: held back only by the short urgent window per hop (a
    // few hops in a 12-node cluster), never by the ordinary coalescing window per hop.
    let bound = 4 * (c.config.urgent_coalesce_ms + 2);
    assert!(
        arrivals.iter().all(|&t| t <= bound),
        "arrivals {arrivals:?} over {bound} ms"
    );
}

#[test]
fn derived_liveness_is_swim_membership() {
    // Sanity of the getter: a node never seen is not down.
    let c = Cluster::formed(3, 15, config(3, |_| {}), 500);
    assert!(!c.mesh(0).liveness().is_down(&node_id(40)));
    assert!(!c.mesh(0).liveness().is_down(&node_id(1)));
}
