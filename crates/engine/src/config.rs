//! Hyper-parameters read from GGUF metadata.

use candle_core::quantized::gguf_file::{Content, Value};

use crate::{EngineError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Arch {
    Llama,
    Qwen2,
    Gemma3,
}

/// How RoPE pairs dimensions. GGUF llama weights are permuted by the converter so that
/// adjacent pairs rotate; qwen2 keeps the NEOX layout (dimension i pairs with i + d/2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RopeStyle {
    Adjacent,
    Neox,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub name: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub n_ff: usize,
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
}

/// First position of a `prompt_len`-token prefix a later token still sees through `window`
/// (a token sees itself and the `window - 1` before it); 0 without a window.
pub fn window_start(window: Option<usize>, prompt_len: usize) -> usize {
    window.map_or(0, |w| prompt_len.saturating_sub(w.saturating_sub(1)))
}

/// Gemma 3's layer pattern: every sixth layer attends globally.
const GEMMA3_PATTERN: usize = 6;

impl ModelConfig {
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let arch_name = meta_str(content, "general.architecture")?;
        let (arch, rope_style) = match arch_name.as_str() {
            "llama" => (Arch::Llama, RopeStyle::Adjacent),
            "qwen2" => (Arch::Qwen2, RopeStyle::Neox),
            "gemma3" => (Arch::Gemma3, RopeStyle::Neox),
            other => {
                return Err(EngineError::Unsupported(format!(
                    "architecture {other:?} (supported: llama, qwen2, gemma3)"
                )))
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let n_embd = meta_usize(content, &key("embedding_length"))?;
        let n_head = meta_usize(content, &key("attention.head_count"))?;
        let n_kv_head = meta_usize(content, &key("attention.head_count_kv")).unwrap_or(n_head);
        // Gemma's heads are wider than n_embd / n_head; the key length says so.
        let head_dim =
            meta_usize(content, &key("attention.key_length")).unwrap_or(n_embd / n_head.max(1));
        if n_head == 0
            || n_kv_head == 0
            || n_head % n_kv_head != 0
            || (arch != Arch::Gemma3 && head_dim * n_head != n_embd)
            || head_dim == 0
            || !head_dim.is_multiple_of(2)
            || head_dim > crate::attention::MAX_HEAD_DIM
        {
            return Err(EngineError::Unsupported(format!(
                "head layout {n_head} heads / {n_kv_head} kv heads / width {n_embd}"
            )));
        }
        let vocab_size = match content.metadata.get("tokenizer.ggml.tokens") {
            Some(Value::Array(tokens)) => tokens.len(),
            _ => return Err(EngineError::Gguf("missing tokenizer.ggml.tokens".into())),
        };
        let n_layer = meta_usize(content, &key("block_count"))?;
        let window = meta_usize(content, &key("attention.sliding_window"))
            .ok()
            .filter(|&w| w > 0 && arch == Arch::Gemma3);
        // Gemma 3: five sliding layers, then one global, repeated (llama.cpp's pattern 6).
        let sliding = (0..n_layer)
            .map(|l| window.is_some() && l % GEMMA3_PATTERN < GEMMA3_PATTERN - 1)
            .collect();
        Ok(Self {
            arch,
            name: meta_str(content, "general.name").unwrap_or_else(|_| arch_name.clone()),
            n_layer,
            n_embd,
            n_head,
            n_kv_head,
            head_dim,
            n_ff: meta_usize(content, &key("feed_forward_length"))?,
            vocab_size,
            context_length: meta_usize(content, &key("context_length")).unwrap_or(4096),
            rope_base: meta_f32(content, &key("rope.freq_base")).unwrap_or(10_000.0),
            rope_style,
            rms_eps: meta_f32(content, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            window,
            sliding,
            rope_base_local: meta_f32(content, &key("rope.freq_base_swa")).unwrap_or(10_000.0),
        })
    }

    /// Width of the query rows (`n_head * head_dim`; Gemma's differs from `n_embd`).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The sliding window of layer `l`, if it has one.
    pub fn window_of(&self, l: usize) -> Option<usize> {
        self.window
            .filter(|_| self.sliding.get(l).copied().unwrap_or(false))
    }

    /// First position of a `prompt_len`-token prefix that layer `l` can still show to a token
    /// after it: the window cut (0 on full-attention layers).
    pub fn visible_from(&self, l: usize, prompt_len: usize) -> usize {
        window_start(self.window_of(l), prompt_len)
    }

    /// f16 K+V bytes per token over all layers (before any window cut).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * 2 * self.n_layer * self.n_kv_head * self.head_dim
    }

    pub fn group_size(&self) -> usize {
        self.n_head / self.n_kv_head
    }
}

pub(crate) fn meta<'a>(content: &'a Content, key: &str) -> Result<&'a Value> {
    content
        .metadata
        .get(key)
        .ok_or_else(|| EngineError::Gguf(format!("missing metadata key {key}")))
}

pub(crate) fn meta_str(content: &Content, key: &str) -> Result<String> {
    meta(content, key)?
        .to_string()
        .cloned()
        .map_err(|e| EngineError::Gguf(format!("{key}: {e}")))
}

pub(crate) fn meta_usize(content: &Content, key: &str) -> Result<usize> {
    let v = meta(content, key)?;
    let n = match v {
        Value::U8(x) => *x as u64,
        Value::U16(x) => *x as u64,
        Value::U32(x) => *x as u64,
        Value::U64(x) => *x,
        Value::I32(x) if *x >= 0 => *x as u64,
        Value::I64(x) if *x >= 0 => *x as u64,
        other => return Err(EngineError::Gguf(format!("{key}: not a count: {other:?}"))),
    };
    Ok(n as usize)
}

pub(crate) fn meta_f32(content: &Content, key: &str) -> Result<f32> {
    match meta(content, key)? {
        Value::F32(x) => Ok(*x),
        Value::F64(x) => Ok(*x as f32),
        other => Err(EngineError::Gguf(format!("{key}: not a float: {other:?}"))),
    }
}
