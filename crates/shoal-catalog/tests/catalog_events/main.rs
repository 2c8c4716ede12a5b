//! Event tests for the catalog, in the openraft engine-test shape: build a state, feed one event
//! in, assert the exact outcome out (the `MergeOutcome`, the counters, the held records).
//!
//! Fixture conventions (see `shoal_catalog::testkit`): region `test`, service `prod/api/http`,
//! nodes `node-0..node-7`; `fx.lifecycle(instance, generation, revision, state)` is owned by
//! `node-0`; `fx.health(instance, owner, generation, owner_boot, seq, status)`.
//!
//! One file per topic; `support` holds the fixtures they share. One test binary.

mod support;

mod deltas;
mod gc;
mod health_merge;
mod lifecycle_merge;
mod sharing;
mod transitions;
mod views;
