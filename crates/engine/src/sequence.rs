//! One conversation's state: an optional shared prefix (e.g. a cloud prompt's KV, read-only)
//! and the private KV of everything after it.

use std::sync::Arc;

use crate::kv::{LayerKv, PrefixKv};
use crate::model::{LayerInput, Model};
use crate::Result;

pub struct Sequence {
    prefix: Option<Arc<PrefixKv>>,
    kv: Vec<LayerKv>,
    /// Private token ids (after the prefix).
    tokens: Vec<u32>,
}

impl Sequence {
    pub fn new(model: &Model) -> Self {
        Self {
            prefix: None,
            kv: (0..model.cfg.n_layer)
                .map(|_| model.new_layer_kv())
                .collect(),
            tokens: Vec::new(),
        }
    }

    /// A sequence that continues after `prefix`, checked against the model first.
    pub fn with_prefix(model: &Model, prefix: Arc<PrefixKv>) -> Result<Self> {
        prefix.check_fits(&model.cfg, &model.fingerprint)?;
        let mut s = Self::new(model);
        s.prefix = Some(prefix);
        Ok(s)
    }

    pub fn prefix(&self) -> Option<&Arc<PrefixKv>> {
        self.prefix.as_ref()
    }

    pub fn prefix_len(&self) -> usize {
        self.prefix.as_ref().map_or(0, |p| p.n_tokens())
    }

    /// Positions so far: prefix plus private tokens.
    pub fn len(&self) -> usize {
        self.prefix_len() + self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn private_tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Bytes of private KV (the prefix is shared and not counted).
    pub fn private_kv_bytes(&self) -> usize {
        self.kv.iter().map(|l| l.bytes()).sum()
    }

    pub fn layer_kv(&self, l: usize) -> &LayerKv {
        &self.kv[l]
    }

    pub(crate) fn layer_input(&mut self, l: usize, rows: usize) -> LayerInput<'_> {
        LayerInput {
            prefix: self.prefix.as_ref().map(|p| &*p.layers[l]),
            private: &mut self.kv[l],
            rows,
        }
    }

    pub(crate) fn push_tokens(&mut self, ids: &[u32]) {
        self.tokens.extend_from_slice(ids);
    }

    /// Prefill `ids` in one call; returns the last position's logits.
    pub fn prefill(&mut self, model: &Model, ids: &[u32]) -> Result<Vec<f32>> {
        let mut out = model.forward(&mut [(self, ids)])?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Prefill in chunks of `chunk` tokens (bounded activation memory).
    pub fn prefill_chunked(
        &mut self,
        model: &Model,
        ids: &[u32],
        chunk: usize,
    ) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        for c in ids.chunks(chunk.max(1)) {
            logits = self.prefill(model, c)?;
        }
        Ok(logits)
    }

    /// Export the whole context computed so far as a shareable prefix. Only a sequence
    /// without a prefix of its own can be exported (prefixes do not nest).
    pub fn export_prefix(&self, model: &Model) -> Result<PrefixKv> {
        if self.prefix.is_some() {
            return Err(crate::EngineError::Input(
                "a sequence that already has a prefix cannot be exported as one".into(),
            ));
        }
        Ok(PrefixKv {
            fingerprint: model.fingerprint.clone(),
            token_ids: self.tokens.clone(),
            layers: self.kv.iter().map(|l| Arc::new(l.clone())).collect(),
        })
    }
}
