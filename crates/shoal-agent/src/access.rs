//! Who may do what on the local socket: workload identity from unix peer credentials, the
//! `[access]` policy, and instance ownership.
//!
//! # Identity
//! Every accepted connection's peer credentials (`SO_PEERCRED`: uid, gid, pid) are read once,
//! at accept, and attached to each request on it as a [`LocalCaller`]. **Authorisation uses the
//! uid and gid only.** They are fixed by the kernel at `connect()` and cannot be changed by the
//! peer afterwards. The pid is not: once the connecting process exits its pid may be reused
//! by an unrelated process, so a check such as "pid 1234 runs /usr/bin/web" is racy unless it
//! is guarded the way SPIRE's peer tracker does (pidfd/`/proc` watching for the lifetime of
//! the connection). shoal avoids the race instead of guarding it: pid and executable
//! (`/proc/<pid>/exe`, read at accept when readable) are recorded for the audit trail only
//! (the agent's log and the authority's audit log), never used to decide.
//!
//! # Policy (`[access]`)
//! Grants map identities (uids, gids, user names, group names) to rights on service-key
//! patterns (`namespace/service/port`, each segment a glob where `*` matches any run of
//! characters; a pattern with fewer segments whose last segment is `*` covers the rest, so
//! `prod/*` is every service of `prod` and `*` is everything). Rights:
//!
//! | right | allows |
//! | --- | --- |
//! | `read` | endpoints / pick / services (only needed with `reads = "granted"`) |
//! | `register` | register new instances; re-register instances it owns |
//! | `change_own` | ready / drain / deregister instances it owns |
//! | `report` | passive-health reports and local ejection (`POST .../report`) |
//! | `orchestrator` | register, re-register and change any instance in its patterns |
//! | `admin` | everything in its patterns |
//!
//! Every right implies `read`. The agent's own uid and uid 0 are admin everywhere.
//! Writes fail closed: refused (HTTP 403, `{"error", "reason", ...}`) unless granted.
//! Reads default to open (`reads = "open"`): whoever may open the socket may read, as with
//! Consul's agent and the Kubernetes API's discovery reads; the socket's mode and group
//! (`[api] socket_mode`, `socket_group`) are the outer gate. `reads = "granted"` makes
//! endpoints and pick require a grant as well.
//!
//! Group grants match the caller's primary gid (from the credentials) or, for supplementary
//! membership, the caller's user listed as a member of the group at agent start (the
//! credentials carry no supplementary groups; a change to group membership needs a restart).
//!
//! # Ownership
//! An instance is owned by the uid that registered it. Owners are kept in `owners.json` in the
//! data directory (rewritten atomically on every change) so they survive a restart. An
//! instance registered by `[[instances]]` in the config file is owned by the agent itself.
//! Only the owner (with `change_own`), an orchestrator or an admin of the instance's service
//! may change it; re-registering an instance id owned by another uid is refused. An instance
//! of this node with no recorded owner may be changed by orchestrators and admins only.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use shoal_proto::rpc::LocalCaller;
use shoal_proto::ServiceKey;

/// File (in the data dir) holding the owners of local instances.
pub const OWNERS_FILE: &str = "owners.json";
/// Most owned instances tracked (local instances of one node; bounded like everything else).
pub const MAX_OWNED: usize = 65_536;
/// Most distinct (caller, route, reason) refusals logged; past it refusals are only counted.
pub const MAX_LOGGED_REFUSALS: usize = 4_096;

/// One right of a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Right {
    /// Read endpoints, pick, services.
    Read,
    /// Register instances (and re-register its own).
    Register,
    /// Ready / drain / deregister its own instances.
    ChangeOwn,
    /// Report outcomes / eject locally.
    Report,
    /// Register and change any instance in the patterns.
    Orchestrator,
    /// Everything in the patterns.
    Admin,
}

/// Who reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadAccess {
    /// Anyone who can open the socket may read (default).
    #[default]
    Open,
    /// Reads need a grant (any right on the service's pattern).
    Granted,
}

/// `[access]`: the local socket's authorisation policy (see the module docs).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AccessConfig {
    /// DEVELOPMENT ONLY: every caller may do everything (logged loudly at start).
    #[serde(default)]
    pub dev_allow_all: bool,
    /// Who may read: `open` (default) or `granted`.
    #[serde(default)]
    pub reads: ReadAccess,
    /// The grants.
    #[serde(default)]
    pub grants: Vec<GrantConfig>,
}

/// `[[access.grants]]`: identities, patterns and rights. An identity list may mix kinds;
/// a caller matching any of them gets the rights on every pattern.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GrantConfig {
    /// Numeric uids.
    #[serde(default)]
    pub uids: Vec<u32>,
    /// Numeric gids.
    #[serde(default)]
    pub gids: Vec<u32>,
    /// User names (resolved at start; unknown names refuse the config).
    #[serde(default)]
    pub users: Vec<String>,
    /// Group names (resolved at start with their members; unknown names refuse the config).
    #[serde(default)]
    pub groups: Vec<String>,
    /// Service-key patterns, e.g. `prod/*`, `prod/web/*`, `*`.
    pub services: Vec<String>,
    /// Rights on those patterns.
    pub rights: Vec<Right>,
}

