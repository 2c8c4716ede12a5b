//! Health probes of the instances on this node: startup, readiness and liveness, each HTTP GET
//! (2xx), TCP connect, or exec (exit 0), with its own period, timeout (< period), jitter and
//! success / failure thresholds (Kubernetes' semantics).
//!
//! * **startup** gates the other two: until it has passed, readiness and liveness do not run;
//! * **readiness** failing `failure_threshold` times in a row makes the agent sign a Failing
//!   health record (the endpoint stops being routable everywhere); `success_threshold` passes
//!   after that sign Passing again. While the instance is STARTING, the first readiness pass
//!   (after startup) makes the agent ask the authority for READY;
//! * **liveness** failures are reported (metric + log) and nothing else: shoal never restarts
//!   anything, so a flapping dependency cannot cause a restart storm.
//!
//! Capacity protection: every probe execution takes a permit of one node-wide semaphore
//! (`[probes] max_concurrent`), and every period is jittered so probes never run in lockstep.
//!
//! Probes cannot escalate (trust rule T3, docs/invariants.md: the agent never runs
//! caller-supplied commands with its own privileges):
//! * HTTP and TCP probes may only target the instance's own registered address
//!   ([`ProbeSet::check_targets`]), so a registrant cannot make the agent connect elsewhere;
//! * `exec` probes are refused unless `[probes] allow_exec = true`; when allowed they run as
//!   the registering uid/gid ([`ExecAs`]; the agent refuses other uids when it is not root),
//!   in `/`, with an empty environment except `PATH`, in their own process group that is
//!   killed (SIGKILL) on timeout, stdout/stderr read up to [`MAX_PROBE_OUTPUT`] bytes each.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, Semaphore};

use crate::keys::Jitter;

/// How to check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ProbeAction {
    /// HTTP/1.1 GET `http://{address}{path}`; 2xx passes.
    Http {
        /// Target `ip:port` (default: the instance's address).
        #[serde(default)]
        address: Option<SocketAddr>,
        /// Path, e.g. `/healthz`.
        path: String,
    },
    /// TCP connect succeeds.
    Tcp {
        /// Target `ip:port` (default: the instance's address).
        #[serde(default)]
        address: Option<SocketAddr>,
    },
    /// Run a command; exit status 0 passes. No shell is involved.
    Exec {
        /// Program and arguments.
        command: Vec<String>,
    },
}

/// One probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSpec {
    /// What to check.
    pub action: ProbeAction,
    /// Period between probes, ms.
    #[serde(default = "default_period_ms")]
    pub period_ms: u64,
    /// Timeout of one probe, ms; must be below the period.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Each period is lengthened by a uniform random `0..=jitter_ms`.
    #[serde(default = "default_jitter_ms")]
    pub jitter_ms: u64,
    /// Consecutive passes to count as passing.
    #[serde(default = "one")]
    pub success_threshold: u32,
    /// Consecutive failures to count as failing.
    #[serde(default = "three")]
    pub failure_threshold: u32,
}

fn default_period_ms() -> u64 {
    2_000
}
fn default_timeout_ms() -> u64 {
    1_000
}
fn default_jitter_ms() -> u64 {
    200
}
fn one() -> u32 {
    1
}
fn three() -> u32 {
    3
}

