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
