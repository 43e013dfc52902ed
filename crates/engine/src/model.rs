//! The model: GGUF weights and a forward pass the project owns, one layer at a time.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::gguf::Content;
use sha2::{Digest, Sha256};

use crate::attention::{attend_batch_kept, KeptView, KvView, Scores};
use crate::chat::ChatTemplate;
use crate::config::ModelConfig;
use crate::gguf::meta_str;
use crate::kv::{LayerKv, LayerSpan};
use crate::norm::{rms_norm, rms_norm_in_place, rms_norm_into};
use crate::recurrent::{convolve_qkv, head, short_conv, Params, Recurrence, Recurrent, Rows};
use crate::rope::Rope;
use crate::sample::{logprobs, TokenLogprobs};
use crate::tokenizer::Tokenizer;
use crate::weights::{Attention, DeltaNetWeights, Ffn, Linear, Mixer, ShortConvWeights, Weights};
use crate::{EngineError, Result};

/// Longest context the RoPE table is built for, whatever the GGUF claims.
const MAX_POSITIONS: usize = 32_768;
/// Entries (position x frequency) one RoPE table may hold: wide heads get fewer positions
/// (Gemma's 256-wide heads: 16 384) so the tables stay at 16 MB each.
const ROPE_TABLE_ENTRIES: usize = 1 << 21;

#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelInfo {
    pub path: PathBuf,
    pub file_bytes: u64,
    /// Per tensor type: bytes, and the kernels that run it.
    pub tensor_types: Vec<crate::weights::TensorType>,
    pub load_secs: f64,
    pub tied_output: bool,
}

pub struct Model {
    pub cfg: ModelConfig,
    pub tokenizer: Tokenizer,
    pub chat: Option<ChatTemplate>,
    /// SHA-256 of the GGUF file: both sides of a split must hold the same weights.
    pub fingerprint: String,
    pub info: ModelInfo,
    weights: Weights,
    rope: Rope,
    /// The sliding layers' RoPE (their own base), if the model has such layers.
    rope_local: Option<Rope>,
}

/// A pass's intermediate rows, kept from layer to layer: allocating them per layer cost page
/// faults and zeroing on tens of MB per layer in a long prefill (gate and up of 1024 rows of
/// Qwen 1.5B: 37 MB each).
#[derive(Default)]
pub struct Scratch {
    h: Vec<f32>,
    qkv: [Vec<f32>; 4],
    attn: Vec<f32>,
    o: Vec<f32>,
    gate_up: [Vec<f32>; 2],
    down: Vec<f32>,
}

impl Scratch {
    /// Floats held (capacity) over all buffers.
    pub(crate) fn floats(&self) -> usize {
        let all = [&self.h, &self.attn, &self.o, &self.down]
            .into_iter()
            .chain(&self.qkv)
            .chain(&self.gate_up);
        all.map(|v| v.capacity()).sum()
    }
}

/// Most rows a layer runs at once (`forward_layer`): llama.cpp's micro-batch.
const LAYER_ROWS: usize = 512;

/// One sequence's share of a layer call: its new rows are the next `rows` rows of the batch.
pub struct LayerInput<'a> {
    pub prefix: Option<&'a LayerKv>,
    /// Kept positions between the prefix and the private KV (a conversation's earlier turns).
    pub kept: Option<LayerSpan<'a>>,
    pub private: &'a mut LayerKv,
    pub rows: usize,
    /// Rows of `private` after these ones: on a layer reading another's KV (Gemma 4's last
    /// layers), which holds the whole pass's rows before this one runs, those of the pieces
    /// after this one (`forward_layer` sets it; 0 elsewhere).
    pub after: usize,
}

/// What every layer of a pass may read besides its hidden rows: the pass's token ids and
/// their scaled embeddings (Gemma 4's per-layer inputs are made from them, layer by layer;
/// other families pass them empty).
#[derive(Clone, Copy)]
pub struct PassTokens<'a> {
    pub ids: &'a [u32],
    pub embedded: &'a [f32],
}

