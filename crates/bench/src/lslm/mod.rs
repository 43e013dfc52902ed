//! CE-LSLM experiments (`lslm`): quality of the small model with the large model's mapped
//! KV, TTFT and bytes, on adapters the product's align job (`edgeprompt_align::job`) wrote.

pub mod fused;
pub mod latency;
pub mod quality;
pub mod report;

use std::path::PathBuf;

use edgeprompt_align::job as align;
pub use edgeprompt_align::job::{describe, system_ids};
use edgeprompt_engine::Model;
use edgeprompt_kv::Codec;

use crate::inputs::{resolve, sharegpt};
use crate::BenchError;

/// `edgeprompt-bench lslm`: quality, then TTFT and bytes.
pub struct Settings {
    pub llm: std::path::PathBuf,
    pub slm: std::path::PathBuf,
    /// Adapter files; the first drives the latency runs and the single-layer study.
    pub adapters: Vec<std::path::PathBuf>,
    pub quality: Option<quality::Settings>,
    pub latency: Option<latency::Settings>,
    /// The planner may only load layers whose split kept at least this next-token agreement
    /// with the SLM alone in the quality run (the split chooses latency *and* drift).
    pub min_agreement: f64,
    pub sharegpt: std::path::PathBuf,
    pub threads: usize,
    pub out: std::path::PathBuf,
}

#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub machine: crate::machine::Machine,
    pub llm: String,
    pub slm: String,
    pub threads: usize,
    pub adapters: Vec<String>,
    /// Smallest split the adapters allow (every layer from it on is matched).
    pub min_split: usize,
    pub min_agreement: f64,
    /// Smallest split whose measured agreement reached `min_agreement` (and every deeper
    /// split's did too); the latency runs do not go below it.
    pub quality_split: Option<usize>,
    pub quality: Option<quality::Report>,
    pub latency: Vec<latency::Row>,
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let (machine, llm) = crate::setup(s.threads, &s.llm)?;
    let slm = std::sync::Arc::new(Model::load(&s.slm)?);
    eprintln!("{}", describe(&machine, &llm, &slm, s.threads));
    let mut sets = Vec::new();
    for p in &s.adapters {
        let a = align::load_adapters(p)?;
        if a.meta.slm_fingerprint != slm.fingerprint || a.meta.llm_fingerprint != llm.fingerprint {
            return Err(BenchError::Data(format!(
                "{} was fitted for other models: run `edgeprompt align` again",
                p.display()
            )));
        }
        sets.push((p.display().to_string(), a));
    }
    let first = sets
        .first()
        .ok_or_else(|| BenchError::Data("no adapter file given".into()))?;
    let min_split = first.1.min_split();
    let quality = match &s.quality {
        Some(q) => Some(quality::run(&llm, &slm, &sets, q)?),
        None => None,
    };
    let quality_split = quality.as_ref().map(|q| {
        let mut splits: Vec<(usize, f64)> = q
            .configs
            .iter()
            .filter(|c| c.adapters.as_deref() == Some(first.0.as_str()) && c.split.is_some())
            .filter_map(|c| Some((c.split?, c.agree_slm)))
            .collect();
        splits.sort_by_key(|s| std::cmp::Reverse(s.0));
        splits
            .iter()
            .take_while(|(_, agree)| *agree >= s.min_agreement)
            .last()
            .map_or(slm.cfg.n_layer, |(split, _)| *split)
    });
    let latency = match &s.latency {
        Some(l) => {
            let set = align::load_adapters(&s.adapters[0])?;
            let floor = quality_split.unwrap_or(0).max(set.min_split());
            eprintln!(
                "latency: the planner may load layers {floor}.. (agreement >= {:.0} % in the quality run)",
                100.0 * s.min_agreement
            );
            latency::run(&llm, &slm, set, &s.sharegpt, l, floor)?
        }
        None => Vec::new(),
    };
    let report = Report {
        machine,
        llm: llm.cfg.name.clone(),
        slm: slm.cfg.name.clone(),
        threads: s.threads,
        adapters: sets.iter().map(|s| s.0.clone()).collect(),
        min_split,
        min_agreement: s.min_agreement,
        quality_split,
        quality,
        latency,
    };
    crate::write_json(&s.out, "lslm.json", &report)?;
    for (name, svg) in plots(report.quality.as_ref(), &report.latency) {
        std::fs::write(s.out.join(name), svg)?;
    }
    Ok(report)
}

