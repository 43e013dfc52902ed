//! Per-layer KV held as f16, one contiguous buffer per KV head so a new token is an append
//! and attention streams keys without copying the cache.

use std::sync::Arc;

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::config::ModelConfig;
use crate::recurrent::Recurrent;
use crate::{EngineError, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct LayerKv {
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Position of the first token held: positions before it were cut (a sliding-window
    /// layer's prefix keeps only what a later token can still see).
    start: usize,
    len: usize,
    /// `k[h]` holds `len * head_dim` values: token-major rows of KV head `h`.
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    /// A recurrent layer's state after position `end()` (such a layer holds no K/V rows: its
    /// positions are all cut, the state keeps what later tokens need of them).
    pub state: Option<Arc<Recurrent>>,
    /// The layer whose KV this one attends with (Gemma 4's last layers): it holds none of its
    /// own, and nothing is sent, stored or signed for it.
    pub kv_of: Option<usize>,
}

impl LayerKv {
    pub fn new(n_kv_head: usize, head_dim: usize) -> Self {
        Self {
            n_kv_head,
            head_dim,
            start: 0,
            len: 0,
            k: vec![Vec::new(); n_kv_head],
            v: vec![Vec::new(); n_kv_head],
            state: None,
            kv_of: None,
        }
    }

    /// A layer that reads layer `source`'s KV, after position `end`: no rows of its own.
    pub fn reading(n_kv_head: usize, head_dim: usize, end: usize, source: usize) -> Self {
        Self {
            start: end,
            kv_of: Some(source),
            ..Self::new(n_kv_head, head_dim)
        }
    }

    /// A recurrent layer after position `end`: no rows, the state.
    pub fn recurrent(n_kv_head: usize, head_dim: usize, end: usize, state: Arc<Recurrent>) -> Self {
        Self {
            start: end,
            state: Some(state),
            ..Self::new(n_kv_head, head_dim)
        }
    }

    /// Build from per-head buffers (e.g. decoded from the wire).
    pub fn from_heads(head_dim: usize, k: Vec<Vec<f16>>, v: Vec<Vec<f16>>) -> Result<Self> {
        let n_kv_head = k.len();
        let len = k.first().map_or(0, |h| h.len() / head_dim.max(1));
        let ok = v.len() == n_kv_head
            && head_dim > 0
            && k.iter().chain(&v).all(|h| h.len() == len * head_dim);
        if !ok {
            return Err(EngineError::KvMismatch(
                "K/V head buffers disagree in count or length".into(),
            ));
        }
        Ok(Self {
            n_kv_head,
            head_dim,
            start: 0,
            len,
            k,
            v,
            state: None,
            kv_of: None,
        })
    }

    /// Tokens held (positions `start()..end()`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Position of the first token held.
    pub fn start(&self) -> usize {
        self.start
    }

    /// One past the last position held.
    pub fn end(&self) -> usize {
        self.start + self.len
    }

    /// The same tokens, said to start at position `start` (KV decoded from a cut stream).
    pub fn starting_at(mut self, start: usize) -> Self {
        self.start = start;
        self
    }

    /// Only positions `from..` (no-op when `from <= start`): the window cut.
    pub fn cut_before(&self, from: usize) -> Self {
        let drop = from.saturating_sub(self.start).min(self.len);
        let d = self.head_dim;
        Self {
            n_kv_head: self.n_kv_head,
            head_dim: d,
            start: self.start + drop,
            len: self.len - drop,
            k: self.k.iter().map(|h| h[drop * d..].to_vec()).collect(),
            v: self.v.iter().map(|h| h[drop * d..].to_vec()).collect(),
            state: self.state.clone(),
            kv_of: self.kv_of,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn keys(&self, head: usize) -> &[f16] {
        &self.k[head]
    }

    pub fn values(&self, head: usize) -> &[f16] {
        &self.v[head]
    }

    /// Append `rows` tokens from row-major `[rows, n_kv_head * head_dim]` f32 K and V.
    pub fn append(&mut self, k: &[f32], v: &[f32], rows: usize) {
        let w = self.n_kv_head * self.head_dim;
        debug_assert_eq!(k.len(), rows * w);
        for r in 0..rows {
            for h in 0..self.n_kv_head {
                let s = r * w + h * self.head_dim;
                let e = s + self.head_dim;
                // `half`'s slice conversion: F16C eight at a time where present, the same
                // rounding as `f16::from_f32` value by value (a batch-32 SmolLM2 step spent ~3 %
                // of its time converting one value per call).
                for (dst, src) in [(&mut self.k[h], &k[s..e]), (&mut self.v[h], &v[s..e])] {
                    let at = dst.len();
                    dst.resize(at + self.head_dim, f16::ZERO);
                    dst[at..].convert_from_f32_slice(src);
                }
            }
        }
        self.len += rows;
    }

    /// Keys as token-major f32 rows `[len, n_kv_head * head_dim]` (the layout `append` takes).
    pub fn key_rows(&self) -> Vec<f32> {
        rows(&self.k, self.len, self.head_dim)
    }

    /// Values as token-major f32 rows `[len, n_kv_head * head_dim]`.
    pub fn value_rows(&self) -> Vec<f32> {
        rows(&self.v, self.len, self.head_dim)
    }

    /// Bytes of K and V, and of a recurrent layer's state.
    pub fn bytes(&self) -> usize {
        2 * 2 * self.len * self.n_kv_head * self.head_dim
            + self.state.as_ref().map_or(0, |s| s.bytes())
    }

    /// This layer's positions followed by `next`'s (the positions right after them).
    pub fn joined(&self, next: &LayerKv) -> Result<Self> {
        self.first(self.len).joined(next)
    }

    /// Its first `len` positions (all of them if it holds fewer), borrowed.
    pub fn first(&self, len: usize) -> LayerSpan<'_> {
        LayerSpan {
            kv: self,
            len: len.min(self.len),
        }
    }

    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            for h in self.k.iter_mut().chain(self.v.iter_mut()) {
                h.truncate(len * self.head_dim);
            }
            self.len = len;
        }
    }
}

/// A layer's first positions, borrowed: what a turn reads of kept positions it shares only
/// up to where its tokens part from them.
#[derive(Clone, Copy, Debug)]
pub struct LayerSpan<'a> {
    kv: &'a LayerKv,
    len: usize,
}

