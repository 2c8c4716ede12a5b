//! Membership push-pull riding on anti-entropy: a member that missed SWIM's rumour of a member
//! learns it from a peer's list, only the differing buckets travel, openers are rate-limited,
//! and a list never brings a dead identity back.

mod support;

use shoal_mesh::membership::MEMBER_BUCKETS;
use shoal_mesh::messages::{AntiEntropy, StreamMessage};
use shoal_mesh::MemberId;
use shoal_proto::Generation;
use support::{config, identity, node_id, Cluster};

fn encode(c: &Cluster, msg: AntiEntropy) -> Vec<u8> {
    StreamMessage::AntiEntropy(msg)
        .encode(c.config.max_stream_message_bytes)
        .expect("fits")
}

/// Node 0's opening digest, as its anti-entropy round would send it.
fn digest_of(c: &Cluster, i: usize, members: Vec<u32>) -> Vec<u8> {
    let heads = c.mesh(i).catalog().heads();
    encode(
        c,
        AntiEntropy::Digest {
            regions: heads.regions,
            buckets: Vec::new(),
            members,
            reply: true,
        },
    )
}

fn knows(c: &Cluster, i: usize, id: &MemberId) -> bool {
    c.mesh(i).membership().members().any(|m| m == id)
}

#[test]
fn a_member_that_missed_a_join_learns_it_from_a_peers_list() {
    let mut c = Cluster::new(3, 5, config(3, |_| {}));
    // Node 0 knows everyone; node 1 knows only node 0, and nothing is gossiped (bootstrap
    // does not broadcast), so only push-pull can tell node 1 about node 2.
    c.bootstrap(0, vec![identity(1), identity(2)]);
    c.bootstrap(1, vec![identity(0)]);
    c.crash(2);
    assert!(!knows(&c, 1, &identity(2)));
    assert_ne!(
        c.mesh(0).membership().member_buckets(),
        c.mesh(1).membership().member_buckets()
    );

    let digest = digest_of(&c, 0, c.mesh(0).membership().member_buckets().to_vec());
    c.inject_stream(1, 0, &digest);
    // Node 1 sends its list of the differing bucket; node 0 answers with its own, which has
    // node 2; well before any anti-entropy timer fires.
    c.run_for(20);

    assert!(knows(&c, 1, &identity(2)), "node 1 learned node 2");
    assert_eq!(
        c.mesh(0).membership().member_buckets(),
        c.mesh(1).membership().member_buckets(),
        "both views hash the same"
    );
    assert_eq!(c.mesh(1).counters().push_pull_lists_sent, 1);
    assert_eq!(c.mesh(0).counters().push_pull_lists_sent, 1);
    assert_eq!(c.mesh(1).membership().counters().members_learned, 1);
    assert_eq!(c.mesh(0).membership().counters().members_learned, 0);
    // One bucket differed, so one bucket's members travelled, not the whole list.
    let lists: Vec<_> = c
        .sent
        .iter()
        .filter_map(|s| s.bytes.as_deref())
        .filter_map(|b| match StreamMessage::decode(b, usize::MAX).ok()? {
            StreamMessage::AntiEntropy(AntiEntropy::Members { buckets, .. }) => Some(buckets),
            _ => None,
        })
        .collect();
    assert_eq!(lists.len(), 2);
    assert!(lists.iter().all(|b| b.len() == 1), "{lists:?}");
}

#[test]
fn openers_are_rate_limited_and_answers_are_not_sent_when_nothing_is_lacking() {
    let mut c = Cluster::new(3, 6, config(3, |_| {}));
    c.bootstrap(0, vec![identity(1), identity(2)]);
    c.bootstrap(1, vec![identity(0), identity(2)]);
    c.crash(2);
    // Same view: a digest opens nothing.
    let digest = digest_of(&c, 0, c.mesh(0).membership().member_buckets().to_vec());
    c.inject_stream(1, 0, &digest);
    c.run_for(20);
    assert_eq!(c.mesh(1).counters().push_pull_lists_sent, 0);

    // A digest whose every bucket differs opens one list; the peer (node 0) lacks nothing
    // node 1 holds, so it does not answer.
    let bogus = digest_of(&c, 0, vec![0; MEMBER_BUCKETS]);
    c.inject_stream(1, 0, &bogus);
    c.run_for(20);
    assert_eq!(c.mesh(1).counters().push_pull_lists_sent, 1);
    assert_eq!(c.mesh(0).counters().push_pull_lists_sent, 0);

    // Within the minimum interval the next opener is limited; after it, allowed again.
    c.inject_stream(1, 0, &bogus);
    assert_eq!(c.mesh(1).counters().push_pull_limited, 1);
    assert_eq!(c.mesh(1).counters().push_pull_lists_sent, 1);
    c.run_for(c.config.push_pull_min_interval_ms);
    c.inject_stream(1, 0, &bogus);
    assert_eq!(c.mesh(1).counters().push_pull_lists_sent, 2);
}

#[test]
fn a_list_never_brings_back_a_dead_identity_but_brings_its_successor() {
    let mut c = Cluster::formed(4, 7, config(4, |_| {}), 1_000);
    c.crash(3);
    let dead = node_id(3);
    let declared = c.run_until_true(60_000, 100, |c| {
        c.mesh(0).membership().is_down(&dead) && c.mesh(1).membership().is_down(&dead)
    });
    assert!(declared.is_some(), "node 3 declared down");

    // A stale list (a peer that has not noticed yet) names the dead identity.
    let stale = encode(
        &c,
        AntiEntropy::Members {
            buckets: (0..MEMBER_BUCKETS as u16).collect(),
            members: vec![identity(1), identity(3)],
            reply: false,
        },
    );
    c.inject_stream(0, 1, &stale);
    assert!(c.mesh(0).membership().is_down(&dead));
    assert_eq!(c.mesh(0).membership().counters().members_learned, 0);

    // The restarted node (boot + 1) is new: it is learned and replaces the dead identity.
    let reborn = MemberId {
        boot: Generation(identity(3).boot.0 + 1),
        ..identity(3)
    };
    let fresh = encode(
        &c,
        AntiEntropy::Members {
            buckets: (0..MEMBER_BUCKETS as u16).collect(),
            members: vec![identity(1), reborn.clone()],
            reply: false,
        },
    );
    c.inject_stream(0, 1, &fresh);
    assert!(knows(&c, 0, &reborn));
    assert!(!c.mesh(0).membership().is_down(&dead));
    assert_eq!(c.mesh(0).membership().counters().members_learned, 1);
}
