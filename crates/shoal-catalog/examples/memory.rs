//! Memory per record: builds region (33,000) and global (100,000) catalogs the way an agent
//! does (decode a verified snapshot, install it, drop the snapshot) and counts the bytes still
//! allocated afterwards with a counting global allocator (`stats_alloc`).
//!
//! Run: `cargo run --release -p shoal-catalog --example memory`
//!
//! The figures are requested bytes (what the program asked the allocator for); the system
//! allocator adds roughly 8-16 bytes of bookkeeping per live allocation, so the live
//! allocation count is printed too.

#[path = "../benches/common/mod.rs"]
mod common;

use std::alloc::System;

use shoal_catalog::snapshot;
use shoal_catalog::testkit::Fixture;
use shoal_catalog::{Catalog, Snapshot, SnapshotScope};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn main() {
    let fx = Fixture::new();
    let records = common::region_records(&fx, 100_000);
    for n in [33_000usize, 100_000] {
        // The wire bytes, produced outside the measured region.
        let bytes = {
            let mut c = Catalog::new();
            for r in &records[..n] {
                let merged = c.apply_lifecycle(r.clone(), &fx.keyring);
                assert_eq!(merged, shoal_catalog::MergeOutcome::Applied);
            }
            snapshot::encode(&Snapshot::of(&c, SnapshotScope::Catalog, fx.region.clone()))
        };

        let region = Region::new(GLOBAL);
        let mut catalog = Catalog::new();
        let snap = snapshot::decode(&bytes, &fx.keyring).expect("valid snapshot");
        catalog.install(&snap, &fx.keyring);
        drop(snap);
        let s = region.change();
        assert_eq!(catalog.len(), n);

        let live =
            s.bytes_allocated as i128 - s.bytes_deallocated as i128 + s.bytes_reallocated as i128;
        let live_allocs = s.allocations as i128 - s.deallocations as i128;
        println!(
            "memory: {n} records: {live} bytes live ({:.1} MiB), {:.0} B/record, \
             {:.1} live allocations/record, snapshot {} bytes",
            live as f64 / (1024.0 * 1024.0),
            live as f64 / n as f64,
            live_allocs as f64 / n as f64,
            bytes.len()
        );
        drop(catalog);
    }
}
