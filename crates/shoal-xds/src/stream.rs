//! One state-of-the-world ADS stream as a state machine, without IO: requests and new views go
//! in, responses come out. [`crate::server`] drives it from a gRPC stream; the tests drive it
//! directly.
//!
//! The rules (the xDS transport protocol, "ACK and NACK semantics" and "When to send an
//! update" in Envoy's `xds_protocol` document):
//!
//! - Every response carries the view's version as `version_info` and a fresh `nonce`
//!   (a per-stream counter).
//! - A request whose `response_nonce` is that of the last response of its type is an **ACK**
//!   (no `error_detail`) or a **NACK** (`error_detail` set: the client rejected the response and
//!   keeps its previous config). A NACK is logged and counted by the driver; the rejected content
//!   is not sent again: the next change of the view is.
//! - A request with an older nonce is **stale** (the client has not seen the newest response
//!   yet) and is ignored: the newer response answers it.
//! - A request with an empty nonce is an initial subscription and is always answered.
//! - A change of `resource_names` is answered with the resources for the new names.
//! - A new view is sent, per subscribed type, only when that type's resources changed.
//!
//! Empty `resource_names` means every resource for LDS and CDS (the legacy wildcard) and none
//! for RDS and EDS.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Any;
use shoal_proto::Zone;

use crate::model::{Locality, View};
use crate::resources::{build, ResourceType};

/// Most resource names one subscription may hold; a request naming more is refused.
pub const MAX_RESOURCE_NAMES: usize = 10_000;

/// What one request was, for the driver's logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestKind {
    /// First request of a type on this stream (empty nonce).
    Subscribe,
    /// The client accepted the response with this nonce.
    Ack,
    /// The client rejected the response with this nonce; `message` is its `error_detail`.
    Nack {
        /// The client's `error_detail.message`.
        message: String,
    },
    /// A nonce older than the last response of its type: ignored.
    Stale,
}

/// A request this stream refuses. Nothing of the stream's state changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The type URL is none of the four served types.
    #[error("resource type {0:?} is not served (only LDS, RDS, CDS and EDS over ADS)")]
    UnknownType(String),
    /// More than [`MAX_RESOURCE_NAMES`] names.
    #[error("{0} resource names in one request (at most {MAX_RESOURCE_NAMES})")]
    TooManyNames(usize),
}

/// The outcome of one accepted request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutcome {
    /// The type the request was for.
    pub ty: ResourceType,
    /// What the request was.
    pub kind: RequestKind,
    /// The response to send, if any.
    pub response: Option<DiscoveryResponse>,
}

/// The last response of one type on this stream.
#[derive(Debug, Clone)]
struct Sent {
    nonce: String,
    resources: Vec<(String, Any)>,
}

/// One type's subscription on this stream.
#[derive(Debug, Clone, Default)]
struct Subscription {
    /// `None`: the wildcard (LDS/CDS with empty names).
    names: Option<BTreeSet<String>>,
    last: Option<Sent>,
    acked_version: Option<String>,
}

/// A state-of-the-world ADS stream.
pub struct AdsStream {
    local: Locality,
    caller: Locality,
    node_id: Option<String>,
    subs: BTreeMap<ResourceType, Subscription>,
    next_nonce: u64,
}

