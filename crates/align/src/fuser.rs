//! The KV fuser (after Cache-to-Cache): the small model's own KV of a cloud prompt, corrected
//! per layer by a small network that reads the large model's KV of the same prompt, through
//! per-head gates. Trained by `scripts/fuser/train.py` on the small model's loss (both models
//! frozen); applied here, on the cloud, once per prompt. The result has the small model's
//! shape, so an edge gets EdgePrompt mode's bytes and TTFT and answers with the fused KV.
//!
//! Per small-model layer `j` (large-model layer `matches[j]`), for keys (RoPE undone) and for
//! values, per token:
//!
//! ```text
//! x  = [rmsnorm(K_llm), rmsnorm(K_slm)]
//! d  = W2 silu(W1 x + b1) + b2
//! K' = K_slm + gate[head] * rms(K_slm) * d        (keys: the correction rotated to the position)
//! ```
//!
//! A head whose gate is zero keeps its KV bit for bit: an untrained fuser (gates start at
//! zero) is exactly the small model alone. The arithmetic is scalar with a fixed summation
//! order and the engine's SiLU, so the fused KV has the same bits on every machine.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use edgeprompt_engine::kernels::silu_mul;
use edgeprompt_engine::rope::Rope;
use edgeprompt_engine::{LayerKv, Model};
use half::f16;
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};

use crate::{AlignError, Result, Shape};

const META_KEY: &str = "edgeprompt.fuser";
const EPS: f32 = 1e-6;
/// Bounds on a file's shapes before anything is allocated from them.
const MAX_WIDTH: usize = 1 << 14;
const MAX_HIDDEN: usize = 1 << 13;
const MAX_POSITIONS: usize = 32_768;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FuserMeta {
    pub llm_fingerprint: String,
    pub slm_fingerprint: String,
    pub llm_n_layer: usize,
    /// Width of one large-model KV row (`n_kv_head * head_dim`).
    pub llm_kv_width: usize,
    pub slm: Shape,
    pub slm_rope_base: f32,
    /// Per small-model layer, the large-model layer it reads.
    pub matches: Vec<usize>,
    pub hidden: usize,
    /// How it was trained (steps, cases, seed, ...), as the script wrote it.
    #[serde(default)]
    pub training: serde_json::Value,
}

/// One fuser for the keys or the values of one layer.
struct Part {
    din: usize,
    dout: usize,
    hidden: usize,
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
    gate: Vec<f32>,
}

pub struct Fuser {
    pub meta: FuserMeta,
    /// SHA-256 of the file, hex: what the cloud's headers and seals name.
    pub sha256: String,
    /// Per small-model layer: (keys, values).
    layers: Vec<(Part, Part)>,
}

/// Fixed-order dot product: eight lanes, then the lanes summed left to right.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = acc.iter().fold(0f32, |s, v| s + v);
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

fn rms(x: &[f32]) -> f32 {
    (dot(x, x) / x.len().max(1) as f32 + EPS).sqrt()
}

impl Part {
    /// The correction for one token's row `slm` (RoPE undone for keys), given the large
    /// model's row `llm`; heads whose gate is zero get exactly zero.
    fn correction(&self, llm: &[f32], slm: &[f32], n_kv_head: usize, out: &mut [f32]) {
        let mut x = Vec::with_capacity(self.din);
        let (rl, rs) = (rms(llm), rms(slm));
        x.extend(llm.iter().map(|v| v / rl));
        x.extend(slm.iter().map(|v| v / rs));
        let mut h: Vec<f32> = (0..self.hidden)
            .map(|r| dot(&self.w1[r * self.din..(r + 1) * self.din], &x) + self.b1[r])
            .collect();
        silu_mul(&mut h, &vec![1.0; self.hidden]);
        let hd = self.dout / n_kv_head;
        for (c, o) in out.iter_mut().enumerate() {
            let g = self.gate[c / hd];
            *o = if g == 0.0 {
                0.0
            } else {
                let d = dot(&self.w2[c * self.hidden..(c + 1) * self.hidden], &h) + self.b2[c];
                g * (rs * d)
            };
        }
    }

