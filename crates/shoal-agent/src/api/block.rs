//! Blocking queries: wait for an index to pass, bounded and jittered like Consul's.

use std::time::Duration;

use crate::keys::Jitter;
use crate::state::Shared;

/// Waits until the view index passes `index` or the (bounded, jittered) wait elapses.
pub(super) async fn block(shared: &Shared, index: u64, wait_ms: Option<u64>) {
    let max = shared.cfg.raw.api.max_wait_ms;
    let wait = wait_ms.unwrap_or(300_000).min(max);
    // Consul adds up to wait/16 so watchers woken together do not return together.
    let wait = wait + Jitter::new().upto(wait / 16);
    let mut rx = shared.index.subscribe();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait);
    loop {
        if *rx.borrow_and_update() > index {
            return;
        }
        if tokio::time::timeout_at(deadline, rx.changed())
            .await
            .is_err()
        {
            return;
        }
    }
}
