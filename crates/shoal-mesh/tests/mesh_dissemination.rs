//! Specification of record dissemination in `shoal_mesh::Mesh`: Plumtree eager push with
//! coalescing, PRUNE on duplicates, IHAVE/GRAFT and anti-entropy repair, late joiners, and
//! tombstone compaction answered by snapshots. Driven by `support::Cluster` in virtual time.

mod support;

use shoal_mesh::messages::{RecordPush, StreamMessage};
use shoal_proto::envelope::MessageKind;
use shoal_proto::LifecycleState::{Draining, Expired, Ready};
use support::{config, Cluster, SentExt, LATENCY_MS};

const N: usize = 16;
const WARM_UP_MS: u64 = 2_000;

#[test]
fn a_published_record_reaches_every_node_quickly() {
    let mut c = Cluster::formed(N, 1, config(N, |_| {}), WARM_UP_MS);
    let t0 = c.now;
    let rec = c.record("a", 3, Ready);
    c.publish(3, vec![rec]);
    c.run_for(2_000);

    let arrivals: Vec<u64> = (0..N)
        .map(|i| {
            c.applied_at(i, "a", 1)
                .expect("every node applies the record")
                - t0
        })
        .collect();
    let slowest = *arrivals.iter().max().expect("nodes");
    eprintln!("arrival ms: {arrivals:?}");
    assert_eq!(arrivals[3], 0, "the publisher applies at once");
    // Each hop of the eager tree waits at most one coalescing window plus the link latency.
    let hop = c.config.coalesce_ms + LATENCY_MS;
    assert!(
        slowest <= 4 * hop,
        "slowest arrival {slowest} ms > 4 hops of {hop} ms"
    );
    assert!(c.all_have_revision(1));
}

#[test]
fn a_draining_record_is_pushed_without_waiting_for_the_coalescing_window() {
    let cfg = config(N, |c| c.coalesce_ms = 300);
    let mut c = Cluster::formed(N, 2, cfg, WARM_UP_MS);

    let t0 = c.now;
    let ready = c.record("a", 5, Ready);
    c.publish(0, vec![ready]);
    c.run_for(3_000);
    let first_ready = (1..N)
        .filter_map(|i| c.applied_at(i, "a", 1))
        .min()
        .expect("the record spread")
        - t0;
    assert!(
        first_ready >= 300,
        "READY waits for the coalescing window at the publisher ({first_ready} ms)"
    );

    let t1 = c.now;
    let draining = c.record("a", 5, Draining);
    c.publish(0, vec![draining]);
    c.run_for(1_000);
    let arrivals: Vec<u64> = (0..N)
        .map(|i| c.applied_at(i, "a", 2).expect("every node gets DRAINING") - t1)
        .collect();
    eprintln!("READY first arrival {first_ready} ms; DRAINING arrivals {arrivals:?}");
    let slowest = *arrivals.iter().max().expect("nodes");
    assert!(
        slowest < c.config.coalesce_ms,
        "DRAINING took {slowest} ms, not less than one coalescing window"
    );
    // Pushed hop by hop, waiting only the short urgent window at each hop: a whole number of
    // (link latency + urgent window) steps.
    let hop = LATENCY_MS + c.config.urgent_coalesce_ms;
    assert!(
        arrivals.iter().all(|t| t % hop == 0),
        "arrivals {arrivals:?} are not whole hops of {hop} ms"
    );
}

#[test]
fn duplicate_pushes_prune_links_yet_every_node_gets_every_record() {
    let mut c = Cluster::formed(N, 3, config(N, |_| {}), WARM_UP_MS);
    const RECORDS: usize = 60;
    for r in 0..RECORDS {
        let origin = (r * 7) % N;
        let rec = c.record(&format!("i{r}"), origin, Ready);
        c.publish(origin, vec![rec]);
        c.run_for(30);
    }
    c.run_for(3_000);

    let prunes = c.total(|m| m.counters().prunes_sent);
    assert!(prunes > 0, "duplicate eager pushes must be pruned");
    for i in 0..N {
        let catalog = c.mesh(i).catalog();
        assert_eq!(catalog.len(), RECORDS, "node {i} holds every record");
        assert_eq!(catalog.region_head(&c.fixture.region).0, RECORDS as u64);
        assert_eq!(catalog.open_gaps(), 0);
    }
    // Pruning bounds both the links and the copies: every node keeps at most `eager_fanout`
    // eager links, and the records carried by pushes stay under one copy per eager link of
    // the receiver (what a mesh that never prunes sends).
    let fanout = c.mesh(0).config().eager_fanout;
    for i in 0..N {
        let (eager, _) = c.mesh(i).peer_sets();
        assert!(
            eager <= fanout,
            "node {i} has {eager} eager links, over {fanout}"
        );
    }
    let pushed_records: usize = c
        .sent
        .iter()
        .filter(|s| s.is(MessageKind::RecordPush))
        .map(|s| {
            let bytes = s.bytes.as_ref().expect("stream bytes are logged");
            match StreamMessage::decode(bytes, usize::MAX).expect("a push decodes") {
                StreamMessage::Push(p) => p.lifecycle.len() + p.health.len(),
                other => panic!("a push, not {other:?}"),
            }
        })
        .sum();
    let receipts = RECORDS * (N - 1);
    // Seed 3: 2,277 records pushed for 900 receipts (2.53 each); with PRUNE ignored 2,732
    // (3.04 each). The ceiling sits between them.
    assert!(
        pushed_records * 4 <= receipts * 11,
        "{pushed_records} records pushed for {receipts} receipts: more than 2.75 copies each"
    );
}