impl std::fmt::Debug for AdsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdsStream")
            .field("caller", &self.caller)
            .field("node_id", &self.node_id)
            .field("types", &self.subs.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl AdsStream {
    /// A new stream of a caller next to the agent at `local` (region and zone).
    pub fn new(local: Locality) -> Self {
        Self {
            caller: local.clone(),
            local,
            node_id: None,
            subs: BTreeMap::new(),
            next_nonce: 0,
        }
    }

    /// The caller's locality: its bootstrap's `node.locality.zone` when valid, else the agent's.
    pub fn caller(&self) -> &Locality {
        &self.caller
    }

    /// The caller's `node.id` once a request carried it.
    pub fn node_id(&self) -> Option<&str> {
        self.node_id.as_deref()
    }

    /// The version the client last ACKed for a type (`None`: none yet).
    pub fn acked_version(&self, ty: ResourceType) -> Option<&str> {
        self.subs.get(&ty)?.acked_version.as_deref()
    }

    fn learn_node(&mut self, node: &Node) {
        if !node.id.is_empty() {
            self.node_id = Some(node.id.chars().take(256).collect());
        }
        if let Some(zone) = node
            .locality
            .as_ref()
            .and_then(|l| Zone::new(l.zone.clone()).ok())
        {
            self.caller.zone = zone;
        } else {
            self.caller.zone = self.local.zone.clone();
        }
    }

    /// Feeds one request of the client, with the newest view.
    ///
    /// # Errors
    /// [`RequestError`] for a type that is not served or too many names; the stream's state is
    /// unchanged and the stream may go on.
    #[must_use = "the response must be sent"]
    pub fn handle_request(
        &mut self,
        req: &DiscoveryRequest,
        view: &View,
    ) -> Result<RequestOutcome, RequestError> {
        let ty = ResourceType::from_type_url(&req.type_url)
            .ok_or_else(|| RequestError::UnknownType(req.type_url.chars().take(200).collect()))?;
        if req.resource_names.len() > MAX_RESOURCE_NAMES {
            return Err(RequestError::TooManyNames(req.resource_names.len()));
        }
        if let Some(node) = &req.node {
            self.learn_node(node);
        }
        let sub = self.subs.entry(ty).or_default();
        let kind = match (&sub.last, req.response_nonce.as_str()) {
            (_, "") => RequestKind::Subscribe,
            (Some(last), nonce) if last.nonce == nonce => match &req.error_detail {
                Some(status) => RequestKind::Nack {
                    message: status.message.chars().take(1_000).collect(),
                },
                None => {
                    sub.acked_version = Some(req.version_info.clone());
                    RequestKind::Ack
                }
            },
            _ => RequestKind::Stale,
        };
        if kind == RequestKind::Stale {
            return Ok(RequestOutcome {
                ty,
                kind,
                response: None,
            });
        }
        let names = if req.resource_names.is_empty() && ty.empty_means_wildcard() {
            None
        } else {
            Some(req.resource_names.iter().cloned().collect::<BTreeSet<_>>())
        };
        let changed = sub.names != names;
        sub.names = names;
        let must_answer = kind == RequestKind::Subscribe || changed;
        let response = must_answer.then(|| self.respond(ty, view, true));
        Ok(RequestOutcome {
            ty,
            kind,
            response: response.flatten(),
        })
    }

    /// Feeds a new view: the responses for every subscribed type whose resources changed.
    #[must_use = "the responses must be sent"]
    pub fn handle_view(&mut self, view: &View) -> Vec<DiscoveryResponse> {
        let types: Vec<ResourceType> = self.subs.keys().copied().collect();
        types
            .into_iter()
            .filter_map(|ty| self.respond(ty, view, false))
            .collect()
    }

    /// Builds the response of one type; with `always == false`, only when its resources differ
    /// from the last response of that type.
    fn respond(
        &mut self,
        ty: ResourceType,
        view: &View,
        always: bool,
    ) -> Option<DiscoveryResponse> {
        let caller = self.caller.clone();
        let sub = self.subs.get_mut(&ty)?;
        let resources = build(ty, view, sub.names.as_ref(), &caller);
        let unchanged = sub.last.as_ref().is_some_and(|l| l.resources == resources);
        if unchanged && !always {
            return None;
        }
        self.next_nonce += 1;
        let nonce = self.next_nonce.to_string();
        let response = DiscoveryResponse {
            version_info: view.version.to_string(),
            resources: resources.iter().map(|(_, a)| a.clone()).collect(),
            type_url: ty.type_url(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        sub.last = Some(Sent { nonce, resources });
        Some(response)
    }
}

#[cfg(test)]
mod tests;