    fn is_zero(&self) -> bool {
        self.gate.iter().all(|&g| g == 0.0)
    }
}

impl Fuser {
    /// Read and check a file written by `scripts/fuser/train.py`.
    pub fn load(path: &Path) -> Result<Self> {
        let err = |msg: String| AlignError::File {
            path: path.display().to_string(),
            msg,
        };
        let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| err(e.to_string()))?;
        let meta: FuserMeta = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get(META_KEY))
            .ok_or_else(|| err("no fuser metadata: not a fuser file".into()))
            .and_then(|s| serde_json::from_str(s).map_err(|e| err(e.to_string())))?;
        let (dl, ds) = (meta.llm_kv_width, meta.slm.kv_width());
        if meta.matches.len() != meta.slm.n_layer
            || meta.matches.iter().any(|&i| i >= meta.llm_n_layer)
            || !(1..=MAX_WIDTH).contains(&dl)
            || !(1..=MAX_WIDTH).contains(&ds)
            || !(1..=MAX_HIDDEN).contains(&meta.hidden)
            || meta.slm.n_kv_head == 0
            || ds % meta.slm.n_kv_head != 0
        {
            return Err(err("shapes or layer matches out of range".into()));
        }
        let st = SafeTensors::deserialize(&bytes).map_err(|e| err(e.to_string()))?;
        let tensor = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let t = st.tensor(name).map_err(|e| err(format!("{name}: {e}")))?;
            if t.dtype() != Dtype::F32 || t.shape() != shape {
                return Err(err(format!(
                    "{name}: {:?} {:?}, expected F32 {shape:?}",
                    t.dtype(),
                    t.shape()
                )));
            }
            let v: Vec<f32> = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            match v.iter().all(|x| x.is_finite()) {
                true => Ok(v),
                false => Err(err(format!("{name}: not every value is finite"))),
            }
        };
        let h = meta.hidden;
        let part = |j: usize, kind: &str| -> Result<Part> {
            let p = format!("fuser.{j}.{kind}.");
            Ok(Part {
                din: dl + ds,
                dout: ds,
                hidden: h,
                w1: tensor(&format!("{p}w1"), &[h, dl + ds])?,
                b1: tensor(&format!("{p}b1"), &[h])?,
                w2: tensor(&format!("{p}w2"), &[ds, h])?,
                b2: tensor(&format!("{p}b2"), &[ds])?,
                gate: tensor(&format!("{p}gate"), &[meta.slm.n_kv_head])?,
            })
        };
        let layers = (0..meta.slm.n_layer)
            .map(|j| Ok((part(j, "k")?, part(j, "v")?)))
            .collect::<Result<Vec<_>>>()?;
        let sha256 = format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(&bytes));
        Ok(Self {
            meta,
            sha256,
            layers,
        })
    }

    /// The fuser was trained for exactly these two models.
    pub fn check(&self, llm: &Model, slm: &Model) -> Result<()> {
        let m = &self.meta;
        if llm.fingerprint != m.llm_fingerprint || slm.fingerprint != m.slm_fingerprint {
            return Err(AlignError::Mismatch(format!(
                "the fuser was trained for cloud model {} and edge model {}, not {} and {}",
                short(&m.llm_fingerprint),
                short(&m.slm_fingerprint),
                short(&llm.fingerprint),
                short(&slm.fingerprint)
            )));
        }
        crate::attention_only(llm)?;
        crate::attention_only(slm)?;
        if Shape::of(slm) != m.slm
            || llm.cfg.n_layer != m.llm_n_layer
            || Shape::of(llm).kv_width() != m.llm_kv_width
            || slm.cfg.rope_base != m.slm_rope_base
        {
            return Err(AlignError::Mismatch(
                "the fuser's shapes are not these models'".into(),
            ));
        }
        Ok(())
    }

    /// Small-model layers the fuser changes (a gate not zero).
    pub fn fused_layers(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&j| !(self.layers[j].0.is_zero() && self.layers[j].1.is_zero()))
            .collect()
    }

    /// The small model's prompt KV fused with the large model's (both from position 0, over
    /// the same tokens): one layer per small-model layer.
    pub fn fuse(
        &self,
        llm: &Model,
        slm: &Model,
        llm_kv: &[Arc<LayerKv>],
        slm_kv: &[Arc<LayerKv>],
    ) -> Result<Vec<LayerKv>> {
        self.check(llm, slm)?;
        if llm_kv.len() != llm.cfg.n_layer || slm_kv.len() != slm.cfg.n_layer {
            return Err(AlignError::Mismatch("a prompt KV misses layers".into()));
        }
        let rope = Rope::new(
            slm.cfg.head_dim,
            slm.cfg.rope_base,
            slm.cfg.rope_style,
            slm.max_positions().min(MAX_POSITIONS),
        );
        let (nkv, hd) = (slm.cfg.n_kv_head, slm.cfg.head_dim);
        let (ds, dl) = (nkv * hd, self.meta.llm_kv_width);
        let mut out = Vec::with_capacity(slm_kv.len());
        for (j, (kp, vp)) in self.layers.iter().enumerate() {
            let (s, l) = (&slm_kv[j], &llm_kv[self.meta.matches[j]]);
            let n = s.len();
            if l.len() != n || s.start() != 0 || l.start() != 0 || n > MAX_POSITIONS {
                return Err(AlignError::Mismatch(format!(
                    "layer {j}: the two prompt KVs hold different positions"
                )));
            }
            if kp.is_zero() && vp.is_zero() {
                out.push((**s).clone());
                continue;
            }
            // The large model's rows as the training data held them: f16.
            let round = |v: Vec<f32>| -> Vec<f32> {
                v.into_iter().map(|x| f16::from_f32(x).to_f32()).collect()
            };
            let (lk, lv) = (round(llm.unrotated_keys(l, 0)?), round(l.value_rows()));
            let (sk_rot, sk, sv) = (s.key_rows(), slm.unrotated_keys(s, 0)?, s.value_rows());
            let (mut k, mut v) = (sk_rot.clone(), sv.clone());
            let mut c = vec![0f32; ds];
            for t in 0..n {
                let (row, lrow) = (t * ds..(t + 1) * ds, t * dl..(t + 1) * dl);
                kp.correction(&lk[lrow.clone()], &sk[row.clone()], nkv, &mut c);
                rope.apply(&mut c, t);
                add_where_gated(&mut k[row.clone()], &c, &kp.gate, hd);
                vp.correction(&lv[lrow], &sv[row.clone()], nkv, &mut c);
                add_where_gated(&mut v[row], &c, &vp.gate, hd);
            }
            let mut kv = LayerKv::new(nkv, hd);
            kv.append(&k, &v, n);
            out.push(kv);
        }
        Ok(out)
    }
}

