//! `shoal policy ...`: the global policy key and documents (docs/adr/0013-global-policy-and-failover.md).
//!
//! - `keygen --out FILE`: a global policy key seed (0600), prints its public key (hex) for the
//!   authorities' and agents' `[failover] policy_keys`;
//! - `sign --key FILE --in policy.json --out policy.signed`: validates and signs a document;
//! - `verify FILE --policy-key HEX`: checks a signed document offline and prints it as JSON;
//! - `push FILE --addr ... --ca ... --cert ... --key ...`: hands it to one region's authority
//!   (committed through Raft, audited; other regions' authorities pull it from there);
//! - `show --addr ...`: prints the document a replica holds.
//!
//! The input JSON:
//! ```json
//! {"version": 2,
//!  "regions": [{"region": "r1", "authority_keys": ["<64 hex>"]}],
//!  "services": [{"service": "prod/web/http", "allowed_failover_regions": ["r2", "r3"],
//!                "mode": "read_only", "max_cross_region_rps": 200,
//!                "max_snapshot_age_s": 600, "on_stale": "degrade",
//!                "overprovisioning_factor_pct": 140}]}
//! ```
//!
//! `overprovisioning_factor_pct` (optional, 100..=10000) turns on threshold failover: a pick
//! spills to the failover regions with Envoy's priority-load share,
//! `100 - min(100, factor * routable / registered)` % of the local region
//! (<https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/upstream/load_balancing/priority>;
//! Envoy's default is 140). Absent: fail over only when the region has no routable endpoint.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Subcommand;
use serde::Deserialize;
use serde_json::json;
use shoal_proto::rpc::{AuthorityOk, AuthorityRequestBody};
use shoal_proto::{
    FailoverMode, GlobalPolicy, GlobalServicePolicy, Region, RegionKeys, ServicePolicy,
    SignedGlobalPolicy, SigningKey, StaleAction,
};
use shoal_transport::keyfile;

use crate::cli::{operator_call, Connect};
use crate::config::{from_hex, read_signing_key, to_hex};

