//! The **development** authority: the pure rules of `shoal-authority` ([`AuthorityState::apply`])
//! run in-process with a well-known, INSECURE region key, so a single node or an all-dev
//! cluster works before the real (Raft-replicated) authority is deployed. Its state is persisted
//! in the data directory so revisions and generations keep growing across restarts.
//!
//! Every applied command is appended to `audit.log` in the data directory as one JSON
//! [`shoal_authority::AuditEntry`] per line, the format of the real authority's audit log
//! (including `on_behalf_of`, the local process a write was made for).
//!
//! Never use it in production: anyone can derive the key from the region name.

use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use shoal_authority::{
    Admission, ApplyContext, AuthorityCommand, AuthorityState, Caller, Query, Refusal, ReplayCache,
    Routed, WriteAnswer,
};
use shoal_proto::rpc::{
    AuthorityError, AuthorityOk, AuthorityRequestBody, AuthorityStatus, LocalCaller,
};
use shoal_proto::{NodeId, Region, SigningKey};

use crate::keys::write_atomic;

/// File name of the persisted dev authority state.
pub const DEV_STATE_FILE: &str = "dev-authority.state";
/// File name of the dev authority's audit log (JSON lines, as the real authority's).
pub const DEV_AUDIT_FILE: &str = "audit.log";

/// How far above what the mesh holds a dev authority that lost its state starts numbering
/// ([`DevAuthority::open`]): the agent's persisted catalog may lag what the region issued by
/// the writes since it was last saved, far fewer than this on a development cluster.
pub const DEV_FLOOR_MARGIN: u64 = 1_000_000;

/// What this agent's catalog holds of its own region's authority chain, read when the dev
/// authority opens and before each write: the largest revision and the largest boot
/// generation seen (0 and 0 for an empty catalog). A state that numbers below them would re-issue revisions and generations
/// the region already used, and agents would drop those writes as stale or conflicting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldByMesh {
    /// Largest revision of the region seen.
    pub revision: u64,
    /// Largest boot generation of a held record of the region.
    pub generation: u64,
}

impl HeldByMesh {
    /// What `catalog` holds of `region`: the largest revision its head has seen or a held
    /// record carries, and the largest generation of a held record. A pass over the entries
    /// (a development catalog is small; the head alone can miss revisions past its bounded
    /// set of pending ones).
    pub fn of(catalog: &shoal_catalog::Catalog, region: &Region) -> Self {
        let seen = catalog
            .heads()
            .regions
            .iter()
            .find(|h| &h.region == region)
            .map_or(0, |h| h.max_seen.0);
        catalog
            .entries()
            .map(|(_, _, e)| &e.lifecycle().record)
            .filter(|r| &r.region == region)
            .fold(
                Self {
                    revision: seen,
                    generation: 0,
                },
                |held, r| Self {
                    revision: held.revision.max(r.revision.0),
                    generation: held.generation.max(r.generation.0),
                },
            )
    }
}

/// The well-known development key of `region` (INSECURE by construction).
pub fn dev_key(region: &Region) -> SigningKey {
    let mut seed = *b"shoal-INSECURE-dev-authority-key";
    for (i, b) in region.as_str().bytes().enumerate() {
        seed[i % 32] ^= b.rotate_left((i / 32) as u32);
    }
    SigningKey::from_seed(seed)
}

/// The in-process development authority.
pub struct DevAuthority {
    state: AuthorityState,
    key: SigningKey,
    node: NodeId,
    path: PathBuf,
    audit_path: PathBuf,
    audit_failed_logged: bool,
    /// A failed state save was logged (cleared by the next save that succeeds).
    save_failed_logged: bool,
    /// Why writes are refused: the state file could not be read nor moved aside.
    write_blocked: Option<String>,
    /// Committed answers of remote callers' writes, for their retries (`shoal_authority::replay`).
    replays: ReplayCache,
}

