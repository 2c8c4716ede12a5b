//! Lifecycle calls to the region authority, with per-attempt timeouts, leader redirects and
//! jittered exponential backoff inside a total budget. Never called while a lock is held and
//! never on a read path (invariant 6).

use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, histogram};
use shoal_proto::rpc::{AuthorityError, AuthorityOk, AuthorityRequestBody, LocalCaller};
use tokio::sync::oneshot;

use crate::keys::Jitter;
use crate::state::{DriverCmd, Shared};

/// Why a lifecycle call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No replica answered within the budget, or the region has no quorum (HTTP 503).
    #[error("authority unavailable: {0}")]
    Unavailable(String),
    /// The rules refused the request (HTTP 409).
    #[error("refused ({code}): {reason}")]
    Refused {
        /// Stable code.
        code: String,
        /// Reason.
        reason: String,
    },
    /// The request was invalid (HTTP 400).
    #[error("invalid: {0}")]
    Invalid(String),
}

fn op_name(body: &AuthorityRequestBody) -> &'static str {
    match body {
        AuthorityRequestBody::Register { .. } => "register",
        AuthorityRequestBody::Transition { .. } => "transition",
        AuthorityRequestBody::GetPolicy { .. } => "get_policy",
        AuthorityRequestBody::PutPolicy { .. } => "put_policy",
        AuthorityRequestBody::Status => "status",
        AuthorityRequestBody::BindNodeKey { .. } => "bind_node_key",
        AuthorityRequestBody::RevokeNode { .. } => "revoke_node",
        AuthorityRequestBody::ReadmitNode { .. } => "readmit_node",
        AuthorityRequestBody::Members(_) => "members",
        AuthorityRequestBody::PutGlobalPolicy { .. } => "put_global_policy",
        AuthorityRequestBody::GetGlobalPolicy => "get_global_policy",
        AuthorityRequestBody::RegionSummaries { .. } => "region_summaries",
        AuthorityRequestBody::FailoverFeed { .. } => "failover_feed",
    }
}

/// Calls the authority (or the in-process development authority) for the agent itself.
///
/// # Errors
/// [`CallError`]; the agent's status records the last unavailability for `/v1/agent/health`.
pub async fn call(
    shared: &Arc<Shared>,
    body: AuthorityRequestBody,
) -> Result<AuthorityOk, CallError> {
    call_for(shared, body, None).await
}

/// As [`call`], forwarding on behalf of a local process (named in the authority's audit log).
///
/// # Errors
/// As [`call`].
pub async fn call_for(
    shared: &Arc<Shared>,
    body: AuthorityRequestBody,
    on_behalf_of: Option<LocalCaller>,
) -> Result<AuthorityOk, CallError> {
    let op = op_name(&body);
    let started = tokio::time::Instant::now();
    let result = call_inner(shared, body, on_behalf_of).await;
    let elapsed = started.elapsed().as_secs_f64();
    let label = match &result {
        Ok(_) => "ok",
        Err(CallError::Unavailable(_)) => "unavailable",
        Err(CallError::Refused { .. }) => "refused",
        Err(CallError::Invalid(_)) => "invalid",
    };
    if op != "status" && op != "failover_feed" {
        histogram!("shoal_authority_rpc_seconds", "op" => op).record(elapsed);
        counter!("shoal_authority_writes_total", "op" => op, "result" => label).increment(1);
    }
    let now = shared.now_ms();
    let mut st = shared.status.lock().expect("status");
    match &result {
        Err(CallError::Unavailable(e)) => st.authority_error = Some(e.clone()),
        _ => {
            st.last_authority_ms = Some(now);
            st.authority_error = None;
        }
    }
    result
}

/// How long a replica that did not answer (timed out, unreachable, its name did not resolve)
/// is tried after the others, ms. About a Raft election's worth of a restart.
pub const SHUN_MS: u64 = 30_000;

/// Which replica an agent's authority calls try first (issue: with one of three replicas
/// killed, 4 of 10 registrations took 1.1-1.2 s, each call starting at a random replica).
///
/// The replica that last answered a write (a success or a rules refusal: only a leader gives
/// either), or the leader a follower named, is tried first; replicas that failed to answer
/// within the last [`SHUN_MS`] are tried last. Between calls only; within one call the order is fixed at its
/// start, and a `NotLeader` redirect is followed at once.
#[derive(Debug, Default)]
pub struct Route {
    /// The replica (as configured or as a leader was named) to try first.
    preferred: Option<String>,
    /// Replicas that did not answer, until (monotonic ms).
    shunned: std::collections::HashMap<String, u64>,
}