/// A service-key pattern (`namespace/service/port` with `*` globs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    segments: Vec<String>,
}

impl Pattern {
    /// Parses a pattern.
    ///
    /// # Errors
    /// Empty, more than three segments, an empty segment, or fewer than three segments
    /// without a trailing `*`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let segments: Vec<String> = s.split('/').map(str::to_owned).collect();
        if s.is_empty() || segments.len() > 3 || segments.iter().any(String::is_empty) {
            return Err(format!(
                "pattern `{s}`: need `namespace/service/port` with `*` globs (e.g. `prod/*`)"
            ));
        }
        if segments.len() < 3 && segments.last().map(String::as_str) != Some("*") {
            return Err(format!(
                "pattern `{s}`: fewer than three segments must end in `*` (e.g. `prod/*`)"
            ));
        }
        Ok(Self { segments })
    }

    /// True when `key` matches.
    pub fn matches(&self, key: &ServiceKey) -> bool {
        let parts = [
            key.namespace.as_str(),
            key.service.as_str(),
            key.port_name.as_str(),
        ];
        for (i, seg) in self.segments.iter().enumerate() {
            let last = i + 1 == self.segments.len();
            if last && seg == "*" {
                return true; // covers this segment and every one after it
            }
            if !glob(seg, parts[i]) {
                return false;
            }
        }
        self.segments.len() == 3
    }
}

/// `*`-only glob on one segment.
fn glob(pattern: &str, text: &str) -> bool {
    let mut pieces = pattern.split('*');
    let first = pieces.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    if pieces.is_empty() {
        return rest.is_empty(); // no `*` at all: exact match
    }
    let (last, middle) = pieces.split_last().expect("non-empty");
    for p in middle {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// What a request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Read a service's endpoints.
    Read,
    /// Register (or re-register an instance it owns).
    Register,
    /// Change (ready/drain/deregister) an instance it owns.
    ChangeOwn,
    /// Register over / change an instance owned by someone else (or by nobody known).
    ChangeOthers,
    /// Report an outcome / eject.
    Report,
}

impl Action {
    fn satisfied_by(self, r: Right) -> bool {
        match r {
            Right::Admin => true,
            Right::Orchestrator => !matches!(self, Action::Report),
            Right::Read => self == Action::Read,
            Right::Register => matches!(self, Action::Register | Action::Read),
            Right::ChangeOwn => matches!(self, Action::ChangeOwn | Action::Read),
            Right::Report => matches!(self, Action::Report | Action::Read),
        }
    }

    /// Right(s) that would grant it, for refusal messages.
    pub fn needs(self) -> &'static str {
        match self {
            Action::Read => "read",
            Action::Register => "register",
            Action::ChangeOwn => "change_own",
            Action::ChangeOthers => "orchestrator or admin",
            Action::Report => "report",
        }
    }
}

#[derive(Debug, Clone)]
struct Grant {
    uids: BTreeSet<u32>,
    gids: BTreeSet<u32>,
    /// Uids that are supplementary members of a granted group (from the group database).
    member_uids: BTreeSet<u32>,
    patterns: Vec<Pattern>,
    rights: Vec<Right>,
}

impl Grant {
    fn covers(&self, who: &LocalCaller) -> bool {
        self.uids.contains(&who.uid)
            || self.gids.contains(&who.gid)
            || self.member_uids.contains(&who.uid)
    }
}

/// Looks user and group names up (the system's database; a stub in tests).
pub trait Directory {
    /// Uid of a user name.
    fn user_uid(&self, name: &str) -> Option<u32>;
    /// Gid and member user names of a group.
    fn group(&self, name: &str) -> Option<(u32, Vec<String>)>;
}

/// The system's user and group database (NSS via `getpwnam_r` / `getgrnam_r`).
pub struct SystemDirectory;

impl Directory for SystemDirectory {
    fn user_uid(&self, name: &str) -> Option<u32> {
        nix::unistd::User::from_name(name)
            .ok()
            .flatten()
            .map(|u| u.uid.as_raw())
    }
    fn group(&self, name: &str) -> Option<(u32, Vec<String>)> {
        nix::unistd::Group::from_name(name)
            .ok()
            .flatten()
            .map(|g| (g.gid.as_raw(), g.mem))
    }
}

/// A compiled policy.
#[derive(Debug, Clone)]
pub struct Policy {
    dev_allow_all: bool,
    reads: ReadAccess,
    admins: BTreeSet<u32>,
    grants: Vec<Grant>,
}

/// Why a request was refused: a stable code plus a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// Stable code (`not_granted`, `not_owner`, ...), the metric's `reason` label.
    pub code: &'static str,
    /// Human-readable reason.
    pub reason: String,
}

