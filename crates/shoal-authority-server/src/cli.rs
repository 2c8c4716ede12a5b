//! `shoal authority ...`: the replica server and its admin commands (wired into the `shoal`
//! binary by `crates/shoal-cli/src/authority.rs`, and into this crate's `shoal-authority`
//! binary).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use shoal_proto::rpc::{AuthorityOk, AuthorityRequestBody, MembersOp};
use shoal_proto::SigningKey;
use shoal_transport::certs::{read_key_file, read_pem_file};
use shoal_transport::keyfile::{self, Overwrite};

use crate::client::AuthorityClient;
use crate::config::{to_hex, AuthorityConfig};
use crate::storage;

/// Authority subcommands.
#[derive(Debug, Subcommand)]
pub enum AuthorityCmd {
    /// Run one authority replica until SIGINT/SIGTERM.
    Run {
        /// Path of authority.toml.
        #[arg(long)]
        config: PathBuf,
    },
    /// Print a replica's status (leader, term, revision, members) as JSON.
    Status {
        /// The replica's RPC address (`ip:port`; default `$SHOAL_AUTHORITY_ADDR`, which lets a
        /// Kubernetes exec probe name its own pod IP).
        #[arg(long, env = "SHOAL_AUTHORITY_ADDR")]
        addr: SocketAddr,
        /// Region CA PEM.
        #[arg(long)]
        ca: PathBuf,
        /// Client certificate PEM (any node or operator certificate of the region).
        #[arg(long)]
        cert: PathBuf,
        /// Client key PEM.
        #[arg(long)]
        key: PathBuf,
        /// Reply timeout in ms.
        #[arg(long, default_value_t = 3_000)]
        timeout_ms: u64,
    },
    /// Save or restore a replica's snapshot file.
    Snapshot {
        /// What to do.
        #[command(subcommand)]
        cmd: SnapshotCmd,
    },
    /// Revoke or readmit a node's key (operator certificate required; ADR 0006).
    Node {
        /// What to do.
        #[command(subcommand)]
        cmd: NodeCmd,
    },
    /// List or change the replica set through Raft joint consensus (operator certificate
    /// required; docs/operations.md "Replace a replica").
    Members {
        /// What to do.
        #[command(subcommand)]
        cmd: MembersCmd,
    },
    /// Generate a region signing key seed file (mode 0600, its directory created 0700 when
    /// missing) and print its verifying key (hex) for the agents' `authority_keys`. Refuses to
    /// overwrite an existing file unless `--force`.
    Keygen {
        /// Output file (64 hex chars).
        #[arg(long)]
        out: PathBuf,
        /// Replace an existing key file (atomically). Every agent trusting the old key must be
        /// given the new one.
        #[arg(long)]
        force: bool,
    },
}

/// How to reach a replica as an operator.
#[derive(Debug, clap::Args)]
pub struct Connect {
    /// A replica's RPC address (`ip:port`); a follower's answer redirects to the leader.
    #[arg(long)]
    addr: SocketAddr,
    /// Region CA PEM.
    #[arg(long)]
    ca: PathBuf,
    /// Operator certificate PEM (`operator-*` identity, or one listed as an operator).
    #[arg(long)]
    cert: PathBuf,
    /// Operator key PEM.
    #[arg(long)]
    key: PathBuf,
    /// Reply timeout in ms.
    #[arg(long, default_value_t = 5_000)]
    timeout_ms: u64,
}

/// `shoal authority node ...`.
#[derive(Debug, Subcommand)]
pub enum NodeCmd {
    /// Revoke `node`: the authority stores no key for it, refuses it until readmitted and
    /// expires every live instance it owns (reason `NodeRevoked`), so nothing it signed
    /// verifies on any agent. Prints the expired records as JSON.
    Revoke {
        /// The node id.
        node: String,
        /// Where the authority is.
        #[command(flatten)]
        connect: Connect,
    },
    /// Lift a revocation: `node` may bind a new key (its revoked key stays refused).
    Readmit {
        /// The node id.
        node: String,
        /// Where the authority is.
        #[command(flatten)]
        connect: Connect,
    },
}

