//! `edgeprompt-bench codecs`: what each KV codec does to the answer. ShareGPT pairs (a cloud
//! prompt as the system turn, a private prompt as the user turn); the cloud prompt's KV goes
//! through the codec as the wire carries it (layer by layer, chunks of `CHUNK_TOKENS`, the
//! real `Reassembler`), and the edge continues from the decoded KV. Against the f16 answer
//! (bitwise the single-node answer):
//! - teacher-forced next-token agreement: at the private prompt's last position and at every
//!   position of the reference answer, fed the reference tokens, is the greedy token the same?
//! - free-running identity: is the whole greedy answer (up to `answer_tokens`, or the stop
//!   token) the same?
//! - the largest |Δlogit| at the first answer position;
//! - bytes against f16 (raw and zstd-3), encode and decode MB/s of f16 KV.
//!
//! And a reference row, `ULP`: the f16 KV with every value but the first token's moved by at
//! most one unit in its last place (two in three of them moved). A codec at 4 or 8 bits moves
//! most values by far more; how often this tiny change already flips a greedy answer says how
//! much of a codec's "identical answers" shortfall is the model's near-ties, not the codec.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_cloud::stream::CHUNK_TOKENS;
use edgeprompt_engine::sample::argmax;
use edgeprompt_engine::{Message, Model, PrefixKv, Sequence};
use edgeprompt_kv::chunk::{Chunk, Reassembler};
use edgeprompt_kv::Codec;
use half::f16;
use serde::Serialize;
use serde_json::Value;

use crate::inputs::{resolve, sharegpt};
use crate::machine::Machine;
use crate::plot::{line_chart, Series};
use crate::results::{f, load, machine_line};
use crate::workload::{Workload, WorkloadSpec};
use crate::BenchError;

/// The reference row's name.
pub const ULP: &str = "f16 ±1 ulp";

