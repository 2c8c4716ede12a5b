//! ed25519 signatures over the canonical encoding: round trip, tamper detection per field,
//! wrong and unknown keys, key rotation overlap.

use shoal_proto::sign::SignatureBytes;
use shoal_proto::{
    Generation, HealthRecord, HealthSeq, HealthStatus, InstanceId, LifecycleState, NodeId,
    Revision, SignatureError, SignedHealth, SigningKey, TransitionReason, TrustedKeys,
    VerifyingKey,
};

mod common {
    use std::net::SocketAddr;

    use shoal_proto::{
        EndpointSpec, Generation, InstanceId, LabelDimension, Labels, LifecycleRecord,
        LifecycleState, NodeId, Region, Revision, TransitionReason, TransitionSource, Version,
        Zone,
    };

    pub fn lifecycle() -> LifecycleRecord {
        LifecycleRecord {
            key: "prod/payments/http".parse().unwrap(),
            instance: InstanceId::new("payments-7f9c").unwrap(),
            generation: Generation(3),
            region: Region::new("eu-west").unwrap(),
            revision: Revision(41),
            owner: NodeId::new("node-17").unwrap(),
            owner_key: Some([0x5a; 32]),
            endpoint: EndpointSpec {
                address: "10.1.2.3:8443".parse::<SocketAddr>().unwrap(),
                zone: Zone::new("eu-west-a").unwrap(),
                version: Version::new("2.7.1").unwrap(),
                weight: 100,
                labels: Labels::new(vec![(LabelDimension::Protocol, "http2".into())]).unwrap(),
            },
            state: LifecycleState::Ready,
            reason: TransitionReason::ReadinessPassed,
            source: TransitionSource::Authority,
            lease_ms: 300_000,
            committed_at_ms: 1_700_000_000_000,
        }
    }
}

fn health() -> HealthRecord {
    HealthRecord {
        key: "prod/payments/http".parse().unwrap(),
        instance: InstanceId::new("payments-7f9c").unwrap(),
        generation: Generation(3),
        owner: NodeId::new("node-17").unwrap(),
        owner_boot: Generation(1),
        seq: HealthSeq(5),
        status: HealthStatus::Passing,
        reason: TransitionReason::ReadinessRecovered,
    }
}

#[test]
fn signing_is_deterministic_and_verifies() {
    let k = SigningKey::from_seed([1; 32]);
    let a = k.sign_lifecycle(common::lifecycle());
    let b = k.sign_lifecycle(common::lifecycle());
    assert_eq!(a, b, "ed25519 is deterministic: same record, same bytes");
    assert_eq!(a.signer, k.id());
    k.verifying_key().verify_lifecycle(&a).unwrap();
    let h = k.sign_health(health());
    k.verifying_key().verify_health(&h).unwrap();
}

#[test]
fn keys_round_trip_through_their_bytes() {
    let k = SigningKey::from_seed([9; 32]);
    assert_eq!(SigningKey::from_seed(k.to_seed()).id(), k.id());
    let vk = k.verifying_key();
    let back = VerifyingKey::from_bytes(vk.to_bytes()).unwrap();
    assert_eq!(back, vk);
    assert_eq!(back.id().0, vk.to_bytes()[..8]);
}