/// `shoal authority members ...`.
#[derive(Debug, Subcommand)]
pub enum MembersCmd {
    /// Print the voters and learners as JSON (the leader adds how far each has replicated
    /// and when it last answered).
    List {
        /// Where the authority is.
        #[command(flatten)]
        connect: Connect,
    },
    /// Add a running replica (started with `join = true`): as a learner until it has caught
    /// up, then as a voter. Prints the new replica set.
    Add {
        /// Its Raft id (unique; never reuse the id of a removed replica).
        #[arg(long)]
        id: u64,
        /// Its node id (the node id in its certificate).
        #[arg(long)]
        node: String,
        /// Its replica-to-replica address, `host:port`.
        #[arg(long)]
        raft_addr: String,
        /// Its agent RPC address, `host:port`.
        #[arg(long)]
        rpc_addr: String,
        /// Longest wait for it to catch up, ms.
        #[arg(long, default_value_t = 60_000)]
        catch_up_ms: u64,
        /// Where the authority is.
        #[command(flatten)]
        connect: Connect,
    },
    /// Remove a voter or learner. Refused if it is the last voter or if the remaining voters
    /// hold no live majority. Prints the new replica set.
    Remove {
        /// Its Raft id.
        #[arg(long)]
        id: u64,
        /// Where the authority is.
        #[command(flatten)]
        connect: Connect,
    },
}

/// JSON of a replica set as `members` prints it.
pub fn members_json(v: &shoal_proto::rpc::MembersView) -> serde_json::Value {
    serde_json::json!({
        "answered_by": v.answered_by,
        "leader": v.leader,
        "config_index": v.config_index,
        "joint": v.joint,
        "members": v.members.iter().map(|m| serde_json::json!({
            "id": m.id,
            "node": m.node,
            "raft_addr": m.raft_addr,
            "rpc_addr": m.rpc_addr,
            "voter": m.voter,
            "matched_index": m.matched_index,
            "last_heard_ms": m.last_heard_ms,
        })).collect::<Vec<_>>(),
    })
}

/// Sends one operator request, following leader redirects (at most 3).
pub(crate) async fn operator_call(
    c: &Connect,
    body: AuthorityRequestBody,
) -> anyhow::Result<AuthorityOk> {
    let client = AuthorityClient::connect(
        "127.0.0.1:0".parse().expect("addr"),
        &read_pem_file(&c.ca)?,
        &read_pem_file(&c.cert)?,
        &read_pem_file(&c.key)?,
    )?;
    let mut addr = c.addr;
    let mut result = Err(anyhow::anyhow!("no answer"));
    for _ in 0..4 {
        let res = client
            .call(addr, body.clone(), Duration::from_millis(c.timeout_ms))
            .await?;
        match res {
            Err(shoal_proto::rpc::AuthorityError::NotLeader {
                leader: Some(leader),
            }) => {
                addr = leader.parse().context("leader address")?;
                result = Err(anyhow::anyhow!("not the leader; last tried {addr}"));
            }
            Err(shoal_proto::rpc::AuthorityError::Refused { code, reason }) => {
                result = Err(anyhow::anyhow!("refused ({code}): {reason}"));
                break;
            }
            Err(e) => {
                result = Err(anyhow::anyhow!("{e}"));
                break;
            }
            Ok(ok) => {
                result = Ok(ok);
                break;
            }
        }
    }
    client.shutdown().await;
    result
}

/// `shoal authority snapshot ...`.
#[derive(Debug, Subcommand)]
pub enum SnapshotCmd {
    /// Copy the latest verified snapshot of a data directory to `file`. A running replica
    /// that has none yet is asked for one first.
    Save {
        /// Destination file (written atomically, mode 0600). Refuses to overwrite an existing
        /// file unless `--force`.
        file: PathBuf,
        /// The replica's data directory (never created by this command).
        #[arg(long)]
        data_dir: PathBuf,
        /// How long to wait for a running replica to build its first snapshot, ms.
        #[arg(long, default_value_t = 30_000)]
        wait_ms: u64,
        /// Replace an existing `file` (atomically).
        #[arg(long)]
        force: bool,
    },
    /// Disaster recovery: start a NEW cluster incarnation from `file` in a STOPPED replica's
    /// data directory (fresh vote and log; revisions and generations above `--floor`). See
    /// docs/operations.md for the runbook.
    Restore {
        /// Snapshot file made by `save`.
        file: PathBuf,
        /// The replica's data directory.
        #[arg(long)]
        data_dir: PathBuf,
        /// Every revision and generation the region issued before the disaster is <= this
        /// (the largest region head and generation the agents report). Default: the backup's
        /// head plus `--margin`.
        #[arg(long)]
        floor: Option<u64>,
        /// Margin over the backup's head when `--floor` is not given.
        #[arg(long, default_value_t = storage::DEFAULT_RESTORE_MARGIN)]
        margin: u64,
        /// Id of the new incarnation: omit on the first replica; on the others pass the id
        /// (and `--floor`) the first restore printed.
        #[arg(long)]
        cluster_id: Option<String>,
        /// Confirm discarding the directory's vote, log and snapshot (moved to
        /// `pre-restore-<id>/`, not deleted).
        #[arg(long)]
        force_new_cluster: bool,
        /// Make this replica (its Raft id) the new cluster's only voter; add the others with
        /// `members add` afterwards.
        #[arg(long)]
        single_voter: Option<u64>,
    },
}