impl ProbeSpec {
    /// Checks timing and thresholds.
    ///
    /// # Errors
    /// A message naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if !(MIN_PROBE_PERIOD_MS..=MAX_PROBE_PERIOD_MS).contains(&self.period_ms) {
            return Err(format!(
                "period_ms ({}) must be in {MIN_PROBE_PERIOD_MS}..={MAX_PROBE_PERIOD_MS}",
                self.period_ms
            ));
        }
        if self.timeout_ms < MIN_PROBE_TIMEOUT_MS || self.timeout_ms >= self.period_ms {
            return Err(format!(
                "need {MIN_PROBE_TIMEOUT_MS} <= timeout_ms ({}) < period_ms ({})",
                self.timeout_ms, self.period_ms
            ));
        }
        if self.jitter_ms > self.period_ms {
            return Err(format!(
                "jitter_ms ({}) must be at most period_ms ({})",
                self.jitter_ms, self.period_ms
            ));
        }
        let thresholds = 1..=MAX_PROBE_THRESHOLD;
        if !thresholds.contains(&self.success_threshold)
            || !thresholds.contains(&self.failure_threshold)
        {
            return Err(format!("thresholds must be in 1..={MAX_PROBE_THRESHOLD}"));
        }
        if let ProbeAction::Exec { command } = &self.action {
            if command.is_empty() {
                return Err("exec probe needs a command".into());
            }
        }
        if let ProbeAction::Http { path, .. } = &self.action {
            if !path.starts_with('/') {
                return Err("http probe path must start with /".into());
            }
            // The path goes into the request line as is: no spaces or control characters
            // (CR/LF would split the request), and a bounded length.
            if path.len() > 1024 || path.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(
                    "http probe path must be at most 1024 bytes without spaces or control characters"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

/// Shortest probe period, ms. Kubernetes' floor is 1 s and Consul raises shorter check
/// intervals to 1 s; 100 ms keeps sub-second readiness for local apps while bounding what one
/// caller's probes cost (QA: 20 instances at a 2 ms period made ~4,000 probes a second).
pub const MIN_PROBE_PERIOD_MS: u64 = 100;
/// Longest probe period, ms (1 h). Periods near `u64::MAX` overflowed the next deadline.
pub const MAX_PROBE_PERIOD_MS: u64 = 3_600_000;
/// Shortest probe timeout, ms.
pub const MIN_PROBE_TIMEOUT_MS: u64 = 10;
/// Largest success / failure threshold.
pub const MAX_PROBE_THRESHOLD: u32 = 1_000;

/// Bytes of an exec probe's stdout (and of its stderr) kept for the log; the rest is discarded.
pub const MAX_PROBE_OUTPUT: usize = 4 * 1024;
/// The only environment variable an exec probe gets.
pub const EXEC_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Who an exec probe runs as: the registrant's credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecAs {
    /// Uid.
    pub uid: u32,
    /// Gid.
    pub gid: u32,
}

/// The probes of one instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSet {
    /// Startup probe.
    #[serde(default)]
    pub startup: Option<ProbeSpec>,
    /// Readiness probe.
    #[serde(default)]
    pub readiness: Option<ProbeSpec>,
    /// Liveness probe.
    #[serde(default)]
    pub liveness: Option<ProbeSpec>,
}

impl ProbeSet {
    /// Validates each probe.
    ///
    /// # Errors
    /// A message naming the probe and field.
    pub fn validate(&self) -> Result<(), String> {
        for (name, p) in [
            ("startup", &self.startup),
            ("readiness", &self.readiness),
            ("liveness", &self.liveness),
        ] {
            if let Some(p) = p {
                p.validate().map_err(|e| format!("{name}: {e}"))?;
            }
        }
        Ok(())
    }

