//! Probe definitions of local instances, persisted in `probes.json` in the data directory, so
//! that an agent restart (graceful or `kill -9`) resumes the probes of instances registered over
//! the local API. Without this, an instance whose agent restarted stayed READY and routable
//! everywhere with nobody probing it, and traffic went to a dead backend until its owner
//! re-registered.
//!
//! At start, [`crate::agent::restore_probes`] restarts the probes of every persisted entry whose
//! instance is still held by this node in the loaded catalog, at the same generation and not
//! EXPIRED; other entries are dropped. A missing file is empty; a corrupt one is logged,
//! counted (`shoal_rejected_inputs_total{source="probes_file",reason="decode"}`) and treated as
//! empty (the instances are then judged on lifecycle and owner liveness only, as before, until
//! re-registered). The file is replaced atomically, mode 0600, at most [`MAX_PERSISTED`] entries.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use shoal_proto::{Generation, InstanceId, ServiceKey};

use crate::probes::{ExecAs, ProbeSet};

/// File name in the data directory.
pub const PROBES_FILE: &str = "probes.json";
/// Most entries kept (the same bound as the owners table).
pub const MAX_PERSISTED: usize = crate::access::MAX_OWNED;

/// One instance's probes, as persisted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PersistedProbes {
    /// Service key (`namespace/service/port`).
    pub service: String,
    /// Instance id.
    pub instance: String,
    /// Generation the probes report health for.
    pub generation: u64,
    /// The instance's registered address (the probes' default target).
    pub address: SocketAddr,
    /// The probes.
    pub probes: ProbeSet,
    /// Uid/gid exec probes run as (`None`: the agent's own, for `[[instances]]`).
    #[serde(default)]
    pub exec_as: Option<(u32, u32)>,
}

impl PersistedProbes {
    /// The parsed key, instance and generation, or `None` when the entry is malformed.
    pub fn ids(&self) -> Option<(ServiceKey, InstanceId, Generation)> {
        Some((
            self.service.parse().ok()?,
            InstanceId::new(self.instance.clone()).ok()?,
            Generation(self.generation),
        ))
    }

    /// Who exec probes run as.
    pub fn exec_as(&self) -> Option<ExecAs> {
        self.exec_as.map(|(uid, gid)| ExecAs { uid, gid })
    }
}

/// The persisted probe table.
#[derive(Debug)]
pub struct LocalProbes {
    path: PathBuf,
    map: Mutex<BTreeMap<(String, String), PersistedProbes>>,
}

impl LocalProbes {
    /// Loads `dir/probes.json` (missing: empty; corrupt: logged, counted, empty).
    pub fn load(dir: &Path) -> Self {
        let path = dir.join(PROBES_FILE);
        let mut map = BTreeMap::new();
        match crate::persist::read_state_file(&path) {
            Ok(b) => match serde_json::from_slice::<Vec<PersistedProbes>>(&b) {
                Ok(v) => {
                    for e in v.into_iter().take(MAX_PERSISTED) {
                        map.insert((e.service.clone(), e.instance.clone()), e);
                    }
                }
                Err(e) => {
                    crate::metrics::rejected("probes_file", "decode");
                    tracing::error!(file = %path.display(), error = %e, "probes file unreadable; probes of API-registered instances not resumed");
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "probes file unreadable");
            }
        }
        Self {
            path,
            map: Mutex::new(map),
        }
    }

    /// Every persisted entry.
    pub fn entries(&self) -> Vec<PersistedProbes> {
        self.map.lock().expect("probes").values().cloned().collect()
    }

    /// Records (and persists) the probes of an instance; a full table is logged, not grown.
    pub fn set(&self, entry: PersistedProbes) {
        let mut map = self.map.lock().expect("probes");
        let k = (entry.service.clone(), entry.instance.clone());
        if map.len() >= MAX_PERSISTED && !map.contains_key(&k) {
            tracing::error!(
                max = MAX_PERSISTED,
                "probes table full; these probes are not resumed after a restart"
            );
            return;
        }
        map.insert(k, entry);
        self.save(&map);
    }

    /// Forgets (and persists the removal of) an instance's probes.
    pub fn remove(&self, key: &ServiceKey, instance: &InstanceId) {
        let mut map = self.map.lock().expect("probes");
        if map
            .remove(&(key.to_string(), instance.to_string()))
            .is_some()
        {
            self.save(&map);
        }
    }

    fn save(&self, map: &BTreeMap<(String, String), PersistedProbes>) {
        let v: Vec<&PersistedProbes> = map.values().collect();
        let bytes = serde_json::to_vec(&v).expect("probe entries serialise");
        if let Err(e) = crate::keys::write_atomic(&self.path, &bytes, 0o600) {
            metrics::counter!("shoal_persist_total", "what" => "probes", "result" => "error")
                .increment(1);
            tracing::error!(file = %self.path.display(), error = %e, "probes file not written");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::{ProbeAction, ProbeSpec};

    fn entry(instance: &str) -> PersistedProbes {
        PersistedProbes {
            service: "prod/web/http".into(),
            instance: instance.into(),
            generation: 7,
            address: "10.0.0.7:8080".parse().unwrap(),
            probes: ProbeSet {
                startup: None,
                readiness: Some(ProbeSpec {
                    action: ProbeAction::Tcp { address: None },
                    period_ms: 1000,
                    timeout_ms: 500,
                    jitter_ms: 0,
                    success_threshold: 1,
                    failure_threshold: 3,
                }),
                liveness: None,
            },
            exec_as: Some((995, 994)),
        }
    }

    #[test]
    fn entries_survive_a_reload_and_removals_persist() {
        let dir = tempfile::tempdir().unwrap();
        let p = LocalProbes::load(dir.path());
        assert!(p.entries().is_empty());
        p.set(entry("a"));
        p.set(entry("b"));
        let again = LocalProbes::load(dir.path());
        assert_eq!(again.entries(), vec![entry("a"), entry("b")]);
        let (key, inst, generation) = entry("a").ids().unwrap();
        assert_eq!(generation, Generation(7));
        again.remove(&key, &inst);
        assert_eq!(LocalProbes::load(dir.path()).entries(), vec![entry("b")]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(PROBES_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_corrupt_file_loads_empty() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(PROBES_FILE), b"{not json").unwrap();
        assert!(LocalProbes::load(dir.path()).entries().is_empty());
    }
}
