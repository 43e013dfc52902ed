//! A weight matrix as the kernels hold it (packed quantized, or floats as stored), and a
//! linear layer: the matrix and its bias.

use std::sync::Arc;

use crate::kernels::{FloatMatrix, QMatrix};
use crate::{EngineError, Result};

/// A weight matrix: the packed kernels for the quantized formats, the float GEMM for F32,
/// F16 and BF16 (kept as the file stores them).
pub(crate) enum Matrix {
    Own(QMatrix),
    Float(FloatMatrix),
}

impl Matrix {
    /// Bytes held in memory, as the kernels read them.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Matrix::Own(m) => m.bytes(),
            Matrix::Float(m) => m.bytes(),
        }
    }

    pub(crate) fn dims(&self) -> (usize, usize) {
        match self {
            Matrix::Own(m) => (m.out_dim(), m.in_dim()),
            Matrix::Float(m) => (m.out_dim(), m.in_dim()),
        }
    }

    pub(crate) fn matmul(&self, x: &[f32], rows: usize, in_dim: usize) -> Result<Vec<f32>> {
        debug_assert_eq!(in_dim, self.dims().1);
        Ok(match self {
            Matrix::Own(m) => m.matmul(x, rows),
            Matrix::Float(m) => m.matmul(x, rows),
        })
    }

    /// Rows `ids` of the matrix, as f32 (embedding lookup).
    pub(crate) fn rows(&self, ids: &[u32]) -> Result<Vec<f32>> {
        match self {
            Matrix::Own(m) => Ok(ids
                .iter()
                .flat_map(|&i| m.dequantize_row(i as usize))
                .collect()),
            Matrix::Float(m) => {
                let k = m.in_dim();
                let mut out = vec![0f32; ids.len() * k];
                for (&i, y) in ids.iter().zip(out.chunks_exact_mut(k)) {
                    m.row(i as usize, y);
                }
                Ok(out)
            }
        }
    }
}

/// A projection: `x · Wᵀ + b`.
pub(crate) struct Linear {
    pub(crate) weight: Arc<Matrix>,
    pub(crate) bias: Option<Vec<f32>>,
    pub out_dim: usize,
    pub in_dim: usize,
}

impl Linear {
    /// Bytes of its weight as held in memory.
    pub fn weight_bytes(&self) -> usize {
        self.weight.bytes()
    }

    /// `rows` input rows of `in_dim` floats -> `rows` output rows of `out_dim`.
    /// Each output row depends only on its input row, so a token's result does not depend on
    /// which other tokens share the call.
    pub fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        if x.len() != rows * self.in_dim {
            return Err(EngineError::Input(format!(
                "linear input has {} floats, expected {rows} x {}",
                x.len(),
                self.in_dim
            )));
        }
        let mut out = self.weight.matmul(x, rows, self.in_dim)?;
        self.add_bias(&mut out);
        Ok(out)
    }

    fn add_bias(&self, out: &mut [f32]) {
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(self.out_dim) {
                for (o, bb) in row.iter_mut().zip(b) {
                    *o += bb;
                }
            }
        }
    }

    /// Several projections of the same input in one parallel call (same results as one
    /// `forward` each), into `outs` (one buffer per projection, reused: see
    /// `kernels::matmul_many_into`).
    pub fn forward_many_into(
        ls: &[&Linear],
        x: &[f32],
        rows: usize,
        outs: &mut [Vec<f32>],
    ) -> Result<()> {
        if outs.len() != ls.len() {
            return Err(EngineError::Input(format!(
                "{} outputs for {} projections",
                outs.len(),
                ls.len()
            )));
        }
        let own: Option<Vec<&QMatrix>> = ls
            .iter()
            .map(|l| match &*l.weight {
                Matrix::Own(m) if l.in_dim == m.in_dim() && x.len() == rows * l.in_dim => Some(m),
                _ => None,
            })
            .collect();
        let Some(own) = own else {
            for (l, out) in ls.iter().zip(outs.iter_mut()) {
                *out = l.forward(x, rows)?;
            }
            return Ok(());
        };
        crate::kernels::matmul_many_into(&own, x, rows, outs);
        for (l, out) in ls.iter().zip(outs.iter_mut()) {
            l.add_bias(out);
        }
        Ok(())
    }
}
