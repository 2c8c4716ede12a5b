//! The agent RPC server of a replica: requests in (stream messages on `rpc_addr`), the
//! caller from the peer certificate, leader-only writes through Raft, replies and the audit
//! log of refused requests (see the `server` module docs, "Requests").

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{counter, histogram};
use openraft::error::{ClientWriteError, RaftError};
use openraft::ServerState;
use shoal_authority::{Admission, AuthorityCommand, Caller, Query, Refusal, Routed, WriteAnswer};
use shoal_proto::envelope::{self, MessageKind, MAX_STREAM_MESSAGE_BYTES};
use shoal_proto::rpc::{
    AuthorityError, AuthorityOk, AuthorityReply, AuthorityRequest, AuthorityRequestBody,
    LocalCaller,
};
use shoal_transport::certs::NodeIdentity;
use shoal_transport::transport::{Channel, Inbound};
use tokio::sync::mpsc;

use super::{wall_ms, Replica};
use crate::types::Proposal;

/// Maps a peer identity to the caller the state machine authorises
/// ([`Caller::of_certificate`]).
pub fn caller_of(peer: &NodeIdentity, operators: &BTreeSet<String>) -> Caller {
    Caller::of_certificate(&peer.node_id, operators)
}

impl Replica {
    pub(super) fn leader_rpc_addr(&self) -> Option<String> {
        let m = self.raft.metrics().borrow().clone();
        let leader = super::live_leader(&m)?;
        m.membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.rpc_addr.clone())
    }

    pub(super) async fn serve_rpc(self: Arc<Self>, mut inbound: mpsc::Receiver<Inbound>) {
        while let Some(msg) = inbound.recv().await {
            if msg.channel != Channel::Stream {
                continue; // the RPC endpoint carries no SWIM (the member has its own address)
            }
            let req: AuthorityRequest = match envelope::decode(
                &msg.bytes,
                MessageKind::AuthorityRequest,
                MAX_STREAM_MESSAGE_BYTES,
            ) {
                Ok(r) => r,
                Err(e) => {
                    counter!("shoal_authority_rpc_rejected_total", "reason" => e.as_label())
                        .increment(1);
                    continue;
                }
            };
            let Ok(permit) = self.inflight.clone().try_acquire_owned() else {
                counter!("shoal_authority_rpc_rejected_total", "reason" => "overload").increment(1);
                self.reply(msg.from, req.request_id, Err(AuthorityError::NoQuorum));
                continue;
            };
            // A retry of a write (same caller, same request id) is not applied twice.
            let write = req.body.is_write();
            if write {
                let seen = self.replays.lock().expect("replays").admit(
                    &msg.peer.node_id,
                    req.request_id,
                    self.mono_ms(),
                );
                match seen {
                    Admission::Fresh => {}
                    Admission::InFlight => {
                        // The first attempt's reply carries the same id and answers this one.
                        counter!("shoal_authority_replays_total", "outcome" => "in_flight")
                            .increment(1);
                        continue;
                    }
                    Admission::Replay(ok) => {
                        counter!("shoal_authority_replays_total", "outcome" => "answered")
                            .increment(1);
                        self.reply(msg.from, req.request_id, Ok(*ok));
                        continue;
                    }
                }
            }
            let this = self.clone();
            tokio::spawn(async move {
                let on_behalf_of = req.on_behalf_of.map(LocalCaller::bounded);
                let result = this.handle_for(&msg.peer, req.body, on_behalf_of).await;
                if write {
                    this.replays.lock().expect("replays").finish(
                        &msg.peer.node_id,
                        req.request_id,
                        &result,
                    );
                }
                this.reply(msg.from, req.request_id, result);
                drop(permit);
            });
        }
    }

    pub(super) fn reply(
        &self,
        to: SocketAddr,
        request_id: u64,
        result: Result<AuthorityOk, AuthorityError>,
    ) {
        let reply = AuthorityReply { request_id, result };
        match envelope::encode(
            MessageKind::AuthorityReply,
            &reply,
            MAX_STREAM_MESSAGE_BYTES,
        ) {
            Ok(bytes) => {
                if let Err(e) = self.rpc.send_stream_message(to, bytes) {
                    tracing::debug!(error = %e, %to, "reply not sent");
                }
            }
            Err(e) => tracing::warn!(error = %e, "reply too large"),
        }
    }

    /// Handles one request from `peer` (exposed for in-process tests).
    pub async fn handle(
        &self,
        peer: &NodeIdentity,
        body: AuthorityRequestBody,
    ) -> Result<AuthorityOk, AuthorityError> {
        self.handle_for(peer, body, None).await
    }

    /// As [`Replica::handle`], for a request an agent forwards on behalf of a local process
    /// (recorded in the audit log, never used to decide).
    pub async fn handle_for(
        &self,
        peer: &NodeIdentity,
        body: AuthorityRequestBody,
        on_behalf_of: Option<LocalCaller>,
    ) -> Result<AuthorityOk, AuthorityError> {
        let caller = caller_of(peer, &self.operators);
        if !crate::regions::gateway_may(peer.node_id.as_str(), &body) {
            return Err(AuthorityError::Refused {
                code: "gateway_read_only".into(),
                reason: "gateway identities (other regions' authorities) may only read".into(),
            });
        }
        let (cmd, answer) = match shoal_authority::route(caller.clone(), body) {
            Routed::Query(q) => return self.query(peer, &caller, q).await,
            Routed::Write { cmd, answer } => (cmd, answer),
        };
        if let AuthorityCommand::PutGlobalPolicy { signed, .. } = &cmd {
            self.regions.verify_policy(signed)?;
        }
        if self.sm.with_state(|s| s.is_noop(&cmd)) {
            // Every agent start binds the key already held: nothing to commit.
            return Ok(AuthorityOk::Committed {
                records: Vec::new(),
            });
        }
        let started = Instant::now();
        let res = self.write(cmd.clone(), on_behalf_of.clone()).await;
        let outcome = match &res {
            Ok(_) => "committed",
            Err(AuthorityError::Refused { .. }) => "refused",
            Err(AuthorityError::NotLeader { .. }) => "not_leader",
            Err(AuthorityError::NoQuorum) => "no_quorum",
            Err(AuthorityError::Invalid(_)) => "invalid",
        };
        counter!("shoal_authority_writes_total", "outcome" => outcome).increment(1);
        if res.is_ok() {
            histogram!("shoal_authority_commit_latency_seconds")
                .record(started.elapsed().as_secs_f64());
        }
        if let Err(e) = &res {
            if !matches!(e, AuthorityError::Refused { .. }) {
                self.audit_rejected(peer, on_behalf_of.as_ref(), &cmd, e);
            }
        }
        let records = res?;
        Ok(match answer {
            WriteAnswer::Records => AuthorityOk::Committed { records },
            WriteAnswer::Policy(key) => {
                AuthorityOk::Policy(self.sm.with_state(|s| s.policy(&key).cloned()))
            }
            WriteAnswer::GlobalPolicy => {
                AuthorityOk::GlobalPolicy(self.sm.with_state(|s| s.global_policy().cloned()))
            }
        })
    }

    /// Answers a request no command stands for.
    async fn query(
        &self,
        peer: &NodeIdentity,
        caller: &Caller,
        q: Query,
    ) -> Result<AuthorityOk, AuthorityError> {
        Ok(match q {
            Query::Status => match self.core_stopped() {
                // The probe (`shoal authority status`) fails, with the cause, until `run` exits.
                Some(cause) => {
                    return Err(AuthorityError::Refused {
                        code: "replica_stopped".into(),
                        reason: format!(
                            "replica {}: the Raft core stopped: {cause}",
                            self.cfg.me().node
                        ),
                    })
                }
                None => AuthorityOk::Status(self.status()),
            },
            Query::Members(op) => return self.members(peer, caller, op).await,
            Query::GetGlobalPolicy => {
                AuthorityOk::GlobalPolicy(self.sm.with_state(|s| s.global_policy().cloned()))
            }
            Query::GetPolicy(key) => {
                AuthorityOk::Policy(self.sm.with_state(|s| s.policy(&key).cloned()))
            }
            Query::RegionSummaries {
                keys,
                policy_version,
            } => self.regions.serve_summaries(keys, policy_version).await,
            Query::FailoverFeed { policy_version } => self.regions.feed(policy_version),
        })
    }

    /// Proposes `cmd` and waits for its outcome, bounded by `write_timeout_ms`.
    pub(super) async fn write(
        &self,
        cmd: AuthorityCommand,
        on_behalf_of: Option<LocalCaller>,
    ) -> Result<Vec<shoal_proto::SignedLifecycle>, AuthorityError> {
        let m = self.raft.metrics().borrow().clone();
        if m.state != ServerState::Leader {
            return Err(AuthorityError::NotLeader {
                leader: self.leader_rpc_addr(),
            });
        }
        if m.millis_since_quorum_ack
            .is_some_and(|ms| ms > self.cfg.quorum_stale_ms)
        {
            return Err(AuthorityError::NoQuorum);
        }
        let retry_of = cmd.transition_target();
        let proposal = Proposal {
            cmd,
            proposed_at_ms: wall_ms(),
            on_behalf_of,
        };
        let timeout = Duration::from_millis(self.cfg.write_timeout_ms);
        let res = match tokio::time::timeout(timeout, self.raft.client_write(proposal)).await {
            Err(_) => return Err(AuthorityError::NoQuorum),
            Ok(r) => r,
        };
        match res {
            Ok(resp) => match resp.data {
                Ok(records) => Ok(records),
                Err(refusal @ Refusal::AlreadyInState(_)) => {
                    counter!("shoal_authority_refusals_total", "code" => refusal.code())
                        .increment(1);
                    match self.sm.with_state(|s| s.retry_answer(retry_of.as_ref())) {
                        Some(records) => Ok(records),
                        None => Err(AuthorityError::Refused {
                            code: refusal.code().to_string(),
                            reason: refusal.to_string(),
                        }),
                    }
                }
                Err(refusal) => {
                    let code = refusal.code();
                    counter!("shoal_authority_refusals_total", "code" => code).increment(1);
                    Err(AuthorityError::Refused {
                        code: code.to_string(),
                        reason: refusal.to_string(),
                    })
                }
            },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(AuthorityError::NotLeader {
                    leader: f.leader_node.map(|n| n.rpc_addr),
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "client_write failed");
                Err(AuthorityError::NoQuorum)
            }
        }
    }

    pub(super) fn audit_rejected(
        &self,
        peer: &NodeIdentity,
        on_behalf_of: Option<&LocalCaller>,
        cmd: &AuthorityCommand,
        e: &AuthorityError,
    ) {
        self.audit_line(&serde_json::json!({
            "rpc_rejected": {
                "at_ms": wall_ms(),
                "peer": peer.node_id.as_str(),
                "on_behalf_of": on_behalf_of,
                "command": format!("{cmd:?}"),
                "error": e.to_string(),
            }
        }));
    }

    /// Appends one JSON line to this replica's `audit.log` (RPC-layer events; applied
    /// commands are audited by the state machine, through the same writer).
    pub(super) fn audit_line(&self, line: &serde_json::Value) {
        self.sm.audit_line(line);
    }
}
