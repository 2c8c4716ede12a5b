//! Joining the region: the backoff between attempts and the seed list of one attempt.

use std::net::SocketAddr;
use std::time::Duration;

use crate::boot::Jitter;

/// Longest wait for one seed name to resolve.
pub const SEED_RESOLVE_TIMEOUT_MS: u64 = 2_000;

/// Exponential backoff with full jitter (the "Full Jitter" variant of AWS's "Exponential
/// Backoff And Jitter", 2015): attempt `a` waits uniformly in `0..=min(base·2^min(a,20), max)`.
/// Full jitter spreads a region's simultaneous rejoins (after a seed outage) the most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Ceiling of the first wait, ms.
    pub base_ms: u64,
    /// Largest ceiling, ms (at least `base_ms`).
    pub max_ms: u64,
}

impl Backoff {
    /// The ceiling of attempt `attempt` (0-based), ms.
    pub fn ceiling_ms(&self, attempt: u32) -> u64 {
        self.base_ms
            .saturating_mul(1u64 << attempt.min(20))
            .min(self.max_ms.max(self.base_ms))
    }

    /// The wait before the next attempt after `attempt` failed ones, ms.
    pub fn delay_ms(&self, attempt: u32, jitter: &mut Jitter) -> u64 {
        jitter.upto(self.ceiling_ms(attempt))
    }
}

/// Resolves `names` (`host:port`, IPs or DNS names; each bounded by
/// [`SEED_RESOLVE_TIMEOUT_MS`]; one that does not resolve is logged at debug and skipped),
/// appends `extra` (e.g. persisted members), drops `me`, sorts and deduplicates.
pub async fn resolve_seeds(
    names: &[String],
    extra: &[SocketAddr],
    me: SocketAddr,
) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for s in names {
        match tokio::time::timeout(
            Duration::from_millis(SEED_RESOLVE_TIMEOUT_MS),
            tokio::net::lookup_host(s.as_str()),
        )
        .await
        {
            Ok(Ok(addrs)) => out.extend(addrs),
            _ => tracing::debug!(seed = %s, "seed did not resolve"),
        }
    }
    out.extend_from_slice(extra);
    out.retain(|a| *a != me);
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_then_cap_and_delays_stay_under_them() {
        let b = Backoff {
            base_ms: 100,
            max_ms: 1_000,
        };
        let ceilings: Vec<u64> = (0..6).map(|a| b.ceiling_ms(a)).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(b.ceiling_ms(u32::MAX), 1_000);
        let mut j = Jitter::from_seed(1);
        for a in 0..30 {
            assert!(b.delay_ms(a, &mut j) <= b.ceiling_ms(a));
        }
        let tiny = Backoff {
            base_ms: 100,
            max_ms: 10,
        };
        assert_eq!(tiny.ceiling_ms(3), 100, "max below base is raised to base");
    }

    #[tokio::test]
    async fn seeds_are_resolved_merged_without_self_sorted_and_deduplicated() {
        let me: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let extra: Vec<SocketAddr> = vec!["127.0.0.3:7000".parse().unwrap(), me];
        let names = vec![
            "127.0.0.3:7000".to_owned(),
            "127.0.0.2:7000".to_owned(),
            "127.0.0.1:7000".to_owned(),
            "not a seed".to_owned(),
        ];
        let got = resolve_seeds(&names, &extra, me).await;
        let want: Vec<SocketAddr> = vec![
            "127.0.0.2:7000".parse().unwrap(),
            "127.0.0.3:7000".parse().unwrap(),
        ];
        assert_eq!(got, want);
    }
}
