//! `shoal`: the node agent (`shoal agent`), operator commands against the local agent's unix
//! socket, dev certificates and snapshot inspection. Human tables by default, `--json` for
//! scripts.

/// `println!` for the command's output: when stdout is a pipe whose reader has gone
/// (`shoal snapshot inspect F | head`), the process ends quietly with status 0 instead of
/// panicking (status 101), as a SIGPIPE-killed Unix tool would; any other write error ends it
/// with status 1 and a message on stderr.
macro_rules! outln {
    () => {
        $crate::out_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out_line(format_args!($($arg)*))
    };
}

mod authority;
mod http;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use serde_json::{json, Value};
use shoal_catalog::Verifier;
use shoal_proto::{
    NodeId, Region, ServiceKey, SignatureError, SignedHealth, SignedLifecycle, VerifyingKey,
};

#[derive(Debug, Parser)]
#[command(
    name = "shoal",
    version,
    about = "shoal service discovery: agent and operator tools"
)]
struct Cli {
    /// Local agent socket (default: $SHOAL_SOCKET, else /run/shoal/agent.sock).
    #[arg(long, global = true, env = "SHOAL_SOCKET")]
    socket: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the node agent.
    Agent(AgentArgs),
    /// Members of this agent's region mesh.
    Members,
    /// Supervisor probe of the local agent: exit 0 when `/v1/agent/<live|ready>` answers 200,
    /// 1 otherwise (for Docker `HEALTHCHECK` and Kubernetes exec probes; needs no curl).
    Probe {
        /// `live` (process serving; never fails on an authority outage) or `ready` (serves a
        /// view).
        #[arg(value_parser = ["live", "ready"])]
        what: String,
    },
    /// Services in the local view.
    Services,
    /// Endpoints of `namespace/service/port`.
    Endpoints {
        /// Service key.
        key: String,
        /// Filter by state (READY, DRAINING, ...).
        #[arg(long)]
        state: Option<String>,
        /// Filter by zone.
        #[arg(long)]
        zone: Option<String>,
        /// Label selector `dimension:value` (repeatable).
        #[arg(long)]
        label: Vec<String>,
    },
    /// Follow the endpoints of a service (blocking queries).
    Watch {
        /// Service key.
        key: String,
        /// Seconds per blocking query.
        #[arg(long, default_value_t = 30)]
        wait: u64,
    },
    /// Pick one endpoint (same zone, then same region, weighted).
    Pick {
        /// Service key.
        key: String,
    },
    /// Register an instance on this node (STARTING until `ready` or its probes pass).
    Register {
        /// Service key.
        key: String,
        /// Instance id.
        #[arg(long)]
        instance: String,
        /// `ip:port`.
        #[arg(long)]
        address: SocketAddr,
        /// Version.
        #[arg(long, default_value = "0.0.0")]
        version: String,
        /// Weight.
        #[arg(long, default_value_t = 100)]
        weight: u32,
        /// Zone (default: the agent's).
        #[arg(long)]
        zone: Option<String>,
        /// Label `dimension=value` (repeatable).
        #[arg(long)]
        label: Vec<String>,
        /// Probes as JSON, e.g. `{"readiness": {"action": {"tcp": {}}, "period_ms": 1000, "timeout_ms": 500}}`
        /// (timeout_ms, default 1000, must be below period_ms, default 2000).
        #[arg(long)]
        probes: Option<String>,
    },
    /// Mark a local instance READY.
    Ready(InstanceArgs),
    /// Drain a local instance.
    Drain(InstanceArgs),
    /// Deregister a local instance.
    Deregister(InstanceArgs),
    /// Snapshot files.
    Snapshot {
        #[command(subcommand)]
        cmd: SnapshotCmd,
    },
    /// Development certificates.
    Certs {
        #[command(subcommand)]
        cmd: CertsCmd,
    },
    /// Region authority (built separately).
    Authority {
        #[command(subcommand)]
        cmd: authority::AuthorityCmd,
    },
    /// Global policy: key, signing, delivery to authorities (docs/adr/0013).
    Policy {
        #[command(subcommand)]
        cmd: shoal_authority_server::policy_cli::PolicyCmd,
    },
}

#[derive(Debug, clap::Args)]
struct InstanceArgs {
    /// Service key.
    key: String,
    /// Instance id.
    instance: String,
}

