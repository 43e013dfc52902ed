//! `edgeprompt-bench grammar`: what constrained decoding costs a batched decode step. The same
//! sequences (a shared cloud prompt, private prompts after it) decode greedily with no grammar,
//! held to a JSON schema, and under the free-text rule of `tool_choice: auto`; each step is the
//! batched forward pass plus every row's draw (the grammar's mask included), as the edge
//! server's scheduler runs it.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_engine::{
    sample_each, Draw, Grammars, Model, Sampler, SamplingParams, Sequence, Spec,
};
use serde::Serialize;
use serde_json::json;

use crate::inputs::{resolve, sharegpt};
use crate::machine::Machine;
use crate::results::{f, load, machine_line};
use crate::BenchError;

pub struct Settings {
    pub model: PathBuf,
    pub sharegpt: Option<PathBuf>,
    pub cloud_tokens: usize,
    pub private_tokens: usize,
    pub batch_sizes: Vec<usize>,
    /// Timed decode steps per point (after one untimed step).
    pub steps: usize,
    /// Rounds; each point keeps its best.
    pub repeats: usize,
    pub threads: usize,
    pub out: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// No grammar: the baseline.
    Plain,
    /// A JSON schema whose answers are long (an array of at least 60 objects).
    JsonSchema,
    /// Text that may not open with a call's marks: `tool_choice: auto` when the model chats.
    ToolsAutoText,
}

const MODES: [Mode; 3] = [Mode::Plain, Mode::JsonSchema, Mode::ToolsAutoText];

#[derive(Debug, Serialize)]
pub struct Row {
    pub mode: Mode,
    pub batch: usize,
    pub tok_s: f64,
    pub step_ms: f64,
    /// Of a step: the draws (and masks) of all rows.
    pub draw_ms: f64,
    /// Rows whose answer had ended (an end token drawn) by the last timed step.
    pub ended_rows: usize,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub threads: usize,
    pub cloud_tokens: usize,
    pub private_tokens: usize,
    pub steps: usize,
    pub repeats: usize,
    pub schema: serde_json::Value,
    pub text_rule: String,
    pub rows: Vec<Row>,
}

fn schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 60,
                "items": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, "note": {"type": "string"}},
                    "required": ["id", "note"]
                }
            }
        },
        "required": ["items"]
    })
}

const TEXT_RULE: &str =
    "start: TEXT\nTEXT: /(.|\\n)+/ & ~/[ \\t\\n]*(\\{|```|<tool_call>)(.|\\n)*/\n";

