//! `edgeprompt-bench ttft`: time to first token for a cloud prompt of 64..1024 tokens plus a
//! private edge prompt (512 tokens, EdgePrompt §3 setup) over each link profile: edge-only
//! (the edge prefills everything), EdgePrompt pipelined and non-pipelined, and the planner's
//! prediction, all measured in one run on real gRPC through the shaping link.

pub mod report;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_edge::split_choice::AutoSplit;
use edgeprompt_edge::Timeline;
use edgeprompt_engine::sample::argmax;
use edgeprompt_engine::{Message, Sequence};
use edgeprompt_kv::Codec;
use edgeprompt_link::{Link, Profile};
use edgeprompt_planner::lslm::{plan, SplitInputs};
use edgeprompt_planner::{predict, Inputs, Regime};
use serde::Serialize;

use crate::inputs::{resolve, sharegpt};
use crate::machine::Machine;
use crate::nodes;
use crate::plot::{line_chart, Series};
use crate::workload::cut;
use crate::BenchError;

pub struct Settings {
    pub model: PathBuf,
    pub sharegpt: PathBuf,
    pub cloud_lens: Vec<usize>,
    pub edge_len: usize,
    pub profiles: Vec<String>,
    pub codec: Codec,
    pub threads: usize,
    /// Python with `llama_cpp`: llama.cpp's edge-only TTFT on the same tokens, same threads.
    pub llama_python: Option<PathBuf>,
    pub out: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Row {
    pub profile: String,
    pub cloud_tokens: usize,
    pub edge_tokens: usize,
    pub edge_only_s: f64,
    /// llama.cpp prefilling the same cloud + edge tokens (its TTFT running alone on the edge).
    pub llama_edge_only_s: Option<f64>,
    pub pipelined_s: f64,
    /// The same request through a fresh `serve` (cold cache, OpenAI chat, first streamed
    /// token): the scheduler's pipelined cold path. Chat models only.
    pub served_cold_s: Option<f64>,
    /// The same through a fresh `serve` with its default `--cloud-layers-from auto`, once
    /// one other prompt's fetch has measured the link: the split it chose and its TTFT.
    pub served_auto_split: Option<usize>,
    pub served_auto_s: Option<f64>,
    pub sequential_s: f64,
    pub predicted_pipelined_s: f64,
    pub predicted_sequential_s: f64,
    pub regime: Regime,
    pub kv_bytes_down: usize,
    /// The exact split the planner picks for this link (`planner::lslm::plan` with the same
    /// model on both sides, so every split gives the same answer): cloud layers `split..`
    /// are loaded, the edge computes `0..split` of the cloud prompt meanwhile; `n_layer`
    /// means edge-only.
    pub planned_split: Option<usize>,
    /// The model's layers (a split this high computes them all).
    pub layers: usize,
    /// TTFT measured at that split (edge-only's when it is `n_layer`).
    pub planned_split_s: Option<f64>,
    pub predicted_split_s: Option<f64>,
    /// Sliding-window models: the same request with the window layers sent whole.
    pub pipelined_uncut_s: Option<f64>,
    pub kv_bytes_down_uncut: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub threads: usize,
    pub codec: String,
    pub profiles: Vec<(String, Profile)>,
    pub rows: Vec<Row>,
}

struct Case {
    id: String,
    system: String,
    cloud_ids: Vec<u32>,
    edge_ids: Vec<u32>,
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let (machine, model) = crate::setup(s.threads, &s.model)?;
    let turns = crate::sharegpt::turns(&s.sharegpt, 400)?;
    let half = turns.len() / 2;
    let (cloud_src, edge_src) = (turns[..half].join("\n"), turns[half..].join("\n"));
    let user = cut(&model, &edge_src, s.edge_len.saturating_sub(8))?;
    let mut cases = Vec::new();
    for &n in &s.cloud_lens {
        let system = cut(&model, &cloud_src, n.saturating_sub(6))?;
        let (cloud_ids, edge_ids) = match &model.chat {
            Some(chat) => {
                let split = chat.split(&system, &[Message::new("user", &user)])?;
                (
                    model.tokenizer.encode(&split.cloud)?,
                    model.tokenizer.encode(&split.edge)?,
                )
            }
            // A base model: the cloud prompt as text, the private prompt continuing it.
            None => (
                model.tokenizer.encode_prompt(&system)?,
                model.tokenizer.encode(&format!("\n\n{user}"))?,
            ),
        };
        cases.push(Case {
            id: format!("c{n}"),
            system,
            cloud_ids,
            edge_ids,
        });
    }
    eprintln!(
        "machine: {}; model {}; threads {}; codec {}",
        machine,
        model.cfg.name,
        s.threads,
        s.codec.name()
    );
    // Edge-only: the edge prefills the cloud prompt and its own.
    let mut edge_only = Vec::new();
    for c in &cases {
        let ids: Vec<u32> = c.cloud_ids.iter().chain(&c.edge_ids).copied().collect();
        let t = Instant::now();
        let mut seq = Sequence::new(&model);
        let logits = seq.prefill_chunked(&model, &ids, 512)?;
        let _ = argmax(&logits);
        edge_only.push(t.elapsed().as_secs_f64());
        eprintln!(
            "  edge-only {} + {} tokens: TTFT {:.3} s",
            c.cloud_ids.len(),
            c.edge_ids.len(),
            edge_only.last().unwrap_or(&0.0)
        );
    }
    // The cloud prompt alone, computed here: what each layer the edge computes instead of
    // loading costs (the split plan's per-layer prompt compute; layers cost alike).
    let mut cloud_local = Vec::new();
    for c in &cases {
        let t = Instant::now();
        Sequence::new(&model).prefill_chunked(&model, &c.cloud_ids, 512)?;
        cloud_local.push(t.elapsed().as_secs_f64());
    }
    let mut llama_edge_only = Vec::new();
    for c in &cases {
        let ids: Vec<u32> = c.cloud_ids.iter().chain(&c.edge_ids).copied().collect();
        let secs = match &s.llama_python {
            Some(py) => {
                let t = crate::engine::llama_prefill_secs(py, &s.model, &ids, s.threads)?;
                eprintln!("  llama.cpp edge-only {} tokens: TTFT {t:.3} s", ids.len());
                Some(t)
            }
            None => None,
        };
        llama_edge_only.push(secs);
    }
    // What `serve --cloud-layers-from auto` measures at start: this machine's per-layer compute.
    let per_token_layer = AutoSplit::measure(&model)?;
    // Another prompt, fetched first by the auto-split server to measure the link.
    let warm = cut(&model, &edge_src, 256)?;
    let rt = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    let mut profiles = Vec::new();
    let mut timeline_example = None;
    rt.block_on(async {
        let mut prompts: Vec<(String, String)> = cases.iter().map(|c| (c.id.clone(), c.system.clone())).collect();
        prompts.push(("warm".into(), warm.clone()));
        let cloud_addr = nodes::cloud(&model, &prompts).await?;
        let uncut_addr = match model.cfg.window {
            Some(_) => Some(nodes::cloud_uncut(&model, &prompts).await?),
            None => None,
        };
        for name in &s.profiles {
            let p = Profile::named(name).ok_or_else(|| BenchError::Data(format!("unknown profile {name}")))?;
            profiles.push((name.clone(), p));
            let link = Link::start("127.0.0.1:0", cloud_addr.to_string(), p).await?;
            let url = format!("http://{}", link.addr);
            let uncut_link = match uncut_addr {
                Some(a) => Some(Link::start("127.0.0.1:0", a.to_string(), p).await?),
                None => None,
            };
            for (((c, &eo), &llama), &local) in cases.iter().zip(&edge_only).zip(&llama_edge_only).zip(&cloud_local) {
                let (pipe, tl) = nodes::edge_ttft(&model, &url, &c.id, &c.edge_ids, s.codec, true, 0).await?;
                let (seq, _) = nodes::edge_ttft(&model, &url, &c.id, &c.edge_ids, s.codec, false, 0).await?;
                let served = match model.chat {
                    Some(_) => {
                        let edge = nodes::edge(&model, "bench", Some(url.clone()), s.codec).await?;
                        let (sample, _) = crate::serve::one(&crate::http().build().unwrap_or_default(), &edge, "bench", &c.system, &user, 1)
                            .await
                            .map_err(BenchError::Data)?;
                        Some(sample.ttft_s)
                    }
                    None => None,
                };
                let served_auto = match model.chat {
                    Some(_) => {
                        let auto = Arc::new(AutoSplit::new(&model, 0, per_token_layer));
                        let edge = nodes::edge_with(&model, "bench", Some(url.clone()), s.codec, Some(auto.clone()), Default::default()).await?;
                        let http = crate::http().build().unwrap_or_default();
                        crate::serve::one(&http, &edge, "bench", &warm, &user, 1).await.map_err(BenchError::Data)?;
                        let split = auto.choose(Some(c.cloud_ids.len())).split;
                        let (sample, _) = crate::serve::one(&http, &edge, "bench", &c.system, &user, 1)
                            .await
                            .map_err(BenchError::Data)?;
                        Some((split, sample.ttft_s))
                    }
                    None => None,
                };
                let uncut = match &uncut_link {
                    Some(u) => {
                        let url = format!("http://{}", u.addr);
                        let (t, tl) = nodes::edge_ttft(&model, &url, &c.id, &c.edge_ids, s.codec, true, 0).await?;
                        eprintln!("  {name:>11} cloud {:4}: window layers sent whole: pipelined {t:.3} s, {:.1} MB down", c.cloud_ids.len(), tl.bytes_down() as f64 / 1e6);
                        Some((t, tl.bytes_down()))
                    }
                    None => None,
                };
                let l = &tl.layers;
                let pred = predict(&Inputs {
                    cloud_layer_secs: vec![0.0; l.len()],
                    layer_bytes: l.iter().map(|x| x.wire_bytes).collect(),
                    bandwidth_bps: p.bandwidth_bps as f64,
                    rtt_secs: p.rtt.as_secs_f64(),
                    edge_layer_secs: l.iter().map(|x| x.compute_end - x.compute_start).collect(),
                    head_secs: (pipe - l.last().map_or(0.0, |x| x.compute_end)).max(0.0),
                });
                let n = l.len();
                let split_plan = plan(&SplitInputs {
                    prompt_layer_secs: vec![local / n.max(1) as f64; n],
                    private_layer_secs: l.iter().map(|x| x.compute_end - x.compute_start).collect(),
                    layer_bytes: l.iter().map(|x| x.wire_bytes).collect(),
                    bandwidth_bps: p.bandwidth_bps as f64,
                    rtt_secs: p.rtt.as_secs_f64(),
                    cloud_secs: 0.0,
                    head_secs: (pipe - l.last().map_or(0.0, |x| x.compute_end)).max(0.0),
                    min_split: 0,
                });
                let split_s = match split_plan.split {
                    k if k >= n => eo,
                    k => nodes::edge_ttft(&model, &url, &c.id, &c.edge_ids, s.codec, true, k).await?.0,
                };
                eprintln!(
                    "  {name:>11} cloud {:4} + edge {}: edge-only {eo:.3} s | pipelined {pipe:.3} s ({:.2}x) | served cold {} | served auto {} | sequential {seq:.3} s | predicted {:.3} s ({:?}) | split at {} {split_s:.3} s (predicted {:.3} s)",
                    c.cloud_ids.len(),
                    c.edge_ids.len(),
                    pipe / eo,
                    served.map_or("-".into(), |t| format!("{t:.3} s ({:.2}x pipelined)", t / pipe)),
                    served_auto.map_or("-".into(), |(k, t)| format!("from {k} {t:.3} s")),
                    pred.pipelined_secs,
                    pred.regime,
                    split_plan.split,
                    split_plan.ttft_secs
                );
                if timeline_example.is_none() && name == "constrained" && std::ptr::eq(c, cases.last().unwrap_or(c)) {
                    timeline_example = Some(tl.clone());
                }
                rows.push(Row {
                    profile: name.clone(),
                    cloud_tokens: c.cloud_ids.len(),
                    edge_tokens: c.edge_ids.len(),
                    edge_only_s: eo,
                    llama_edge_only_s: llama,
                    pipelined_s: pipe,
                    served_cold_s: served,
                    served_auto_split: served_auto.map(|x| x.0),
                    served_auto_s: served_auto.map(|x| x.1),
                    sequential_s: seq,
                    predicted_pipelined_s: pred.pipelined_secs,
                    predicted_sequential_s: pred.sequential_secs,
                    regime: pred.regime,
                    kv_bytes_down: tl.bytes_down(),
                    planned_split: Some(split_plan.split),
                    layers: n,
                    planned_split_s: Some(split_s),
                    predicted_split_s: Some(split_plan.ttft_secs),
                    pipelined_uncut_s: uncut.map(|u| u.0),
                    kv_bytes_down_uncut: uncut.map(|u| u.1),
                });
            }
        }
        Ok::<_, BenchError>(())
    })?;
    let report = Report {
        machine,
        model: model.cfg.name.clone(),
        threads: s.threads,
        codec: s.codec.name().into(),
        profiles,
        rows,
    };
    write_outputs(&report, &s.out, timeline_example.as_ref())?;
    Ok(report)
}

fn write_outputs(r: &Report, out: &Path, timeline: Option<&Timeline>) -> Result<(), BenchError> {
    std::fs::create_dir_all(out)?;
    // A sliding-window model's run (cut vs whole) goes beside the main one, not over it.
    let window = r.rows.iter().any(|x| x.pipelined_uncut_s.is_some());
    let stem = if window { "ttft-window" } else { "ttft" };
    std::fs::write(
        out.join(format!("{stem}.json")),
        serde_json::to_string_pretty(r)?,
    )?;
    for (name, p) in &r.profiles {
        let rows: Vec<&Row> = r.rows.iter().filter(|x| &x.profile == name).collect();
        // Points where the row has a value (llama.cpp, served and window runs are optional).
        let some = |label: &str, f: &dyn Fn(&Row) -> Option<f64>, dashed: bool| Series {
            name: label.into(),
            points: rows
                .iter()
                .filter_map(|x| f(x).map(|v| (x.cloud_tokens as f64, v)))
                .collect(),
            dashed,
        };
        let series = |label: &str, f: &dyn Fn(&Row) -> f64, dashed: bool| {
            some(label, &|x| Some(f(x)), dashed)
        };
        let svg = line_chart(
            &format!(
                "TTFT, {}: {} ({:.0} Mbit/s, RTT {:?}), edge prompt {} tokens",
                r.model,
                name,
                p.bandwidth_bps as f64 / 1e6,
                p.rtt,
                rows.first().map_or(0, |x| x.edge_tokens)
            ),
            "cloud prompt tokens",
            "TTFT (s)",
            &[
                series("edge only", &|x| x.edge_only_s, false),
                some("llama.cpp edge only", &|x| x.llama_edge_only_s, true),
                series("EdgePrompt pipelined", &|x| x.pipelined_s, false),
                some(
                    "EdgePrompt, window layers sent whole",
                    &|x| x.pipelined_uncut_s,
                    true,
                ),
                some("served, its own split", &|x| x.served_auto_s, false),
                series("EdgePrompt sequential", &|x| x.sequential_s, false),
                series("planner (pipelined)", &|x| x.predicted_pipelined_s, true),
            ],
        );
        std::fs::write(out.join(format!("{stem}-{name}.svg")), svg)?;
    }
    if let Some(tl) = timeline.filter(|_| !window) {
        let pts = |f: &dyn Fn(&edgeprompt_edge::LayerTiming) -> f64| -> Vec<(f64, f64)> {
            tl.layers.iter().map(|l| (l.layer as f64, f(l))).collect()
        };
        let svg = line_chart(
            "Layer pipeline (constrained link, longest cloud prompt): cloud layer arrives vs edge layer computes",
            "layer",
            "seconds since request",
            &[
                Series { name: "cloud layer arrived".into(), points: pts(&|l| l.arrived), dashed: false },
                Series { name: "edge compute start".into(), points: pts(&|l| l.compute_start), dashed: true },
                Series { name: "edge compute end".into(), points: pts(&|l| l.compute_end), dashed: false },
            ],
        );
        std::fs::write(out.join("pipeline-timeline.svg"), svg)?;
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "qwen05")]
    model: String,
    #[arg(long, value_delimiter = ',', default_value = "64,256,512,1024")]
    cloud_lens: Vec<usize>,
    #[arg(long, default_value_t = 512)]
    edge_len: usize,
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "6g,5g,wifi,4g,constrained"
    )]
    profiles: Vec<String>,
    #[arg(long, default_value = "f16")]
    codec: String,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// A Python with `llama_cpp`: adds llama.cpp edge-only TTFT on the same tokens.
    #[arg(long)]
    llama_python: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench ttft`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let sharegpt = sharegpt()?;
    let s = Settings {
        model: resolve(&a.model)?,
        sharegpt,
        cloud_lens: a.cloud_lens,
        edge_len: a.edge_len,
        profiles: a.profiles,
        codec: Codec::parse(&a.codec)
            .ok_or_else(|| BenchError::Failed(format!("codec is one of {}", Codec::names())))?,
        threads: a.threads,
        llama_python: a.llama_python,
        out: a.out.clone(),
    };
    let r = run(&s)?;
    let window = r.rows.iter().any(|x| x.pipelined_uncut_s.is_some());
    eprintln!(
        "wrote {} rows to {}/{}.json and SVG plots",
        r.rows.len(),
        a.out.display(),
        if window { "ttft-window" } else { "ttft" }
    );
    Ok(())
}