impl<'a> LayerSpan<'a> {
    pub fn start(&self) -> usize {
        self.kv.start
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn end(&self) -> usize {
        self.kv.start + self.len
    }

    pub fn keys(&self, head: usize) -> &'a [f16] {
        &self.kv.k[head][..self.len * self.kv.head_dim]
    }

    pub fn values(&self, head: usize) -> &'a [f16] {
        &self.kv.v[head][..self.len * self.kv.head_dim]
    }

    /// A recurrent layer's state (at the end of the layer's positions: a sequence continues
    /// kept positions of a hybrid model only from their end).
    pub fn state(&self) -> Option<&'a Arc<Recurrent>> {
        self.kv.state.as_ref()
    }

    /// These positions followed by `next`'s (the positions right after them), copied.
    pub fn joined(&self, next: &LayerKv) -> Result<LayerKv> {
        let kv = self.kv;
        if next.n_kv_head != kv.n_kv_head || next.head_dim != kv.head_dim {
            return Err(EngineError::KvMismatch(
                "joined layers differ in shape".into(),
            ));
        }
        let n = self.len * kv.head_dim;
        let cat = |a: &[Vec<f16>], b: &[Vec<f16>]| -> Vec<Vec<f16>> {
            a.iter()
                .zip(b)
                .map(|(x, y)| [&x[..n], &y[..]].concat())
                .collect()
        };
        Ok(LayerKv {
            n_kv_head: kv.n_kv_head,
            head_dim: kv.head_dim,
            start: kv.start,
            len: self.len + next.len,
            k: cat(&kv.k, &next.k),
            v: cat(&kv.v, &next.v),
            state: next.state.clone().or_else(|| kv.state.clone()),
            kv_of: kv.kv_of,
        })
    }
}

fn rows(heads: &[Vec<f16>], len: usize, head_dim: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(len * heads.len() * head_dim);
    for t in 0..len {
        for h in heads {
            out.extend(
                h[t * head_dim..(t + 1) * head_dim]
                    .iter()
                    .map(|x| x.to_f32()),
            );
        }
    }
    out
}

