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

async fn call_inner(
    shared: &Arc<Shared>,
    body: AuthorityRequestBody,
    on_behalf_of: Option<LocalCaller>,
) -> Result<AuthorityOk, CallError> {
    let cfg = &shared.cfg.raw.authority;
    let mut targets: Vec<Option<String>> = if cfg.dev {
        vec![None]
    } else {
        cfg.addresses.iter().cloned().map(Some).collect()
    };
    if targets.is_empty() {
        return Err(CallError::Unavailable(
            "no authority configured ([authority] addresses, or dev = true)".into(),
        ));
    }
    let mut jitter = Jitter::new();
    let start = jitter.upto(targets.len() as u64 - 1) as usize;
    targets.rotate_left(start);
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
            body: body.clone(),
            on_behalf_of: on_behalf_of.clone(),
            reply: tx,
        };
        if shared.driver.send(cmd).await.is_err() {
            return Err(CallError::Unavailable("agent shutting down".into()));
        }
        match tokio::time::timeout(timeout, rx).await {
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
