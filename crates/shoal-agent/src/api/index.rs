//! Blocking-query indexes (ADR 0011): one per service, one for the member list, one for the
//! whole view; all drawn from one counter so they compare with each other.
//!
//! **Shape.** An index is a `u64` `(boot << 32) + n`: `boot` is this agent's boot generation
//! (persisted in the data dir and bumped at every start, `crate::keys::open_boot`), `n` counts
//! view changes since this boot started (from 1). It is the agent's own owner head
//! `(owner_boot, seq)` packed in one number, so it never goes backwards across a restart: every
//! index of boot `b + 1` is above every index of boot `b`, and a watcher that carries an index
//! from before a restart is answered at once (the view may have changed while it was away).
//! Indexes stay below 2^53 (exact in JSON doubles) while `boot < 2^21`; `n` wraps into the boot
//! bits only after 2^32 changes in one boot (~300 days at 167 changes/s).
//!
//! **Per service.** A change names the services it touches (a lifecycle or health record: its
//! key; a member up/down: the services with endpoints on that node; an ejection: the
//! ejected instance's service; a full snapshot: every service). Only their indexes move, so a
//! watch on one service wakes only for it. A service never changed in this boot has the first
//! index of the boot (`floor`).
//!
//! **Bounds.** One `watch` channel per service that changed or is watched, at most
//! [`MAX_WATCHED_SERVICES`]; past it, channels without watchers are dropped (their service
//! falls back to `floor`, which only ever makes a watcher return early, never late), and if
//! still full a watcher follows the whole-view index instead (counted in
//! `shoal_api_index_overflow_total`).

use std::collections::HashMap;
use std::sync::Mutex;

use shoal_proto::{Generation, ServiceKey};
use tokio::sync::watch;

/// Most per-service index channels held.
pub const MAX_WATCHED_SERVICES: usize = 65_536;

/// The indexes of one agent's view.
#[derive(Debug)]
pub struct ViewIndex {
    /// Whole view: bumped by every change.
    global: watch::Sender<u64>,
    /// Member list.
    members: watch::Sender<u64>,
    /// Services, and the index every service has at least (raised by full snapshots).
    services: Mutex<Services>,
}

#[derive(Debug)]
struct Services {
    floor: u64,
    by_key: HashMap<ServiceKey, watch::Sender<u64>>,
}

/// What a blocking query follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched<'a> {
    /// Every change (`/v1/services`, `/v1/agent/*`).
    All,
    /// Membership changes (`/v1/agent/members`, Consul's `/v1/catalog/nodes`).
    Members,
    /// One service.
    Service(&'a ServiceKey),
}

impl ViewIndex {
    /// The first index of boot `boot`: `(boot << 32) + 1`.
    pub fn first_of_boot(boot: Generation) -> u64 {
        boot.0.saturating_mul(1 << 32).saturating_add(1)
    }

    /// Indexes starting at the first index of `boot`.
    pub fn new(boot: Generation) -> Self {
        let first = Self::first_of_boot(boot);
        Self {
            global: watch::channel(first).0,
            members: watch::channel(first).0,
            services: Mutex::new(Services {
                floor: first,
                by_key: HashMap::new(),
            }),
        }
    }

    /// The whole-view index: the last change of anything.
    pub fn current(&self) -> u64 {
        *self.global.borrow()
    }

    /// The index of the last change of the member list.
    pub fn members(&self) -> u64 {
        *self.members.borrow()
    }

    /// The index of the last change of `key`'s view.
    pub fn service(&self, key: &ServiceKey) -> u64 {
        let s = self.services.lock().expect("index lock");
        s.by_key.get(key).map_or(s.floor, |tx| *tx.borrow())
    }

    /// The index of what `w` follows.
    pub fn of(&self, w: Watched<'_>) -> u64 {
        match w {
            Watched::All => self.current(),
            Watched::Members => self.members(),
            Watched::Service(k) => self.service(k),
        }
    }

    fn next(&self) -> u64 {
        let mut out = 0;
        self.global.send_modify(|i| {
            *i += 1;
            out = *i;
        });
        out
    }

    /// A change that touches no service and no member (e.g. a local status change): only the
    /// whole-view index moves. Returns the new index.
    pub fn bump(&self) -> u64 {
        self.next()
    }

