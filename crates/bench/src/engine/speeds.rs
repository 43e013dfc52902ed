//! What timing an engine takes and gives, shared by ours, llama.cpp's and candle's
//! (`candle.rs`): the settings, the speeds, the best of a few runs.

use std::path::PathBuf;

use serde::Serialize;

use crate::BenchError;

#[derive(Clone)]
pub struct Settings {
    pub model: PathBuf,
    pub threads: usize,
    pub prompt_lens: Vec<usize>,
    pub decode_tokens: usize,
    pub repeats: usize,
    /// Python with `llama_cpp` installed (scripts/bench_engine.sh makes one).
    pub llama_python: Option<PathBuf>,
    pub skip_candle: bool,
    /// Context the decode runs after (default: 512, or the longest prompt if shorter).
    pub decode_at: Option<usize>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Speeds {
    /// (prompt tokens, tokens per second)
    pub prefill: Vec<(usize, f64)>,
    pub decode: f64,
    /// Peak RSS of this engine in its own process (llama.cpp only), bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// The SIMD this engine was built for (llama.cpp only, e.g. `AVX2/AVX512/AVX512_VNNI`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simd: Option<String>,
}

/// The least of `n` timings (at least one): the run the host disturbed least.
pub(super) fn best_of<F: FnMut() -> Result<f64, BenchError>>(
    n: usize,
    mut f: F,
) -> Result<f64, BenchError> {
    let mut best = f64::INFINITY;
    for _ in 0..n.max(1) {
        best = best.min(f()?);
    }
    Ok(best)
}

/// The faster of two runs, figure by figure (and the larger memory peak).
pub(super) fn best_speeds(a: Option<Speeds>, b: Speeds) -> Speeds {
    let Some(a) = a else {
        return b;
    };
    Speeds {
        prefill: a
            .prefill
            .iter()
            .zip(&b.prefill)
            .map(|(x, y)| (x.0, x.1.max(y.1)))
            .collect(),
        decode: a.decode.max(b.decode),
        rss_bytes: a.rss_bytes.max(b.rss_bytes),
        simd: a.simd.or(b.simd),
    }
}