#[derive(Debug, clap::Args)]
struct AgentArgs {
    /// Config file.
    #[arg(long, short)]
    config: PathBuf,
    /// Override node_id.
    #[arg(long)]
    node_id: Option<String>,
    /// Override region.
    #[arg(long)]
    region: Option<String>,
    /// Override zone.
    #[arg(long)]
    zone: Option<String>,
    /// Override data_dir.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Override listen.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Override metrics address.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Override seeds (comma-separated).
    #[arg(long, value_delimiter = ',')]
    seeds: Option<Vec<String>>,
    /// Run the DEVELOPMENT authority in-process (insecure; never in production).
    #[arg(long)]
    dev_authority: bool,
    /// Log filter (RUST_LOG syntax; default: `RUST_LOG`, else `info`). hickory's per-query
    /// lines stay at `warn` unless the filter names `hickory_server` / `hickory_proto`.
    #[arg(long, env = "SHOAL_LOG")]
    log: Option<String>,
}

#[derive(Debug, Subcommand)]
enum SnapshotCmd {
    /// Print what a persisted snapshot holds (checks structure and CRC; signatures are not
    /// checked unless --authority-key is given).
    Inspect {
        /// File.
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum CertsCmd {
    /// Create `<region>-ca.pem` and `<region>-ca-key.pem` (key mode 0600; the output directory
    /// is created 0700 when missing). Refuses to overwrite either file unless `--force`.
    Ca {
        /// Region.
        #[arg(long)]
        region: String,
        /// Output directory.
        #[arg(long, default_value = ".")]
        out: PathBuf,
        /// Replace existing files (atomically). Every node certificate of the old CA stops
        /// being trusted once peers reload the new CA.
        #[arg(long)]
        force: bool,
    },
    /// Create a node certificate signed by the region CA (key mode 0600). Refuses to overwrite
    /// an existing certificate or key unless `--force`; with it, the key then the certificate
    /// are replaced atomically, ready for `kill -HUP` of the agent or authority using them.
    Node {
        /// Node id.
        #[arg(long)]
        node_id: String,
        /// Region.
        #[arg(long)]
        region: String,
        /// Directory holding the CA files (and receiving the node files).
        #[arg(long, default_value = ".")]
        out: PathBuf,
        /// Extra IP SANs.
        #[arg(long)]
        ip: Vec<IpAddr>,
        /// Extra DNS SANs.
        #[arg(long)]
        dns: Vec<String>,
        /// Replace existing files (certificate rotation).
        #[arg(long)]
        force: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    if !runs_a_server(&cli.cmd) {
        shoal_authority_server::cli::init_cli_tracing();
    }
    let rt = runtime(&cli.cmd, worker_threads_env());
    let code = match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

/// True for the long-running commands that install their own log subscriber (`agent` and
/// `authority run`, info level with timestamps).
fn runs_a_server(cmd: &Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Agent(_)
            | Cmd::Authority {
                cmd: authority::AuthorityCmd::Run { .. }
            }
    )
}

/// `TOKIO_WORKER_THREADS` when set to a positive number.
fn worker_threads_env() -> Option<usize> {
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
}

/// The tokio runtime of one invocation.
///
/// `shoal agent` runs on one thread (tokio's current-thread scheduler) unless
/// `TOKIO_WORKER_THREADS` asks for a multi-thread runtime with that many workers; every other
/// subcommand (the authority replica among them) keeps a multi-thread runtime, 2 workers unless
/// `TOKIO_WORKER_THREADS` says otherwise. An idle agent's work is a few dozen small wake-ups a
/// second (SWIM datagrams, QUIC ACKs, timers) that pass from task to task: the endpoint driver,
/// a connection, the reader, the mesh driver and back. On two workers those hops wake the other
/// thread (eventfd writes, futexes, context switches); on one thread they are queue pushes.
/// Issue 19: an idle agent at N=50 spends ~15 % less CPU this way. The price: the local API,
/// DNS and xDS share the thread with the mesh, so a long request delays SWIM by its length;
/// an agent with heavy local traffic can set `TOKIO_WORKER_THREADS=2`.
fn runtime(cmd: &Cmd, workers: Option<usize>) -> tokio::runtime::Runtime {
    let built = match (cmd, workers) {
        (Cmd::Agent(_), None) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        (_, workers) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .worker_threads(workers.unwrap_or(2))
            .build(),
    };
    built.expect("tokio runtime")
}

/// Writes one line of output (see [`outln!`]).
fn out_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("error: writing to stdout: {e}");
            std::process::exit(1);
        }
    }
}