/// `shoal policy` subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyCmd {
    /// Generate a global policy key seed file (0600) and print its public key (hex).
    Keygen {
        /// Output file.
        #[arg(long)]
        out: PathBuf,
        /// Replace an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Validate and sign a policy JSON document with the global policy key.
    Sign {
        /// The global policy key seed file.
        #[arg(long)]
        key: PathBuf,
        /// Input JSON (see the module docs).
        #[arg(long = "in")]
        input: PathBuf,
        /// Output file (postcard of the signed document).
        #[arg(long)]
        out: PathBuf,
    },
    /// Verify a signed document offline and print it as JSON.
    Verify {
        /// The signed document.
        file: PathBuf,
        /// The global policy public key (hex).
        #[arg(long)]
        policy_key: String,
    },
    /// Hand a signed document to a region's authority (Raft-committed and audited there).
    Push {
        /// The signed document.
        file: PathBuf,
        /// Where the authority is.
        #[command(flatten)]
        connect: Connect,
    },
    /// Print the document a replica holds.
    Show {
        /// Where the authority is.
        #[command(flatten)]
        connect: Connect,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputDoc {
    version: u64,
    regions: Vec<InputRegion>,
    #[serde(default)]
    services: Vec<InputService>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputRegion {
    region: String,
    authority_keys: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputService {
    service: String,
    allowed_failover_regions: Vec<String>,
    mode: String,
    #[serde(default)]
    max_cross_region_rps: Option<u32>,
    #[serde(default)]
    max_snapshot_age_s: Option<u32>,
    #[serde(default = "d_on_stale")]
    on_stale: String,
    #[serde(default)]
    overprovisioning_factor_pct: Option<u32>,
}

fn d_on_stale() -> String {
    "degrade".into()
}

/// Builds a [`GlobalPolicy`] from the input JSON (sorted, validated).
///
/// # Errors
/// Bad JSON, names, keys, modes, or a document that fails [`GlobalPolicy::validate`].
pub fn parse_document(text: &str, issued_at_ms: u64) -> anyhow::Result<GlobalPolicy> {
    let doc: InputDoc = serde_json::from_str(text).context("policy JSON")?;
    let mut regions = Vec::new();
    for r in doc.regions {
        let mut keys = Vec::new();
        for k in &r.authority_keys {
            let b: [u8; 32] = from_hex(k)
                .and_then(|b| b.try_into().ok())
                .with_context(|| format!("region {}: key {k:?} is not 64 hex chars", r.region))?;
            keys.push(b);
        }
        regions.push(RegionKeys {
            region: Region::new(r.region.clone())
                .with_context(|| format!("region {}", r.region))?,
            authority_keys: keys,
        });
    }
    regions.sort_by(|a, b| a.region.cmp(&b.region));
    let mut services = Vec::new();
    for s in doc.services {
        let mode = match s.mode.as_str() {
            "read_only" => FailoverMode::ReadOnly,
            "writable" => FailoverMode::Writable,
            m => anyhow::bail!("service {}: mode {m:?} (read_only or writable)", s.service),
        };
        let on_stale = match s.on_stale.as_str() {
            "degrade" => StaleAction::Degrade,
            "refuse" => StaleAction::Refuse,
            m => anyhow::bail!("service {}: on_stale {m:?} (degrade or refuse)", s.service),
        };
        let mut allowed = Vec::new();
        for r in &s.allowed_failover_regions {
            allowed.push(Region::new(r.clone()).with_context(|| format!("region {r}"))?);
        }
        services.push(GlobalServicePolicy {
            key: s
                .service
                .parse()
                .map_err(|e| anyhow::anyhow!("service {}: {e}", s.service))?,
            policy: ServicePolicy {
                allowed_failover_regions: allowed,
                mode,
                max_cross_region_rps: s.max_cross_region_rps,
                max_snapshot_age_s: s.max_snapshot_age_s,
                on_stale,
                overprovisioning_factor_pct: s.overprovisioning_factor_pct,
            },
        });
    }
    services.sort_by(|a, b| a.key.cmp(&b.key));
    let policy = GlobalPolicy {
        version: doc.version,
        issued_at_ms,
        regions,
        services,
    };
    policy.validate()?;
    Ok(policy)
}

/// The document as JSON (for `verify` and `show`).
pub fn document_json(signed: &SignedGlobalPolicy) -> serde_json::Value {
    let p = &signed.policy;
    json!({
        "version": p.version,
        "issued_at_ms": p.issued_at_ms,
        "signer": format!("{:?}", signed.signer),
        "regions": p.regions.iter().map(|r| json!({
            "region": r.region.to_string(),
            "authority_keys": r.authority_keys.iter().map(|k| to_hex(k)).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "services": p.services.iter().map(|s| json!({
            "service": s.key.to_string(),
            "allowed_failover_regions": s.policy.allowed_failover_regions.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "mode": match s.policy.mode { FailoverMode::ReadOnly => "read_only", FailoverMode::Writable => "writable" },
            "max_cross_region_rps": s.policy.max_cross_region_rps,
            "max_snapshot_age_s": s.policy.max_snapshot_age_s,
            "on_stale": match s.policy.on_stale { StaleAction::Degrade => "degrade", StaleAction::Refuse => "refuse" },
            "overprovisioning_factor_pct": s.policy.overprovisioning_factor_pct,
        })).collect::<Vec<_>>(),
    })
}

/// Largest signed policy file read (`verify`, `push`): 4 MiB, the largest RPC message
/// ([`shoal_proto::envelope::MAX_STREAM_MESSAGE_BYTES`]); `push` sends the file in one message,
/// so a larger one could never be delivered.
pub const MAX_SIGNED_POLICY_BYTES: u64 = shoal_proto::envelope::MAX_STREAM_MESSAGE_BYTES as u64;

/// Largest policy document read by `sign`: 16 MiB. Its signed encoding must fit
/// [`MAX_SIGNED_POLICY_BYTES`], and JSON with its key names and hex keys takes a few times the
/// bytes of that encoding.
pub const MAX_POLICY_DOCUMENT_BYTES: u64 = 16 << 20;

fn read_signed(path: &Path) -> anyhow::Result<SignedGlobalPolicy> {
    let bytes = keyfile::read_bounded(path, MAX_SIGNED_POLICY_BYTES)
        .with_context(|| format!("reading {}", path.display()))?;
    postcard::from_bytes(&bytes).with_context(|| format!("{}: not a signed policy", path.display()))
}

/// Runs one `shoal policy` command.
///
/// # Errors
/// Any failure, with context.
pub async fn run(cmd: PolicyCmd) -> anyhow::Result<()> {
    match cmd {
        PolicyCmd::Keygen { out, force } => {
            let overwrite = crate::cli::prepare_key_out(&out, force)?;
            let mut seed = [0u8; 32];
            rand::fill(&mut seed);
            keyfile::write_private(&out, to_hex(&seed).as_bytes(), overwrite)?;
            println!(
                "{}",
                to_hex(&SigningKey::from_seed(seed).verifying_key().to_bytes())
            );
        }
        PolicyCmd::Sign { key, input, out } => {
            let key = read_signing_key(&key)?;
            let bytes = keyfile::read_bounded(&input, MAX_POLICY_DOCUMENT_BYTES)
                .with_context(|| format!("reading {}", input.display()))?;
            let text = String::from_utf8(bytes)
                .with_context(|| format!("reading {}: not UTF-8", input.display()))?;
            let policy = parse_document(&text, crate::server::wall_ms())?;
            let signed = key.sign_global_policy(policy);
            let bytes = postcard::to_allocvec(&signed).context("encoding")?;
            std::fs::write(&out, bytes).with_context(|| format!("writing {}", out.display()))?;
            println!("{}", document_json(&signed));
        }
        PolicyCmd::Verify { file, policy_key } => {
            let signed = read_signed(&file)?;
            let keys = shoal_runtime::config::parse_public_keys(&[policy_key])?;
            signed.verify(&keys).map_err(|e| anyhow::anyhow!(e))?;
            println!("{}", document_json(&signed));
        }
        PolicyCmd::Push { file, connect } => {
            let signed = read_signed(&file)?;
            let body = AuthorityRequestBody::PutGlobalPolicy { signed };
            match operator_call(&connect, body).await? {
                AuthorityOk::GlobalPolicy(Some(p)) => println!("{}", document_json(&p)),
                other => anyhow::bail!("unexpected answer: {other:?}"),
            }
        }
        PolicyCmd::Show { connect } => {
            match operator_call(&connect, AuthorityRequestBody::GetGlobalPolicy).await? {
                AuthorityOk::GlobalPolicy(Some(p)) => println!("{}", document_json(&p)),
                AuthorityOk::GlobalPolicy(None) => println!("null"),
                other => anyhow::bail!("unexpected answer: {other:?}"),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(extra: &str) -> String {
        let k = to_hex(&SigningKey::from_seed([3; 32]).verifying_key().to_bytes());
        format!(
            r#"{{"version": 2, "regions": [{{"region": "r1", "authority_keys": ["{k}"]}}],
               "services": [{{"service": "prod/web/http", "allowed_failover_regions": ["r2"],
                              "mode": "read_only"{extra}}}]}}"#
        )
    }

    #[test]
    fn the_overprovisioning_factor_is_parsed_range_checked_and_shown() {
        let p = parse_document(&input(""), 0).unwrap();
        assert_eq!(p.services[0].policy.overprovisioning_factor_pct, None);
        let p = parse_document(&input(r#", "overprovisioning_factor_pct": 140"#), 0).unwrap();
        assert_eq!(p.services[0].policy.overprovisioning_factor_pct, Some(140));
        let shown = document_json(&SigningKey::from_seed([9; 32]).sign_global_policy(p));
        assert_eq!(shown["services"][0]["overprovisioning_factor_pct"], 140);
        let err = parse_document(&input(r#", "overprovisioning_factor_pct": 50"#), 0)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("prod/web/http")
                && err.contains("overprovisioning_factor_pct must be 100..=10000"),
            "{err}"
        );
        assert!(parse_document(&input(r#", "overprovisioning_factor_pct": -1"#), 0).is_err());
    }
}
