//! `edgeprompt`: the product binary, one subcommand per job (the benchmarks are
//! `edgeprompt-bench`, in `crates/bench`).

mod align;
mod generate;
mod models;
mod nodes;
mod plan;
mod security;
mod serve;

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
    /// Cloud node: prefill named prompts once, stream their KV to edges over gRPC.
    Cloud(nodes::CloudArgs),
    /// Edge node, one chat turn: fetch the cloud prompt's KV, compute the private prompt here.
    Edge(nodes::EdgeArgs),
    /// A cloud prompt's KV as the edge fetches and checks it, written to a file other programs
    /// read (docs/protocol.md).
    KvExport(nodes::ExportArgs),
    /// Edge node as an OpenAI-compatible HTTP server with continuous batching.
    Serve(Box<serve::ServeArgs>),
    /// Shaping TCP proxy (bandwidth, RTT) with named profiles.
    Link(nodes::LinkArgs),
    /// Cloud, link and edge on loopback answering a chat with a private prompt.
    Demo(nodes::DemoArgs),
    /// CE-LSLM: match a large cloud model's layers to a small edge model's (CKA, RSA) and fit
    /// the K/V adapters the cloud serves the small model through.
    Align(align::AlignArgs),
    /// CE-LSLM fuser: write training data (both models' prompt KV, the large model's view of
    /// each answer) for `scripts/fuser/train.py`.
    FuserData(align::FuserDataArgs),
    /// Print a model's configuration, tensor types and fingerprint.
    Info(models::InfoArgs),
    /// Fleet planning: N edges at R req/s on these prompts and links: how many cloud nodes,
    /// what latency (the fleet simulator on measured costs).
    Plan(plan::PlanArgs),
    /// A new key pair for a cloud to sign the KV it serves (edges check it with --cloud-key).
    Keygen(security::KeygenArgs),
    /// Keys pinned for clouds: show them, pin one out of band (or to settle a conflict), or
    /// forget one.
    Trust(security::TrustArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Generate(a) => generate::run(a),
        Command::Info(a) => models::info(a),
        Command::Keygen(a) => security::keygen(a),
        Command::Trust(a) => security::trust(a),
        Command::Cloud(a) => nodes::cloud(a),
        Command::Edge(a) => nodes::edge(a),
        Command::KvExport(a) => nodes::kv_export(a),
        Command::Serve(a) => serve::run(*a),
        Command::Link(a) => nodes::link(a),
        Command::Demo(a) => nodes::demo(a),
        Command::Align(a) => align::run(a),
        Command::FuserData(a) => align::fuser_data(a),
        Command::Plan(a) => plan::run(a),
    }
}
