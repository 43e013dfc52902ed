//! Hyper-parameters read from GGUF metadata.

use crate::arch::Meta;
pub use crate::arch::{Arch, Features, Moe, RopeStyle};
use crate::gguf::{meta_str, Content, Value};
use crate::{EngineError, Result};

#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub name: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    /// Head size of the global layers (of every layer, but in Gemma 4).
    pub head_dim: usize,
    /// Head size of the sliding layers (Gemma 4: 256 beside its global 512).
    pub head_dim_local: usize,
    /// Dimensions of each sliding layer's heads RoPE rotates (the global layers':
    /// `features.rope_dims`).
    pub rope_dims_local: usize,
    /// The widest FFN hidden width (`ffn_widths` per layer).
    pub n_ff: usize,
    /// Per layer: its FFN hidden width (Gemma 4's shared-KV layers: twice the others').
    pub ffn_widths: Vec<usize>,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rope_base: f32,
    pub rope_style: RopeStyle,
    pub rms_eps: f32,
    /// Sliding-window size: a token sees itself and the `window - 1` positions before it, on
    /// the layers `sliding` marks.
    pub window: Option<usize>,
    /// Per layer: whether it attends through the sliding window.
    pub sliding: Vec<bool>,
    /// RoPE base of the sliding layers (Gemma 3: 10 000; the global layers use `rope_base`).
    pub rope_base_local: f32,
    /// Per layer: whether it is a recurrent layer, which keeps a state of fixed size instead of
    /// KV (`features.recurrence` says what it is).
    pub recurrent: Vec<bool>,
    /// Per layer: the layer whose KV it attends with, itself but in Gemma 4's last layers,
    /// which read an earlier one's and own none (`owns_kv`).
    pub kv_source: Vec<usize>,
    /// What the family's layers do beyond the plain transformer (`arch/`).
    pub features: Features,
}

/// First position of a `prompt_len`-token prefix a later token still sees through `window`
/// (a token sees itself and the `window - 1` before it); 0 without a window.
pub fn window_start(window: Option<usize>, prompt_len: usize) -> usize {
    window.map_or(0, |w| prompt_len.saturating_sub(w.saturating_sub(1)))
}

