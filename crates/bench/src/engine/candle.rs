//! candle's stock quantized models as a second baseline of `edgeprompt-bench engine`, built
//! with `--features candle` (scripts/bench_engine.sh does): candle and its GEMMs double the
//! bench's compile time, so the test suite leaves them out.

use std::path::Path;
use std::time::Instant;

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use candle_transformers::models::{quantized_gemma3, quantized_llama, quantized_qwen2};
use edgeprompt_engine::Arch;

use super::speeds::{best_of, Settings, Speeds};
use crate::BenchError;

enum CandleModel {
    Llama(quantized_llama::ModelWeights),
    Qwen2(quantized_qwen2::ModelWeights),
    Gemma3(quantized_gemma3::ModelWeights),
}

impl CandleModel {
    fn load(path: &Path, arch: Arch) -> Result<Self, BenchError> {
        let mut f = std::fs::File::open(path)?;
        let ct = gguf_file::Content::read(&mut f)?;
        Ok(match arch {
            Arch::Llama => Self::Llama(quantized_llama::ModelWeights::from_gguf(
                ct,
                &mut f,
                &Device::Cpu,
            )?),
            Arch::Qwen2 => Self::Qwen2(quantized_qwen2::ModelWeights::from_gguf(
                ct,
                &mut f,
                &Device::Cpu,
            )?),
            Arch::Gemma3 => Self::Gemma3(quantized_gemma3::ModelWeights::from_gguf(
                ct,
                &mut f,
                &Device::Cpu,
            )?),
            other => {
                return Err(BenchError::Data(format!(
                    "candle-transformers has no {other:?} model to compare with"
                )))
            }
        })
    }

    /// Run `ids` at positions `pos..`; position 0 resets the model's cache.
    fn forward(&mut self, ids: &[u32], pos: usize) -> Result<(), BenchError> {
        let x = Tensor::new(ids, &Device::Cpu)?.unsqueeze(0)?;
        let y = match self {
            Self::Llama(m) => m.forward(&x, pos)?,
            Self::Gemma3(m) => m.forward(&x, pos)?,
            Self::Qwen2(m) => m.forward(&x, pos)?,
        };
        y.to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(())
    }
}

pub fn time(
    path: &Path,
    arch: Arch,
    ids: &[u32],
    s: &Settings,
    ctx: usize,
) -> Result<Speeds, BenchError> {
    let mut m = CandleModel::load(path, arch)?;
    let mut out = Speeds::default();
    for &n in &s.prompt_lens {
        let secs = best_of(s.repeats, || {
            let t = Instant::now();
            for (c, chunk) in ids[..n].chunks(512).enumerate() {
                m.forward(chunk, c * 512)?;
            }
            Ok(t.elapsed().as_secs_f64())
        })?;
        out.prefill.push((n, n as f64 / secs));
        eprintln!("  candle   prefill {n:5}: {:8.1} tok/s", n as f64 / secs);
    }
    let per_tok = best_of(s.repeats, || {
        for (c, chunk) in ids[..ctx].chunks(512).enumerate() {
            m.forward(chunk, c * 512)?;
        }
        let t = Instant::now();
        for i in 0..s.decode_tokens {
            m.forward(&ids[ctx + i..ctx + i + 1], ctx + i)?;
        }
        Ok(t.elapsed().as_secs_f64() / s.decode_tokens as f64)
    })?;
    out.decode = 1.0 / per_tok;
    eprintln!("  candle   decode @{ctx}: {:8.1} tok/s", out.decode);
    Ok(out)
}