    /// Checks that HTTP and TCP probes target the instance's own address `addr` (IPv4-mapped
    /// IPv6 spellings of one address are the same address).
    ///
    /// # Errors
    /// A message naming the probe and the address it wanted.
    pub fn check_targets(&self, addr: SocketAddr) -> Result<(), String> {
        for (name, p) in self.iter() {
            let target = match &p.action {
                ProbeAction::Http { address, .. } | ProbeAction::Tcp { address } => *address,
                ProbeAction::Exec { .. } => None,
            };
            if let Some(t) = target {
                // One socket, whichever way it is written (`[::ffff:a.b.c.d]:p` is `a.b.c.d:p`).
                if crate::api::canonical_endpoint_address(t)
                    != crate::api::canonical_endpoint_address(addr)
                {
                    return Err(format!(
                        "{name} probe targets {t}, but probes may only target the instance's own address {addr}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// True when any probe is `exec`.
    pub fn has_exec(&self) -> bool {
        self.iter()
            .any(|(_, p)| matches!(p.action, ProbeAction::Exec { .. }))
    }

    fn iter(&self) -> impl Iterator<Item = (&'static str, &ProbeSpec)> {
        [
            ("startup", &self.startup),
            ("readiness", &self.readiness),
            ("liveness", &self.liveness),
        ]
        .into_iter()
        .filter_map(|(n, p)| p.as_ref().map(|p| (n, p)))
    }

    /// True when no probe is configured.
    pub fn is_empty(&self) -> bool {
        self.startup.is_none() && self.readiness.is_none() && self.liveness.is_none()
    }
}

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// Startup.
    Startup,
    /// Readiness.
    Readiness,
    /// Liveness.
    Liveness,
}

impl ProbeKind {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Startup => "startup",
            Self::Readiness => "readiness",
            Self::Liveness => "liveness",
        }
    }
}

/// What the probe loop tells the agent: only threshold crossings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeSignal {
    /// Startup passed (and readiness passed after it, if configured): ask for READY.
    Started,
    /// Readiness crossed the failure threshold.
    ReadinessFailing,
    /// Readiness recovered after failing.
    ReadinessPassing,
    /// Liveness crossed the failure threshold (reported only).
    LivenessFailing,
    /// Liveness recovered.
    LivenessPassing,
}

/// Runs one probe once. `exec_as`: the credentials an exec probe runs with (`None`: the
/// agent's own, for instances declared in the agent's config file).
pub async fn run_once(
    action: &ProbeAction,
    default_addr: SocketAddr,
    exec_as: Option<ExecAs>,
    timeout: Duration,
) -> bool {
    match action {
        ProbeAction::Exec { command } => run_exec(command, exec_as, timeout).await,
        ProbeAction::Tcp { address } => tokio::time::timeout(
            timeout,
            tokio::net::TcpStream::connect(address.unwrap_or(default_addr)),
        )
        .await
        .is_ok_and(|r| r.is_ok()),
        ProbeAction::Http { address, path } => {
            tokio::time::timeout(timeout, http_get(address.unwrap_or(default_addr), path))
                .await
                .unwrap_or(false)
        }
    }
}

/// Reads up to [`MAX_PROBE_OUTPUT`] bytes, then discards the rest until EOF (so the child
/// never blocks on a full pipe).
async fn bounded_read<R: tokio::io::AsyncRead + Unpin>(r: Option<R>) -> Vec<u8> {
    let Some(mut r) = r else { return Vec::new() };
    let mut kept = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = MAX_PROBE_OUTPUT.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

async fn run_exec(command: &[String], exec_as: Option<ExecAs>, timeout: Duration) -> bool {
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env_clear()
        .env("PATH", EXEC_PATH)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(a) = exec_as {
        // std drops supplementary groups (setgroups(0)) when the parent is root.
        cmd.uid(a.uid).gid(a.gid);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            metrics::counter!("shoal_probe_exec_total", "result" => "spawn_error").increment(1);
            tracing::debug!(error = %e, command = ?command, "exec probe did not start");
            return false;
        }
    };
    let pid = child.id();
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let run = async {
        let (o, e) = tokio::join!(bounded_read(out), bounded_read(err));
        (child.wait().await, o, e)
    };
    match tokio::time::timeout(timeout, run).await {
        Ok((Ok(status), stdout, stderr)) => {
            if !status.success() {
                tracing::debug!(command = ?command, %status,
                    stdout = %String::from_utf8_lossy(&stdout),
                    stderr = %String::from_utf8_lossy(&stderr), "exec probe failed");
            }
            status.success()
        }
        Ok((Err(_), _, _)) => false,
        Err(_) => {
            // The whole process group: a shell's children die with it.
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            metrics::counter!("shoal_probe_exec_total", "result" => "timeout_killed").increment(1);
            false
        }
    }
}

async fn http_get(addr: SocketAddr, path: &str) -> bool {
    let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let Ok((mut sender, conn)) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream)).await
    else {
        return false;
    };
    let conn = tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, addr.to_string())
        .header("user-agent", "shoal-probe")
        .body(Empty::new());
    let ok = match req {
        Ok(req) => matches!(sender.send_request(req).await, Ok(r) if r.status().is_success()),
        Err(_) => false,
    };
    conn.abort();
    ok
}

