//! One conversation's state: an optional shared prefix (e.g. a cloud prompt's KV, read-only),
//! the positions kept from its earlier turns (read-only too), and the private KV of everything
//! after them.

use std::sync::Arc;

use crate::kv::{ContinuedKv, LayerKv, PrefixKv};
use crate::model::{LayerInput, Model, Scratch};
use crate::Result;

/// Clone copies the private KV and shares the prefix (answers forked after one prefill).
#[derive(Clone)]
pub struct Sequence {
    prefix: Option<Arc<PrefixKv>>,
    /// Positions after the prefix kept from earlier turns (its prefix is `prefix`), of which
    /// the first `kept_len` are this sequence's.
    kept: Option<Arc<ContinuedKv>>,
    kept_len: usize,
    kv: Vec<LayerKv>,
    /// Private token ids (after the prefix).
    tokens: Vec<u32>,
}

impl Sequence {
    pub fn new(model: &Model) -> Self {
        Self {
            prefix: None,
            kept: None,
            kept_len: 0,
            kv: (0..model.cfg.n_layer)
                .map(|l| model.new_layer_kv(l))
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

    /// A sequence that continues after `kept` (and the prefix it follows), checked first.
    pub fn continuing(model: &Model, kept: Arc<ContinuedKv>) -> Result<Self> {
        let n = kept.token_ids.len();
        Self::continuing_first(model, kept, n)
    }

    /// A sequence that continues after the first `n` of `kept`'s positions (where a turn's
    /// tokens part from them), checked first. Those positions attend only to earlier ones, so
    /// they are what this sequence would compute there itself.
    pub fn continuing_first(model: &Model, kept: Arc<ContinuedKv>, n: usize) -> Result<Self> {
        kept.check_fits(&model.cfg, &model.fingerprint)?;
        // A recurrent layer's state exists only where the kept positions end.
        let hybrid = model.cfg.recurrent.iter().any(|&r| r);
        if hybrid && n != kept.token_ids.len() {
            return Err(crate::EngineError::Input(format!(
                "{n} of {} kept positions asked of a model with recurrent layers: its state is \
                 kept only where they end",
                kept.token_ids.len()
            )));
        }
        if n > kept.token_ids.len() {
            return Err(crate::EngineError::Input(format!(
                "{n} kept positions asked of {}",
                kept.token_ids.len()
            )));
        }
        let mut s = Self::new(model);
        s.prefix = kept.prefix.clone();
        s.kept = Some(kept);
        s.kept_len = n;
        Ok(s)
    }

    pub fn prefix(&self) -> Option<&Arc<PrefixKv>> {
        self.prefix.as_ref()
    }

    pub fn kept(&self) -> Option<&Arc<ContinuedKv>> {
        self.kept.as_ref()
    }

    /// Positions before the private ones: the prefix's and the kept ones.
    pub fn prefix_len(&self) -> usize {
        match &self.kept {
            Some(k) => k.prefix_len() + self.kept_len,
            None => self.prefix.as_ref().map_or(0, |p| p.n_tokens()),
        }
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

    /// Layer `l`'s share of a pass of `rows` new rows: the KV it attends with (its own, or
    /// for a layer that reads another's, that layer's).
    pub(crate) fn layer_input(&mut self, model: &Model, l: usize, rows: usize) -> LayerInput<'_> {
        let l = model.cfg.kv_source_of(l);
        LayerInput {
            prefix: self.prefix.as_ref().map(|p| &*p.layers[l]),
            kept: self.kept.as_ref().map(|k| k.layers[l].first(self.kept_len)),
            private: &mut self.kv[l],
            rows,
            after: 0,
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

    /// Everything computed so far, prefix and private KV, as one prefix: what a later turn of
    /// the same conversation continues from (copied; the prefix itself is not changed).
    pub fn export_whole(&self, model: &Model) -> Result<PrefixKv> {
        if self.kept.is_some() {
            return Err(crate::EngineError::Input(
                "a sequence on kept positions exports them with export_continued".into(),
            ));
        }
        let Some(p) = &self.prefix else {
            return self.export_prefix(model);
        };
        let end = self.len();
        let layers = p
            .layers
            .iter()
            .zip(&self.kv)
            .enumerate()
            .map(|(l, (a, b))| match !model.cfg.owns_kv(l) {
                true => Ok(Arc::new(settled(b, a.state.as_ref(), end, model, l))),
                false => a.joined(b).map(Arc::new),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut token_ids = p.token_ids.clone();
        token_ids.extend_from_slice(&self.tokens);
        Ok(PrefixKv {
            fingerprint: model.fingerprint.clone(),
            token_ids,
            layers,
        })
    }

    /// Everything after the prefix computed so far (kept positions and private KV) as positions
    /// that continue it: what a later turn continues from, the prefix held rather than copied.
    pub fn export_continued(&self, model: &Model) -> Result<ContinuedKv> {
        let from = self.prefix.as_ref().map_or(0, |p| p.n_tokens());
        let end = self.len();
        let earlier = |l: usize| {
            let kept = self.kept.as_ref().and_then(|k| k.layers[l].state.as_ref());
            kept.or_else(|| {
                self.prefix
                    .as_ref()
                    .and_then(|p| p.layers[l].state.as_ref())
            })
        };
        let layers = match &self.kept {
            Some(k) => k
                .layers
                .iter()
                .zip(&self.kv)
                .enumerate()
                .map(|(l, (a, b))| match !model.cfg.owns_kv(l) {
                    true => Ok(Arc::new(settled(b, earlier(l), end, model, l))),
                    false => a.first(self.kept_len).joined(b).map(Arc::new),
                })
                .collect::<Result<Vec<_>>>()?,
            None => self
                .kv
                .iter()
                .enumerate()
                .map(|(l, b)| match !model.cfg.owns_kv(l) {
                    true => Arc::new(settled(b, earlier(l), end, model, l)),
                    false => Arc::new(b.clone().starting_at(from)),
                })
                .collect(),
        };
        let mut token_ids = self
            .kept
            .as_ref()
            .map_or_else(Vec::new, |k| k.token_ids[..self.kept_len].to_vec());
        token_ids.extend_from_slice(&self.tokens);
        Ok(ContinuedKv {
            fingerprint: model.fingerprint.clone(),
            prefix: self.prefix.clone(),
            token_ids,
            layers,
        })
    }

    /// Export the whole context computed so far as a shareable prefix. Only a sequence
    /// without a prefix of its own can be exported (prefixes do not nest).
    pub fn export_prefix(&self, model: &Model) -> Result<PrefixKv> {
        if self.prefix.is_some() || self.kept.is_some() {
            return Err(crate::EngineError::Input(
                "a sequence that already has a prefix cannot be exported as one".into(),
            ));
        }
        let end = self.tokens.len();
        Ok(PrefixKv {
            fingerprint: model.fingerprint.clone(),
            token_ids: self.tokens.clone(),
            layers: self
                .kv
                .iter()
                .enumerate()
                .map(|(l, b)| match !model.cfg.owns_kv(l) {
                    true => Arc::new(settled(b, None, end, model, l)),
                    false => Arc::new(b.clone()),
                })
                .collect(),
        })
    }
}

/// A layer without KV of its own as a prefix or kept positions ending at `end` hold it: no
/// rows, and for a recurrent layer the sequence's own state (`private`'s) or, when it ran no
/// token past them, the earlier one; for one that reads another layer's KV, which.
fn settled(
    private: &LayerKv,
    earlier: Option<&Arc<crate::recurrent::Recurrent>>,
    end: usize,
    model: &Model,
    layer: usize,
) -> LayerKv {
    let c = &model.cfg;
    if !c.is_recurrent(layer) {
        let (h, d) = (private.n_kv_head, private.head_dim);
        return LayerKv::reading(h, d, end, c.kv_source_of(layer));
    }
    let mut l = LayerKv::new(private.n_kv_head, private.head_dim);
    if let Some(st) = private.state.as_ref().or(earlier) {
        l = LayerKv::recurrent(private.n_kv_head, private.head_dim, end, st.clone());
    }
    l.starting_at(end)
}

/// A prefill run one layer at a time against a prefix that arrives layer by layer (the edge's
/// pipeline: layer `l` of the private prompt runs as soon as cloud layer `l` is here).
pub struct PrefillPass {
    ids: Vec<u32>,
    x: Vec<f32>,
    /// The scaled embeddings, kept for a model whose layers read them (Gemma 4's PLE).
    embedded: Vec<f32>,
    /// The prefix KV of the layers later layers read instead of their own (Gemma 4), kept
    /// from their turn (`run_layer` lends each layer's only for its call).
    sources: Vec<Option<LayerKv>>,
    kv: Vec<LayerKv>,
    next_layer: usize,
    prefix_len: usize,
    scratch: Scratch,
}

impl PrefillPass {
    /// Start a pass for private tokens `ids` that follow a prefix of `prefix_len` tokens.
    pub fn new(model: &Model, ids: &[u32], prefix_len: usize) -> Result<Self> {
        if ids.is_empty() {
            return Err(crate::EngineError::Input("no tokens to run".into()));
        }
        let x = model.embed(ids)?;
        Ok(Self {
            ids: ids.to_vec(),
            embedded: match model.layers_read_embeddings() {
                true => x.clone(),
                false => Vec::new(),
            },
            x,
            sources: vec![None; model.cfg.n_layer],
            kv: (0..model.cfg.n_layer)
                .map(|l| model.new_layer_kv(l))
                .collect(),
            next_layer: 0,
            prefix_len,
            scratch: Scratch::default(),
        })
    }

    pub fn next_layer(&self) -> usize {
        self.next_layer
    }

    /// Run the next layer with that layer's prefix KV (`None` for a pass without prefix; a
    /// layer that reads an earlier one's KV holds none of its own and reads that one's).
    pub fn run_layer(&mut self, model: &Model, prefix: Option<&LayerKv>) -> Result<()> {
        let l = self.next_layer;
        if l >= model.cfg.n_layer {
            return Err(crate::EngineError::Input("all layers already ran".into()));
        }
        let fits = |p: &LayerKv| {
            let state = match (&p.state, &model.cfg.features.recurrence) {
                (Some(st), Some(shape)) => model.cfg.is_recurrent(l) && st.fits(shape),
                (Some(_), None) => false,
                (None, _) => !model.cfg.is_recurrent(l) || self.prefix_len == 0,
            };
            p.end() == self.prefix_len
                && p.start() <= model.cfg.visible_from(l, self.prefix_len)
                && p.n_kv_head == model.cfg.n_kv_head
                && p.head_dim == model.cfg.head_dim_of(l)
                && state
        };
        if !prefix.map_or(self.prefix_len == 0, fits) {
            let (n, h, d) = prefix.map_or((0, 0, 0), |p| (p.end(), p.n_kv_head, p.head_dim));
            return Err(crate::EngineError::KvMismatch(format!(
                "layer {l}: prefix of {n} tokens x {h} heads x {d}, expected {} x {} x {}",
                self.prefix_len,
                model.cfg.n_kv_head,
                model.cfg.head_dim_of(l)
            )));
        }
        let src = model.cfg.kv_source_of(l);
        // Kept while a later layer still reads it.
        let read_later = (l + 1..model.cfg.n_layer).any(|m| model.cfg.kv_source_of(m) == l);
        if read_later {
            self.sources[l] = prefix.cloned();
        }
        let prefix = match src == l {
            true => prefix,
            false => self.sources[src].as_ref(),
        };
        let mut parts = [LayerInput {
            prefix,
            kept: None,
            private: &mut self.kv[src],
            rows: self.ids.len(),
            after: 0,
        }];
        let tokens = crate::model::PassTokens {
            ids: &self.ids,
            embedded: &self.embedded,
        };
        model.forward_layer(l, &mut self.x, tokens, &mut parts, &mut self.scratch)?;
        // A recurrent layer as a prefix holds it: its state where the pass ends (a layer
        // reading another's KV: nothing, from there).
        if !model.cfg.owns_kv(l) {
            let end = self.prefix_len + self.ids.len();
            self.kv[l] = settled(&self.kv[l], None, end, model, l);
        }
        self.next_layer += 1;
        Ok(())
    }

    /// The hidden rows (`[ids, n_embd]`) after the layers run so far: the representation
    /// layer alignment compares (CE-LSLM eq. 11).
    pub fn hidden(&self) -> &[f32] {
        &self.x
    }

    /// This pass's own KV of layer `l` (complete once that layer ran; a recurrent layer's state
    /// at the pass's end).
    pub fn layer_kv(&self, l: usize) -> &LayerKv {
        &self.kv[l]
    }

    /// A pass without prefix, finished: its KV as a shareable prefix (the cloud's job).
    pub fn into_prefix(self, model: &Model) -> Result<PrefixKv> {
        if self.next_layer != model.cfg.n_layer || self.prefix_len != 0 {
            return Err(crate::EngineError::Input(
                "pass is not a finished prefix-free pass".into(),
            ));
        }
        let end = self.ids.len();
        let layers = self
            .kv
            .into_iter()
            .enumerate()
            .map(|(l, b)| match !model.cfg.owns_kv(l) {
                true => Arc::new(settled(&b, None, end, model, l)),
                false => Arc::new(b),
            })
            .collect();
        Ok(PrefixKv {
            fingerprint: model.fingerprint.clone(),
            token_ids: self.ids,
            layers,
        })
    }

    /// After the last layer: the sequence (prefix + private KV) and the last position's logits.
    pub fn finish(self, model: &Model, prefix: Arc<PrefixKv>) -> Result<(Sequence, Vec<f32>)> {
        if self.next_layer != model.cfg.n_layer {
            return Err(crate::EngineError::Input(format!(
                "pass stopped at layer {} of {}",
                self.next_layer, model.cfg.n_layer
            )));
        }
        prefix.check_fits(&model.cfg, &model.fingerprint)?;
        if prefix.n_tokens() != self.prefix_len {
            return Err(crate::EngineError::KvMismatch(
                "prefix length changed".into(),
            ));
        }
        let d = model.cfg.n_embd;
        let logits = model.logits(&self.x[self.x.len() - d..])?;
        let seq = Sequence {
            prefix: Some(prefix),
            kept: None,
            kept_len: 0,
            kv: self.kv,
            tokens: self.ids,
        };
        Ok((seq, logits))
    }
}
