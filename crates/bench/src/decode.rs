//! `edgeprompt-bench decode`: batched decode throughput against batch size (1-32) and cloud
//! prompt length (64-1024), with every sequence reading one shared copy of the cloud prompt's
//! KV (RelayAttention-like, what the edge server does) versus a private copy per request
//! (PagedAttention-like, no sharing). Same model, same kernels, same run.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_engine::sample::argmax;
use edgeprompt_engine::{Model, PrefixKv, Sequence};
use serde::Serialize;

use crate::inputs::{resolve, sharegpt};
use crate::machine::Machine;
use crate::plot::{line_chart, Series};
use crate::results::{f, load, machine_line};
use crate::BenchError;

pub struct Settings {
    pub model: PathBuf,
    /// ShareGPT JSON for the text; a built-in paragraph when absent.
    pub sharegpt: Option<PathBuf>,
    pub cloud_lens: Vec<usize>,
    pub batch_sizes: Vec<usize>,
    /// Private prompt tokens per sequence before decoding.
    pub private_tokens: usize,
    /// Timed decode steps per point (after one untimed step).
    pub steps: usize,
    /// Measurements per point, the best kept (the machine is shared, interference only ever
    /// slows a run down). Each round measures every point in turn (lengths, batch sizes,
    /// shared and copy), so a slow minute of the host touches all points alike instead of
    /// skewing the ratios between lengths.
    pub repeats: usize,
    pub threads: usize,
    pub out: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One read-only copy of the prefix for the whole batch.
    Shared,
    /// Each request holds its own copy of the prefix.
    Copy,
}

#[derive(Debug, Serialize)]
pub struct Row {
    pub mode: Mode,
    pub cloud_tokens: usize,
    pub batch: usize,
    pub tok_s: f64,
    pub step_ms: f64,
    pub prefix_kv_bytes: usize,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub threads: usize,
    pub private_tokens: usize,
    pub steps: usize,
    pub repeats: usize,
    pub text_source: String,
    pub rows: Vec<Row>,
}

const FALLBACK_TEXT: &str = "Edge devices answer questions about public documents while the \
user's own data stays on the device. The public part of the prompt is long and the same for \
everyone, so it is computed once in the cloud and its key-value cache is sent to the edge. ";

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let machine = crate::start(s.threads);
    let model = Model::load(&s.model)?;
    let (text, source) = match &s.sharegpt {
        Some(p) if p.exists() => (crate::sharegpt::turns(p, 300)?.join("\n"), "ShareGPT"),
        _ => (FALLBACK_TEXT.repeat(120), "built-in paragraph"),
    };
    let ids = model.tokenizer.encode(&text)?;
    let max_len = s.cloud_lens.iter().max().copied().unwrap_or(0);
    let max_batch = s.batch_sizes.iter().max().copied().unwrap_or(1);
    let need = max_len + max_batch * s.private_tokens;
    if ids.len() < need {
        return Err(BenchError::Data(format!(
            "need {need} tokens of text, have {}",
            ids.len()
        )));
    }
    eprintln!(
        "machine: {}; model {}; threads {}; private prompt {} tokens; {} timed steps per point, best of {}",
        machine, model.cfg.name, s.threads, s.private_tokens, s.steps, s.repeats
    );
    let mut prefixes = Vec::new();
    for &len in &s.cloud_lens {
        let mut seq = Sequence::new(&model);
        seq.prefill_chunked(&model, &ids[..len], 256)?;
        prefixes.push(Arc::new(seq.export_prefix(&model)?));
    }
    let points: Vec<(usize, usize)> = (0..s.cloud_lens.len())
        .flat_map(|li| s.batch_sizes.iter().map(move |&b| (li, b)))
        .collect();
    let modes = [Mode::Shared, Mode::Copy];
    let mut best = vec![[(0f64, 0f64); 2]; points.len()];
    let rounds = s.repeats.max(1);
    for round in 1..=rounds {
        for (&(li, b), best) in points.iter().zip(best.iter_mut()) {
            let privates: Vec<&[u32]> = (0..b)
                .map(|i| {
                    let at = max_len + i * s.private_tokens;
                    &ids[at..at + s.private_tokens]
                })
                .collect();
            for (i, mode) in modes.into_iter().enumerate() {
                let m = measure(&model, &prefixes[li], &privates, mode, s.steps)?;
                eprintln!(
                    "  round {round}/{rounds} cloud {:5} batch {b:3} {mode:?}: {:8.1} tok/s",
                    s.cloud_lens[li], m.0
                );
                if m.0 > best[i].0 {
                    best[i] = m;
                }
            }
        }
    }
    let mut rows = Vec::new();
    for (&(li, b), best) in points.iter().zip(best) {
        let len = s.cloud_lens[li];
        for (mode, (tok_s, step_ms)) in modes.into_iter().zip(best) {
            eprintln!(
                "  cloud {len:5} batch {b:3} {mode:?}: {tok_s:8.1} tok/s ({step_ms:.1} ms/step), best of {rounds}"
            );
            rows.push(Row {
                mode,
                cloud_tokens: len,
                batch: b,
                tok_s,
                step_ms,
                prefix_kv_bytes: prefixes[li].bytes() * if mode == Mode::Copy { b } else { 1 },
            });
        }
    }
    let report = Report {
        machine,
        model: model.cfg.name.clone(),
        threads: s.threads,
        private_tokens: s.private_tokens,
        steps: s.steps,
        repeats: s.repeats,
        text_source: source.into(),
        rows,
    };
    print_summary(&report, s);
    write_outputs(&report, s)?;
    Ok(report)
}

