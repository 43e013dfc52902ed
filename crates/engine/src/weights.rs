//! Model tensors, loaded from GGUF. Matrices stay in their file's format (quantized ones
//! repacked for the packed kernels, F32/F16/BF16 as stored for the float kernels); norms and
//! biases are plain f32 (`dequant`).

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};

use std::sync::Arc;

use crate::arch::Moe;
use crate::config::ModelConfig;
use crate::dequant;
use crate::gguf::{Content, Dtype};
use crate::kernels::{Carver, FloatMatrix, Floats, Format, QMatrix, Slab};
pub(crate) use crate::linear::{Linear, Matrix};
use crate::recurrent::{DeltaNet, Recurrence, ShortConv};
use crate::{EngineError, Result};

/// A float tensor's values from its little-endian bytes (`None`: not a float type).
fn floats(dtype: Dtype, raw: &[u8]) -> Option<Floats> {
    let two = || {
        raw.chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    Some(match dtype {
        Dtype::F32 => Floats::F32(
            raw.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        Dtype::F16 => Floats::F16(two().map(half::f16::from_bits).collect()),
        Dtype::BF16 => Floats::BF16(two().map(half::bf16::from_bits).collect()),
        Dtype::Q4_0
        | Dtype::Q4_1
        | Dtype::Q5_0
        | Dtype::Q5_1
        | Dtype::Q8_0
        | Dtype::Q8_1
        | Dtype::Q2K
        | Dtype::Q3K
        | Dtype::Q4K
        | Dtype::Q5K
        | Dtype::Q6K
        | Dtype::Q8K
        | Dtype::IQ4NL
        | Dtype::IQ4XS
        | Dtype::Other(_) => return None,
    })
}

fn own_format(dtype: Dtype) -> Option<Format> {
    match dtype {
        Dtype::Q4_0 => Some(Format::Q4_0),
        Dtype::Q4_1 => Some(Format::Q4_1),
        Dtype::Q5_0 => Some(Format::Q5_0),
        Dtype::Q5_1 => Some(Format::Q5_1),
        Dtype::Q8_0 => Some(Format::Q8_0),
        Dtype::Q2K => Some(Format::Q2K),
        Dtype::Q3K => Some(Format::Q3K),
        Dtype::Q4K => Some(Format::Q4K),
        Dtype::Q5K => Some(Format::Q5K),
        Dtype::Q6K => Some(Format::Q6K),
        Dtype::IQ4NL => Some(Format::IQ4NL),
        Dtype::IQ4XS => Some(Format::IQ4XS),
        Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::Q8_1 | Dtype::Q8K | Dtype::Other(_) => None,
    }
}

/// Repacked bytes and number of the file's matrices our kernels run (a stack of experts
/// counts each expert).
fn own_matrices(content: &Content) -> (usize, usize) {
    content
        .tensor_infos
        .values()
        .filter_map(|i| {
            let f = own_format(i.dtype)?;
            match i.dims[..] {
                [n, k] => Some((QMatrix::packed_bytes(f, n, k)?, 1)),
                [e, n, k] => Some((e * QMatrix::packed_bytes(f, n, k)?, e)),
                _ => None,
            }
        })
        .fold((0, 0), |(b, c), (p, n)| (b + p, c + n))
}

/// The bytes of one tensor type in a file, and what runs its matrices.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TensorType {
    /// llama.cpp's name (`Q4_K`).
    pub name: String,
    pub bytes: usize,
    pub runs_in: String,
}

fn tensor_types(bytes: std::collections::HashMap<Dtype, usize>) -> Vec<TensorType> {
    let mut v: Vec<TensorType> = bytes
        .into_iter()
        .map(|(t, bytes)| TensorType {
            name: t.to_string(),
            bytes,
            runs_in: match (own_format(t), t) {
                (Some(_), _) => format!("packed kernels ({})", crate::kernels::LEVEL.name()),
                (None, Dtype::F32 | Dtype::F16 | Dtype::BF16) => {
                    format!("float kernels ({})", crate::kernels::LEVEL.name())
                }
                _ => "no kernel (refused at load)".into(),
            },
        })
        .collect();
    v.sort_by_key(|t| std::cmp::Reverse(t.bytes));
    v
}

pub(crate) struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub mixer: Mixer,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
    /// Norms of the attention and FFN outputs (Gemma).
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
    /// The per-layer embedding's weights (Gemma 4).
    pub per_layer: Option<crate::ple::LayerPle>,
    /// The layer's output times this (Gemma 4).
    pub out_scale: Option<f32>,
}