/// The KV of a shared prompt prefix (the cloud prompt): read-only, shared by many sequences.
#[derive(Clone, Debug)]
pub struct PrefixKv {
    /// Fingerprint of the model that computed it.
    pub fingerprint: String,
    pub token_ids: Vec<u32>,
    pub layers: Vec<Arc<LayerKv>>,
}

impl PrefixKv {
    pub fn n_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Its first `n` positions (all of it if it has fewer).
    pub fn first(&self, n: usize) -> Self {
        if n >= self.n_tokens() {
            return self.clone();
        }
        Self {
            fingerprint: self.fingerprint.clone(),
            token_ids: self.token_ids[..n].to_vec(),
            layers: self
                .layers
                .iter()
                .map(|l| {
                    let mut l = LayerKv::clone(l);
                    l.truncate(n.saturating_sub(l.start()));
                    if l.kv_of.is_some() {
                        l.start = n;
                    }
                    if l.state.is_some() {
                        // A recurrent state is not the one at `n`: none, which no model takes.
                        l.state = None;
                        l.start = n;
                    }
                    Arc::new(l)
                })
                .collect(),
        }
    }

    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.bytes()).sum()
    }

    /// Check that this prefix can be attended to by `cfg`'s model with `fingerprint`.
    pub fn check_fits(&self, cfg: &ModelConfig, fingerprint: &str) -> Result<()> {
        if self.fingerprint != fingerprint {
            return Err(EngineError::KvMismatch(format!(
                "computed by model {}, this model is {}",
                short(&self.fingerprint),
                short(fingerprint)
            )));
        }
        if self.layers.len() != cfg.n_layer {
            return Err(EngineError::KvMismatch(format!(
                "{} layers, model has {}",
                self.layers.len(),
                cfg.n_layer
            )));
        }
        for (i, l) in self.layers.iter().enumerate() {
            let from = cfg.visible_from(i, self.n_tokens());
            if l.n_kv_head != cfg.n_kv_head
                || l.head_dim != cfg.head_dim_of(i)
                || l.end() != self.n_tokens()
                || l.start() > from
            {
                return Err(misfit(
                    &format!("layer {i}"),
                    l,
                    cfg,
                    i,
                    from,
                    self.n_tokens(),
                ));
            }
            check_state(cfg, i, l, self.n_tokens())?;
            check_source(cfg, i, l)?;
        }
        Ok(())
    }

    /// This prefix with every sliding-window layer cut to the positions a later token can
    /// still see (what the cloud ships and the edge keeps).
    pub fn window_cut(&self, cfg: &ModelConfig) -> Self {
        let n = self.n_tokens();
        Self {
            fingerprint: self.fingerprint.clone(),
            token_ids: self.token_ids.clone(),
            layers: self
                .layers
                .iter()
                .enumerate()
                .map(|(l, kv)| {
                    let from = cfg.visible_from(l, n);
                    if from > kv.start() {
                        Arc::new(kv.cut_before(from))
                    } else {
                        kv.clone()
                    }
                })
                .collect(),
        }
    }
}

/// Positions that continue a shared prefix: a conversation's earlier turns, kept between them
/// (the edge's private prefix cache). The prefix is held, not copied, so conversations on one
/// cloud prompt share its KV as running requests do.
#[derive(Clone, Debug)]
pub struct ContinuedKv {
    /// Fingerprint of the model that computed it.
    pub fingerprint: String,
    /// The prefix these positions follow (`None`: they start at position 0).
    pub prefix: Option<Arc<PrefixKv>>,
    /// Ids of the positions after the prefix.
    pub token_ids: Vec<u32>,
    /// Per layer, positions `prefix_len()..n_tokens()`.
    pub layers: Vec<Arc<LayerKv>>,
}

impl ContinuedKv {
    /// Positions before these (the prefix's).
    pub fn prefix_len(&self) -> usize {
        self.prefix.as_ref().map_or(0, |p| p.n_tokens())
    }

    /// Every position: the prefix's and these.
    pub fn n_tokens(&self) -> usize {
        self.prefix_len() + self.token_ids.len()
    }

    /// Whether `ids` begin with every position's id (the prefix's, then these).
    pub fn begins(&self, ids: &[u32]) -> bool {
        self.shared_with(ids) == Some(self.token_ids.len())
    }

