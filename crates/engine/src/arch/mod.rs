//! The model families the engine runs, one small file each: how a family reads its GGUF
//! metadata and what its layers do differently. The forward pass (`model.rs`), the split
//! attention, the KV layout and streaming are one and the same for all of them; a family only
//! sets the knobs below (`Features`), which is why the cloud/edge split, the exact merge, the
//! sliding-window cut and CE-LSLM work for every one.

mod gemma;
mod gemma4;
mod granite;
mod lfm2;
mod llama;
mod phi3;
mod qwen;
mod qwen35;
mod smollm3;

use crate::gguf::{Content, Value};

use crate::gguf::{meta_f32, meta_usize};
use crate::{EngineError, Result};

/// How RoPE pairs dimensions. GGUF llama weights are permuted by the converter so that
/// adjacent pairs rotate; qwen2 keeps the NEOX layout (dimension i pairs with i + d/2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RopeStyle {
    Adjacent,
    Neox,
}

/// The families, by the name GGUF gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Qwen35,
    Qwen35Moe,
    Phi3,
    SmolLm3,
    Gemma2,
    Gemma3,
    Gemma4,
    Granite,
    Lfm2,
}

/// Every architecture name this engine loads, for the error that names the rest.
pub const SUPPORTED: &str =
    "llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe, phi3, smollm3, gemma2, gemma3, gemma4, granite,
     lfm2";

impl Arch {
    pub fn from_name(name: &str) -> Result<Self> {
        Ok(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "qwen3moe" => Arch::Qwen3Moe,
            "qwen35" => Arch::Qwen35,
            "qwen35moe" => Arch::Qwen35Moe,
            "phi3" => Arch::Phi3,
            "smollm3" => Arch::SmolLm3,
            "gemma2" => Arch::Gemma2,
            "gemma3" => Arch::Gemma3,
            "gemma4" => Arch::Gemma4,
            "granite" => Arch::Granite,
            "lfm2" => Arch::Lfm2,
            other => {
                return Err(EngineError::Unsupported(format!(
                    "architecture {other:?} (supported: {SUPPORTED})"
                )))
            }
        })
    }
}

/// A mixture of experts in place of the dense FFN (Qwen3-MoE): each row's `used` experts of
/// `count`, chosen by a softmax router, their weights renormalised to sum to one.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Moe {
    pub count: usize,
    pub used: usize,
    /// Hidden width of one expert.
    pub n_ff: usize,
    /// Hidden width of the shared expert every row also runs, its output scaled by a sigmoid
    /// gate of the row (Qwen3.5-MoE), when the layers have one.
    pub shared_n_ff: Option<usize>,
}

