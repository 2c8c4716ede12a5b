//! Blocking queries: wait for an index to pass, bounded and jittered like Consul's.

use std::time::Duration;

use crate::state::Shared;

use super::Watched;

/// Native blocking: waits until what `watched` follows passes `index`, at most `wait_ms`
/// (default 5 min) capped at `[api] max_wait_ms`, plus jitter (see [`block_on`]).
pub(super) async fn block(shared: &Shared, watched: Watched<'_>, index: u64, wait_ms: Option<u64>) {
    let wait = wait_ms
        .unwrap_or(DEFAULT_WAIT_MS)
        .min(shared.cfg.raw.api.max_wait_ms);
    block_on(shared, watched, index, wait).await;
}

/// Default native blocking wait, ms (Consul's).
pub(super) const DEFAULT_WAIT_MS: u64 = 300_000;

/// Waits until the index of what `watched` follows is above `index`, or `wait_ms` plus a
/// random jitter of up to `wait_ms / 16` elapses (Consul adds it so that watchers woken
/// together do not all come back at once). Returns at once when the index is already above.
pub(crate) async fn block_on(shared: &Shared, watched: Watched<'_>, index: u64, wait_ms: u64) {
    let wait = wait_ms + super::rng::upto(wait_ms / 16);
    let mut rx = shared.index.subscribe(watched);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait);
    loop {
        if *rx.borrow_and_update() > index {
            return;
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            // Timed out, or the sender went away (agent shutting down).
            Ok(Err(_)) | Err(_) => return,
        }
    }
}