/// `row += c` on the heads whose gate is not zero (the others keep their bits).
fn add_where_gated(row: &mut [f32], c: &[f32], gate: &[f32], hd: usize) {
    for (h, g) in gate.iter().enumerate() {
        if *g != 0.0 {
            for (x, d) in row[h * hd..(h + 1) * hd].iter_mut().zip(&c[h * hd..]) {
                *x += d;
            }
        }
    }
}

fn short(fp: &str) -> &str {
    &fp[..fp.len().min(12)]
}

/// A fuser file for tests: `scale` times a fixed pseudo-random pattern in every weight, the
/// gates of `gated` layers set to `gate` (others zero).
pub fn write_for_test(
    path: &Path,
    llm: &Model,
    slm: &Model,
    hidden: usize,
    gated: &[usize],
    gate: f32,
) -> Result<()> {
    let (ls, ss) = (Shape::of(llm), Shape::of(slm));
    let (dl, ds) = (ls.kv_width(), ss.kv_width());
    let matches: Vec<usize> = (0..ss.n_layer)
        .map(|j| j * (ls.n_layer - 1) / (ss.n_layer - 1).max(1))
        .collect();
    let meta = FuserMeta {
        llm_fingerprint: llm.fingerprint.clone(),
        slm_fingerprint: slm.fingerprint.clone(),
        llm_n_layer: ls.n_layer,
        llm_kv_width: dl,
        slm: ss,
        slm_rope_base: slm.cfg.rope_base,
        matches,
        hidden,
        training: serde_json::json!({"test": true}),
    };
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut noise = |n: usize, scale: f32| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let u = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                (u * scale).to_le_bytes()
            })
            .collect()
    };
    let mut bufs: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for j in 0..ss.n_layer {
        for kind in ["k", "v"] {
            let p = format!("fuser.{j}.{kind}.");
            let g = if gated.contains(&j) { gate } else { 0.0 };
            bufs.insert(
                format!("{p}w1"),
                (vec![hidden, dl + ds], noise(hidden * (dl + ds), 0.2)),
            );
            bufs.insert(format!("{p}b1"), (vec![hidden], noise(hidden, 0.1)));
            bufs.insert(
                format!("{p}w2"),
                (vec![ds, hidden], noise(ds * hidden, 0.2)),
            );
            bufs.insert(format!("{p}b2"), (vec![ds], noise(ds, 0.1)));
            let gates: Vec<u8> = (0..ss.n_kv_head).flat_map(|_| g.to_le_bytes()).collect();
            bufs.insert(format!("{p}gate"), (vec![ss.n_kv_head], gates));
        }
    }
    let views = bufs
        .iter()
        .map(|(n, (s, b))| {
            safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| AlignError::Mismatch(e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = serde_json::to_string(&meta).map_err(|e| AlignError::Mismatch(e.to_string()))?;
    let bytes = safetensors::serialize(
        views,
        Some(std::collections::HashMap::from([(META_KEY.into(), meta)])),
    )
    .map_err(|e| AlignError::Mismatch(e.to_string()))?;
    std::fs::write(path, bytes)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_order_dot_product_sums_lanes_then_the_tail() {
        let a: Vec<f32> = (0..19).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..19).map(|i| 1.0 - i as f32 * 0.25).collect();
        let want: f32 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (*x as f64 * *y as f64) as f32)
            .sum();
        assert!((dot(&a, &b) - want).abs() < 1e-3);
        assert_eq!(dot(&a, &b), dot(&a, &b));
        assert_eq!(rms(&[3.0, 4.0]), (12.5f32 + EPS).sqrt());
    }

    #[test]
    fn a_file_that_is_not_a_fuser_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        std::fs::write(&path, b"not safetensors").unwrap();
        assert!(Fuser::load(&path).is_err());
        // Valid safetensors without the fuser's metadata.
        let data = 1f32.to_le_bytes();
        let v = safetensors::tensor::TensorView::new(Dtype::F32, vec![1], &data).unwrap();
        let bytes = safetensors::serialize([("t", v)], None).unwrap();
        std::fs::write(&path, bytes).unwrap();
        let e = Fuser::load(&path).err().unwrap().to_string();
        assert!(e.contains("not a fuser file"), "{e}");
        // The metadata, but shapes out of range: refused before any tensor is read.
        let meta = serde_json::json!({"llm_fingerprint": "a", "slm_fingerprint": "b",
            "llm_n_layer": 2, "llm_kv_width": 8,
            "slm": {"n_layer": 1, "n_kv_head": 1, "head_dim": 4},
            "slm_rope_base": 1e4, "matches": [5], "hidden": 4});
        let v = safetensors::tensor::TensorView::new(Dtype::F32, vec![1], &data).unwrap();
        let bytes = safetensors::serialize(
            [("t", v)],
            Some(std::collections::HashMap::from([(
                META_KEY.to_string(),
                meta.to_string(),
            )])),
        )
        .unwrap();
        std::fs::write(&path, bytes).unwrap();
        let e = Fuser::load(&path).err().unwrap().to_string();
        assert!(e.contains("out of range"), "{e}");
    }
}
