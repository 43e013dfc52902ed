//! What the small model loses or keeps when its cloud-prompt KV comes from the large model
//! through the adapters, on held-out ShareGPT conversations: the earlier turns are the cloud
//! prompt, the next user turn is private, and the real answer is scored token by token
//! (teacher forcing). Per configuration: perplexity of the answer and top-1 next-token
//! agreement with the SLM alone (cloud prompt computed locally) and with the LLM alone.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_align::conversation::{self, answer_logits, nll, prefix_of, Case, Limits};
use edgeprompt_align::AdapterSet;
use edgeprompt_engine::rope::Rope;
use edgeprompt_engine::{LayerKv, Model};
use serde::{Deserialize, Serialize};

use crate::BenchError;

pub struct Settings {
    pub sharegpt: PathBuf,
    pub cases: usize,
    pub cloud_tokens: usize,
    pub user_tokens: usize,
    pub answer_tokens: usize,
    /// ShareGPT records before this one are never used (calibration reads the first ones).
    pub first_record: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    pub name: String,
    /// Adapter file (None for the two models alone).
    pub adapters: Option<String>,
    pub key_keep: Option<f64>,
    /// Layers `split..` from the cloud.
    pub split: Option<usize>,
    /// Only this layer from the cloud.
    pub single_layer: Option<usize>,
    pub perplexity: f64,
    pub agree_slm: f64,
    pub agree_llm: f64,
    pub tokens: usize,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub cases: usize,
    pub cloud_tokens_mean: f64,
    pub scored_tokens: usize,
    pub configs: Vec<Config>,
    pub secs: f64,
}

/// Per scored position: the argmax and the negative log-likelihood of the true next token.
#[derive(Clone)]
struct Scored {
    argmax: Vec<u32>,
    nll: Vec<f64>,
}

#[derive(Default, Clone)]
struct Tally {
    nll: f64,
    agree_slm: usize,
    agree_llm: usize,
    n: usize,
}

impl Tally {
    fn add(&mut self, s: &Scored, slm: &Scored, llm: &Scored) {
        for (i, (&a, &nll)) in s.argmax.iter().zip(&s.nll).enumerate() {
            self.nll += nll;
            self.agree_slm += usize::from(a == slm.argmax[i]);
            self.agree_llm += usize::from(a == llm.argmax[i]);
            self.n += 1;
        }
    }
}

fn cases(llm: &Model, slm: &Model, s: &Settings) -> Result<Vec<Case>, BenchError> {
    let limits = Limits {
        cloud_tokens: s.cloud_tokens,
        user_tokens: s.user_tokens,
        answer_tokens: s.answer_tokens,
    };
    let out = conversation::cases(llm, slm, &s.sharegpt, s.first_record, s.cases, limits)?;
    if out.len() < s.cases {
        return Err(BenchError::Data(format!(
            "found {} held-out conversations, {} asked",
            out.len(),
            s.cases
        )));
    }
    Ok(out)
}

/// Run private + answer after `layers` (one per model layer) and score the answer tokens.
fn score(model: &Model, layers: &[Arc<LayerKv>], c: &Case) -> Result<Scored, BenchError> {
    let logits = answer_logits(model, layers, c.cloud.len(), &c.private, &c.answer)?;
    let v = model.cfg.vocab_size;
    let mut out = Scored {
        argmax: Vec::new(),
        nll: Vec::new(),
    };
    for (row, &target) in logits.chunks_exact(v).zip(&c.answer) {
        out.nll.push(nll(row, target));
        out.argmax.push(edgeprompt_engine::sample::argmax(row));
    }
    Ok(out)
}

