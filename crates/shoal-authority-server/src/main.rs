//! `shoal-authority`: the authority replica and its admin commands as a standalone binary
//! (the same commands as `shoal authority ...`).

use clap::Parser;
use shoal_authority_server::cli::{run, AuthorityCmd};

/// shoal region authority.
#[derive(Debug, Parser)]
#[command(name = "shoal-authority")]
struct Args {
    #[command(subcommand)]
    cmd: AuthorityCmd,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    run(Args::parse().cmd).await
}
