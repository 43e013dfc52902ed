//! Run a model over calibration token sequences and keep, per layer, what alignment needs:
//! hidden rows of sampled tokens (for CKA/RSA), position-free K and V of every token (for the
//! adapters), and per key channel the query and key energy (for ThinK channel selection).

use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::Model;

use crate::Result;

/// Which tokens of each sequence feed the similarity measures.
#[derive(Debug, Clone, Copy)]
pub struct Sampling {
    /// Leading positions left out: the first tokens act as attention sinks with hidden norms
    /// orders of magnitude above the rest, and would decide a linear CKA on their own.
    pub skip_first: usize,
    /// Every `stride`-th token after that.
    pub stride: usize,
}

#[derive(Debug, Default, Clone)]
pub struct LayerData {
    /// `[sim_rows, n_embd]`: the layer's output for the sampled tokens.
    pub hidden: Vec<f32>,
    /// `[tokens, kv_width]` keys with RoPE undone, and values.
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    /// Per key channel: Σ over tokens of the squared rotated key, and of the squared rotated
    /// queries of the heads that read this KV head.
    pub key_energy: Vec<f64>,
    pub query_energy: Vec<f64>,
}

#[derive(Debug, Clone)]
pub struct Calibration {
    pub n_embd: usize,
    pub kv_width: usize,
    pub sim_rows: usize,
    pub tokens: usize,
    pub layers: Vec<LayerData>,
}

/// Collect over `sequences` (each starts at position 0). `progress(done, total)` is called
/// after each sequence.
pub fn collect(
    model: &Model,
    sequences: &[Vec<u32>],
    sampling: Sampling,
    mut progress: impl FnMut(usize, usize),
) -> Result<Calibration> {
    crate::attention_only(model)?;
    let c = &model.cfg;
    let kv_width = c.n_kv_head * c.head_dim;
    let mut layers = vec![
        LayerData {
            key_energy: vec![0.0; kv_width],
            query_energy: vec![0.0; kv_width],
            ..Default::default()
        };
        c.n_layer
    ];
    let (mut sim_rows, mut tokens) = (0, 0);
    let group = c.n_head / c.n_kv_head.max(1);
    for (i, ids) in sequences.iter().enumerate() {
        if ids.is_empty() {
            continue;
        }
        let picked: Vec<usize> = (sampling.skip_first..ids.len())
            .step_by(sampling.stride.max(1))
            .collect();
        let mut pass = PrefillPass::new(model, ids, 0)?;
        for (l, data) in layers.iter_mut().enumerate() {
            let q = model.queries(l, pass.hidden(), 0)?;
            pass.run_layer(model, None)?;
            let x = pass.hidden();
            for &t in &picked {
                data.hidden
                    .extend_from_slice(&x[t * c.n_embd..(t + 1) * c.n_embd]);
            }
            let kv = pass.layer_kv(l);
            for row in kv.key_rows().chunks_exact(kv_width) {
                for (e, k) in data.key_energy.iter_mut().zip(row) {
                    *e += (*k as f64).powi(2);
                }
            }
            for row in q.chunks_exact(c.n_embd) {
                for (h, qh) in row.chunks_exact(c.head_dim).enumerate() {
                    let kvh = h / group.max(1);
                    let e = &mut data.query_energy[kvh * c.head_dim..(kvh + 1) * c.head_dim];
                    for (e, v) in e.iter_mut().zip(qh) {
                        *e += (*v as f64).powi(2);
                    }
                }
            }
            data.keys.extend(model.unrotated_keys(kv, 0)?);
            data.values.extend(kv.value_rows());
        }
        sim_rows += picked.len();
        tokens += ids.len();
        progress(i + 1, sequences.len());
    }
    Ok(Calibration {
        n_embd: c.n_embd,
        kv_width,
        sim_rows,
        tokens,
        layers,
    })
}

impl Calibration {
    /// Hidden rows of layer `l` as f64 for the similarity measures.
    pub fn hidden_f64(&self, l: usize) -> Vec<f64> {
        self.layers[l].hidden.iter().map(|&v| v as f64).collect()
    }
}