/// What a family's layers do beyond the plain pre-norm transformer with SiLU-gated FFN and
/// RoPE on every dimension of every layer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Features {
    pub rope_style: RopeStyle,
    /// Biases on Q, K and V (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMS norms of Q and K (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Norms of the attention and FFN outputs before the residual add (Gemma).
    pub post_norms: bool,
    /// GELU (tanh) instead of SiLU in the gated FFN (Gemma).
    pub gelu: bool,
    /// Q, K and V in one matrix, gate and up in one (Phi-3).
    pub fused: bool,
    /// Embeddings times this (Gemma: sqrt(width); Granite: its embedding multiplier).
    pub embed_scale: f32,
    /// Each layer's attention and FFN output times this before the residual add (Granite).
    pub residual_scale: f32,
    /// Scores are `q.k * attn_scale` (default 1/sqrt(head_dim); Granite sets its own).
    pub attn_scale: f32,
    /// Logits times this (Granite divides by its logit scale).
    pub logit_scale: f32,
    /// Scores soft-capped: `cap * tanh(s / cap)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits soft-capped likewise (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Dimensions of each head RoPE rotates (Phi-4-mini: 3/4 of them); the rest pass through.
    pub rope_dims: usize,
    /// The rotated values times this (LongRoPE's attention factor).
    pub rope_attn_factor: f32,
    /// Every this many layers, one without RoPE (SmolLM3: layers 3, 7, 11, ...).
    pub no_rope_every: Option<usize>,
    /// Every this many layers, one global; the others attend through the sliding window
    /// (Gemma 3: 6, Gemma 2: 2).
    pub window_pattern: usize,
    /// The sliding layers' RoPE base when the GGUF names none (Gemma 3: 10 000; otherwise
    /// the global base).
    pub window_rope_base: Option<f32>,
    pub moe: Option<Moe>,
    /// Q projected twice as wide, its second half per head a sigmoid gate on the attention
    /// output (Qwen3.5).
    pub attn_gate: bool,
    /// The name of the norm before the FFN (`ffn_norm`; Qwen3.5: `post_attention_norm`).
    pub ffn_norm: &'static str,
    /// The name of the norm before the head (`output_norm`; LFM2: `token_embd_norm`).
    pub output_norm: &'static str,
    /// What the recurrent layers of a hybrid are (Qwen3.5: Gated DeltaNet; LFM2: short
    /// convolutions); which layers they are is `ModelConfig::recurrent`.
    pub recurrence: Option<crate::recurrent::Recurrence>,
    /// V rows normed (RMS, no weight) before they are cached (Gemma 4).
    pub v_norm: bool,
    /// Values per layer of each token's per-layer embedding (Gemma 4's PLE); 0: none.
    pub per_layer_embd: usize,
}

impl Features {
    /// The plain transformer: Llama's.
    pub fn plain(head_dim: usize) -> Self {
        Self {
            rope_style: RopeStyle::Adjacent,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            gelu: false,
            fused: false,
            embed_scale: 1.0,
            residual_scale: 1.0,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            logit_scale: 1.0,
            attn_softcap: None,
            final_softcap: None,
            rope_dims: head_dim,
            rope_attn_factor: 1.0,
            no_rope_every: None,
            window_pattern: 0,
            window_rope_base: None,
            moe: None,
            attn_gate: false,
            ffn_norm: "ffn_norm",
            output_norm: "output_norm",
            recurrence: None,
            v_norm: false,
            per_layer_embd: 0,
        }
    }

    /// Whether layer `l` rotates its queries and keys.
    pub fn ropes(&self, l: usize) -> bool {
        self.no_rope_every
            .is_none_or(|n| !(l + 1).is_multiple_of(n))
    }
}

/// A GGUF's metadata under its architecture's prefix.
pub struct Meta<'a> {
    pub content: &'a Content,
    pub arch: &'a str,
}

impl Meta<'_> {
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    pub fn usize(&self, k: &str) -> Result<usize> {
        meta_usize(self.content, &self.key(k))
    }

    pub fn f32(&self, k: &str) -> Option<f32> {
        meta_f32(self.content, &self.key(k)).ok()
    }

    /// Whether the file holds a tensor of this name.
    pub fn has(&self, tensor: &str) -> bool {
        self.content.tensor_infos.contains_key(tensor)
    }

    /// A per-layer list of counts (`None` when the key is absent or one number).
    pub fn counts(&self, k: &str) -> Result<Option<Vec<usize>>> {
        match self.content.metadata.get(&self.key(k)) {
            Some(Value::Array(v)) => v
                .iter()
                .map(|x| x.to_u32().map(|n| n as usize))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| EngineError::Gguf(format!("{k}: not counts"))),
            _ => Ok(None),
        }
    }
}

