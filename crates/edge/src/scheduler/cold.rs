//! A private prompt prefilled layer by layer while its cloud prompt's layers land.

use std::sync::Arc;
use std::time::Instant;

use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::{Model, Sequence, TokenLogprobs};

use super::Failure;
use crate::layer_stream::LayerStream;
use crate::pipeline::{LayerTiming, Timeline};

/// A finished cold prefill: the sequence, its last-row logits, the prompt's row scores.
pub(super) type Finished = (Sequence, Vec<f32>, Vec<TokenLogprobs>);

/// A private prompt prefilled one layer at a time as a cold cloud prompt's layers land.
pub(super) struct Cold {
    pub(super) stream: Arc<LayerStream>,
    pub(super) pass: Option<PrefillPass>,
    pub(super) rows: usize,
    pub(super) timeline: Timeline,
}

impl Cold {
    /// Run the layers that have landed, each costing `rows / n_layer` of the step's prefill
    /// budget (one layer at least, so a cold prompt always moves). The sequence and its first
    /// logits once the last layer ran and the prompt is resolved.
    pub(super) fn run(
        &mut self,
        model: &Model,
        budget: &mut usize,
        since: Instant,
        score: Option<(usize, &[u32])>,
    ) -> Result<Option<Finished>, Failure> {
        let Some(pass) = self.pass.as_mut() else {
            return Err(Failure::internal("cold prefill already finished"));
        };
        let n = model.cfg.n_layer;
        let cost = self.rows.div_ceil(n).max(1);
        let secs = |t: Instant| t.saturating_duration_since(since).as_secs_f64();
        let mut ran = 0;
        while pass.next_layer() < n && (ran == 0 || *budget >= cost) {
            let l = pass.next_layer();
            let Some(landed) = self.stream.layer(l) else {
                break;
            };
            let t0 = Instant::now();
            pass.run_layer(model, Some(&landed.kv))
                .map_err(|e| Failure::internal(e.to_string()))?;
            *budget = budget.saturating_sub(cost);
            ran += 1;
            self.timeline.layers.push(LayerTiming {
                layer: l,
                arrived: secs(landed.at),
                compute_start: secs(t0),
                compute_end: secs(Instant::now()),
                wire_bytes: landed.wire_bytes,
            });
        }
        match self.stream.outcome() {
            Some(Err(e)) if e.busy => Err(Failure::busy(e)),
            Some(Err(e)) => Err(Failure::no_cloud_prompt(e)),
            Some(Ok(prefix)) if pass.next_layer() == n => {
                let pass = self
                    .pass
                    .take()
                    .ok_or_else(|| Failure::internal("cold prefill already finished"))?;
                let scores = match score {
                    Some((top, ids)) => {
                        let x = pass.hidden();
                        let rows = &x[..x.len() - model.cfg.n_embd];
                        model
                            .score_rows(rows, &ids[1..], top)
                            .map_err(|e| Failure::internal(e.to_string()))?
                    }
                    None => Vec::new(),
                };
                let (seq, logits) = pass
                    .finish(model, prefix)
                    .map_err(|e| Failure::internal(e.to_string()))?;
                Ok(Some((seq, logits, scores)))
            }
            _ => Ok(None),
        }
    }

    /// Private layers that ran before the prompt's last layer landed.
    pub(super) fn overlapped(&self) -> usize {
        let t = &self.timeline.layers;
        let last = t.iter().map(|l| l.arrived).fold(0.0, f64::max);
        t.iter().filter(|l| l.compute_start < last).count()
    }
}