fn socket_path(cli_socket: &Option<PathBuf>) -> PathBuf {
    cli_socket
        .clone()
        .unwrap_or_else(|| PathBuf::from(shoal_agent::config::DEFAULT_SOCKET))
}

fn key_path(key: &str) -> anyhow::Result<String> {
    let k: ServiceKey = key.parse().map_err(|e| {
        anyhow::anyhow!("invalid service key `{key}`: {e} (want namespace/service/port)")
    })?;
    Ok(format!(
        "/v1/services/{}/{}/{}",
        k.namespace, k.service, k.port_name
    ))
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b':' | b',' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let socket = socket_path(&cli.socket);
    let json_out = cli.json;
    match cli.cmd {
        Cmd::Agent(a) => run_agent(a, cli.socket).await,
        Cmd::Authority { cmd } => authority::run(cmd).await.map(|()| 0),
        Cmd::Policy { cmd } => shoal_authority_server::policy_cli::run(cmd)
            .await
            .map(|()| 0),
        Cmd::Certs { cmd } => certs(cmd).map(|()| 0),
        Cmd::Snapshot {
            cmd: SnapshotCmd::Inspect { file },
        } => inspect(&file, json_out).map(|()| 0),
        Cmd::Members => get_and_print(&socket, "/v1/agent/members", json_out, print_members).await,
        Cmd::Probe { what } => probe(&socket, &what, json_out).await,
        Cmd::Services => get_and_print(&socket, "/v1/services", json_out, print_services).await,
        Cmd::Endpoints {
            key,
            state,
            zone,
            label,
        } => {
            let mut q = Vec::new();
            if let Some(s) = state {
                q.push(format!("state={}", enc(&s)));
            }
            if let Some(z) = zone {
                q.push(format!("zone={}", enc(&z)));
            }
            for l in label {
                q.push(format!("label={}", enc(&l)));
            }
            let path = format!("{}/endpoints?{}", key_path(&key)?, q.join("&"));
            get_and_print(&socket, &path, json_out, print_endpoints).await
        }
        Cmd::Pick { key } => {
            let path = format!("{}/pick", key_path(&key)?);
            get_and_print(&socket, &path, json_out, |v| {
                let e = &v["endpoint"];
                outln!(
                    "{} {} ({}, zone {})",
                    e["address"].as_str().unwrap_or("-"),
                    e["instance"].as_str().unwrap_or("-"),
                    e["state"].as_str().unwrap_or("-"),
                    e["zone"].as_str().unwrap_or("-")
                );
            })
            .await
        }
        Cmd::Watch { key, wait } => watch(&socket, &key, wait, json_out).await,
        Cmd::Register {
            key,
            instance,
            address,
            version,
            weight,
            zone,
            label,
            probes,
        } => {
            let mut labels = serde_json::Map::new();
            for l in label {
                let (d, v) = l.split_once('=').context("--label wants dimension=value")?;
                labels.insert(d.to_owned(), json!(v));
            }
            let mut body = json!({"instance": instance, "address": address.to_string(), "version": version, "weight": weight, "labels": labels});
            if let Some(z) = zone {
                body["zone"] = json!(z);
            }
            if let Some(p) = probes {
                body["probes"] = serde_json::from_str(&p).context("--probes is not JSON")?;
            }
            post_and_print(
                &socket,
                &format!("{}/register", key_path(&key)?),
                &body,
                json_out,
            )
            .await
        }
        Cmd::Ready(i) => lifecycle(&socket, &i, "ready", json_out).await,
        Cmd::Drain(i) => lifecycle(&socket, &i, "drain", json_out).await,
        Cmd::Deregister(i) => lifecycle(&socket, &i, "deregister", json_out).await,
    }
}