/// A content-free control for layer `kv`: every token gets the prompt's mean key (without
/// RoPE, then rotated to its position) and mean value. What mapped KV must beat to carry
/// anything about the tokens.
fn mean_layer(model: &Model, rope: &Rope, kv: &LayerKv) -> Result<LayerKv, BenchError> {
    let w = kv.n_kv_head * kv.head_dim;
    let n = kv.len();
    let mean = |rows: &[f32]| -> Vec<f32> {
        let mut m = vec![0f32; w];
        for r in rows.chunks_exact(w) {
            m.iter_mut().zip(r).for_each(|(a, b)| *a += b / n as f32);
        }
        m
    };
    let (mk, mv) = (mean(&model.unrotated_keys(kv, 0)?), mean(&kv.value_rows()));
    let mut k = Vec::with_capacity(n * w);
    for t in 0..n {
        let mut row = mk.clone();
        rope.apply(&mut row, t);
        k.extend(row);
    }
    let mut out = LayerKv::new(kv.n_kv_head, kv.head_dim);
    out.append(&k, &mv.repeat(n), n);
    Ok(out)
}

/// Splits to evaluate for `set`: all-local, then deeper-to-shallower down to its minimum.
fn splits(set: &AdapterSet) -> Vec<usize> {
    let n = set.meta.slm.n_layer;
    let mut s: Vec<usize> = [1, 2, 4, 6, 8, 12, 16, 20, 24, 28]
        .iter()
        .filter_map(|k| n.checked_sub(*k))
        .filter(|&s| s >= set.min_split())
        .collect();
    if set.min_split() < n && !s.contains(&set.min_split()) {
        s.push(set.min_split());
    }
    s
}

