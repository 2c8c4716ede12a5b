//! Specification of `shoal_mesh::Mesh` at its edges: bad stream input is counted and changes
//! nothing, datagrams never exceed the packet limit, full queues count overflow instead of
//! growing, and the same seed gives the same bytes on the wire.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use shoal_mesh::messages::{
    AntiEntropy, Graft, Prune, RecordPush, StreamMessage, MAX_MEMBERS_PER_MESSAGE,
};
use shoal_mesh::MeshTimer;
use shoal_mesh::{Channel, Command, MeshEvent};
use shoal_proto::envelope::{MessageKind, MAGIC, PROTOCOL_VERSION};
use shoal_proto::LifecycleState::{Draining, Ready};
use shoal_proto::SigningKey;
use support::{addr, config, Cluster};

fn header(version: u8, kind: u8) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.push(version);
    v.push(kind);
    v
}

#[test]
fn malformed_oversized_and_wrong_kind_stream_messages_are_counted_and_change_nothing() {
    let mut c = Cluster::formed(3, 21, config(3, |_| {}), 1_000);
    let rec = c.record("a", 1, Ready);
    c.publish(1, vec![rec]);
    c.run_for(500);
    let max = c.config.max_stream_message_bytes;
    let too_many: Vec<_> = (0..257)
        .map(|r| c.record(&format!("p{r}"), 1, Ready))
        .collect();

    let mut too_large = header(PROTOCOL_VERSION, MessageKind::Prune as u8);
    too_large.resize(max + 1, 0);
    let mut trailing = StreamMessage::Prune(Prune {}).encode(max).unwrap();
    trailing.push(0);
    let over_limit_push = StreamMessage::Push(RecordPush {
        lifecycle: too_many,
        health: Vec::new(),
    })
    .encode(max)
    .unwrap();
    let over_limit_digest = StreamMessage::AntiEntropy(AntiEntropy::Digest {
        regions: Vec::new(),
        buckets: vec![0; 33],
        members: Vec::new(),
        reply: true,
    })
    .encode(max)
    .unwrap();
    let over_limit_members = StreamMessage::AntiEntropy(AntiEntropy::Members {
        buckets: vec![0],
        members: vec![support::identity(1); MAX_MEMBERS_PER_MESSAGE + 1],
        reply: true,
    })
    .encode(max)
    .unwrap();
    let mut malformed = header(PROTOCOL_VERSION, MessageKind::RecordPush as u8);
    malformed.extend_from_slice(&[0xff; 16]);
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", vec![]),
        ("truncated", MAGIC.to_vec()),
        ("bad_magic", b"XX\x01\x07".to_vec()),
        (
            "version",
            header(PROTOCOL_VERSION + 1, MessageKind::Delta as u8),
        ),
        ("unknown_kind", header(PROTOCOL_VERSION, 99)),
        (
            "not_stream",
            header(PROTOCOL_VERSION, MessageKind::Swim as u8),
        ),
        (
            "not_stream",
            header(PROTOCOL_VERSION, MessageKind::AuthorityRequest as u8),
        ),
        ("too_large", too_large),
        ("malformed", malformed),
        ("trailing", trailing),
        ("over_limit", over_limit_push),
        ("over_limit", over_limit_digest),
        ("over_limit", over_limit_members),
    ];

    let m = &mut c.net.nodes[0].m;
    assert!(m.poll_transmit().is_none() && m.poll_event().is_none());
    let catalog = m.catalog().clone();
    let peers = m.peer_sets();
    let before = m.counters().clone();
    let now = c.net.now;
    let mut expected: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (label, bytes) in inputs {
        m.handle_stream_message(now, addr(1), &bytes);
        *expected.entry(label).or_default() += 1;
        assert_eq!(m.counters().rejected, expected, "after a {label} message");
        assert!(m.poll_transmit().is_none(), "{label}: nothing sent");
        assert!(m.poll_armed().is_none(), "{label}: nothing scheduled");
        assert!(m.poll_event().is_none(), "{label}: nothing reported");
    }
    assert!(m.catalog() == &catalog);
    assert_eq!(m.catalog().index(), catalog.index());
    assert_eq!(m.peer_sets(), peers);
    let mut after = m.counters().clone();
    after.rejected = before.rejected.clone();
    assert_eq!(after, before, "no other counter moved");
}