/// The parts of `lslm.json` the plots are drawn from (`bench report` redraws them).
#[derive(serde::Deserialize)]
pub struct PlotData {
    pub quality: Option<quality::Report>,
    #[serde(default)]
    pub latency: Vec<latency::Row>,
}

/// Quality vs split, per-layer reuse, and TTFT vs split (predicted curve, measured points).
pub fn plots(quality: Option<&quality::Report>, latency: &[latency::Row]) -> Vec<(String, String)> {
    use crate::plot::{bar_chart, line_chart, Series};
    let mut out = Vec::new();
    let n_layers = n_layers(quality, latency);
    if let Some(q) = quality {
        let mut series = Vec::new();
        let mut by_file: Vec<(String, Vec<&quality::Config>)> = Vec::new();
        for c in q
            .configs
            .iter()
            .filter(|c| c.split.is_some() && c.adapters.is_some())
        {
            let key = c
                .name
                .split(" (")
                .nth(1)
                .map_or("full keys".to_string(), |t| {
                    t.trim_end_matches(')').to_string()
                });
            match by_file.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(c),
                None => by_file.push((key, vec![c])),
            }
        }
        let slm_ppl = q
            .configs
            .iter()
            .find(|c| c.name == "SLM alone")
            .map_or(0.0, |c| c.perplexity);
        for (key, cs) in &by_file {
            let loaded = |c: &&quality::Config| (n_layers - c.split.unwrap_or(0)) as f64;
            series.push(Series {
                name: format!("agree %, {key}"),
                points: std::iter::once((0.0, 100.0))
                    .chain(cs.iter().map(|c| (loaded(c), 100.0 * c.agree_slm)))
                    .collect(),
                dashed: false,
            });
            series.push(Series {
                name: format!("ppl x10, {key}"),
                points: std::iter::once((0.0, 10.0 * slm_ppl))
                    .chain(cs.iter().map(|c| (loaded(c), 10.0 * c.perplexity)))
                    .collect(),
                dashed: true,
            });
        }
        let control: Vec<&quality::Config> = q
            .configs
            .iter()
            .filter(|c| c.name.starts_with("control"))
            .collect();
        if !control.is_empty() {
            series.push(Series {
                name: "agree %, mean-KV control".into(),
                points: std::iter::once((0.0, 100.0))
                    .chain(control.iter().map(|c| {
                        (
                            (n_layers - c.split.unwrap_or(0)) as f64,
                            100.0 * c.agree_slm,
                        )
                    }))
                    .collect(),
                dashed: false,
            });
        }
        out.push((
            "lslm-quality.svg".into(),
            line_chart(
                "Edge SLM with its deepest layers' KV mapped from the cloud LLM (held-out answers)",
                "layers loaded from the cloud (deepest first)",
                "% top-1 agreement with SLM alone / perplexity x10",
                &series,
            ),
        ));
        let bars: Vec<(String, f64)> = q
            .configs
            .iter()
            .filter_map(|c| {
                c.single_layer
                    .map(|j| (format!("layer {j}"), 100.0 * c.agree_slm))
            })
            .collect();
        if !bars.is_empty() {
            out.push((
                "lslm-layers.svg".into(),
                bar_chart(
                    "next-token agreement with the SLM alone when only this layer comes from the cloud",
                    "% agreement",
                    &bars,
                ),
            ));
        }
    }
    let mut series = Vec::new();
    for row in latency {
        let tag = format!("{} {} tok", row.profile, row.cloud_tokens);
        series.push(Series {
            name: format!("predicted, {tag}"),
            points: row.curve.iter().map(|&(s, t)| (s as f64, t)).collect(),
            dashed: true,
        });
        series.push(Series {
            name: format!("measured, {tag}"),
            points: vec![
                (row.min_split as f64, row.min_split_s),
                (row.split as f64, row.measured_s),
                (n_layers as f64, row.slm_alone_s),
            ],
            dashed: false,
        });
    }
    if !series.is_empty() {
        out.push((
            "lslm-ttft.svg".into(),
            line_chart(
                "CE-LSLM TTFT vs split (layers split.. from the cloud)",
                "split layer",
                "TTFT (s)",
                &series,
            ),
        ));
    }
    out
}