/// Score every configuration on `s.cases` held-out conversations; `sets` are (file, adapters).
pub fn run(
    llm: &Model,
    slm: &Model,
    sets: &[(String, AdapterSet)],
    s: &Settings,
) -> Result<Report, BenchError> {
    let start = Instant::now();
    if llm.cfg.vocab_size != slm.cfg.vocab_size {
        return Err(BenchError::Data("the models' vocabularies differ".into()));
    }
    let cases = cases(llm, slm, s)?;
    eprintln!(
        "quality: {} held-out conversations (ShareGPT records {}..), cloud prompt <= {} tokens, answer <= {} tokens",
        cases.len(),
        s.first_record,
        s.cloud_tokens,
        s.answer_tokens
    );
    let (llm, slm) = (llm, slm);
    // Configuration name -> (description, tally).
    let mut configs: Vec<(Config, Tally)> = Vec::new();
    let mut tally = |cfg: Config, sc: &Scored, slm_s: &Scored, llm_s: &Scored| match configs
        .iter_mut()
        .find(|(c, _)| c.name == cfg.name)
    {
        Some((_, t)) => t.add(sc, slm_s, llm_s),
        None => {
            let mut t = Tally::default();
            t.add(sc, slm_s, llm_s);
            configs.push((cfg, t));
        }
    };
    let base = |name: &str| Config {
        name: name.into(),
        adapters: None,
        key_keep: None,
        split: None,
        single_layer: None,
        perplexity: 0.0,
        agree_slm: 0.0,
        agree_llm: 0.0,
        tokens: 0,
    };
    let rope = Rope::new(
        slm.cfg.head_dim,
        slm.cfg.rope_base,
        slm.cfg.rope_style,
        slm.max_positions(),
    );
    for (ci, c) in cases.iter().enumerate() {
        let llm_prefix = prefix_of(llm, &c.cloud)?;
        let slm_prefix = prefix_of(slm, &c.cloud)?;
        let llm_s = score(llm, &llm_prefix.layers, c)?;
        let slm_s = score(slm, &slm_prefix.layers, c)?;
        tally(base("LLM alone"), &llm_s, &slm_s, &llm_s);
        let mut sc = base("SLM alone");
        sc.split = Some(slm.cfg.n_layer);
        tally(sc, &slm_s, &slm_s, &llm_s);
        for (si, (path, set)) in sets.iter().enumerate() {
            let keep = set.meta.key_keep;
            let tag = if keep < 1.0 {
                format!(" (ThinK {:.0}%)", keep * 100.0)
            } else {
                String::new()
            };
            let mapped: Vec<Option<Arc<LayerKv>>> = (0..slm.cfg.n_layer)
                .map(|j| match set.llm_layer(j) {
                    Some(i) => set
                        .map_layer(llm, j, &llm_prefix.layers[i])
                        .map(|kv| Some(Arc::new(kv)))
                        .map_err(BenchError::from),
                    None => Ok(None),
                })
                .collect::<Result<_, _>>()?;
            let with = |take: &dyn Fn(usize) -> bool| -> Vec<Arc<LayerKv>> {
                (0..slm.cfg.n_layer)
                    .map(|j| match (&mapped[j], take(j)) {
                        (Some(m), true) => m.clone(),
                        _ => slm_prefix.layers[j].clone(),
                    })
                    .collect()
            };
            for split in splits(set) {
                let sc = score(slm, &with(&|j| j >= split), c)?;
                let mut cfg = base(&format!(
                    "SLM + cloud layers {split}..{}{tag}",
                    slm.cfg.n_layer
                ));
                cfg.adapters = Some(path.clone());
                cfg.key_keep = Some(keep);
                cfg.split = Some(split);
                tally(cfg, &sc, &slm_s, &llm_s);
            }
            // Which single layers can be reused without loss (full-key adapters only), and the
            // content-free control at each split.
            if si == 0 {
                let means = slm_prefix
                    .layers
                    .iter()
                    .map(|l| mean_layer(slm, &rope, l).map(Arc::new))
                    .collect::<Result<Vec<_>, _>>()?;
                for split in splits(set) {
                    let layers: Vec<Arc<LayerKv>> = (0..slm.cfg.n_layer)
                        .map(|j| {
                            if j >= split {
                                means[j].clone()
                            } else {
                                slm_prefix.layers[j].clone()
                            }
                        })
                        .collect();
                    let sc = score(slm, &layers, c)?;
                    let mut cfg = base(&format!(
                        "control: mean KV in layers {split}..{}",
                        slm.cfg.n_layer
                    ));
                    cfg.split = Some(split);
                    tally(cfg, &sc, &slm_s, &llm_s);
                }
                for j in (0..slm.cfg.n_layer).filter(|&j| mapped[j].is_some()) {
                    let sc = score(slm, &with(&|k| k == j), c)?;
                    let mut cfg = base(&format!("SLM + cloud layer {j} only{tag}"));
                    cfg.adapters = Some(path.clone());
                    cfg.key_keep = Some(keep);
                    cfg.single_layer = Some(j);
                    tally(cfg, &sc, &slm_s, &llm_s);
                }
            }
        }
        eprintln!(
            "  case {}/{}: cloud {} + private {} + answer {} tokens ({:.0} s so far)",
            ci + 1,
            cases.len(),
            c.cloud.len(),
            c.private.len(),
            c.answer.len(),
            start.elapsed().as_secs_f64()
        );
    }
    let configs: Vec<Config> = configs
        .into_iter()
        .map(|(mut c, t)| {
            let n = t.n.max(1) as f64;
            c.perplexity = (t.nll / n).exp();
            c.agree_slm = t.agree_slm as f64 / n;
            c.agree_llm = t.agree_llm as f64 / n;
            c.tokens = t.n;
            c
        })
        .collect();
    println!(
        "{:<44} {:>10} {:>10} {:>10}",
        "configuration", "perplexity", "agree SLM", "agree LLM"
    );
    for c in &configs {
        println!(
            "{:<44} {:>10.2} {:>9.1}% {:>9.1}%",
            c.name,
            c.perplexity,
            100.0 * c.agree_slm,
            100.0 * c.agree_llm
        );
    }
    Ok(Report {
        cases: cases.len(),
        cloud_tokens_mean: cases.iter().map(|c| c.cloud.len()).sum::<usize>() as f64
            / cases.len().max(1) as f64,
        scored_tokens: configs.first().map_or(0, |c| c.tokens),
        configs,
        secs: start.elapsed().as_secs_f64(),
    })
}