impl DevAuthority {
    /// Loads the persisted state from `data_dir`. An unreadable state file (torn, corrupt, of an
    /// older build, not a regular file) is moved aside to `<name>.corrupt-<unix ms>`, never
    /// overwritten, and the authority starts empty; if it cannot be moved aside, writes are
    /// refused (503) until it is moved away and the agent restarted, since the next save would
    /// replace what it holds.
    ///
    /// A state that is behind what the mesh holds (`held`: started empty after its file was
    /// lost or set aside, or an older copy put back) would re-issue used revisions and
    /// generations, and every write it acknowledged would be dropped by agents. Its numbering
    /// is raised above `held` plus [`DEV_FLOOR_MARGIN`] first (`AuthorityState::raise_floor`,
    /// ADR 0007's restore rule) and saved. Instances it no longer knows must be registered
    /// again (their new generation supersedes the held one).
    pub fn open(
        region: Region,
        node: NodeId,
        data_dir: &std::path::Path,
        held: HeldByMesh,
    ) -> Self {
        let path = data_dir.join(DEV_STATE_FILE);
        let (state, unreadable) = match crate::persist::read_state_file(&path) {
            Ok(b) => match AuthorityState::decode(&b) {
                Ok(s) => (s, None),
                Err(e) => (AuthorityState::new(region.clone()), Some(e.to_string())),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                (AuthorityState::new(region.clone()), None)
            }
            Err(e) => (AuthorityState::new(region.clone()), Some(e.to_string())),
        };
        let write_blocked = unreadable.and_then(|error| set_aside(&path, &error));
        let mut state = state;
        if is_behind(&state, held) && write_blocked.is_none() {
            raise_above(&mut state, held, &path);
        }
        Self {
            key: dev_key(&region),
            state,
            node,
            path,
            audit_path: data_dir.join(DEV_AUDIT_FILE),
            audit_failed_logged: false,
            save_failed_logged: false,
            write_blocked,
            replays: ReplayCache::default(),
        }
    }

    /// Before a write: raises the numbering if the mesh now holds a revision or generation
    /// this state has not issued (the data directory was replaced while the region kept its
    /// records, so the catalog was empty at [`DevAuthority::open`] and anti-entropy has filled
    /// it since).
    pub fn catch_up(&mut self, held: HeldByMesh) {
        if self.write_blocked.is_none() && is_behind(&self.state, held) {
            raise_above(&mut self.state, held, &self.path);
        }
    }

    /// The public key peers must trust (`[trust] dev_authority = true` does it).
    pub fn verifying_key(&self) -> shoal_proto::VerifyingKey {
        self.key.verifying_key()
    }

    /// Handles one request from `caller`. Committed records must be published to the mesh by
    /// the caller of this function.
    pub fn handle(
        &mut self,
        caller: NodeId,
        body: AuthorityRequestBody,
    ) -> Result<AuthorityOk, AuthorityError> {
        self.handle_for(caller, body, None)
    }

    /// Handles request `request_id` from another agent: a retry of a write already committed
    /// (the same `request_id` from the same caller within [`shoal_authority::replay::REPLAY_TTL_MS`])
    /// is answered with the first answer and not applied again. Without this, the attempts an
    /// agent queued while this one was stopped (`kill -STOP`) were all applied when it resumed:
    /// one registration became five boot generations.
    pub fn handle_request(
        &mut self,
        caller: NodeId,
        request_id: u64,
        body: AuthorityRequestBody,
        on_behalf_of: Option<LocalCaller>,
        now_ms: u64,
    ) -> Result<AuthorityOk, AuthorityError> {
        if !body.is_write() {
            return self.handle_for(caller, body, on_behalf_of);
        }
        match self.replays.admit(&caller, request_id, now_ms) {
            Admission::Fresh => {}
            // Requests are handled one at a time here: nothing is ever in flight.
            Admission::InFlight => return Err(AuthorityError::NoQuorum),
            Admission::Replay(ok) => {
                metrics::counter!("shoal_authority_replays_total", "outcome" => "answered")
                    .increment(1);
                return Ok(*ok);
            }
        }
        let result = self.handle_for(caller.clone(), body, on_behalf_of);
        self.replays.finish(&caller, request_id, &result);
        result
    }

