//! Per matched layer pair, linear maps from the LLM's K and V to the SLM's (ridge least
//! squares on calibration data), optionally predicting only the key channels ThinK keeps
//! (CE-LSLM eq. 17). Keys are mapped without RoPE: the two models rotate with different head
//! sizes, so a map between rotated keys would have to depend on the position.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use edgeprompt_engine::rope::Rope;
use edgeprompt_engine::{LayerKv, Model, RopeStyle};
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};

use crate::calib::Calibration;
use crate::ridge::{fit, r_squared, LinearMap};
use crate::{AlignError, Result};

const META_KEY: &str = "edgeprompt.adapters";
const MAX_POSITIONS: usize = 32_768;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    pub n_layer: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
}

impl Shape {
    pub fn of(model: &Model) -> Self {
        Self {
            n_layer: model.cfg.n_layer,
            n_kv_head: model.cfg.n_kv_head,
            head_dim: model.cfg.head_dim,
        }
    }

    pub fn kv_width(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
}

/// One matched pair and how well its maps fit held-out calibration tokens.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairInfo {
    pub slm_layer: usize,
    pub llm_layer: usize,
    pub cka: f64,
    pub rsa: f64,
    /// R² of the mapped keys (kept channels) and values on held-out tokens.
    pub r2_keys: f64,
    pub r2_values: f64,
    pub key_channels: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdapterMeta {
    pub llm_fingerprint: String,
    pub slm_fingerprint: String,
    pub llm: Shape,
    pub slm: Shape,
    pub slm_rope_base: f32,
    pub slm_rope_style: RopeStyle,
    pub ridge: f64,
    /// Fraction of key channel pairs ThinK keeps (1 = all).
    pub key_keep: f64,
    pub calibration_tokens: usize,
    pub held_out_tokens: usize,
    pub pairs: Vec<PairInfo>,
}

struct LayerAdapter {
    llm_layer: usize,
    keys: LinearMap,
    values: LinearMap,
    /// SLM key channels the key map predicts; the rest are zero.
    key_channels: Vec<u32>,
}

/// The adapters between one LLM and one SLM.
pub struct AdapterSet {
    pub meta: AdapterMeta,
    layers: BTreeMap<usize, LayerAdapter>,
    slm_rope: Rope,
}

/// How to fit.
#[derive(Debug, Clone, Copy)]
pub struct FitOptions {
    pub ridge: f64,
    pub key_keep: f64,
    /// Fraction of calibration tokens (the last ones) held out for R².
    pub held_out: f64,
}

/// The SLM key channels ThinK keeps for one layer: per KV head, the rotary pairs with the
/// largest `‖Q_c‖ · ‖K_c‖` (eq. 17's greedy criterion); a pair is kept or dropped whole so
/// that RoPE, which mixes the two channels, keeps a pruned pair at zero.
pub fn think_channels(
    key_energy: &[f64],
    query_energy: &[f64],
    shape: Shape,
    style: RopeStyle,
    keep: f64,
) -> Vec<u32> {
    let (hd, half) = (shape.head_dim, shape.head_dim / 2);
    let pair = |i: usize| match style {
        RopeStyle::Neox => (i, i + half),
        RopeStyle::Adjacent => (2 * i, 2 * i + 1),
    };
    let n_keep = ((keep.clamp(0.0, 1.0) * half as f64).ceil() as usize).clamp(1, half);
    let mut out = Vec::new();
    for h in 0..shape.n_kv_head {
        let base = h * hd;
        let mut scored: Vec<(usize, f64)> = (0..half)
            .map(|i| {
                let (a, b) = pair(i);
                let k = key_energy[base + a] + key_energy[base + b];
                let q = query_energy[base + a] + query_energy[base + b];
                (i, (k * q).sqrt())
            })
            .collect();
        scored.sort_by(|x, y| y.1.total_cmp(&x.1));
        for &(i, _) in &scored[..n_keep] {
            let (a, b) = pair(i);
            out.extend([(base + a) as u32, (base + b) as u32]);
        }
    }
    out.sort_unstable();
    out
}

/// Fit adapters for every matched pair (`matches[j]` = LLM layer for SLM layer `j`).
#[allow(clippy::too_many_arguments)]
pub fn fit_adapters(
    llm: &Model,
    slm: &Model,
    llm_cal: &Calibration,
    slm_cal: &Calibration,
    matches: &[Option<usize>],
    cka: &[Vec<f64>],
    rsa: &[Vec<f64>],
    opts: FitOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<AdapterSet> {
    if llm_cal.tokens != slm_cal.tokens {
        return Err(AlignError::Calibration(
            "the two models saw different tokens".into(),
        ));
    }
    let (ls, ss) = (Shape::of(llm), Shape::of(slm));
    let (dx, dy) = (ls.kv_width(), ss.kv_width());
    let n = llm_cal.tokens;
    let n_fit = ((1.0 - opts.held_out.clamp(0.0, 0.9)) * n as f64) as usize;
    let mut layers = BTreeMap::new();
    let mut pairs = Vec::new();
    let todo: Vec<(usize, usize)> = matches
        .iter()
        .enumerate()
        .filter_map(|(j, m)| m.map(|i| (j, i)))
        .collect();
    for (done, &(j, i)) in todo.iter().enumerate() {
        let (x, s) = (&llm_cal.layers[i], &slm_cal.layers[j]);
        let channels = if opts.key_keep < 1.0 {
            think_channels(
                &s.key_energy,
                &s.query_energy,
                ss,
                slm.cfg.rope_style,
                opts.key_keep,
            )
        } else {
            (0..dy as u32).collect()
        };
        let ky: Vec<f32> = s
            .keys
            .chunks_exact(dy)
            .flat_map(|row| channels.iter().map(|&c| row[c as usize]))
            .collect();
        let dk = channels.len();
        let keys = fit(&x.keys[..n_fit * dx], &ky[..n_fit * dk], n_fit, opts.ridge)?;
        let values = fit(
            &x.values[..n_fit * dx],
            &s.values[..n_fit * dy],
            n_fit,
            opts.ridge,
        )?;
        let held = |m: &LinearMap, xs: &[f32], ys: &[f32], d: usize| {
            if n_fit < n {
                r_squared(&ys[n_fit * d..], &m.apply(&xs[n_fit * dx..]), d)
            } else {
                f64::NAN
            }
        };
        pairs.push(PairInfo {
            slm_layer: j,
            llm_layer: i,
            cka: cka[i][j],
            rsa: rsa[i][j],
            r2_keys: held(&keys, &x.keys, &ky, dk),
            r2_values: held(&values, &x.values, &s.values, dy),
            key_channels: dk,
        });
        layers.insert(
            j,
            LayerAdapter {
                llm_layer: i,
                keys,
                values,
                key_channels: channels,
            },
        );
        progress(done + 1, todo.len());
    }
    let meta = AdapterMeta {
        llm_fingerprint: llm.fingerprint.clone(),
        slm_fingerprint: slm.fingerprint.clone(),
        llm: ls,
        slm: ss,
        slm_rope_base: slm.cfg.rope_base,
        slm_rope_style: slm.cfg.rope_style,
        ridge: opts.ridge,
        key_keep: opts.key_keep,
        calibration_tokens: n_fit,
        held_out_tokens: n - n_fit,
        pairs,
    };
    Ok(AdapterSet::new(meta, layers))
}

impl AdapterSet {
    fn new(meta: AdapterMeta, layers: BTreeMap<usize, LayerAdapter>) -> Self {
        let slm_rope = Rope::new(
            meta.slm.head_dim,
            meta.slm_rope_base,
            meta.slm_rope_style,
            MAX_POSITIONS,
        );
        Self {
            meta,
            layers,
            slm_rope,
        }
    }

    /// The LLM layer SLM layer `j` reads, if it has an adapter.
    pub fn llm_layer(&self, j: usize) -> Option<usize> {
        self.layers.get(&j).map(|a| a.llm_layer)
    }

    /// The smallest split `s` such that every SLM layer `>= s` has an adapter.
    pub fn min_split(&self) -> usize {
        let n = self.meta.slm.n_layer;
        (0..=n)
            .rev()
            .take_while(|&s| s == n || self.layers.contains_key(&s))
            .last()
            .unwrap_or(n)
    }

    /// SLM layer `j`'s KV for the tokens the LLM computed `llm_kv` for (positions `0..`).
    pub fn map_layer(&self, llm: &Model, j: usize, llm_kv: &LayerKv) -> Result<LayerKv> {
        crate::attention_only(llm)?;
        if llm.fingerprint != self.meta.llm_fingerprint {
            return Err(AlignError::Mismatch(
                "the adapters were fitted for another LLM".into(),
            ));
        }
        let a = self
            .layers
            .get(&j)
            .ok_or_else(|| AlignError::Mismatch(format!("SLM layer {j} has no matched layer")))?;
        let dy = self.meta.slm.kv_width();
        if llm_kv.len() > MAX_POSITIONS {
            return Err(AlignError::Mismatch(format!(
                "{} tokens exceed the RoPE table",
                llm_kv.len()
            )));
        }
        let keys = llm.unrotated_keys(llm_kv, 0)?;
        let pk = a.keys.apply(&keys);
        let values = a.values.apply(&llm_kv.value_rows());
        let n = llm_kv.len();
        let mut k = vec![0f32; n * dy];
        for (t, (dst, src)) in k
            .chunks_exact_mut(dy)
            .zip(pk.chunks_exact(a.key_channels.len()))
            .enumerate()
        {
            for (&c, &v) in a.key_channels.iter().zip(src) {
                dst[c as usize] = v;
            }
            self.slm_rope.apply(dst, t);
        }
        let mut out = LayerKv::new(self.meta.slm.n_kv_head, self.meta.slm.head_dim);
        out.append(&k, &values, n);
        Ok(out)
    }

    /// Write as safetensors (tensors `slm.{j}.keys`, `.values`, `.key_channels`; the
    /// fingerprints, shapes and fit quality in the metadata), atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        let err = |msg: String| AlignError::File {
            path: path.display().to_string(),
            msg,
        };
        let mut bufs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        for (j, a) in &self.layers {
            for (name, m) in [("keys", &a.keys), ("values", &a.values)] {
                let bytes = m.w.iter().flat_map(|v| v.to_le_bytes()).collect();
                bufs.push((
                    format!("slm.{j}.{name}"),
                    Dtype::F32,
                    vec![m.din + 1, m.dout],
                    bytes,
                ));
            }
            let ch = a
                .key_channels
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            bufs.push((
                format!("slm.{j}.key_channels"),
                Dtype::U32,
                vec![a.key_channels.len()],
                ch,
            ));
        }
        let views = bufs
            .iter()
            .map(|(n, d, s, b)| {
                safetensors::tensor::TensorView::new(*d, s.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| err(e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        let meta = serde_json::to_string(&self.meta).map_err(|e| err(e.to_string()))?;
        let bytes = safetensors::serialize(views, Some(HashMap::from([(META_KEY.into(), meta)])))
            .map_err(|e| err(e.to_string()))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
        }
        let tmp = path.with_extension("safetensors.tmp");
        std::fs::write(&tmp, bytes).map_err(|e| err(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| err(e.to_string()))
    }

    /// Read and check a file written by `save`.
    pub fn load(path: &Path) -> Result<Self> {
        let err = |msg: String| AlignError::File {
            path: path.display().to_string(),
            msg,
        };
        let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| err(e.to_string()))?;
        let meta: AdapterMeta = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get(META_KEY))
            .ok_or_else(|| err("no adapter metadata".into()))
            .and_then(|s| serde_json::from_str(s).map_err(|e| err(e.to_string())))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| err(e.to_string()))?;
        let (dx, dy) = (meta.llm.kv_width(), meta.slm.kv_width());
        let mut layers = BTreeMap::new();
        for p in &meta.pairs {
            if p.slm_layer >= meta.slm.n_layer || p.llm_layer >= meta.llm.n_layer {
                return Err(err(format!(
                    "pair {} <- {} out of range",
                    p.slm_layer, p.llm_layer
                )));
            }
            let tensor = |name: &str, dtype: Dtype, shape: &[usize]| -> Result<Vec<[u8; 4]>> {
                let full = format!("slm.{}.{name}", p.slm_layer);
                let t = st.tensor(&full).map_err(|e| err(format!("{full}: {e}")))?;
                if t.dtype() != dtype || t.shape() != shape {
                    return Err(err(format!(
                        "{full}: {:?} {:?}, expected {dtype:?} {shape:?}",
                        t.dtype(),
                        t.shape()
                    )));
                }
                Ok(t.data()
                    .chunks_exact(4)
                    .map(|c| [c[0], c[1], c[2], c[3]])
                    .collect())
            };
            let channels: Vec<u32> = tensor("key_channels", Dtype::U32, &[p.key_channels])?
                .into_iter()
                .map(u32::from_le_bytes)
                .collect();
            if channels.iter().any(|&c| c as usize >= dy) {
                return Err(err(format!(
                    "slm.{}.key_channels out of range",
                    p.slm_layer
                )));
            }
            let map = |name: &str, dout: usize| -> Result<LinearMap> {
                let w = tensor(name, Dtype::F32, &[dx + 1, dout])?
                    .into_iter()
                    .map(f32::from_le_bytes)
                    .collect();
                Ok(LinearMap { din: dx, dout, w })
            };
            layers.insert(
                p.slm_layer,
                LayerAdapter {
                    llm_layer: p.llm_layer,
                    keys: map("keys", channels.len())?,
                    values: map("values", dy)?,
                    key_channels: channels,
                },
            );
        }
        Ok(Self::new(meta, layers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_keeps_whole_rotary_pairs_with_the_most_energy() {
        let shape = Shape {
            n_layer: 1,
            n_kv_head: 2,
            head_dim: 8,
        };
        // Head 0: pair 2 (channels 2, 6) dominates; head 1: pair 1 (channels 9, 13).
        let mut k = vec![1.0; 16];
        let q = vec![1.0; 16];
        k[2] = 50.0;
        k[9] = 40.0;
        let kept = think_channels(&k, &q, shape, RopeStyle::Neox, 0.25);
        assert_eq!(kept, vec![2, 6, 9, 13]);
        assert_eq!(
            think_channels(&k, &q, shape, RopeStyle::Neox, 1.0).len(),
            16
        );
    }

    #[test]
    fn save_and_load_round_trip_and_reject_a_damaged_file() {
        let shape_l = Shape {
            n_layer: 3,
            n_kv_head: 1,
            head_dim: 4,
        };
        let shape_s = Shape {
            n_layer: 2,
            n_kv_head: 1,
            head_dim: 2,
        };
        let m = |din: usize, dout: usize, s: f32| LinearMap {
            din,
            dout,
            w: (0..(din + 1) * dout).map(|i| i as f32 * s).collect(),
        };
        let meta = AdapterMeta {
            llm_fingerprint: "aa".into(),
            slm_fingerprint: "bb".into(),
            llm: shape_l,
            slm: shape_s,
            slm_rope_base: 1e4,
            slm_rope_style: RopeStyle::Neox,
            ridge: 0.1,
            key_keep: 1.0,
            calibration_tokens: 10,
            held_out_tokens: 2,
            pairs: vec![PairInfo {
                slm_layer: 1,
                llm_layer: 2,
                cka: 0.9,
                rsa: 0.8,
                r2_keys: 0.5,
                r2_values: 0.4,
                key_channels: 2,
            }],
        };
        let layers = BTreeMap::from([(
            1,
            LayerAdapter {
                llm_layer: 2,
                keys: m(4, 2, 0.5),
                values: m(4, 2, -0.25),
                key_channels: vec![0, 1],
            },
        )]);
        let set = AdapterSet::new(meta, layers);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.safetensors");
        set.save(&path).unwrap();
        let back = AdapterSet::load(&path).unwrap();
        assert_eq!(back.meta.slm_fingerprint, "bb");
        assert_eq!(back.llm_layer(1), Some(2));
        assert_eq!(back.llm_layer(0), None);
        assert_eq!(back.min_split(), 1);
        assert_eq!(back.layers[&1].keys, set.layers[&1].keys);
        assert_eq!(back.layers[&1].values, set.layers[&1].values);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() - 3);
        std::fs::write(&path, bytes).unwrap();
        assert!(AdapterSet::load(&path).is_err());
    }
}