fn spec(mode: Mode) -> Option<Spec> {
    match mode {
        Mode::Plain => None,
        Mode::JsonSchema => Some(Spec::JsonSchema(schema())),
        Mode::ToolsAutoText => Some(Spec::Lark(TEXT_RULE.into())),
    }
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let machine = crate::start(s.threads);
    let model = Model::load(&s.model)?;
    let t = Instant::now();
    let grammars = Grammars::for_model(&model).map_err(|e| BenchError::Data(e.to_string()))?;
    let trie_secs = t.elapsed().as_secs_f64();
    let text = match &s.sharegpt {
        Some(p) if p.exists() => crate::sharegpt::turns(p, 300)?.join("\n"),
        _ => "Answer the questions of the passengers of a railway. ".repeat(200),
    };
    let ids = model.tokenizer.encode(&text)?;
    let max_b = s.batch_sizes.iter().max().copied().unwrap_or(1);
    let need = s.cloud_tokens + max_b * s.private_tokens;
    if ids.len() < need {
        return Err(BenchError::Data(format!(
            "need {need} tokens of text, have {}",
            ids.len()
        )));
    }
    eprintln!(
        "machine: {machine}; model {}; threads {}; cloud prompt {} tokens, private {} each; {} timed \
         steps per point, best of {}; vocabulary trie built in {trie_secs:.2} s",
        model.cfg.name, s.threads, s.cloud_tokens, s.private_tokens, s.steps, s.repeats
    );
    let prefix = {
        let mut seq = Sequence::new(&model);
        seq.prefill_chunked(&model, &ids[..s.cloud_tokens], 256)?;
        Arc::new(seq.export_prefix(&model)?)
    };
    let mut best: Vec<Option<Row>> = Vec::new();
    let points: Vec<(usize, Mode)> = s
        .batch_sizes
        .iter()
        .flat_map(|&b| MODES.iter().map(move |&m| (b, m)))
        .collect();
    best.resize_with(points.len(), || None);
    for round in 1..=s.repeats.max(1) {
        for (&(b, mode), best) in points.iter().zip(best.iter_mut()) {
            let privates: Vec<&[u32]> = (0..b)
                .map(|i| {
                    let at = s.cloud_tokens + i * s.private_tokens;
                    &ids[at..at + s.private_tokens]
                })
                .collect();
            let row = measure(&model, &grammars, &prefix, &privates, mode, s.steps)?;
            eprintln!(
                "  round {round} batch {b:3} {mode:?}: {:7.1} tok/s, step {:.2} ms (draws {:.2} ms), {} ended",
                row.tok_s, row.step_ms, row.draw_ms, row.ended_rows
            );
            if best.as_ref().is_none_or(|x| row.tok_s > x.tok_s) {
                *best = Some(row);
            }
        }
    }
    let rows: Vec<Row> = best.into_iter().flatten().collect();
    let report = Report {
        machine,
        model: model.cfg.name.clone(),
        threads: s.threads,
        cloud_tokens: s.cloud_tokens,
        private_tokens: s.private_tokens,
        steps: s.steps,
        repeats: s.repeats,
        schema: schema(),
        text_rule: TEXT_RULE.into(),
        rows,
    };
    println!("\nbatch | mode | tok/s | vs plain | draws per step | masks' share of a plain step");
    for r in &report.rows {
        let Some(plain) = report
            .rows
            .iter()
            .find(|p| p.batch == r.batch && p.mode == Mode::Plain)
        else {
            continue;
        };
        println!(
            "{:5} | {:?} | {:.1} | {:.3}x | {:.2} ms | {:.1} %",
            r.batch,
            r.mode,
            r.tok_s,
            r.tok_s / plain.tok_s,
            r.draw_ms,
            mask_share(r, plain)
        );
    }
    crate::write_json(&s.out, "grammar.json", &report)?;
    Ok(report)
}

/// What the masks add to a step, as a share of the plain step: the draws' time is measured
/// apart, so this is steadier than the two throughputs' ratio, which host noise moves by a few
/// per cent.
pub fn mask_share(r: &Row, plain: &Row) -> f64 {
    100.0 * (r.draw_ms - plain.draw_ms) / plain.step_ms
}