fn n_layers(quality: Option<&quality::Report>, latency: &[latency::Row]) -> usize {
    latency
        .first()
        .and_then(|l| l.curve.last().map(|c| c.0))
        .or_else(|| {
            quality.and_then(|q| {
                q.configs
                    .iter()
                    .find(|c| c.name == "SLM alone")
                    .and_then(|c| c.split)
            })
        })
        .unwrap_or(0)
}

/// The smallest split that kept next-token agreement in a saved `lslm.json`.
pub fn quality_floor(table: &std::path::Path) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(table).ok()?).ok()?;
    v["quality_split"].as_u64().map(|k| k as usize)
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "qwen15")]
    llm: String,
    #[arg(long, default_value = "qwen05")]
    slm: String,
    /// Adapter files from `edgeprompt align` (the first drives latency and the per-layer study).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "models/align/adapters.safetensors,models/align/adapters-think50.safetensors"
    )]
    adapters: Vec<PathBuf>,
    /// Held-out conversations scored (0 skips the quality part).
    #[arg(long, default_value_t = 8)]
    cases: usize,
    #[arg(long, default_value_t = 512)]
    cloud_tokens: usize,
    #[arg(long, default_value_t = 96)]
    user_tokens: usize,
    #[arg(long, default_value_t = 96)]
    answer_tokens: usize,
    /// First ShareGPT record used (the ones before are calibration's).
    #[arg(long, default_value_t = 4000)]
    first_record: usize,
    /// Cloud prompt lengths for TTFT.
    #[arg(long, value_delimiter = ',', default_value = "512,1024")]
    cloud_lens: Vec<usize>,
    /// Quality only.
    #[arg(long)]
    skip_latency: bool,
    #[arg(long, default_value_t = 64)]
    edge_len: usize,
    #[arg(long, value_delimiter = ',', default_value = "6g,wifi,4g")]
    profiles: Vec<String>,
    #[arg(long, default_value = "f16")]
    codec: String,
    /// The planner only loads layers whose split kept this next-token agreement with the SLM
    /// alone in the quality run.
    #[arg(long, default_value_t = 0.9)]
    min_agreement: f64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench lslm`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let sharegpt = sharegpt()?;
    let codec = Codec::parse(&a.codec)
        .ok_or_else(|| BenchError::Failed(format!("codec is one of {}", Codec::names())))?;
    let s = Settings {
        llm: resolve(&a.llm)?,
        slm: resolve(&a.slm)?,
        adapters: a.adapters,
        quality: (a.cases > 0).then(|| quality::Settings {
            sharegpt: sharegpt.clone(),
            cases: a.cases,
            cloud_tokens: a.cloud_tokens,
            user_tokens: a.user_tokens,
            answer_tokens: a.answer_tokens,
            first_record: a.first_record,
        }),
        latency: (!a.skip_latency).then_some({
            latency::Settings {
                cloud_lens: a.cloud_lens,
                edge_len: a.edge_len,
                profiles: a.profiles,
                codec,
            }
        }),
        min_agreement: a.min_agreement,
        sharegpt,
        threads: a.threads,
        out: a.out.clone(),
    };
    for p in &s.adapters {
        if !p.exists() {
            return Err(BenchError::Failed(format!(
                "{} missing: run `edgeprompt align` first",
                p.display()
            )));
        }
    }
    run(&s)?;
    eprintln!("wrote {}/lslm.json and lslm-*.svg", a.out.display());
    Ok(())
}
