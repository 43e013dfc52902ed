//! Sealed KV chunks (one layer, one token range, one codec, a CRC-32 over header and payload)
//! and the reassembler that accepts them only in layer-major order and only if they fit.

use std::sync::Arc;

use edgeprompt_engine::recurrent::{Recurrence, Recurrent};
use edgeprompt_engine::LayerKv;
use half::f16;

use crate::codec::{self, Codec};
use crate::layers::LayerMap;
use crate::{KvError, Result};

pub use crate::codec::MAX_CHUNK_TOKENS;

#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub layer: u32,
    pub start: u32,
    pub end: u32,
    pub codec: Codec,
    pub compressed: bool,
    pub payload: Vec<u8>,
    /// A recurrent layer's state (its one chunk, at the layer's end): f32 LE, never compressed.
    pub state: Vec<u8>,
    pub checksum: u32,
}

impl Chunk {
    /// Encode positions `start..end` of one layer's KV (which holds `kv.start()..kv.end()`)
    /// and seal it.
    pub fn encode(
        layer: u32,
        kv: &LayerKv,
        start: usize,
        end: usize,
        codec: Codec,
        zstd_level: Option<i32>,
    ) -> Result<Self> {
        if start > end || start < kv.start() || end > kv.end() {
            return Err(KvError::Shape(format!(
                "positions {start}..{end} of {}..{}",
                kv.start(),
                kv.end()
            )));
        }
        let (d, a, b) = (kv.head_dim, start - kv.start(), end - kv.start());
        let k: Vec<&[f16]> = (0..kv.n_kv_head)
            .map(|h| &kv.keys(h)[a * d..b * d])
            .collect();
        let v: Vec<&[f16]> = (0..kv.n_kv_head)
            .map(|h| &kv.values(h)[a * d..b * d])
            .collect();
        // No positions (a recurrent layer's chunk, an empty prompt's): an empty payload, not
        // a zstd frame of nothing.
        let zstd_level = zstd_level.filter(|_| end > start);
        let payload = codec::encode(codec, zstd_level, &k, &v, d)?;
        // A recurrent layer holds no positions: its one chunk ends where it does.
        let state = match &kv.state {
            Some(st) if start == kv.end() => st.to_le_bytes(),
            _ => Vec::new(),
        };
        let mut c = Chunk {
            layer,
            start: start as u32,
            end: end as u32,
            codec,
            compressed: zstd_level.is_some(),
            payload,
            state,
            checksum: 0,
        };
        c.checksum = c.compute_checksum();
        Ok(c)
    }

    pub fn compute_checksum(&self) -> u32 {
        let mut h = crc32fast::Hasher::new();
        h.update(&self.layer.to_le_bytes());
        h.update(&self.start.to_le_bytes());
        h.update(&self.end.to_le_bytes());
        h.update(self.codec.name().as_bytes());
        h.update(&[self.compressed as u8]);
        h.update(&self.payload);
        h.update(&self.state);
        h.finalize()
    }

    pub fn verify(&self) -> Result<()> {
        if self.compute_checksum() != self.checksum {
            return Err(KvError::Checksum {
                layer: self.layer,
                start: self.start,
                end: self.end,
            });
        }
        Ok(())
    }

    pub fn n_tokens(&self) -> usize {
        (self.end - self.start) as usize
    }
}

