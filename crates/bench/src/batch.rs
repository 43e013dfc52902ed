//! `edgeprompt-bench batch` (EdgePrompt Fig. 3): groups of requests that share a cloud prompt,
//! run to completion with the edge server's continuous batcher, throughput (generated tokens/s)
//! against cloud-prompt length for three schemes:
//! - `no_sharing` (PagedAttention-like): every request prefills its own copy of the cloud prompt;
//! - `shared` (RelayAttention-like): each group's cloud prompt is prefilled once here and shared;
//! - `split` (EdgePrompt): the cloud prompt's KV comes from the cloud (its prefill is the cloud's
//!   work, not timed here; its transfer is what `bench ttft` measures) and is shared.
//!
//! "Cloud" and "edge" hardware are emulated by the thread count (stated in the output).

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::scheduler::{Batcher, Event, Job, SchedulerConfig};
use edgeprompt_engine::{Message, Model, PrefixKv, SamplingParams, Sequence};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::inputs::{resolve, sharegpt};
use crate::machine::Machine;
use crate::plot::{line_chart, Series};
use crate::results::{f, load, machine_line};
use crate::workload::{Workload, WorkloadSpec};
use crate::BenchError;

pub struct Settings {
    pub model: PathBuf,
    /// `cloud_len` is replaced by each of `cloud_lens`.
    pub workload: WorkloadSpec,
    pub cloud_lens: Vec<usize>,
    pub max_tokens: usize,
    /// (label, threads), e.g. ("cloud", 2), ("edge", 1).
    pub hardware: Vec<(String, usize)>,
    pub out: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    NoSharing,
    Shared,
    Split,
}

const SCHEMES: [Scheme; 3] = [Scheme::NoSharing, Scheme::Shared, Scheme::Split];

#[derive(Debug, Serialize)]
pub struct Row {
    pub hardware: String,
    pub threads: usize,
    pub scheme: Scheme,
    pub cloud_tokens: usize,
    pub requests: usize,
    pub generated_tokens: usize,
    pub secs: f64,
    pub tok_s: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub max_tokens: usize,
    pub workload: WorkloadSpec,
    pub rows: Vec<Row>,
}

/// A group's cloud prompt ids and its requests' private ids.
struct Group {
    cloud: Vec<u32>,
    requests: Vec<Vec<u32>>,
}

fn groups(model: &Model, w: &Workload) -> Result<Vec<Group>, BenchError> {
    let chat = model
        .chat
        .as_ref()
        .ok_or_else(|| BenchError::Data("model has no chat template".into()))?;
    let mut out = Vec::new();
    for (g, sys) in w.cloud.iter().enumerate() {
        let cloud = model
            .tokenizer
            .encode(&chat.render(&[Message::new("system", sys)], false)?)?;
        let mut requests = Vec::new();
        for r in w.requests.iter().filter(|r| r.cloud == g) {
            let split = chat.split(sys, &[Message::new("user", &r.user)])?;
            requests.push(model.tokenizer.encode(&split.edge)?);
        }
        out.push(Group { cloud, requests });
    }
    Ok(out)
}

fn prefill_prefix(model: &Model, ids: &[u32]) -> Result<Arc<PrefixKv>, BenchError> {
    let mut seq = Sequence::new(model);
    seq.prefill_chunked(model, ids, 256)?;
    Ok(Arc::new(seq.export_prefix(model)?))
}

