//! Training data for the KV fuser (`edgeprompt fuser-data`): per conversation case, what the
//! cloud would compute for its prompt with both models, and the large model's view of the
//! answer. The training script (`scripts/fuser/train.py`) reads these files; it never runs
//! the large model itself, and it sees the small model's prompt KV exactly as the cloud
//! serves it (this engine's f16 KV), so what it learns is what the cloud will apply.
//!
//! One safetensors file per case, `case-<record>.safetensors`:
//! - `cloud`, `private`, `answer`: token ids (I32);
//! - `slm.{j}.k`, `slm.{j}.v`: the small model's prompt KV of layer `j` (F16 `[n, width]`,
//!   keys rotated, as held);
//! - `llm.{i}.k`, `llm.{i}.v`: the large model's, keys with RoPE undone (F16);
//! - `llm.top_ids`, `llm.top_logp`: per answer token, the large model's `top_k` most likely
//!   next tokens and their log-probabilities (I32 / F32 `[answer, top_k]`);
//! - `slm.nll`, `llm.nll`: each model alone's negative log-likelihood of each answer token
//!   (F32), which the script's own forward pass is checked against.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use edgeprompt_engine::Model;
use half::f16;
use safetensors::Dtype;

use crate::conversation::{answer_logits, cases, nll, prefix_of, Limits};
use crate::{AlignError, Result};

pub struct Settings {
    pub conversations: PathBuf,
    pub first_record: usize,
    pub cases: usize,
    pub limits: Limits,
    pub top_k: usize,
    pub out: PathBuf,
}

type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

fn ids(name: &str, v: &[u32]) -> Tensor {
    let bytes = v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect();
    (name.into(), Dtype::I32, vec![v.len()], bytes)
}

fn halfs(name: &str, v: &[f32], width: usize) -> Tensor {
    let bytes = v
        .iter()
        .flat_map(|&x| f16::from_f32(x).to_le_bytes())
        .collect();
    (name.into(), Dtype::F16, vec![v.len() / width, width], bytes)
}

fn floats(name: &str, v: &[f32], shape: Vec<usize>) -> Tensor {
    let bytes = v.iter().flat_map(|&x| x.to_le_bytes()).collect();
    (name.into(), Dtype::F32, shape, bytes)
}

/// Write every case not written yet; returns the cases now in `out`.
pub fn write(
    llm: &Model,
    slm: &Model,
    s: &Settings,
    mut progress: impl FnMut(usize, usize),
) -> Result<usize> {
    crate::attention_only(llm)?;
    crate::attention_only(slm)?;
    let all = cases(
        llm,
        slm,
        &s.conversations,
        s.first_record,
        s.cases,
        s.limits,
    )?;
    std::fs::create_dir_all(&s.out)?;
    let v = llm.cfg.vocab_size;
    for (done, c) in all.iter().enumerate() {
        let path = s.out.join(format!("case-{:06}.safetensors", c.record));
        if path.exists() {
            continue;
        }
        let lp = prefix_of(llm, &c.cloud)?;
        let sp = prefix_of(slm, &c.cloud)?;
        let mut t: Vec<Tensor> = vec![
            ids("cloud", &c.cloud),
            ids("private", &c.private),
            ids("answer", &c.answer),
        ];
        for (j, kv) in sp.layers.iter().enumerate() {
            let w = kv.n_kv_head * kv.head_dim;
            t.push(halfs(&format!("slm.{j}.k"), &kv.key_rows(), w));
            t.push(halfs(&format!("slm.{j}.v"), &kv.value_rows(), w));
        }
        for (i, kv) in lp.layers.iter().enumerate() {
            let w = kv.n_kv_head * kv.head_dim;
            t.push(halfs(&format!("llm.{i}.k"), &llm.unrotated_keys(kv, 0)?, w));
            t.push(halfs(&format!("llm.{i}.v"), &kv.value_rows(), w));
        }
        let n = c.cloud.len();
        let ll = answer_logits(llm, &lp.layers, n, &c.private, &c.answer)?;
        let sl = answer_logits(slm, &sp.layers, n, &c.private, &c.answer)?;
        let (mut top_ids, mut top_logp, mut llm_nll, mut slm_nll) =
            (vec![], vec![], vec![], vec![]);
        for (i, &target) in c.answer.iter().enumerate() {
            let row = &ll[i * v..(i + 1) * v];
            let lse = row[target as usize] as f64 + nll(row, target);
            let mut order: Vec<u32> = (0..v as u32).collect();
            order.select_nth_unstable_by(s.top_k, |&a, &b| {
                row[b as usize].total_cmp(&row[a as usize])
            });
            let mut top = order[..s.top_k].to_vec();
            top.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
            for &id in &top {
                top_ids.push(id);
                top_logp.push((row[id as usize] as f64 - lse) as f32);
            }
            llm_nll.push(nll(row, target) as f32);
            slm_nll.push(nll(&sl[i * v..(i + 1) * v], target) as f32);
        }
        let a = c.answer.len();
        t.push(ids("llm.top_ids", &top_ids));
        t.last_mut().expect("just pushed").2 = vec![a, s.top_k];
        t.push(floats("llm.top_logp", &top_logp, vec![a, s.top_k]));
        t.push(floats("llm.nll", &llm_nll, vec![a]));
        t.push(floats("slm.nll", &slm_nll, vec![a]));
        save(&path, &t, llm, slm)?;
        progress(done + 1, all.len());
    }
    Ok(all.len())
}

fn save(path: &Path, t: &[Tensor], llm: &Model, slm: &Model) -> Result<()> {
    let err = |msg: String| AlignError::File {
        path: path.display().to_string(),
        msg,
    };
    let views = t
        .iter()
        .map(|(n, d, s, b)| {
            safetensors::tensor::TensorView::new(*d, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| err(e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = HashMap::from([
        ("llm_fingerprint".to_string(), llm.fingerprint.clone()),
        ("slm_fingerprint".to_string(), slm.fingerprint.clone()),
    ]);
    let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| err(e.to_string()))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
