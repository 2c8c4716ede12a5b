//! The load generator: keep-alive HTTP/1.1 over a unix socket, one thread per connection,
//! open loop by the intended-send-time method (wrk2's): request `k` of connection `c` is due
//! at `start + k * interval + c * interval / conns`; it is sent when due (or at once when the
//! previous answer came late), and its latency runs from when it was *due*, so a stall counts
//! for every request it delayed (no coordinated omission).

use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::SERVICES;

/// A keep-alive HTTP/1.1 client over the unix socket; reconnects when the server closes.
pub struct Conn {
    socket: PathBuf,
    w: UnixStream,
    r: BufReader<UnixStream>,
}

impl Conn {
    /// Connects to `socket`.
    pub fn new(socket: &Path) -> Self {
        let s = UnixStream::connect(socket).unwrap();
        Self {
            socket: socket.to_owned(),
            r: BufReader::with_capacity(64 * 1024, s.try_clone().unwrap()),
            w: s,
        }
    }

    /// `GET path`: (status, body). Status 0: the connection failed (then reconnected).
    pub fn get(&mut self, path: &str) -> (u16, Vec<u8>) {
        match self.try_get(path) {
            Some(r) => r,
            None => {
                *self = Self::new(&self.socket.clone());
                (0, Vec::new())
            }
        }
    }

    fn try_get(&mut self, path: &str) -> Option<(u16, Vec<u8>)> {
        write!(self.w, "GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").ok()?;
        let mut line = String::new();
        if self.r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let status = line.split_whitespace().nth(1)?.parse().ok()?;
        let mut len = 0;
        loop {
            line.clear();
            if self.r.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if line == "\r\n" {
                break;
            }
            let (name, value) = line.split_once(':').unwrap_or((&line, ""));
            if name.eq_ignore_ascii_case("content-length") {
                len = value.trim().parse().ok()?;
            }
        }
        let mut body = vec![0; len];
        self.r.read_exact(&mut body).ok()?;
        Some((status, body))
    }
}

/// Services the request mix cycles over: `BENCH_SERVICES` (a caller's working set), default
/// all of them.
fn services_in_mix() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("BENCH_SERVICES")
            .ok()
            .and_then(|n| n.parse().ok())
            .map_or(SERVICES, |n: usize| n.clamp(1, SERVICES))
    })
}

/// The request mix: alternately the endpoints list and a pick, over the services in the mix.
pub fn path(i: usize) -> String {
    let svc = i % services_in_mix();
    if i.is_multiple_of(2) {
        format!("/v1/services/prod/svc-{svc}/http/endpoints")
    } else {
        format!("/v1/services/prod/svc-{svc}/http/pick")
    }
}

/// One open-loop run.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Offered req/s.
    pub offered: u64,
    /// Completed req/s over the run.
    pub achieved: f64,
    /// Requests answered.
    pub completed: u64,
    /// Answers other than 200 (and failed connections).
    pub errors: u64,
    /// Latency percentiles from the intended send time (nearest rank).
    pub p50: Duration,
    /// 99th.
    pub p99: Duration,
    /// 99.9th.
    pub p999: Duration,
    /// Largest.
    pub max: Duration,
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "open loop {} req/s: achieved {:.0} req/s, non-200 {}, p50 {} p99 {} p99.9 {} max {}",
            self.offered,
            self.achieved,
            self.errors,
            ms(self.p50),
            ms(self.p99),
            ms(self.p999),
            ms(self.max)
        )
    }
}

/// `d` in ms with three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// Nearest-rank percentile of sorted samples.
fn pct(sorted: &[Duration], p: f64) -> Duration {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Lowers this thread's timer slack to 1 us (Linux's default 50 us would add up to 50 us of
/// oversleep to every due time, and so to every latency measured from it).
fn tight_timer_slack() {
    let _ = std::fs::write("/proc/thread-self/timerslack_ns", "1000");
}

/// Offers `rate` req/s for `secs` s over `conns` connections; see the module docs.
pub fn open_loop(socket: &Path, rate: u64, secs: u64, conns: usize) -> Run {
    let per_conn = (rate / conns as u64).max(1);
    let interval = Duration::from_nanos(1_000_000_000 / per_conn);
    let total = per_conn * secs;
    let start = Instant::now() + Duration::from_millis(50);
    let handles: Vec<_> = (0..conns)
        .map(|c| {
            let socket = socket.to_owned();
            std::thread::spawn(move || {
                tight_timer_slack();
                let mut conn = Conn::new(&socket);
                let offset = interval * c as u32 / conns as u32;
                let mut lat = Vec::with_capacity(total as usize);
                let mut errors = 0u64;
                for k in 0..total {
                    let due = start + offset + interval * k as u32;
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    let (status, _) = conn.get(&path(c * 7919 + k as usize));
                    if status != 200 {
                        errors += 1;
                    }
                    lat.push(Instant::now() - due);
                }
                (lat, errors)
            })
        })
        .collect();
    let mut lat = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (l, e) = h.join().unwrap();
        lat.extend(l);
        errors += e;
    }
    let elapsed = start.elapsed();
    lat.sort();
    Run {
        offered: rate,
        achieved: lat.len() as f64 / elapsed.as_secs_f64(),
        completed: lat.len() as u64,
        errors,
        p50: pct(&lat, 0.50),
        p99: pct(&lat, 0.99),
        p999: pct(&lat, 0.999),
        max: *lat.last().unwrap(),
    }
}

/// Requests as fast as answers come, for `secs` s over `conns` connections: req/s.
pub fn closed_loop(socket: &Path, conns: usize, secs: u64) -> f64 {
    let stop = Instant::now() + Duration::from_secs(secs);
    let handles: Vec<_> = (0..conns)
        .map(|c| {
            let socket = socket.to_owned();
            std::thread::spawn(move || {
                let mut conn = Conn::new(&socket);
                let mut n = 0usize;
                while Instant::now() < stop {
                    conn.get(&path(c * 7919 + n));
                    n += 1;
                }
                n
            })
        })
        .collect();
    let n: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    n as f64 / secs as f64
}