impl LayerInput<'_> {
    /// The recurrent state this part's rows continue: its own, else the kept positions', else
    /// the prefix's, else the state before any token.
    fn start_state(&self, s: &Recurrence) -> Arc<Recurrent> {
        self.private
            .state
            .clone()
            .or_else(|| self.kept.and_then(|k| k.state().cloned()))
            .or_else(|| self.prefix.and_then(|p| p.state.clone()))
            .unwrap_or_else(|| Arc::new(Recurrent::zero(s)))
    }

    /// Positions before the private KV.
    fn before(&self) -> usize {
        self.kept
            .map(|k| k.end())
            .or(self.prefix.map(|p| p.end()))
            .unwrap_or(0)
    }
}

impl Model {
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let start = Instant::now();
        // The file's hash (its identity on the wire) is a fifth of a load: taken on its own
        // thread while the weights are read and repacked.
        std::thread::scope(|scope| {
            let hash = scope.spawn(|| file_sha256(path));
            let model = Self::load_parts(path);
            let fingerprint = hash
                .join()
                .map_err(|_| EngineError::Gguf(format!("{}: hashing failed", path.display())))??;
            let mut m = model?;
            m.fingerprint = fingerprint;
            m.info.load_secs = start.elapsed().as_secs_f64();
            Ok(m)
        })
    }

    /// Everything `load` makes but the fingerprint (left empty) and the load time.
    fn load_parts(path: &Path) -> Result<Self> {
        let io = |source| EngineError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let file_bytes = file.metadata().map_err(io)?.len();
        // Buffered: the metadata is read a few bytes at a time (Gemma 3's 262k-token
        // vocabulary took half a load in `read` calls).
        let mut content = Content::read(&mut std::io::BufReader::new(file), file_bytes)
            .map_err(|e| EngineError::Gguf(format!("{}: {e}", path.display())))?;
        let cfg = ModelConfig::from_gguf(&content)?;
        let tokenizer = Tokenizer::from_gguf(&content)?;
        let chat = match meta_str(&content, "tokenizer.chat_template") {
            Ok(src) => Some(template(&tokenizer, &src)?),
            Err(_) => None,
        };
        // The vocabulary as metadata values and the tokenizer's build are done with (Gemma 3:
        // ~110 MB of small allocations); give their pages back before the weights come in.
        content.metadata = Default::default();
        release_free_memory();
        let weights = Weights::load(&content, path, &cfg)?;
        drop(content);
        release_free_memory();
        let fingerprint = String::new();
        let positions = cfg
            .context_length
            .min(MAX_POSITIONS)
            .min(ROPE_TABLE_ENTRIES / (cfg.head_dim.max(cfg.head_dim_local) / 2));
        let f = &cfg.features;
        let rope = Rope::partial(
            cfg.head_dim,
            f.rope_dims,
            cfg.rope_base,
            cfg.rope_style,
            positions,
            weights.rope_factors.as_deref(),
            f.rope_attn_factor,
        );
        // The sliding layers' own base and head size; the divisors are the global layers'
        // (Gemma 4's proportional RoPE; no family with a window has others).
        let rope_local = cfg.window.map(|_| {
            Rope::partial(
                cfg.head_dim_local,
                cfg.rope_dims_local,
                cfg.rope_base_local,
                cfg.rope_style,
                positions,
                None,
                f.rope_attn_factor,
            )
        });
        let info = ModelInfo {
            path: path.to_path_buf(),
            file_bytes,
            tensor_types: weights.type_bytes.clone(),
            load_secs: 0.0,
            tied_output: weights.tied_output,
        };
        Ok(Self {
            cfg,
            tokenizer,
            chat,
            fingerprint,
            info,
            weights,
            rope,
            rope_local,
        })
    }

    /// Chat with a template the user gives (a base model's GGUF has none; this one replaces
    /// the file's own).
    pub fn set_chat_template(&mut self, src: &str) -> Result<()> {
        self.chat = Some(template(&self.tokenizer, src)?);
        Ok(())
    }

    /// The RoPE of layer `l` (none on a layer without: SmolLM3's every fourth).
    fn rope(&self, l: usize) -> Option<&Rope> {
        if !self.cfg.features.ropes(l) {
            return None;
        }
        Some(match &self.rope_local {
            Some(r) if self.cfg.window_of(l).is_some() => r,
            _ => &self.rope,
        })
    }

    pub fn max_positions(&self) -> usize {
        self.rope.max_positions()
    }

    /// Layer `l`'s KV, empty.
    pub fn new_layer_kv(&self, l: usize) -> LayerKv {
        LayerKv::new(self.cfg.n_kv_head, self.cfg.head_dim_of(l))
    }

    /// Keys of `kv` (tokens at positions `pos0..`) as token-major rows with RoPE undone
    /// (the global layers' RoPE: CE-LSLM maps full-attention models only).
    pub fn unrotated_keys(&self, kv: &LayerKv, pos0: usize) -> Result<Vec<f32>> {
        if kv.head_dim != self.cfg.head_dim || pos0 + kv.len() > self.max_positions() {
            return Err(EngineError::KvMismatch(format!(
                "keys of head size {} at {pos0}.., this model's heads are {}",
                kv.head_dim, self.cfg.head_dim
            )));
        }
        let mut k = kv.key_rows();
        let w = kv.n_kv_head * kv.head_dim;
        for (t, row) in k.chunks_exact_mut(w.max(1)).enumerate() {
            self.rope.unapply(row, pos0 + t);
        }
        Ok(k)
    }

    /// The rotated queries layer `l` computes from its input rows `x` (tokens at `pos0..`):
    /// what key-channel selection (ThinK) scores channels against.
    pub fn queries(&self, l: usize, x: &[f32], pos0: usize) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let rows = x.len() / c.n_embd;
        if l >= c.n_layer || x.len() != rows * c.n_embd || pos0 + rows > self.max_positions() {
            return Err(EngineError::Input(format!(
                "queries of layer {l} for {} floats at {pos0}..",
                x.len()
            )));
        }
        let w = &self.weights.layers[l];
        let a = match &w.mixer {
            Mixer::Attention(a) => a,
            Mixer::DeltaNet(_) | Mixer::ShortConv(_) => {
                return Err(EngineError::Input(format!(
                    "layer {l} is recurrent: it has no queries"
                )))
            }
        };
        let h = rms_norm(x, &w.attn_norm, c.rms_eps);
        let mut q = a.wq.forward(&h, rows)?;
        if let Some(n) = &a.q_norm {
            q = rms_norm(&q, n, c.rms_eps);
        }
        if let Some(r) = self.rope(l) {
            r.apply_rows(&mut q, c.q_dim_of(l), pos0);
        }
        Ok(q)
    }

    /// Weight bytes a decode step streams, and multiply-adds per token through the layers
    /// (for roofline figures).
    pub fn traffic(&self) -> (usize, usize) {
        self.weights.traffic()
    }

    /// Bytes of weight matrices held in memory (repacked, the embedding once).
    pub fn weight_bytes(&self) -> usize {
        self.weights.resident_bytes()
    }

    /// Whether a pass must keep its embeddings for the layers (`PassTokens`).
    pub fn layers_read_embeddings(&self) -> bool {
        self.weights.per_layer.is_some()
    }

    /// Hidden states for `ids` (`[ids.len(), n_embd]`).
    pub fn embed(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let mut x = self.weights.embed(ids, self.cfg.vocab_size)?;
        // Gemma scales its embeddings by sqrt(width), Granite by its multiplier.
        let s = self.cfg.features.embed_scale;
        if s != 1.0 {
            x.iter_mut().for_each(|a| *a *= s);
        }
        Ok(x)
    }

    /// Run layer `l` on the batch's hidden rows `x` in place. `parts` cut `x` into
    /// sequences, in order; each part's K/V are appended to its private cache. `scratch`
    /// holds the layer's intermediate rows; pass the same one for every layer of a pass.
    ///
    /// Rows run `LAYER_ROWS` at a time, each piece after the ones before it in its sequence
    /// (a row's arithmetic does not depend on the cut), so a long prompt's scratch stays that
    /// of `LAYER_ROWS` rows.
    pub fn forward_layer(
        &self,
        l: usize,
        x: &mut [f32],
        tokens: PassTokens,
        parts: &mut [LayerInput],
        scratch: &mut Scratch,
    ) -> Result<()> {
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        let d = self.cfg.n_embd;
        if x.len() != rows * d {
            return Err(EngineError::Input(format!(
                "layer input has {} floats for {rows} rows",
                x.len()
            )));
        }
        let reads = self.layers_read_embeddings();
        if reads && (tokens.ids.len() != rows || tokens.embedded.len() != rows * d) {
            return Err(EngineError::Input(format!(
                "layer input has {} ids and {} embedded floats for {rows} rows",
                tokens.ids.len(),
                tokens.embedded.len()
            )));
        }
        // A layer reading another's KV finds this pass's rows already there.
        let shared = !self.cfg.owns_kv(l) && !self.cfg.is_recurrent(l);
        // Checked for whole parts, before any piece: a refused call writes no KV.
        for part in parts.iter() {
            let new = if shared { 0 } else { part.rows };
            let end = part.before() + part.private.len() + new;
            if end > self.max_positions() {
                return Err(EngineError::Input(format!(
                    "context of {end} tokens exceeds the model's {}",
                    self.max_positions()
                )));
            }
        }
        if rows <= LAYER_ROWS {
            return self.layer_rows(l, x, tokens, parts, scratch);
        }
        // The cut, planned first: each piece as (part, rows of it) for consecutive parts
        // (a part without rows too, so that the parts of a piece are a run).
        let mut pieces: Vec<Vec<(usize, usize)>> = vec![Vec::new()];
        let mut n = 0;
        for (i, part) in parts.iter().enumerate() {
            let mut left = part.rows;
            loop {
                if n == LAYER_ROWS {
                    pieces.push(Vec::new());
                    n = 0;
                }
                let take = left.min(LAYER_ROWS - n);
                if let Some(cut) = pieces.last_mut() {
                    cut.push((i, take));
                }
                (n, left) = (n + take, left - take);
                if left == 0 {
                    break;
                }
            }
        }
        let mut row = 0;
        // Per part, its rows the pieces so far ran.
        let mut done = vec![0; parts.len()];
        for cut in &pieces {
            let n: usize = cut.iter().map(|c| c.1).sum();
            if n == 0 {
                continue;
            }
            let first = cut[0].0;
            let mut piece: Vec<LayerInput> = parts[first..first + cut.len()]
                .iter_mut()
                .zip(cut)
                .map(|(p, &(i, rows))| {
                    done[i] += rows;
                    LayerInput {
                        prefix: p.prefix,
                        kept: p.kept,
                        private: &mut *p.private,
                        rows,
                        after: if shared {
                            p.after + p.rows - done[i]
                        } else {
                            0
                        },
                    }
                })
                .collect();
            let piece_tokens = match reads {
                true => PassTokens {
                    ids: &tokens.ids[row..row + n],
                    embedded: &tokens.embedded[row * d..(row + n) * d],
                },
                false => tokens,
            };
            self.layer_rows(
                l,
                &mut x[row * d..(row + n) * d],
                piece_tokens,
                &mut piece,
                scratch,
            )?;
            row += n;
        }
        Ok(())
    }

    /// `forward_layer` on rows that run as one piece (`x` and the context checked there).
    fn layer_rows(
        &self,
        l: usize,
        x: &mut [f32],
        tokens: PassTokens,
        parts: &mut [LayerInput],
        scratch: &mut Scratch,
    ) -> Result<()> {
        let c = &self.cfg;
        let w = &self.weights.layers[l];
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        rms_norm_into(x, &w.attn_norm, c.rms_eps, &mut scratch.h);
        match &w.mixer {
            Mixer::Attention(a) => self.attention_rows(l, a, parts, rows, scratch)?,
            Mixer::DeltaNet(d) => self.delta_net_rows(d, parts, rows, scratch)?,
            Mixer::ShortConv(sc) => self.short_conv_rows(sc, parts, rows, scratch)?,
        }
        let Scratch {
            h,
            o,
            gate_up,
            down,
            ..
        } = scratch;
        let f = &c.features;
        if let Some(n) = &w.post_attn_norm {
            rms_norm_in_place(o, n, c.rms_eps);
        }
        scale_in_place(o, f.residual_scale);
        add_in_place(x, o, c.n_embd);
        rms_norm_into(x, &w.ffn_norm, c.rms_eps, h);
        match &w.ffn {
            Ffn::Dense {
                gate,
                up,
                down: w_down,
            } => {
                Linear::forward_many_into(&[gate, up], h, rows, gate_up)?;
                let [g, u] = gate_up;
                gated_par(g, u, c.n_ff_of(l), f.gelu);
                Linear::forward_many_into(&[w_down], g, rows, std::slice::from_mut(down))?;
            }
            Ffn::Experts(experts) => crate::moe::forward(experts, h, rows, f.gelu, down)?,
        }
        if let Some(n) = &w.post_ffn_norm {
            rms_norm_in_place(down, n, c.rms_eps);
        }
        scale_in_place(down, f.residual_scale);
        add_in_place(x, down, c.n_embd);
        if let (Some(ple), Some(lp)) = (&self.weights.per_layer, &w.per_layer) {
            let input = ple.input(l, tokens.ids, tokens.embedded, c.rms_eps)?;
            lp.add(x, &input, rows, c.rms_eps)?;
        }
        if let Some(s) = w.out_scale {
            x.iter_mut().for_each(|a| *a *= s);
        }
        Ok(())
    }

    /// Attention of the normed rows `scratch.h` over each part's KV (the new rows' K/V appended
    /// to its private cache); the output projection in `scratch.o`.
    fn attention_rows(
        &self,
        l: usize,
        w: &Attention,
        parts: &mut [LayerInput],
        rows: usize,
        scratch: &mut Scratch,
    ) -> Result<()> {
        let c = &self.cfg;
        let hd = c.head_dim_of(l);
        let (kvw, qw) = (c.n_kv_head * hd, c.n_head * hd);
        let Scratch {
            h, qkv, attn, o, ..
        } = scratch;
        // The projections this layer has: Q always; K and V unless it reads another layer's
        // KV (V may be K's rows); Qwen3.5's gate.
        let mats: Vec<&Linear> = std::iter::once(&w.wq)
            .chain(&w.wk)
            .chain(&w.wv)
            .chain(&w.gate)
            .collect();
        // (The gate comes fourth: only layers with K and V have one, `weights.rs`.)
        if w.gate.is_some() && mats.len() != 4 {
            return Err(EngineError::Input(
                "a gated attention layer without K or V".into(),
            ));
        }
        let n = mats.len();
        Linear::forward_many_into(&mats, h, rows, &mut qkv[..n])?;
        let [q, k, v, gate] = qkv;
        if w.wk.is_some() && w.wv.is_none() {
            v.clear();
            v.extend_from_slice(k);
        }
        if let Some(qn) = &w.q_norm {
            rms_norm_in_place(q, qn, c.rms_eps);
        }
        if let Some(kn) = &w.k_norm {
            rms_norm_in_place(k, kn, c.rms_eps);
        }
        if let Some(vn) = &w.v_norm {
            rms_norm_in_place(v, vn, c.rms_eps);
        }
        // Each sequence's rows rotated and appended to its own cache; a batch's sequences
        // are cut over the pool.
        let rope = self.rope(l);
        type Rows<'r, 'p> = (
            &'r mut LayerInput<'p>,
            &'r mut [f32],
            &'r mut [f32],
            &'r [f32],
        );
        let mut jobs: Vec<Rows> = Vec::with_capacity(parts.len());
        // A layer reading another's KV computes none: its rows are in that layer's already.
        let owns = w.wk.is_some();
        let kvw_new = if owns { kvw } else { 0 };
        let (mut qr, mut kr, mut vr) = (&mut q[..], &mut k[..], &v[..]);
        for part in parts.iter_mut() {
            let (qa, qb) = std::mem::take(&mut qr).split_at_mut(part.rows * qw);
            let (ka, kb) = std::mem::take(&mut kr).split_at_mut(part.rows * kvw_new);
            let (va, vb) = vr.split_at(part.rows * kvw_new);
            (qr, kr, vr) = (qb, kb, vb);
            jobs.push((part, qa, ka, va));
        }
        crate::par::each(&mut jobs, 4, &|_, (part, q, k, v)| {
            let held = if owns { 0 } else { part.after + part.rows };
            let pos0 = part.before() + part.private.len() - held;
            if let Some(rope) = rope {
                rope.apply_rows(q, qw, pos0);
                if owns {
                    rope.apply_rows(k, kvw, pos0);
                }
            }
            if owns {
                part.private.append(k, v, part.rows);
            }
        });
        drop(jobs);
        let views: Vec<KeptView> = parts
            .iter()
            .map(|p| KeptView {
                view: KvView {
                    prefix: p.prefix,
                    private: p.private,
                    rows: p.rows,
                    after: if owns { 0 } else { p.after },
                },
                kept: p.kept,
            })
            .collect();
        // Every value is written by `attend_batch`.
        attn.resize(rows * qw, 0.0);
        let f = &c.features;
        let scores = Scores {
            scale: f.attn_scale,
            cap: f.attn_softcap,
        };
        attend_batch_kept(q, &views, c.n_head, hd, c.window_of(l), scores, attn);
        if w.gate.is_some() {
            crate::par::rows2(attn, gate, qw, &|a, g| {
                for (a, &g) in a.iter_mut().zip(g) {
                    *a *= crate::recurrent::sigmoid(g);
                }
            });
        }
        Linear::forward_many_into(&[&w.wo], attn, rows, std::slice::from_mut(o))
    }

    /// The Gated DeltaNet of the normed rows `scratch.h`: each part's rows continue its state
    /// (its own, else the kept positions' or the prefix's, else zero) token by token, the
    /// state kept in its private layer; the output projection in `scratch.o`.
    fn delta_net_rows(
        &self,
        w: &DeltaNetWeights,
        parts: &mut [LayerInput],
        rows: usize,
        scratch: &mut Scratch,
    ) -> Result<()> {
        let Some(shape @ Recurrence::DeltaNet(s)) = self.cfg.features.recurrence else {
            return Err(EngineError::Input(
                "a DeltaNet layer without its shape".into(),
            ));
        };
        let Scratch {
            h, qkv, attn, o, ..
        } = scratch;
        Linear::forward_many_into(&[&w.qkv, &w.z, &w.beta, &w.alpha], h, rows, qkv)?;
        let [qkv, z, beta, alpha] = &*qkv;
        let p = Params {
            conv: &w.conv,
            dt_bias: &w.dt_bias,
            a: &w.a,
            norm: &w.norm,
            eps: self.cfg.rms_eps,
        };
        let (cd, vd, nh) = (s.conv_dim(), s.value_dim(), s.v_heads);
        // Per part: its rows, its state (taken out to be moved on), its convolved rows.
        let mut at = 0;
        let mut states = Vec::with_capacity(parts.len());
        let mut inputs = Vec::with_capacity(parts.len());
        for part in parts.iter_mut() {
            let r = Rows {
                qkv: &qkv[at * cd..(at + part.rows) * cd],
                z: &z[at * vd..(at + part.rows) * vd],
                beta: &beta[at * nh..(at + part.rows) * nh],
                alpha: &alpha[at * nh..(at + part.rows) * nh],
                rows: part.rows,
            };
            at += part.rows;
            let mut state = part.start_state(&shape);
            let x = convolve_qkv(&s, &p, Arc::make_mut(&mut state), &r);
            states.push(state);
            inputs.push((r, x));
        }
        // Every (part, value head) alone over the pool: a head's tokens in order.
        let d = s.head_dim;
        let mut jobs: Vec<(usize, usize, &mut [f32], Vec<f32>)> = Vec::new();
        for (i, st) in states.iter_mut().enumerate() {
            let rows_i = inputs[i].0.rows;
            for (hh, m) in Arc::make_mut(st).matrix.chunks_exact_mut(d * d).enumerate() {
                jobs.push((i, hh, m, vec![0f32; rows_i * d]));
            }
        }
        crate::par::each(&mut jobs, 2, &|_, (i, hh, m, out)| {
            let (r, x) = &inputs[*i];
            head(&s, &p, *hh, m, x, r, out);
        });
        // Heads' rows side by side, parts one after another.
        attn.resize(rows * vd, 0.0);
        let firsts: Vec<usize> = inputs
            .iter()
            .scan(0, |at, (r, _)| {
                let first = *at;
                *at += r.rows;
                Some(first)
            })
            .collect();
        for (i, hh, _, out) in &jobs {
            for (t, head_row) in out.chunks_exact(d).enumerate() {
                let at = (firsts[*i] + t) * vd + hh * d;
                attn[at..at + d].copy_from_slice(head_row);
            }
        }
        drop(jobs);
        for (part, st) in parts.iter_mut().zip(states) {
            part.private.state = Some(st);
        }
        Linear::forward_many_into(&[&w.out], attn, rows, std::slice::from_mut(o))
    }

    /// LFM2's short convolution of the normed rows `scratch.h`: each part's rows continue its
    /// window (as `delta_net_rows`); the output projection in `scratch.o`.
    fn short_conv_rows(
        &self,
        w: &ShortConvWeights,
        parts: &mut [LayerInput],
        rows: usize,
        scratch: &mut Scratch,
    ) -> Result<()> {
        let Some(shape @ Recurrence::ShortConv(s)) = self.cfg.features.recurrence else {
            return Err(EngineError::Input(
                "a short-convolution layer without its shape".into(),
            ));
        };
        let Scratch {
            h, qkv, attn, o, ..
        } = scratch;
        Linear::forward_many_into(&[&w.in_proj], h, rows, &mut qkv[..1])?;
        let bcx = &qkv[0];
        attn.clear();
        let mut at = 0;
        for part in parts.iter_mut() {
            let mut state = part.start_state(&shape);
            let y = short_conv(
                &s,
                &w.conv,
                Arc::make_mut(&mut state),
                &bcx[at * 3 * s.width..(at + part.rows) * 3 * s.width],
                part.rows,
            );
            attn.extend_from_slice(&y);
            part.private.state = Some(state);
            at += part.rows;
        }
        Linear::forward_many_into(&[&w.out], attn, rows, std::slice::from_mut(o))
    }

    /// Logits for hidden rows `x` (`[rows, n_embd]`) -> `[rows, vocab]`.
    pub fn logits(&self, x: &[f32]) -> Result<Vec<f32>> {
        let (mut h, mut out) = (Vec::new(), Vec::new());
        self.logits_into(x, &mut h, &mut out)?;
        Ok(out)
    }

    /// `logits` into the caller's buffers (`h`: the output norm's rows), reused as they are.
    pub(crate) fn logits_into(
        &self,
        x: &[f32],
        h: &mut Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let rows = x.len() / self.cfg.n_embd;
        rms_norm_into(x, &self.weights.output_norm, self.cfg.rms_eps, h);
        Linear::forward_many_into(&[&self.weights.output], h, rows, std::slice::from_mut(out))?;
        let f = &self.cfg.features;
        scale_in_place(out, f.logit_scale);
        if let Some(cap) = f.final_softcap {
            crate::kernels::softcap(out, cap);
        }
        Ok(())
    }

    /// Log-probability of `next[j]` after hidden row `j` of `x` (`[next.len(), n_embd]`, before
    /// the output norm), with `top` alternatives. Logits are made a few rows at a time: a long
    /// prompt's rows times a 150k vocabulary would not fit.
    pub fn score_rows(&self, x: &[f32], next: &[u32], top: usize) -> Result<Vec<TokenLogprobs>> {
        const ROWS: usize = 16;
        let d = self.cfg.n_embd;
        if x.len() != next.len() * d {
            return Err(EngineError::Input(format!(
                "{} hidden values for {} tokens of width {d}",
                x.len(),
                next.len()
            )));
        }
        let mut out = Vec::with_capacity(next.len());
        for (rows, ids) in x.chunks(ROWS * d).zip(next.chunks(ROWS)) {
            let logits = self.logits(rows)?;
            for (l, &id) in logits.chunks_exact(self.cfg.vocab_size).zip(ids) {
                out.push(logprobs(l, id, top));
            }
        }
        Ok(out)
    }
}