/// What mixes a layer's positions: attention over KV, a Gated DeltaNet's recurrence, or a
/// short convolution.
pub(crate) enum Mixer {
    Attention(Attention),
    DeltaNet(DeltaNetWeights),
    ShortConv(ShortConvWeights),
}

pub(crate) struct Attention {
    pub wq: Linear,
    /// None on a layer that attends with another's KV (Gemma 4's last layers).
    pub wk: Option<Linear>,
    /// None where K's rows serve as V (Gemma 4).
    pub wv: Option<Linear>,
    /// V rows normed (RMS) with this weight: ones (Gemma 4 norms V without one).
    pub v_norm: Option<Vec<f32>>,
    pub wo: Linear,
    /// Per-head norms of Q and K (Qwen3, Gemma 3, Qwen3.5).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// The output gate's projection (Qwen3.5: Q's second half per head).
    pub gate: Option<Linear>,
}

/// A Gated DeltaNet layer (`recurrent.rs`): Q, K and V in one projection, the output gate,
/// the write strength and decay inputs per value head, the convolution's taps, and the output.
pub(crate) struct DeltaNetWeights {
    pub qkv: Linear,
    pub z: Linear,
    pub beta: Linear,
    pub alpha: Linear,
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub a: Vec<f32>,
    pub norm: Vec<f32>,
    pub out: Linear,
}

/// LFM2's short convolution (`recurrent.rs`): B, C and X in one projection, the taps, and the
/// output.
pub(crate) struct ShortConvWeights {
    pub in_proj: Linear,
    pub conv: Vec<f32>,
    pub out: Linear,
}

impl Mixer {
    /// Every matrix it holds, in the order a token runs them.
    fn matrices(&self) -> Vec<&Linear> {
        match self {
            Mixer::Attention(a) => std::iter::once(&a.wq)
                .chain(&a.wk)
                .chain(&a.wv)
                .chain(&a.gate)
                .chain([&a.wo])
                .collect(),
            Mixer::DeltaNet(x) => vec![&x.qkv, &x.z, &x.beta, &x.alpha, &x.out],
            Mixer::ShortConv(x) => vec![&x.in_proj, &x.out],
        }
    }
}

/// A layer's feed-forward block: the gated MLP, or a mixture of experts in its place.
pub(crate) enum Ffn {
    Dense {
        gate: Linear,
        up: Linear,
        down: Linear,
    },
    Experts(Experts),
}

impl Ffn {
    /// Every matrix it holds.
    fn matrices(&self) -> Vec<&Linear> {
        match self {
            Ffn::Dense { gate, up, down } => vec![gate, up, down],
            Ffn::Experts(x) => std::iter::once(&x.router)
                .chain(&x.gate)
                .chain(&x.up)
                .chain(&x.down)
                .chain(
                    x.shared
                        .iter()
                        .flat_map(|s| [&s.gate_inp, &s.gate, &s.up, &s.down]),
                )
                .collect(),
        }
    }
}

/// One layer's experts: the router, each expert's gate, up and down, and the shared expert.
pub(crate) struct Experts {
    /// Experts each row runs.
    pub used: usize,
    pub router: Linear,
    pub gate: Vec<Linear>,
    pub up: Vec<Linear>,
    pub down: Vec<Linear>,
    pub shared: Option<SharedExpert>,
}