async fn run_agent(a: AgentArgs, socket: Option<PathBuf>) -> anyhow::Result<i32> {
    let spec = a
        .log
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(shoal_agent::log_filter(&spec)).unwrap_or_else(
                |_| tracing_subscriber::EnvFilter::new(shoal_agent::log_filter("info")),
            ),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: log files and journald get plain text (issue 18).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let overrides = shoal_agent::Overrides {
        node_id: a.node_id,
        region: a.region,
        zone: a.zone,
        data_dir: a.data_dir,
        listen: a.listen,
        socket,
        metrics: a.metrics,
        seeds: a.seeds,
        dev_authority: a.dev_authority,
    }
    .with_env()?;
    let cfg = shoal_agent::load(&a.config, overrides)?;
    shoal_agent::run(cfg).await?;
    Ok(0)
}

/// `shoal probe live|ready`: 0 on 200, 1 on any other answer or no answer (the reason on
/// stderr, the body with `--json`).
async fn probe(socket: &Path, what: &str, json_out: bool) -> anyhow::Result<i32> {
    match http::request(socket, "GET", &format!("/v1/agent/{what}"), None).await {
        Ok((status, v)) => {
            if json_out {
                outln!("{}", serde_json::to_string(&v)?);
            }
            if status == 200 {
                Ok(0)
            } else {
                eprintln!(
                    "{what}: {status} {}",
                    v["reason"].as_str().unwrap_or("not ok")
                );
                Ok(1)
            }
        }
        Err(e) => {
            eprintln!("{what}: no answer from {}: {e:#}", socket.display());
            Ok(1)
        }
    }
}

async fn lifecycle(
    socket: &Path,
    i: &InstanceArgs,
    action: &str,
    json_out: bool,
) -> anyhow::Result<i32> {
    let path = format!(
        "{}/instances/{}/{action}",
        key_path(&i.key)?,
        enc(&i.instance)
    );
    post_and_print(socket, &path, &json!({}), json_out).await
}

async fn post_and_print(
    socket: &Path,
    path: &str,
    body: &Value,
    json_out: bool,
) -> anyhow::Result<i32> {
    let (status, v) = http::request(socket, "POST", path, Some(body)).await?;
    finish(status, &v, json_out, |v| {
        outln!("{}", serde_json::to_string_pretty(v).unwrap_or_default())
    })
}

async fn get_and_print(
    socket: &Path,
    path: &str,
    json_out: bool,
    human: impl Fn(&Value),
) -> anyhow::Result<i32> {
    let (status, v) = http::request(socket, "GET", path, None).await?;
    finish(status, &v, json_out, human)
}

fn finish(status: u16, v: &Value, json_out: bool, human: impl Fn(&Value)) -> anyhow::Result<i32> {
    if json_out {
        outln!("{}", serde_json::to_string_pretty(v)?);
    } else if (200..300).contains(&status) {
        human(v);
        if v["stale"].as_bool() == Some(true) {
            eprintln!(
                "warning: the agent's view is STALE (snapshot age {} ms)",
                v["snapshot_age_ms"]
            );
        }
    } else {
        eprintln!(
            "error ({status}): {}",
            v["error"].as_str().unwrap_or("request failed")
        );
        if let Some(d) = v.get("detail") {
            eprintln!("  {d}");
        }
        if let Some(r) = v.get("reason").and_then(Value::as_str) {
            eprintln!("  reason: {r}");
        }
    }
    Ok(if (200..300).contains(&status) { 0 } else { 1 })
}

fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        outln!("{}", s.join("  ").trim_end());
    };
    line(headers.iter().map(|h| (*h).to_owned()).collect());
    for r in rows {
        line(r);
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn print_members(v: &Value) {
    let rows = v["members"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            vec![
                s(&m["node"]),
                s(&m["address"]),
                s(&m["state"]),
                s(&m["zone"]),
                s(&m["version"]),
                s(&m["boot"]),
                m["last_change_ms_ago"]
                    .as_u64()
                    .map_or_else(|| "-".to_owned(), ago),
            ]
        })
        .collect();
    table(
        &[
            "NODE",
            "ADDRESS",
            "STATE",
            "ZONE",
            "VERSION",
            "BOOT",
            "LAST CHANGE",
        ],
        rows,
    );
}