    /// As [`DevAuthority::handle`], for a request forwarded on behalf of a local process
    /// (recorded in the audit entry).
    pub fn handle_for(
        &mut self,
        caller: NodeId,
        body: AuthorityRequestBody,
        on_behalf_of: Option<LocalCaller>,
    ) -> Result<AuthorityOk, AuthorityError> {
        // The replicated authority's rules (shoal_authority::request), with no configured
        // operator list: an `operator-*` certificate is an operator.
        let caller = Caller::of_certificate(&caller, &std::collections::BTreeSet::new());
        let (cmd, answer) = match shoal_authority::route(caller, body) {
            Routed::Write { cmd, answer } => (cmd, answer),
            Routed::Query(q) => return self.query(q),
        };
        if matches!(cmd, AuthorityCommand::PutGlobalPolicy { .. }) {
            return Err(AuthorityError::Invalid(
                "the development authority holds no global policy (ADR 0013)".into(),
            ));
        }
        let committed_at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let ctx = ApplyContext {
            log_index: self.state.last_applied_index() + 1,
            committed_at_ms,
            signing_key: &self.key,
        };
        if self.write_blocked.is_some() {
            metrics::counter!("shoal_dev_authority_save_failures_total").increment(1);
            return Err(AuthorityError::NoQuorum);
        }
        let retry_of = cmd.transition_target();
        // An answer is only given for a state that is on disk: if saving fails the command is
        // undone (the state before it is kept aside; the dev authority's state is small) and
        // the caller is told to retry, as a Raft replica that cannot append does (ADR 0023).
        let before = self.state.clone();
        let result = self.state.apply_on_behalf(cmd, ctx, on_behalf_of);
        if let Err(e) = self.save() {
            self.state = before;
            metrics::counter!("shoal_dev_authority_save_failures_total").increment(1);
            if !self.save_failed_logged {
                tracing::error!(error = %e, file = %self.path.display(), "DEV AUTHORITY: cannot persist state; writes are refused until it can");
                self.save_failed_logged = true;
            }
            return Err(AuthorityError::NoQuorum);
        }
        self.save_failed_logged = false;
        self.append_audit();
        let records = match result {
            Ok(records) => records,
            Err(r @ Refusal::AlreadyInState(_)) => {
                // A retry of a write that committed: answer with the committed record.
                self.state.retry_answer(retry_of.as_ref()).ok_or_else(|| {
                    AuthorityError::Refused {
                        code: r.code().to_owned(),
                        reason: r.to_string(),
                    }
                })?
            }
            Err(r) => {
                return Err(AuthorityError::Refused {
                    code: r.code().to_owned(),
                    reason: r.to_string(),
                })
            }
        };
        Ok(match answer {
            WriteAnswer::Records | WriteAnswer::GlobalPolicy => AuthorityOk::Committed { records },
            WriteAnswer::Policy(key) => AuthorityOk::Policy(self.state.policy(&key).cloned()),
        })
    }

    /// Answers a request no command stands for, as a single replica with no other regions.
    fn query(&self, q: Query) -> Result<AuthorityOk, AuthorityError> {
        Ok(match q {
            Query::GetPolicy(key) => AuthorityOk::Policy(self.state.policy(&key).cloned()),
            Query::GetGlobalPolicy => AuthorityOk::GlobalPolicy(None),
            Query::FailoverFeed { .. } => AuthorityOk::Summaries {
                summaries: Vec::new(),
                policy: None,
            },
            Query::Members(_) => {
                return Err(AuthorityError::Invalid(
                    "the development authority has no replica set".into(),
                ))
            }
            Query::RegionSummaries { .. } => {
                return Err(AuthorityError::Invalid(
                    "the development authority holds no global policy (ADR 0013)".into(),
                ))
            }
            Query::Status => AuthorityOk::Status(AuthorityStatus {
                node: self.node.clone(),
                leader: Some(self.node.clone()),
                term: 0,
                applied_index: self.state.last_applied_index(),
                revision: self.state.head_revision(),
                members: vec![self.node.clone()],
                cluster_id: None,
            }),
        })
    }

    fn append_audit(&mut self) {
        use std::io::Write;
        let Some(entry) = self.state.audit().last() else {
            return;
        };
        let line = serde_json::to_string(entry).expect("audit entries serialise");
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600) // it names local callers (uid, pid, executable)
            .open(&self.audit_path)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = res {
            metrics::counter!("shoal_audit_write_failures_total").increment(1);
            if !self.audit_failed_logged {
                tracing::warn!(error = %e, file = %self.audit_path.display(), "DEV AUTHORITY: cannot append audit log");
                self.audit_failed_logged = true;
            }
        }
    }

    /// Writes the whole state to [`DEV_STATE_FILE`] (write to a temporary file, fsync, rename).
    fn save(&self) -> std::io::Result<()> {
        write_atomic(&self.path, &self.state.encode(), 0o600)
    }
}

/// True when `state` would issue a revision or generation at or below what the mesh holds.
fn is_behind(state: &AuthorityState, held: HeldByMesh) -> bool {
    held.revision >= state.next_revision().0
        || held.generation >= state.generation_at(state.last_applied_index() + 1).0
}

