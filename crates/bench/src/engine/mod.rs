//! `edgeprompt-bench engine`: prefill and decode speed of our engine, candle's stock
//! quantized model and llama.cpp, on the same GGUF, threads and token ids, in one run.

#[cfg(feature = "candle")]
mod candle;
pub mod report;
mod speeds;

use std::path::{Path, PathBuf};
use std::time::Instant;

use edgeprompt_engine::{Arch, Model, Sequence};
use serde::Serialize;

use crate::inputs::resolve;
use crate::machine::{peak_rss, reset_peak_rss, Machine};
use crate::BenchError;
use speeds::{best_of, best_speeds};
pub use speeds::{Settings, Speeds};

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub model_file_bytes: u64,
    pub threads: usize,
    pub decode_context: usize,
    pub ours: Speeds,
    pub candle: Option<Speeds>,
    pub llama_cpp: Option<Speeds>,
    pub ours_peak_rss_bytes: Option<u64>,
    /// Peak RSS once the model is loaded (weights repacked, nothing run yet): the repack
    /// replaces the file's bytes rather than adding to them.
    pub ours_load_rss_bytes: Option<u64>,
    /// Weight matrices as held in memory (repacked; the embedding once when tied), part of
    /// both figures above.
    #[serde(default)]
    pub ours_weight_bytes: Option<u64>,
    /// KV of the longest prompt (f16), part of the peak above.
    pub kv_bytes_longest: usize,
    /// llama.cpp's peak RSS in the same run, less its Python host's own before loading.
    pub llama_cpp_rss_bytes: Option<u64>,
    pub roofline: Roofline,
}

/// How close decode comes to the memory bound and what prefill computes.
#[derive(Debug, Serialize)]
pub struct Roofline {
    /// Streaming read bandwidth measured here on the benchmark's threads, GB/s: the median of
    /// the probes run right after each round's decode.
    pub stream_read_gbps: f64,
    /// Weight bytes one decode step reads (layers + output head).
    pub weight_bytes_per_token: usize,
    /// `weight_bytes_per_token * decode tok/s` (the best round), GB/s.
    pub decode_gbps: f64,
    /// The median over rounds of each round's decode GB/s over the probe right after it: a
    /// shared host's bandwidth drifts by the minute, so each decode is judged against its own.
    pub decode_roofline_fraction: f64,
    /// Per round: (decode GB/s, stream probe GB/s).
    pub rounds: Vec<(f64, f64)>,
    /// f16 K and V bytes a decode step reads on average at the decode context (each layer's
    /// window cut applied): past a few thousand tokens a small model reads as much KV as
    /// weights.
    pub kv_bytes_per_token: usize,
    /// `decode_roofline_fraction` counting the KV read as well as the weights.
    pub decode_with_kv_fraction: f64,
    /// Integer ops (2 per multiply-add) per second through the layers at each prompt length.
    pub prefill_gops: Vec<(usize, f64)>,
}

