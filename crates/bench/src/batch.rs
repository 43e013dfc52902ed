//! `edgeprompt-bench batch` (EdgePrompt Fig. 3): groups of requests that share a cloud prompt,
//! run to completion with the edge server's continuous batcher, throughput (generated tokens/s)
//! against cloud-prompt length for three schemes:
//! - `no_sharing` (PagedAttention-like): every request prefills its own copy of the cloud prompt;
//! - `shared` (RelayAttention-like): each group's cloud prompt is prefilled once here and shared;
//! - `split` (EdgePrompt): the cloud prompt's KV comes from the cloud (its prefill is the cloud's
//!   work, not timed here; its transfer is what `bench ttft` measures) and is shared.
//!
//! "Cloud" and "edge" hardware are emulated by the thread count (stated in the output).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::scheduler::{Batcher, Event, Job, SchedulerConfig};
use edgeprompt_engine::{Message, Model, PrefixKv, SamplingParams, Sequence};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::machine::Machine;
use crate::plot::{line_chart, Series};
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
