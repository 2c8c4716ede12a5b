//! A warning that repeats at most once per interval, counting what it held back: for refusals
//! a remote peer can cause at will (one log line per refused handshake let a single peer with a
//! certificate of another CA write a line a second, forever).
//! Used by the QUIC transport's refusals and by the agent's capped TCP ports
//! ([`crate::capped_accept`], DNS, xDS).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Shortest time between two lines of one [`LogEvery`].
pub const LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Says when to log: at most once per [`LOG_INTERVAL`].
#[derive(Debug, Default)]
pub struct LogEvery {
    /// Milliseconds since [`base`] of the last line, plus one (0 = never).
    last_ms: AtomicU64,
    held: AtomicU64,
}

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

impl LogEvery {
    /// A throttle that has never logged.
    pub const fn new() -> Self {
        Self {
            last_ms: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(lines held back since the last one)` when the caller should log now.
    pub fn check(&self) -> Option<u64> {
        let now = u64::try_from(base().elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        let last = self.last_ms.load(Ordering::Relaxed);
        let interval = u64::try_from(LOG_INTERVAL.as_millis()).unwrap_or(u64::MAX);
        if (last != 0 && now.saturating_sub(last) < interval)
            || self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.held.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.held.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_once_then_counts() {
        let l = LogEvery::new();
        assert_eq!(l.check(), Some(0));
        assert_eq!(l.check(), None);
        assert_eq!(l.check(), None);
        assert_eq!(l.held.load(Ordering::Relaxed), 2);
    }
}