/// The expert every row runs besides its routed ones (Qwen3.5-MoE): a gated MLP whose output
/// is scaled by `sigmoid(gate_inp . row)`.
pub(crate) struct SharedExpert {
    /// One output: the row's gate logit.
    pub gate_inp: Linear,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

pub(crate) struct Weights {
    /// Per-frequency RoPE divisors (Llama 3's `rope_freqs`, Phi's short LongRoPE factors).
    pub rope_factors: Option<Vec<f32>>,
    pub token_embd: Arc<Matrix>,
    /// Gemma 4's per-layer embeddings.
    pub per_layer: Option<crate::ple::PerLayer>,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    pub output: Linear,
    pub tied_output: bool,
    /// Per tensor type: its bytes and what runs it, for reporting.
    pub type_bytes: Vec<TensorType>,
}

struct Loader<'a> {
    content: &'a Content,
    reader: BufReader<File>,
    /// One mapping for every matrix our kernels run, carved in load order (`kernels::arena`).
    carver: Carver,
    type_bytes: std::collections::HashMap<Dtype, usize>,
}

/// A matrix of a float type from its bytes; any other type is one no kernel runs.
fn float_matrix(name: &str, dtype: Dtype, raw: &[u8], n: usize, k: usize) -> Result<Matrix> {
    floats(dtype, raw)
        .and_then(|w| FloatMatrix::new(w, n, k))
        .map(Matrix::Float)
        .ok_or_else(|| {
            EngineError::Unsupported(format!(
                "tensor {name}: {dtype} [{n}, {k}] is not a matrix this engine runs"
            ))
        })
}

