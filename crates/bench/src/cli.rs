//! The subcommands of `edgeprompt-bench`: benchmarks that print their machine, settings and
//! baselines.

use std::path::PathBuf;

use edgeprompt_bench::engine;
use edgeprompt_engine::catalog;
use edgeprompt_kv::Codec;

#[derive(clap::Subcommand)]
pub enum Bench {
    /// Engine prefill/decode tok/s vs candle's stock quantized model and llama.cpp.
    Engine(EngineArgs),
    /// TTFT over link profiles: edge-only vs EdgePrompt pipelined/sequential vs the planner.
    Ttft(TtftArgs),
    /// Constrained decoding's cost: batched decode tok/s with a JSON schema or the tools' text rule vs none.
    Grammar(GrammarArgs),
    /// Batched decode tok/s vs batch size and cloud prompt length: shared prefix vs per-request copy.
    Decode(DecodeArgs),
    /// Poisson arrivals at a sweep of rates against the edge server (and llama.cpp's): latency, TTFT, throughput.
    Serve(ServeArgs),
    /// Multi-turn conversations (ShareGPT's) on shared cloud prompts against the edge server (and llama.cpp's): TTFT per turn.
    Chat(ChatArgs),
    /// EdgePrompt Fig. 3: throughput vs cloud prompt length, no sharing / shared / split, two hardware settings.
    Batch(BatchArgs),
    /// CE-LSLM Table II analogue: cloud-only vs edge-only vs cloud-edge (per codec).
    Table(TableArgs),
    /// KV codecs: bytes vs f16 and what they change in the answer, per model.
    Codecs(CodecsArgs),
    /// Bytes leaving the cloud against the number of edges: edges reading the object store vs
    /// the cloud streaming to each (SeaweedFS on loopback).
    Fanout(FanoutArgs),
    /// The scale-out curve: 1, 2, 3 cloud replicas behind one object store and one Redis;
    /// prefills against distinct prompts, completed lookups and their p99.
    Replicas(ReplicasArgs),
    /// Failover under load: three cloud replicas, SeaweedFS (three volume servers) and a Redis
    /// Cluster as processes; a volume server, a Redis master and a replica killed in turn.
    Failover(FailoverArgs),
    /// CE-LSLM: quality of the edge SLM with the cloud LLM's mapped KV vs each alone; TTFT and bytes.
    Lslm(LslmArgs),
    /// CE-LSLM fuser: the edge SLM with fused KV vs each model alone and the mapped layers, on
    /// held-out conversations: perplexity, agreement, multiple-choice exact match.
    Fuser(FuserArgs),
    /// Chaos under load: real cloud, Redis, link and edge processes, faults on a seeded schedule, every request accounted for.
    Soak(SoakArgs),
    /// CE-LSLM Fig. 7: one cloud and N edges as real processes under Poisson load vs cloud-only; the simulator replays the same traces.
    Fleet(FleetArgs),
    /// The fleet simulator at CE-LSLM Fig. 7's scale and the deployer's questions (100 and 1000 edges), on costs fitted here.
    FleetGrid(FleetGridArgs),
    /// The fleet simulator with the object store and replicas against the fan-out and
    /// scale-out runs, then at 10^4-10^6 edges: replicas and store egress for a rollout.
    FleetScaleout(FleetScaleoutArgs),
    /// The fleet simulator's costs for one model on this process's cores (fitted forward passes).
    FleetCosts(FleetCostsArgs),
    /// docs/results.md (and the planner validation plot) generated from the JSON in docs/results/.
    Report(ReportArgs),
}

