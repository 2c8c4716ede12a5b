//! Workload identity on the local socket, with real processes: an agent (run as root by the
//! test) whose socket two unprivileged unix users can open, and `curl --unix-socket` clients
//! spawned as those users (`CommandExt::uid/gid`). User A must not be able to touch what user
//! B registered; every refusal is a 403 with a reason, counted, and never reaches the
//! authority; B's own writes land in the authority's audit log under B's uid.
//!
//! Needs root and the users `shoal-test-a` / `shoal-test-b` (`.ci/run` creates them). Without
//! them it prints a SKIP line, unless `SHOAL_REQUIRE_UNIX_USERS=1` (set by `.ci/run`).

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const METRICS: &str = "127.0.41.1:29541";

fn refused_writes(m: &str) -> f64 {
    metric_sum(m, "shoal_api_writes_total", &[("result", "refused")])
}

/// Audit entries of the dev authority (JSON lines in its data dir).
fn audit(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Gives the one agent of `c` the policy of these tests (users A and B may register and change
/// their own instances of `prod/*`, nothing more), metrics on `metrics` and a socket both
/// users can open; starts it.
fn start_with_user_policy(c: &mut Cluster, metrics: &str) {
    {
        use std::os::unix::fs::PermissionsExt;
        // The users must be able to reach the socket inside the (0700) temp dir.
        std::fs::set_permissions(c.tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let agent = &mut c.agents[0];
    let text = std::fs::read_to_string(&agent.config).unwrap();
    assert!(
        text.contains("dev_allow_all = true"),
        "harness uses the dev policy"
    );
    let policy = format!(
        "[[access.grants]]\nusers = [\"{USER_A}\", \"{USER_B}\"]\nservices = [\"prod/*\"]\nrights = [\"register\", \"change_own\"]\n"
    );
    let text = text
        .replace("dev_allow_all = true\n", &policy)
        .replace(
            "cluster_size = 8\n",
            &format!("cluster_size = 8\nmetrics = \"{metrics}\"\n"),
        )
        .replace("[api]\n", "[api]\nsocket_mode = 0o666\n");
    std::fs::write(&agent.config, text).unwrap();
    agent.start();
    eventually(Duration::from_secs(20), "agent answers", || {
        agent.get("/v1/agent/self").map(|_| ())
    });
    assert!(!agent.log().contains("DEVELOPMENT ACCESS POLICY"));
}

fn reg(addr: &str, inst: &str) -> String {
    format!("{{\"instance\":\"{inst}\",\"address\":\"{addr}\"}}")
}

#[test]
fn user_a_cannot_touch_user_b_instances() {
    let Some((a, b)) = users_or_skip("user_a_cannot_touch_user_b_instances") else {
        return;
    };
    let mut c = Cluster::new(41, 1);
    start_with_user_policy(&mut c, METRICS);
    let audit_path = c.tmp.path().join("data-node-a/audit.log");
    let agent = &mut c.agents[0];
    let sock = agent.socket.clone();

    // B registers web-b1: B owns it.
    let (code, v) = curl_as(
        b,
        &sock,
        "POST",
        &format!("{SVC}/register"),
        Some(&reg("10.0.0.9:8080", "web-b1")),
    );
    assert_eq!(code, 200, "B registers: {v}");
    assert_eq!(state_at(agent, "web-b1").unwrap().0, "STARTING");

    let before = metrics_text(METRICS);
    let refused0 = refused_writes(&before);
    let audit_len0 = audit(&audit_path).len();

    // A, step by step: every write on B's instance is a 403 with a reason.
    let mut refusals = 0;
    let mut expect_403 =
        |what: &str, method: &str, path: &str, body: Option<&str>, reason: &str| {
            let (code, v) = curl_as(a, &sock, method, path, body);
            assert_eq!(code, 403, "A {what}: expected 403, got {code} {v}");
            assert_eq!(v["reason"], reason, "A {what}: {v}");
            assert!(
                v["error"].as_str().is_some_and(|e| e.len() > 20),
                "A {what}: a sentence: {v}"
            );
            assert_eq!(v["uid"], a.0, "A {what}: {v}");
            refusals += 1;
        };
    let inst = format!("{SVC}/instances/web-b1");
    expect_403(
        "re-registers B's instance id at its own address",
        "POST",
        &format!("{SVC}/register"),
        Some(&reg("10.0.0.66:8080", "web-b1")),
        "not_owner",
    );
    for action in ["ready", "drain", "deregister"] {
        expect_403(
            action,
            "POST",
            &format!("{inst}/{action}"),
            None,
            "not_owner",
        );
    }
    for outcome in ["timeout", "ok"] {
        expect_403(
            &format!("reports {outcome} (eject)"),
            "POST",
            &format!("{SVC}/report"),
            Some(&format!(
                "{{\"instance\":\"web-b1\",\"outcome\":\"{outcome}\",\"eject_ms\":600000}}"
            )),
            "not_granted",
        );
    }
    let exec_probe = "{\"instance\":\"web-a1\",\"address\":\"10.0.0.5:8080\",\"probes\":{\"readiness\":{\"action\":{\"exec\":{\"command\":[\"/bin/sh\",\"-c\",\"id > /tmp/pwned\"]}}}}}";
    expect_403(
        "registers an exec probe while exec probes are disabled",
        "POST",
        &format!("{SVC}/register"),
        Some(exec_probe),
        "exec_probes_disabled",
    );
    expect_403(
        "registers a fresh instance id at B's address (traffic hijack)",
        "POST",
        &format!("{SVC}/register"),
        Some(&reg("10.0.0.9:8080", "a-evil")),
        "address_in_use",
    );
    // A probe aimed at another host is refused too (400: bad input, not a permission).
    let (code, v) = curl_as(
        a,
        &sock,
        "POST",
        &format!("{SVC}/register"),
        Some("{\"instance\":\"web-a2\",\"address\":\"10.0.0.5:8080\",\"probes\":{\"readiness\":{\"action\":{\"http\":{\"address\":\"169.254.169.254:80\",\"path\":\"/latest\"}}}}}"),
    );
    assert_eq!(
        (code, v["reason"].as_str()),
        (400, Some("probe_target")),
        "{v}"
    );
    // Nothing changed: B's instance is still STARTING and not ejected.
    let (_, v) = agent.get(&format!("{SVC}/endpoints")).unwrap();
    let e = endpoint(&v, "web-b1").unwrap();
    assert_eq!(
        (e["state"].as_str(), e["ejected"].as_bool()),
        (Some("STARTING"), Some(false)),
        "{e}"
    );
    // Each refusal counted (refused writes never reached the authority: no new audit entry).
    let after = metrics_text(METRICS);
    assert_eq!(
        refused_writes(&after) - refused0,
        refusals as f64,
        "{after}"
    );
    assert!(
        metric_sum(
            &after,
            "shoal_api_refusals_total",
            &[("reason", "not_owner")]
        ) >= 4.0
    );
    assert_eq!(
        audit(&audit_path).len(),
        audit_len0,
        "refused writes must not reach the authority"
    );
    // Logged once per (caller, route, reason): the two report refusals give one line.
    let log = strip_ansi(&agent.log());
    let lines = |needle: &str| {
        log.lines()
            .filter(|l| l.contains("local API write refused") && l.contains(needle))
            .count()
    };
    assert_eq!(lines("route=\"report\""), 1, "{log}");
    assert_eq!(lines("code=\"not_owner\""), 4, "{log}");

    // B's own changes succeed and are audited under B's uid.
    for action in ["ready", "drain"] {
        let (code, v) = curl_as(b, &sock, "POST", &format!("{inst}/{action}"), None);
        assert_eq!(code, 200, "B {action}: {v}");
    }
    assert_eq!(state_at(agent, "web-b1").unwrap().0, "DRAINING");
    let entries = audit(&audit_path);
    let by_b: Vec<&Value> = entries
        .iter()
        .filter(|e| e["on_behalf_of"]["uid"] == b.0)
        .collect();
    assert_eq!(by_b.len(), 3, "register, ready, drain by B: {entries:?}");
    for e in &by_b {
        assert_eq!(e["on_behalf_of"]["gid"], b.1, "{e}");
        assert!(e["on_behalf_of"]["pid"].as_u64().is_some(), "{e}");
        assert!(
            e["on_behalf_of"]["exe"]
                .as_str()
                .is_some_and(|x| x.ends_with("curl")),
            "{e}"
        );
        assert!(e["outcome"].get("Accepted").is_some(), "{e}");
    }
    assert!(
        entries.iter().all(|e| e["on_behalf_of"]["uid"] != a.0),
        "{entries:?}"
    );
    let accepted = metric_sum(
        &metrics_text(METRICS),
        "shoal_api_writes_total",
        &[("result", "accepted")],
    );
    assert!(accepted >= 3.0);

    // Ownership survives an agent restart: A still may not, B still may.
    agent.stop();
    agent.start();
    eventually(Duration::from_secs(20), "agent answers again", || {
        agent.get("/v1/agent/self").map(|_| ())
    });
    let (code, v) = curl_as(a, &sock, "POST", &format!("{inst}/deregister"), None);
    assert_eq!(
        (code, v["reason"].as_str()),
        (403, Some("not_owner")),
        "{v}"
    );
    let (code, v) = curl_as(b, &sock, "POST", &format!("{inst}/deregister"), None);
    assert_eq!(code, 200, "B deregisters after a restart: {v}");
}

/// The QA repro of a torn `owners.json`: after the restart nobody's ownership is trusted, but
/// the addresses stay taken (no hijack by a fresh instance id), the torn file is kept aside
/// byte for byte and never overwritten, and the agent says where it is.
#[test]
fn a_torn_owners_file_keeps_addresses_taken_and_is_kept_aside() {
    let Some((a, b)) = users_or_skip("a_torn_owners_file_keeps_addresses_taken_and_is_kept_aside")
    else {
        return;
    };
    const METRICS2: &str = "127.0.42.1:29542";
    let mut c = Cluster::new(42, 1);
    start_with_user_policy(&mut c, METRICS2);
    let data = c.tmp.path().join("data-node-a");
    let agent = &mut c.agents[0];
    let sock = agent.socket.clone();
    // B owns web-b1 at 10.0.0.8:8080 and a few more instances; A is refused its address.
    for i in 0..20 {
        let (code, v) = curl_as(
            b,
            &sock,
            "POST",
            &format!("{SVC}/register"),
            Some(&reg(
                &format!("10.0.1.{i}:8080"),
                &format!("web-b{}", i + 10),
            )),
        );
        assert_eq!(code, 200, "B registers: {v}");
    }
    let (code, v) = curl_as(
        b,
        &sock,
        "POST",
        &format!("{SVC}/register"),
        Some(&reg("10.0.0.8:8080", "web-b1")),
    );
    assert_eq!(code, 200, "B registers web-b1: {v}");
    let (code, v) = curl_as(
        a,
        &sock,
        "POST",
        &format!("{SVC}/register"),
        Some(&reg("10.0.0.8:8080", "a-evil")),
    );
    assert_eq!(
        (code, v["reason"].as_str()),
        (403, Some("address_in_use")),
        "{v}"
    );
    // The same socket spelled as an IPv4-mapped IPv6 address is the same address (QA: these
    // were accepted, and DNS then served B's backend under A's instance).
    for (i, spelling) in ["[::ffff:10.0.0.8]:8080", "[::ffff:a00:8]:8080"]
        .into_iter()
        .enumerate()
    {
        let (code, v) = curl_as(
            a,
            &sock,
            "POST",
            &format!("{SVC}/register"),
            Some(&reg(spelling, &format!("a-evil-v6-{i}"))),
        );
        assert_eq!(
            (code, v["reason"].as_str()),
            (403, Some("address_in_use")),
            "{spelling}: {v}"
        );
    }
    // An app registers in its agent's zone only (QA: a `zone-1` claim from a `zone-2` agent
    // took every pick of `zone-1` callers).
    let (code, v) = curl_as(
        a,
        &sock,
        "POST",
        &format!("{SVC}/register"),
        Some("{\"instance\":\"a-elsewhere\",\"address\":\"10.0.9.9:8080\",\"zone\":\"z9\"}"),
    );
    assert_eq!(
        (code, v["reason"].as_str()),
        (403, Some("zone_not_local")),
        "{v}"
    );

    // Stop, tear owners.json (as `head -c N`), start again.
    agent.stop();
    let owners = data.join("owners.json");
    let full = std::fs::read(&owners).unwrap();
    let torn = full[..full.len() / 2].to_vec();
    std::fs::write(&owners, &torn).unwrap();
    agent.start();
    eventually(Duration::from_secs(20), "agent answers again", || {
        agent.get("/v1/agent/self").map(|_| ())
    });
    eventually(
        Duration::from_secs(20),
        "web-b1 restored from the snapshot",
        || state_at(agent, "web-b1").map(|_| ()),
    );

    // Kept aside, byte for byte, and the log names it.
    let aside: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("owners.json.corrupt-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), torn);
    let log = strip_ansi(&agent.log());
    assert!(
        log.contains("owners file unreadable; moved aside to")
            && log.contains(&*aside[0].to_string_lossy()),
        "{log}"
    );

    // Ownership unknown: B may not change web-b1 (safe), and A may not take its address.
    let (code, v) = curl_as(
        b,
        &sock,
        "POST",
        &format!("{SVC}/instances/web-b1/drain"),
        None,
    );
    assert_eq!(
        (code, v["reason"].as_str()),
        (403, Some("owner_unknown")),
        "{v}"
    );
    for (who, inst) in [(a, "e-new"), (b, "b-new")] {
        let (code, v) = curl_as(
            who,
            &sock,
            "POST",
            &format!("{SVC}/register"),
            Some(&reg("10.0.0.8:8080", inst)),
        );
        assert_eq!(
            (code, v["reason"].as_str()),
            (403, Some("address_in_use")),
            "uid {} registering {inst} at web-b1's address: {v}",
            who.0
        );
    }
    assert_eq!(state_at(agent, "e-new"), None);

    // A free address still works and starts a fresh owners.json; the torn file stays aside.
    let (code, v) = curl_as(
        a,
        &sock,
        "POST",
        &format!("{SVC}/register"),
        Some(&reg("10.0.0.77:8080", "web-a1")),
    );
    assert_eq!(code, 200, "A registers at a free address: {v}");
    let fresh: Value = serde_json::from_slice(&std::fs::read(&owners).unwrap()).unwrap();
    assert_eq!(fresh.as_array().map(Vec::len), Some(1), "{fresh}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), torn);
    let m = metrics_text(METRICS2);
    assert_eq!(
        metric_sum(
            &m,
            "shoal_files_set_aside_total",
            &[("file", "owners.json")]
        ),
        1.0,
        "{m}"
    );
}

/// With `[access] reads = "granted"` the metrics port (no caller identity) must not list the
/// service keys the socket refuses to ungranted callers: the per-service series are exported
/// once, summed, under `service="_withheld"`, unless the operator opts in with
/// `metrics_service_labels = true`. Needs no other unix user (the test is root: an admin).
#[test]
fn granted_reads_keep_service_keys_off_the_metrics_port() {
    const METRICS3: &str = "127.0.43.1:29543";
    let mut c = Cluster::new(43, 1);
    let agent = &mut c.agents[0];
    let text = std::fs::read_to_string(&agent.config).unwrap();
    let granted = text
        .replace("dev_allow_all = true\n", "reads = \"granted\"\n")
        .replace(
            "cluster_size = 8\n",
            &format!("cluster_size = 8\nmetrics = \"{METRICS3}\"\n"),
        );
    std::fs::write(&agent.config, &granted).unwrap();
    agent.start();
    eventually(Duration::from_secs(20), "agent answers", || {
        agent.get("/v1/agent/self").map(|_| ())
    });
    register_ready(agent, "web-1", "10.0.0.7:8080");
    let withheld = [("service", "_withheld")];
    let m = eventually(Duration::from_secs(20), "the summed ready series", || {
        let m = metrics_text(METRICS3);
        (metric_sum(&m, "shoal_ready_endpoints", &withheld) == 1.0).then_some(m)
    });
    assert!(
        !m.contains("prod/web/http"),
        "a service key on /metrics:\n{m}"
    );
    assert!(
        m.lines()
            .filter(|l| l.starts_with("shoal_no_backend_total"))
            .all(|l| l.contains("service=\"_withheld\"")),
        "{m}"
    );
    // A pick of an unknown service answers 503 and is counted without its name.
    let (code, _) = agent
        .get("/v1/services/prod/secret-payments/http/pick")
        .unwrap();
    assert_eq!(code, 503);
    let m = metrics_text(METRICS3);
    assert!(!m.contains("secret-payments"), "{m}");
    assert_eq!(
        metric_sum(&m, "shoal_no_backend_total", &withheld),
        1.0,
        "{m}"
    );
    assert!(strip_ansi(&agent.log()).contains("per-service metric series withheld"));

    // The explicit opt-in exports them (and says so at start).
    agent.stop();
    std::fs::write(
        &agent.config,
        granted.replace(
            "cluster_size = 8\n",
            "cluster_size = 8\nmetrics_service_labels = true\n",
        ),
    )
    .unwrap();
    agent.start();
    eventually(Duration::from_secs(20), "the per-service series", || {
        let m = metrics_text(METRICS3);
        (metric_sum(&m, "shoal_ready_endpoints", &[("service", "prod/web/http")]) == 1.0)
            .then_some(())
    });
    assert!(strip_ansi(&agent.log()).contains("/metrics shows every service key"));
}