/// `1234` ms -> `1.2s ago`, `90000` -> `1m30s ago`.
fn ago(ms: u64) -> String {
    match ms {
        0..=59_999 => format!("{}.{}s ago", ms / 1000, ms % 1000 / 100),
        60_000..=3_599_999 => format!("{}m{:02}s ago", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m ago", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

fn print_services(v: &Value) {
    let rows = v["services"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|m| vec![s(&m["service"]), s(&m["endpoints"]), s(&m["routable"])])
        .collect();
    table(&["SERVICE", "ENDPOINTS", "ROUTABLE"], rows);
}

fn print_endpoints(v: &Value) {
    let rows = v["endpoints"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| {
            vec![
                s(&e["instance"]),
                s(&e["address"]),
                s(&e["state"]),
                s(&e["zone"]),
                s(&e["node"]),
                s(&e["generation"]),
                s(&e["revision"]),
                s(&e["routable"]),
            ]
        })
        .collect();
    table(
        &[
            "INSTANCE", "ADDRESS", "STATE", "ZONE", "NODE", "GEN", "REV", "ROUTABLE",
        ],
        rows,
    );
    outln!("index {}  stale {}", s(&v["index"]), s(&v["stale"]));
}

/// What `shoal watch` compares to decide whether to print: the endpoints without the
/// per-agent timing fields (`applied_at_ms` differs after an agent restart although nothing
/// about the endpoint changed).
fn watch_digest(v: &Value) -> Value {
    let mut eps = v["endpoints"].clone();
    if let Some(list) = eps.as_array_mut() {
        for e in list {
            if let Some(o) = e.as_object_mut() {
                o.remove("applied_at_ms");
            }
        }
    }
    eps
}

/// First and largest reconnect backoff of `shoal watch`, ms.
const WATCH_BACKOFF_MS: (u64, u64) = (100, 10_000);

/// Follows a service with blocking queries and prints its endpoints whenever they change
/// (never the same table twice). When the agent goes away (restart, upgrade) it retries with
/// exponential backoff and full jitter, and resumes from the index it had: indexes never go
/// backwards across agent restarts (ADR 0011), so the first answer after a restart comes at
/// once and is printed only if the endpoints differ. Exits on a 4xx answer (bad key, no read
/// access).
async fn watch(socket: &Path, key: &str, wait: u64, json_out: bool) -> anyhow::Result<i32> {
    let base = format!("{}/endpoints", key_path(key)?);
    let mut index = 0u64;
    let mut last: Option<Value> = None;
    let mut backoff_ms = WATCH_BACKOFF_MS.0;
    let mut down_since: Option<std::time::Instant> = None;
    loop {
        let path = format!("{base}?index={index}&wait={wait}s");
        let (status, v) = match http::request(socket, "GET", &path, None).await {
            Ok(r) => r,
            Err(e) => {
                if down_since.is_none() {
                    eprintln!("agent unreachable ({e:#}); retrying with backoff");
                    down_since = Some(std::time::Instant::now());
                }
                let sleep_ms = shoal_agent::keys::Jitter::new().upto(backoff_ms);
                tokio::time::sleep(std::time::Duration::from_millis(sleep_ms)).await;
                backoff_ms = (backoff_ms * 2).min(WATCH_BACKOFF_MS.1);
                continue;
            }
        };
        if let Some(t) = down_since.take() {
            eprintln!(
                "agent back after {:.1} s; resuming",
                t.elapsed().as_secs_f64()
            );
        }
        backoff_ms = WATCH_BACKOFF_MS.0;
        if (400..500).contains(&status) {
            return finish(status, &v, json_out, |_| {});
        }
        if status != 200 {
            // 5xx (e.g. shutting down): retry like an unreachable agent.
            eprintln!("agent answered {status}; retrying");
            let sleep_ms = shoal_agent::keys::Jitter::new().upto(backoff_ms);
            tokio::time::sleep(std::time::Duration::from_millis(sleep_ms)).await;
            continue;
        }
        // An index that went backwards (an agent older than ADR 0011) restarts the watch.
        index = v["index"].as_u64().unwrap_or(0);
        let digest = watch_digest(&v);
        if last.as_ref() == Some(&digest) {
            continue;
        }
        if json_out {
            outln!("{}", serde_json::to_string(&v)?);
        } else {
            print_endpoints(&v);
            outln!();
        }
        use std::io::Write as _;
        std::io::stdout().flush()?;
        last = Some(digest);
    }
}

fn certs(cmd: CertsCmd) -> anyhow::Result<()> {
    use shoal_transport::{certs, keyfile};
    match cmd {
        CertsCmd::Ca { region, out, force } => {
            let region: Region = region.parse().map_err(|e| anyhow::anyhow!("region: {e}"))?;
            let f = certs::create_ca_with(&region, &out, overwrite(force))?;
            outln!("{}\n{}", f.cert.display(), f.key.display());
        }
        CertsCmd::Node {
            node_id,
            region,
            out,
            ip,
            dns,
            force,
        } => {
            let region: Region = region.parse().map_err(|e| anyhow::anyhow!("region: {e}"))?;
            let node: NodeId = node_id
                .parse()
                .map_err(|e| anyhow::anyhow!("node id: {e}"))?;
            // As the outputs are checked: `--out new/..` names the CA next to `new`, which the
            // kernel cannot resolve while `new` is missing.
            let ca = certs::CaFiles {
                cert: keyfile::path_once_created(&out.join(format!("{region}-ca.pem"))),
                key: keyfile::path_once_created(&out.join(format!("{region}-ca-key.pem"))),
            };
            let f = certs::create_node_cert_with(
                &ca,
                &node,
                &region,
                &certs::ExtraSans { ips: ip, dns },
                &out,
                overwrite(force),
            )?;
            outln!("{}\n{}", f.cert.display(), f.key.display());
        }
    }
    Ok(())
}

fn overwrite(force: bool) -> shoal_transport::certs::Overwrite {
    if force {
        shoal_transport::certs::Overwrite::Replace
    } else {
        shoal_transport::certs::Overwrite::Refuse
    }
}

/// Accepts every signature: `snapshot inspect` shows structure, not trust.
struct NoVerify;

impl shoal_catalog::RecordCache for NoVerify {}

impl Verifier for NoVerify {
    fn verify_lifecycle(&self, _: &SignedLifecycle) -> Result<(), SignatureError> {
        Ok(())
    }
    fn verify_health(&self, _: &SignedHealth, _: &VerifyingKey) -> Result<(), SignatureError> {
        Ok(())
    }
}

/// Largest file `snapshot inspect` reads: the largest snapshot the decoder accepts (its header
/// plus [`shoal_catalog::snapshot::MAX_SNAPSHOT_BODY_BYTES`], 512 MiB); anything larger could
/// not be loaded by an agent either.
const MAX_INSPECT_BYTES: u64 = shoal_catalog::snapshot::SNAPSHOT_HEADER_BYTES as u64
    + shoal_catalog::snapshot::MAX_SNAPSHOT_BODY_BYTES;

fn inspect(file: &Path, json_out: bool) -> anyhow::Result<()> {
    let bytes = shoal_transport::keyfile::read_bounded(file, MAX_INSPECT_BYTES)
        .with_context(|| format!("read {}", file.display()))?;
    let snap = match shoal_catalog::snapshot::decode(&bytes, &NoVerify) {
        Ok(s) => s,
        Err(e) => bail!("{}: refused: {e}", file.display()),
    };
    let mut per_service = std::collections::BTreeMap::<String, (usize, usize)>::new();
    for r in &snap.lifecycle {
        let e = per_service.entry(r.record.key.to_string()).or_default();
        e.0 += 1;
        if r.record.state == shoal_proto::LifecycleState::Ready {
            e.1 += 1;
        }
    }
    let v = json!({
        "file": file.display().to_string(),
        "bytes": bytes.len(),
        "scope": format!("{:?}", snap.scope),
        "region": snap.region.as_str(),
        "revision": snap.revision.0,
        "lifecycle_records": snap.lifecycle.len(),
        "health_records": snap.health.len(),
        "regions": snap.regions.iter().map(|h| json!({"region": h.region.as_str(), "contiguous": h.contiguous.0, "gc_floor": h.gc_floor.0})).collect::<Vec<_>>(),
        "services": per_service.iter().map(|(k, (n, r))| json!({"service": k, "records": n, "ready": r})).collect::<Vec<_>>(),
        "signatures_checked": false,
    });
    if json_out {
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        outln!("{}: {} bytes, region {}, revision {}, {} lifecycle + {} health records (signatures not checked)",
            file.display(), bytes.len(), snap.region, snap.revision.0, snap.lifecycle.len(), snap.health.len());
        table(
            &["SERVICE", "RECORDS", "READY"],
            per_service
                .iter()
                .map(|(k, (n, r))| vec![k.clone(), n.to_string(), r.to_string()])
                .collect(),
        );
    }
    Ok(())
}