/// Builds layers from chunks arriving layer-major (layer 0 tokens 0..n, then layer 1, ...).
/// A layer may start past position 0 (a sliding-window layer cut to what a later token can
/// see). A chunk that fails its checksum, comes out of order or does not fit is an error and
/// is never used. Memory follows what arrives: a layer's buffers are reserved (fallibly) when
/// its first chunk has passed its checks, never from a header's claims alone.
pub struct Reassembler {
    n_layers: usize,
    n_tokens: usize,
    /// Per layer, the first position the stream carries.
    starts: Vec<usize>,
    n_kv_head: usize,
    head_dim: usize,
    next_layer: usize,
    next_start: usize,
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    /// The codec every chunk must carry (the stream's header names one).
    codec: Option<Codec>,
    /// A hybrid model's state shape: a layer that starts at the segment's end is a recurrent
    /// layer, its one chunk carries a state of this shape.
    state: Option<Recurrence>,
    /// Per layer, its head size and whether it reads another layer's KV (then no chunk
    /// carries it: it is complete as soon as it is due).
    layers: LayerMap,
    /// Layers that read another's KV, complete and not yet taken (`take_unowned`).
    unowned: Vec<(usize, LayerKv)>,
}

impl Reassembler {
    pub fn new(n_layers: usize, n_tokens: usize, n_kv_head: usize, head_dim: usize) -> Self {
        Self {
            n_layers,
            n_tokens,
            starts: vec![0; n_layers],
            n_kv_head,
            head_dim,
            next_layer: 0,
            next_start: 0,
            k: vec![Vec::new(); n_kv_head],
            v: vec![Vec::new(); n_kv_head],
            codec: None,
            state: None,
            layers: LayerMap::default(),
            unowned: Vec::new(),
        }
    }

    /// A model whose layers differ in head size or read other layers' KV (`LayerMap`): its
    /// lists one per layer (or empty), set before the starts.
    pub fn with_layers(mut self, m: LayerMap) -> Result<Self> {
        m.check(self.n_layers, usize::MAX)?;
        self.layers = m;
        self.skip_unowned();
        Ok(self)
    }

    /// Layers complete without a chunk since the last call: those that read another layer's
    /// KV (no positions of their own), in order. Take them after every `push`.
    pub fn take_unowned(&mut self) -> Vec<(usize, LayerKv)> {
        std::mem::take(&mut self.unowned)
    }

    /// The head size of layer `l`.
    fn dim(&self, l: usize) -> usize {
        self.layers.head_dim(l, self.head_dim)
    }

    /// Past every due layer that reads another's KV.
    fn skip_unowned(&mut self) {
        while let Some(src) = self.layers.reads(self.next_layer) {
            let l = self.next_layer;
            let kv = LayerKv::reading(self.n_kv_head, self.dim(l), self.n_tokens, src);
            self.unowned.push((l, kv));
            self.next_layer += 1;
        }
        self.next_start = self.starts.get(self.next_layer).copied().unwrap_or(0);
    }

    /// A stream of a hybrid model whose recurrent layers' states have shape `s` (checked
    /// against the model later: which layers hold one is the model's to say).
    pub fn with_state(mut self, s: Option<Recurrence>) -> Self {
        self.state = s;
        self
    }

    /// Every chunk must be in `codec` (what the stream's header announced).
    pub fn with_codec(mut self, codec: Codec) -> Self {
        self.codec = Some(codec);
        self
    }

    /// A stream that starts at layer `first` (the layers below are computed elsewhere).
    pub fn starting_at(mut self, first: usize) -> Self {
        self.next_layer = first.min(self.n_layers);
        self.unowned.clear();
        self.skip_unowned();
        self
    }

    /// The first position each layer carries (empty: every layer from 0). Refused unless one
    /// per layer, each before the segment's end (or at it: a recurrent layer, in a stream
    /// that has a state shape).
    pub fn with_starts(mut self, starts: &[usize]) -> Result<Self> {
        if starts.is_empty() {
            return Ok(self);
        }
        let at_end_ok = |l: usize| self.state.is_some() || self.layers.reads(l).is_some();
        if starts.len() != self.n_layers
            || starts
                .iter()
                .enumerate()
                .any(|(l, &s)| s > self.n_tokens || (s == self.n_tokens && s > 0 && !at_end_ok(l)))
        {
            return Err(KvError::Shape(format!(
                "{} layer starts for {} layers of {} tokens",
                starts.len(),
                self.n_layers,
                self.n_tokens
            )));
        }
        self.starts = starts.to_vec();
        self.next_start = self.starts.get(self.next_layer).copied().unwrap_or(0);
        Ok(self)
    }