/// Best-of-`passes` streaming read of a 512 MiB buffer split over the rayon pool's threads,
/// GB/s. The buffer is mapped as the weights are (`kernels::Slab`, on 2 MiB pages where the
/// kernel gives them), so the probe is the best read the weights could get.
fn stream_read_gbps(passes: usize) -> f64 {
    use rayon::prelude::*;
    let Ok(mut slab) = edgeprompt_engine::kernels::Slab::alone(512 << 20) else {
        return 0.0;
    };
    for (i, w) in slab.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(i as u64).to_le_bytes());
    }
    // SAFETY: any eight bytes are a valid u64; the slab starts on a cache line.
    let (_, buf, _) = unsafe { slab.align_to::<u64>() };
    let mut best = 0f64;
    for _ in 0..passes {
        let t = Instant::now();
        let sum: u64 = buf
            .par_chunks(1 << 16)
            .map(|c| {
                // Eight independent lanes keep the loads in flight.
                let mut acc = [0u64; 8];
                for w in c.chunks_exact(8) {
                    for (a, x) in acc.iter_mut().zip(w) {
                        *a = a.wrapping_add(*x);
                    }
                }
                acc.iter().fold(0u64, |a, b| a.wrapping_add(*b))
            })
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
        best = best.max((buf.len() * 8) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Token ids of real text, long enough for the longest prompt plus decoding.
fn bench_ids(model: &Model, n: usize) -> Result<Vec<u32>, BenchError> {
    let para = "The history of computing spans abacuses, mechanical calculators, vacuum tubes, \
        transistors and integrated circuits. Engineers in 1946 built ENIAC; later, stored-program \
        machines, compilers and operating systems (UNIX, 1969) changed how people wrote code: \
        fn main() { println!(\"hello\"); } and print('hello') are now everyday examples. ";
    let mut ids = Vec::new();
    while ids.len() < n {
        ids.extend(model.tokenizer.encode(para)?);
    }
    ids.truncate(n);
    Ok(ids)
}

/// What the rounds measured: the best of each engine, each round's (our decode tok/s, stream
/// probe GB/s right after it), and our peak RSS outside the probes (None: not measurable).
struct Turns {
    ours: Speeds,
    llama: Option<Speeds>,
    probes: Vec<(f64, f64)>,
    peak_rss: Option<u64>,
}

/// Ours and llama.cpp take turns, one pass over every length each per round, and each figure
/// is the best of its rounds. This host's speed moves 10-30 % between minutes: run one engine's
/// repeats and then the other's, and a slow minute lands on one engine only (a Qwen 1.5B
/// run here had llama.cpp at 57 tok/s for prefill 512 and 71 for 1024).
fn time_in_turns(
    model: &Model,
    ids: &[u32],
    s: &Settings,
    ctx: usize,
) -> Result<Turns, BenchError> {
    let once = Settings {
        repeats: 1,
        ..s.clone()
    };
    let (mut ours, mut llama, mut probes) = (None, None, Vec::new());
    // The probe's 512 MiB buffer would be the process's peak (runs at f9045df reported 659 MB
    // for SmolLM2's 126): the peak restarts after each probe, so it is the engine's own.
    let mut peak = reset_peak_rss().then_some(0u64);
    if peak.is_none() {
        eprintln!("  peak RSS cannot be restarted here; ours is left out");
    }
    for round in 1..=s.repeats.max(1) {
        eprintln!("  round {round} of {}", s.repeats.max(1));
        let speeds = time_ours(model, ids, &once, ctx)?;
        peak = peak.zip(peak_rss()).map(|(a, b)| a.max(b));
        probes.push((speeds.decode, stream_read_gbps(3)));
        reset_peak_rss();
        ours = Some(best_speeds(ours, speeds));
        if let Some(py) = &s.llama_python {
            llama = Some(best_speeds(llama, time_llama(py, &s.model, ids, &once)?));
        }
    }
    Ok(Turns {
        ours: ours.unwrap_or_default(),
        llama,
        probes,
        peak_rss: peak,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
fn time_ours(model: &Model, ids: &[u32], s: &Settings, ctx: usize) -> Result<Speeds, BenchError> {
    let mut out = Speeds::default();
    for &n in &s.prompt_lens {
        let secs = best_of(s.repeats, || {
            let mut seq = Sequence::new(model);
            let t = Instant::now();
            seq.prefill_chunked(model, &ids[..n], 512)?;
            Ok(t.elapsed().as_secs_f64())
        })?;
        out.prefill.push((n, n as f64 / secs));
        eprintln!("  ours     prefill {n:5}: {:8.1} tok/s", n as f64 / secs);
    }
    let per_tok = best_of(s.repeats, || {
        let mut seq = Sequence::new(model);
        seq.prefill_chunked(model, &ids[..ctx], 512)?;
        let t = Instant::now();
        for i in 0..s.decode_tokens {
            seq.prefill(model, &ids[ctx + i..ctx + i + 1])?;
        }
        Ok(t.elapsed().as_secs_f64() / s.decode_tokens as f64)
    })?;
    out.decode = 1.0 / per_tok;
    eprintln!("  ours     decode @{ctx}: {:8.1} tok/s", out.decode);
    Ok(out)
}

fn time_llama(
    python: &Path,
    model: &Path,
    ids: &[u32],
    s: &Settings,
) -> Result<Speeds, BenchError> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ref/llama_bench.py");
    let ids_file =
        std::env::temp_dir().join(format!("edgeprompt-bench-ids-{}.json", std::process::id()));
    std::fs::write(&ids_file, serde_json::to_vec(ids)?)?;
    let lens: Vec<String> = s.prompt_lens.iter().map(|n| n.to_string()).collect();
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(model)
        .arg(&ids_file)
        .arg(s.threads.to_string())
        .arg(lens.join(","))
        .arg(s.decode_tokens.to_string())
        .arg(s.repeats.to_string())
        .arg(decode_context(s).to_string())
        .output()?;
    let _ = std::fs::remove_file(&ids_file);
    if !out.status.success() {
        return Err(BenchError::Llama(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let mut sp = Speeds::default();
    for &n in &s.prompt_lens {
        let secs = v["prefill"][n.to_string()]
            .as_f64()
            .ok_or_else(|| BenchError::Llama(format!("no prefill time for {n}")))?;
        sp.prefill.push((n, n as f64 / secs));
        eprintln!("  llama.cpp prefill {n:5}: {:8.1} tok/s", n as f64 / secs);
    }
    sp.decode = 1.0
        / v["decode"]
            .as_f64()
            .ok_or_else(|| BenchError::Llama("no decode time".into()))?;
    sp.rss_bytes = v["rss_bytes"].as_u64();
    sp.simd = v["simd"].as_str().map(String::from);
    eprintln!("  llama.cpp decode:        {:8.1} tok/s", sp.decode);
    Ok(sp)
}

/// llama.cpp's best-of-2 prefill time of `ids` (its time to the first token's logits).
pub(crate) fn llama_prefill_secs(
    python: &Path,
    model: &Path,
    ids: &[u32],
    threads: usize,
) -> Result<f64, BenchError> {
    let s = Settings {
        model: model.to_path_buf(),
        threads,
        prompt_lens: vec![ids.len() - 1],
        decode_tokens: 1,
        repeats: 2,
        llama_python: None,
        skip_candle: true,
        decode_at: None,
    };
    let sp = time_llama(python, model, ids, &s)?;
    // Scaled from n - 1 tokens (the script keeps one id for its decode step).
    Ok(ids.len() as f64 / sp.prefill[0].1)
}

/// f16 K and V bytes one of `steps` decode steps after `ctx` tokens reads, on average: every
/// layer's keys up to the step's position, or its window.
fn decode_kv_bytes(cfg: &edgeprompt_engine::ModelConfig, ctx: usize, steps: usize) -> usize {
    let steps = steps.max(1);
    // Every attention layer reads the keys it sees, of its own KV or the layer's it shares.
    let bytes: usize = (0..cfg.n_layer)
        .filter(|&l| !cfg.is_recurrent(l))
        .map(|l| {
            let per_key = 2 * 2 * cfg.n_kv_head * cfg.head_dim_of(l);
            let keys: usize = (1..=steps)
                // Step `i`'s token sits at position `ctx + i - 1`.
                .map(|i| {
                    ctx + i - edgeprompt_engine::config::window_start(cfg.window_of(l), ctx + i - 1)
                })
                .sum();
            per_key * keys
        })
        .sum();
    bytes / steps
}

/// The context decode is timed after.
fn decode_context(s: &Settings) -> usize {
    s.decode_at
        .unwrap_or_else(|| 512.min(*s.prompt_lens.iter().max().unwrap_or(&512)))
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let machine = crate::start(s.threads);
    eprintln!("machine: {machine}");
    let model = Model::load(&s.model)?;
    let load_rss = peak_rss();
    let ctx = decode_context(s);
    let need = s
        .prompt_lens
        .iter()
        .max()
        .copied()
        .unwrap_or(0)
        .max(ctx + s.decode_tokens);
    let ids = bench_ids(&model, need)?;
    eprintln!(
        "model: {} ({:.0} MB), threads {}, best of {}, decode {} tokens after {ctx}",
        model.cfg.name,
        model.info.file_bytes as f64 / 1e6,
        s.threads,
        s.repeats,
        s.decode_tokens
    );
    // Each round's decode is paired with a stream probe right after it: a single probe
    // window on a shared host read anywhere from 39 to 65 GB/s (Zen 5, session 27), and
    // judged against the wrong window decode looked like 59 % or 108 % of the bound.
    let Turns {
        ours,
        llama: llama_cpp,
        probes,
        peak_rss: rss,
    } = time_in_turns(&model, &ids, s, ctx)?;
    let longest = s.prompt_lens.iter().max().copied().unwrap_or(0);
    let kv_bytes_longest = model.cfg.kv_bytes_per_token() * longest;
    let (weight_bytes, macs) = model.traffic();
    let gbps = |tok_s: f64| weight_bytes as f64 * tok_s / 1e9;
    let rounds: Vec<(f64, f64)> = probes.iter().map(|&(d, p)| (gbps(d), p)).collect();
    let stream = median(rounds.iter().map(|r| r.1).collect());
    let decode_gbps = gbps(ours.decode);
    let kv_bytes = decode_kv_bytes(&model.cfg, ctx, s.decode_tokens);
    let with_kv = (weight_bytes + kv_bytes) as f64 / weight_bytes.max(1) as f64;
    let roofline = Roofline {
        stream_read_gbps: stream,
        weight_bytes_per_token: weight_bytes,
        decode_gbps,
        decode_roofline_fraction: median(rounds.iter().map(|r| r.0 / r.1).collect()),
        decode_with_kv_fraction: median(rounds.iter().map(|r| r.0 * with_kv / r.1).collect()),
        kv_bytes_per_token: kv_bytes,
        rounds,
        prefill_gops: ours
            .prefill
            .iter()
            .map(|&(n, tps)| (n, 2.0 * macs as f64 * tps / 1e9))
            .collect(),
    };
    eprintln!(
        "  roofline: stream read {stream:.1} GB/s (median of {:?}); decode reads {:.0} MB/token = {decode_gbps:.1} GB/s; round by round {:.0} % (median); with {:.0} MB of KV {:.0} %",
        roofline.rounds.iter().map(|r| (r.1 * 10.0).round() / 10.0).collect::<Vec<_>>(),
        weight_bytes as f64 / 1e6,
        100.0 * roofline.decode_roofline_fraction,
        kv_bytes as f64 / 1e6,
        100.0 * roofline.decode_with_kv_fraction
    );
    let arch = model.cfg.arch;
    let file_bytes = model.info.file_bytes;
    let weight_bytes_held = model.weight_bytes() as u64;
    let name = model.cfg.name.clone();
    drop(model);
    // candle is a secondary baseline: a model it cannot run is reported, not fatal.
    let candle = if s.skip_candle {
        None
    } else {
        candle_baseline(&s.model, arch, &ids, s, ctx)
    };
    let llama_cpp_rss_bytes = llama_cpp.as_ref().and_then(|l| l.rss_bytes);
    Ok(Report {
        machine,
        model: name,
        model_file_bytes: file_bytes,
        threads: s.threads,
        decode_context: ctx,
        ours,
        candle,
        llama_cpp,
        ours_peak_rss_bytes: rss,
        ours_load_rss_bytes: load_rss,
        ours_weight_bytes: Some(weight_bytes_held),
        kv_bytes_longest,
        llama_cpp_rss_bytes,
        roofline,
    })
}

#[cfg(feature = "candle")]
fn candle_baseline(
    path: &Path,
    arch: Arch,
    ids: &[u32],
    s: &Settings,
    ctx: usize,
) -> Option<Speeds> {
    candle::time(path, arch, ids, s, ctx)
        .inspect_err(|e| eprintln!("  candle   failed, left out: {e}"))
        .ok()
}

#[cfg(not(feature = "candle"))]
fn candle_baseline(_: &Path, _: Arch, _: &[u32], _: &Settings, _: usize) -> Option<Speeds> {
    eprintln!("  candle   not built in (build with `--features candle`), left out");
    None
}

/// The human-readable table: tok/s and ratios against each baseline.
pub fn table(r: &Report) -> String {
    let mut t = format!(
        "{} | {} threads | {} | kernels {} | rev {}\n{:<14}{:>10}{:>10}{:>10}{:>12}{:>12}\n",
        r.model,
        r.threads,
        r.machine.cpu,
        r.machine.kernels,
        r.machine.git_rev,
        "tok/s",
        "ours",
        "candle",
        "llama.cpp",
        "ours/candle",
        "ours/llama"
    );
    let fmt = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.1}"));
    let ratio = |a: f64, b: Option<f64>| b.map_or("-".into(), |b| format!("{:.2}x", a / b));
    let rows: Vec<(String, f64, Option<f64>, Option<f64>)> = r
        .ours
        .prefill
        .iter()
        .enumerate()
        .map(|(i, (n, v))| {
            (
                format!("prefill {n}"),
                *v,
                r.candle.as_ref().map(|c| c.prefill[i].1),
                r.llama_cpp.as_ref().map(|c| c.prefill[i].1),
            )
        })
        .chain(std::iter::once((
            format!("decode @{}", r.decode_context),
            r.ours.decode,
            r.candle.as_ref().map(|c| c.decode),
            r.llama_cpp.as_ref().map(|c| c.decode),
        )))
        .collect();
    for (name, ours, candle, llama) in rows {
        t += &format!(
            "{:<14}{:>10.1}{:>10}{:>10}{:>12}{:>12}\n",
            name,
            ours,
            fmt(candle),
            fmt(llama),
            ratio(ours, candle),
            ratio(ours, llama)
        );
    }
    let rf = &r.roofline;
    t += &format!(
        "roofline: stream read {:.1} GB/s on {} threads; decode {:.1} GB/s of weights ({:.0} % of it; {:.0} % with {:.0} MB of KV); prefill {}\n",
        rf.stream_read_gbps,
        r.threads,
        rf.decode_gbps,
        100.0 * rf.decode_roofline_fraction,
        100.0 * rf.decode_with_kv_fraction,
        rf.kv_bytes_per_token as f64 / 1e6,
        rf.prefill_gops
            .iter()
            .map(|(n, g)| format!("{n}: {g:.0} GOP/s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mb = |b: Option<u64>| b.map_or("-".into(), |b| format!("{:.0} MB", b as f64 / 1e6));
    let file = r.model_file_bytes as f64;
    t += &format!(
        "RSS: GGUF {:.0} MB; ours {} after load ({:.2}x; weights as repacked {}), peak {} ({:.2}x, with {:.0} MB of KV); llama.cpp peak {}\n",
        file / 1e6,
        mb(r.ours_load_rss_bytes),
        r.ours_load_rss_bytes.unwrap_or(0) as f64 / file,
        mb(r.ours_weight_bytes),
        mb(r.ours_peak_rss_bytes),
        r.ours_peak_rss_bytes.unwrap_or(0) as f64 / file,
        r.kv_bytes_longest as f64 / 1e6,
        mb(r.llama_cpp_rss_bytes),
    );
    t
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, value_delimiter = ',', default_value = "128,512,1024")]
    prompt_lens: Vec<usize>,
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// Runs of each figure, ours and llama.cpp alike; the best is kept (this host's speed
    /// moves by 10-20 % from minute to minute: best of 2 was not enough).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// A Python with `llama_cpp` (scripts/bench_engine.sh builds .venv-bench).
    #[arg(long)]
    llama_python: Option<PathBuf>,
    #[arg(long)]
    skip_candle: bool,
    /// Context the decode is timed after [default: 512, or the longest prompt if shorter].
    #[arg(long)]
    decode_at: Option<usize>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench engine`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let settings = Settings {
        model: resolve(&a.model)?,
        threads: a.threads,
        prompt_lens: a.prompt_lens,
        decode_tokens: a.decode_tokens,
        repeats: a.repeats,
        llama_python: a.llama_python,
        skip_candle: a.skip_candle,
        decode_at: a.decode_at,
    };
    let report = run(&settings)?;
    println!("{}", table(&report));
    std::fs::create_dir_all(&a.out)?;
    let path = a
        .out
        .join(format!("engine-{}.json", crate::file_part(&a.model)));
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::decode_kv_bytes;
    use edgeprompt_engine::{Arch, ModelConfig, RopeStyle};

    fn cfg(window: Option<usize>, sliding: Vec<bool>) -> ModelConfig {
        ModelConfig {
            arch: Arch::Gemma3,
            name: "toy".into(),
            n_layer: sliding.len(),
            n_embd: 64,
            n_head: 2,
            n_kv_head: 1,
            head_dim: 16,
            head_dim_local: 16,
            rope_dims_local: 16,
            n_ff: 128,
            ffn_widths: vec![128; sliding.len()],
            vocab_size: 10,
            context_length: 4096,
            rope_base: 1e6,
            rope_style: RopeStyle::Neox,
            rms_eps: 1e-6,
            window,
            recurrent: vec![false; sliding.len()],
            kv_source: (0..sliding.len()).collect(),
            sliding,
            rope_base_local: 1e4,
            features: edgeprompt_engine::config::Features::plain(16),
        }
    }

    #[test]
    fn decode_kv_bytes_count_each_steps_keys_and_the_window() {
        // One key of one layer: K and V, 16 f16 each.
        let per_key = 2 * 16 * 2;
        // Full attention: steps after 100 tokens see 101 and 102 keys.
        let full = cfg(None, vec![false]);
        assert_eq!(decode_kv_bytes(&full, 100, 2), per_key * (101 + 102) / 2);
        // A window of 8 caps a sliding layer at 8 keys; the global layer sees them all.
        let mixed = cfg(Some(8), vec![true, false]);
        assert_eq!(decode_kv_bytes(&mixed, 100, 1), per_key * (8 + 101));
        // Inside the window a sliding layer sees every key.
        assert_eq!(decode_kv_bytes(&mixed, 4, 1), per_key * (5 + 5));
    }
}
