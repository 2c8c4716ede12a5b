//! The monotonic clock the mesh core is fed with.

use std::time::Duration;

use tokio::time::Instant;

/// Monotonic milliseconds since an origin, on tokio's clock (so `tokio::time::pause` and
/// `advance` drive it in tests). The mesh core requires `now_ms` never to decrease
/// (docs/invariants.md); an `Instant` cannot go backwards, so neither can this.
#[derive(Debug, Clone, Copy)]
pub struct MonoClock {
    origin: Instant,
}

impl MonoClock {
    /// A clock whose zero is `origin`.
    pub fn new(origin: Instant) -> Self {
        Self { origin }
    }

    /// A clock whose zero is now.
    pub fn start() -> Self {
        Self::new(Instant::now())
    }

    /// The origin.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// Milliseconds since the origin (saturating at `u64::MAX`).
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The instant `ms` milliseconds after the origin (saturating far in the future).
    pub fn at(&self, ms: u64) -> Instant {
        self.origin
            .checked_add(Duration::from_millis(ms))
            .unwrap_or_else(|| self.origin + Duration::from_secs(86_400 * 365 * 30))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn now_follows_tokio_time_and_at_inverts_it() {
        let c = MonoClock::start();
        assert_eq!(c.now_ms(), 0);
        tokio::time::advance(Duration::from_millis(1_250)).await;
        assert_eq!(c.now_ms(), 1_250);
        assert_eq!(c.at(1_250), Instant::now());
        assert!(c.at(u64::MAX) > c.at(1_250));
    }
}
