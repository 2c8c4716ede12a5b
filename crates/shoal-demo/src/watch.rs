//! `shoal-demo watch-gone`: polls `/v1/agent/members` on many agents until none lists `node`
//! as up (absent, or `state: down`); prints, per agent, the ms from `--since-ms` to the first
//! poll that no longer lists it as up.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::agent::call;
use crate::now_ms;

/// `watch-gone` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// File with one agent socket path per line.
    #[arg(long)]
    sockets: PathBuf,
    /// Node id that should disappear.
    #[arg(long)]
    node: String,
    /// Reference time (unix ms), e.g. the moment of the kill.
    #[arg(long)]
    since_ms: u64,
    /// Give up after this long.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    /// Poll interval, ms.
    #[arg(long, default_value_t = 50)]
    interval_ms: u64,
}

/// Polls until every agent dropped the node or the timeout; one line per agent: `socket ms`.
pub fn run(a: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.sockets)?;
    let sockets: Vec<PathBuf> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(PathBuf::from)
        .collect();
    let mut done: Vec<Option<u64>> = vec![None; sockets.len()];
    let deadline = Instant::now() + Duration::from_secs(a.timeout_s);
    while done.iter().any(Option::is_none) && Instant::now() < deadline {
        for (i, s) in sockets.iter().enumerate() {
            if done[i].is_some() {
                continue;
            }
            if let Ok((200, v)) = call(s, "GET", "/v1/agent/members", None, Duration::from_secs(2))
            {
                // Gone = not listed, or listed as `down` (the member list keeps down nodes).
                let listed_up = v["members"].as_array().is_some_and(|ms| {
                    ms.iter()
                        .any(|m| m["node"] == a.node.as_str() && m["state"] != "down")
                });
                if !listed_up {
                    done[i] = Some(now_ms().saturating_sub(a.since_ms));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(a.interval_ms));
    }
    for (s, d) in sockets.iter().zip(&done) {
        match d {
            Some(ms) => println!("{} {ms}", s.display()),
            None => println!("{} timeout", s.display()),
        }
    }
    Ok(())
}