/// Raises `state`'s numbering above `held` plus the margin and saves it (logged; a failed save
/// is retried by the first write, which refuses itself if it fails again).
fn raise_above(state: &mut AuthorityState, held: HeldByMesh, path: &std::path::Path) {
    let floor = held
        .revision
        .max(held.generation)
        .saturating_add(DEV_FLOOR_MARGIN);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if let Err(e) = state.raise_floor(floor, format!("dev-{now_ms}")) {
        tracing::error!(error = %e, floor, "DEV AUTHORITY: cannot raise its numbering");
        return;
    }
    metrics::counter!("shoal_dev_authority_floor_raises_total").increment(1);
    tracing::error!(
        file = %path.display(),
        held_revision = held.revision,
        held_generation = held.generation,
        floor,
        "DEV AUTHORITY state is behind what the mesh holds (lost, set aside or an older copy); \
         numbering restarts above it. Instances it does not know must be registered again"
    );
    if let Err(e) = write_atomic(path, &state.encode(), 0o600) {
        tracing::error!(error = %e, file = %path.display(), "DEV AUTHORITY: cannot persist its raised numbering");
    }
}

/// Moves the unreadable state file at `path` aside; `Some(why)` when it could not be (then it
/// must not be written).
fn set_aside(path: &std::path::Path, error: &str) -> Option<String> {
    match crate::keys::set_aside(path) {
        Ok(aside) => {
            metrics::counter!("shoal_files_set_aside_total", "file" => DEV_STATE_FILE).increment(1);
            tracing::error!(
                file = %path.display(),
                kept_at = %aside.display(),
                error,
                "DEV AUTHORITY state unreadable; moved aside (nothing deleted), starting empty"
            );
            None
        }
        Err(e) => {
            tracing::error!(
                file = %path.display(),
                error,
                set_aside_error = %e,
                "DEV AUTHORITY state unreadable and could not be moved aside; writes are refused \
                 until it is moved away and the agent restarted"
            );
            Some(format!(
                "{} is unreadable and could not be moved aside ({e})",
                path.display()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register() -> AuthorityRequestBody {
        AuthorityRequestBody::Register {
            key: "prod/web/http".parse().unwrap(),
            instance: "web-1".parse().unwrap(),
            on_node: None,
            endpoint: shoal_catalog::testkit::Fixture::spec(1),
            lease_ms: 300_000,
        }
    }

    fn generation(r: &Result<AuthorityOk, AuthorityError>) -> u64 {
        match r {
            Ok(AuthorityOk::Committed { records }) => records[0].record.generation.0,
            other => panic!("not committed: {other:?}"),
        }
    }

    /// A dev authority of region `dev` on `node-a`, its files in `dir`, on an empty mesh.
    fn open(dir: &tempfile::TempDir) -> DevAuthority {
        open_held(dir, HeldByMesh::default())
    }

    fn open_held(dir: &tempfile::TempDir, held: HeldByMesh) -> DevAuthority {
        DevAuthority::open(
            "dev".parse().unwrap(),
            "node-a".parse().unwrap(),
            dir.path(),
            held,
        )
    }

    fn revision(r: &Result<AuthorityOk, AuthorityError>) -> u64 {
        match r {
            Ok(AuthorityOk::Committed { records }) => records[0].record.revision.0,
            other => panic!("not committed: {other:?}"),
        }
    }

    #[test]
    fn a_state_behind_the_mesh_numbers_above_what_the_mesh_holds() {
        let b: NodeId = "node-b".parse().unwrap();
        // The mesh holds revisions up to 40 and generations up to 12 of this region, and the
        // state file was lost (a fresh state would number from 1 and 1).
        let held = HeldByMesh {
            revision: 40,
            generation: 12,
        };
        let dir = tempfile::tempdir().unwrap();
        let mut dev = open_held(&dir, held);
        let first = dev.handle_request(b.clone(), 1, register(), None, 0);
        assert!(revision(&first) > 40 + DEV_FLOOR_MARGIN, "{first:?}");
        assert!(generation(&first) > 40 + DEV_FLOOR_MARGIN, "{first:?}");
        // Saved at open: a restart on the same mesh view keeps numbering where it was.
        let mut again = open_held(&dir, held);
        let next = again.handle_request(b.clone(), 2, register(), None, 1_000);
        assert_eq!(revision(&next), revision(&first) + 1);
        assert_eq!(generation(&next), generation(&first) + 1);
        // An unreadable file is set aside and the fresh state is raised the same way.
        std::fs::write(dir.path().join(DEV_STATE_FILE), b"torn").unwrap();
        let mut fresh = open_held(&dir, held);
        let r = fresh.handle_request(b.clone(), 3, register(), None, 2_000);
        assert!(revision(&r) > 40 + DEV_FLOOR_MARGIN, "{r:?}");
        // A state ahead of the mesh (the normal restart) is left as it was.
        let dir = tempfile::tempdir().unwrap();
        let mut dev = open(&dir);
        let one = dev.handle_request(b.clone(), 1, register(), None, 0);
        let mut reopened = open_held(
            &dir,
            HeldByMesh {
                revision: revision(&one),
                generation: generation(&one),
            },
        );
        let two = reopened.handle_request(b.clone(), 2, register(), None, 1_000);
        assert_eq!(revision(&two), revision(&one) + 1);
        // Caught up before a write: the mesh held nothing at open (a replaced data directory)
        // and anti-entropy brought revisions up to 40 since.
        let dir = tempfile::tempdir().unwrap();
        let mut wiped = open(&dir);
        wiped.catch_up(HeldByMesh::default());
        wiped.catch_up(held);
        let r = wiped.handle_request(b, 1, register(), None, 0);
        assert!(revision(&r) > 40 + DEV_FLOOR_MARGIN, "{r:?}");
    }

    #[test]
    fn a_retried_registration_is_answered_not_applied_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut dev = open(&dir);
        let b: NodeId = "node-b".parse().unwrap();
        let first = dev.handle_request(b.clone(), 42, register(), None, 0);
        let applied = dev.state.last_applied_index();
        // The attempts queued while this process was stopped: same caller, same id.
        for t in 1..5 {
            let again = dev.handle_request(b.clone(), 42, register(), None, t * 500);
            assert_eq!(again, first);
        }
        assert_eq!(
            dev.state.last_applied_index(),
            applied,
            "a retry was applied"
        );
        // A new call (another id) registers a new boot generation, as before.
        let next = dev.handle_request(b, 43, register(), None, 3_000);
        assert!(generation(&next) > generation(&first));
    }

    #[test]
    fn a_write_whose_state_cannot_be_saved_is_refused_and_undone() {
        let dir = tempfile::tempdir().unwrap();
        let mut dev = open(&dir);
        let b: NodeId = "node-b".parse().unwrap();
        let first = dev.handle_request(b.clone(), 1, register(), None, 0);
        let applied = dev.state.last_applied_index();
        let audit_lines = || {
            std::fs::read_to_string(dir.path().join(DEV_AUDIT_FILE))
                .unwrap()
                .lines()
                .count()
        };
        assert_eq!(audit_lines(), 1);
        // The state file's name is taken by a non-empty directory: the atomic replace fails
        // (as it would on a full or read-only disk, which root in CI cannot be refused).
        let state = dir.path().join(DEV_STATE_FILE);
        let saved = std::fs::read(&state).unwrap();
        std::fs::remove_file(&state).unwrap();
        std::fs::create_dir(&state).unwrap();
        std::fs::write(state.join("occupied"), b"x").unwrap();
        let refused = dev.handle_request(b.clone(), 2, register(), None, 1_000);
        assert_eq!(
            refused,
            Err(AuthorityError::NoQuorum),
            "an unsaved write was acknowledged"
        );
        assert_eq!(
            dev.state.last_applied_index(),
            applied,
            "the unsaved write stayed applied"
        );
        assert_eq!(audit_lines(), 1, "the unsaved write was audited");
        // Once the disk takes writes again the retry (same id: failures are not replayed)
        // commits, as the next generation after the first registration.
        std::fs::remove_dir_all(&state).unwrap();
        std::fs::write(&state, saved).unwrap();
        let retried = dev.handle_request(b, 2, register(), None, 2_000);
        assert_eq!(generation(&retried), generation(&first) + 1);
        assert_eq!(dev.state.last_applied_index(), applied + 1);
        assert_eq!(audit_lines(), 2);
    }
    #[test]
    fn an_unreadable_state_file_is_kept_aside_and_never_overwritten() {
        // Corrupt: moved aside with every byte, the authority starts empty and takes writes.
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join(DEV_STATE_FILE);
        std::fs::write(&state, b"not a state").unwrap();
        let mut dev = open(&dir);
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(".corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1, "the corrupt file was not kept aside");
        assert_eq!(std::fs::read(&aside[0]).unwrap(), b"not a state");
        let b: NodeId = "node-b".parse().unwrap();
        generation(&dev.handle_request(b.clone(), 1, register(), None, 0));
        // Not a regular file and not movable (a directory cannot be linked): writes are refused
        // and it is left as it was.
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join(DEV_STATE_FILE);
        std::fs::create_dir(&state).unwrap();
        std::fs::write(state.join("kept"), b"x").unwrap();
        let mut dev = open(&dir);
        let refused = dev.handle_request(b, 1, register(), None, 0);
        assert_eq!(refused, Err(AuthorityError::NoQuorum));
        assert!(state.join("kept").exists());
    }
}
