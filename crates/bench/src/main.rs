//! `edgeprompt-bench`: the benchmark harness, apart from the product binary (`edgeprompt`) so
//! that what operators deploy carries no baselines, plotting or report code.

mod cli;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "edgeprompt-bench",
    version,
    about = "EdgePrompt benchmarks: machine, settings and baselines printed with every result"
)]
struct Args {
    #[command(subcommand)]
    bench: cli::Bench,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    cli::run(Args::parse().bench)
}