#[test]
fn a_node_cut_off_from_streams_catches_up_after_the_window() {
    let mut c = Cluster::formed(N, 4, config(N, |_| {}), WARM_UP_MS);
    for r in 0..5 {
        let rec = c.record(&format!("before{r}"), r, Ready);
        c.publish(r, vec![rec]);
    }
    c.run_for(1_000);
    assert!(c.all_have_revision(5));

    const P: usize = 9;
    c.cut_streams(P, 5_000);
    for r in 0..10 {
        let origin = (r * 5) % N;
        let origin = if origin == P { 0 } else { origin };
        let rec = c.record(&format!("during{r}"), origin, Ready);
        c.publish(origin, vec![rec]);
        c.run_for(200);
    }
    assert_eq!(
        c.mesh(P).catalog().region_head(&c.fixture.region).0,
        5,
        "the cut node missed every push"
    );
    c.run_until(c.now + 3_000); // the window ends
    let healed_at = c.now;
    // One more change after the heal: pushed to P on top of a hole.
    let rec = c.record("after", 1, Ready);
    c.publish(1, vec![rec]);

    let caught_up = c.run_until_true(healed_at + 10_000, 50, |c| {
        (0..N).all(|i| c.mesh(i).catalog() == c.mesh(0).catalog())
    });
    let caught_up = caught_up.expect("the cut node converges") - healed_at;
    let p = c.mesh(P);
    eprintln!(
        "caught up {caught_up} ms after heal; gaps {} grafts {} deltas {}",
        p.counters().gaps_detected,
        p.counters().grafts_sent,
        p.counters().deltas_received
    );
    assert_eq!(p.catalog().heads(), c.mesh(0).catalog().heads());
    assert_eq!(p.catalog().len(), 16);
    assert_eq!(p.catalog().open_gaps(), 0);
    assert!(p.counters().gaps_detected > 0, "the hole was noticed");
    assert!(
        p.counters().deltas_received > 0,
        "repair came as deltas (graft or anti-entropy)"
    );
}

#[test]
fn a_late_joiner_receives_the_whole_catalog_by_anti_entropy() {
    let mut c = Cluster::formed(N, 5, config(N + 1, |_| {}), WARM_UP_MS);
    for r in 0..20 {
        let rec = c.record(&format!("i{r}"), r % N, Ready);
        c.publish(r % N, vec![rec]);
    }
    c.run_for(1_000);
    assert!(c.all_have_revision(20));

    let j = c.add_node();
    let joined_at = c.now;
    c.join(j, vec![support::addr(0), support::addr(1)]);
    let done = c.run_until_true(joined_at + 20_000, 50, |c| {
        c.mesh(j).catalog() == c.mesh(0).catalog()
    });
    let took = done.expect("the joiner converges") - joined_at;
    let m = c.mesh(j);
    eprintln!(
        "joiner converged in {took} ms: ae rounds {} deltas {}",
        m.counters().anti_entropy_rounds,
        m.counters().deltas_received
    );
    assert_eq!(m.catalog().len(), 20);
    assert_eq!(m.catalog().heads(), c.mesh(0).catalog().heads());
    assert!(m.counters().deltas_received > 0);
    assert_eq!(
        m.counters().stream_in[MessageKind::RecordPush as usize].messages,
        0,
        "nothing was published after the join: only anti-entropy can have brought the records"
    );
    assert!(took <= 2 * c.config.anti_entropy_interval_ms + 2_000);
}