#[derive(clap::Args)]
pub struct FleetArgs {
    /// The cloud node's model (and cloud-only's).
    #[arg(long, default_value = "qwen15")]
    cloud_model: String,
    /// The edges' model; CE-LSLM when it differs from the cloud's.
    #[arg(long, default_value = "qwen05")]
    edge_model: String,
    /// CE-LSLM adapters (`edgeprompt align`); made with `edgeprompt align` when missing.
    #[arg(long, default_value = "models/align/adapters.safetensors")]
    adapters: PathBuf,
    /// Layers from this one on come from the cloud [default: the smallest split the CE-LSLM
    /// quality table allows, or 0 for one model].
    #[arg(long)]
    split: Option<usize>,
    #[arg(long, default_value = "docs/results/lslm.json")]
    lslm_table: PathBuf,
    #[arg(long, default_value_t = 4)]
    prompts: usize,
    #[arg(long, default_value_t = 512)]
    prefix_len: usize,
    #[arg(long, default_value_t = 48)]
    private_len: usize,
    #[arg(long, default_value_t = 48)]
    max_tokens: usize,
    #[arg(long, default_value = "wifi")]
    link: String,
    /// edgeprompt-N (a cloud and N edges), cloud-only, llama-server.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "edgeprompt-1,edgeprompt-2,cloud-only,llama-server"
    )]
    setups: Vec<String>,
    /// Offered requests per second over the fleet.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1,2")]
    rates: Vec<f64>,
    /// Seconds of arrivals per rate.
    #[arg(long, default_value_t = 60.0)]
    secs: f64,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// llama.cpp's `llama-server` binary (scripts/llama_server.sh builds it).
    #[arg(long)]
    llama_server: Option<PathBuf>,
    /// Rates for llama-server [default: --rates].
    #[arg(long, value_delimiter = ',')]
    llama_rates: Vec<f64>,
    #[arg(long, default_value_t = 8)]
    slots: usize,
    /// Timings per calibration pass (the median is kept).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long)]
    edgeprompt: Option<PathBuf>,
    /// Run nothing: replay a saved fleet.json's traces through the simulator again, in place.
    #[arg(long)]
    replay: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct FleetGridArgs {
    #[arg(long, default_value = "qwen15")]
    cloud_model: String,
    #[arg(long, default_value = "qwen05")]
    edge_model: String,
    /// The real fleet run: its CE-LSLM split and KV bytes per token.
    #[arg(long, default_value = "docs/results/fleet.json")]
    fleet: PathBuf,
    #[arg(long, default_value = "5g")]
    link: String,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct FleetCostsArgs {
    #[arg(long)]
    model: String,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// The JSON file to write.
    #[arg(long)]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct SoakArgs {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Length of the load (faults are placed along it).
    #[arg(long, default_value_t = 600.0)]
    secs: f64,
    /// Poisson arrivals per second over both edges.
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
    /// Cloud prompts registered with the cloud nodes.
    #[arg(long, default_value_t = 8)]
    prompts: usize,
    #[arg(long, default_value_t = 192)]
    cloud_len: usize,
    #[arg(long, default_value_t = 32)]
    user_len: usize,
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// Link profile between each edge and its cloud node.
    #[arg(long, default_value = "wifi")]
    link: String,
    #[arg(long, default_value_t = 128)]
    kv_budget_mb: usize,
    #[arg(long, default_value_t = 16)]
    prefix_cache_mb: usize,
    /// Each edge's private prefix cache (conversations kept for their next turns).
    #[arg(long, default_value_t = 16)]
    private_cache_mb: usize,
    #[arg(long, default_value_t = 32)]
    max_queue: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The `edgeprompt` binary the processes run (default: beside this one).
    #[arg(long)]
    edgeprompt: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct FleetScaleoutArgs {
    /// Where the fan-out, scale-out and SmolLM2 cost runs are.
    #[arg(long, default_value = "docs/results/xeon-207")]
    runs: PathBuf,
    #[arg(long, default_value = "docs/results/fleet-grid.json")]
    grid: PathBuf,
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    edges: Vec<usize>,
    /// Seconds of load simulated per fleet.
    #[arg(long, default_value_t = 120.0)]
    secs: f64,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct FailoverArgs {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Length of the load (the faults come at 1/4, 1/2 and 3/4 of it).
    #[arg(long, default_value_t = 120.0)]
    secs: f64,
    /// Poisson arrivals per second over both edges.
    #[arg(long, default_value_t = 2.0)]
    rate: f64,
    #[arg(long, default_value_t = 8)]
    prompts: usize,
    #[arg(long, default_value_t = 384)]
    cloud_len: usize,
    #[arg(long, default_value_t = 32)]
    user_len: usize,
    #[arg(long, default_value_t = 16)]
    max_tokens: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The `edgeprompt` binary the processes run (default: beside this one).
    #[arg(long)]
    edgeprompt: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct ReplicasArgs {
    #[arg(long, default_value = "smollm2")]
    model: String,
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    replicas: Vec<usize>,
    #[arg(long, default_value_t = 12)]
    prompts: usize,
    #[arg(long, default_value_t = 96)]
    lookups: usize,
    #[arg(long, default_value_t = 100)]
    prompt_words: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct FanoutArgs {
    #[arg(long, default_value = "smollm2")]
    model: String,
    #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
    edges: Vec<usize>,
    /// Edges fetching at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Words in the cloud prompt's house rules (about 3 tokens each).
    #[arg(long, default_value_t = 300)]
    prompt_words: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct CodecsArgs {
    #[arg(long, value_delimiter = ',', default_value = "smollm2,qwen05,qwen15")]
    models: Vec<String>,
    #[arg(long, value_delimiter = ',', default_value = "int8,int8ch,int4,int4ch")]
    codecs: Vec<String>,
    /// ShareGPT pairs per model.
    #[arg(long, default_value_t = 20)]
    pairs: usize,
    #[arg(long, default_value_t = 512)]
    cloud_len: usize,
    #[arg(long, default_value_t = 64)]
    edge_len: usize,
    #[arg(long, default_value_t = 64)]
    answer_tokens: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct LslmArgs {
    #[arg(long, default_value = "qwen15")]
    llm: String,
    #[arg(long, default_value = "qwen05")]
    slm: String,
    /// Adapter files from `edgeprompt align` (the first drives latency and the per-layer study).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "models/align/adapters.safetensors,models/align/adapters-think50.safetensors"
    )]
    adapters: Vec<PathBuf>,
    /// Held-out conversations scored (0 skips the quality part).
    #[arg(long, default_value_t = 8)]
    cases: usize,
    #[arg(long, default_value_t = 512)]
    cloud_tokens: usize,
    #[arg(long, default_value_t = 96)]
    user_tokens: usize,
    #[arg(long, default_value_t = 96)]
    answer_tokens: usize,
    /// First ShareGPT record used (the ones before are calibration's).
    #[arg(long, default_value_t = 4000)]
    first_record: usize,
    /// Cloud prompt lengths for TTFT.
    #[arg(long, value_delimiter = ',', default_value = "512,1024")]
    cloud_lens: Vec<usize>,
    /// Quality only.
    #[arg(long)]
    skip_latency: bool,
    #[arg(long, default_value_t = 64)]
    edge_len: usize,
    #[arg(long, value_delimiter = ',', default_value = "6g,wifi,4g")]
    profiles: Vec<String>,
    #[arg(long, default_value = "f16")]
    codec: String,
    /// The planner only loads layers whose split kept this next-token agreement with the SLM
    /// alone in the quality run.
    #[arg(long, default_value_t = 0.9)]
    min_agreement: f64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct FuserArgs {
    #[arg(long, default_value = "qwen15")]
    llm: String,
    #[arg(long, default_value = "qwen05")]
    slm: String,
    /// The fuser `scripts/fuser/train.py` wrote.
    #[arg(long, default_value = "models/fuser/fuser.safetensors")]
    fuser: PathBuf,
    /// Adapters from `edgeprompt align`, to compare today's mapped layers (skipped if absent).
    #[arg(long, default_value = "models/align/adapters.safetensors")]
    adapters: PathBuf,
    /// The mapped layers compared start here (the split the quality floor allows).
    #[arg(long, default_value_t = 18)]
    mapped_split: usize,
    /// Conversations in ShareGPT's format (default: the packaged ShareGPT).
    #[arg(long)]
    conversations: Option<PathBuf>,
    /// First record used: 4000 holds out the cases `bench lslm` scores (its 8 first), apart
    /// from calibration and from the fuser's training data (records 10000..).
    #[arg(long, default_value_t = 4000)]
    first_record: usize,
    #[arg(long, default_value_t = 72)]
    cases: usize,
    #[arg(long, default_value_t = 512)]
    cloud_tokens: usize,
    #[arg(long, default_value_t = 96)]
    user_tokens: usize,
    #[arg(long, default_value_t = 96)]
    answer_tokens: usize,
    /// Options per multiple-choice question.
    #[arg(long, default_value_t = 4)]
    choices: usize,
    /// Cases whose TTFT and bytes are measured on loopback gRPC, fused vs EdgePrompt mode.
    #[arg(long, default_value_t = 4)]
    wire_cases: usize,
    /// Link profile for those measurements.
    #[arg(long, default_value = "wifi")]
    profile: String,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Offered request rates (req/s).
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1,2")]
    rates: Vec<f64>,
    /// Distinct cloud prompts.
    #[arg(long, default_value_t = 4)]
    groups: usize,
    /// Requests per cloud prompt (per rate), each with a private prompt no other request has.
    #[arg(long, default_value_t = 6)]
    per_group: usize,
    #[arg(long, default_value_t = 512)]
    cloud_len: usize,
    #[arg(long, default_value_t = 128)]
    edge_len: usize,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Our edge's batch; llama-server's slots should be the same (scripts/bench_serve.sh).
    #[arg(long, default_value_t = 8)]
    max_batch: usize,
    /// llama.cpp's OpenAI-compatible server on the same GGUF, e.g. http://127.0.0.1:8090/v1
    /// (scripts/bench_serve.sh starts one).
    #[arg(long)]
    llama_server: Option<String>,
    /// How that server was started, recorded with the results (scripts/bench_serve.sh sets it).
    #[arg(long)]
    llama_server_args: Option<String>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct ChatArgs {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Conversations started per second (Poisson), one sweep point each.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.5")]
    rates: Vec<f64>,
    /// Conversations per rate, each with its own ShareGPT conversation.
    #[arg(long, default_value_t = 8)]
    conversations: usize,
    /// User turns per conversation.
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Distinct cloud prompts the conversations share.
    #[arg(long, default_value_t = 2)]
    groups: usize,
    #[arg(long, default_value_t = 512)]
    cloud_len: usize,
    /// A user turn is cut to this many tokens.
    #[arg(long, default_value_t = 128)]
    turn_len: usize,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Our edge's batch; llama-server's slots should be the same (scripts/bench_serve.sh).
    #[arg(long, default_value_t = 8)]
    max_batch: usize,
    /// llama.cpp's OpenAI-compatible server on the same GGUF (scripts/bench_serve.sh starts one).
    #[arg(long)]
    llama_server: Option<String>,
    #[arg(long)]
    llama_server_args: Option<String>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct BatchArgs {
    #[arg(long, default_value = "smollm2")]
    model: String,
    #[arg(long, value_delimiter = ',', default_value = "64,256,512,1024")]
    cloud_lens: Vec<usize>,
    /// Groups (distinct cloud prompts); the paper uses 100.
    #[arg(long, default_value_t = 2)]
    groups: usize,
    /// Requests per group; the paper uses 10.
    #[arg(long, default_value_t = 8)]
    per_group: usize,
    #[arg(long, default_value_t = 64)]
    edge_len: usize,
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Hardware settings as label:threads.
    #[arg(long, value_delimiter = ',', default_value = "cloud:2,edge:1")]
    hardware: Vec<String>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct TableArgs {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Requests, each on its own cloud prompt.
    #[arg(long, default_value_t = 8)]
    requests: usize,
    #[arg(long, default_value_t = 512)]
    cloud_len: usize,
    #[arg(long, default_value_t = 128)]
    edge_len: usize,
    #[arg(long, default_value_t = 48)]
    max_tokens: usize,
    #[arg(long, default_value = "5g")]
    profile: String,
    #[arg(long, value_delimiter = ',', default_value = "f16,int8,int4")]
    codecs: Vec<String>,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct ReportArgs {
    #[arg(long, default_value = "docs/results")]
    from: PathBuf,
    #[arg(long, default_value = "docs/results.md")]
    to: PathBuf,
}

#[derive(clap::Args)]
pub struct DecodeArgs {
    #[arg(long, default_value = "smollm2")]
    model: String,
    #[arg(long, value_delimiter = ',', default_value = "64,256,512,1024")]
    cloud_lens: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    batch_sizes: Vec<usize>,
    #[arg(long, default_value_t = 32)]
    private_tokens: usize,
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// Measurements per point; the best is kept.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct GrammarArgs {
    #[arg(long, default_value = "qwen05")]
    model: String,
    #[arg(long, default_value_t = 256)]
    cloud_tokens: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    batch_sizes: Vec<usize>,
    #[arg(long, default_value_t = 32)]
    private_tokens: usize,
    #[arg(long, default_value_t = 32)]
    steps: usize,
    /// Rounds; each point keeps its best.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct TtftArgs {
    #[arg(long, default_value = "qwen05")]
    model: String,
    #[arg(long, value_delimiter = ',', default_value = "64,256,512,1024")]
    cloud_lens: Vec<usize>,
    #[arg(long, default_value_t = 512)]
    edge_len: usize,
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "6g,5g,wifi,4g,constrained"
    )]
    profiles: Vec<String>,
    #[arg(long, default_value = "f16")]
    codec: String,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// A Python with `llama_cpp`: adds llama.cpp edge-only TTFT on the same tokens.
    #[arg(long)]
    llama_python: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct EngineArgs {
    #[arg(long, default_value = "smollm2")]
    model: String,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, value_delimiter = ',', default_value = "128,512,1024")]
    prompt_lens: Vec<usize>,
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// Runs of each figure, ours and llama.cpp alike; the best is kept (this host's speed
    /// moves by 10-20 % from minute to minute: best of 2 was not enough).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// A Python with `llama_cpp` (scripts/bench_engine.sh builds .venv-bench).
    #[arg(long)]
    llama_python: Option<PathBuf>,
    #[arg(long)]
    skip_candle: bool,
    /// Context the decode is timed after [default: 512, or the longest prompt if shorter].
    #[arg(long)]
    decode_at: Option<usize>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

fn sharegpt() -> anyhow::Result<PathBuf> {
    Ok(catalog::sharegpt()?)
}

fn resolve(name: &str) -> anyhow::Result<PathBuf> {
    Ok(catalog::resolve(name)?)
}

pub fn run(b: Bench) -> anyhow::Result<()> {
    match b {
        Bench::Lslm(a) => {
            let sharegpt = sharegpt()?;
            let codec = Codec::parse(&a.codec)
                .ok_or_else(|| anyhow::anyhow!("codec is one of {}", Codec::names()))?;
            let s = edgeprompt_bench::lslm::Settings {
                llm: resolve(&a.llm)?,
                slm: resolve(&a.slm)?,
                adapters: a.adapters,
                quality: (a.cases > 0).then(|| edgeprompt_bench::lslm::quality::Settings {
                    sharegpt: sharegpt.clone(),
                    cases: a.cases,
                    cloud_tokens: a.cloud_tokens,
                    user_tokens: a.user_tokens,
                    answer_tokens: a.answer_tokens,
                    first_record: a.first_record,
                }),
                latency: (!a.skip_latency).then_some({
                    edgeprompt_bench::lslm::latency::Settings {
                        cloud_lens: a.cloud_lens,
                        edge_len: a.edge_len,
                        profiles: a.profiles,
                        codec,
                    }
                }),
                min_agreement: a.min_agreement,
                sharegpt,
                threads: a.threads,
                out: a.out.clone(),
            };
            for p in &s.adapters {
                anyhow::ensure!(
                    p.exists(),
                    "{} missing: run `edgeprompt align` first",
                    p.display()
                );
            }
            edgeprompt_bench::lslm::run(&s)?;
            eprintln!("wrote {}/lslm.json and lslm-*.svg", a.out.display());
            Ok(())
        }
        Bench::Fuser(a) => {
            anyhow::ensure!(
                a.fuser.exists(),
                "{} missing: run `edgeprompt fuser-data` and scripts/fuser/train.py first",
                a.fuser.display()
            );
            anyhow::ensure!(
                a.cases > 0 && a.choices > 0,
                "--cases and --choices are at least 1"
            );
            let s = edgeprompt_bench::lslm::fused::Settings {
                llm: resolve(&a.llm)?,
                slm: resolve(&a.slm)?,
                fuser: a.fuser,
                adapters: a.adapters.exists().then_some(a.adapters),
                mapped_split: a.mapped_split,
                conversations: match a.conversations {
                    Some(p) => p,
                    None => sharegpt()?,
                },
                first_record: a.first_record,
                cases: a.cases,
                limits: edgeprompt_align::conversation::Limits {
                    cloud_tokens: a.cloud_tokens,
                    user_tokens: a.user_tokens,
                    answer_tokens: a.answer_tokens,
                },
                choices: a.choices,
                wire_cases: a.wire_cases,
                profile: a.profile,
                threads: a.threads,
                out: a.out.clone(),
            };
            edgeprompt_bench::lslm::fused::run(&s)?;
            eprintln!("wrote {}/fuser.json", a.out.display());
            Ok(())
        }
        Bench::Ttft(a) => {
            let sharegpt = sharegpt()?;
            let s = edgeprompt_bench::ttft::Settings {
                model: resolve(&a.model)?,
                sharegpt,
                cloud_lens: a.cloud_lens,
                edge_len: a.edge_len,
                profiles: a.profiles,
                codec: Codec::parse(&a.codec)
                    .ok_or_else(|| anyhow::anyhow!("codec is one of {}", Codec::names()))?,
                threads: a.threads,
                llama_python: a.llama_python,
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::ttft::run(&s)?;
            let window = r.rows.iter().any(|x| x.pipelined_uncut_s.is_some());
            eprintln!(
                "wrote {} rows to {}/{}.json and SVG plots",
                r.rows.len(),
                a.out.display(),
                if window { "ttft-window" } else { "ttft" }
            );
            Ok(())
        }
        Bench::Codecs(a) => {
            let s = edgeprompt_bench::codecs::Settings {
                models: a
                    .models
                    .iter()
                    .map(|m| resolve(m))
                    .collect::<anyhow::Result<_>>()?,
                sharegpt: sharegpt()?,
                codecs: a
                    .codecs
                    .iter()
                    .map(|c| {
                        Codec::parse(c)
                            .ok_or_else(|| anyhow::anyhow!("codec {c}: one of {}", Codec::names()))
                    })
                    .collect::<anyhow::Result<_>>()?,
                pairs: a.pairs.max(1),
                cloud_len: a.cloud_len,
                edge_len: a.edge_len,
                answer_tokens: a.answer_tokens.max(1),
                threads: a.threads,
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::codecs::run(&s)?;
            eprintln!(
                "wrote {} rows to {}/codecs.json and codecs.svg",
                r.rows.len(),
                a.out.display()
            );
            Ok(())
        }
        Bench::Replicas(a) => {
            let s = edgeprompt_bench::replicas::Settings {
                model: resolve(&a.model)?,
                replicas: a.replicas.clone(),
                prompts: a.prompts.max(1),
                lookups: a.lookups,
                prompt_words: a.prompt_words,
                seed: a.seed,
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::replicas::run(&s)?;
            eprintln!(
                "wrote {} rows to {}/replicas.json",
                r.rows.len(),
                a.out.display()
            );
            Ok(())
        }
        Bench::FleetScaleout(a) => {
            let s = edgeprompt_bench::fleet::scaleout::Settings {
                runs: a.runs,
                grid: a.grid,
                edges: a.edges,
                secs: a.secs,
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::fleet::scaleout::run(&s)?;
            eprintln!(
                "worst predicted error {:.1} %; wrote {}/fleet-scaleout.json",
                r.worst_predicted_error * 100.0,
                a.out.display()
            );
            Ok(())
        }
        Bench::Failover(a) => {
            let s = edgeprompt_bench::failover::Settings {
                model: resolve(&a.model)?,
                edgeprompt: beside(a.edgeprompt)?,
                sharegpt: sharegpt()?,
                secs: a.secs,
                rate: a.rate,
                prompts: a.prompts.max(1),
                cloud_len: a.cloud_len,
                user_len: a.user_len,
                max_tokens: a.max_tokens,
                seed: a.seed,
                client_timeout_secs: 180,
                dir: std::env::temp_dir()
                    .join(format!("edgeprompt-failover-{}", std::process::id())),
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::failover::run(&s)?;
            let _ = std::fs::remove_dir_all(&s.dir);
            eprintln!("wrote {}/failover.json", a.out.display());
            let bad = r.violations();
            anyhow::ensure!(bad.is_empty(), "failover: {}", bad.join("; "));
            Ok(())
        }
        Bench::Fanout(a) => {
            let s = edgeprompt_bench::fanout::Settings {
                model: resolve(&a.model)?,
                edges: a.edges.clone(),
                concurrency: a.concurrency,
                prompt_words: a.prompt_words,
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::fanout::run(&s)?;
            eprintln!(
                "wrote {} rows to {}/fanout.json",
                r.rows.len(),
                a.out.display()
            );
            Ok(())
        }
        Bench::Grammar(a) => {
            let s = edgeprompt_bench::grammar::Settings {
                model: resolve(&a.model)?,
                sharegpt: sharegpt().ok(),
                cloud_tokens: a.cloud_tokens,
                private_tokens: a.private_tokens,
                batch_sizes: a.batch_sizes,
                steps: a.steps.max(1),
                repeats: a.repeats,
                threads: a.threads,
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::grammar::run(&s)?;
            eprintln!(
                "wrote {} rows to {}/grammar.json",
                r.rows.len(),
                a.out.display()
            );
            Ok(())
        }
        Bench::Decode(a) => {
            let s = edgeprompt_bench::decode::Settings {
                model: resolve(&a.model)?,
                sharegpt: sharegpt().ok(),
                cloud_lens: a.cloud_lens,
                batch_sizes: a.batch_sizes,
                private_tokens: a.private_tokens,
                steps: a.steps.max(1),
                repeats: a.repeats,
                threads: a.threads,
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::decode::run(&s)?;
            eprintln!(
                "wrote {} rows to {}/decode.json and decode-*.svg",
                r.rows.len(),
                a.out.display()
            );
            Ok(())
        }
        Bench::FleetGrid(a) => {
            let s = edgeprompt_bench::fleet::grid::Settings {
                bench: std::env::current_exe()?,
                cloud_model: resolve(&a.cloud_model)?,
                edge_model: resolve(&a.edge_model)?,
                sharegpt: sharegpt()?,
                fleet: a.fleet,
                link: a.link,
                repeats: a.repeats.max(1),
                dir: std::env::temp_dir().join(format!("edgeprompt-grid-{}", std::process::id())),
                out: a.out.clone(),
            };
            edgeprompt_bench::fleet::grid::run(&s)?;
            let _ = std::fs::remove_dir_all(&s.dir);
            eprintln!("wrote {}/fleet-grid.json", a.out.display());
            Ok(())
        }
        Bench::FleetCosts(a) => {
            let r =
                edgeprompt_bench::fleet::costs::run(&edgeprompt_bench::fleet::costs::Settings {
                    model: resolve(&a.model)?,
                    sharegpt: sharegpt()?,
                    threads: a.threads.max(1),
                    repeats: a.repeats.max(1),
                })?;
            if let Some(dir) = a.out.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&a.out, serde_json::to_string_pretty(&r)?)?;
            Ok(())
        }
        Bench::Fleet(a) => {
            if let Some(file) = &a.replay {
                edgeprompt_bench::fleet::replay(file, &resolve(&a.edge_model)?)?;
                eprintln!("rewrote {}", file.display());
                return Ok(());
            }
            let edgeprompt = match a.edgeprompt {
                Some(p) => p,
                None => std::env::current_exe()?.with_file_name("edgeprompt"),
            };
            anyhow::ensure!(
                edgeprompt.exists(),
                "{} not found: build it with `cargo build --release --bin edgeprompt` or pass --edgeprompt",
                edgeprompt.display()
            );
            let setups = a
                .setups
                .iter()
                .map(|x| {
                    edgeprompt_bench::fleet::Setup::parse(x).ok_or_else(|| {
                        anyhow::anyhow!("setup {x}: edgeprompt-N, cloud-only or llama-server")
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let lslm = a.cloud_model != a.edge_model;
            if lslm && !a.adapters.exists() {
                eprintln!(
                    "no {}: running `edgeprompt align` (about a minute)",
                    a.adapters.display()
                );
                let ok = std::process::Command::new(&edgeprompt)
                    .args(["align", "--llm", &a.cloud_model, "--slm", &a.edge_model])
                    .status()?
                    .success();
                anyhow::ensure!(
                    ok && a.adapters.exists(),
                    "edgeprompt align did not write {}",
                    a.adapters.display()
                );
            }
            let split = match a.split {
                Some(k) => k,
                None if lslm => {
                    edgeprompt_bench::lslm::quality_floor(&a.lslm_table).ok_or_else(|| {
                        anyhow::anyhow!(
                            "no split floor in {}: pass --split",
                            a.lslm_table.display()
                        )
                    })?
                }
                None => 0,
            };
            let s = edgeprompt_bench::fleet::Settings {
                edgeprompt,
                bench: std::env::current_exe()?,
                cloud_model: resolve(&a.cloud_model)?,
                cloud_model_id: a.cloud_model.clone(),
                edge_model: resolve(&a.edge_model)?,
                edge_model_id: a.edge_model.clone(),
                adapters: lslm.then_some(a.adapters.clone()),
                split,
                sharegpt: sharegpt()?,
                prompts: a.prompts.max(1),
                prefix_len: a.prefix_len,
                private_len: a.private_len,
                max_tokens: a.max_tokens,
                link: a.link,
                setups,
                rates: a.rates,
                secs: a.secs,
                seed: a.seed,
                llama_server: a.llama_server,
                llama_rates: a.llama_rates,
                slots: a.slots,
                repeats: a.repeats.max(1),
                dir: std::env::temp_dir().join(format!("edgeprompt-fleet-{}", std::process::id())),
                out: a.out.clone(),
            };
            edgeprompt_bench::fleet::run(&s)?;
            let _ = std::fs::remove_dir_all(&s.dir);
            eprintln!("wrote {}/fleet.json", a.out.display());
            Ok(())
        }
        Bench::Soak(a) => {
            let s = edgeprompt_bench::soak::Settings {
                model: resolve(&a.model)?,
                edgeprompt: beside(a.edgeprompt)?,
                sharegpt: sharegpt()?,
                secs: a.secs,
                rate: a.rate,
                prompts: a.prompts.max(1),
                cloud_len: a.cloud_len,
                user_len: a.user_len,
                max_tokens: a.max_tokens,
                link: a.link,
                kv_budget_mb: a.kv_budget_mb,
                prefix_cache_mb: a.prefix_cache_mb,
                private_cache_mb: a.private_cache_mb,
                max_queue: a.max_queue,
                seed: a.seed,
                client_timeout_secs: 180,
                dir: std::env::temp_dir().join(format!("edgeprompt-soak-{}", std::process::id())),
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::soak::run(&s)?;
            let _ = std::fs::remove_dir_all(&s.dir);
            eprintln!("wrote {}/soak.json", a.out.display());
            let bad = r.violations();
            anyhow::ensure!(bad.is_empty(), "the soak found: {}", bad.join("; "));
            Ok(())
        }
        Bench::Chat(a) => {
            let s = edgeprompt_bench::chat::Settings {
                model: resolve(&a.model)?,
                model_id: a.model.clone(),
                sharegpt: sharegpt()?,
                conversations: a.conversations.max(1),
                turns: a.turns.max(1),
                groups: a.groups.max(1),
                cloud_len: a.cloud_len,
                turn_len: a.turn_len.max(1),
                max_tokens: a.max_tokens,
                rates: a.rates,
                seed: a.seed,
                threads: a.threads,
                max_batch: a.max_batch.max(1),
                llama_server: a.llama_server,
                llama_server_args: a.llama_server_args,
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::chat::run(&s)?;
            eprintln!(
                "wrote {} turns to {}/chat{}.json",
                r.samples.len(),
                a.out.display(),
                edgeprompt_bench::serve::file_tag(&s.model_id)
            );
            Ok(())
        }
        Bench::Serve(a) => {
            let s = edgeprompt_bench::serve::Settings {
                model: resolve(&a.model)?,
                model_id: a.model.clone(),
                workload: edgeprompt_bench::workload::WorkloadSpec {
                    sharegpt: sharegpt()?,
                    groups: a.groups.max(1),
                    per_group: a.per_group.max(1),
                    cloud_len: a.cloud_len,
                    edge_len: a.edge_len,
                    seed: a.seed,
                },
                rates: a.rates,
                max_tokens: a.max_tokens,
                threads: a.threads,
                max_batch: a.max_batch.max(1),
                llama_server: a.llama_server,
                llama_server_args: a.llama_server_args,
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::serve::run(&s)?;
            let tag = edgeprompt_bench::serve::file_tag(&s.model_id);
            eprintln!(
                "wrote {} points to {}/serve{tag}.json and serve{tag}-*.svg",
                r.points.len(),
                a.out.display()
            );
            Ok(())
        }
        Bench::Batch(a) => {
            let mut hardware = Vec::new();
            for h in &a.hardware {
                let (label, t) = h
                    .split_once(':')
                    .ok_or_else(|| anyhow::anyhow!("hardware is label:threads, got {h}"))?;
                hardware.push((label.to_string(), t.parse::<usize>()?.max(1)));
            }
            let s = edgeprompt_bench::batch::Settings {
                model: resolve(&a.model)?,
                workload: edgeprompt_bench::workload::WorkloadSpec {
                    sharegpt: sharegpt()?,
                    groups: a.groups.max(1),
                    per_group: a.per_group.max(1),
                    cloud_len: 0,
                    edge_len: a.edge_len,
                    seed: a.seed,
                },
                cloud_lens: a.cloud_lens,
                max_tokens: a.max_tokens,
                hardware,
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::batch::run(&s)?;
            eprintln!(
                "wrote {} rows to {}/batch.json and batch-*.svg",
                r.rows.len(),
                a.out.display()
            );
            Ok(())
        }
        Bench::Table(a) => {
            let codecs = a
                .codecs
                .iter()
                .map(|c| {
                    Codec::parse(c)
                        .ok_or_else(|| anyhow::anyhow!("codec {c}: one of {}", Codec::names()))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let s = edgeprompt_bench::table::Settings {
                model: resolve(&a.model)?,
                model_id: a.model.clone(),
                workload: edgeprompt_bench::workload::WorkloadSpec {
                    sharegpt: sharegpt()?,
                    groups: a.requests.max(1),
                    per_group: 1,
                    cloud_len: a.cloud_len,
                    edge_len: a.edge_len,
                    seed: a.seed,
                },
                max_tokens: a.max_tokens,
                profile: a.profile,
                codecs,
                threads: a.threads,
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::table::run(&s)?;
            eprintln!(
                "wrote {} rows to {}/table.json",
                r.rows.len(),
                a.out.display()
            );
            Ok(())
        }
        Bench::Report(a) => {
            edgeprompt_bench::report::run(&a.from, &a.to)?;
            eprintln!("wrote {}", a.to.display());
            Ok(())
        }
        Bench::Engine(a) => {
            let settings = engine::Settings {
                model: resolve(&a.model)?,
                threads: a.threads,
                prompt_lens: a.prompt_lens,
                decode_tokens: a.decode_tokens,
                repeats: a.repeats,
                llama_python: a.llama_python,
                skip_candle: a.skip_candle,
                decode_at: a.decode_at,
            };
            let report = engine::run(&settings)?;
            println!("{}", engine::table(&report));
            std::fs::create_dir_all(&a.out)?;
            let path = a.out.join(format!(
                "engine-{}.json",
                edgeprompt_bench::file_part(&a.model)
            ));
            std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
            eprintln!("wrote {}", path.display());
            Ok(())
        }
    }
}

/// The `edgeprompt` binary: the one given, or the one beside this.
fn beside(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let p = match given {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("edgeprompt"),
    };
    anyhow::ensure!(
        p.exists(),
        "{} not found: build it with `cargo build --release --bin edgeprompt` or pass --edgeprompt",
        p.display()
    );
    Ok(p)
}
