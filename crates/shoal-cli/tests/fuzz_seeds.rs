//! Valid inputs for the fuzz targets in `fuzz/` (records signed with the testkit fixture's
//! keys, which the targets trust), checked against the production decoders. With
//! `SHOAL_FUZZ_SEEDS=<dir>` they are also written to `<dir>/<target>/seed-<n>`, which
//! `bench/fuzz` does before fuzzing so that libFuzzer starts from inputs that pass the
//! signature checks it could never forge.

use std::sync::Arc;

use shoal_catalog::snapshot::{self, Snapshot, SnapshotScope};
use shoal_catalog::testkit::Fixture;
use shoal_catalog::Catalog;
use shoal_mesh::messages::{IHave, Prune, RecordPush, StreamMessage};
use shoal_mesh::{MemberId, Mesh, MeshConfig};
use shoal_proto::envelope::{self, MessageKind, MAX_STREAM_MESSAGE_BYTES};
use shoal_proto::rpc::{AuthorityRequest, AuthorityRequestBody};
use shoal_proto::{
    Generation, HealthSeq, HealthStatus, LifecycleState, NodeId, Region, Revision, SigningKey, Zone,
};
use shoal_transport::certs::{self, ExtraSans, Validity, CA_VALIDITY, NODE_VALIDITY};

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let f = Fixture::new();
    let mut out = Vec::new();
    let lc = [
        f.lifecycle("web-1", 1, 1, LifecycleState::Starting),
        f.lifecycle("web-1", 1, 2, LifecycleState::Ready),
        f.lifecycle("web-2", 1, 3, LifecycleState::Draining),
    ];
    let hc = [
        f.health("web-1", 0, 1, 1, 1, HealthStatus::Passing),
        f.health("web-1", 0, 1, 1, 2, HealthStatus::Failing),
    ];

    // envelope: identifiers in every kind's envelope.
    let key = f.key.clone();
    for kind in [MessageKind::Heads, MessageKind::Graft] {
        out.push(("envelope", envelope::encode(kind, &key, 1200).unwrap()));
    }
    out.push((
        "envelope",
        envelope::encode(MessageKind::Prune, &f.region, 1200).unwrap(),
    ));

    // records: selector byte, then postcard.
    for r in &lc {
        let mut b = vec![0];
        b.extend(postcard::to_allocvec(r).unwrap());
        out.push(("records", b));
        let mut b = vec![3];
        b.extend(postcard::to_allocvec(&r.record).unwrap());
        out.push(("records", b));
    }
    for h in &hc {
        let mut b = vec![1];
        b.extend(postcard::to_allocvec(h).unwrap());
        out.push(("records", b));
        let mut b = vec![4];
        b.extend(postcard::to_allocvec(&h.record).unwrap());
        out.push(("records", b));
    }

    // mesh stream messages.
    let push = StreamMessage::Push(RecordPush {
        lifecycle: lc.iter().cloned().map(Arc::new).collect(),
        health: hc.iter().cloned().map(Arc::new).collect(),
    });
    let ihave = StreamMessage::IHave(IHave {
        regions: vec![(f.region.clone(), Revision(3))],
        owners: vec![(f.nodes[0].0.clone(), Generation(1), HealthSeq(2))],
    });
    let mut catalog = Catalog::new();
    for r in &lc {
        let merged = catalog.apply_lifecycle(Arc::new(r.clone()), &f.keyring);
        assert_eq!(merged, shoal_catalog::MergeOutcome::Applied);
    }
    for h in &hc {
        let merged = catalog.apply_health(Arc::new(h.clone()), &f.keyring);
        assert_eq!(merged, shoal_catalog::MergeOutcome::Applied);
    }
    let snap = Snapshot::of(&catalog, SnapshotScope::Catalog, f.region.clone());
    let snap_bytes = snapshot::encode(&snap);
    for m in [
        push,
        ihave,
        StreamMessage::Prune(Prune {}),
        StreamMessage::Snapshot(snap_bytes.clone()),
    ] {
        let bytes = m.encode(MAX_STREAM_MESSAGE_BYTES).unwrap();
        out.push(("mesh_stream", bytes.clone()));
        out.push(("mesh_stream_apply", bytes));
    }
    out.push(("catalog_snapshot", snap_bytes));

    // SWIM datagrams: what a joining member sends.
    let mut joiner = Mesh::new(
        MemberId {
            node: NodeId::new("node-1").unwrap(),
            addr: "127.0.0.1:7001".parse().unwrap(),
            boot: Generation(1),
        },
        f.region.clone(),
        Zone::new("z").unwrap(),
        SigningKey::from_seed([100 + 1; 32]),
        MeshConfig::for_cluster_size(8),
        f.keyring.clone(),
        1,
    );
    joiner.start(0);
    joiner.join(0, &["127.0.0.1:7000".parse().unwrap()]);
    while let Some(t) = joiner.poll_transmit() {
        if t.channel == shoal_mesh::Channel::Datagram {
            let mut b = vec![u8::try_from(t.bytes.len().min(255)).unwrap()];
            b.extend(&t.bytes);
            out.push(("mesh_datagram", b));
        } else {
            out.push(("mesh_stream_apply", t.bytes));
        }
    }

    // agent data dir files.
    out.push((
        "agent_files",
        [&[0u8][..], b"00".repeat(32).as_slice()].concat(),
    ));
    out.push(("agent_files", b"\x0142\n".to_vec()));
    out.push((
        "agent_files",
        [
            &[2u8][..],
            br#"[{"node":"node-1","addr":"127.0.0.1:7946"}]"#,
        ]
        .concat(),
    ));
    let state = shoal_authority::AuthorityState::new(f.region.clone());
    out.push(("agent_files", [&[3u8][..], &state.encode()].concat()));

    // authority RPC.
    let req = AuthorityRequest {
        request_id: 7,
        body: AuthorityRequestBody::Status,
        on_behalf_of: None,
    };
    out.push((
        "authority_rpc",
        envelope::encode(
            MessageKind::AuthorityRequest,
            &req,
            MAX_STREAM_MESSAGE_BYTES,
        )
        .unwrap(),
    ));

    // A node certificate (DER).
    let region = Region::new("test").unwrap();
    let ca = certs::generate_ca(&region, Validity::from_now(CA_VALIDITY)).unwrap();
    let node = certs::generate_node_cert(
        &ca,
        &NodeId::new("node-0").unwrap(),
        &region,
        &ExtraSans::default(),
        Validity::from_now(NODE_VALIDITY),
    )
    .unwrap();
    let der = certs::parse_certs(&node.cert_pem, "seed").unwrap();
    out.push(("node_certificate", der[0].to_vec()));
    out.push(("node_certificate", node.cert_pem.into_bytes()));
    out
}