/// Consecutive-result counter with hysteresis.
#[derive(Debug, Clone, Default)]
pub struct Threshold {
    passes: u32,
    fails: u32,
    /// `Some(true)` passing, `Some(false)` failing, `None` not decided yet.
    pub state: Option<bool>,
}

impl Threshold {
    /// Records one result; returns the new state when it changed.
    pub fn record(
        &mut self,
        ok: bool,
        success_threshold: u32,
        failure_threshold: u32,
    ) -> Option<bool> {
        if ok {
            self.passes = self.passes.saturating_add(1);
            self.fails = 0;
            if self.passes >= success_threshold && self.state != Some(true) {
                self.state = Some(true);
                return Some(true);
            }
        } else {
            self.fails = self.fails.saturating_add(1);
            self.passes = 0;
            if self.fails >= failure_threshold && self.state != Some(false) {
                self.state = Some(false);
                return Some(false);
            }
        }
        None
    }
}

async fn probe_tick(
    spec: &ProbeSpec,
    kind: ProbeKind,
    addr: SocketAddr,
    exec_as: Option<ExecAs>,
    sem: &Semaphore,
    jitter: &mut Jitter,
) -> bool {
    tokio::time::sleep(Duration::from_millis(
        spec.period_ms.saturating_add(jitter.upto(spec.jitter_ms)),
    ))
    .await;
    let Ok(_permit) = sem.acquire().await else {
        return false;
    };
    let started = std::time::Instant::now();
    let ok = run_once(
        &spec.action,
        addr,
        exec_as,
        Duration::from_millis(spec.timeout_ms),
    )
    .await;
    metrics::histogram!("shoal_probe_duration_seconds", "kind" => kind.as_str())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!("shoal_probes_total", "kind" => kind.as_str(), "result" => if ok { "pass" } else { "fail" })
        .increment(1);
    ok
}

/// Runs the probes of one instance until the task is aborted, sending threshold crossings.
pub async fn run_instance(
    set: ProbeSet,
    addr: SocketAddr,
    exec_as: Option<ExecAs>,
    sem: Arc<Semaphore>,
    tx: mpsc::Sender<ProbeSignal>,
) {
    let mut jitter = Jitter::new();
    if let Some(spec) = &set.startup {
        let mut t = Threshold::default();
        loop {
            let ok = probe_tick(spec, ProbeKind::Startup, addr, exec_as, &sem, &mut jitter).await;
            match t.record(ok, spec.success_threshold, spec.failure_threshold) {
                Some(true) => break,
                Some(false) => {
                    tracing::warn!(%addr, "startup probe failing; still waiting");
                    t = Threshold::default();
                }
                None => {}
            }
        }
    }
    if set.readiness.is_none() {
        let _ = tx.send(ProbeSignal::Started).await;
    }
    let liveness = set.liveness.clone().map(|spec| {
        let sem = sem.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut jitter = Jitter::new();
            let mut t = Threshold::default();
            loop {
                let ok =
                    probe_tick(&spec, ProbeKind::Liveness, addr, exec_as, &sem, &mut jitter).await;
                match t.record(ok, spec.success_threshold, spec.failure_threshold) {
                    Some(false) => {
                        let _ = tx.send(ProbeSignal::LivenessFailing).await;
                    }
                    Some(true) => {
                        let _ = tx.send(ProbeSignal::LivenessPassing).await;
                    }
                    None => {}
                }
            }
        })
    });
    let _guard = AbortOnDrop(liveness);
    let Some(spec) = set.readiness else {
        std::future::pending::<()>().await;
        return;
    };
    let mut t = Threshold::default();
    let mut started = false;
    loop {
        let ok = probe_tick(
            &spec,
            ProbeKind::Readiness,
            addr,
            exec_as,
            &sem,
            &mut jitter,
        )
        .await;
        match t.record(ok, spec.success_threshold, spec.failure_threshold) {
            Some(true) if !started => {
                started = true;
                let _ = tx.send(ProbeSignal::Started).await;
                let _ = tx.send(ProbeSignal::ReadinessPassing).await;
            }
            Some(true) => {
                let _ = tx.send(ProbeSignal::ReadinessPassing).await;
            }
            Some(false) => {
                let _ = tx.send(ProbeSignal::ReadinessFailing).await;
            }
            None => {}
        }
    }
}

