//! CE-LSLM TTFT and bytes on real gRPC through the shaping link: the cloud runs the LLM with
//! adapters, the edge the SLM; the edge computes cloud-prompt layers `0..split` while layers
//! `split..` load (eq. 20). Baselines measured in the same run: the SLM alone and the LLM
//! alone computing everything at the edge. The planner (eq. 19/20) predicts the TTFT of every
//! split from per-layer times measured here and picks one.

use std::sync::Arc;
use std::time::Instant;

use edgeprompt_align::AdapterSet;
use edgeprompt_edge::Timeline;
use edgeprompt_engine::sample::argmax;
use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::{Message, Model, Sequence};
use edgeprompt_kv::Codec;
use edgeprompt_link::{Link, Profile};
use edgeprompt_planner::lslm::{plan, SplitInputs};
use serde::{Deserialize, Serialize};

use crate::workload::cut;
use crate::BenchError;

pub struct Settings {
    pub cloud_lens: Vec<usize>,
    pub edge_len: usize,
    pub profiles: Vec<String>,
    pub codec: Codec,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub profile: String,
    pub cloud_tokens: usize,
    pub edge_tokens: usize,
    pub slm_alone_s: f64,
    pub llm_alone_s: f64,
    /// The planner's split and its predicted and measured TTFT.
    pub split: usize,
    pub predicted_s: f64,
    pub measured_s: f64,
    /// Measured at the smallest allowed split (most layers from the cloud; the adapters'
    /// and the quality floor).
    pub min_split: usize,
    pub min_split_s: f64,
    pub min_split_predicted_s: f64,
    /// Wire bytes at the planner's split and at the smallest one.
    pub bytes_down: usize,
    pub min_split_bytes: usize,
    /// What the same layers would cost as the LLM's own KV (adapters on the edge).
    pub llm_kv_bytes_same_layers: usize,
    /// The planner's predicted TTFT per split.
    pub curve: Vec<(usize, f64)>,
}

struct Case {
    id: String,
    system: String,
    cloud: Vec<u32>,
    private: Vec<u32>,
}

async fn measure(
    slm: &Arc<Model>,
    url: &str,
    c: &Case,
    codec: Codec,
    split: usize,
) -> Result<(f64, Timeline), BenchError> {
    crate::nodes::edge_ttft(slm, url, &c.id, &c.private, codec, true, split).await
}

fn time_alone(model: &Model, c: &Case) -> Result<f64, BenchError> {
    let ids: Vec<u32> = c.cloud.iter().chain(&c.private).copied().collect();
    let t = Instant::now();
    let mut seq = Sequence::new(model);
    let _ = argmax(&seq.prefill(model, &ids)?);
    Ok(t.elapsed().as_secs_f64())
}

/// Per-layer SLM compute of the cloud prompt (what loading a layer saves).
fn prompt_layer_secs(slm: &Model, ids: &[u32]) -> Result<Vec<f64>, BenchError> {
    let mut pass = PrefillPass::new(slm, ids, 0)?;
    (0..slm.cfg.n_layer)
        .map(|_| {
            let t = Instant::now();
            pass.run_layer(slm, None)?;
            Ok(t.elapsed().as_secs_f64())
        })
        .collect()
}

