//! Five real agents: auto-join from one seed, registration and drain visible everywhere,
//! `kill -9` detected within the configured bound, restart as a new generation.

mod common;

use std::time::{Duration, Instant};

use common::*;

#[test]
fn five_agents_join_register_drain_kill_restart() {
    let mut c = Cluster::new(31, 5);
    c.start_all();
    c.wait_converged(5, Duration::from_secs(20));

    // An instance registered on B becomes visible (READY, routable) at every agent.
    register_ready(&c.agents[1], "web-b", "10.1.0.2:80");
    let mut ready_times = Vec::new();
    for a in &c.agents {
        eventually(
            Duration::from_secs(10),
            &format!("web-b READY at {}", a.name),
            || (state_at(a, "web-b")? == ("READY".into(), true)).then_some(()),
        );
        ready_times.push(record_times(a, "web-b", "READY"));
    }
    // Drain on B: DRAINING at all.
    let (code, v) = c.agents[1]
        .post(&format!("{SVC}/instances/web-b/drain"), "")
        .unwrap();
    assert_eq!(code, 200, "{v}");
    for (a, (ready_committed, ready_applied)) in c.agents.iter().zip(&ready_times) {
        eventually(
            Duration::from_secs(10),
            &format!("web-b DRAINING at {}", a.name),
            || (state_at(a, "web-b")? == ("DRAINING".into(), false)).then_some(()),
        );
        // Every agent stamps the DRAINING record when it applies it: after the commit (one
        // host, one wall clock) and after it applied the READY record.
        let (committed, applied) = record_times(a, "web-b", "DRAINING");
        assert!(committed >= *ready_committed, "{}: commit times", a.name);
        assert!(applied > *ready_applied, "{}: apply times", a.name);
    }

    // C's instance is routable everywhere, then C dies without a word.
    register_ready(&c.agents[2], "web-c", "10.1.0.3:80");
    for a in &c.agents {
        eventually(
            Duration::from_secs(10),
            &format!("web-c READY at {}", a.name),
            || (state_at(a, "web-c")? == ("READY".into(), true)).then_some(()),
        );
    }
    c.agents[2].kill9();
    let killed = Instant::now();
    let bound = detection_bound();
    for a in c.agents.iter().filter(|a| a.child.is_some()) {
        eventually(bound, &format!("web-c unroutable at {}", a.name), || {
            let (state, routable) = state_at(a, "web-c")?;
            (!routable).then_some(state)
        });
    }
    let took = killed.elapsed();
    assert!(took <= bound, "detection took {took:?} > {bound:?}");
    // Pick never hands out the dead node's endpoint (and B's is draining): no backend.
    let (code, v) = c.agents[0].get(&format!("{SVC}/pick")).unwrap();
    assert_eq!(code, 503, "{v}");
    assert_eq!(v["error"], "no backend");

    // C restarts: a new boot generation joins, the old identity is gone everywhere.
    c.agents[2].start();
    for a in c.agents.iter() {
        eventually(
            Duration::from_secs(20),
            &format!("{} sees node-c boot 2 only", a.name),
            || {
                let (_, v) = a.get("/v1/agent/members")?;
                let cs: Vec<u64> = v["members"]
                    .as_array()?
                    .iter()
                    .filter(|m| m["node"] == "node-c")
                    .filter_map(|m| m["boot"].as_u64())
                    .collect();
                (cs == vec![2]).then_some(())
            },
        );
    }
}

/// `(committed_at_ms, applied_at_ms)` of `instance` at `agent`, which must be in `state`;
/// checks both are set and applied >= committed.
fn record_times(agent: &Agent, instance: &str, state: &str) -> (u64, u64) {
    let (_, v) = agent.get(&format!("{SVC}/endpoints")).unwrap();
    let e = endpoint(&v, instance).unwrap();
    assert_eq!(e["state"], state, "{}: {e}", agent.name);
    let committed = e["committed_at_ms"].as_u64().unwrap();
    let applied = e["applied_at_ms"].as_u64();
    let applied = applied.unwrap_or_else(|| panic!("{}: no applied_at_ms: {e}", agent.name));
    assert!(committed > 0, "{}: {e}", agent.name);
    assert!(
        applied >= committed,
        "{}: applied before commit: {e}",
        agent.name
    );
    (committed, applied)
}