pub struct Settings {
    pub models: Vec<PathBuf>,
    pub sharegpt: PathBuf,
    pub codecs: Vec<Codec>,
    pub pairs: usize,
    pub cloud_len: usize,
    pub edge_len: usize,
    pub answer_tokens: usize,
    pub threads: usize,
    pub out: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Row {
    pub model: String,
    pub codec: String,
    /// f16 bytes / codec bytes.
    pub ratio_vs_f16: f64,
    /// The same with zstd level 3 on both.
    pub ratio_vs_f16_zstd: f64,
    /// Fractions in 0..1.
    pub next_token_agreement: f64,
    pub identical_64: f64,
    pub max_abs_dlogit: f64,
    pub encode_mb_s: f64,
    pub decode_mb_s: f64,
    pub pairs: usize,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub threads: usize,
    pub cloud_tokens: usize,
    pub edge_tokens: usize,
    pub answer_tokens: usize,
    pub chunk_tokens: usize,
    pub rows: Vec<Row>,
}

/// One codec's tallies over a model's pairs.
#[derive(Default)]
struct Tally {
    bytes: usize,
    zbytes: usize,
    agree: usize,
    positions: usize,
    identical: usize,
    dlogit: f32,
    enc_s: f64,
    dec_s: f64,
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let machine = crate::start(s.threads);
    eprintln!(
        "machine: {machine}; {} threads; {} pairs of {} cloud + {} private tokens, answers of {}; codecs {}",
        s.threads,
        s.pairs,
        s.cloud_len,
        s.edge_len,
        s.answer_tokens,
        s.codecs.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
    );
    let mut rows = Vec::new();
    for path in &s.models {
        rows.extend(model_rows(s, path)?);
    }
    let report = Report {
        machine,
        threads: s.threads,
        cloud_tokens: s.cloud_len,
        edge_tokens: s.edge_len,
        answer_tokens: s.answer_tokens,
        chunk_tokens: CHUNK_TOKENS,
        rows,
    };
    crate::write_json(&s.out, "codecs.json", &report)?;
    std::fs::write(s.out.join("codecs.svg"), plot(&report.rows))?;
    Ok(report)
}

fn model_rows(s: &Settings, path: &std::path::Path) -> Result<Vec<Row>, BenchError> {
    let model = Model::load(path)?;
    let name = model.cfg.name.clone();
    eprintln!("model {name}");
    let work = Workload::build(
        &model,
        &WorkloadSpec {
            sharegpt: s.sharegpt.clone(),
            groups: s.pairs,
            per_group: 1,
            cloud_len: s.cloud_len,
            edge_len: s.edge_len,
            seed: 11,
        },
    )?;
    // One tally per codec, then the reference's.
    let mut tallies: Vec<Tally> = (0..=s.codecs.len()).map(|_| Tally::default()).collect();
    let mut f16_bytes = (0, 0);
    for (i, r) in work.requests.iter().enumerate() {
        let (cloud_ids, edge_ids) = split_ids(&model, &work.cloud[r.cloud], &r.user)?;
        let mut cloud = Sequence::new(&model);
        cloud.prefill_chunked(&model, &cloud_ids, 512)?;
        let exact = cloud.export_prefix(&model)?;
        let (_, plain) = transcode(&exact, Codec::F16)?;
        f16_bytes = (f16_bytes.0 + plain.bytes, f16_bytes.1 + plain.zbytes);
        // The reference is f16 on the wire, with no codec to time.
        let reference = WireStats {
            enc_s: 0.0,
            dec_s: 0.0,
            ..plain
        };
        let (want_first, want) = greedy(&model, Arc::new(exact.clone()), &edge_ids, s)?;
        for (k, t) in tallies.iter_mut().enumerate() {
            let (prefix, stats) = match s.codecs.get(k) {
                Some(codec) => transcode(&exact, *codec)?,
                None => (nudge(&exact)?, reference),
            };
            t.bytes += stats.bytes;
            t.zbytes += stats.zbytes;
            t.enc_s += stats.enc_s;
            t.dec_s += stats.dec_s;
            let prefix = Arc::new(prefix);
            let (agree, dl) =
                teacher_forced(&model, prefix.clone(), &edge_ids, &want, &want_first)?;
            t.agree += agree;
            t.positions += want.len();
            t.dlogit = t.dlogit.max(dl);
            // Greedy answers differ only if some position disagreed.
            let same = agree == want.len() || greedy(&model, prefix, &edge_ids, s)?.1 == want;
            t.identical += usize::from(same);
        }
        eprintln!("  pair {}/{}", i + 1, work.requests.len());
    }
    let n = work.requests.len();
    let f16_mb = f16_bytes.0 as f64 / 1e6;
    let names = s.codecs.iter().map(|c| c.name()).chain([ULP]);
    let rows: Vec<Row> = names
        .zip(&tallies)
        .map(|(c, t)| Row {
            model: name.clone(),
            codec: c.to_string(),
            ratio_vs_f16: f16_bytes.0 as f64 / t.bytes.max(1) as f64,
            ratio_vs_f16_zstd: f16_bytes.1 as f64 / t.zbytes.max(1) as f64,
            next_token_agreement: t.agree as f64 / t.positions.max(1) as f64,
            identical_64: t.identical as f64 / n.max(1) as f64,
            max_abs_dlogit: t.dlogit as f64,
            encode_mb_s: speed(f16_mb, t.enc_s),
            decode_mb_s: speed(f16_mb, t.dec_s),
            pairs: n,
        })
        .collect();
    for r in &rows {
        eprintln!(
            "  {:>7}: {:.2}x smaller than f16 ({:.2}x with zstd), next token {:.1} %, identical answers {:.0} %, max |dlogit| {:.3}, encode {:.0} MB/s, decode {:.0} MB/s",
            r.codec,
            r.ratio_vs_f16,
            r.ratio_vs_f16_zstd,
            100.0 * r.next_token_agreement,
            100.0 * r.identical_64,
            r.max_abs_dlogit,
            r.encode_mb_s,
            r.decode_mb_s
        );
    }
    Ok(rows)
}

/// The cloud part (the system turn) and the private part as token ids, cut where the chat
/// template puts the system turn; plain text when the model has no template.
fn split_ids(model: &Model, cloud: &str, user: &str) -> Result<(Vec<u32>, Vec<u32>), BenchError> {
    let (c, e) = match &model.chat {
        Some(t) => {
            let p = t.split(cloud, &[Message::new("user", user)])?;
            (p.cloud, p.edge)
        }
        None => (cloud.to_string(), user.to_string()),
    };
    Ok((model.tokenizer.encode(&c)?, model.tokenizer.encode(&e)?))
}

/// The greedy answer after `edge` on `prefix`: the first position's logits and the tokens up
/// to `answer_tokens` or the first stop token.
fn greedy(
    model: &Model,
    prefix: Arc<PrefixKv>,
    edge: &[u32],
    s: &Settings,
) -> Result<(Vec<f32>, Vec<u32>), BenchError> {
    let mut seq = Sequence::with_prefix(model, prefix)?;
    let first = seq.prefill(model, edge)?;
    let mut logits = first.clone();
    let mut out = Vec::new();
    while out.len() < s.answer_tokens {
        let t = argmax(&logits) as u32;
        out.push(t);
        if model.tokenizer.stop_ids.contains(&t) {
            break;
        }
        logits = seq.prefill(model, &[t])?;
    }
    Ok((first, out))
}

/// Positions of `want` whose greedy token matches when fed the reference tokens, and the
/// largest |Δlogit| at the first position.
fn teacher_forced(
    model: &Model,
    prefix: Arc<PrefixKv>,
    edge: &[u32],
    want: &[u32],
    want_first: &[f32],
) -> Result<(usize, f32), BenchError> {
    let mut seq = Sequence::with_prefix(model, prefix)?;
    let mut logits = seq.prefill(model, edge)?;
    let dl = logits
        .iter()
        .zip(want_first)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let mut agree = 0;
    for (i, &t) in want.iter().enumerate() {
        agree += usize::from(argmax(&logits) as u32 == t);
        if i + 1 < want.len() {
            logits = seq.prefill(model, &[t])?;
        }
    }
    Ok((agree, dl))
}

/// MB/s, or 0 for nothing timed (the reference row).
fn speed(mb: f64, secs: f64) -> f64 {
    if secs > 0.0 {
        mb / secs
    } else {
        0.0
    }
}

/// `prefix` with every value after each layer's first token moved by -1, 0 or +1 in its last
/// bit (a fixed hash picks which).
fn nudge(prefix: &PrefixKv) -> Result<PrefixKv, BenchError> {
    let step = |(i, x): (usize, &f16), salt: usize| {
        let h = ((i ^ salt.wrapping_mul(0x9E37_79B9)) as u32).wrapping_mul(0x85EB_CA6B) >> 16;
        f16::from_bits(x.to_bits().wrapping_add((h % 3) as u16).wrapping_sub(1))
    };
    let mut layers = Vec::with_capacity(prefix.layers.len());
    for (l, layer) in prefix.layers.iter().enumerate() {
        let d = layer.head_dim;
        let heads = |key: bool, salt: usize| -> Vec<Vec<f16>> {
            (0..layer.n_kv_head)
                .map(|h| {
                    let rows = if key { layer.keys(h) } else { layer.values(h) };
                    let (first, rest) = rows.split_at(d.min(rows.len()));
                    let salt = salt + 2 * h + 64 * l;
                    first
                        .iter()
                        .copied()
                        .chain(rest.iter().enumerate().map(|p| step(p, salt)))
                        .collect()
                })
                .collect()
        };
        let (k, v) = (heads(true, 0), heads(false, 1));
        let kv = edgeprompt_engine::LayerKv::from_heads(d, k, v)?.starting_at(layer.start());
        layers.push(Arc::new(kv));
    }
    Ok(PrefixKv {
        fingerprint: prefix.fingerprint.clone(),
        token_ids: prefix.token_ids.clone(),
        layers,
    })
}

#[derive(Clone, Copy)]
struct WireStats {
    bytes: usize,
    zbytes: usize,
    enc_s: f64,
    dec_s: f64,
}

fn spans(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n)
        .step_by(CHUNK_TOKENS)
        .map(move |a| (a, (a + CHUNK_TOKENS).min(n)))
}