    pub fn is_complete(&self) -> bool {
        self.next_layer == self.n_layers
    }

    /// Index of the next layer expected (layers completed, counting skipped ones).
    pub fn layers_done(&self) -> usize {
        self.next_layer
    }

    /// Accept one chunk; returns the layer it completes, if any.
    pub fn push(&mut self, c: &Chunk) -> Result<Option<(usize, LayerKv)>> {
        c.verify()?;
        if self.is_complete()
            || c.layer as usize != self.next_layer
            || c.start as usize != self.next_start
        {
            return Err(KvError::Order {
                want_layer: self.next_layer as u32,
                want_start: self.next_start as u32,
                layer: c.layer,
                start: c.start,
            });
        }
        if self.codec.is_some_and(|want| want != c.codec) {
            return Err(KvError::Shape(format!(
                "a chunk in {} inside a stream of {}",
                c.codec.name(),
                self.codec.map_or("", |x| x.name())
            )));
        }
        if c.end < c.start || c.end as usize > self.n_tokens || c.n_tokens() > MAX_CHUNK_TOKENS {
            return Err(KvError::Shape(format!(
                "tokens {}..{} in a segment of {} (at most {MAX_CHUNK_TOKENS} a chunk)",
                c.start, c.end, self.n_tokens
            )));
        }
        let dim = self.dim(self.next_layer);
        let (k, v) = codec::decode(
            c.codec,
            c.compressed,
            &c.payload,
            self.n_kv_head,
            dim,
            c.n_tokens(),
        )?;
        // No model makes infinite or NaN keys and values: such a chunk is forged or broken.
        if k.iter().chain(&v).flatten().any(|x| !x.is_finite()) {
            return Err(KvError::Shape(format!(
                "layer {} tokens {}..{}: values that are not finite",
                c.layer, c.start, c.end
            )));
        }
        let stateful = self.starts[self.next_layer] == self.n_tokens && self.n_tokens > 0;
        if stateful {
            return self.push_state(c);
        }
        if !c.state.is_empty() {
            return Err(KvError::Shape(format!(
                "layer {}: a state on a layer that holds positions",
                c.layer
            )));
        }
        let first_of_layer = c.start as usize == self.starts[self.next_layer];
        let rest = (self.n_tokens - self.starts[self.next_layer]) * dim;
        for (dst, src) in self.k.iter_mut().zip(k).chain(self.v.iter_mut().zip(v)) {
            if first_of_layer {
                dst.try_reserve_exact(rest)
                    .map_err(|e| KvError::Shape(format!("cannot hold the layer: {e}")))?;
            }
            dst.extend_from_slice(&src);
        }
        self.next_start = c.end as usize;
        if self.next_start < self.n_tokens {
            return Ok(None);
        }
        let k = std::mem::replace(&mut self.k, vec![Vec::new(); self.n_kv_head]);
        let v = std::mem::replace(&mut self.v, vec![Vec::new(); self.n_kv_head]);
        let idx = self.next_layer;
        let layer = LayerKv::from_heads(dim, k, v)?.starting_at(self.starts[idx]);
        Ok(Some((idx, self.advance(layer))))
    }

    /// A recurrent layer's one chunk (its positions checked empty by `push`): the state, of the
    /// stream's shape and finite.
    fn push_state(&mut self, c: &Chunk) -> Result<Option<(usize, LayerKv)>> {
        let bad = |what: &str| KvError::Shape(format!("layer {}: {what}", c.layer));
        let shape = self
            .state
            .ok_or_else(|| bad("a state in a stream without one"))?;
        if c.start != c.end || c.n_tokens() != 0 {
            return Err(bad("a recurrent layer's chunk holds positions"));
        }
        let state = Recurrent::from_le_bytes(&shape, &c.state)
            .ok_or_else(|| bad("a state not of the model's size, or not finite"))?;
        let layer = LayerKv::recurrent(
            self.n_kv_head,
            self.dim(self.next_layer),
            self.n_tokens,
            Arc::new(state),
        );
        let idx = self.next_layer;
        Ok(Some((idx, self.advance(layer))))
    }