/// Starts [`run_instance`] as its own task and returns a guard that aborts it (and with it the
/// liveness task it owns) when dropped. The caller keeps the guard inside the task that stands
/// for the instance's probes, so aborting that task stops the probes: a detached probe task would
/// keep running commands as the registrant, or keep dialling its target, after a deregister.
pub fn spawn_instance(
    set: ProbeSet,
    addr: SocketAddr,
    exec_as: Option<ExecAs>,
    sem: Arc<Semaphore>,
    tx: mpsc::Sender<ProbeSignal>,
) -> AbortOnDrop {
    AbortOnDrop(Some(tokio::spawn(run_instance(
        set, addr, exec_as, sem, tx,
    ))))
}

/// Aborts the task it holds when dropped.
#[must_use = "dropping the guard aborts the task at once"]
pub struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(h) = &self.0 {
            h.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_has_hysteresis() {
        let mut t = Threshold::default();
        assert_eq!(t.record(true, 2, 3), None);
        assert_eq!(t.record(true, 2, 3), Some(true));
        assert_eq!(t.record(false, 2, 3), None);
        assert_eq!(t.record(false, 2, 3), None);
        assert_eq!(t.record(true, 2, 3), None);
        assert_eq!(t.record(false, 2, 3), None);
        assert_eq!(t.record(false, 2, 3), None);
        assert_eq!(t.record(false, 2, 3), Some(false));
        assert_eq!(t.record(false, 2, 3), None);
    }

    #[test]
    fn http_probe_paths_cannot_split_the_request_line() {
        for bad in ["/x HTTP/1.1\r\nX-Injected: 1", "/a b", "/\u{0}", "/tab\t"] {
            let p = spec(ProbeAction::Http {
                address: None,
                path: bad.into(),
            })
            .unwrap();
            assert!(p.validate().is_err(), "{bad:?} accepted");
        }
        let ok = spec(ProbeAction::Http {
            address: None,
            path: "/ready?x=1".into(),
        })
        .unwrap();
        ok.validate().unwrap();
    }

    #[test]
    fn probe_timings_are_bounded() {
        let base = spec(ProbeAction::Tcp { address: None }).unwrap();
        base.validate().unwrap();
        type Change = fn(&mut ProbeSpec);
        let bad: [(&str, Change); 7] = [
            ("period 2 ms", |p| (p.period_ms, p.timeout_ms) = (2, 1)),
            ("period u64::MAX", |p| p.period_ms = u64::MAX),
            ("period over 1 h", |p| p.period_ms = MAX_PROBE_PERIOD_MS + 1),
            ("timeout 1 ms", |p| p.timeout_ms = 1),
            ("jitter u64::MAX", |p| p.jitter_ms = u64::MAX),
            ("jitter above period", |p| p.jitter_ms = p.period_ms + 1),
            ("threshold huge", |p| p.failure_threshold = u32::MAX),
        ];
        for (what, change) in bad {
            let mut p = base.clone();
            change(&mut p);
            assert!(p.validate().is_err(), "{what} accepted");
        }
        let mut floor = base;
        (floor.period_ms, floor.timeout_ms) = (MIN_PROBE_PERIOD_MS, MIN_PROBE_TIMEOUT_MS);
        floor.validate().unwrap();
    }

    #[test]
    fn probe_targets_match_whatever_the_spelling() {
        let own: SocketAddr = "127.0.0.50:8080".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.50]:8080".parse().unwrap();
        let set = |address| ProbeSet {
            readiness: spec(ProbeAction::Tcp {
                address: Some(address),
            }),
            ..ProbeSet::default()
        };
        assert_eq!(set(mapped).check_targets(own), Ok(()));
        assert_eq!(set(own).check_targets(mapped), Ok(()));
        assert!(set("127.0.0.51:8080".parse().unwrap())
            .check_targets(own)
            .is_err());
    }

    #[test]
    fn timeout_must_be_below_period() {
        let p = ProbeSpec {
            action: ProbeAction::Tcp { address: None },
            period_ms: 1000,
            timeout_ms: 1000,
            jitter_ms: 0,
            success_threshold: 1,
            failure_threshold: 1,
        };
        assert!(p.validate().is_err());
    }

    /// Regression: deregistering aborted only the outer task and left the probe loop running
    /// (an exec probe kept running as the registrant every period). Aborting the task that
    /// holds the guard must end the probe tasks: their senders drop, so `recv` ends.
    #[tokio::test]
    async fn aborting_the_holder_stops_every_probe_task() {
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let tcp = || {
            let mut s = spec(ProbeAction::Tcp { address: None });
            if let Some(s) = s.as_mut() {
                s.period_ms = 50;
                s.timeout_ms = 20;
            }
            s
        };
        let set = ProbeSet {
            startup: None,
            readiness: tcp(),
            liveness: tcp(),
        };
        let (tx, mut rx) = mpsc::channel(16);
        let sem = Arc::new(Semaphore::new(4));
        let holder = tokio::spawn(async move {
            let _probes = spawn_instance(set, addr, None, sem, tx);
            std::future::pending::<()>().await;
        });
        // The probes run: a failing signal arrives.
        let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a probe signal");
        assert!(first.is_some());
        holder.abort();
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while rx.recv().await.is_some() {}
        })
        .await;
        assert!(
            ended.is_ok(),
            "probe tasks still hold their senders after the abort"
        );
    }

    #[tokio::test]
    async fn tcp_and_exec_probes() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let t = Duration::from_millis(500);
        assert!(run_once(&ProbeAction::Tcp { address: None }, addr, None, t).await);
        drop(l);
        assert!(!run_once(&ProbeAction::Tcp { address: None }, addr, None, t).await);
        let ok = ProbeAction::Exec {
            command: vec!["true".into()],
        };
        let bad = ProbeAction::Exec {
            command: vec!["false".into()],
        };
        assert!(run_once(&ok, addr, None, t).await);
        assert!(!run_once(&bad, addr, None, t).await);
    }

    fn spec(action: ProbeAction) -> Option<ProbeSpec> {
        Some(ProbeSpec {
            action,
            period_ms: 1000,
            timeout_ms: 500,
            jitter_ms: 0,
            success_threshold: 1,
            failure_threshold: 1,
        })
    }

    #[test]
    fn probes_may_only_target_the_instance_address() {
        let own: SocketAddr = "10.0.0.7:8080".parse().unwrap();
        let http = |a: Option<&str>| ProbeAction::Http {
            address: a.map(|a| a.parse().unwrap()),
            path: "/ready".into(),
        };
        let tcp = |a: &str| ProbeAction::Tcp {
            address: Some(a.parse().unwrap()),
        };
        let ok = ProbeSet {
            startup: spec(http(None)),
            readiness: spec(http(Some("10.0.0.7:8080"))),
            liveness: spec(tcp("10.0.0.7:8080")),
        };
        assert_eq!(ok.check_targets(own), Ok(()));
        for (set, what) in [
            (
                ProbeSet {
                    readiness: spec(http(Some("169.254.169.254:80"))),
                    ..Default::default()
                },
                "readiness probe targets 169.254.169.254:80",
            ),
            (
                ProbeSet {
                    liveness: spec(tcp("10.0.0.7:22")),
                    ..Default::default()
                },
                "liveness probe targets 10.0.0.7:22",
            ),
            (
                ProbeSet {
                    startup: spec(tcp("127.0.0.1:8080")),
                    ..Default::default()
                },
                "startup probe targets 127.0.0.1:8080",
            ),
        ] {
            let e = set.check_targets(own).unwrap_err();
            assert!(e.contains(what), "{e}");
            assert!(e.contains("own address 10.0.0.7:8080"), "{e}");
        }
        let exec = ProbeSet {
            readiness: spec(ProbeAction::Exec {
                command: vec!["true".into()],
            }),
            ..Default::default()
        };
        assert!(exec.has_exec() && !ok.has_exec());
        assert_eq!(exec.check_targets(own), Ok(()));
    }

    /// The exec probe runs with the registrant's uid/gid, not the agent's. Needs root and the
    /// CI user `shoal-test-a`; prints SKIP otherwise (fails with SHOAL_REQUIRE_UNIX_USERS=1).
    #[tokio::test]
    async fn exec_probe_runs_as_the_registrant() {
        use std::os::unix::fs::MetadataExt;
        let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        let user = nix::unistd::User::from_name("shoal-test-a").ok().flatten();
        let (true, Some(user)) = (root, user) else {
            assert_ne!(
                std::env::var("SHOAL_REQUIRE_UNIX_USERS").as_deref(),
                Ok("1"),
                "exec_probe_runs_as_the_registrant needs root and user shoal-test-a"
            );
            println!("SKIP exec_probe_runs_as_the_registrant: needs root and user shoal-test-a");
            return;
        };
        let (uid, gid) = (user.uid.as_raw(), user.gid.as_raw());
        let t = Duration::from_millis(2_000);
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let check = |u: u32, g: u32| ProbeAction::Exec {
            command: vec![
                "sh".into(),
                "-c".into(),
                format!(
                    "test \"$(id -u)\" = {u} && test \"$(id -g)\" = {g} && test \"$(id -G)\" = {g}"
                ),
            ],
        };
        let as_a = Some(ExecAs { uid, gid });
        assert!(run_once(&check(uid, gid), addr, as_a, t).await);
        assert!(!run_once(&check(0, 0), addr, as_a, t).await);
        // Without `exec_as` (the agent's own config) it runs as the agent: root here.
        assert!(run_once(&check(0, 0), addr, None, t).await);
    }

    #[tokio::test]
    async fn exec_probe_gets_a_minimal_environment_and_its_group_is_killed_on_timeout() {
        let t = Duration::from_millis(2_000);
        // Only PATH is set: HOME (set for any test runner) is not.
        let env = ProbeAction::Exec {
            command: vec![
                "sh".into(),
                "-c".into(),
                "test -z \"$HOME\" && test -n \"$PATH\" && test \"$(pwd)\" = /".into(),
            ],
        };
        assert!(run_once(&env, "127.0.0.1:1".parse().unwrap(), None, t).await);
        // A probe that outlives its timeout, with a child of its own: both are killed.
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("grandchild.pid");
        let hang = ProbeAction::Exec {
            command: vec![
                "sh".into(),
                "-c".into(),
                format!("sleep 30 & echo $! > {}; wait", marker.display()),
            ],
        };
        let started = std::time::Instant::now();
        let ok = run_once(
            &hang,
            "127.0.0.1:1".parse().unwrap(),
            None,
            Duration::from_millis(300),
        )
        .await;
        assert!(!ok);
        assert!(started.elapsed() < Duration::from_secs(5));
        let pid: i32 = std::fs::read_to_string(&marker)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The grandchild (same process group) is gone once SIGKILL is delivered: bounded wait.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Gone, or a zombie waiting for its (killed) parent's reaper.
            if stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "grandchild {pid} still alive: {stat}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Output beyond the bound is discarded, and the probe still finishes.
        let loud = ProbeAction::Exec {
            command: vec!["sh".into(), "-c".into(), "head -c 1000000 /dev/zero".into()],
        };
        assert!(run_once(&loud, "127.0.0.1:1".parse().unwrap(), None, t).await);
    }
}