/// Prefill each private prompt after the prefix, then time `steps` batched greedy decode
/// steps. Returns (tokens/s, ms per step).
fn measure(
    model: &Model,
    prefix: &Arc<PrefixKv>,
    privates: &[&[u32]],
    mode: Mode,
    steps: usize,
) -> Result<(f64, f64), BenchError> {
    let mut seqs = Vec::with_capacity(privates.len());
    for _ in privates {
        let p = match mode {
            Mode::Shared => prefix.clone(),
            Mode::Copy => Arc::new(PrefixKv {
                layers: prefix
                    .layers
                    .iter()
                    .map(|l| Arc::new((**l).clone()))
                    .collect(),
                ..(**prefix).clone()
            }),
        };
        seqs.push(Sequence::with_prefix(model, p)?);
    }
    let mut batch: Vec<(&mut Sequence, &[u32])> =
        seqs.iter_mut().zip(privates.iter().copied()).collect();
    let mut next: Vec<u32> = model
        .forward(&mut batch)?
        .iter()
        .map(|l| argmax(l))
        .collect();
    drop(batch);
    let mut start = Instant::now();
    for step in 0..=steps {
        if step == 1 {
            // The first step warms caches; time the rest.
            start = Instant::now();
        }
        let feeds: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let mut batch: Vec<(&mut Sequence, &[u32])> = seqs
            .iter_mut()
            .zip(&feeds)
            .map(|(s, f)| (s, &f[..]))
            .collect();
        next = model
            .forward(&mut batch)?
            .iter()
            .map(|l| argmax(l))
            .collect();
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    Ok((
        (privates.len() * steps) as f64 / secs,
        secs * 1e3 / steps as f64,
    ))
}

fn tok_s(r: &Report, mode: Mode, len: usize, b: usize) -> Option<f64> {
    r.rows
        .iter()
        .find(|x| x.mode == mode && x.cloud_tokens == len && x.batch == b)
        .map(|x| x.tok_s)
}

fn print_summary(r: &Report, s: &Settings) {
    let (Some(&lo), Some(&hi)) = (s.cloud_lens.first(), s.cloud_lens.last()) else {
        return;
    };
    println!("\nbatch | shared {hi}/{lo} (flat = 1.00) | copy {hi}/{lo} | shared/copy at {hi}");
    for &b in &s.batch_sizes {
        let f = |m, l| tok_s(r, m, l, b).unwrap_or(f64::NAN);
        println!(
            "{b:5} | {:>27.2} | {:>12.2} | {:>8.2}x",
            f(Mode::Shared, hi) / f(Mode::Shared, lo),
            f(Mode::Copy, hi) / f(Mode::Copy, lo),
            f(Mode::Shared, hi) / f(Mode::Copy, hi)
        );
    }
}

fn write_outputs(r: &Report, s: &Settings) -> Result<(), BenchError> {
    crate::write_json(&s.out, "decode.json", r)?;
    let mut by_batch = Vec::new();
    for mode in [Mode::Shared, Mode::Copy] {
        for &len in &s.cloud_lens {
            by_batch.push(Series {
                name: format!("{mode:?} prefix, cloud {len}"),
                points: s
                    .batch_sizes
                    .iter()
                    .filter_map(|&b| tok_s(r, mode, len, b).map(|t| (b as f64, t)))
                    .collect(),
                dashed: mode == Mode::Copy,
            });
        }
    }
    let title = format!(
        "{}: batched decode throughput, shared prefix (solid) vs per-request copy (dashed)",
        r.model
    );
    std::fs::write(
        s.out.join("decode-batch.svg"),
        line_chart(&title, "batch size", "tokens/s", &by_batch),
    )?;
    let mut by_len = Vec::new();
    for mode in [Mode::Shared, Mode::Copy] {
        for &b in s.batch_sizes.iter().filter(|&&b| b >= 8) {
            by_len.push(Series {
                name: format!("{mode:?} prefix, batch {b}"),
                points: s
                    .cloud_lens
                    .iter()
                    .filter_map(|&l| tok_s(r, mode, l, b).map(|t| (l as f64, t)))
                    .collect(),
                dashed: mode == Mode::Copy,
            });
        }
    }
    let title = format!("{}: decode throughput against cloud prompt length", r.model);
    std::fs::write(
        s.out.join("decode-prefix-len.svg"),
        line_chart(&title, "cloud prompt tokens", "tokens/s", &by_len),
    )?;
    Ok(())
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    #[arg(long, value_delimiter = ',', default_value = "64,256,512,1024")]
    cloud_lens: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    batch_sizes: Vec<usize>,
    #[arg(long, default_value_t = 32)]
    private_tokens: usize,
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// Measurements per point; the best is kept.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench decode`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let s = Settings {
        model: resolve(&a.model)?,
        sharegpt: sharegpt().ok(),
        cloud_lens: a.cloud_lens,
        batch_sizes: a.batch_sizes,
        private_tokens: a.private_tokens,
        steps: a.steps.max(1),
        repeats: a.repeats,
        threads: a.threads,
        out: a.out.clone(),
    };
    let r = run(&s)?;
    eprintln!(
        "wrote {} rows to {}/decode.json and decode-*.svg",
        r.rows.len(),
        a.out.display()
    );
    Ok(())
}

