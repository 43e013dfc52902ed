//! `edgeprompt`: one binary, one subcommand per job.

mod bench;
mod generate;
mod models;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "edgeprompt",
    version,
    about = "Cloud-edge collaborative LLM inference"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answer one chat turn locally, streaming, and print TTFT and throughput.
    Generate(generate::Args),
    /// Print a model's configuration, tensor types and fingerprint.
    Info(models::InfoArgs),
    /// Benchmarks (machine, settings and baselines printed with every result).
    #[command(subcommand)]
    Bench(bench::Bench),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Generate(a) => generate::run(a),
        Command::Info(a) => models::info(a),
        Command::Bench(b) => bench::run(b),
    }
}
