//! Attention over a read-only shared prefix (the cloud prompt's KV) and a private causal
//! segment (the edge prompt and the answer), joined by the log-sum-exp merge of docs/design.md §2.
//!
//! Every query row keeps a running softmax state `(m, l, acc)` and consumes keys one at a
//! time in absolute position order. Folding the private keys into the state left by the
//! prefix *is* the LSE merge (`merge` below computes it for two independent partials), and
//! because the float operations per query depend only on the keys it sees, not on how rows
//! are batched or how the context is cut into segments, split inference, chunked prefill and
//! one-shot prefill produce bit-identical attention outputs.
//!
//! The files: the running state, partials and the merge here; the scalar reference
//! (`scalar.rs`); the choice of kernel for a set of queries (`dispatch.rs`); the batch, its
//! shared-prefix tiles and tasks (`batch.rs`); the kernels of each ISA (`x86/avx2.rs`,
//! `x86/few.rs` and `x86/wide.rs` for AVX-512, `arm/neon.rs`); the tests (`tests.rs`).

use half::f16;

#[cfg(target_arch = "aarch64")]
mod arm;
mod batch;
mod dispatch;
mod scalar;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use batch::{attend_batch, attend_batch_kept, attend_batch_scaled, KeptView, KvView, Scores};
use scalar::{attend_impl, fold_scalar};

/// Largest head dimension the stack buffers hold.
pub const MAX_HEAD_DIM: usize = 512;
/// Keys converted from f16 and scored per block.
const BLOCK: usize = 32;

/// Running softmax over keys for one query and head. `acc / l` is the attention output and
/// `m + ln(l)` its log-sum-exp.
#[derive(Clone)]
pub struct State {
    m: f32,
    l: f32,
    acc: [f32; MAX_HEAD_DIM],
    dim: usize,
}

/// A finished attention partial: normalised output and log-sum-exp of the scores.
#[derive(Clone, Debug, PartialEq)]
pub struct Partial {
    pub out: Vec<f32>,
    pub lse: f32,
}

impl State {
    pub fn new(dim: usize) -> Self {
        assert!(dim <= MAX_HEAD_DIM, "head dim {dim} > {MAX_HEAD_DIM}");
        Self {
            m: f32::NEG_INFINITY,
            l: 0.0,
            acc: [0.0; MAX_HEAD_DIM],
            dim,
        }
    }

    /// Consume `n` keys/values (token-major rows of `dim` f16) for query `q` (pre-scaled).
    pub fn attend(&mut self, q: &[f32], keys: &[f16], values: &[f16], n: usize) {
        dispatch::attend(self, q, keys, values, n)
    }

    /// Back to `new(dim)`'s state, zeroing only the accumulator's first `dim` values (the
    /// rest are never read).
    fn reset(&mut self, dim: usize) {
        assert!(dim <= MAX_HEAD_DIM, "head dim {dim} > {MAX_HEAD_DIM}");
        self.m = f32::NEG_INFINITY;
        self.l = 0.0;
        self.acc[..dim].fill(0.0);
        self.dim = dim;
    }

    pub fn finish(&self) -> Partial {
        let inv = 1.0 / self.l;
        Partial {
            out: self.acc[..self.dim].iter().map(|a| a * inv).collect(),
            lse: self.m + self.l.ln(),
        }
    }

    fn write_output(&self, out: &mut [f32]) {
        let inv = 1.0 / self.l;
        for (o, a) in out.iter_mut().zip(&self.acc[..self.dim]) {
            *o = a * inv;
        }
    }
}

/// The exact two-part merge (docs/design.md §2): softmax over the union of two key sets from the
/// softmaxes over each set and their log-sum-exps.
pub fn merge(a: &Partial, b: &Partial) -> Partial {
    let m = a.lse.max(b.lse);
    let (wa, wb) = ((a.lse - m).exp(), (b.lse - m).exp());
    let z = wa + wb;
    Partial {
        out: a
            .out
            .iter()
            .zip(&b.out)
            .map(|(x, y)| (wa * x + wb * y) / z)
            .collect(),
        lse: m + z.ln(),
    }
}

/// The paper's eq. 5 read with a constant weight: `alpha * A_cloud + (1 - alpha) * A_edge`.
/// Not exact; kept only as an ablation.
pub fn fixed_alpha(a: &Partial, b: &Partial, alpha: f32) -> Vec<f32> {
    a.out
        .iter()
        .zip(&b.out)
        .map(|(x, y)| alpha * x + (1.0 - alpha) * y)
        .collect()
}