impl Policy {
    /// Compiles `cfg`, resolving names through `dir`; `agent_uid` (and 0) are admins.
    ///
    /// # Errors
    /// A message naming the bad grant, pattern or name.
    pub fn compile(
        cfg: &AccessConfig,
        agent_uid: u32,
        dir: &dyn Directory,
    ) -> Result<Self, String> {
        let mut grants = Vec::new();
        for (i, g) in cfg.grants.iter().enumerate() {
            let mut uids: BTreeSet<u32> = g.uids.iter().copied().collect();
            for u in &g.users {
                uids.insert(
                    dir.user_uid(u)
                        .ok_or_else(|| format!("grant {i}: unknown user `{u}`"))?,
                );
            }
            let mut gids: BTreeSet<u32> = g.gids.iter().copied().collect();
            let mut member_uids = BTreeSet::new();
            for name in &g.groups {
                let (gid, members) = dir
                    .group(name)
                    .ok_or_else(|| format!("grant {i}: unknown group `{name}`"))?;
                gids.insert(gid);
                for m in members {
                    if let Some(uid) = dir.user_uid(&m) {
                        member_uids.insert(uid);
                    }
                }
            }
            if uids.is_empty() && gids.is_empty() {
                return Err(format!("grant {i}: names no uid, gid, user or group"));
            }
            if g.rights.is_empty() || g.services.is_empty() {
                return Err(format!("grant {i}: needs `services` and `rights`"));
            }
            let patterns = g
                .services
                .iter()
                .map(|p| Pattern::parse(p).map_err(|e| format!("grant {i}: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            grants.push(Grant {
                uids,
                gids,
                member_uids,
                patterns,
                rights: g.rights.clone(),
            });
        }
        Ok(Self {
            dev_allow_all: cfg.dev_allow_all,
            reads: cfg.reads,
            admins: [0, agent_uid].into_iter().collect(),
            grants,
        })
    }

    /// True when the development policy (everything allowed) is on.
    pub fn dev_allow_all(&self) -> bool {
        self.dev_allow_all
    }

    /// True when `who` is an admin everywhere (the agent's uid or root).
    pub fn is_superuser(&self, who: &LocalCaller) -> bool {
        self.admins.contains(&who.uid)
    }

    /// May `who` do `action` on `key`?
    pub fn allows(&self, who: &LocalCaller, action: Action, key: &ServiceKey) -> bool {
        if self.dev_allow_all || self.is_superuser(who) {
            return true;
        }
        if action == Action::Read && self.reads == ReadAccess::Open {
            return true;
        }
        self.grants.iter().any(|g| {
            g.covers(who)
                && g.rights.iter().any(|r| action.satisfied_by(*r))
                && g.patterns.iter().any(|p| p.matches(key))
        })
    }

    /// [`Policy::allows`] as a result with a reason.
    ///
    /// # Errors
    /// [`Denied`] `not_granted`.
    pub fn check(&self, who: &LocalCaller, action: Action, key: &ServiceKey) -> Result<(), Denied> {
        if self.allows(who, action, key) {
            return Ok(());
        }
        Err(Denied {
            code: "not_granted",
            reason: format!(
                "uid {} gid {} has no `{}` grant for {key} in the agent's [access] policy",
                who.uid,
                who.gid,
                action.needs()
            ),
        })
    }
}

/// The owner of a local instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// Uid that registered it.
    pub uid: u32,
    /// Its gid at the time.
    pub gid: u32,
}

/// What [`Owners::claim`] did, for [`Owners::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Nothing changed (already this owner's).
    Unchanged,
    /// The owner was set and persisted; `previous` is restored on release.
    Taken {
        /// The owner before the claim.
        previous: Option<Owner>,
    },
}

