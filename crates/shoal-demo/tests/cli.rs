//! The `shoal-demo` binary as the local scenario (`deploy/local/scenario.sh`) and the compose
//! fault test start it: its command line, and a backend that cannot reach its agent.
//!
//! Being an integration test also makes `cargo test --workspace` build the binary in the same
//! invocation as every other test binary, so `.ci/run` needs no second `cargo build` (which
//! selects other features and rebuilt tokio, quinn and axum: several minutes on 2 cores).

use std::process::Command;

fn demo() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shoal-demo"))
}

#[test]
fn help_lists_every_subcommand_the_scripts_use() {
    let out = demo()
        .arg("--help")
        .output()
        .expect("run shoal-demo --help");
    assert!(out.status.success(), "--help exits 0: {out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for cmd in ["backend", "client", "report", "watch-applied", "watch-gone"] {
        assert!(help.contains(cmd), "`{cmd}` missing from --help:\n{help}");
    }
}

#[test]
fn an_unknown_subcommand_is_a_usage_error() {
    let out = demo().arg("serve").output().expect("run shoal-demo serve");
    assert_eq!(
        out.status.code(),
        Some(2),
        "clap's usage exit code: {out:?}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("serve"));
}

#[test]
fn a_backend_without_an_agent_fails_and_says_why() {
    let out = demo()
        .args([
            "backend",
            "--agent-socket",
            "/nonexistent/shoal-demo-test/agent.sock",
            "--service",
            "prod/web/http",
            "--instance",
            "web-1",
            "--listen",
            "127.0.0.1:0",
            "--register-timeout-ms",
            "300",
        ])
        .output()
        .expect("run shoal-demo backend");
    assert_eq!(out.status.code(), Some(1), "a failed run exits 1: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("shoal-demo: "), "an error line: {err}");
    assert!(!err.contains("panicked"), "an error, not a panic: {err}");
    assert!(
        err.contains("/register"),
        "names the registration that failed: {err}"
    );
}