#[test]
fn a_forged_record_is_refused_by_signature_and_not_applied() {
    let mut c = Cluster::formed(3, 22, config(3, |_| {}), 1_000);
    let mut forged = (*c.record("evil", 1, Ready)).clone();
    let rogue = SigningKey::from_seed([9; 32]);
    forged = rogue.sign_lifecycle(forged.record);
    let bytes = StreamMessage::Push(RecordPush {
        lifecycle: vec![Arc::new(forged)],
        health: Vec::new(),
    })
    .encode(c.config.max_stream_message_bytes)
    .unwrap();
    c.inject_stream(0, 1, &bytes);
    let m = c.mesh(0);
    assert!(m.catalog().is_empty());
    assert_eq!(m.catalog().counters().bad_signature, 1);
    assert!(!c
        .events
        .iter()
        .any(|(_, n, e)| *n == 0 && matches!(e, MeshEvent::LifecycleApplied(_))));
}

#[test]
fn every_datagram_fits_the_configured_packet_size() {
    // A region formed by joins through one seed: the seed's membership feeds and the gossip of
    // thirty joins fill packets up to the limit.
    const N: usize = 30;
    let cfg = config(N, |c| c.membership.max_packet_bytes = 400);
    let mut c = Cluster::new(N, 23, cfg);
    c.loss = 0.05;
    for i in 1..N {
        c.join(i, vec![addr(0)]);
        c.run_for(10);
    }
    c.run_for(5_000);
    for r in 0..30 {
        let rec = c.record(&format!("i{r}"), r % N, Ready);
        c.publish(r % N, vec![rec]);
    }
    c.run_for(2_000);
    c.crash(3);
    c.crash(17);
    c.run_for(10_000);

    let datagrams: Vec<usize> = c
        .sent
        .iter()
        .filter(|s| s.channel == Channel::Datagram)
        .map(|s| s.len)
        .collect();
    eprintln!(
        "{} datagrams, largest {} B",
        datagrams.len(),
        c.max_datagram
    );
    assert!(datagrams.iter().all(|&len| len <= 400));
    assert!(c.max_datagram > 300, "the limit was actually pressed");
    assert_eq!(
        c.live()
            .filter(|&i| c.mesh(i).membership().num_members() == N - 3)
            .count(),
        N - 2,
        "the region still formed and saw both crashes"
    );
}

