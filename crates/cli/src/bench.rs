//! `edgeprompt bench ...`: benchmarks that print their machine, settings and baselines.

use std::path::PathBuf;

use edgeprompt_bench::engine;

#[derive(clap::Subcommand)]
pub enum Bench {
    /// Engine prefill/decode tok/s vs candle's stock quantized model and llama.cpp.
    Engine(EngineArgs),
    /// TTFT over link profiles: edge-only vs EdgePrompt pipelined/sequential vs the planner.
    Ttft(TtftArgs),
    /// Batched decode tok/s vs batch size and cloud prompt length: shared prefix vs per-request copy.
    Decode(DecodeArgs),
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
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    /// A Python with `llama_cpp` (scripts/bench_engine.sh builds .venv-bench).
    #[arg(long)]
    llama_python: Option<PathBuf>,
    #[arg(long)]
    skip_candle: bool,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

pub fn run(b: Bench) -> anyhow::Result<()> {
    match b {
        Bench::Ttft(a) => {
            let sharegpt =
                super::models::models_dir().join("ShareGPT_V3_unfiltered_cleaned_split.json");
            anyhow::ensure!(
                sharegpt.exists(),
                "ShareGPT missing: run `python3 scripts/models.py sharegpt`"
            );
            let s = edgeprompt_bench::ttft::Settings {
                model: super::models::resolve(&a.model)?,
                sharegpt,
                cloud_lens: a.cloud_lens,
                edge_len: a.edge_len,
                profiles: a.profiles,
                codec: edgeprompt_kv::Codec::parse(&a.codec)
                    .ok_or_else(|| anyhow::anyhow!("codec is f16, int8 or int4"))?,
                threads: a.threads,
                out: a.out.clone(),
            };
            let r = edgeprompt_bench::ttft::run(&s)?;
            eprintln!(
                "wrote {} rows to {}/ttft.json and SVG plots",
                r.rows.len(),
                a.out.display()
            );
            Ok(())
        }
        Bench::Decode(a) => {
            let s = edgeprompt_bench::decode::Settings {
                model: super::models::resolve(&a.model)?,
                sharegpt: Some(
                    super::models::models_dir().join("ShareGPT_V3_unfiltered_cleaned_split.json"),
                ),
                cloud_lens: a.cloud_lens,
                batch_sizes: a.batch_sizes,
                private_tokens: a.private_tokens,
                steps: a.steps.max(1),
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
        Bench::Engine(a) => {
            let settings = engine::Settings {
                model: super::models::resolve(&a.model)?,
                threads: a.threads,
                prompt_lens: a.prompt_lens,
                decode_tokens: a.decode_tokens,
                repeats: a.repeats,
                llama_python: a.llama_python,
                skip_candle: a.skip_candle,
            };
            let report = engine::run(&settings)?;
            println!("{}", engine::table(&report));
            std::fs::create_dir_all(&a.out)?;
            let path = a
                .out
                .join(format!("engine-{}.json", a.model.replace('/', "_")));
            std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
            eprintln!("wrote {}", path.display());
            Ok(())
        }
    }
}
