//! `shoal authority ...` — placeholder. The region authority server is being built in
//! `crates/shoal-authority-server`; its engineer replaces this file (keeping `AuthorityCmd` and
//! `run`).

use clap::Subcommand;

/// Authority subcommands (not built yet).
#[derive(Debug, Subcommand)]
pub enum AuthorityCmd {
    /// Run an authority replica (not built yet).
    Run {
        /// Remaining arguments, ignored.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// Runs an authority subcommand.
///
/// # Errors
/// Never; exits the process with status 2.
pub async fn run(cmd: AuthorityCmd) -> anyhow::Result<()> {
    let _ = cmd;
    eprintln!("shoal authority: not built yet (use `shoal agent --dev-authority` meanwhile)");
    std::process::exit(2);
}