impl Loader<'_> {
    /// A tensor's bytes as the file stores them, in a format `dequant` expands.
    fn raw(&mut self, name: &str) -> Result<(Dtype, Vec<u8>)> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| EngineError::Gguf(format!("missing tensor {name}")))?;
        if !dequant::runs(info.dtype) {
            return Err(EngineError::Unsupported(format!(
                "tensor {name} is in {}, a format this engine does not run (it runs F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K, IQ4_NL and IQ4_XS)",
                info.dtype
            )));
        }
        // The header checked that the tensor lies inside the file.
        let bytes = info
            .elements()
            .and_then(|n| info.dtype.bytes(n))
            .ok_or_else(|| EngineError::Gguf(format!("tensor {name}: bad size")))?;
        let mut raw = vec![0u8; bytes];
        self.reader
            .seek(SeekFrom::Start(
                self.content.tensor_data_offset + info.offset,
            ))
            .and_then(|_| self.reader.read_exact(&mut raw))
            .map_err(|e| EngineError::Gguf(format!("tensor {name}: {e}")))?;
        *self.type_bytes.entry(info.dtype).or_default() += bytes;
        Ok((info.dtype, raw))
    }

    /// A weight matrix. Formats our kernels run are read straight from the file into their
    /// final buffer (one copy of the weights in memory); others are kept as stored.
    fn matrix(&mut self, name: &str) -> Result<Matrix> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| EngineError::Gguf(format!("missing tensor {name}")))?;
        if let (Some(f), Some((n, k))) = (own_format(info.dtype), info.dims2()) {
            let bad = || EngineError::Gguf(format!("tensor {name}: bad size"));
            let bytes = QMatrix::gguf_bytes(f, n, k).ok_or_else(bad)?;
            let packed = QMatrix::packed_bytes(f, n, k).ok_or_else(bad)?;
            let start = self.content.tensor_data_offset + info.offset;
            let mut slab = match self.carver.take(packed) {
                Some(slab) => slab,
                None => {
                    Slab::alone(packed).map_err(|e| EngineError::Gguf(format!("{name}: {e}")))?
                }
            };
            self.reader
                .seek(SeekFrom::Start(start))
                .and_then(|_| self.reader.read_exact(&mut slab[..bytes]))
                .map_err(|e| EngineError::Gguf(format!("tensor {name}: {e}")))?;
            *self.type_bytes.entry(info.dtype).or_default() += bytes;
            return QMatrix::from_gguf(f, n, k, slab)
                .map(Matrix::Own)
                .ok_or_else(bad);
        }
        let Some((n, k)) = info.dims2() else {
            return Err(EngineError::Gguf(format!(
                "tensor {name}: {:?} is not a matrix",
                info.dims
            )));
        };
        let (dtype, raw) = self.raw(name)?;
        float_matrix(name, dtype, &raw, n, k)
    }

    /// Rows `first..first + n` of matrix `e` of the stack `name` (its `k` columns), read
    /// alone: one of fused Q/K/V, gate/up, or one expert of a stack. Rows of a quantized
    /// matrix are whole blocks, so the cut is exact.
    fn rows(&mut self, name: &str, e: usize, first: usize, n: usize) -> Result<Matrix> {
        self.gather(name, e, &[(first, n)])
    }

    /// The row ranges `(first, n)` of matrix `e` of the stack `name`, in that order, as one
    /// matrix (Qwen3.5's Q rows, interleaved per head with its gate's).
    fn gather(&mut self, name: &str, e: usize, ranges: &[(usize, usize)]) -> Result<Matrix> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| EngineError::Gguf(format!("missing tensor {name}")))?;
        let n: usize = ranges.iter().map(|r| r.1).sum();
        let bad = || EngineError::Gguf(format!("tensor {name}: {n} rows of matrix {e}"));
        let (stack, rows, k) = match info.dims[..] {
            // A vector is a matrix of one row (Qwen3.5-MoE's shared expert gate).
            [k] => (1, 1, k),
            [rows, k] => (1, rows, k),
            [stack, rows, k] => (stack, rows, k),
            _ => return Err(bad()),
        };
        if e >= stack || ranges.iter().any(|&(f, m)| f + m > rows) {
            return Err(bad());
        }
        let dtype = info.dtype;
        let base = self.content.tensor_data_offset + info.offset;
        let own = own_format(dtype);
        let row_bytes = match own {
            Some(f) => QMatrix::gguf_bytes(f, 1, k),
            None if dequant::runs(dtype) => dtype.bytes(k),
            None => {
                return Err(EngineError::Unsupported(format!(
                    "tensor {name} is in {dtype}, a format this engine does not run"
                )))
            }
        }
        .ok_or_else(bad)?;
        let mut read = |into: &mut [u8]| -> Result<()> {
            let mut at = 0;
            for &(first, m) in ranges {
                let start = base + ((e * rows + first) * row_bytes) as u64;
                let len = m * row_bytes;
                self.reader
                    .seek(SeekFrom::Start(start))
                    .and_then(|_| self.reader.read_exact(&mut into[at..at + len]))
                    .map_err(|e| EngineError::Gguf(format!("tensor {name}: {e}")))?;
                at += len;
            }
            Ok(())
        };
        let bytes = n * row_bytes;
        let Some(f) = own else {
            let mut raw = vec![0u8; bytes];
            read(&mut raw)?;
            *self.type_bytes.entry(dtype).or_default() += bytes;
            return float_matrix(name, dtype, &raw, n, k);
        };
        let packed = QMatrix::packed_bytes(f, n, k).ok_or_else(bad)?;
        let mut slab = match self.carver.take(packed) {
            Some(slab) => slab,
            None => Slab::alone(packed).map_err(|e| EngineError::Gguf(format!("{name}: {e}")))?,
        };
        read(&mut slab[..bytes])?;
        *self.type_bytes.entry(dtype).or_default() += bytes;
        QMatrix::from_gguf(f, n, k, slab)
            .map(Matrix::Own)
            .ok_or_else(bad)
    }

    /// `rows`, as a projection from `in_dim` to `out_dim`.
    fn linear_rows(
        &mut self,
        name: &str,
        e: usize,
        first: usize,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Linear> {
        let w = self.rows(name, e, first, out_dim)?;
        if w.dims() != (out_dim, in_dim) {
            return Err(EngineError::Gguf(format!(
                "{name} has rows of {} values, expected {in_dim}",
                w.dims().1
            )));
        }
        Ok(Linear {
            weight: Arc::new(w),
            bias: None,
            out_dim,
            in_dim,
        })
    }

    /// An attention layer's weights: Q, K and V (fused in one matrix for Phi), the output,
    /// Q/K norms, and Qwen3.5's output gate (each head's Q rows followed by its gate's).
    fn attention(&mut self, p: &str, cfg: &ModelConfig, l: usize) -> Result<Attention> {
        let f = &cfg.features;
        let d = cfg.n_embd;
        let hd = cfg.head_dim_of(l);
        let (qd, kv) = (cfg.n_head * hd, cfg.n_kv_head * hd);
        let (wq, gate) = if f.attn_gate {
            let name = format!("{p}.attn_q.weight");
            let half = |off: usize| -> Vec<(usize, usize)> {
                (0..cfg.n_head).map(|h| (2 * h * hd + off, hd)).collect()
            };
            let q = self.gather(&name, 0, &half(0))?;
            let g = self.gather(&name, 0, &half(hd))?;
            let lin = |w: Matrix| -> Result<Linear> {
                if w.dims() != (qd, d) {
                    return Err(EngineError::Gguf(format!(
                        "{name} has rows of {} values, expected {d}",
                        w.dims().1
                    )));
                }
                Ok(Linear {
                    weight: Arc::new(w),
                    bias: None,
                    out_dim: qd,
                    in_dim: d,
                })
            };
            (lin(q)?, Some(lin(g)?))
        } else if f.fused {
            let qkv = format!("{p}.attn_qkv.weight");
            (self.linear_rows(&qkv, 0, 0, qd, d)?, None)
        } else {
            (
                self.linear(&format!("{p}.attn_q"), f.qkv_bias, d, qd)?,
                None,
            )
        };
        let owns = cfg.owns_kv(l);
        let (wk, wv) = if !owns {
            (None, None)
        } else if f.fused {
            let qkv = format!("{p}.attn_qkv.weight");
            (
                Some(self.linear_rows(&qkv, 0, qd, kv, d)?),
                Some(self.linear_rows(&qkv, 0, qd + kv, kv, d)?),
            )
        } else {
            let v = format!("{p}.attn_v");
            // Gemma 4 may have no V projection: K's rows serve as V.
            let wv = match f.v_norm && !self.has(&format!("{v}.weight")) {
                true => None,
                false => Some(self.linear(&v, f.qkv_bias, d, kv)?),
            };
            (
                Some(self.linear(&format!("{p}.attn_k"), f.qkv_bias, d, kv)?),
                wv,
            )
        };
        let mut norm = |name: &str, on: bool| -> Result<Option<Vec<f32>>> {
            on.then(|| self.vector(&format!("{p}.{name}.weight"), hd))
                .transpose()
        };
        Ok(Attention {
            q_norm: norm("attn_q_norm", f.qk_norm)?,
            k_norm: norm("attn_k_norm", f.qk_norm && owns)?,
            v_norm: (f.v_norm && owns).then(|| vec![1.0; hd]),
            wq,
            wk,
            wv,
            wo: self.linear(&format!("{p}.attn_output"), false, qd, d)?,
            gate,
        })
    }

    /// A Gated DeltaNet layer's weights (llama.cpp's names), every size checked against `s`.
    fn delta_net(&mut self, p: &str, s: &DeltaNet, d: usize) -> Result<DeltaNetWeights> {
        let conv = self.taps(
            &format!("{p}.ssm_conv1d.weight"),
            s.conv_dim(),
            s.conv_kernel,
        )?;
        Ok(DeltaNetWeights {
            qkv: self.linear(&format!("{p}.attn_qkv"), false, d, s.conv_dim())?,
            z: self.linear(&format!("{p}.attn_gate"), false, d, s.value_dim())?,
            beta: self.linear(&format!("{p}.ssm_beta"), false, d, s.v_heads)?,
            alpha: self.linear(&format!("{p}.ssm_alpha"), false, d, s.v_heads)?,
            conv,
            dt_bias: self.vector(&format!("{p}.ssm_dt.bias"), s.v_heads)?,
            a: self.vector(&format!("{p}.ssm_a"), s.v_heads)?,
            norm: self.vector(&format!("{p}.ssm_norm.weight"), s.head_dim)?,
            out: self.linear(&format!("{p}.ssm_out"), false, s.value_dim(), d)?,
        })
    }

    /// An LFM2 short-convolution layer's weights (llama.cpp's names).
    fn short_conv(&mut self, p: &str, s: &ShortConv, d: usize) -> Result<ShortConvWeights> {
        Ok(ShortConvWeights {
            in_proj: self.linear(&format!("{p}.shortconv.in_proj"), false, d, 3 * s.width)?,
            conv: self.taps(&format!("{p}.shortconv.conv.weight"), s.width, s.kernel)?,
            out: self.linear(&format!("{p}.shortconv.out_proj"), false, s.width, d)?,
        })
    }

    /// A depthwise convolution's `k` taps over `c` channels: stored per channel (its taps
    /// together), kept tap by tap, each tap over every channel, the order the convolution
    /// reads them in.
    fn taps(&mut self, name: &str, c: usize, k: usize) -> Result<Vec<f32>> {
        let stored = self.vector(name, c * k)?;
        Ok((0..k)
            .flat_map(|i| stored.iter().skip(i).step_by(k).copied())
            .collect())
    }

    /// A layer's experts: gate and up stacked apart, or in one stack (each expert's gate rows,
    /// then its up rows); and the shared expert when the family has one.
    fn experts(&mut self, p: &str, moe: &Moe, d: usize) -> Result<Experts> {
        let ff = moe.n_ff;
        let fused = format!("{p}.ffn_gate_up_exps.weight");
        let (gate_name, up_name, up_first) = if self.has(&fused) {
            (fused.clone(), fused, ff)
        } else {
            let name = |part| format!("{p}.ffn_{part}_exps.weight");
            (name("gate"), name("up"), 0)
        };
        let mut stack = |name: &str, first: usize, out: usize, inp: usize| {
            (0..moe.count)
                .map(|e| self.linear_rows(name, e, first, out, inp))
                .collect::<Result<Vec<_>>>()
        };
        let gate = stack(&gate_name, 0, ff, d)?;
        let up = stack(&up_name, up_first, ff, d)?;
        let down = stack(&format!("{p}.ffn_down_exps.weight"), 0, d, ff)?;
        let shared = match moe.shared_n_ff {
            Some(sf) => Some(SharedExpert {
                gate_inp: self.linear_rows(
                    &format!("{p}.ffn_gate_inp_shexp.weight"),
                    0,
                    0,
                    1,
                    d,
                )?,
                gate: self.linear(&format!("{p}.ffn_gate_shexp"), false, d, sf)?,
                up: self.linear(&format!("{p}.ffn_up_shexp"), false, d, sf)?,
                down: self.linear(&format!("{p}.ffn_down_shexp"), false, sf, d)?,
            }),
            None => None,
        };
        Ok(Experts {
            used: moe.used,
            router: self.linear(&format!("{p}.ffn_gate_inp"), false, d, moe.count)?,
            gate,
            up,
            down,
            shared,
        })
    }

    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        let (dtype, raw) = self.raw(name)?;
        let have =
            raw.len() / dtype.block().map_or(1, |(_, b)| b) * dtype.block().map_or(1, |(p, _)| p);
        if have != len {
            return Err(EngineError::Gguf(format!(
                "{name} has {have} values, expected {len}"
            )));
        }
        let mut v = vec![0f32; len];
        dequant::row(dtype, &raw, &mut v)?;
        Ok(v)
    }

    fn linear(&mut self, name: &str, bias: bool, in_dim: usize, out_dim: usize) -> Result<Linear> {
        let w = self.matrix(&format!("{name}.weight"))?;
        let dims = w.dims();
        if dims != (out_dim, in_dim) {
            return Err(EngineError::Gguf(format!(
                "{name}.weight has shape {dims:?}, expected ({out_dim}, {in_dim})"
            )));
        }
        let bias = if bias {
            Some(self.vector(&format!("{name}.bias"), out_dim)?)
        } else {
            None
        };
        Ok(Linear {
            weight: Arc::new(w),
            bias,
            out_dim,
            in_dim,
        })
    }
}

