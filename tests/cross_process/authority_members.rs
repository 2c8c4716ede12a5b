//! Membership change on real processes (issue 14 item 3,
//! docs/adr/0009-authority-membership-change.md): `shoal authority members add|remove|list`
//! replaces one replica of three (the leader) while three agents write; no acknowledged write
//! is lost and every agent ends with every acknowledged write's revision. Also the refusals:
//! a non-operator, a duplicate node, a removal that would leave no live majority, the last
//! voter.
//!
//! The harness is `common/authority.rs`. Every wait polls with a bounded deadline.

mod common;

use std::sync::atomic::Ordering;

use common::eventually;

#[path = "common/authority.rs"]
mod authority;

use authority::*;

#[test]
fn replace_the_leader_of_three_under_write_load_loses_no_acknowledged_write() {
    // auth-1..3 voters, auth-4 a spare (`join = true`), three agents.
    let mut r = Region3::with_replicas(71, 3, 1, 3);
    r.start_all();
    for a in &r.agents {
        wait_members(a, 5);
    }
    let leader = eventually(WAIT, "a leader", || leader_index(&r));

    // A node certificate is not an operator.
    let dir = r.tmp.path().to_owned();
    let (ok, _, err) = members_cmd_as(
        &r,
        leader,
        &dir.join("dev-node-node-a.pem"),
        &dir.join("dev-node-node-a-key.pem"),
        &["remove", "--id", "2"],
    );
    assert!(!ok && err.contains("not_allowed"), "{err}");
    let (ok, v, err) = members_cmd(&r, leader, &["list"]);
    assert!(ok, "{err}");
    assert_eq!(voters_of(&v), vec![1, 2, 3], "{v}");

    let (stop, writer) = spawn_workload(&r, 6, 71);
    eventually(WAIT, "writes under way", || {
        let (_, v) = r.agents[0].get(&format!("{SVC}/endpoints"))?;
        (v["endpoints"].as_array()?.len() >= 6).then_some(())
    });
    let ip4 = auth_ip(r.subnet, 3);
    let raft4 = format!("{ip4}:{RAFT_PORT}");
    let rpc4 = format!("{ip4}:{RPC_PORT}");
    // A node id already in the set: refused before anything is proposed.
    let (ok, _, err) = members_cmd(
        &r,
        leader,
        &[
            "add",
            "--id",
            "9",
            "--node",
            "auth-2",
            "--raft-addr",
            &raft4,
            "--rpc-addr",
            &rpc4,
        ],
    );
    assert!(!ok && err.contains("member_exists"), "{err}");

    // Replace the leader: start the spare, add it (learner, then voter), remove the leader.
    r.auths[3].start();
    let (ok, v, err) = members_cmd(
        &r,
        leader,
        &[
            "add",
            "--id",
            "4",
            "--node",
            "auth-4",
            "--raft-addr",
            &raft4,
            "--rpc-addr",
            &rpc4,
        ],
    );
    assert!(ok, "members add: {err}");
    assert_eq!(voters_of(&v), vec![1, 2, 3, 4], "{v}");
    let old = leader as u64 + 1;
    let (ok, v, err) = members_cmd(&r, leader, &["remove", "--id", &old.to_string()]);
    assert!(ok, "members remove {old}: {err}");
    let mut want: Vec<u64> = (1..=4).filter(|i| *i != old).collect();
    want.sort();
    assert_eq!(voters_of(&v), want, "{v}");
    // The removed leader steps down once the configuration without it committed; stop it.
    r.auths[leader].kill9();
    let new_leader = eventually(WAIT, "a leader among the remaining voters", || {
        leader_index(&r).filter(|l| *l != leader)
    });
    // Writes keep being acknowledged by the new set.
    let acked_before = count_acks_in_audit(&r, new_leader);
    eventually(WAIT, "writes acknowledged after the replacement", || {
        (count_acks_in_audit(&r, new_leader) > acked_before + 4).then_some(())
    });

    // Worst moment for a removal: one of the three remaining voters is down. Removing another
    // live voter would leave {down, live}: refused, nothing proposed.
    let down = want
        .iter()
        .map(|i| *i as usize - 1)
        .find(|i| *i != new_leader)
        .unwrap();
    r.auths[down].kill9();
    let other = want
        .iter()
        .map(|i| *i as usize - 1)
        .find(|i| *i != new_leader && *i != down)
        .unwrap();
    // The leader judges liveness by the last Raft answer (within quorum_stale_ms = 1 s here):
    // wait until it no longer counts the killed replica as live.
    eventually(WAIT, "the leader sees the killed replica silent", || {
        let (_, v, _) = members_cmd(&r, new_leader, &["list"]);
        v["members"]
            .as_array()?
            .iter()
            .find(|m| m["id"] == down as u64 + 1)?["last_heard_ms"]
            .as_u64()
            .filter(|ms| *ms > 1_000)
    });
    let (ok, _, err) = members_cmd(
        &r,
        new_leader,
        &["remove", "--id", &(other + 1).to_string()],
    );
    assert!(!ok && err.contains("would_lose_quorum"), "{err}");
    r.auths[down].start();

    stop.store(true, Ordering::Relaxed);
    let log = writer.join().unwrap();
    let history = check_history(&log);
    assert!(history.is_empty(), "history violations: {history:#?}");
    let agents: Vec<_> = r.agents.iter().collect();
    let diffs = check_agents(&agents, &log, WAIT);
    eprintln!(
        "replaced auth-{old} (leader) by auth-4 under load: {} writes acknowledged, {} attempts \
         without acknowledgement, {} idempotent repeats; agents differ: {}",
        log.acks.len(),
        log.unacked_attempts,
        log.repeats.len(),
        diffs.len()
    );
    assert!(
        diffs.is_empty(),
        "agents lost acknowledged writes: {diffs:#?}"
    );
    assert!(
        log.acks.len() >= 20,
        "too few writes to mean anything: {}",
        log.acks.len()
    );

    // The final set lists three voters; every replica audited each membership entry once.
    let (ok, v, err) = members_cmd(&r, new_leader, &["list"]);
    assert!(ok, "{err}");
    assert_eq!(voters_of(&v), want, "{v}");
    for i in want.iter().map(|i| *i as usize - 1) {
        let text =
            std::fs::read_to_string(r.tmp.path().join(format!("data-auth-{}/audit.log", i + 1)))
                .unwrap_or_default();
        let idx: Vec<u64> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["membership"]["log_index"].as_u64())
            .collect();
        let mut dedup = idx.clone();
        dedup.dedup();
        assert_eq!(
            idx,
            dedup,
            "auth-{}: a membership entry audited twice",
            i + 1
        );
        assert!(
            idx.len() >= 3,
            "auth-{}: membership entries audited: {idx:?}",
            i + 1
        );
    }
    let leader_audit = std::fs::read_to_string(
        r.tmp
            .path()
            .join(format!("data-auth-{}/audit.log", leader + 1)),
    )
    .unwrap();
    assert!(
        leader_audit.contains("\"membership_change\""),
        "the change is audited where it was handled"
    );
}