/// Initialises `tracing` from `RUST_LOG` (default `info`); idempotent.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: log files and journald get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Initialises `tracing` for a short command (everything but `run`): warnings on stderr
/// (`RUST_LOG` may ask for more), one plain line each without timestamps, so that a library's
/// `tracing::warn!` reaches the operator; e.g. `keygen` and `shoal certs` warn about an output
/// directory that group or others can write (`shoal_transport::keyfile::ensure_dir`).
/// Idempotent; a subscriber installed before wins.
pub fn init_cli_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Checks a `keygen`'s `--out` before anything is written, then creates its missing parent
/// directories (0700, [`keyfile::ensure_dir`]); returns how to write the file. So a refused run
/// (a path that names no file or a directory, or a file that exists without `--force`) leaves
/// no directory behind: `--out new/../region.key` with `region.key` present used to create
/// `new/` and then refuse. [`keyfile::write_private`] still opens the file `O_EXCL`, so a file
/// that appears in between is refused all the same.
///
/// # Errors
/// The refusal, naming `out`; [`keyfile::KeyFileError`] when a directory cannot be created.
pub(crate) fn prepare_key_out(out: &Path, force: bool) -> anyhow::Result<Overwrite> {
    if out.file_name().is_none() {
        anyhow::bail!(
            "{}: names no file; give the key file's path (e.g. DIR/region.key)",
            out.display()
        );
    }
    let target = keyfile::path_once_created(out);
    if let Ok(meta) = std::fs::symlink_metadata(&target) {
        if meta.is_dir() {
            anyhow::bail!(
                "{}: is a directory; give the key file's path",
                out.display()
            );
        }
        if !force {
            return Err(keyfile::KeyFileError::Exists {
                path: out.to_path_buf(),
            }
            .into());
        }
    }
    if let Some(dir) = out.parent() {
        keyfile::ensure_dir(dir)?;
    }
    Ok(if force {
        Overwrite::Replace
    } else {
        Overwrite::Refuse
    })
}

