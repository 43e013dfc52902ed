//! What a model's layers hold beyond one shape for all: each layer's head size, and the layer
//! whose KV it reads (Gemma 4: sliding and global layers of different head sizes, and last
//! layers that read an earlier layer's KV and own none). Streams, files and signatures name
//! it; for every other model it is empty, and they read as before.

use std::sync::Arc;

use edgeprompt_engine::config::ModelConfig;
use edgeprompt_engine::LayerKv;

use crate::{KvError, Result};

/// Per layer, its head size and the layer whose KV it attends with; both empty when every
/// layer has the model's one head size and its own KV.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerMap {
    pub head_dims: Vec<usize>,
    pub kv_sources: Vec<usize>,
}

impl LayerMap {
    /// From per-layer lists; empty if they say nothing beyond `head_dim` for every layer and
    /// each layer's own KV.
    pub fn new(head_dims: Vec<usize>, kv_sources: Vec<usize>, head_dim: usize) -> Self {
        let plain = head_dims.iter().all(|&d| d == head_dim)
            && kv_sources.iter().enumerate().all(|(l, &s)| s == l);
        match plain {
            true => Self::default(),
            false => Self {
                head_dims,
                kv_sources,
            },
        }
    }

    /// The model's.
    pub fn of(cfg: &ModelConfig) -> Self {
        Self::new(
            (0..cfg.n_layer).map(|l| cfg.head_dim_of(l)).collect(),
            (0..cfg.n_layer).map(|l| cfg.kv_source_of(l)).collect(),
            cfg.head_dim,
        )
    }

    /// What a prefix's layers say of themselves (`head_dim`: the first layer's).
    pub fn of_layers(layers: &[Arc<LayerKv>]) -> Self {
        Self::new(
            layers.iter().map(|l| l.head_dim).collect(),
            layers
                .iter()
                .enumerate()
                .map(|(i, l)| l.kv_of.unwrap_or(i))
                .collect(),
            layers.first().map_or(0, |l| l.head_dim),
        )
    }

    /// Checked against a model of `n_layers` whose heads are at most `max_head_dim`: one entry
    /// per layer in each list (or none), each source an earlier layer that owns its KV.
    pub fn check(&self, n_layers: usize, max_head_dim: usize) -> Result<()> {
        let bad = |what: String| KvError::Shape(format!("layer map: {what}"));
        if self.head_dims.len() != self.kv_sources.len()
            || !(self.head_dims.is_empty() || self.head_dims.len() == n_layers)
        {
            return Err(bad(format!(
                "{} head sizes and {} sources for {n_layers} layers",
                self.head_dims.len(),
                self.kv_sources.len()
            )));
        }
        if let Some(d) = self.head_dims.iter().find(|&&d| d == 0 || d > max_head_dim) {
            return Err(bad(format!("a head size of {d}")));
        }
        for (l, &s) in self.kv_sources.iter().enumerate() {
            if s > l || (s < l && self.kv_sources[s] != s) {
                return Err(bad(format!("layer {l} reads layer {s}")));
            }
        }
        Ok(())
    }

    /// Layer `l`'s head size (`head_dim` when the map is empty).
    pub fn head_dim(&self, l: usize, head_dim: usize) -> usize {
        self.head_dims.get(l).copied().unwrap_or(head_dim)
    }

    /// The layer whose KV layer `l` reads, if another's: `l` carries none.
    pub fn reads(&self, l: usize) -> Option<usize> {
        self.kv_sources.get(l).copied().filter(|&s| s != l)
    }

    /// The largest head size (`head_dim` when empty).
    pub fn max_head_dim(&self, head_dim: usize) -> usize {
        self.head_dims.iter().copied().max().unwrap_or(head_dim)
    }
}
