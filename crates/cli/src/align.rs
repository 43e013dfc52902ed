//! `edgeprompt align`: CE-LSLM layer matching and adapters for a cloud LLM / edge SLM pair.

use std::path::PathBuf;

use edgeprompt_align::job as align;
use edgeprompt_align::Sampling;
use edgeprompt_engine::catalog;

#[derive(clap::Args)]
pub struct AlignArgs {
    /// The cloud's large model (name or GGUF path).
    #[arg(long, default_value = "qwen15")]
    llm: String,
    /// The edge's small model (same tokenizer).
    #[arg(long, default_value = "qwen05")]
    slm: String,
    /// Calibration sequences (ShareGPT) and tokens of text in each.
    #[arg(long, default_value_t = 24)]
    sequences: usize,
    #[arg(long, default_value_t = 384)]
    seq_tokens: usize,
    /// Similarity uses every `stride`-th token after the first `skip_first` of each sequence.
    #[arg(long, default_value_t = 8)]
    stride: usize,
    #[arg(long, default_value_t = 4)]
    skip_first: usize,
    /// Eq. 16 thresholds. The edge loads a contiguous run of deep layers, and the last layers
    /// of a model pair differ most (Qwen2.5 1.5B/0.5B: CKA 0.74 for the last pair), so the
    /// defaults let every layer match and `bench lslm` measures which ones keep quality.
    #[arg(long, default_value_t = 0.7)]
    t_cka: f64,
    #[arg(long, default_value_t = 0.7)]
    t_rsa: f64,
    /// Ridge penalty relative to the mean feature energy.
    #[arg(long, default_value_t = 1e-3)]
    ridge: f64,
    /// Key-channel fractions to fit (1 = all channels; < 1 = ThinK selection, eq. 17).
    #[arg(long, value_delimiter = ',', default_value = "1,0.5")]
    key_keep: Vec<f64>,
    /// Fraction of calibration tokens held out to report each map's R².
    #[arg(long, default_value_t = 0.2)]
    held_out: f64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Adapters (safetensors), align.json and the heat maps go here.
    #[arg(long, default_value = "models/align")]
    out: PathBuf,
}

pub fn run(a: AlignArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.key_keep.iter().all(|k| *k > 0.0 && *k <= 1.0),
        "--key-keep fractions are in (0, 1]"
    );
    anyhow::ensure!(
        a.sequences > 0 && a.seq_tokens >= 16,
        "need at least one calibration sequence of 16 tokens"
    );
    let s = align::Settings {
        llm: super::models::resolve(&a.llm)?,
        slm: super::models::resolve(&a.slm)?,
        sharegpt: catalog::sharegpt()?,
        sequences: a.sequences,
        seq_tokens: a.seq_tokens,
        sampling: Sampling {
            skip_first: a.skip_first,
            stride: a.stride.max(1),
        },
        t_cka: a.t_cka,
        t_rsa: a.t_rsa,
        ridge: a.ridge,
        key_keeps: a.key_keep,
        held_out: a.held_out,
        threads: a.threads,
        out: a.out,
    };
    align::run(&s)?;
    Ok(())
}

#[derive(clap::Args)]
pub struct FuserDataArgs {
    /// The cloud's large model (name or GGUF path).
    #[arg(long, default_value = "qwen15")]
    llm: String,
    /// The edge's small model (same tokenizer).
    #[arg(long, default_value = "qwen05")]
    slm: String,
    /// Conversations in ShareGPT's format (default: the packaged ShareGPT).
    #[arg(long)]
    conversations: Option<PathBuf>,
    /// First record used. The defaults keep training data apart from calibration (the first
    /// ~1000 records) and from the held-out cases `bench lslm` scores (from record 4000).
    #[arg(long, default_value_t = 10_000)]
    first_record: usize,
    #[arg(long, default_value_t = 320)]
    cases: usize,
    #[arg(long, default_value_t = 512)]
    cloud_tokens: usize,
    #[arg(long, default_value_t = 96)]
    user_tokens: usize,
    #[arg(long, default_value_t = 96)]
    answer_tokens: usize,
    /// The large model's most likely next tokens kept per answer token (for the KL loss).
    #[arg(long, default_value_t = 64)]
    top_k: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "models/fuser/data")]
    out: PathBuf,
}

pub fn fuser_data(a: FuserDataArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.cases > 0, "--cases must be at least 1");
    anyhow::ensure!(
        (1..=1024).contains(&a.top_k),
        "--top-k is between 1 and 1024"
    );
    let machine = edgeprompt_engine::machine::start(a.threads);
    let llm = edgeprompt_engine::Model::load(&super::models::resolve(&a.llm)?)?;
    let slm = edgeprompt_engine::Model::load(&super::models::resolve(&a.slm)?)?;
    anyhow::ensure!(
        llm.cfg.vocab_size == slm.cfg.vocab_size && a.top_k < llm.cfg.vocab_size,
        "the two models' vocabularies differ"
    );
    eprintln!("{}", align::describe(&machine, &llm, &slm, a.threads));
    let s = edgeprompt_align::fuser_data::Settings {
        conversations: match a.conversations {
            Some(p) => p,
            None => catalog::sharegpt()?,
        },
        first_record: a.first_record,
        cases: a.cases,
        limits: edgeprompt_align::conversation::Limits {
            cloud_tokens: a.cloud_tokens,
            user_tokens: a.user_tokens,
            answer_tokens: a.answer_tokens,
        },
        top_k: a.top_k,
        out: a.out.clone(),
    };
    let start = std::time::Instant::now();
    let n = edgeprompt_align::fuser_data::write(&llm, &slm, &s, |done, all| {
        eprintln!(
            "  case {done}/{all} ({:.0} s)",
            start.elapsed().as_secs_f64()
        )
    })?;
    eprintln!("{n} cases in {}", a.out.display());
    Ok(())
}