/// Committed lifecycle audit entries at replica `i` (a progress measure).
fn count_acks_in_audit(r: &Region3, i: usize) -> usize {
    std::fs::read_to_string(r.tmp.path().join(format!("data-auth-{}/audit.log", i + 1)))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"log_index\"") && !l.contains("membership"))
        .count()
}

#[test]
fn a_single_voter_refuses_to_remove_itself() {
    let mut r = Region3::with_replicas(72, 3, 0, 1);
    r.start_all();
    wait_members(&r.agents[0], 3);
    let leader = eventually(WAIT, "a leader", || leader_index(&r));
    // Shrink to one voter (two removals), then the last one is refused.
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    for o in &others {
        let (ok, _, err) = members_cmd(&r, leader, &["remove", "--id", &(o + 1).to_string()]);
        assert!(ok, "remove {}: {err}", o + 1);
    }
    let (ok, v, err) = members_cmd(&r, leader, &["list"]);
    assert!(ok, "{err}");
    assert_eq!(voters_of(&v), vec![leader as u64 + 1], "{v}");
    let (ok, _, err) = members_cmd(&r, leader, &["remove", "--id", &(leader + 1).to_string()]);
    assert!(!ok && err.contains("last_voter"), "{err}");
    // A single voter still commits writes.
    register(&r.agents[0], "solo-1", None);
}