#[test]
fn fuzz_seeds_decode_with_the_production_decoders() {
    let f = Fixture::new();
    let seeds = seeds();
    for (target, bytes) in &seeds {
        match *target {
            "mesh_stream" | "mesh_stream_apply" if bytes[3] != MessageKind::Swim as u8 => {
                StreamMessage::decode(bytes, MAX_STREAM_MESSAGE_BYTES)
                    .unwrap_or_else(|e| panic!("{target}: {e}"));
            }
            "catalog_snapshot" => {
                let s = snapshot::decode(bytes, &f.keyring).unwrap();
                // web-1 (newest record) and web-2; web-1's newest health record.
                assert_eq!((s.lifecycle.len(), s.health.len()), (2, 1));
            }
            "mesh_datagram" => {
                envelope::decode_header(&bytes[1..], 1200).unwrap();
            }
            "authority_rpc" => {
                envelope::decode::<AuthorityRequest>(
                    bytes,
                    MessageKind::AuthorityRequest,
                    MAX_STREAM_MESSAGE_BYTES,
                )
                .unwrap();
            }
            _ => {}
        }
    }
    assert!(seeds.iter().any(|(t, _)| *t == "mesh_datagram"));
    if let Some(dir) = std::env::var_os("SHOAL_FUZZ_SEEDS") {
        let dir = std::path::PathBuf::from(dir);
        for (n, (target, bytes)) in seeds.iter().enumerate() {
            let d = dir.join(target);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(format!("seed-{n}")), bytes).unwrap();
        }
        eprintln!("wrote {} seeds under {}", seeds.len(), dir.display());
    }
}
