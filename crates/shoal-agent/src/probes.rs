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

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
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
        if self.period_ms == 0 || self.timeout_ms == 0 || self.timeout_ms >= self.period_ms {
            return Err(format!(
                "need 0 < timeout_ms ({}) < period_ms ({})",
                self.timeout_ms, self.period_ms
            ));
        }
        if self.success_threshold == 0 || self.failure_threshold == 0 {
            return Err("thresholds must be >= 1".into());
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
        }
        Ok(())
    }
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

/// Runs one probe once.
pub async fn run_once(action: &ProbeAction, default_addr: SocketAddr, timeout: Duration) -> bool {
    let fut = async {
        match action {
            ProbeAction::Tcp { address } => {
                tokio::net::TcpStream::connect(address.unwrap_or(default_addr))
                    .await
                    .is_ok()
            }
            ProbeAction::Http { address, path } => {
                http_get(address.unwrap_or(default_addr), path).await
            }
            ProbeAction::Exec { command } => {
                let mut cmd = tokio::process::Command::new(&command[0]);
                cmd.args(&command[1..])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .kill_on_drop(true);
                matches!(cmd.status().await, Ok(s) if s.success())
            }
        }
    };
    tokio::time::timeout(timeout, fut).await.unwrap_or(false)
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
    sem: &Semaphore,
    jitter: &mut Jitter,
) -> bool {
    tokio::time::sleep(Duration::from_millis(
        spec.period_ms + jitter.upto(spec.jitter_ms),
    ))
    .await;
    let Ok(_permit) = sem.acquire().await else {
        return false;
    };
    let started = std::time::Instant::now();
    let ok = run_once(&spec.action, addr, Duration::from_millis(spec.timeout_ms)).await;
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
    sem: Arc<Semaphore>,
    tx: mpsc::Sender<ProbeSignal>,
) {
    let mut jitter = Jitter::new();
    if let Some(spec) = &set.startup {
        let mut t = Threshold::default();
        loop {
            let ok = probe_tick(spec, ProbeKind::Startup, addr, &sem, &mut jitter).await;
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
                let ok = probe_tick(&spec, ProbeKind::Liveness, addr, &sem, &mut jitter).await;
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
        let ok = probe_tick(&spec, ProbeKind::Readiness, addr, &sem, &mut jitter).await;
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

struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

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

    #[tokio::test]
    async fn tcp_and_exec_probes() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let t = Duration::from_millis(500);
        assert!(run_once(&ProbeAction::Tcp { address: None }, addr, t).await);
        drop(l);
        assert!(!run_once(&ProbeAction::Tcp { address: None }, addr, t).await);
        let ok = ProbeAction::Exec {
            command: vec!["true".into()],
        };
        let bad = ProbeAction::Exec {
            command: vec!["false".into()],
        };
        assert!(run_once(&ok, addr, t).await);
        assert!(!run_once(&bad, addr, t).await);
    }
}
