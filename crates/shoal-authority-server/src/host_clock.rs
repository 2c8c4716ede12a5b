//! The host's monotonic clock, readable across process restarts
//! (docs/adr/0024-lease-credit-across-process-restarts.md).
//!
//! A new leader credits the time since it applied the latest lease checkpoint
//! (docs/adr/0008-lease-checkpoints.md). A [`std::time::Instant`] cannot measure that across a
//! restart of the replica's process: it cannot be written down. `CLOCK_MONOTONIC` can: it
//! counts from the host's boot, the same for every process on the host, and it stops while
//! the host is suspended, so it never runs ahead of real time. A reading tagged with the boot
//! it belongs to (`/proc/sys/kernel/random/boot_id`) is a [`HostInstant`]; a later process
//! of the same boot can measure from it, and one of another boot knows it cannot.

use std::sync::OnceLock;

use nix::time::{clock_gettime, ClockId};

/// Where Linux names the current boot (a random UUID per boot).
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// One reading of the host's monotonic clock, tagged with the boot it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostInstant {
    /// The boot's id: readings of different boots do not compare. Never contains white space.
    pub boot: String,
    /// `CLOCK_MONOTONIC` in ms since that boot.
    pub ms: u64,
}

/// A source of [`HostInstant`]s: [`HostInstant::now`], or a fixed clock in tests.
pub type HostClock = fn() -> Option<HostInstant>;

/// A source of Unix wall-clock ms: [`crate::server::wall_ms`], or a fixed clock in tests.
pub type WallClock = fn() -> u64;

impl HostInstant {
    /// The host clock now; `None` where the boot id or the clock cannot be read (not Linux,
    /// no `/proc`): callers then measure within their own process only.
    pub fn now() -> Option<Self> {
        static BOOT: OnceLock<Option<String>> = OnceLock::new();
        let boot = BOOT
            .get_or_init(|| {
                let id = std::fs::read_to_string(BOOT_ID_PATH).ok()?;
                let id = id.trim();
                (!id.is_empty() && !id.contains(char::is_whitespace)).then(|| id.to_owned())
            })
            .clone()?;
        let t = clock_gettime(ClockId::CLOCK_MONOTONIC).ok()?;
        let ms = u64::try_from(t.tv_sec())
            .ok()?
            .saturating_mul(1_000)
            .saturating_add(u64::try_from(t.tv_nsec()).ok()? / 1_000_000);
        Some(Self { boot, ms })
    }

    /// Milliseconds from `earlier` to `self` (0 if `earlier` is later), or `None` when they
    /// belong to different boots and cannot be compared.
    pub fn ms_since(&self, earlier: &HostInstant) -> Option<u64> {
        (self.boot == earlier.boot).then(|| self.ms.saturating_sub(earlier.ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_of_one_boot_compare_and_of_two_boots_do_not() {
        let a = HostInstant::now().expect("Linux: boot id and CLOCK_MONOTONIC");
        let b = HostInstant::now().unwrap();
        assert_eq!(a.boot, b.boot);
        assert!(b.ms_since(&a).is_some());
        assert_eq!(a.ms_since(&b), Some(0), "saturates when `earlier` is later");
        let other = HostInstant {
            boot: "another-boot".into(),
            ms: 0,
        };
        assert_eq!(a.ms_since(&other), None);
        assert_eq!(
            HostInstant {
                boot: "x".into(),
                ms: 5_000
            }
            .ms_since(&HostInstant {
                boot: "x".into(),
                ms: 1_500
            }),
            Some(3_500)
        );
    }
}