/// `prefix` encoded in `codec` chunk by chunk and rebuilt by the reassembler, as an edge
/// receives it.
fn transcode(prefix: &PrefixKv, codec: Codec) -> Result<(PrefixKv, WireStats), BenchError> {
    let first = prefix
        .layers
        .first()
        .ok_or_else(|| BenchError::Data("empty prefix".into()))?;
    let n = first.len();
    let mut re = Reassembler::new(prefix.layers.len(), n, first.n_kv_head, first.head_dim);
    let (mut enc_s, mut dec_s) = (0.0, 0.0);
    let (mut bytes, mut zbytes) = (0, 0);
    let mut layers = Vec::with_capacity(prefix.layers.len());
    for (l, layer) in prefix.layers.iter().enumerate() {
        for (a, b) in spans(n) {
            let t = Instant::now();
            let c = Chunk::encode(l as u32, layer, a, b, codec, None)?;
            enc_s += t.elapsed().as_secs_f64();
            bytes += c.payload.len();
            zbytes += Chunk::encode(l as u32, layer, a, b, codec, Some(3))?
                .payload
                .len();
            let t = Instant::now();
            let done = re.push(&c)?;
            dec_s += t.elapsed().as_secs_f64();
            if let Some((_, kv)) = done {
                layers.push(Arc::new(kv));
            }
        }
    }
    let out = PrefixKv {
        fingerprint: prefix.fingerprint.clone(),
        token_ids: prefix.token_ids.clone(),
        layers,
    };
    Ok((
        out,
        WireStats {
            bytes,
            zbytes,
            enc_s,
            dec_s,
        },
    ))
}

