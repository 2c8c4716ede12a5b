//! `shoal-demo`: a demo backend that registers through its local agent, a load generator that
//! routes every request through the agent's `pick`, and the scenario report.
//!
//! Everything is std threads and blocking sockets (the agent API is HTTP/1.1 over a unix
//! socket, one request per connection); tokio is used only to wait for SIGTERM/SIGINT.

mod agent;
mod applied;
mod backend;
mod client;
mod plot;
mod report;
mod watch;

use clap::{Parser, Subcommand};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "shoal-demo",
    about = "Demo backend, load generator and scenario report"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Serve HTTP, register through the local agent, drain + deregister on SIGTERM.
    Backend(backend::Args),
    /// Send requests routed by the agent's `pick`; write a JSON-lines timeline.
    Client(client::Args),
    /// Build the scenario report (JSON + markdown + timeline SVG) from a run directory.
    Report(report::Args),
    /// Follow every agent's view with blocking queries; log when each applied each record.
    WatchApplied(applied::Args),
    /// Poll many agents' member lists until a node is gone from all (benchmarks).
    WatchGone(watch::Args),
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Backend(a) => backend::run(a),
        Cmd::Client(a) => client::run(a),
        Cmd::Report(a) => report::run(a),
        Cmd::WatchApplied(a) => applied::run(a),
        Cmd::WatchGone(a) => watch::run(a),
    };
    if let Err(e) = res {
        eprintln!("shoal-demo: {e:#}");
        std::process::exit(1);
    }
}

/// Unix wall-clock milliseconds (what the authority's `committed_at_ms` uses).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Spawns a thread that sends one message on the returned channel at SIGTERM or SIGINT.
pub fn termination_signal() -> std::sync::mpsc::Receiver<&'static str> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("signal runtime: {e}");
                return;
            }
        };
        rt.block_on(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                eprintln!("cannot install signal handlers");
                return;
            };
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            let _ = tx.send(name);
        });
    });
    rx
}
