//! Gemma 4's per-layer embeddings (PLE): each layer adds to its output a projection of its own
//! small input per token, made from a table row of the token and a projection of the token's
//! embedding (llama.cpp's `project_per_layer_inputs`):
//!
//! `input_l = (rms_norm(P_l . e / sqrt(width)) + T[id]_l * sqrt(n)) / sqrt(2)` for the scaled
//! embedding `e`, then after the layer's FFN `x += rms_norm(W_up . (gelu(W_gate . x) * input_l))`.
//!
//! The table (vocabulary x layers x `n` values: most of E2B's file) is read where it lies in
//! the file, mapped and never copied or expanded: a token's slice for one layer is dequantized
//! when that layer runs. Every step is per row, so a split, a chunked and a one-shot prefill
//! give the same bits.

use std::fs::File;

use memmap2::Mmap;

use crate::gguf::{Content, Dtype};
use crate::linear::Linear;
use crate::{EngineError, Result};

/// The token table, as the file stores it.
pub(crate) struct Table {
    map: Mmap,
    dtype: Dtype,
    /// Bytes of one token's row (every layer's values).
    row_bytes: usize,
    /// Bytes of one layer's values within a row.
    layer_bytes: usize,
    /// Values per layer.
    width: usize,
    rows: usize,
}

impl Table {
    /// The tensor `name` of `content`, mapped from `file`; its rows `n_layer * width` values
    /// wide, cut per layer at whole blocks.
    pub fn map(
        content: &Content,
        file: &File,
        name: &str,
        n_layer: usize,
        width: usize,
    ) -> Result<Self> {
        let info = content
            .tensor_infos
            .get(name)
            .ok_or_else(|| EngineError::Gguf(format!("missing tensor {name}")))?;
        let bad = |why: &str| EngineError::Gguf(format!("tensor {name}: {why}"));
        let [rows, cols] = info.dims[..] else {
            return Err(bad("not a matrix"));
        };
        if cols != n_layer * width {
            return Err(bad(&format!(
                "rows of {cols} values, expected {n_layer} layers of {width}"
            )));
        }
        if !crate::dequant::runs(info.dtype) {
            return Err(EngineError::Unsupported(format!(
                "tensor {name} is in {}, a format this engine does not run",
                info.dtype
            )));
        }
        let per_block = info.dtype.block().map_or(1, |(p, _)| p);
        if !width.is_multiple_of(per_block) {
            return Err(EngineError::Unsupported(format!(
                "{name}: {width} values per layer cut {}'s blocks of {per_block}",
                info.dtype
            )));
        }
        let row_bytes = info.dtype.bytes(cols).ok_or_else(|| bad("bad size"))?;
        let layer_bytes = info.dtype.bytes(width).ok_or_else(|| bad("bad size"))?;
        let len = row_bytes.checked_mul(rows).ok_or_else(|| bad("bad size"))?;
        let offset = content.tensor_data_offset + info.offset;
        // SAFETY: the file is opened read-only and only read through this map; llama.cpp maps
        // its weights the same way. The header check put the tensor inside the file.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map(file)
        }
        .map_err(|e| bad(&e.to_string()))?;
        Ok(Self {
            map,
            dtype: info.dtype,
            row_bytes,
            layer_bytes,
            width,
            rows,
        })
    }

    /// Bytes the table maps (pages of it are resident as tokens touch them).
    pub fn bytes(&self) -> usize {
        self.map.len()
    }

    /// Layer `l`'s values of each token of `ids`, times `scale`, into `out` (`[ids, width]`).
    fn layer_rows(&self, ids: &[u32], l: usize, scale: f32, out: &mut [f32]) -> Result<()> {
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(self.width)) {
            let id = id as usize;
            if id >= self.rows {
                return Err(EngineError::Input(format!(
                    "token id {id} is outside the per-layer table of {}",
                    self.rows
                )));
            }
            let at = id * self.row_bytes + l * self.layer_bytes;
            crate::dequant::row(self.dtype, &self.map[at..at + self.layer_bytes], o)?;
            o.iter_mut().for_each(|a| *a *= scale);
        }
        Ok(())
    }
}

/// The model's PLE weights: the table, each layer's slice of the embedding's projection, and
/// the norm of that projection.
pub(crate) struct PerLayer {
    pub table: Table,
    /// Per layer: rows `l * width..` of `per_layer_model_proj` (the embedding to `width`).
    pub proj: Vec<Linear>,
    pub proj_norm: Vec<f32>,
}

/// A layer's PLE weights: the gate from the hidden row, the projection back, its norm.
pub(crate) struct LayerPle {
    pub gate: Linear,
    pub proj: Linear,
    pub post_norm: Vec<f32>,
}

impl PerLayer {
    /// Layer `l`'s input for the rows of `ids`, whose scaled embeddings are `embedded`.
    pub fn input(&self, l: usize, ids: &[u32], embedded: &[f32], eps: f32) -> Result<Vec<f32>> {
        let n = self.table.width;
        let proj = &self.proj[l];
        let mut x = proj.forward(embedded, ids.len())?;
        let s = 1.0 / (proj.in_dim as f32).sqrt();
        x.iter_mut().for_each(|a| *a *= s);
        let mut x = crate::norm::rms_norm(&x, &self.proj_norm, eps);
        let mut t = vec![0f32; ids.len() * n];
        self.table.layer_rows(ids, l, (n as f32).sqrt(), &mut t)?;
        let half = 1.0 / 2f32.sqrt();
        for (a, b) in x.iter_mut().zip(&t) {
            *a = (*a + b) * half;
        }
        Ok(x)
    }

    /// Bytes held: the table as mapped, the projections.
    pub fn bytes(&self) -> usize {
        self.table.bytes() + self.proj.iter().map(|p| p.weight_bytes()).sum::<usize>()
    }
}

impl LayerPle {
    /// `x += rms_norm(proj . (gelu(gate . x) * input))` for `rows` rows of `x`.
    pub fn add(&self, x: &mut [f32], input: &[f32], rows: usize, eps: f32) -> Result<()> {
        let mut g = self.gate.forward(x, rows)?;
        crate::kernels::gelu_mul(&mut g, input);
        let mut y = self.proj.forward(&g, rows)?;
        crate::norm::rms_norm_in_place(&mut y, &self.post_norm, eps);
        for (a, b) in x.iter_mut().zip(&y) {
            *a += b;
        }
        Ok(())
    }

    pub fn matrices(&self) -> [&Linear; 2] {
        [&self.gate, &self.proj]
    }
}