/// The section of `docs/results.md` from `<sub>decode.json`.
pub fn section(dir: &Path, sub: &str, md: &mut String) {
    let Some(v) = load(dir, &format!("{sub}decode.json")) else {
        return;
    };
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    let get = |mode: &str, len: u64, b: u64| {
        rows.iter()
            .find(|r| r["mode"] == mode && r["cloud_tokens"] == len && r["batch"] == b)
            .map_or(f64::NAN, |r| f(&r["tok_s"]))
    };
    let mut lens: Vec<u64> = rows
        .iter()
        .filter_map(|r| r["cloud_tokens"].as_u64())
        .collect();
    lens.sort();
    lens.dedup();
    let mut batches: Vec<u64> = rows.iter().filter_map(|r| r["batch"].as_u64()).collect();
    batches.sort();
    batches.dedup();
    let (Some(&lo), Some(&hi)) = (lens.first(), lens.last()) else {
        return;
    };
    let _ = writeln!(
        md,
        "## Batched decode: shared prefix vs per-request copy (`edgeprompt-bench decode`, `{sub}decode.json`)\n\n{}; private prompt {} \
         tokens, {} timed steps, best of {}\n\n| batch | shared tok/s at {} / {} cloud tokens | copy tok/s at {lo} / {hi} | shared {hi}/{lo} | shared / copy at {hi} | prefix KV held at {hi}: shared / copies |\n| --- | --- | --- | --- | --- | --- |",
        machine_line(&v),
        v["private_tokens"],
        v["steps"],
        v["repeats"],
        lo,
        hi
    );
    let bytes = |mode: &str, b: u64| {
        rows.iter()
            .find(|r| r["mode"] == mode && r["cloud_tokens"] == hi && r["batch"] == b)
            .map_or(f64::NAN, |r| f(&r["prefix_kv_bytes"]) / 1e6)
    };
    for b in batches {
        let _ = writeln!(
            md,
            "| {b} | {:.0} / {:.0} | {:.0} / {:.0} | {:.2} | {:.2}x | {:.1} MB / {:.1} MB |",
            get("shared", lo, b),
            get("shared", hi, b),
            get("copy", lo, b),
            get("copy", hi, b),
            get("shared", hi, b) / get("shared", lo, b),
            get("shared", hi, b) / get("copy", hi, b),
            bytes("shared", b),
            bytes("copy", b)
        );
    }
    let _ = writeln!(
        md,
        "\n![by batch](results/{sub}decode-batch.svg) ![by length](results/{sub}decode-prefix-len.svg)\n"
    );
}