/// Why [`Owners::claim`] refused. In every case the table (in memory and on disk) is as it was
/// and the registration must not be forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimError {
    /// The instance is owned by this other uid, and the caller may not take it over.
    NotOwner(Owner),
    /// The table holds [`MAX_OWNED`] instances; a new one would have no owner.
    TableFull,
    /// The caller's uid owns `limit` instances of this node already
    /// (`[api] max_instances_per_caller`).
    CallerLimit {
        /// The configured limit.
        limit: usize,
    },
    /// The owner record could not be written (the message says why); after a restart the
    /// caller could not change its own instance, so it is not registered.
    NotPersisted(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct OwnedEntry {
    service: String,
    instance: String,
    owner: Owner,
}

/// Owners of local instances, persisted in [`OWNERS_FILE`].
#[derive(Debug)]
pub struct Owners {
    path: PathBuf,
    map: Mutex<BTreeMap<(String, String), Owner>>,
    /// Why the file must not be written: an unreadable file that could not be moved aside
    /// (writing would destroy it). `None` normally.
    write_blocked: Option<String>,
    /// The error of the last failed write; cleared by the next successful one.
    last_error: Mutex<Option<String>>,
}

impl Owners {
    /// Loads `dir/owners.json`. Missing: empty. Unreadable (torn, corrupt, or it cannot be
    /// read): never trusted and never overwritten. It is moved aside to
    /// `owners.json.corrupt-<unix ms>` ([`crate::keys::set_aside`]) before anything new is
    /// written, logged with both paths and counted (`shoal_rejected_inputs_total{source =
    /// "owners_file"}`, `shoal_files_set_aside_total{file = "owners.json"}`); the table starts
    /// empty, so the instances it listed have no recorded owner: only admins and orchestrators
    /// may change them, and their addresses stay taken (`check_address`). If it cannot be moved
    /// aside, the table is kept in memory only and the file is left as it is.
    pub fn load(dir: &Path) -> Self {
        let path = dir.join(OWNERS_FILE);
        let mut map = BTreeMap::new();
        let unreadable = match crate::persist::read_state_file(&path) {
            Ok(b) => match serde_json::from_slice::<Vec<OwnedEntry>>(&b) {
                Ok(v) => {
                    for e in v.into_iter().take(MAX_OWNED) {
                        map.insert((e.service, e.instance), e.owner);
                    }
                    None
                }
                Err(e) => {
                    crate::metrics::rejected("owners_file", "decode");
                    Some(e.to_string())
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                crate::metrics::rejected("owners_file", "read");
                Some(e.to_string())
            }
        };
        let write_blocked = unreadable.and_then(|error| Self::set_aside(&path, &error));
        Self {
            path,
            map: Mutex::new(map),
            write_blocked,
            last_error: Mutex::new(None),
        }
    }

    /// Moves the unreadable file at `path` aside; `Some(why)` when it could not be (then it
    /// must not be written).
    fn set_aside(path: &Path, error: &str) -> Option<String> {
        match crate::keys::set_aside(path) {
            Ok(aside) => {
                metrics::counter!("shoal_files_set_aside_total", "file" => OWNERS_FILE)
                    .increment(1);
                tracing::error!(
                    file = %path.display(),
                    kept_at = %aside.display(),
                    error,
                    "owners file unreadable; moved aside to {} (nothing deleted); instance owners unknown: \
                     only admins and orchestrators may change this node's instances until they are \
                     re-registered, and their addresses stay taken",
                    aside.display()
                );
                None
            }
            Err(e) => {
                tracing::error!(
                    file = %path.display(),
                    error,
                    set_aside_error = %e,
                    "owners file unreadable and could not be moved aside; it is left untouched and \
                     owners are kept in memory only until it is moved away and the agent restarted"
                );
                Some(format!(
                    "{} is unreadable and could not be moved aside ({e}); not overwriting it",
                    path.display()
                ))
            }
        }
    }

    /// The owner of an instance, if known.
    pub fn get(&self, key: &ServiceKey, instance: &str) -> Option<Owner> {
        self.map
            .lock()
            .expect("owners")
            .get(&(key.to_string(), instance.to_owned()))
            .copied()
    }

    /// Records (or replaces) an owner and persists.
    ///
    /// # Errors
    /// The table is full, or the file cannot be written (the in-memory entry is kept).
    pub fn set(&self, key: &ServiceKey, instance: &str, owner: Owner) -> Result<(), String> {
        let mut m = self.map.lock().expect("owners");
        let id = (key.to_string(), instance.to_owned());
        if m.len() >= MAX_OWNED && !m.contains_key(&id) {
            return Err(format!("owner table full ({MAX_OWNED} instances)"));
        }
        m.insert(id, owner);
        self.save(&m)
    }

    /// Atomically checks and takes ownership of an instance before its registration is
    /// forwarded: free or already `owner`'s ids are taken; an id owned by another uid is taken
    /// only when `may_take_over` (orchestrator, admin, the agent itself). A new id is refused
    /// when `owner.uid` already owns `per_uid_limit` instances. The change is persisted before
    /// this returns, so an acknowledged registration always has an owner on disk.
    ///
    /// # Errors
    /// [`ClaimError`]; the table is then unchanged (a failed write is rolled back in memory).
    pub fn claim(
        &self,
        key: &ServiceKey,
        instance: &str,
        owner: Owner,
        may_take_over: bool,
        per_uid_limit: usize,
    ) -> Result<Claim, ClaimError> {
        let mut m = self.map.lock().expect("owners");
        let id = (key.to_string(), instance.to_owned());
        let previous = m.get(&id).copied();
        match previous {
            Some(o) if o == owner => return Ok(Claim::Unchanged),
            Some(o) if o.uid != owner.uid && !may_take_over => return Err(ClaimError::NotOwner(o)),
            None if m.len() >= MAX_OWNED => return Err(ClaimError::TableFull),
            _ => {}
        }
        // Only an id new to this uid adds to its count (re-registering its own does not).
        if previous.is_none_or(|o| o.uid != owner.uid) {
            let owned = m.values().filter(|o| o.uid == owner.uid).count();
            if owned >= per_uid_limit {
                return Err(ClaimError::CallerLimit {
                    limit: per_uid_limit,
                });
            }
        }
        m.insert(id.clone(), owner);
        if let Err(e) = self.save(&m) {
            match previous {
                Some(o) => m.insert(id, o),
                None => m.remove(&id),
            };
            return Err(ClaimError::NotPersisted(e));
        }
        Ok(Claim::Taken { previous })
    }

    /// Why the last write of the owners file failed, or why it may not be written at all;
    /// `None` once a write succeeds. Shown by `/v1/agent/health` (`owners_error`).
    pub fn persist_error(&self) -> Option<String> {
        self.write_blocked
            .clone()
            .or_else(|| self.last_error.lock().expect("owners error").clone())
    }

    /// Gives a [`Owners::claim`] back after the registration failed.
    pub fn release(&self, key: &ServiceKey, instance: &str, claim: Claim) {
        let Claim::Taken { previous } = claim else {
            return;
        };
        let mut m = self.map.lock().expect("owners");
        let id = (key.to_string(), instance.to_owned());
        match previous {
            Some(o) => m.insert(id, o),
            None => m.remove(&id),
        };
        if let Err(e) = self.save(&m) {
            tracing::error!(%key, instance, error = %e, "instance owner not persisted (kept in memory)");
        }
    }

    /// Forgets an instance (deregistered) and persists.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn remove(&self, key: &ServiceKey, instance: &str) -> Result<(), String> {
        let mut m = self.map.lock().expect("owners");
        if m.remove(&(key.to_string(), instance.to_owned())).is_none() {
            return Ok(());
        }
        self.save(&m)
    }

    /// Writes the table; a failure is counted (`shoal_persist_total{result="owners_error"}`)
    /// and kept for [`Owners::persist_error`]. Callers log it.
    fn save(&self, m: &BTreeMap<(String, String), Owner>) -> Result<(), String> {
        let result = self.write(m);
        if result.is_err() {
            metrics::counter!("shoal_persist_total", "result" => "owners_error").increment(1);
        }
        *self.last_error.lock().expect("owners error") = result.as_ref().err().cloned();
        result
    }

    fn write(&self, m: &BTreeMap<(String, String), Owner>) -> Result<(), String> {
        if let Some(why) = &self.write_blocked {
            return Err(why.clone());
        }
        let list: Vec<OwnedEntry> = m
            .iter()
            .map(|((service, instance), owner)| OwnedEntry {
                service: service.clone(),
                instance: instance.clone(),
                owner: *owner,
            })
            .collect();
        let json = serde_json::to_vec(&list).map_err(|e| e.to_string())?;
        crate::keys::write_atomic(&self.path, &json, 0o600)
            .map_err(|e| format!("cannot write {}: {e}", self.path.display()))
    }
}

/// Logs each distinct refusal once per (uid, route, reason); bounded.
#[derive(Debug, Default)]
pub struct RefusalLog {
    seen: Mutex<HashSet<(u32, &'static str, &'static str)>>,
}

impl RefusalLog {
    /// Logs `denied` for `who` on `route` unless that (uid, route, code) was logged before.
    pub fn log(&self, who: &LocalCaller, route: &'static str, denied: &Denied) {
        let mut seen = self.seen.lock().expect("refusal log");
        let id = (who.uid, route, denied.code);
        if seen.contains(&id) {
            return;
        }
        if seen.len() >= MAX_LOGGED_REFUSALS {
            metrics::counter!("shoal_api_refusal_logs_suppressed_total").increment(1);
            return;
        }
        seen.insert(id);
        tracing::warn!(caller = %who, route, code = denied.code, reason = %denied.reason,
            "{}", refusal_message(route));
    }
}

/// The log line of a refusal on `route` (`read` is the one read route; the others write).
fn refusal_message(route: &str) -> &'static str {
    if route == "read" {
        "local API read refused (logged once per caller, route and reason)"
    } else {
        "local API write refused (logged once per caller, route and reason)"
    }
}

