//! The whole model over a batch of sequences: each sequence's new tokens through every layer
//! (its KV read and appended where it lives), then the last rows' logits. Apart from
//! `model.rs` (one layer's forward pass), which knows nothing of sequences.

use std::sync::Arc;

use crate::kv::{LayerKv, PrefixKv};
use crate::model::{LayerInput, Model, PassTokens, Scratch};
use crate::sample::TokenLogprobs;
use crate::sequence::Sequence;
use crate::{EngineError, Result};

/// The largest scratch a thread keeps between passes (16 MB: a decode batch's, not a long
/// prefill's).
const KEEP_SCRATCH_FLOATS: usize = 4 << 20;

thread_local! {
    static SCRATCH: std::cell::Cell<Scratch> = Default::default();
}

thread_local! {
    /// The output norm's rows and the head's logits of this thread's last `forward_scoring`.
    static HEAD: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = Default::default();
}

impl Model {
    /// Run new tokens through the whole model for a batch of sequences; returns each
    /// sequence's last-row logits.
    pub fn forward(&self, batch: &mut [(&mut Sequence, &[u32])]) -> Result<Vec<Vec<f32>>> {
        let none = vec![None; batch.len()];
        Ok(self
            .forward_scoring(batch, &none)?
            .into_iter()
            .map(|(logits, _)| logits)
            .collect())
    }

    /// `forward`, and for each sequence with `score[i] = Some(top)` the log-probability of
    /// every fed token after the first, from the row before it, with `top` alternatives (the
    /// rows of a prompt a client asked to score). Logits are per row, so scoring leaves every
    /// last-row logit as `forward` gives it.
    #[allow(clippy::type_complexity)]
    pub fn forward_scoring(
        &self,
        batch: &mut [(&mut Sequence, &[u32])],
        score: &[Option<usize>],
    ) -> Result<Vec<(Vec<f32>, Vec<TokenLogprobs>)>> {
        let ids: Vec<u32> = batch.iter().flat_map(|(_, t)| t.iter().copied()).collect();
        if ids.is_empty() || batch.iter().any(|(_, t)| t.is_empty()) {
            return Err(EngineError::Input("no tokens to run".into()));
        }
        // Checked before any KV is written, so a refused batch leaves every sequence as it was.
        for (seq, t) in batch.iter() {
            if seq.len() + t.len() > self.max_positions() {
                return Err(EngineError::Input(format!(
                    "context of {} tokens exceeds the model's {}",
                    seq.len() + t.len(),
                    self.max_positions()
                )));
            }
        }
        let mut x = self.embed(&ids)?;
        let embedded = match self.layers_read_embeddings() {
            true => x.clone(),
            false => Vec::new(),
        };
        let tokens = PassTokens {
            ids: &ids,
            embedded: &embedded,
        };
        // This thread's scratch from its last pass: a batched decode step would otherwise
        // zero and fault in fresh buffers every step. A long prefill's (tens of MB) is let go.
        let mut scratch = SCRATCH.with(|c| c.take());
        for l in 0..self.cfg.n_layer {
            let mut parts: Vec<LayerInput> = batch
                .iter_mut()
                .map(|(seq, t)| seq.layer_input(self, l, t.len()))
                .collect();
            self.forward_layer(l, &mut x, tokens, &mut parts, &mut scratch)?;
        }
        if scratch.floats() <= KEEP_SCRATCH_FLOATS {
            SCRATCH.with(|c| c.set(scratch));
        }
        let d = self.cfg.n_embd;
        let mut last = Vec::with_capacity(batch.len() * d);
        let mut scores = Vec::with_capacity(batch.len());
        let mut r = 0;
        for (i, (seq, t)) in batch.iter_mut().enumerate() {
            let rows = &x[r * d..(r + t.len()) * d];
            scores.push(match score.get(i).copied().flatten() {
                Some(top) => self.score_rows(&rows[..rows.len() - d], &t[1..], top)?,
                None => Vec::new(),
            });
            r += t.len();
            last.extend_from_slice(&x[(r - 1) * d..r * d]);
            seq.push_tokens(t);
        }
        // The head's output lands in this thread's buffer, kept from call to call: a fresh
        // `[rows, vocab]` buffer per step (6 MB for a batch of 32 on SmolLM2) was page faults
        // and zeroing on the caller's thread while the pool's other threads waited.
        HEAD.with(|cell| {
            let mut buf = cell.borrow_mut();
            let (h, out) = &mut *buf;
            self.logits_into(&last, h, out)?;
            // Each row's copy (200 KB to 1 MB) made over the pool.
            let vocab = self.cfg.vocab_size;
            let mut rows = vec![Vec::new(); out.len() / vocab.max(1)];
            let out = &*out;
            crate::par::each(&mut rows, 4, &|i, r| {
                *r = out[i * vocab..(i + 1) * vocab].to_vec()
            });
            Ok(rows.into_iter().zip(scores).collect())
        })
    }

    /// The logits a single node has after the prompt `prefix` holds: its last token run again
    /// on the KV of the others (row arithmetic does not depend on the chunking, so this is the
    /// row the cloud computed). `None` when a sliding window already cut a position that
    /// token needs, or a recurrent layer holds only the state after it.
    pub fn prefix_logits(&self, prefix: &PrefixKv) -> Result<Option<Vec<f32>>> {
        let Some((&last, before)) = prefix.token_ids.split_last() else {
            return Ok(None);
        };
        if prefix.layers.iter().any(|l| l.state.is_some()) {
            return Ok(None);
        }
        let n = before.len();
        let cut = PrefixKv {
            fingerprint: prefix.fingerprint.clone(),
            token_ids: before.to_vec(),
            layers: prefix
                .layers
                .iter()
                .map(|l| {
                    let mut l = match l.kv_of {
                        Some(src) => LayerKv::reading(l.n_kv_head, l.head_dim, n, src),
                        None => (**l).clone(),
                    };
                    l.truncate(n.saturating_sub(l.start()));
                    Arc::new(l)
                })
                .collect(),
        };
        let fits = cut
            .layers
            .iter()
            .enumerate()
            .all(|(l, kv)| kv.start() <= self.cfg.visible_from(l, n));
        if !fits {
            return Ok(None);
        }
        let mut seq = if n == 0 {
            Sequence::new(self)
        } else {
            Sequence::with_prefix(self, Arc::new(cut))?
        };
        seq.prefill(self, &[last]).map(Some)
    }
}
