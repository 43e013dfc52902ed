//! `edgeprompt-bench fleet-costs`: the simulator's `Costs` for one model on this machine's
//! cores, fitted to timed forward passes of the engine the servers run: prompts of 16-512
//! tokens after 0-1024 held ones, and decode steps of 1-32 sequences at 128-1024 tokens of
//! context, some beside a prompt chunk as the edge's scheduler mixes them. Run pinned
//! (`taskset`) to the cores a node gets, so the pool has that many threads.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_engine::sample::argmax;
use edgeprompt_engine::Sequence;
use edgeprompt_planner::fleet::fit::fit;
use edgeprompt_planner::fleet::model::Costs;
use edgeprompt_planner::fleet::server::{StepCost, Work};
use serde::{Deserialize, Serialize};

use crate::inputs::{resolve, sharegpt};
use crate::machine::Machine;
use crate::BenchError;

pub struct Settings {
    pub model: PathBuf,
    pub sharegpt: PathBuf,
    pub threads: usize,
    /// Timings per pass; the median is kept.
    pub repeats: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Point {
    pub decoding: usize,
    pub context: f64,
    pub prefill: usize,
    pub prefill_attend: f64,
    pub secs: f64,
    pub fitted_secs: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub threads: usize,
    pub costs: Costs,
    /// Mean |fitted - measured| / measured over the points.
    pub fit_error: f64,
    pub points: Vec<Point>,
}

/// What `fleet` reads back from a `fleet-costs` run.
#[derive(Debug, Clone, Deserialize)]
pub struct Fitted {
    pub model: String,
    pub threads: usize,
    pub costs: Costs,
    pub fit_error: f64,
}

fn attend(n: usize, before: usize) -> f64 {
    n as f64 * (before as f64 + (n as f64 + 1.0) / 2.0)
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let (machine, model) = crate::setup(s.threads, &s.model)?;
    let text = crate::sharegpt::turns(&s.sharegpt, 400)?.join("\n");
    let ids = model.tokenizer.encode(&text)?;
    let need = 1024 + 32 * 8 + 512;
    if ids.len() < need {
        return Err(BenchError::Data(format!(
            "need {need} tokens of ShareGPT text, have {}",
            ids.len()
        )));
    }
    eprintln!(
        "machine: {machine}; model {}; threads {}; median of {}",
        model.cfg.name, s.threads, s.repeats
    );
    let mut prefixes = Vec::new();
    for len in [128usize, 1024] {
        let mut seq = Sequence::new(&model);
        seq.prefill_chunked(&model, &ids[..len], 256)?;
        prefixes.push((len, Arc::new(seq.export_prefix(&model)?)));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut points: Vec<(Work, f64)> = Vec::new();
    // Prompts after 0, 128 or 1024 held tokens.
    for (n, held) in [
        (16, 0),
        (64, 0),
        (256, 0),
        (512, 0),
        (64, 1024),
        (256, 1024),
        (32, 128),
    ] {
        let prompt = &ids[1024..1024 + n];
        let mut t = Vec::new();
        for _ in 0..s.repeats {
            let mut seq = match prefixes.iter().find(|p| p.0 == held) {
                Some((_, p)) => Sequence::with_prefix(&model, p.clone())?,
                None => Sequence::new(&model),
            };
            let start = Instant::now();
            model.forward(&mut [(&mut seq, prompt)])?;
            t.push(start.elapsed().as_secs_f64());
        }
        let w = Work {
            prefill: n,
            prefill_attend: attend(n, held),
            ..Work::default()
        };
        points.push((w, median(t)));
    }
    // Decode steps, alone and beside a prompt chunk.
    // Up to the edge's whole batch (32), and with a private prompt arriving beside it, as
    // under load.
    for (pi, b, chunk) in [
        (0, 1, 0),
        (0, 4, 0),
        (0, 16, 0),
        (0, 32, 0),
        (1, 1, 0),
        (1, 4, 0),
        (1, 16, 0),
        (1, 32, 0),
        (1, 4, 64),
        (0, 16, 48),
        (1, 32, 48),
    ] {
        let (len, prefix) = &prefixes[pi];
        let private = 8;
        let mut seqs = Vec::new();
        for i in 0..b {
            let mut seq = Sequence::with_prefix(&model, prefix.clone())?;
            let at = 1024 + i * private;
            model.forward(&mut [(&mut seq, &ids[at..at + private])])?;
            seqs.push(seq);
        }
        let mut next: Vec<u32> = vec![ids[0]; b];
        let mut t = Vec::new();
        for step in 0..s.repeats {
            let feeds: Vec<[u32; 1]> = next.iter().map(|&x| [x]).collect();
            let mut extra = Sequence::new(&model);
            let chunk_ids = &ids[1024 + 32 * 8..1024 + 32 * 8 + chunk];
            let mut batch: Vec<(&mut Sequence, &[u32])> = seqs
                .iter_mut()
                .zip(&feeds)
                .map(|(s, f)| (s, &f[..]))
                .collect();
            if chunk > 0 {
                batch.push((&mut extra, chunk_ids));
            }
            let start = Instant::now();
            let out = model.forward(&mut batch)?;
            t.push(start.elapsed().as_secs_f64());
            next = out.iter().take(b).map(|l| argmax(l)).collect();
            let _ = step;
        }
        // The context each sequence attends to at the middle step.
        let ctx = len + private + 1 + s.repeats / 2;
        let w = Work {
            decoding: b,
            context: (b * ctx) as f64,
            prefill: chunk,
            prefill_attend: attend(chunk, 0),
        };
        points.push((w, median(t)));
    }
    let costs = fit(&points).ok_or_else(|| BenchError::Data("the cost fit is singular".into()))?;
    let points: Vec<Point> = points
        .iter()
        .map(|(w, secs)| Point {
            decoding: w.decoding,
            context: w.context,
            prefill: w.prefill,
            prefill_attend: w.prefill_attend,
            secs: *secs,
            fitted_secs: costs.step_secs(w),
        })
        .collect();
    for p in &points {
        eprintln!(
            "  decode {:2} (context {:6.0}) prefill {:4}: {:8.2} ms measured, {:8.2} ms fitted",
            p.decoding,
            p.context,
            p.prefill,
            p.secs * 1e3,
            p.fitted_secs * 1e3
        );
    }
    let fit_error = points
        .iter()
        .map(|p| (p.fitted_secs - p.secs).abs() / p.secs)
        .sum::<f64>()
        / points.len() as f64;
    eprintln!("  fitted {costs:?}; mean error {:.1} %", fit_error * 100.0);
    Ok(Report {
        machine,
        model: model.cfg.name.clone(),
        threads: s.threads,
        costs,
        fit_error,
        points,
    })
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    model: String,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// The JSON file to write.
    #[arg(long)]
    out: PathBuf,
}

/// `edgeprompt-bench fleet-costs`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let r = run(&Settings {
        model: resolve(&a.model)?,
        sharegpt: sharegpt()?,
        threads: a.threads.max(1),
        repeats: a.repeats.max(1),
    })?;
    if let Some(dir) = a.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&a.out, serde_json::to_string_pretty(&r)?)?;
    Ok(())
}