#[test]
fn after_compaction_a_returning_node_installs_a_snapshot_and_resurrects_nothing() {
    let cfg = config(N, |c| {
        c.tombstone_retention_ms = 2_000;
        c.gc_interval_ms = 500;
    });
    let mut c = Cluster::formed(N, 6, cfg, WARM_UP_MS);
    for (r, name) in ["a", "b", "c"].into_iter().enumerate() {
        let rec = c.record(name, r, Ready);
        c.publish(r, vec![rec]);
    }
    c.run_for(1_000);
    assert!(c.all_have_revision(3));

    const P: usize = 11;
    c.cut_streams(P, 12_000);
    let drain_a = c.record("a", 0, Draining);
    let expire_a = c.record("a", 0, Expired);
    let expire_b = c.record("b", 1, Expired);
    let new_d = c.record("d", 2, Ready);
    c.publish(4, vec![drain_a, expire_a, expire_b, new_d]);
    c.run_for(8_000);
    for i in (0..N).filter(|&i| i != P) {
        let catalog = c.mesh(i).catalog();
        assert_eq!(
            catalog.len(),
            2,
            "node {i} collected the tombstones of a and b"
        );
        assert_eq!(catalog.gc_floor(&c.fixture.region).0, 7);
    }
    assert_eq!(
        c.mesh(P).catalog().len(),
        3,
        "P still holds a and b as READY"
    );

    c.run_until(c.now + 4_000); // the window ends
    let healed_at = c.now;
    let done = c.run_until_true(healed_at + 20_000, 50, |c| {
        c.mesh(P).catalog().region_head(&c.fixture.region).0 == 7
    });
    done.expect("P catches up");
    c.run_for(10_000);

    let p = c.mesh(P);
    assert!(p.counters().snapshots_installed > 0);
    let names = |i: usize| -> Vec<String> {
        c.mesh(i)
            .catalog()
            .entries()
            .map(|(_, inst, e)| format!("{}@{}", inst.as_str(), e.lifecycle().record.revision.0))
            .collect()
    };
    for i in 0..N {
        assert_eq!(names(i), ["c@3", "d@7"], "node {i}");
        assert_eq!(c.mesh(i).catalog().region_head(&c.fixture.region).0, 7);
    }
    eprintln!(
        "P: snapshots installed {}, total snapshots sent {}",
        p.counters().snapshots_installed,
        c.total(|m| m.counters().snapshots_sent)
    );
}

#[test]
fn bootstrap_draws_every_link_from_the_whole_membership() {
    let c = Cluster::formed(N, 7, config(N, |_| {}), 0);
    for i in 0..N {
        let (eager, lazy) = c.mesh(i).peer_sets();
        assert_eq!(
            (eager, lazy),
            (c.config.eager_fanout, c.config.lazy_fanout),
            "node {i}: links drawn at once, not one link to the first member listed"
        );
    }
    let mut c = c;
    c.run_for(WARM_UP_MS);
    let busiest = (0..N).map(|i| c.mesh(i).peer_sets().0).max().unwrap();
    assert!(
        busiest < N - 1,
        "no member is everyone's eager peer (busiest has {busiest})"
    );
}

#[test]
fn a_redundant_push_is_pruned_even_from_a_peer_we_no_longer_push_to() {
    // Node 0 links to 1 only. Node 2 pushes it a record it already has: 2 is not one of its
    // links (we declared 2 down, or our earlier PRUNE was lost with a connection), yet 2 still
    // pushes to us. It must be told to stop, or it pushes every future record to us for
    // nothing.
    let mut c = Cluster::new(3, 8, config(3, |_| {}));
    let now = c.net.now;
    let members = vec![support::identity(1)];
    let rec = c.record("a", 1, Ready);
    let push = StreamMessage::Push(RecordPush {
        lifecycle: vec![rec],
        health: Vec::new(),
    })
    .encode(1 << 20)
    .unwrap();
    let m = &mut c.net.nodes[0].m;
    m.bootstrap(now, members);
    while m.poll_transmit().is_some() {}
    m.handle_stream_message(now, support::addr(1), &push);
    while m.poll_transmit().is_some() {}
    let prunes = m.counters().prunes_sent;

    m.handle_stream_message(now, support::addr(2), &push);
    let out: Vec<_> = std::iter::from_fn(|| m.poll_transmit()).collect();
    assert_eq!(m.counters().prunes_sent, prunes + 1);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].to, support::addr(2));
    assert_eq!(out[0].bytes[3], MessageKind::Prune as u8);
}

#[test]
fn after_churn_from_many_origins_a_draining_record_still_meets_the_drain_budget() {
    // Concurrent records from different origins prune different edges of the same cycles, so
    // the eager links fragment and some members hear of a record only by IHAVE, then GRAFT.
    let mut c = Cluster::formed(N, 9, config(N, |_| {}), WARM_UP_MS);
    for r in 0..120 {
        let origin = (r * 7) % N;
        let rec = c.record(&format!("i{r}"), origin, Ready);
        c.publish(origin, vec![rec]);
        c.run_for(30);
    }
    c.run_for(3_000);
    let t0 = c.now;
    let rec = c.record("i0", 0, Draining);
    let rev = c.revision();
    c.publish(5, vec![rec]);
    c.run_for(3_000);
    let arrivals: Vec<u64> = (0..N)
        .map(|i| {
            c.applied_at(i, "i0", rev)
                .expect("every node gets DRAINING")
                - t0
        })
        .collect();
    let eager: Vec<usize> = (0..N).map(|i| c.mesh(i).peer_sets().0).collect();
    eprintln!("eager link counts {eager:?}; DRAINING arrivals {arrivals:?}");
    let slowest = *arrivals.iter().max().expect("nodes");
    assert!(slowest <= 1_000, "DRAINING took {slowest} ms");
}