impl ModelConfig {
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let arch_name = meta_str(content, "general.architecture")?;
        let arch = Arch::from_name(&arch_name)?;
        let m = Meta {
            content,
            arch: &arch_name,
        };
        let n_embd = m.usize("embedding_length")?;
        let n_head = m.usize("attention.head_count")?;
        let n_kv_head = crate::arch::kv_heads(&m)?.unwrap_or(n_head);
        // Heads may be wider than n_embd / n_head (Gemma, Qwen3); the key length says so.
        let head_dim = m
            .usize("attention.key_length")
            .unwrap_or(n_embd / n_head.max(1));
        let value_dim = m.usize("attention.value_length").unwrap_or(head_dim);
        let head_dim_local = m.usize("attention.key_length_swa").unwrap_or(head_dim);
        let value_dim_local = m
            .usize("attention.value_length_swa")
            .unwrap_or(head_dim_local);
        let head_ok =
            |d: usize| d > 0 && d.is_multiple_of(2) && d <= crate::attention::MAX_HEAD_DIM;
        if n_embd == 0
            || n_head == 0
            || n_kv_head == 0
            || n_head % n_kv_head != 0
            || !head_ok(head_dim)
            || !head_ok(head_dim_local)
            || value_dim != head_dim
            || value_dim_local != head_dim_local
        {
            return Err(EngineError::Unsupported(format!(
                "head layout {n_head} heads / {n_kv_head} kv heads of {head_dim} and \
                 {head_dim_local} (values {value_dim} and {value_dim_local}) / width {n_embd}"
            )));
        }
        let vocab_size = match content.metadata.get("tokenizer.ggml.tokens") {
            Some(Value::Array(tokens)) => tokens.len(),
            _ => return Err(EngineError::Gguf("missing tokenizer.ggml.tokens".into())),
        };
        // Blocks past the trunk are multi-token-prediction heads (Qwen3.5's MTP): not run.
        let n_layer = m
            .usize("block_count")?
            .saturating_sub(m.usize("nextn_predict_layers").unwrap_or(0));
        let features = crate::arch::features(arch, &m, head_dim, n_embd)?;
        let recurrent = crate::arch::recurrent_layers(arch, &m, n_layer)?;
        let rope_base = m.f32("rope.freq_base").unwrap_or(10_000.0);
        let listed = crate::arch::sliding_layers(arch, &m, n_layer)?;
        let window = m
            .usize("attention.sliding_window")
            .ok()
            .filter(|&w| w > 0 && (features.window_pattern > 0 || listed.is_some()));
        // Listed by the file, or sliding layers, then a global one, repeated (llama.cpp's swa
        // pattern).
        let pattern = features.window_pattern.max(1);
        let sliding: Vec<bool> = match listed {
            Some(listed) => listed.iter().map(|&s| s && window.is_some()).collect(),
            None => (0..n_layer)
                .map(|l| window.is_some() && l % pattern < pattern - 1)
                .collect(),
        };
        let kv_source = crate::arch::kv_sources(arch, &m, &sliding)?;
        let rope_dims_local = m
            .usize("rope.dimension_count_swa")
            .unwrap_or(features.rope_dims.min(head_dim_local));
        if rope_dims_local > head_dim_local || !rope_dims_local.is_multiple_of(2) {
            return Err(EngineError::Unsupported(format!(
                "RoPE on {rope_dims_local} of the sliding layers' {head_dim_local} dimensions"
            )));
        }
        let ffn_widths = match m.counts("feed_forward_length")? {
            Some(w) if w.len() >= n_layer => w[..n_layer].to_vec(),
            Some(_) => {
                return Err(EngineError::Gguf(
                    "feed_forward_length: not one width per layer".into(),
                ))
            }
            None => {
                let n_ff = m
                    .usize("feed_forward_length")
                    .or_else(|e| match features.moe {
                        Some(moe) => Ok(moe.n_ff),
                        None => Err(e),
                    })?;
                vec![n_ff; n_layer]
            }
        };
        let cfg = Self {
            arch,
            name: meta_str(content, "general.name").unwrap_or_else(|_| arch_name.clone()),
            n_layer,
            n_embd,
            n_head,
            n_kv_head,
            head_dim,
            head_dim_local,
            rope_dims_local,
            n_ff: ffn_widths.iter().copied().max().unwrap_or(0),
            ffn_widths,
            vocab_size,
            context_length: m.usize("context_length").unwrap_or(4096),
            rope_base,
            rope_style: features.rope_style,
            rms_eps: m.f32("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
            window,
            sliding,
            recurrent,
            kv_source,
            rope_base_local: m
                .f32("rope.freq_base_swa")
                .or(features.window_rope_base)
                .unwrap_or(rope_base),
            features,
        };
        if cfg.n_layer == 0
            || cfg.ffn_widths.contains(&0)
            || cfg.context_length == 0
            || cfg.vocab_size == 0
        {
            return Err(EngineError::Unsupported(format!(
                "{} layers, feed-forward width {}, context {}, vocabulary {}: none may be 0",
                cfg.n_layer, cfg.n_ff, cfg.context_length, cfg.vocab_size
            )));
        }
        Ok(cfg)
    }

    /// Width of the query rows (`n_head * head_dim`; Gemma's differs from `n_embd`).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Head size of layer `l` (Gemma 4's sliding layers have their own).
    pub fn head_dim_of(&self, l: usize) -> usize {
        match self.sliding.get(l) {
            Some(true) => self.head_dim_local,
            _ => self.head_dim,
        }
    }

    /// Width of layer `l`'s query rows.
    pub fn q_dim_of(&self, l: usize) -> usize {
        self.n_head * self.head_dim_of(l)
    }