/// The peer credentials of a unix-socket connection as a [`LocalCaller`], with the executable
/// read from `/proc/<pid>/exe` when readable (audit only; see the module docs).
pub fn local_caller(cred: &tokio::net::unix::UCred) -> LocalCaller {
    let pid = cred.pid().and_then(|p| u32::try_from(p).ok());
    let exe = pid.and_then(|p| {
        std::fs::read_link(format!("/proc/{p}/exe"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    });
    LocalCaller {
        uid: cred.uid(),
        gid: cred.gid(),
        pid,
        exe,
    }
    .bounded()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir;
    impl Directory for Dir {
        fn user_uid(&self, name: &str) -> Option<u32> {
            match name {
                "web" => Some(1001),
                "deployer" => Some(1002),
                "ops" => Some(1003),
                _ => None,
            }
        }
        fn group(&self, name: &str) -> Option<(u32, Vec<String>)> {
            match name {
                "deploy" => Some((2000, vec!["deployer".into()])),
                _ => None,
            }
        }
    }

    fn who(uid: u32, gid: u32) -> LocalCaller {
        LocalCaller {
            uid,
            gid,
            pid: Some(1),
            exe: None,
        }
    }

    fn key(s: &str) -> ServiceKey {
        s.parse().unwrap()
    }

    #[test]
    fn patterns_match_by_segment() {
        let p = |s| Pattern::parse(s).unwrap();
        assert!(p("*").matches(&key("prod/web/http")));
        assert!(p("prod/*").matches(&key("prod/web/http")));
        assert!(!p("prod/*").matches(&key("production/web/http")));
        assert!(!p("prod/*").matches(&key("staging/web/http")));
        assert!(p("prod/web/*").matches(&key("prod/web/grpc")));
        assert!(!p("prod/web/*").matches(&key("prod/webx/grpc")));
        assert!(p("prod/web-*/http").matches(&key("prod/web-eu/http")));
        assert!(!p("prod/web-*/http").matches(&key("prod/api/http")));
        assert!(p("prod/*/http").matches(&key("prod/api/http")));
        assert!(!p("prod/*/http").matches(&key("prod/api/grpc")));
        assert!(p("prod/web/http").matches(&key("prod/web/http")));
        assert!(!p("prod/web/http").matches(&key("prod/web/https")));
        assert!(p("*/web/*").matches(&key("staging/web/x")));
        assert!(p("prod/a*b*c/*").matches(&key("prod/axxbyyc/p")));
        assert!(!p("prod/a*b*c/*").matches(&key("prod/axxbyyd/p")));
        for bad in ["", "prod", "prod/web", "a/b/c/d", "prod//x", "/x/y"] {
            assert!(Pattern::parse(bad).is_err(), "{bad}");
        }
    }

    fn policy(toml_text: &str) -> Policy {
        let cfg: AccessConfig = toml::from_str(toml_text).unwrap();
        Policy::compile(&cfg, 999, &Dir).unwrap()
    }

    #[test]
    fn writes_fail_closed_and_grants_are_scoped() {
        let p = policy(
            r#"
            [[grants]]
            users = ["web"]
            services = ["prod/web/*"]
            rights = ["register", "change_own"]
            [[grants]]
            groups = ["deploy"]
            services = ["prod/*"]
            rights = ["orchestrator"]
            [[grants]]
            uids = [1003]
            services = ["*"]
            rights = ["report"]
            "#,
        );
        let web = who(1001, 1001);
        let web_key = key("prod/web/http");
        let api_key = key("prod/api/http");
        assert!(p.allows(&web, Action::Register, &web_key));
        assert!(p.allows(&web, Action::ChangeOwn, &web_key));
        assert!(!p.allows(&web, Action::ChangeOthers, &web_key));
        assert!(!p.allows(&web, Action::Report, &web_key));
        assert!(!p.allows(&web, Action::Register, &api_key));
        // Nobody granted: every write refused, reads open by default.
        let stranger = who(4242, 4242);
        for a in [
            Action::Register,
            Action::ChangeOwn,
            Action::ChangeOthers,
            Action::Report,
        ] {
            assert!(!p.allows(&stranger, a, &web_key), "{a:?}");
        }
        assert!(p.allows(&stranger, Action::Read, &web_key));
        let d = p.check(&stranger, Action::Register, &web_key).unwrap_err();
        assert_eq!(d.code, "not_granted");
        assert!(d.reason.contains("uid 4242"), "{}", d.reason);
        // Orchestrator via supplementary group membership (uid 1002 with another primary gid).
        let deployer = who(1002, 1002);
        assert!(p.allows(&deployer, Action::ChangeOthers, &api_key));
        assert!(p.allows(&deployer, Action::Register, &api_key));
        assert!(!p.allows(&deployer, Action::Report, &api_key));
        assert!(!p.allows(&deployer, Action::ChangeOthers, &key("staging/a/b")));
        // ... and via the primary gid.
        assert!(p.allows(&who(5000, 2000), Action::ChangeOthers, &api_key));
        // Report only.
        let ops = who(1003, 1003);
        assert!(p.allows(&ops, Action::Report, &key("any/x/y")));
        assert!(!p.allows(&ops, Action::Register, &key("any/x/y")));
        // The agent's uid and root are admins.
        assert!(p.allows(&who(999, 1), Action::ChangeOthers, &web_key));
        assert!(p.allows(&who(0, 0), Action::Report, &web_key));
    }

    #[test]
    fn reads_can_require_a_grant_and_dev_allows_all() {
        let p = policy(
            "reads = \"granted\"\n[[grants]]\nuids = [1001]\nservices = [\"prod/*\"]\nrights = [\"report\"]\n",
        );
        assert!(p.allows(&who(1001, 1), Action::Read, &key("prod/a/b")));
        assert!(!p.allows(&who(1001, 1), Action::Read, &key("dev/a/b")));
        assert!(!p.allows(&who(7, 7), Action::Read, &key("prod/a/b")));
        let dev = policy("dev_allow_all = true\n");
        assert!(dev.dev_allow_all());
        assert!(dev.allows(&who(7, 7), Action::ChangeOthers, &key("prod/a/b")));
    }

    #[test]
    fn bad_grants_refuse_the_config() {
        let bad = |t: &str| {
            let cfg: AccessConfig = toml::from_str(t).unwrap();
            Policy::compile(&cfg, 999, &Dir).unwrap_err()
        };
        assert!(bad(
            "[[grants]]\nusers = [\"nobody-here\"]\nservices = [\"*\"]\nrights = [\"read\"]\n"
        )
        .contains("unknown user"));
        assert!(
            bad("[[grants]]\ngroups = [\"nope\"]\nservices = [\"*\"]\nrights = [\"read\"]\n")
                .contains("unknown group")
        );
        assert!(bad("[[grants]]\nservices = [\"*\"]\nrights = [\"read\"]\n").contains("names no"));
        assert!(
            bad("[[grants]]\nuids = [1]\nservices = [\"prod\"]\nrights = [\"read\"]\n")
                .contains("pattern")
        );
        assert!(toml::from_str::<AccessConfig>(
            "[[grants]]\nuids = [1]\nservices = [\"*\"]\nrights = [\"root\"]\n"
        )
        .is_err());
    }

    /// The `owners.json.corrupt-*` files of `dir`, with their bytes.
    fn set_aside_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("owners.json.corrupt-")
            })
            .map(|p| {
                let bytes = std::fs::read(&p).unwrap();
                (p.file_name().unwrap().to_string_lossy().into_owned(), bytes)
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_torn_owners_file_is_moved_aside_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("prod/web/http");
        let o = Owners::load(dir.path());
        for i in 0..200 {
            o.set(
                &k,
                &format!("web-{i}"),
                Owner {
                    uid: 1001,
                    gid: 1001,
                },
            )
            .unwrap();
        }
        drop(o);
        // Torn as by `head -c 1000`.
        let path = dir.path().join(OWNERS_FILE);
        let full = std::fs::read(&path).unwrap();
        assert!(full.len() > 1_000);
        std::fs::write(&path, &full[..1_000]).unwrap();

        let o = Owners::load(dir.path());
        // Not trusted (no entry of it is used), and not in the way any more.
        assert_eq!(o.get(&k, "web-0"), None);
        assert!(
            !path.exists(),
            "the torn file is no longer at {}",
            path.display()
        );
        let aside = set_aside_files(dir.path());
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert_eq!(aside[0].1, &full[..1_000], "kept byte for byte");
        // A new write makes a fresh owners.json; the torn one stays aside, untouched.
        o.set(
            &k,
            "e-new",
            Owner {
                uid: 1002,
                gid: 1002,
            },
        )
        .unwrap();
        assert_eq!(set_aside_files(dir.path()), aside);
        let again = Owners::load(dir.path());
        assert_eq!(
            again.get(&k, "e-new"),
            Some(Owner {
                uid: 1002,
                gid: 1002
            })
        );

        // A second torn file in the same millisecond gets its own name; nothing is replaced.
        std::fs::write(&path, b"[{\"service\"").unwrap();
        let name0 = dir.path().join(&aside[0].0);
        let p1 = crate::keys::set_aside(&path).unwrap();
        std::fs::write(&path, b"[{").unwrap();
        let p2 = crate::keys::set_aside(&path).unwrap();
        assert!(p1 != name0 && p2 != p1 && p2 != name0);
        assert_eq!(std::fs::read(&name0).unwrap(), &full[..1_000]);
        assert_eq!(std::fs::read(&p1).unwrap(), b"[{\"service\"");
        assert_eq!(std::fs::read(&p2).unwrap(), b"[{");
    }

    #[test]
    fn an_owners_file_that_cannot_be_read_is_moved_aside_too() {
        // A directory where the file should be: read fails (EISDIR), link fails too, so
        // nothing may be written over it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(OWNERS_FILE);
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), b"x").unwrap();
        let o = Owners::load(dir.path());
        let k = key("prod/web/http");
        let err = o
            .set(
                &k,
                "web-1",
                Owner {
                    uid: 1001,
                    gid: 1001,
                },
            )
            .unwrap_err();
        assert!(err.contains("not overwriting"), "{err}");
        assert_eq!(std::fs::read(path.join("inside")).unwrap(), b"x");
        // Kept in memory for this run.
        assert_eq!(
            o.get(&k, "web-1"),
            Some(Owner {
                uid: 1001,
                gid: 1001
            })
        );
        // But a registration, which needs its owner on disk, is refused and takes nothing.
        assert!(o.persist_error().unwrap().contains("not overwriting"));
        assert!(matches!(
            o.claim(&k, "web-2", A, false, usize::MAX),
            Err(ClaimError::NotPersisted(_))
        ));
        assert_eq!(o.get(&k, "web-2"), None);
    }

    #[test]
    fn a_refused_read_is_logged_as_a_read() {
        assert!(refusal_message("read").starts_with("local API read refused"));
        for write in ["register", "ready", "drain", "deregister", "report"] {
            assert!(refusal_message(write).starts_with("local API write refused"));
        }
    }

    #[test]
    fn owners_survive_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("prod/web/http");
        let o = Owners::load(dir.path());
        assert_eq!(o.get(&k, "web-1"), None);
        o.set(
            &k,
            "web-1",
            Owner {
                uid: 1001,
                gid: 1001,
            },
        )
        .unwrap();
        o.set(
            &k,
            "web-2",
            Owner {
                uid: 1002,
                gid: 1002,
            },
        )
        .unwrap();
        o.remove(&k, "web-2").unwrap();
        let again = Owners::load(dir.path());
        assert_eq!(
            again.get(&k, "web-1"),
            Some(Owner {
                uid: 1001,
                gid: 1001
            })
        );
        assert_eq!(again.get(&k, "web-2"), None);
        // Claims: free ids are taken, another uid's are refused unless it may take over, and a
        // failed registration gives the claim back.
        let a = Owner {
            uid: 1001,
            gid: 1001,
        };
        let b = Owner {
            uid: 1002,
            gid: 1002,
        };
        let any = usize::MAX;
        assert_eq!(
            again.claim(&k, "web-1", a, false, any),
            Ok(Claim::Unchanged)
        );
        assert_eq!(
            again.claim(&k, "web-1", b, false, any),
            Err(ClaimError::NotOwner(a))
        );
        let c = again.claim(&k, "web-3", b, false, any).unwrap();
        assert_eq!(c, Claim::Taken { previous: None });
        assert_eq!(
            again.claim(&k, "web-3", a, false, any),
            Err(ClaimError::NotOwner(b))
        );
        again.release(&k, "web-3", c);
        assert_eq!(again.get(&k, "web-3"), None);
        let t = again.claim(&k, "web-1", b, true, any).unwrap();
        assert_eq!(again.get(&k, "web-1"), Some(b));
        again.release(&k, "web-1", t);
        assert_eq!(Owners::load(dir.path()).get(&k, "web-1"), Some(a));
        std::fs::write(dir.path().join(OWNERS_FILE), b"{not json").unwrap();
        assert_eq!(Owners::load(dir.path()).get(&k, "web-1"), None);
    }

    const A: Owner = Owner {
        uid: 1001,
        gid: 1001,
    };
    const B: Owner = Owner {
        uid: 1002,
        gid: 1002,
    };

    #[test]
    fn a_claim_whose_owner_cannot_be_saved_is_refused_and_rolled_back() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        let k = key("prod/web/http");
        let o = Owners::load(&dir);
        o.claim(&k, "web-1", A, false, usize::MAX).unwrap();
        assert_eq!(o.persist_error(), None);
        // The directory goes away: the next write fails.
        std::fs::remove_dir_all(&dir).unwrap();
        let err = o.claim(&k, "web-2", A, false, usize::MAX).unwrap_err();
        let ClaimError::NotPersisted(why) = err else {
            panic!("{err:?}");
        };
        assert!(why.contains("owners.json"), "{why}");
        assert_eq!(o.get(&k, "web-2"), None, "rolled back: nobody owns it");
        // A take-over that cannot be saved leaves the old owner in place.
        assert!(matches!(
            o.claim(&k, "web-1", B, true, usize::MAX),
            Err(ClaimError::NotPersisted(_))
        ));
        assert_eq!(o.get(&k, "web-1"), Some(A));
        assert_eq!(o.persist_error(), Some(why), "shown by /v1/agent/health");
        // Writable again: the next claim succeeds and clears the error.
        std::fs::create_dir(&dir).unwrap();
        o.claim(&k, "web-2", A, false, usize::MAX).unwrap();
        assert_eq!(o.persist_error(), None);
        assert_eq!(Owners::load(&dir).get(&k, "web-2"), Some(A));
    }

    #[test]
    fn a_full_owner_table_refuses_new_instances_instead_of_leaving_them_unowned() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("prod/web/http");
        let o = Owners::load(dir.path());
        {
            let mut m = o.map.lock().unwrap();
            for i in 0..MAX_OWNED {
                m.insert((k.to_string(), format!("i-{i}")), B);
            }
        }
        assert_eq!(
            o.claim(&k, "new", A, true, usize::MAX),
            Err(ClaimError::TableFull)
        );
        assert_eq!(o.get(&k, "new"), None);
        // An id already in the table may still change hands.
        assert!(o.claim(&k, "i-0", A, true, usize::MAX).is_ok());
    }

    #[test]
    fn a_uid_may_own_at_most_its_limit_of_instances() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("prod/web/http");
        let o = Owners::load(dir.path());
        o.claim(&k, "a-1", A, false, 2).unwrap();
        o.claim(&k, "a-2", A, false, 2).unwrap();
        assert_eq!(
            o.claim(&k, "a-3", A, false, 2),
            Err(ClaimError::CallerLimit { limit: 2 })
        );
        assert_eq!(o.get(&k, "a-3"), None);
        // Re-registering its own instances is not a new one; other uids have their own count.
        assert_eq!(o.claim(&k, "a-1", A, false, 2), Ok(Claim::Unchanged));
        o.claim(&k, "b-1", B, false, 2).unwrap();
        // Taking over another uid's instance counts for the new owner.
        assert_eq!(
            o.claim(&k, "b-1", A, true, 2),
            Err(ClaimError::CallerLimit { limit: 2 })
        );
        // A deregistered instance frees its place.
        o.remove(&k, "a-2").unwrap();
        o.claim(&k, "a-3", A, false, 2).unwrap();
    }
}