/// Hand the allocator's free pages back to the system. glibc keeps freed small allocations
/// (a GGUF vocabulary's hundreds of thousands of strings) resident otherwise: Gemma 3 stayed
/// 54 MB above its weights and tokenizer after loading.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory to the kernel; it touches no live block.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn template(tokenizer: &Tokenizer, src: &str) -> Result<ChatTemplate> {
    let tok = |id: Option<u32>| id.and_then(|i| tokenizer.token_text(i)).unwrap_or_default();
    ChatTemplate::new(src, &tok(tokenizer.bos_id), &tok(tokenizer.eos_id))
}
/// The gated activation (`gelu_mul` or `silu_mul`) on `[rows, width]`, rows split over the
/// pool when there are many (element by element: the same bits however it is cut).
fn gated_par(g: &mut [f32], u: &[f32], width: usize, gelu: bool) {
    crate::par::rows2(g, u, width, &|g, u| {
        if gelu {
            crate::kernels::gelu_mul(g, u)
        } else {
            crate::kernels::silu_mul(g, u)
        }
    });
}

/// `x += y`, `width`-wide rows at a time over the pool.
/// `x *= s` (nothing when `s` is 1: the families without multipliers keep their bits).
fn scale_in_place(x: &mut [f32], s: f32) {
    if s != 1.0 {
        x.iter_mut().for_each(|a| *a *= s);
    }
}

fn add_in_place(x: &mut [f32], y: &[f32], width: usize) {
    crate::par::rows2(x, y, width, &|x, y| {
        for (a, b) in x.iter_mut().zip(y) {
            *a += b;
        }
    });
}

fn file_sha256(path: &Path) -> Result<String> {
    use std::io::Read;
    let io = |source| EngineError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / 4e8 - 5.0)
            .collect()
    }

    #[test]
    fn gated_activation_split_over_threads_matches_one_pass_bitwise() {
        let (rows, width) = (24, 1536);
        let u = values(rows * width, 7);
        for gelu in [false, true] {
            let mut split = values(rows * width, 3);
            let mut whole = split.clone();
            gated_par(&mut split, &u, width, gelu);
            if gelu {
                crate::kernels::gelu_mul(&mut whole, &u);
            } else {
                crate::kernels::silu_mul(&mut whole, &u);
            }
            assert!(split
                .iter()
                .zip(&whole)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