impl Weights {
    pub fn load(content: &Content, path: &std::path::Path, cfg: &ModelConfig) -> Result<Self> {
        let file = File::open(path).map_err(|source| EngineError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let (bytes, count) = own_matrices(content);
        let carver = Carver::new(bytes, count).map_err(|source| EngineError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let mut ld = Loader {
            content,
            reader: BufReader::new(file),
            carver,
            type_bytes: Default::default(),
        };
        let d = cfg.n_embd;
        let f = &cfg.features;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for l in 0..cfg.n_layer {
            let p = format!("blk.{l}");
            let mut norm = |on: bool, name: &str, len: usize| -> Result<Option<Vec<f32>>> {
                on.then(|| ld.vector(&format!("{p}.{name}.weight"), len))
                    .transpose()
            };
            let post_attn_norm = norm(f.post_norms, "post_attention_norm", d)?;
            let post_ffn_norm = norm(f.post_norms, "post_ffw_norm", d)?;
            let mixer = match (cfg.is_recurrent(l), &f.recurrence) {
                (true, Some(Recurrence::DeltaNet(shape))) => {
                    Mixer::DeltaNet(ld.delta_net(&p, shape, d)?)
                }
                (true, Some(Recurrence::ShortConv(shape))) => {
                    Mixer::ShortConv(ld.short_conv(&p, shape, d)?)
                }
                (true, None) => {
                    return Err(EngineError::Gguf(format!(
                        "layer {l} is recurrent in a family without recurrent layers"
                    )))
                }
                (false, _) => Mixer::Attention(ld.attention(&p, cfg, l)?),
            };
            let n_ff = cfg.n_ff_of(l);
            let ffn = match &f.moe {
                Some(moe) => Ffn::Experts(ld.experts(&p, moe, d)?),
                // Phi's gate and up in one matrix: gate the first half of its rows.
                None if f.fused => {
                    let up = format!("{p}.ffn_up.weight");
                    Ffn::Dense {
                        gate: ld.linear_rows(&up, 0, 0, n_ff, d)?,
                        up: ld.linear_rows(&up, 0, n_ff, n_ff, d)?,
                        down: ld.linear(&format!("{p}.ffn_down"), false, n_ff, d)?,
                    }
                }
                None => Ffn::Dense {
                    gate: ld.linear(&format!("{p}.ffn_gate"), false, d, n_ff)?,
                    up: ld.linear(&format!("{p}.ffn_up"), false, d, n_ff)?,
                    down: ld.linear(&format!("{p}.ffn_down"), false, n_ff, d)?,
                },
            };
            let ple = f.per_layer_embd;
            let per_layer = match ple {
                0 => None,
                _ => Some(crate::ple::LayerPle {
                    gate: ld.linear(&format!("{p}.inp_gate"), false, d, ple)?,
                    proj: ld.linear(&format!("{p}.proj"), false, ple, d)?,
                    post_norm: ld.vector(&format!("{p}.post_norm.weight"), d)?,
                }),
            };
            let scale = format!("{p}.layer_output_scale.weight");
            let out_scale = match ld.has(&scale) {
                true => Some(ld.vector(&scale, 1)?[0]),
                false => None,
            };
            layers.push(LayerWeights {
                attn_norm: ld.vector(&format!("{p}.attn_norm.weight"), d)?,
                mixer,
                ffn_norm: ld.vector(&format!("{p}.{}.weight", f.ffn_norm), d)?,
                ffn,
                post_attn_norm,
                post_ffn_norm,
                per_layer,
                out_scale,
            });
        }
        let per_layer = match f.per_layer_embd {
            0 => None,
            ple => {
                let name = "per_layer_model_proj.weight";
                let proj = (0..cfg.n_layer)
                    .map(|l| ld.linear_rows(name, 0, l * ple, ple, d))
                    .collect::<Result<Vec<_>>>()?;
                Some(crate::ple::PerLayer {
                    table: crate::ple::Table::map(
                        content,
                        ld.reader.get_ref(),
                        "per_layer_token_embd.weight",
                        cfg.n_layer,
                        ple,
                    )?,
                    proj,
                    proj_norm: ld.vector("per_layer_proj_norm.weight", ple)?,
                })
            }
        };
        // Llama 3's divisors, or Phi's short LongRoPE factors (contexts here stay within the
        // original length, where llama.cpp takes the short ones too).
        let half = f.rope_dims / 2;
        let rope_factors = ["rope_freqs.weight", "rope_factors_short.weight"]
            .into_iter()
            .find(|n| ld.has(n))
            .map(|n| ld.vector(n, half))
            .transpose()?;
        let output_norm = ld.vector(&format!("{}.weight", f.output_norm), d)?;
        let token_embd = Arc::new(ld.matrix("token_embd.weight")?);
        let tied_output = !ld.has("output.weight");
        // Every token id the tokenizer can produce has its row (exactly one per id when the
        // embedding is also the head).
        let (rows, width) = token_embd.dims();
        if width != d || rows < cfg.vocab_size || (tied_output && rows != cfg.vocab_size) {
            return Err(EngineError::Gguf(format!(
                "token_embd.weight has shape {:?}, expected ({}, {d})",
                token_embd.dims(),
                cfg.vocab_size
            )));
        }
        let output = if tied_output {
            // Tied head: the embedding matrix is the output projection, shared, not copied.
            Linear {
                weight: token_embd.clone(),
                bias: None,
                out_dim: cfg.vocab_size,
                in_dim: d,
            }
        } else {
            ld.linear("output", false, d, cfg.vocab_size)?
        };
        Ok(Self {
            rope_factors,
            token_embd,
            per_layer,
            layers,
            output_norm,
            output,
            tied_output,
            type_bytes: tensor_types(ld.type_bytes),
        })
    }

    /// Weight bytes one token's decode step reads (every layer matrix, of a layer with
    /// experts the router and as many experts as a token uses, and the output head) and the
    /// multiply-adds of one token through the layers (the head runs once per prompt).
    pub fn traffic(&self) -> (usize, usize) {
        let size = |l: &Linear| l.weight.bytes();
        let mut bytes = size(&self.output);
        for l in self.per_layer.iter().flat_map(|p| &p.proj) {
            bytes += size(l);
        }
        let mut macs = 0;
        for w in &self.layers {
            let mut run = |l: &Linear, times: usize| {
                bytes += size(l) * times;
                macs += l.in_dim * l.out_dim * times;
            };
            for l in w.mixer.matrices() {
                run(l, 1);
            }
            for l in w.per_layer.iter().flat_map(|p| p.matrices()) {
                run(l, 1);
            }
            match &w.ffn {
                Ffn::Dense { gate, up, down } => {
                    [gate, up, down].into_iter().for_each(|l| run(l, 1))
                }
                Ffn::Experts(x) => {
                    run(&x.router, 1);
                    for l in [&x.gate[0], &x.up[0], &x.down[0]] {
                        run(l, x.used);
                    }
                    if let Some(s) = &x.shared {
                        [&s.gate_inp, &s.gate, &s.up, &s.down]
                            .into_iter()
                            .for_each(|l| run(l, 1));
                    }
                }
            }
        }
        (bytes, macs)
    }

    /// Bytes every weight matrix holds in memory as the kernels read it (repacked), the
    /// embedding counted once when the head shares it.
    pub fn resident_bytes(&self) -> usize {
        let size = |l: &Linear| l.weight.bytes();
        let embd = if self.tied_output {
            0
        } else {
            self.token_embd.bytes()
        };
        let layers: usize = self
            .layers
            .iter()
            .flat_map(|w| {
                let ple = w.per_layer.iter().flat_map(|p| p.matrices());
                w.mixer
                    .matrices()
                    .into_iter()
                    .chain(w.ffn.matrices())
                    .chain(ple)
            })
            .map(size)
            .sum();
        let ple = self.per_layer.as_ref().map_or(0, |p| p.bytes());
        size(&self.output) + embd + layers + ple
    }

    /// Embedding rows for `ids`, dequantized.
    pub fn embed(&self, ids: &[u32], vocab: usize) -> Result<Vec<f32>> {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::Input(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        self.token_embd.rows(ids)
    }
}
