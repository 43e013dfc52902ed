//! `edgeprompt bench ...`: benchmarks that print their machine, settings and baselines.

use std::path::PathBuf;

use edgeprompt_bench::engine;

#[derive(clap::Subcommand)]
pub enum Bench {
    /// Engine prefill/decode tok/s vs candle's stock quantized model and llama.cpp.
    Engine(EngineArgs),
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
