//! `edgeprompt-bench`: the benchmark harness, apart from the product binary (`edgeprompt`) so
//! that what operators deploy carries no baselines, plotting or report code.

use clap::Parser;
use edgeprompt_bench::{
    batch, chat, codecs, decode, engine, failover, fanout, fleet, grammar, lslm, replicas, report,
    serve, soak, table, ttft,
};

#[derive(Parser)]
#[command(
    name = "edgeprompt-bench",
    version,
    about = "EdgePrompt benchmarks: machine, settings and baselines printed with every result"
)]
struct Args {
    #[command(subcommand)]
    bench: Bench,
}

// The subcommands; each bench's flags (`Args`) and run (`cli`) are in its own module.
#[derive(clap::Subcommand)]
enum Bench {
    /// Engine prefill/decode tok/s vs candle's stock quantized model and llama.cpp.
    Engine(engine::Args),
    /// TTFT over link profiles: edge-only vs EdgePrompt pipelined/sequential vs the planner.
    Ttft(ttft::Args),
    /// Constrained decoding's cost: batched decode tok/s with a JSON schema or the tools' text rule vs none.
    Grammar(grammar::Args),
    /// Batched decode tok/s vs batch size and cloud prompt length: shared prefix vs per-request copy.
    Decode(decode::Args),
    /// Poisson arrivals at a sweep of rates against the edge server (and llama.cpp's): latency, TTFT, throughput.
    Serve(serve::Args),
    /// Multi-turn conversations (ShareGPT's) on shared cloud prompts against the edge server (and llama.cpp's): TTFT per turn.
    Chat(chat::Args),
    /// EdgePrompt Fig. 3: throughput vs cloud prompt length, no sharing / shared / split, two hardware settings.
    Batch(batch::Args),
    /// CE-LSLM Table II analogue: cloud-only vs edge-only vs cloud-edge (per codec).
    Table(table::Args),
    /// KV codecs: bytes vs f16 and what they change in the answer, per model.
    Codecs(codecs::Args),
    /// Bytes leaving the cloud against the number of edges: edges reading the object store vs
    /// the cloud streaming to each (SeaweedFS on loopback).
    Fanout(fanout::Args),
    /// The scale-out curve: 1, 2, 3 cloud replicas behind one object store and one Redis;
    /// prefills against distinct prompts, completed lookups and their p99.
    Replicas(replicas::Args),
    /// Failover under load: three cloud replicas, SeaweedFS (three volume servers) and a Redis
    /// Cluster as processes; a volume server, a Redis master and a replica killed in turn.
    Failover(failover::Args),
    /// CE-LSLM: quality of the edge SLM with the cloud LLM's mapped KV vs each alone; TTFT and bytes.
    Lslm(lslm::Args),
    /// CE-LSLM fuser: the edge SLM with fused KV vs each model alone and the mapped layers, on
    /// held-out conversations: perplexity, agreement, multiple-choice exact match.
    Fuser(lslm::fused::Args),
    /// Chaos under load: real cloud, Redis, link and edge processes, faults on a seeded schedule, every request accounted for.
    Soak(soak::Args),
    /// CE-LSLM Fig. 7: one cloud and N edges as real processes under Poisson load vs cloud-only; the simulator replays the same traces.
    Fleet(fleet::Args),
    /// The fleet simulator at CE-LSLM Fig. 7's scale and the deployer's questions (100 and 1000 edges), on costs fitted here.
    FleetGrid(fleet::grid::Args),
    /// The fleet simulator with the object store and replicas against the fan-out and
    /// scale-out runs, then at 10^4-10^6 edges: replicas and store egress for a rollout.
    FleetScaleout(fleet::scaleout::Args),
    /// The fleet simulator's costs for one model on this process's cores (fitted forward passes).
    FleetCosts(fleet::costs::Args),
    /// docs/results.md (and the planner validation plot) generated from the JSON in docs/results/.
    Report(report::Args),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Args::parse().bench {
        Bench::Engine(a) => engine::cli(a),
        Bench::Ttft(a) => ttft::cli(a),
        Bench::Grammar(a) => grammar::cli(a),
        Bench::Decode(a) => decode::cli(a),
        Bench::Serve(a) => serve::cli(a),
        Bench::Chat(a) => chat::cli(a),
        Bench::Batch(a) => batch::cli(a),
        Bench::Table(a) => table::cli(a),
        Bench::Codecs(a) => codecs::cli(a),
        Bench::Fanout(a) => fanout::cli(a),
        Bench::Replicas(a) => replicas::cli(a),
        Bench::Failover(a) => failover::cli(a),
        Bench::Lslm(a) => lslm::cli(a),
        Bench::Fuser(a) => lslm::fused::cli(a),
        Bench::Soak(a) => soak::cli(a),
        Bench::Fleet(a) => fleet::cli(a),
        Bench::FleetGrid(a) => fleet::grid::cli(a),
        Bench::FleetScaleout(a) => fleet::scaleout::cli(a),
        Bench::FleetCosts(a) => fleet::costs::cli(a),
        Bench::Report(a) => report::cli(a),
    }?;
    Ok(())
}
