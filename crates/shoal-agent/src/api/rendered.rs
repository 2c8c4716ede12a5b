//! Rendered `endpoints` arrays, reused by the reads of one [`View`] on one worker thread.
//!
//! `GET .../endpoints` spent ~15 % of its CPU serialising the same endpoints again for every
//! read between two changes (docs/benchmarks/agent.md, perf at 5k req/s). The array of an
//! unfiltered read is a function of the view alone when no endpoint is ejected (an ejection
//! lapses with time, so then every read renders afresh), so each worker thread keeps the arrays
//! it rendered for the current view's [`View::generation`] and drops them all when a newer
//! view appears. Thread-local, so reads take no lock and share nothing; the price is that
//! each worker may hold its own copy, bounded by [`MAX_RENDERED_BYTES_PER_THREAD`].

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use serde_json::value::RawValue;
use shoal_proto::ServiceKey;

use crate::state::View;

/// Bound of the rendered arrays one worker thread holds (bytes of JSON, plus each key and
/// [`ENTRY_OVERHEAD_BYTES`] per entry). Past it, new arrays are rendered for each read and
/// not kept until the view changes. A 16-endpoint array is
/// ~6.7 kB, so this keeps ~300 services per thread, first come: a caller's working set, not a
/// region's 2,000 (~13 MB, which would double an agent's RSS budget of 64 MiB with 2 workers).
pub const MAX_RENDERED_BYTES_PER_THREAD: usize = 2 << 20;

#[derive(Default)]
struct Rendered {
    /// The view generation the arrays belong to.
    generation: u64,
    /// What the kept arrays are charged: JSON, keys and per-entry overhead.
    bytes: usize,
    arrays: HashMap<ServiceKey, Rc<RawValue>>,
}

thread_local! {
    static RENDERED: RefCell<Rendered> = RefCell::new(Rendered::default());
}

/// Bytes an entry is charged beyond its JSON: the map slot, the `Rc` header and the key's
/// heap parts (a rough upper bound; the bound is on memory, not on JSON alone).
const ENTRY_OVERHEAD_BYTES: usize = 128;

/// Whether the unfiltered array of `key` in `view` may be reused: the catalog holds the
/// service (a caller cannot fill the cache with made-up names: the kept keys are bounded by
/// the catalog's services) and no ejection is held (an ejection lapses with time).
pub(super) fn cacheable(view: &View, key: &ServiceKey) -> bool {
    view.ejections.is_empty() && view.catalog.service(key).is_some()
}

/// The rendered unfiltered `endpoints` array of `key` in `view`: this thread's copy if it has
/// one for `view`'s generation, else `render()`'s, kept while under the bound.
///
/// # Errors
/// `render`'s error (nothing is kept).
pub(super) fn endpoints_array(
    view: &View,
    key: &ServiceKey,
    render: impl FnOnce() -> serde_json::Result<Box<RawValue>>,
) -> serde_json::Result<Rc<RawValue>> {
    RENDERED.with(|cell| {
        let mut r = cell.borrow_mut();
        if r.generation != view.generation {
            r.arrays.clear();
            r.bytes = 0;
            r.generation = view.generation;
        }
        if let Some(a) = r.arrays.get(key) {
            return Ok(a.clone());
        }
        let a: Rc<RawValue> = Rc::from(render()?);
        let len = a.get().len() + key.to_string().len() + ENTRY_OVERHEAD_BYTES;
        if r.bytes + len <= MAX_RENDERED_BYTES_PER_THREAD {
            r.bytes += len;
            r.arrays.insert(key.clone(), a.clone());
        }
        Ok(a)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> serde_json::Result<Box<RawValue>> {
        RawValue::from_string(s.to_owned())
    }

    #[test]
    fn an_array_is_rendered_once_per_view_generation() {
        let key: ServiceKey = "prod/web/http".parse().unwrap();
        let mut view = View {
            generation: 7,
            ..View::default()
        };
        let first = endpoints_array(&view, &key, || raw("[1]")).unwrap();
        let again = endpoints_array(&view, &key, || panic!("rendered twice")).unwrap();
        assert_eq!((first.get(), again.get()), ("[1]", "[1]"));
        view.generation = 8;
        let newer = endpoints_array(&view, &key, || raw("[2]")).unwrap();
        assert_eq!(newer.get(), "[2]");
    }

    #[test]
    fn arrays_past_the_bound_are_served_but_not_kept() {
        let view = View {
            generation: 42,
            ..View::default()
        };
        let a: ServiceKey = "prod/a/http".parse().unwrap();
        // a is kept, and no 3-byte array fits beside it.
        let room = MAX_RENDERED_BYTES_PER_THREAD - ENTRY_OVERHEAD_BYTES - a.to_string().len();
        let big = format!("[{}1]", "1,".repeat((room - 3) / 2));
        assert!(big.len() <= room && big.len() + 3 + ENTRY_OVERHEAD_BYTES > room);
        let b: ServiceKey = "prod/b/http".parse().unwrap();
        endpoints_array(&view, &a, || raw(&big)).unwrap();
        let mut renders = 0;
        for _ in 0..2 {
            let got = endpoints_array(&view, &b, || {
                renders += 1;
                raw("[3]")
            })
            .unwrap();
            assert_eq!(got.get(), "[3]");
        }
        assert_eq!(
            renders, 2,
            "b does not fit beside a, so each read renders it"
        );
        endpoints_array(&view, &a, || panic!("a was kept")).unwrap();
    }

    #[test]
    fn only_services_the_catalog_holds_are_kept_and_none_while_an_ejection_is_held() {
        use shoal_proto::{Generation, InstanceId, LifecycleState};
        let fx = shoal_catalog::testkit::Fixture::new();
        let mut view = View::default();
        let rec = fx.lifecycle("web-1", 1, 1, LifecycleState::Ready);
        let merged = view
            .catalog
            .apply_lifecycle(std::sync::Arc::new(rec), &fx.keyring);
        assert_eq!(merged, shoal_catalog::MergeOutcome::Applied);
        let unknown: ServiceKey = "prod/made-up/http".parse().unwrap();
        assert!(cacheable(&view, &fx.key));
        assert!(
            !cacheable(&view, &unknown),
            "made-up names would fill the cache"
        );
        view.ejections = std::sync::Arc::new(
            [((InstanceId::new("web-1").unwrap(), Generation(1)), 500)]
                .into_iter()
                .collect(),
        );
        assert!(!cacheable(&view, &fx.key), "an ejection lapses with time");
    }
}