/// The features of `arch` for a model whose heads are `head_dim` wide.
pub fn features(arch: Arch, m: &Meta, head_dim: usize, n_embd: usize) -> Result<Features> {
    let plain = Features::plain(head_dim);
    Ok(match arch {
        Arch::Llama => llama::features(plain),
        Arch::Qwen2 => qwen::qwen2(plain),
        Arch::Qwen3 => qwen::qwen3(plain),
        Arch::Qwen3Moe => qwen::qwen3moe(plain, m)?,
        Arch::Qwen35 => qwen35::features(plain, m, head_dim)?,
        Arch::Qwen35Moe => qwen35::moe(plain, m, head_dim)?,
        Arch::Phi3 => phi3::features(plain, m, head_dim)?,
        Arch::SmolLm3 => smollm3::features(plain),
        Arch::Gemma2 => gemma::gemma2(plain, m, n_embd),
        Arch::Gemma3 => gemma::gemma3(plain, n_embd),
        Arch::Gemma4 => gemma4::features(plain, m, n_embd)?,
        Arch::Granite => granite::features(plain, m),
        Arch::Lfm2 => lfm2::features(plain, m, n_embd)?,
    })
}

/// Per layer (of the first `n_layer`): whether it is recurrent, in a family with recurrent
/// layers (`features.recurrence`); all attention otherwise.
pub fn recurrent_layers(arch: Arch, m: &Meta, n_layer: usize) -> Result<Vec<bool>> {
    match arch {
        Arch::Qwen35 | Arch::Qwen35Moe => qwen35::recurrent_layers(m, n_layer),
        Arch::Lfm2 => lfm2::recurrent_layers(m, n_layer),
        Arch::Llama
        | Arch::Qwen2
        | Arch::Qwen3
        | Arch::Qwen3Moe
        | Arch::Phi3
        | Arch::SmolLm3
        | Arch::Gemma2
        | Arch::Gemma3
        | Arch::Gemma4
        | Arch::Granite => Ok(vec![false; n_layer]),
    }
}

/// Whether the family lists its layers' kinds and which layers read another's KV (Gemma 4);
/// the others slide every `window_pattern`-th layer and own every layer's KV.
fn lists_layers(arch: Arch) -> bool {
    match arch {
        Arch::Gemma4 => true,
        Arch::Llama
        | Arch::Qwen2
        | Arch::Qwen3
        | Arch::Qwen3Moe
        | Arch::Qwen35
        | Arch::Qwen35Moe
        | Arch::Phi3
        | Arch::SmolLm3
        | Arch::Gemma2
        | Arch::Gemma3
        | Arch::Granite
        | Arch::Lfm2 => false,
    }
}

/// Per layer (of the first `n_layer`): whether it attends through the sliding window, when the
/// family lists it (Gemma 4); `None`: every `window_pattern`-th layer is global.
pub fn sliding_layers(arch: Arch, m: &Meta, n_layer: usize) -> Result<Option<Vec<bool>>> {
    match lists_layers(arch) {
        true => gemma4::sliding_layers(m, n_layer).map(Some),
        false => Ok(None),
    }
}

/// Per layer: the layer whose KV it attends with (itself, or for Gemma 4's shared-KV layers
/// an earlier one of its kind).
pub fn kv_sources(arch: Arch, m: &Meta, sliding: &[bool]) -> Result<Vec<usize>> {
    match lists_layers(arch) {
        true => gemma4::kv_sources(m, sliding),
        false => Ok((0..sliding.len()).collect()),
    }
}

/// The KV heads of the attention layers: the GGUF's count, or the one nonzero count of its
/// per-layer list (LFM2: 0 on the recurrent layers); `None` if it names none.
pub fn kv_heads(m: &Meta) -> Result<Option<usize>> {
    let Some(per_layer) = m.counts("attention.head_count_kv")? else {
        return Ok(m.usize("attention.head_count_kv").ok());
    };
    let mut counts: Vec<usize> = per_layer.into_iter().filter(|&h| h > 0).collect();
    counts.dedup();
    match counts[..] {
        [h] => Ok(Some(h)),
        _ => Err(EngineError::Unsupported(format!(
            "attention layers with different KV head counts {counts:?}"
        ))),
    }
}