    /// FFN hidden width of layer `l`.
    pub fn n_ff_of(&self, l: usize) -> usize {
        self.ffn_widths.get(l).copied().unwrap_or(self.n_ff)
    }

    /// The layer whose KV layer `l` attends with.
    pub fn kv_source_of(&self, l: usize) -> usize {
        self.kv_source.get(l).copied().unwrap_or(l)
    }

    /// Whether layer `l` computes and holds KV of its own: an attention layer that does not
    /// read another's.
    pub fn owns_kv(&self, l: usize) -> bool {
        !self.is_recurrent(l) && self.kv_source_of(l) == l
    }

    /// The sliding window of layer `l`, if it has one.
    pub fn window_of(&self, l: usize) -> Option<usize> {
        self.window
            .filter(|_| self.sliding.get(l).copied().unwrap_or(false))
    }

    /// First position of a `prompt_len`-token prefix that layer `l` can still show to a token
    /// after it: the window cut (0 on full-attention layers; all of it on a recurrent layer,
    /// whose state holds what it keeps of the prefix, and on a layer reading another's KV).
    pub fn visible_from(&self, l: usize, prompt_len: usize) -> usize {
        if !self.owns_kv(l) {
            return prompt_len;
        }
        window_start(self.window_of(l), prompt_len)
    }

    /// Whether layer `l` is a recurrent layer.
    pub fn is_recurrent(&self, l: usize) -> bool {
        self.recurrent.get(l).copied().unwrap_or(false)
    }

    /// f16 K+V bytes per token over the layers that own KV (before any window cut).
    pub fn kv_bytes_per_token(&self) -> usize {
        (0..self.n_layer)
            .filter(|&l| self.owns_kv(l))
            .map(|l| 2 * 2 * self.n_kv_head * self.head_dim_of(l))
            .sum()
    }

    /// Bytes a prompt of `n` tokens holds: its attention layers' KV (f16) and its recurrent
    /// layers' states.
    pub fn prompt_bytes(&self, n: usize) -> usize {
        n.saturating_mul(self.kv_bytes_per_token())
            .saturating_add(self.state_bytes())
    }

    /// Bytes of the recurrent layers' states (the same after any number of tokens; 0 for a
    /// model without such layers).
    pub fn state_bytes(&self) -> usize {
        let layers = self.recurrent.iter().filter(|&&r| r).count();
        self.features
            .recurrence
            .map_or(0, |s| layers * s.state_bytes())
    }

    pub fn group_size(&self) -> usize {
        self.n_head / self.n_kv_head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn content(overrides: &[(&str, u32)]) -> Content {
        let mut metadata: HashMap<String, Value> = [
            ("general.architecture", Value::String("llama".into())),
            (
                "tokenizer.ggml.tokens",
                Value::Array(vec![Value::String("a".into()); 8]),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let dims = [
            ("embedding_length", 64),
            ("attention.head_count", 4),
            ("block_count", 2),
            ("feed_forward_length", 128),
            ("context_length", 256),
        ];
        for (k, v) in dims.into_iter().chain(overrides.iter().copied()) {
            metadata.insert(format!("llama.{k}"), Value::U32(v));
        }
        Content {
            metadata,
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        }
    }

    #[test]
    fn a_dimension_of_zero_is_refused() {
        let ok = ModelConfig::from_gguf(&content(&[])).unwrap();
        assert_eq!((ok.n_embd, ok.head_dim, ok.n_ff), (64, 16, 128));
        for key in [
            "embedding_length",
            "attention.head_count",
            "block_count",
            "feed_forward_length",
            "context_length",
        ] {
            let e = ModelConfig::from_gguf(&content(&[(key, 0)]));
            assert!(
                matches!(e, Err(EngineError::Unsupported(_))),
                "{key} = 0: {:?}",
                e.map(|c| c.n_layer)
            );
        }
    }
}
