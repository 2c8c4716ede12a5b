//! Catalog benchmarks (criterion). See docs/benchmarks/catalog.md for figures and commands.
//!
//! - `merge/33000/verified`: build a 33,000-record region catalog from pre-signed records,
//!   ed25519 verification included (what an agent pays when records arrive).
//! - `merge/33000/noop_verifier`: the same with a verifier that accepts everything: the CRDT
//!   merge and index cost alone.
//! - `snapshot/{encode,decode_verified,decode_noop}/{33000,100000}`: snapshot encode and
//!   decode (checksum, postcard, and optionally every signature).
//!
//! Encoded sizes (bytes per record, snapshot bytes) are printed once at start-up.

#[path = "common/mod.rs"]
mod common;

use std::hint::black_box;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use shoal_catalog::snapshot;
use shoal_catalog::testkit::Fixture;
use shoal_catalog::{Catalog, Snapshot, SnapshotScope, Verifier};
use shoal_proto::envelope::{self, MessageKind, MAX_STREAM_MESSAGE_BYTES};
use shoal_proto::{SignatureError, SignedHealth, SignedLifecycle, VerifyingKey};

/// Accepts every record. Only for measuring the merge without signature checks; never use
/// outside benchmarks.
struct NoopVerifier;

impl shoal_catalog::RecordCache for NoopVerifier {}

impl Verifier for NoopVerifier {
    fn verify_lifecycle(&self, _: &SignedLifecycle) -> Result<(), SignatureError> {
        Ok(())
    }
    fn verify_health(&self, _: &SignedHealth, _: &VerifyingKey) -> Result<(), SignatureError> {
        Ok(())
    }
}

const REGION: usize = 33_000;
const GLOBAL: usize = 100_000;

struct Data {
    fx: Fixture,
    /// 100,000 pre-signed records; the first 33,000 are the region catalog.
    records: Vec<Arc<SignedLifecycle>>,
    /// Encoded catalog snapshots of 33,000 and 100,000 records.
    encoded: [(usize, Snapshot, Vec<u8>); 2],
}

fn data() -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| {
        let fx = Fixture::new();
        let records = common::region_records(&fx, GLOBAL);
        let encoded = [REGION, GLOBAL].map(|n| {
            let mut c = Catalog::new();
            for r in &records[..n] {
                let merged = c.apply_lifecycle(r.clone(), &NoopVerifier);
                assert_eq!(merged, shoal_catalog::MergeOutcome::Applied);
            }
            let snap = Snapshot::of(&c, SnapshotScope::Catalog, fx.region.clone());
            let bytes = snapshot::encode(&snap);
            (n, snap, bytes)
        });
        report_sizes(&records, &encoded);
        Data {
            fx,
            records,
            encoded,
        }
    })
}

fn report_sizes(records: &[Arc<SignedLifecycle>], encoded: &[(usize, Snapshot, Vec<u8>)]) {
    let body: usize = records[..REGION]
        .iter()
        .map(|r| postcard::to_allocvec(&**r).expect("encodes").len())
        .sum();
    let one = envelope::encode(
        MessageKind::RecordPush,
        &*records[0],
        MAX_STREAM_MESSAGE_BYTES,
    )
    .expect("fits");
    println!(
        "sizes: signed lifecycle record with 4 labels: {:.1} B/record postcard body (mean of {REGION}), \
         {} B as one RecordPush message (4-byte header included)",
        body as f64 / REGION as f64,
        one.len()
    );
    for (n, _, bytes) in encoded {
        println!(
            "sizes: snapshot of {n} records: {} bytes ({:.2} MiB, {:.1} B/record)",
            bytes.len(),
            bytes.len() as f64 / (1024.0 * 1024.0),
            bytes.len() as f64 / *n as f64
        );
    }
}

fn merge(c: &mut Criterion) {
    let d = data();
    let records = &d.records[..REGION];
    let mut g = c.benchmark_group("merge");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Elements(REGION as u64));
    g.bench_function("33000/verified", |b| {
        b.iter_batched(
            Catalog::new,
            |mut cat| {
                for r in records {
                    let _ = black_box(cat.apply_lifecycle(r.clone(), &d.fx.keyring));
                }
                cat
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("33000/noop_verifier", |b| {
        b.iter_batched(
            Catalog::new,
            |mut cat| {
                for r in records {
                    let _ = black_box(cat.apply_lifecycle(r.clone(), &NoopVerifier));
                }
                cat
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn snapshots(c: &mut Criterion) {
    let d = data();
    let mut g = c.benchmark_group("snapshot");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for (n, snap, bytes) in &d.encoded {
        g.throughput(Throughput::Elements(*n as u64));
        g.bench_function(format!("encode/{n}"), |b| b.iter(|| snapshot::encode(snap)));
        g.bench_function(format!("decode_noop/{n}"), |b| {
            b.iter(|| snapshot::decode(bytes, &NoopVerifier).expect("valid"))
        });
        g.bench_function(format!("decode_verified/{n}"), |b| {
            b.iter(|| snapshot::decode(bytes, &d.fx.keyring).expect("valid"))
        });
    }
    g.finish();
}

criterion_group!(benches, merge, snapshots);
criterion_main!(benches);
