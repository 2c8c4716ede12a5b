//! How each command is named in the audit log (who asked, and a compact summary of what).

use shoal_proto::KeyId;

use crate::audit::CommandSummary;
use crate::caller::CallerId;
use crate::command::AuthorityCommand;

pub(super) fn caller_id(cmd: &AuthorityCommand) -> CallerId {
    match cmd {
        AuthorityCommand::Register { caller, .. }
        | AuthorityCommand::Transition { caller, .. }
        | AuthorityCommand::PutPolicy { caller, .. }
        | AuthorityCommand::PutGlobalPolicy { caller, .. }
        | AuthorityCommand::BindNodeKey { caller, .. }
        | AuthorityCommand::RevokeNode { caller, .. }
        | AuthorityCommand::ReadmitNode { caller, .. } => caller.id(),
        AuthorityCommand::NodeDown { .. }
        | AuthorityCommand::NodeUp { .. }
        | AuthorityCommand::ExpireLeases { .. }
        | AuthorityCommand::LeaderTakeover { .. } => CallerId::Authority,
    }
}

pub(super) fn summary(cmd: &AuthorityCommand) -> CommandSummary {
    match cmd {
        AuthorityCommand::Register {
            key,
            instance,
            on_node,
            lease_ms,
            endpoint,
            ..
        } => CommandSummary::Register {
            key: key.clone(),
            instance: instance.clone(),
            on_node: on_node.clone(),
            address: endpoint.address,
            lease_ms: *lease_ms,
        },
        AuthorityCommand::Transition {
            key,
            instance,
            generation,
            to,
            reason,
            ..
        } => CommandSummary::Transition {
            key: key.clone(),
            instance: instance.clone(),
            generation: *generation,
            to: *to,
            reason: *reason,
        },
        AuthorityCommand::NodeDown { node, at_ms } => CommandSummary::NodeDown {
            node: node.clone(),
            at_ms: *at_ms,
        },
        AuthorityCommand::NodeUp { node } => CommandSummary::NodeUp { node: node.clone() },
        AuthorityCommand::ExpireLeases { now_ms } => {
            CommandSummary::ExpireLeases { now_ms: *now_ms }
        }
        AuthorityCommand::LeaderTakeover { now_ms, .. } => {
            CommandSummary::LeaderTakeover { now_ms: *now_ms }
        }
        AuthorityCommand::PutPolicy { key, .. } => CommandSummary::PutPolicy { key: key.clone() },
        AuthorityCommand::PutGlobalPolicy { signed, .. } => CommandSummary::PutGlobalPolicy {
            version: signed.policy.version,
            signer: signed.signer,
        },
        AuthorityCommand::BindNodeKey { key, .. } => {
            let mut id = [0u8; 8];
            id.copy_from_slice(&key[..8]);
            CommandSummary::BindNodeKey { key: KeyId(id) }
        }
        AuthorityCommand::RevokeNode { node, .. } => {
            CommandSummary::RevokeNode { node: node.clone() }
        }
        AuthorityCommand::ReadmitNode { node, .. } => {
            CommandSummary::ReadmitNode { node: node.clone() }
        }
    }
}