/// Agreement against size, one line per model through its codecs.
fn plot(rows: &[Row]) -> String {
    let mut models: Vec<&str> = rows.iter().map(|r| r.model.as_str()).collect();
    models.dedup();
    let series: Vec<Series> = models
        .iter()
        .map(|m| {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.model == *m)
                .map(|r| (r.ratio_vs_f16, 100.0 * r.next_token_agreement))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                name: m.to_string(),
                points,
                dashed: false,
            }
        })
        .collect();
    line_chart(
        "KV codecs: teacher-forced next-token agreement vs size",
        "times smaller than f16",
        "next-token agreement %",
        &series,
    )
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_delimiter = ',', default_value = "smollm2,qwen05,qwen15")]
    models: Vec<String>,
    #[arg(long, value_delimiter = ',', default_value = "int8,int8ch,int4,int4ch")]
    codecs: Vec<String>,
    /// ShareGPT pairs per model.
    #[arg(long, default_value_t = 20)]
    pairs: usize,
    #[arg(long, default_value_t = 512)]
    cloud_len: usize,
    #[arg(long, default_value_t = 64)]
    edge_len: usize,
    #[arg(long, default_value_t = 64)]
    answer_tokens: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench codecs`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let s = Settings {
        models: a
            .models
            .iter()
            .map(|m| resolve(m))
            .collect::<Result<_, BenchError>>()?,
        sharegpt: sharegpt()?,
        codecs: a
            .codecs
            .iter()
            .map(|c| {
                Codec::parse(c).ok_or_else(|| {
                    BenchError::Failed(format!("codec {c}: one of {}", Codec::names()))
                })
            })
            .collect::<Result<_, BenchError>>()?,
        pairs: a.pairs.max(1),
        cloud_len: a.cloud_len,
        edge_len: a.edge_len,
        answer_tokens: a.answer_tokens.max(1),
        threads: a.threads,
        out: a.out.clone(),
    };
    let r = run(&s)?;
    eprintln!(
        "wrote {} rows to {}/codecs.json and codecs.svg",
        r.rows.len(),
        a.out.display()
    );
    Ok(())
}

/// The section of `docs/results.md` from `codecs.json`.
pub fn section(dir: &Path, md: &mut String) {
    let Some(v) = load(dir, "codecs.json") else {
        return;
    };
    let mut head = v.clone();
    head["model"] = Value::String("per row".into());
    let _ = writeln!(
        md,
        "## KV codecs: size against the answer (`edgeprompt-bench codecs`)\n\n{}; ShareGPT pairs of {} cloud + \
         {} private tokens; the cloud KV goes through the codec in wire chunks of {} tokens. Against the f16 \
         answer (bitwise the single-node one): teacher-forced next-token agreement over the answer's positions, \
         free-running greedy answers of up to {} tokens identical, the largest |Δlogit| at the first answer \
         position; encode/decode speed in MB of f16 KV per second. The row `f16 ±1 ulp` is no codec but a \
         sensitivity reference: every value after the first token moved by at most one unit in its last place (a \
         relative change of at most 0.1 %). The answers so small a change flips sit on the model's near-ties: a \
         64-token greedy answer passes some top-2 gap almost any change crosses. It is not a bound: the channel \
         codecs' error is absolute, and tiny on channels that vary little around a large value, where one ulp is \
         not (20 pairs: ± ~10 points on identical answers).\n\n| model | codec | x smaller than f16 \
         (zstd-3 on both) | next-token agreement | identical answers | max abs Δlogit | encode / decode MB/s | \
         pairs |\n| --- | --- | --- | --- | --- | --- | --- | --- |",
        machine_line(&head),
        v["cloud_tokens"],
        v["edge_tokens"],
        v["chunk_tokens"],
        v["answer_tokens"],
    );
    for r in v["rows"].as_array().cloned().unwrap_or_default() {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2}x ({:.2}x) | {:.1} % | {:.0} % | {:.2} | {} | {} |",
            r["model"].as_str().unwrap_or("?"),
            r["codec"].as_str().unwrap_or("?"),
            f(&r["ratio_vs_f16"]),
            f(&r["ratio_vs_f16_zstd"]),
            100.0 * f(&r["next_token_agreement"]),
            100.0 * f(&r["identical_64"]),
            f(&r["max_abs_dlogit"]),
            match (f(&r["encode_mb_s"]), f(&r["decode_mb_s"])) {
                (e, d) if e > 0.0 => format!("{e:.0} / {d:.0}"),
                _ => "-".into(),
            },
            r["pairs"]
        );
    }
    let _ = writeln!(md, "\n![codecs](results/codecs.svg)\n");
}