#[test]
fn full_queues_count_overflow_instead_of_growing() {
    const N: usize = 8;
    let cfg = config(N, |c| {
        c.max_pending_transmits = 2;
        c.max_outbox_records = 3;
        c.max_pending_events = 4;
    });
    let mut c = Cluster::new(N, 24, cfg);
    let now = c.net.now;
    let members = (1..N).map(support::identity).collect();
    let m = &mut c.net.nodes[0].m;
    m.bootstrap(now, members);
    while m.poll_transmit().is_some() {}
    while m.poll_event().is_some() {}
    // Every peer grafts us: seven eager links.
    let graft = StreamMessage::Graft(Graft::default())
        .encode(1 << 20)
        .unwrap();
    for p in 1..N {
        m.handle_stream_message(now, addr(p), &graft);
    }
    assert_eq!(m.peer_sets().0, N - 1);
    let before = m.counters().clone();

    // Ten withdrawals at once: urgent, so pushed to all seven links after the short urgent
    // coalescing window (one timer), not the ordinary one.
    let records: Vec<_> = (0..10)
        .map(|r| c.record(&format!("d{r}"), 1, Draining))
        .collect();
    let m = &mut c.net.nodes[0].m;
    assert_eq!(
        m.handle_command(now, Command::Publish { lifecycle: records }),
        Ok(())
    );
    let flushes: Vec<u64> = m
        .pending_timers()
        .filter(|(_, t)| **t == MeshTimer::Flush)
        .map(|(at, _)| at)
        .collect();
    let at = m.poll_timeout().expect("timers are armed");
    assert_eq!(flushes, [at], "one flush is armed and it is the next timer");
    assert!(at <= now + m.config().urgent_coalesce_ms);
    m.handle_timeout(at);
    assert!(
        m.pending_timers().all(|(_, t)| *t != MeshTimer::Flush),
        "the flush fired"
    );

    let counters = m.counters();
    assert_eq!(counters.outbox_overflow - before.outbox_overflow, 7);
    assert_eq!(counters.event_overflow - before.event_overflow, 6);
    assert_eq!(counters.transmit_overflow - before.transmit_overflow, 5);
    let mut pushes = Vec::new();
    while let Some(t) = m.poll_transmit() {
        assert_eq!(t.channel, Channel::Stream);
        pushes.push(t);
    }
    assert_eq!(pushes.len(), 2);
    for t in &pushes {
        let StreamMessage::Push(p) = StreamMessage::decode(&t.bytes, usize::MAX).unwrap() else {
            panic!("a push")
        };
        assert_eq!(p.lifecycle.len(), 3, "the outbox held three records");
    }
    let mut events = 0;
    while m.poll_event().is_some() {
        events += 1;
    }
    assert_eq!(events, 4);
    assert_eq!(
        m.catalog().len(),
        10,
        "every record was still applied locally"
    );
}

#[test]
fn records_dropped_by_a_full_outbox_are_repaired() {
    const N: usize = 12;
    let cfg = config(N, |c| c.max_outbox_records = 2);
    let mut c = Cluster::formed(N, 25, cfg, 2_000);
    let records: Vec<_> = (0..10)
        .map(|r| c.record(&format!("i{r}"), r, Ready))
        .collect();
    c.publish(0, records);
    assert_eq!(c.mesh(0).counters().outbox_overflow, 8);
    let start = c.now;
    let done = c.run_until_true(start + 10_000, 50, |c| c.all_have_revision(10));
    let took = done.expect("IHAVE/GRAFT or anti-entropy repairs the overflow") - start;
    eprintln!(
        "repaired in {took} ms; grafts {} deltas {}",
        c.total(|m| m.counters().grafts_sent),
        c.total(|m| m.counters().deltas_sent)
    );
}

fn scenario(seed: u64) -> (u64, usize) {
    const N: usize = 10;
    let mut c = Cluster::formed(N, seed, config(N, |_| {}), 1_000);
    c.loss = 0.02;
    for r in 0..10 {
        let rec = c.record(&format!("i{r}"), r % N, Ready);
        c.publish(r % N, vec![rec]);
        c.run_for(37);
    }
    c.cut_streams(6, 2_000);
    c.crash(2);
    let rec = c.record("i0", 0, Draining);
    c.publish(1, vec![rec]);
    c.run_for(8_000);
    (c.transmit_hash(), c.sent.len())
}

#[test]
fn the_same_seed_gives_the_same_transmits() {
    let a = scenario(7);
    let b = scenario(7);
    assert_eq!(a, b);
    let other = scenario(8);
    assert_ne!(a.0, other.0, "the seed matters");
}

/// Contract C1 (`docs/invariants.md`): a driver that hands the core an earlier `now_ms` than
/// its previous input is caught, in debug builds (every test and simulator test runs one).
#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "now_ms went backwards")]
fn now_ms_going_backwards_is_caught() {
    let mut c = Cluster::new(2, 1, config(2, |_| {}));
    let m = &mut c.net.nodes[0].m;
    m.start(1_000);
    m.handle_timeout(999);
}
