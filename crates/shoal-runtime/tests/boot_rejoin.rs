//! A member declared down renews its SWIM identity (boot + 1) in memory; `MeshIo::dispatch`
//! writes that boot to the boot file before sending anything, so the next start supersedes
//! every identity this life used (before, the file kept the start's boot and a restart reused
//! the renewed one, which peers had already seen).

use std::fs;
use std::net::SocketAddr;

use shoal_catalog::testkit::Fixture;
use shoal_mesh::membership::forge::{gossip_datagram, RumourState};
use shoal_mesh::{MemberId, MembershipEvent, Mesh, MeshConfig, MeshEvent};
use shoal_proto::{Generation, Zone};
use shoal_runtime::boot::{bump_boot, parse_boot, BootFile};
use shoal_runtime::clock::MonoClock;
use shoal_runtime::io::MeshIo;
use shoal_transport::certs::{
    generate_ca, generate_node_cert, ExtraSans, Validity, CA_VALIDITY, NODE_VALIDITY,
};
use shoal_transport::transport::{Transport, TransportConfig};

const BOOT: &str = "boot";

/// A transport on 127.0.0.1 for `fx`'s node 0, with a throwaway CA.
fn transport(fx: &Fixture) -> Transport {
    let ca = generate_ca(&fx.region, Validity::from_now(CA_VALIDITY)).unwrap();
    let cert = generate_node_cert(
        &ca,
        &fx.nodes[0].0,
        &fx.region,
        &ExtraSans::default(),
        Validity::from_now(NODE_VALIDITY),
    )
    .unwrap();
    let config = TransportConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        fx.region.clone(),
        ca.cert_pem,
        cert.cert_pem,
        cert.key_pem,
    );
    Transport::bind(config).unwrap().0
}

fn on_disk(dir: &std::path::Path) -> u64 {
    parse_boot(&fs::read(dir.join(BOOT)).unwrap()).unwrap()
}

#[tokio::test]
async fn a_rejoin_is_written_to_the_boot_file_and_the_next_start_is_above_it() {
    let dir = tempfile::tempdir().unwrap();
    // Four earlier lives.
    fs::write(dir.path().join(BOOT), "4\n").unwrap();
    let file = BootFile::bump(dir.path(), BOOT).unwrap();
    assert_eq!(file.generation(), Generation(5));

    let fx = Fixture::new();
    let transport = transport(&fx);
    let me = MemberId {
        node: fx.nodes[0].0.clone(),
        addr: transport.listen_addr(),
        boot: file.generation(),
    };
    // Peers nobody answers for: only what we send matters, not whether it arrives.
    let peer = |i: usize| MemberId {
        node: fx.nodes[i].0.clone(),
        addr: SocketAddr::from(([127, 0, 0, 1], 9 + i as u16)),
        boot: Generation(1),
    };
    let mut mesh = Mesh::new(
        me.clone(),
        fx.region.clone(),
        Zone::new("zone-a").unwrap(),
        fx.nodes[0].1.clone(),
        MeshConfig::for_cluster_size(3),
        fx.keyring.clone(),
        7,
    );
    let mut io = MeshIo::new(transport, MonoClock::start()).with_boot_file(file);
    let ((), _) = io.pump(&mut mesh, |m, now| m.bootstrap(now, vec![peer(1), peer(2)]));
    assert_eq!(on_disk(dir.path()), 5, "nothing renewed yet");

    // Peer 1 tells us we were declared down: the core renews our identity and rejoins.
    let down = gossip_datagram(&peer(1), &me, &[(me.clone(), 0, RumourState::Down)]);
    let ((), events) = io.pump(&mut mesh, |m, now| {
        m.handle_datagram(now, peer(1).addr, &down)
    });
    let renewed = events
        .iter()
        .find_map(|e| match e {
            MeshEvent::Membership(MembershipEvent::Rejoined { old, new }) => {
                Some((old.boot, new.boot))
            }
            _ => None,
        })
        .expect("a forged down of our identity makes the member rejoin");
    assert_eq!(renewed.0, Generation(5));
    assert!(renewed.1 > Generation(5), "{renewed:?}");
    assert_eq!(mesh.membership().identity().boot, renewed.1);

    // The renewed boot is on disk by the time its announcements were handed to the transport.
    assert_eq!(on_disk(dir.path()), renewed.1 .0);
    let file = io.boot_file().unwrap();
    assert_eq!(file.generation(), renewed.1);
    assert_eq!(file.counters().writes, 1);
    assert_eq!(file.counters().write_errors, 0);

    // A restart starts strictly above every boot this life used.
    io.close().await;
    let next = bump_boot(dir.path(), BOOT).unwrap();
    assert!(next > renewed.1, "restart at {next:?} after {renewed:?}");
}