/// Run every request of `groups` under `scheme`; (generated tokens, seconds).
fn run_scheme(
    model: &Arc<Model>,
    groups: &[Group],
    scheme: Scheme,
    max_tokens: usize,
) -> Result<(usize, f64), BenchError> {
    // The split scheme's prefixes are the cloud's work: computed before the clock starts.
    let received: Vec<Option<Arc<PrefixKv>>> = groups
        .iter()
        .map(|g| match scheme {
            Scheme::Split => prefill_prefix(model, &g.cloud).map(Some),
            _ => Ok(None),
        })
        .collect::<Result<_, _>>()?;
    let cfg = SchedulerConfig {
        kv_budget_bytes: usize::MAX / 2,
        ..SchedulerConfig::default()
    };
    let mut b = Batcher::new(model.clone(), cfg, Arc::new(Metrics::new()));
    let start = Instant::now();
    let mut rxs = Vec::new();
    for (g, pre) in groups.iter().zip(received) {
        let prefix = match scheme {
            Scheme::NoSharing => None,
            Scheme::Shared => Some(prefill_prefix(model, &g.cloud)?),
            Scheme::Split => pre,
        };
        for ids in &g.requests {
            let prompt = match scheme {
                Scheme::NoSharing => [g.cloud.as_slice(), ids].concat(),
                _ => ids.clone(),
            };
            let (tx, rx) = mpsc::unbounded_channel();
            b.admit(Job {
                prefix: prefix.clone(),
                prompt,
                max_tokens,
                sampling: SamplingParams::default(),
                stop: Vec::new(),
                events: tx,
            })
            .map_err(|e| BenchError::Data(format!("{e:?}")))?;
            rxs.push(rx);
        }
    }
    while !b.is_idle() {
        b.step();
    }
    let secs = start.elapsed().as_secs_f64();
    let mut tokens = 0;
    for rx in &mut rxs {
        while let Ok(ev) = rx.try_recv() {
            match ev {
                Event::Done(d) => tokens += d.completion_tokens,
                Event::Failed(m) => return Err(BenchError::Data(m.to_string())),
                Event::Text(_) => {}
            }
        }
    }
    Ok((tokens, secs))
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let machine = Machine::detect();
    let model = Arc::new(Model::load(&s.model)?);
    eprintln!(
        "machine: {}; model {}; {} groups x {} requests, private ~{} tokens, max_tokens {}; hardware {:?}",
        machine, model.cfg.name, s.workload.groups,
        s.workload.per_group, s.workload.edge_len, s.max_tokens, s.hardware
    );
    let mut rows = Vec::new();
    for (label, threads) in &s.hardware {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(*threads)
            .build()
            .map_err(|e| BenchError::Data(e.to_string()))?;
        for &len in &s.cloud_lens {
            let spec = WorkloadSpec {
                cloud_len: len,
                ..s.workload.clone()
            };
            let gs = groups(&model, &Workload::build(&model, &spec)?)?;
            let n: usize = gs.iter().map(|g| g.requests.len()).sum();
            for scheme in SCHEMES {
                let (tokens, secs) =
                    pool.install(|| run_scheme(&model, &gs, scheme, s.max_tokens))?;
                let tok_s = tokens as f64 / secs.max(1e-9);
                eprintln!("  {label} ({threads} threads) cloud {len:5} {scheme:?}: {tokens} tokens in {secs:.2} s = {tok_s:.1} tok/s");
                rows.push(Row {
                    hardware: label.clone(),
                    threads: *threads,
                    scheme,
                    cloud_tokens: len,
                    requests: n,
                    generated_tokens: tokens,
                    secs,
                    tok_s,
                });
            }
        }
    }
    let report = Report {
        machine,
        model: model.cfg.name.clone(),
        max_tokens: s.max_tokens,
        workload: s.workload.clone(),
        rows,
    };
    crate::write_json(&s.out, "batch.json", &report)?;
    for (label, threads) in &s.hardware {
        let series: Vec<Series> = SCHEMES
            .iter()
            .map(|&scheme| Series {
                name: format!("{scheme:?}"),
                points: report
                    .rows
                    .iter()
                    .filter(|r| &r.hardware == label && r.scheme == scheme)
                    .map(|r| (r.cloud_tokens as f64, r.tok_s))
                    .collect(),
                dashed: scheme == Scheme::NoSharing,
            })
            .collect();
        let title = format!(
            "{}: throughput against cloud prompt length, {label} ({threads} threads)",
            report.model
        );
        std::fs::write(
            s.out.join(format!("batch-{label}.svg")),
            line_chart(&title, "cloud prompt tokens", "generated tokens/s", &series),
        )?;
    }
    Ok(report)
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    #[arg(long, value_delimiter = ',', default_value = "64,256,512,1024")]
    cloud_lens: Vec<usize>,
    /// Groups (distinct cloud prompts); the paper uses 100.
    #[arg(long, default_value_t = 2)]
    groups: usize,
    /// Requests per group; the paper uses 10.
    #[arg(long, default_value_t = 8)]
    per_group: usize,
    #[arg(long, default_value_t = 64)]
    edge_len: usize,
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Hardware settings as label:threads.
    #[arg(long, value_delimiter = ',', default_value = "cloud:2,edge:1")]
    hardware: Vec<String>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench batch`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let mut hardware = Vec::new();
    for h in &a.hardware {
        let (label, t) = h
            .split_once(':')
            .ok_or_else(|| BenchError::Failed(format!("hardware is label:threads, got {h}")))?;
        let t = t
            .parse::<usize>()
            .map_err(|e| BenchError::Failed(e.to_string()))?;
        hardware.push((label.to_string(), t.max(1)));
    }
    let s = Settings {
        model: resolve(&a.model)?,
        workload: WorkloadSpec {
            sharegpt: sharegpt()?,
            groups: a.groups.max(1),
            per_group: a.per_group.max(1),
            cloud_len: 0,
            edge_len: a.edge_len,
            seed: a.seed,
        },
        cloud_lens: a.cloud_lens,
        max_tokens: a.max_tokens,
        hardware,
        out: a.out.clone(),
    };
    let r = run(&s)?;
    eprintln!(
        "wrote {} rows to {}/batch.json and batch-*.svg",
        r.rows.len(),
        a.out.display()
    );
    Ok(())
}

/// The section of `docs/results.md` from `batch.json`.
pub fn section(dir: &Path, md: &mut String) {
    let Some(v) = load(dir, "batch.json") else {
        return;
    };
    let w = &v["workload"];
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(
        md,
        "## Throughput against cloud prompt length (`edgeprompt-bench batch`, EdgePrompt Fig. 3)\n\n{}; {} groups × {} \
         requests, private prompts of {} tokens, max_tokens {}; `split` takes the cloud prompt's KV as received (its \
         prefill is the cloud's work)\n\n| hardware | cloud tokens | no sharing tok/s | shared tok/s | split tok/s | split / no sharing |\n| --- | --- | --- | --- | --- | --- |",
        machine_line(&v),
        w["groups"],
        w["per_group"],
        w["edge_len"],
        v["max_tokens"]
    );
    let mut keys: Vec<(String, u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["hardware"].as_str().unwrap_or("?").to_string(),
                r["threads"].as_u64().unwrap_or(0),
                r["cloud_tokens"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    keys.dedup();
    for (hw, threads, len) in keys {
        let get = |scheme: &str| {
            rows.iter()
                .find(|r| {
                    r["hardware"] == hw.as_str()
                        && r["cloud_tokens"] == len
                        && r["scheme"] == scheme
                })
                .map_or(f64::NAN, |r| f(&r["tok_s"]))
        };
        let _ = writeln!(
            md,
            "| {hw} ({threads} threads) | {len} | {:.1} | {:.1} | {:.1} | {:.2}x |",
            get("no_sharing"),
            get("shared"),
            get("split"),
            get("split") / get("no_sharing")
        );
    }
    let _ = writeln!(
        md,
        "\n![cloud](results/batch-cloud.svg) ![edge](results/batch-edge.svg)\n"
    );
}