#[test]
fn every_lifecycle_field_is_covered_by_the_signature() {
    let k = SigningKey::from_seed([1; 32]);
    let vk = k.verifying_key();
    let signed = k.sign_lifecycle(common::lifecycle());
    type Edit = fn(&mut shoal_proto::LifecycleRecord);
    let edits: [(&str, Edit); 12] = [
        ("key", |r| r.key = "prod/payments/grpc".parse().unwrap()),
        ("instance", |r| {
            r.instance = InstanceId::new("payments-0000").unwrap()
        }),
        ("generation", |r| r.generation = Generation(4)),
        ("region", |r| {
            r.region = shoal_proto::Region::new("us-east").unwrap()
        }),
        ("revision", |r| r.revision = Revision(42)),
        ("owner", |r| r.owner = NodeId::new("node-18").unwrap()),
        ("address", |r| {
            r.endpoint.address = "10.9.9.9:8443".parse().unwrap()
        }),
        ("weight", |r| r.endpoint.weight = 101),
        ("state", |r| r.state = LifecycleState::Draining),
        ("reason", |r| r.reason = TransitionReason::DrainCancelled),
        ("lease", |r| r.lease_ms = 1),
        ("committed_at", |r| r.committed_at_ms += 1),
    ];
    for (field, edit) in edits {
        let mut t = signed.clone();
        edit(&mut t.record);
        assert_eq!(
            vk.verify_lifecycle(&t),
            Err(SignatureError::Invalid),
            "{field} is not covered"
        );
    }
    // The signature bytes themselves.
    for i in [0usize, 31] {
        let mut t = signed.clone();
        t.signature.0[i] ^= 1;
        assert_eq!(vk.verify_lifecycle(&t), Err(SignatureError::Invalid));
        let mut t = signed.clone();
        t.signature.1[i] ^= 1;
        assert_eq!(vk.verify_lifecycle(&t), Err(SignatureError::Invalid));
    }
    let mut t = signed.clone();
    t.signature = SignatureBytes([0; 32], [0; 32]);
    assert_eq!(vk.verify_lifecycle(&t), Err(SignatureError::Invalid));
}

#[test]
fn every_health_field_is_covered_by_the_signature() {
    let k = SigningKey::from_seed([2; 32]);
    let vk = k.verifying_key();
    let signed = k.sign_health(health());
    type Edit = fn(&mut HealthRecord);
    let edits: [Edit; 7] = [
        |r| r.instance = InstanceId::new("payments-0000").unwrap(),
        |r| r.generation = Generation(4),
        |r| r.owner = NodeId::new("node-18").unwrap(),
        |r| r.owner_boot = Generation(2),
        |r| r.seq = HealthSeq(6),
        |r| r.status = HealthStatus::Failing,
        |r| r.reason = TransitionReason::LivenessFailed,
    ];
    for edit in edits {
        let mut t: SignedHealth = signed.clone();
        edit(&mut t.record);
        assert_eq!(vk.verify_health(&t), Err(SignatureError::Invalid));
    }
}

#[test]
fn another_key_is_refused_as_wrong_signer_or_invalid() {
    let a = SigningKey::from_seed([1; 32]);
    let b = SigningKey::from_seed([2; 32]);
    let signed = a.sign_lifecycle(common::lifecycle());
    assert_eq!(
        b.verifying_key().verify_lifecycle(&signed),
        Err(SignatureError::WrongSigner(a.id()))
    );
    // Claiming to be b does not help: the signature is a's.
    let mut claimed = signed.clone();
    claimed.signer = b.id();
    assert_eq!(
        b.verifying_key().verify_lifecycle(&claimed),
        Err(SignatureError::Invalid)
    );
}

#[test]
fn lifecycle_and_health_signatures_are_domain_separated() {
    // The same signature bytes over a health record do not verify as a lifecycle record and
    // vice versa (different context prefixes), even with the same key.
    let k = SigningKey::from_seed([3; 32]);
    let h = k.sign_health(health());
    let mut l = k.sign_lifecycle(common::lifecycle());
    l.signature = h.signature;
    assert_eq!(
        k.verifying_key().verify_lifecycle(&l),
        Err(SignatureError::Invalid)
    );
}

#[test]
fn trusted_keys_hold_two_keys_during_a_rotation() {
    let old = SigningKey::from_seed([1; 32]);
    let new = SigningKey::from_seed([2; 32]);
    let mut trusted = TrustedKeys::new();
    assert!(trusted.is_empty());
    trusted.insert(old.verifying_key());
    trusted.insert(new.verifying_key());
    trusted.insert(new.verifying_key());
    assert_eq!(trusted.len(), 2);
    for k in [&old, &new] {
        let s = k.sign_lifecycle(common::lifecycle());
        trusted.get(s.signer).unwrap().verify_lifecycle(&s).unwrap();
    }
    assert!(trusted.get(SigningKey::from_seed([3; 32]).id()).is_none());
}