impl Route {
    /// The order in which to try `configured` at `now_ms`: the preferred replica first, then
    /// the configured ones from the `start`-th on (a random rotation spreads agents), the
    /// shunned ones last.
    pub fn order(&self, configured: &[String], start: usize, now_ms: u64) -> Vec<String> {
        let shunned = |n: &String| self.shunned.get(n).is_some_and(|&until| until > now_ms);
        let mut rotated: Vec<String> = configured.to_vec();
        let len = rotated.len();
        if len > 0 {
            rotated.rotate_left(start % len);
        }
        let mut out = Vec::with_capacity(rotated.len() + 1);
        if let Some(p) = self.preferred.as_ref().filter(|p| !shunned(p)) {
            out.push(p.clone());
        }
        let (cold, warm): (Vec<String>, Vec<String>) = rotated
            .into_iter()
            .filter(|n| Some(n) != self.preferred.as_ref() || shunned(n))
            .partition(|n| shunned(n));
        out.extend(warm);
        out.extend(cold);
        out
    }

    /// `name` answered (`write`: a write, which only the leader answers): try it first next
    /// time. A read's answer only clears its shunning (any replica answers reads).
    pub fn answered(&mut self, name: &str, write: bool) {
        self.shunned.remove(name);
        if write {
            self.preferred = Some(name.to_owned());
        }
    }

    /// A follower named `leader`.
    pub fn redirected(&mut self, leader: &str) {
        self.preferred = Some(leader.to_owned());
    }

    /// `name` did not answer at `now_ms`: try it last for [`SHUN_MS`].
    pub fn failed(&mut self, name: &str, now_ms: u64) {
        if self.preferred.as_deref() == Some(name) {
            self.preferred = None;
        }
        // Bounded by the configured replicas plus the leaders they named.
        if self.shunned.len() >= 64 {
            self.shunned.retain(|_, until| *until > now_ms);
        }
        if self.shunned.len() < 64 {
            self.shunned
                .insert(name.to_owned(), now_ms.saturating_add(SHUN_MS));
        }
    }
}