    /// A change of these services' views. Returns the new index.
    pub fn bump_services<'a>(&self, keys: impl IntoIterator<Item = &'a ServiceKey>) -> u64 {
        let i = self.next();
        let mut s = self.services.lock().expect("index lock");
        for k in keys {
            if let Some(tx) = s.by_key.get(k) {
                tx.send_replace(i);
                continue;
            }
            if s.make_room() {
                s.by_key.insert(k.clone(), watch::channel(i).0);
            } else {
                // No room: the service reads as `floor`; raise it so no watcher sleeps past
                // this change.
                s.floor = i;
                s.wake_all(i);
            }
        }
        i
    }

    /// A change of the member list (and so possibly of every service with endpoints on the
    /// member: pass those to [`ViewIndex::bump_services`] too). Returns the new index.
    pub fn bump_members(&self) -> u64 {
        let i = self.next();
        self.members.send_replace(i);
        i
    }

    /// Every view may have changed (a full snapshot was installed). Returns the new index.
    pub fn bump_everything(&self) -> u64 {
        let i = self.next();
        self.members.send_replace(i);
        let mut s = self.services.lock().expect("index lock");
        s.floor = i;
        s.by_key.retain(|_, tx| tx.receiver_count() > 0);
        s.wake_all(i);
        i
    }

    /// A receiver of what `w` follows; its value is the current index of it.
    pub fn subscribe(&self, w: Watched<'_>) -> watch::Receiver<u64> {
        match w {
            Watched::All => self.global.subscribe(),
            Watched::Members => self.members.subscribe(),
            Watched::Service(k) => {
                let mut s = self.services.lock().expect("index lock");
                if let Some(tx) = s.by_key.get(k) {
                    return tx.subscribe();
                }
                if s.make_room() {
                    let floor = s.floor;
                    return s
                        .by_key
                        .entry(k.clone())
                        .or_insert_with(|| watch::channel(floor).0)
                        .subscribe();
                }
                metrics::counter!("shoal_api_index_overflow_total").increment(1);
                self.global.subscribe()
            }
        }
    }
}

impl Services {
    /// True when one more channel fits (after dropping unwatched ones if needed).
    fn make_room(&mut self) -> bool {
        if self.by_key.len() < MAX_WATCHED_SERVICES {
            return true;
        }
        // Dropping an unwatched channel lowers its service to `floor`: raise the floor to the
        // highest dropped index so no service index goes backwards.
        let mut highest = self.floor;
        self.by_key.retain(|_, tx| {
            let keep = tx.receiver_count() > 0;
            if !keep {
                highest = highest.max(*tx.borrow());
            }
            keep
        });
        if highest > self.floor {
            self.floor = highest;
            let f = self.floor;
            self.wake_all(f);
        }
        self.by_key.len() < MAX_WATCHED_SERVICES
    }

    /// Raises every channel to at least `i`.
    fn wake_all(&self, i: u64) {
        for tx in self.by_key.values() {
            tx.send_if_modified(|v| {
                let up = *v < i;
                if up {
                    *v = i;
                }
                up
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> ServiceKey {
        ServiceKey::new("prod", s, "http").unwrap()
    }

    #[test]
    fn indexes_grow_across_boots() {
        let a = ViewIndex::new(Generation(1));
        for _ in 0..1000 {
            a.bump_services([&key("web")]);
        }
        let before_restart = a.service(&key("web"));
        let b = ViewIndex::new(Generation(2));
        assert!(b.service(&key("web")) > before_restart);
        assert!(b.current() > a.current());
        assert!(b.members() > a.members());
        assert_eq!(b.current(), (2 << 32) + 1);
    }

    #[test]
    fn a_service_moves_only_when_it_changes() {
        let ix = ViewIndex::new(Generation(1));
        let web = key("web");
        let db = key("db");
        let mut rx = ix.subscribe(Watched::Service(&web));
        let start = *rx.borrow_and_update();
        ix.bump_services([&db]);
        ix.bump_members();
        assert!(
            !rx.has_changed().unwrap(),
            "db and members must not wake web"
        );
        assert_eq!(ix.service(&web), start);
        let i = ix.bump_services([&web]);
        assert!(rx.has_changed().unwrap());
        assert_eq!((ix.service(&web), *rx.borrow()), (i, i));
        assert!(ix.service(&db) < i);
        // A full snapshot moves everything, members too.
        let j = ix.bump_everything();
        assert_eq!((ix.service(&web), ix.service(&db), ix.members()), (j, j, j));
    }

    #[test]
    fn dropping_unwatched_channels_never_lowers_an_index() {
        let ix = ViewIndex::new(Generation(1));
        let keys: Vec<_> = (0..MAX_WATCHED_SERVICES + 10)
            .map(|i| key(&format!("s{i}")))
            .collect();
        let changed: Vec<u64> = keys.iter().map(|k| ix.bump_services([k])).collect();
        assert!(ix.services.lock().unwrap().by_key.len() <= MAX_WATCHED_SERVICES);
        // Every service reads at least as high as its last change.
        for (k, i) in keys.iter().zip(&changed) {
            assert!(ix.service(k) >= *i, "{k} went backwards");
        }
    }
}