/// Runs an authority subcommand.
///
/// # Errors
/// Whatever the command fails with, with context.
pub async fn run(cmd: AuthorityCmd) -> anyhow::Result<()> {
    if !matches!(cmd, AuthorityCmd::Run { .. }) {
        init_cli_tracing();
    }
    match cmd {
        AuthorityCmd::Run { config } => {
            init_tracing();
            let cfg = AuthorityConfig::load(&config)?;
            crate::server::run(cfg).await
        }
        AuthorityCmd::Status {
            addr,
            ca,
            cert,
            key,
            timeout_ms,
        } => {
            let client = AuthorityClient::connect(
                "127.0.0.1:0".parse().expect("addr"),
                &read_pem_file(&ca)?,
                &read_pem_file(&cert)?,
                &read_key_file(&key)?,
            )?;
            let res = client
                .call(
                    addr,
                    AuthorityRequestBody::Status,
                    Duration::from_millis(timeout_ms),
                )
                .await?;
            match res {
                Ok(AuthorityOk::Status(s)) => {
                    let json = serde_json::json!({
                        "node": s.node.as_str(),
                        "leader": s.leader.as_ref().map(|l| l.as_str().to_string()),
                        "term": s.term,
                        "applied_index": s.applied_index,
                        "revision": s.revision.0,
                        "members": s.members.iter().map(|m| m.as_str().to_string()).collect::<Vec<_>>(),
                        "cluster_id": s.cluster_id,
                    });
                    println!("{json}");
                }
                other => anyhow::bail!("unexpected answer: {other:?}"),
            }
            client.shutdown().await;
            Ok(())
        }
        AuthorityCmd::Snapshot { cmd } => match cmd {
            SnapshotCmd::Save {
                file,
                data_dir,
                wait_ms,
                force,
            } => {
                let wait = Duration::from_millis(wait_ms);
                let meta = storage::save_snapshot(&data_dir, &file, wait, force)
                    .with_context(|| format!("saving the snapshot of {}", data_dir.display()))?;
                println!("saved snapshot {} to {}", meta.snapshot_id, file.display());
                Ok(())
            }
            SnapshotCmd::Restore {
                file,
                data_dir,
                floor,
                margin,
                cluster_id,
                force_new_cluster,
                single_voter,
            } => {
                let opts = storage::RestoreOptions {
                    floor,
                    margin,
                    cluster_id,
                    force_new_cluster,
                    single_voter,
                };
                let r = storage::restore_snapshot(&data_dir, &file, &opts).with_context(|| {
                    format!("restoring {} into {}", file.display(), data_dir.display())
                })?;
                println!(
                    "restored snapshot {} (revision {}, log index {}) into {} as new cluster {}",
                    r.meta.snapshot_id,
                    r.backup_head.0,
                    r.backup_head.1,
                    data_dir.display(),
                    r.cluster_id
                );
                println!(
                    "revisions and generations issued from now on are > {}",
                    r.floor
                );
                if let Some(aside) = &r.aside_dir {
                    println!(
                        "moved aside: {} -> {}",
                        r.moved_aside.join(", "),
                        aside.display()
                    );
                }
                if let Some(id) = single_voter {
                    println!(
                        "replica {id} is the only voter: start it, then for each other replica \
                         move its data directory away, set join = true in its authority.toml, \
                         start it and run `shoal authority members add --id <ID> ...`"
                    );
                } else {
                    println!(
                        "seed every other replica of the region (stopped) with:\n  shoal authority snapshot restore {} --data-dir <DIR> --floor {} --cluster-id {} --force-new-cluster",
                        file.display(),
                        r.floor,
                        r.cluster_id
                    );
                }
                Ok(())
            }
        },
        AuthorityCmd::Node { cmd } => {
            let (what, node, connect) = match cmd {
                NodeCmd::Revoke { node, connect } => ("revoked", node, connect),
                NodeCmd::Readmit { node, connect } => ("readmitted", node, connect),
            };
            let id = shoal_proto::NodeId::new(node.clone()).context("node id")?;
            let body = if what == "revoked" {
                AuthorityRequestBody::RevokeNode { node: id }
            } else {
                AuthorityRequestBody::ReadmitNode { node: id }
            };
            let records = match operator_call(&connect, body).await? {
                AuthorityOk::Committed { records } => records,
                other => anyhow::bail!("unexpected answer: {other:?}"),
            };
            let expired: Vec<_> = records
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "service": r.record.key.to_string(),
                        "instance": r.record.instance.as_str(),
                        "generation": r.record.generation.0,
                        "revision": r.record.revision.0,
                    })
                })
                .collect();
            println!(
                "{}",
                serde_json::json!({ "node": node, what: true, "expired": expired })
            );
            Ok(())
        }
        AuthorityCmd::Members { cmd } => {
            let (op, connect, wait_ms) = match cmd {
                MembersCmd::List { connect } => (MembersOp::List, connect, 0),
                MembersCmd::Add {
                    id,
                    node,
                    raft_addr,
                    rpc_addr,
                    catch_up_ms,
                    connect,
                } => (
                    MembersOp::Add {
                        id,
                        node: shoal_proto::NodeId::new(node).context("--node")?,
                        raft_addr,
                        rpc_addr,
                        catch_up_ms,
                    },
                    connect,
                    catch_up_ms + 30_000,
                ),
                MembersCmd::Remove { id, connect } => (MembersOp::Remove { id }, connect, 30_000),
            };
            // A change waits for catch-up and two commits: give the reply that long.
            let mut connect = connect;
            connect.timeout_ms = connect.timeout_ms.max(wait_ms);
            match operator_call(&connect, AuthorityRequestBody::Members(op)).await? {
                AuthorityOk::Members(v) => println!("{}", members_json(&v)),
                other => anyhow::bail!("unexpected answer: {other:?}"),
            }
            Ok(())
        }
        AuthorityCmd::Keygen { out, force } => {
            let overwrite = prepare_key_out(&out, force)?;
            let mut seed = [0u8; 32];
            rand::fill(&mut seed);
            let key = SigningKey::from_seed(seed);
            keyfile::write_private(&out, to_hex(&seed).as_bytes(), overwrite)?;
            println!("{}", to_hex(&key.verifying_key().to_bytes()));
            Ok(())
        }
    }
}