async fn call_inner(
    shared: &Arc<Shared>,
    body: AuthorityRequestBody,
    on_behalf_of: Option<LocalCaller>,
) -> Result<AuthorityOk, CallError> {
    let cfg = &shared.cfg.raw.authority;
    if !cfg.dev && cfg.addresses.is_empty() {
        return Err(CallError::Unavailable(
            "no authority configured ([authority] addresses, or dev = true)".into(),
        ));
    }
    let mut jitter = Jitter::new();
    let targets: Vec<Option<String>> = if cfg.dev {
        vec![None]
    } else {
        let start = jitter.upto(cfg.addresses.len() as u64 - 1) as usize;
        let route = shared.authority_route.lock().expect("authority route");
        route
            .order(&cfg.addresses, start, shared.now_ms())
            .into_iter()
            .map(Some)
            .collect()
    };
    // One id for every attempt: a replica answers a retry of a write it already committed
    // with that answer instead of applying it again (shoal_authority::replay).
    let request_id = crate::keys::random_u64();
    let write = body.is_write();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(cfg.rpc_budget_ms);
    let timeout = Duration::from_millis(cfg.rpc_timeout_ms);
    let mut attempt: u32 = 0;
    let mut last_error;
    let mut redirect: Option<String> = None;
    loop {
        let name = redirect
            .take()
            .map(Some)
            .unwrap_or_else(|| targets[attempt as usize % targets.len()].clone());
        // IPs or DNS names (a StatefulSet's stable names), resolved at every call.
        let to = match &name {
            None => Ok(None),
            Some(n) => resolve(n).await.map(Some),
        };
        let to = match to {
            Ok(to) => to,
            Err(e) => {
                last_error = e;
                if let Some(n) = &name {
                    let now = shared.now_ms();
                    shared
                        .authority_route
                        .lock()
                        .expect("authority route")
                        .failed(n, now);
                }
                attempt += 1;
                let pause = Duration::from_millis(jitter.upto(50u64 << attempt.min(4)));
                if tokio::time::Instant::now() + pause >= deadline {
                    return Err(CallError::Unavailable(last_error));
                }
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        let (tx, rx) = oneshot::channel();
        let cmd = DriverCmd::Authority {
            to,
            request_id,
            body: body.clone(),
            on_behalf_of: on_behalf_of.clone(),
            reply: tx,
        };
        if shared.driver.send(cmd).await.is_err() {
            return Err(CallError::Unavailable("agent shutting down".into()));
        }
        let answer = tokio::time::timeout(timeout, rx).await;
        if let Some(n) = &name {
            let mut route = shared.authority_route.lock().expect("authority route");
            match &answer {
                // Any replica answers a read: only a write's answer names the leader.
                Ok(Ok(
                    Ok(_) | Err(AuthorityError::Refused { .. } | AuthorityError::Invalid(_)),
                )) => route.answered(n, write),
                Ok(Ok(Err(AuthorityError::NotLeader { leader: Some(l) }))) => route.redirected(l),
                Ok(Ok(Err(
                    AuthorityError::NotLeader { leader: None } | AuthorityError::NoQuorum,
                ))) => {}
                Ok(Err(_)) | Err(_) => route.failed(n, shared.now_ms()),
            }
        }
        match answer {
            Ok(Ok(Ok(ok))) => return Ok(ok),
            Ok(Ok(Err(AuthorityError::Refused { code, reason }))) => {
                return Err(CallError::Refused { code, reason })
            }
            Ok(Ok(Err(AuthorityError::Invalid(e)))) => return Err(CallError::Invalid(e)),
            Ok(Ok(Err(AuthorityError::NotLeader { leader }))) => {
                last_error = "not the leader".into();
                redirect = leader;
            }
            Ok(Ok(Err(AuthorityError::NoQuorum))) => {
                last_error = "the region authority has no quorum (writes refused)".into();
            }
            Ok(Err(_)) => last_error = format!("{} unreachable", fmt_target(to)),
            Err(_) => last_error = format!("{} timed out", fmt_target(to)),
        }
        // A dial the peer refused (another CA, an expired certificate) drops the request
        // unanswered: name that instead of the timeout (QA: "authority ... timed out" was all
        // an agent with a certificate of another CA said).
        if let Some(why) = to.and_then(|a| shared.transport_view.dial_failure(a)) {
            last_error = format!("{} unreachable: connecting failed: {why}", fmt_target(to));
        }
        attempt += 1;
        counter!("shoal_reconnects_total", "what" => "authority").increment(1);
        // Full jitter: uniform in [0, min(cap, base * 2^attempt)].
        let ceiling = 50u64.saturating_mul(1 << attempt.min(10)).min(1_000);
        let pause = Duration::from_millis(jitter.upto(ceiling));
        if tokio::time::Instant::now() + pause >= deadline {
            return Err(CallError::Unavailable(last_error));
        }
        tokio::time::sleep(pause).await;
    }
}

/// Resolves `host:port` (IP or DNS name) to its first address.
async fn resolve(addr: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(a) = addr.parse() {
        return Ok(a);
    }
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("authority {addr} does not resolve: {e}"))?
        .next()
        .ok_or_else(|| format!("authority {addr} resolves to no address"))
}

fn fmt_target(to: Option<std::net::SocketAddr>) -> String {
    to.map_or_else(|| "dev authority".to_owned(), |a| format!("authority {a}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_fresh_route_is_a_rotation_of_the_configured_replicas() {
        let r = Route::default();
        let cfg = names(&["a", "b", "c"]);
        assert_eq!(r.order(&cfg, 0, 0), names(&["a", "b", "c"]));
        assert_eq!(r.order(&cfg, 2, 0), names(&["c", "a", "b"]));
    }

    #[test]
    fn the_replica_that_answered_goes_first_and_a_silent_one_last() {
        let mut r = Route::default();
        let cfg = names(&["a", "b", "c"]);
        r.answered("c", false);
        assert_eq!(
            r.order(&cfg, 0, 0),
            names(&["a", "b", "c"]),
            "a read names no leader"
        );
        r.answered("b", true);
        assert_eq!(r.order(&cfg, 0, 0), names(&["b", "a", "c"]));
        r.failed("a", 1_000);
        assert_eq!(r.order(&cfg, 0, 1_000), names(&["b", "c", "a"]));
        // The leader fails: it loses its place and goes last with the other silent one.
        r.failed("b", 2_000);
        assert_eq!(r.order(&cfg, 0, 2_000), names(&["c", "a", "b"]));
        // Shunning ends after SHUN_MS.
        assert_eq!(r.order(&cfg, 0, 2_000 + SHUN_MS), names(&["a", "b", "c"]));
    }

    #[test]
    fn a_named_leader_outside_the_configured_list_is_tried_first() {
        let mut r = Route::default();
        let cfg = names(&["a", "b"]);
        r.redirected("10.0.0.9:7001");
        assert_eq!(r.order(&cfg, 1, 0), names(&["10.0.0.9:7001", "b", "a"]));
        // Tried once more than the configured ones: the loop wraps round all of them.
        r.failed("10.0.0.9:7001", 5);
        assert_eq!(r.order(&cfg, 1, 5), names(&["b", "a"]));
    }

    #[test]
    fn the_shunned_table_stays_bounded() {
        let mut r = Route::default();
        for i in 0..1_000 {
            r.failed(&format!("n{i}"), 0);
        }
        assert!(r.shunned.len() <= 64);
    }
}