    /// Layer `layer` is complete: expect the next.
    fn advance(&mut self, layer: LayerKv) -> LayerKv {
        self.next_layer += 1;
        self.skip_unowned();
        layer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(n: usize, seed: f32) -> LayerKv {
        let (h, d) = (2, 32);
        let mut kv = LayerKv::new(h, d);
        let k: Vec<f32> = (0..n * h * d)
            .map(|i| (i as f32 * 0.37 + seed).sin())
            .collect();
        let v: Vec<f32> = (0..n * h * d)
            .map(|i| (i as f32 * 0.11 - seed).cos())
            .collect();
        kv.append(&k, &v, n);
        kv
    }

    fn chunks(layers: &[LayerKv], per: usize) -> Vec<Chunk> {
        let mut out = Vec::new();
        for (l, kv) in layers.iter().enumerate() {
            let mut s = 0;
            while s < kv.len() {
                let e = (s + per).min(kv.len());
                out.push(Chunk::encode(l as u32, kv, s, e, Codec::F16, None).unwrap());
                s = e;
            }
        }
        out
    }

    #[test]
    fn reassembles_layer_major_losslessly() {
        let layers = vec![layer(10, 0.0), layer(10, 1.0), layer(10, 2.0)];
        let mut r = Reassembler::new(3, 10, 2, 32);
        let mut got = Vec::new();
        for c in chunks(&layers, 4) {
            if let Some((i, l)) = r.push(&c).unwrap() {
                assert_eq!(i, got.len());
                got.push(l);
            }
        }
        assert!(r.is_complete());
        assert_eq!(got, layers);
    }

    #[test]
    fn a_stream_starting_at_a_later_layer() {
        let layers = vec![layer(5, 0.0), layer(5, 1.0), layer(5, 2.0)];
        let cs = chunks(&layers, 4);
        let mut r = Reassembler::new(3, 5, 2, 32).starting_at(1);
        // Layer 0 is not part of this stream.
        assert!(matches!(r.push(&cs[0]), Err(KvError::Order { .. })));
        let got: Vec<_> = cs[2..].iter().filter_map(|c| r.push(c).unwrap()).collect();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(got[1].1, layers[2]);
        assert!(r.is_complete());
    }

    #[test]
    fn corrupt_reordered_and_misfit_chunks_are_rejected() {
        let layers = vec![layer(6, 0.0), layer(6, 1.0)];
        let cs = chunks(&layers, 3);
        // Corrupted payload.
        let mut bad = cs[0].clone();
        bad.payload[5] ^= 1;
        let mut r = Reassembler::new(2, 6, 2, 32);
        assert!(matches!(r.push(&bad), Err(KvError::Checksum { .. })));
        // Out of order.
        assert!(matches!(r.push(&cs[1]), Err(KvError::Order { .. })));
        assert!(matches!(r.push(&cs[2]), Err(KvError::Order { .. })));
        // Truncated payload with a re-sealed checksum: the shape check catches it.
        let mut short = cs[0].clone();
        short.payload.truncate(10);
        short.checksum = short.compute_checksum();
        assert!(matches!(r.push(&short), Err(KvError::Shape(_))));
        // A chunk running past the segment.
        let mut long = cs[0].clone();
        long.end = 99;
        long.checksum = long.compute_checksum();
        assert!(r.push(&long).is_err());
        // The good stream is still accepted after the rejections.
        for c in &cs {
            r.push(c).unwrap();
        }
        assert!(r.is_complete());
        assert!(r.push(&cs[0]).is_err());
    }
}
