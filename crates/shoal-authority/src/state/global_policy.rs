//! The global policy document held by the region authority (docs/adr/0013-global-policy-and-failover.md).

use shoal_proto::SignedGlobalPolicy;

use super::AuthorityState;
use crate::refusal::{InvalidRequest, Refusal};

impl AuthorityState {
    /// The held global policy document, if any.
    pub fn global_policy(&self) -> Option<&SignedGlobalPolicy> {
        self.global_policy.as_ref()
    }

    /// The held global policy version (0: none).
    pub fn global_policy_version(&self) -> u64 {
        self.global_policy.as_ref().map_or(0, |g| g.policy.version)
    }

    /// Keeps `signed` when it is valid and its version is above the held one. The signature
    /// was checked by the proposing replica (the state machine holds no policy keys, so every
    /// replica applies the same log identically whatever keys it is configured with).
    pub(super) fn put_global_policy(&mut self, signed: SignedGlobalPolicy) -> Result<(), Refusal> {
        signed
            .policy
            .validate()
            .map_err(|e| InvalidRequest::GlobalPolicy(e.to_string()))?;
        let held = self.global_policy_version();
        if signed.policy.version <= held {
            return Err(InvalidRequest::GlobalPolicyVersion {
                offered: signed.policy.version,
                held,
            }
            .into());
        }
        self.global_policy = Some(signed);
        Ok(())
    }
}