pub fn run(
    llm: &Arc<Model>,
    slm: &Arc<Model>,
    set: AdapterSet,
    sharegpt: &std::path::Path,
    s: &Settings,
    floor: usize,
) -> Result<Vec<Row>, BenchError> {
    let chat = slm
        .chat
        .as_ref()
        .ok_or_else(|| BenchError::Data("model has no chat template".into()))?;
    let turns = crate::sharegpt::turns(sharegpt, 400)?;
    let half = turns.len() / 2;
    let (cloud_src, edge_src) = (turns[..half].join("\n"), turns[half..].join("\n"));
    let user = cut(slm, &edge_src, s.edge_len.saturating_sub(8))?;
    let mut cases = Vec::new();
    for &n in &s.cloud_lens {
        let system = cut(slm, &cloud_src, n.saturating_sub(6))?;
        let split = chat.split(&system, &[Message::new("user", &user)])?;
        cases.push(Case {
            id: format!("c{n}"),
            cloud: super::system_ids(llm, slm, &system)?,
            private: slm.tokenizer.encode(&split.edge)?,
            system,
        });
    }
    let n = slm.cfg.n_layer;
    let min_split = set.min_split().max(floor).min(slm.cfg.n_layer);
    let llm_layer_bytes = llm.cfg.kv_bytes_per_token() / llm.cfg.n_layer;
    let rt = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    rt.block_on(async {
        let prompts: Vec<(String, String)> =
            cases.iter().map(|c| (c.id.clone(), c.system.clone())).collect();
        let cloud_addr = crate::nodes::cloud_with(llm, &prompts, vec![set]).await?;
        for c in &cases {
            let slm_alone = time_alone(slm, c)?;
            let llm_alone = time_alone(llm, c)?;
            let prompt_secs = prompt_layer_secs(slm, &c.cloud)?;
            eprintln!(
                "  cloud {} + private {} tokens: SLM alone {slm_alone:.3} s, LLM alone {llm_alone:.3} s",
                c.cloud.len(),
                c.private.len()
            );
            for name in &s.profiles {
                let p = Profile::named(name)
                    .ok_or_else(|| BenchError::Data(format!("unknown profile {name}")))?;
                let link = Link::start("127.0.0.1:0", cloud_addr.to_string(), p).await?;
                let url = format!("http://{}", link.addr);
                // Warm the cloud's mapped KV, then measure the most-loading split (at least the
                // last layer, so the planner has a measured layer size and private time).
                let probe = min_split.min(n - 1);
                measure(slm, &url, c, s.codec, probe).await?;
                let (t_min, tl) = measure(slm, &url, c, s.codec, probe).await?;
                let mut layer_bytes = vec![0usize; n];
                let mut private_secs = vec![0f64; n];
                for l in &tl.layers {
                    layer_bytes[l.layer] = l.wire_bytes;
                    private_secs[l.layer] = l.compute_end - l.compute_start;
                }
                let last_end = tl.layers.last().map_or(0.0, |l| l.compute_end);
                let inputs = SplitInputs {
                    prompt_layer_secs: prompt_secs.clone(),
                    private_layer_secs: private_secs,
                    layer_bytes: layer_bytes.clone(),
                    bandwidth_bps: p.bandwidth_bps as f64,
                    rtt_secs: p.rtt.as_secs_f64(),
                    cloud_secs: 0.0,
                    head_secs: (t_min - last_end).max(0.0),
                    min_split,
                };
                let planned = plan(&inputs);
                let (t_plan, tl_plan) = if planned.split == probe {
                    (t_min, tl.clone())
                } else if planned.split >= n {
                    // All local: no request at all, the SLM-alone run.
                    (slm_alone, Timeline::default())
                } else {
                    measure(slm, &url, c, s.codec, planned.split).await?
                };
                let row = Row {
                    profile: name.clone(),
                    cloud_tokens: c.cloud.len(),
                    edge_tokens: c.private.len(),
                    slm_alone_s: slm_alone,
                    llm_alone_s: llm_alone,
                    split: planned.split,
                    predicted_s: planned.ttft_secs,
                    measured_s: t_plan,
                    min_split: probe,
                    min_split_s: t_min,
                    min_split_predicted_s: edgeprompt_planner::lslm::ttft(&inputs, probe),
                    bytes_down: tl_plan.bytes_down(),
                    min_split_bytes: tl.bytes_down(),
                    llm_kv_bytes_same_layers: (n - probe) * llm_layer_bytes * c.cloud.len(),
                    curve: planned.curve,
                };
                eprintln!(
                    "  {name:>11}: split {} predicted {:.3} s, measured {:.3} s ({:.2}x SLM alone); from layer {probe}: {:.3} s, {:.2} MB (LLM KV would be {:.2} MB)",
                    row.split,
                    row.predicted_s,
                    row.measured_s,
                    row.measured_s / slm_alone,
                    row.min_split_s,
                    row.min_split_bytes as f64 / 1e6,
                    row.llm_kv_bytes_same_layers as f64 / 1e6
                );
                rows.push(row);
            }
        }
        Ok::<_, BenchError>(())
    })?;
    Ok(rows)
}