/// Prefill each private prompt after the prefix, then time `steps` batched greedy steps, each
/// a forward pass and every row's draw under `mode`'s grammar.
fn measure(
    model: &Model,
    grammars: &Grammars,
    prefix: &Arc<edgeprompt_engine::PrefixKv>,
    privates: &[&[u32]],
    mode: Mode,
    steps: usize,
) -> Result<Row, BenchError> {
    let mut seqs = Vec::with_capacity(privates.len());
    let mut samplers = Vec::with_capacity(privates.len());
    let mut constraints = Vec::with_capacity(privates.len());
    for _ in privates {
        seqs.push(Sequence::with_prefix(model, prefix.clone())?);
        samplers.push(Sampler::new(SamplingParams::default()));
        constraints.push(match spec(mode) {
            Some(sp) => Some(
                grammars
                    .constraint(&sp)
                    .map_err(|e| BenchError::Data(e.to_string()))?,
            ),
            None => None,
        });
    }
    let mut batch: Vec<(&mut Sequence, &[u32])> =
        seqs.iter_mut().zip(privates.iter().copied()).collect();
    let mut logits = model.forward(&mut batch)?;
    drop(batch);
    let mut ended = vec![false; privates.len()];
    let (mut start, mut draw_secs) = (Instant::now(), 0.0);
    for step in 0..=steps {
        if step == 1 {
            // The first step warms caches; time the rest.
            start = Instant::now();
            draw_secs = 0.0;
        }
        let t = Instant::now();
        let draws: Vec<Draw> = samplers
            .iter_mut()
            .zip(constraints.iter_mut())
            .zip(&logits)
            .map(|((sampler, c), l)| Draw {
                sampler,
                constraint: c.as_mut(),
                logits: l,
            })
            .collect();
        let next: Vec<u32> = sample_each(draws)
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(|e| BenchError::Data(e.to_string()))?;
        draw_secs += t.elapsed().as_secs_f64();
        for (e, id) in ended.iter_mut().zip(&next) {
            *e |= model.tokenizer.stop_ids.contains(id);
        }
        let feeds: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let mut batch: Vec<(&mut Sequence, &[u32])> = seqs
            .iter_mut()
            .zip(&feeds)
            .map(|(s, f)| (s, &f[..]))
            .collect();
        logits = model.forward(&mut batch)?;
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    Ok(Row {
        mode,
        batch: privates.len(),
        tok_s: (privates.len() * steps) as f64 / secs,
        step_ms: secs * 1e3 / steps as f64,
        draw_ms: draw_secs * 1e3 / steps as f64,
        ended_rows: ended.iter().filter(|&&e| e).count(),
    })
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "qwen05")]
    model: String,
    #[arg(long, default_value_t = 256)]
    cloud_tokens: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    batch_sizes: Vec<usize>,
    #[arg(long, default_value_t = 32)]
    private_tokens: usize,
    #[arg(long, default_value_t = 32)]
    steps: usize,
    /// Rounds; each point keeps its best.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench grammar`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let s = Settings {
        model: resolve(&a.model)?,
        sharegpt: sharegpt().ok(),
        cloud_tokens: a.cloud_tokens,
        private_tokens: a.private_tokens,
        batch_sizes: a.batch_sizes,
        steps: a.steps.max(1),
        repeats: a.repeats,
        threads: a.threads,
        out: a.out.clone(),
    };
    let r = run(&s)?;
    eprintln!(
        "wrote {} rows to {}/grammar.json",
        r.rows.len(),
        a.out.display()
    );
    Ok(())
}

/// The section of `docs/results.md` from `grammar.json`.
pub fn section(dir: &Path, md: &mut String) {
    let Some(v) = load(dir, "grammar.json") else {
        return;
    };
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(
        md,
        "## Constrained decoding's cost (`edgeprompt-bench grammar`, `grammar.json`)\n\n{}; cloud prompt {} tokens, \
         private {} each, {} timed greedy steps, best of {}. Each step is the batched forward pass and every \
         row's draw, the grammar's mask included. `json_schema`: an object holding an array of at least 60 \
         objects, so no answer ends in the run. `tools_auto_text`: the free-text rule of `tool_choice: auto`. \
         The masks' share is what the draws add over the plain draws, in a plain step's time. It is measured \
         apart, so host noise moves it less than the throughput ratio.\n\n\
         | batch | mode | tok/s | vs plain | draws per step | masks' share of a step |\n| --- | --- | --- | --- | --- | --- |",
        machine_line(&v),
        v["cloud_tokens"],
        v["private_tokens"],
        v["steps"],
        v["repeats"]
    );
    for r in &rows {
        let Some(plain) = rows
            .iter()
            .find(|p| p["batch"] == r["batch"] && p["mode"] == "plain")
        else {
            continue;
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.3}x | {:.2} ms | {:.1} % |",
            r["batch"],
            r["mode"].as_str().unwrap_or(""),
            f(&r["tok_s"]),
            f(&r["tok_s"]) / f(&plain["tok_s"]),
            f(&r["draw_ms"]),
            100.0 * (f(&r["draw_ms"]) - f(&plain["draw_ms"])) / f(&plain["step_ms"])
        );
    }
    let _ = writeln!(md);
}