    /// How many of these positions `ids` share after the prefix (`None` when `ids` do not
    /// begin with the prefix's ids): a conversation whose earlier answer re-tokenized
    /// differently still shares the positions before it.
    pub fn shared_with(&self, ids: &[u32]) -> Option<usize> {
        let p = self.prefix.as_ref().map_or(&[][..], |p| &p.token_ids[..]);
        let rest = ids.strip_prefix(p)?;
        Some(
            self.token_ids
                .iter()
                .zip(rest)
                .take_while(|(a, b)| a == b)
                .count(),
        )
    }

    /// Whether it holds recurrent states: then a turn continues it only from its end (the
    /// states exist nowhere else).
    pub fn has_state(&self) -> bool {
        self.layers.iter().any(|l| l.state.is_some())
    }

    /// Bytes of these positions' K and V (the prefix's not counted).
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.bytes()).sum()
    }

    /// Check that `cfg`'s model with `fingerprint` can attend to the prefix and these positions.
    pub fn check_fits(&self, cfg: &ModelConfig, fingerprint: &str) -> Result<()> {
        if let Some(p) = &self.prefix {
            p.check_fits(cfg, fingerprint)?;
        }
        if self.fingerprint != fingerprint || self.layers.len() != cfg.n_layer {
            return Err(EngineError::KvMismatch(format!(
                "kept positions: model {} with {} layers, this model is {} with {}",
                short(&self.fingerprint),
                self.layers.len(),
                short(fingerprint),
                cfg.n_layer
            )));
        }
        let (from, to) = (self.prefix_len(), self.n_tokens());
        for (i, l) in self.layers.iter().enumerate() {
            // A recurrent layer keeps no rows: its state is at the end.
            let first = if cfg.owns_kv(i) { from } else { to };
            if l.n_kv_head != cfg.n_kv_head
                || l.head_dim != cfg.head_dim_of(i)
                || l.start() != first
                || l.end() != to
            {
                return Err(misfit(&format!("kept layer {i}"), l, cfg, i, first, to));
            }
            check_state(cfg, i, l, to)?;
            check_source(cfg, i, l)?;
        }
        Ok(())
    }
}

/// Layer `i` names the layer whose KV it reads exactly when the model's does (and that one),
/// and then holds no rows.
fn check_source(cfg: &ModelConfig, i: usize, l: &LayerKv) -> Result<()> {
    let want = (!cfg.owns_kv(i) && !cfg.is_recurrent(i)).then(|| cfg.kv_source_of(i));
    if l.kv_of != want || (want.is_some() && !l.is_empty()) {
        return Err(EngineError::KvMismatch(format!(
            "layer {i} reads the KV of {:?} ({} rows of its own), the model's reads {want:?}",
            l.kv_of,
            l.len()
        )));
    }
    Ok(())
}

/// Layer `i` holds a state of `cfg`'s shape, finite, exactly when it is a recurrent layer
/// after at least one position.
fn check_state(cfg: &ModelConfig, i: usize, l: &LayerKv, end: usize) -> Result<()> {
    let ok = match (cfg.is_recurrent(i), &l.state, &cfg.features.recurrence) {
        (false, None, _) => true,
        (false, Some(_), _) => false,
        (true, None, _) => end == 0,
        (true, Some(st), Some(shape)) => st.fits(shape),
        (true, Some(_), None) => false,
    };
    if !ok {
        return Err(EngineError::KvMismatch(format!(
            "layer {i}: {} state where the model {} one",
            if l.state.is_some() { "a" } else { "no" },
            if cfg.is_recurrent(i) {
                "keeps a finite recurrent state of its own shape as"
            } else {
                "has no recurrent"
            }
        )));
    }
    Ok(())
}

/// `what` (a layer) does not have the shape and positions `from..to` that `cfg` expects.
fn misfit(
    what: &str,
    l: &LayerKv,
    cfg: &ModelConfig,
    layer: usize,
    from: usize,
    to: usize,
) -> EngineError {
    EngineError::KvMismatch(format!(
        "{what}: {} heads x {} dims x positions {}..{}, expected {} x {} x {from}..{to}",
        l.n_kv_head,
        l.head_dim,
        l.start(),
        l.end(),
        cfg.n_kv_head,
        cfg.head_dim_of(layer),
    ))
}

fn short(fp: &str) -> &str {
    &fp[..fp.len().min(12)]
}
