//! The engine's section of `docs/results.md`: every model's `engine-*.json` on every machine.

use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

use crate::results::{f, load, machine_line, num};

/// Every engine run there is, by model and then by machine.
pub fn section(dir: &Path, md: &mut String) {
    let mut any = false;
    // Each model as run on the AVX2 EPYC (`docs/results/`), the AVX-512 EPYC
    // (`docs/results/avx512/`; `avx512-as-avx2/`: the same machine with our kernels held to
    // AVX2 and a llama.cpp built without AVX-512; `avx512-long/`: prompts of 2048 and 4096
    // tokens and decode after 4096; `avx512-as-avx2-long/`: both), the AVX-512 Xeon (`docs/results/xeon/`) and the newer one
    // (`xeon-emr/`, Emerald Rapids), a Zen 4 EPYC (`zen4/`) and the AVX2-only Zen 1 and Zen 3
    // EPYCs (`zen1/`, `zen3/`), where there are such runs.
    // The four models we have, Qwen requantized to other file types (scripts/bench_formats.sh),
    // then the synthetic real-shape GGUFs of the families we have no weights for
    // (scripts/bench_families.sh).
    let models = [
        "smollm2",
        "qwen05",
        "qwen15",
        "gemma3",
        "qwen05-q5_k_m",
        "qwen15-q5_k_m",
        "qwen05-q3_k_m",
        "qwen15-q3_k_m",
        "qwen05-iq4_xs",
        "qwen15-iq4_xs",
        "qwen05-q2_k",
        "qwen15-q2_k",
        "qwen05-q5_1",
        "qwen15-q5_1",
        "qwen05-iq4_nl",
        "qwen15-iq4_nl",
        "qwen05-f16",
        "qwen15-f16",
        "qwen05-bf16",
        "qwen15-bf16",
        "synth-qwen3-0.6b",
        "synth-llama3.2-1b",
        "synth-qwen3moe-a3b",
        "synth-qwen35-0.8b",
        "synth-gemma4-e2b",
    ];
    let names = models.iter().flat_map(|m| {
        [
            "",
            "avx512/",
            "avx512-as-avx2/",
            "avx512-long/",
            "avx512-as-avx2-long/",
            "xeon/",
            "xeon-emr/",
            "zen4/",
            "zen1/",
            "zen3/",
            "xeon-207/",
            "xeon-207-as-avx2/",
        ]
        .map(|sub| format!("{sub}engine-{m}.json"))
    });
    for name in names {
        let Some(v) = load(dir, &name) else { continue };
        if !any {
            let _ = writeln!(md, "## Engine speed (`edgeprompt-bench engine`)\n");
            any = true;
        }
        let llama_simd = v["llama_cpp"]["simd"]
            .as_str()
            .map_or(String::new(), |s| format!("; llama.cpp built for {s}"));
        let _ = writeln!(md, "{}{llama_simd} (`{name}`)\n", machine_line(&v));
        let _ = writeln!(md, "| | ours tok/s | candle 0.11 tok/s | llama.cpp tok/s | ours / llama.cpp |\n| --- | --- | --- | --- | --- |");
        let prefill = |who: &str| -> Vec<(u64, f64)> {
            v[who]["prefill"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|p| (p[0].as_u64().unwrap_or(0), f(&p[1])))
                        .collect()
                })
                .unwrap_or_default()
        };
        let (o, c, l) = (prefill("ours"), prefill("candle"), prefill("llama_cpp"));
        for (i, (n, ours)) in o.iter().enumerate() {
            let cv = c.get(i).map_or(f64::NAN, |x| x.1);
            let lv = l.get(i).map_or(f64::NAN, |x| x.1);
            let _ = writeln!(
                md,
                "| prefill {n} | {ours:.0} | {} | {lv:.0} | {:.2}x |",
                num(cv, 0),
                ours / lv
            );
        }
        let (od, cd, ld) = (
            f(&v["ours"]["decode"]),
            f(&v["candle"]["decode"]),
            f(&v["llama_cpp"]["decode"]),
        );
        let _ = writeln!(
            md,
            "| decode @{} | {od:.1} | {} | {ld:.1} | {:.2}x |\n\n{}\n",
            v["decode_context"],
            num(cd, 1),
            od / ld,
            memory_line(&v)
        );
        let rf = &v["roofline"];
        if rf.is_object() {
            let gops: Vec<String> = rf["prefill_gops"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|p| format!("{} tokens {:.0}", p[0], f(&p[1])))
                        .collect()
                })
                .unwrap_or_default();
            // Newer runs pair a probe with each round (`rounds`); older ones probed around them.
            let rounds: Vec<String> = rf["rounds"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| format!("{:.0}/{:.0}", f(&r[0]), f(&r[1])))
                .collect();
            let share = match rounds.is_empty() {
                true => "of it".to_string(),
                false => format!(
                    "of the probe right after each round, median (decode/probe GB/s by round: {})",
                    rounds.join(", ")
                ),
            };
            // Runs since session 32 also count the KV cache a decode step reads.
            let kv = match rf["kv_bytes_per_token"].as_f64() {
                Some(b) => format!(
                    " With the {:.0} MB of KV cache a step reads at this context, {:.0} %.",
                    b / 1e6,
                    100.0 * f(&rf["decode_with_kv_fraction"])
                ),
                None => String::new(),
            };
            let _ = writeln!(
                md,
                "Roofline: streaming read {:.1} GB/s on the same threads; decode streams {:.0} MB of \
                 weights per token = {:.1} GB/s, **{:.0} %** {share}.{kv} Prefill through the \
                 layers: {} GOP/s (2 ops per multiply-add).\n",
                f(&rf["stream_read_gbps"]),
                f(&rf["weight_bytes_per_token"]) / 1e6,
                f(&rf["decode_gbps"]),
                100.0 * f(&rf["decode_roofline_fraction"]),
                gops.join(", ")
            );
        }
    }
}

/// Resident memory of an engine run: after load, peak (with the longest prompt's KV) and
/// llama.cpp's in the same run, each against the GGUF's size.
fn memory_line(v: &Value) -> String {
    let file = f(&v["model_file_bytes"]);
    let peak = f(&v["ours_peak_rss_bytes"]);
    let mut s = format!(
        "GGUF {:.0} MB. Peak RSS {:.0} MB ({:.2}x)",
        file / 1e6,
        peak / 1e6,
        peak / file
    );
    let kv = f(&v["kv_bytes_longest"]);
    if kv.is_finite() {
        let _ = write!(
            s,
            ", of which {:.0} MB is the longest prompt's KV",
            kv / 1e6
        );
    }
    // The optional figures against the file's size, each `{before}N MB (R x{after}`.
    for (key, before, after) in [
        ("ours_load_rss_bytes", "; ", ") once loaded"),
        (
            "ours_weight_bytes",
            ", of which the weights as repacked ",
            "; the rest is mostly the tokenizer)",
        ),
        ("llama_cpp_rss_bytes", "; llama.cpp peak ", ")"),
    ] {
        let x = f(&v[key]);
        if x.is_finite() {
            let _ = write!(s, "{before}{:.0} MB ({:.2}x{after}", x / 1e6, x / file);
        }
    }
    s + "."
}