/// The runbook "Rebuild a region after a restore" (docs/operations.md), by the CLI: a backup
/// of a running region, every replica stopped, the backup restored into auth-1 as the only
/// voter, auth-1 started alone, auth-2 and auth-3 wiped, started with `join = true` and added
/// one at a time; then a write is above the floor and reaches every agent.
#[test]
fn rebuild_a_region_from_one_restored_replica() {
    let mut r = Region3::with_replicas(73, 3, 0, 2);
    r.start_all();
    for a in &r.agents {
        wait_members(a, 4);
    }
    register(&r.agents[0], "rb-1", None);
    transition(&r.agents[0], "rb-1", "ready");
    let dir = r.tmp.path().to_owned();
    let backup = dir.join("backup.snap");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(common::shoal_bin())
            .args(["authority", "snapshot"])
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "snapshot {args:?}: {text}");
        text
    };
    let data = |i: usize| dir.join(format!("data-auth-{i}"));
    run(&[
        "save",
        backup.to_str().unwrap(),
        "--data-dir",
        data(1).to_str().unwrap(),
    ]);
    for a in &mut r.auths {
        a.kill9();
    }
    // The floor: the largest revision / generation the agents hold.
    let floor = r
        .agents
        .iter()
        .filter_map(|a| endpoint_at(a, "rb-1"))
        .map(|e| {
            e["revision"]
                .as_u64()
                .unwrap()
                .max(e["generation"].as_u64().unwrap())
        })
        .max()
        .unwrap();
    let floor_s = floor.to_string();
    run(&[
        "restore",
        backup.to_str().unwrap(),
        "--data-dir",
        data(1).to_str().unwrap(),
        "--floor",
        &floor_s,
        "--force-new-cluster",
        "--single-voter",
        "1",
    ]);
    r.auths[0].start();
    eventually(WAIT, "auth-1 leads alone", || {
        let v = replica_status(&r, 0)?;
        (v["leader"] == "auth-1" && v["members"] == serde_json::json!(["auth-1"])).then_some(())
    });
    for i in 1..3 {
        std::fs::rename(data(i + 1), dir.join(format!("wiped-auth-{}", i + 1))).unwrap();
        let text = std::fs::read_to_string(&r.auths[i].config).unwrap();
        std::fs::write(&r.auths[i].config, format!("join = true\n{text}")).unwrap();
        r.auths[i].start();
        let ip = auth_ip(r.subnet, i);
        let (ok, v, err) = members_cmd(
            &r,
            0,
            &[
                "add",
                "--id",
                &(i + 1).to_string(),
                "--node",
                &format!("auth-{}", i + 1),
                "--raft-addr",
                &format!("{ip}:{RAFT_PORT}"),
                "--rpc-addr",
                &format!("{ip}:{RPC_PORT}"),
            ],
        );
        assert!(ok, "members add {}: {err}", i + 1);
        assert_eq!(voters_of(&v), (1..=i as u64 + 1).collect::<Vec<_>>(), "{v}");
    }
    let cluster = replica_status(&r, 0).unwrap()["cluster_id"].clone();
    assert!(cluster.is_string(), "a restored cluster has an id");
    for i in 1..3 {
        eventually(WAIT, "the added replica runs the new incarnation", || {
            (replica_status(&r, i)?["cluster_id"] == cluster).then_some(())
        });
    }
    // A write after the rebuild is above the floor and reaches every agent.
    transition(&r.agents[0], "rb-1", "drain");
    for a in &r.agents {
        let e = wait_state(a, "rb-1", "DRAINING");
        assert!(e["revision"].as_u64().unwrap() > floor, "{e}");
    }
}
