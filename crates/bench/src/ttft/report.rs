//! The TTFT sections of `docs/results.md`: each machine's `ttft.json` with the planner's
//! validation (and its plot), the sliding-window cut, and pairs of models on the wire.

use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

use crate::plot::{line_chart, Series};
use crate::results::{f, load, machine_line};
use crate::BenchError;

/// Within this relative error the planner counts as validated (issue goal).
const PLANNER_GOAL: f64 = 0.15;

/// The section of `docs/results.md` from `<sub>ttft.json`, and its planner plot.
pub fn section(dir: &Path, sub: &str, md: &mut String) -> Result<(), BenchError> {
    let Some(v) = load(dir, &format!("{sub}ttft.json")) else {
        return Ok(());
    };
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(
        md,
        "## TTFT over link profiles (`edgeprompt-bench ttft`, `{sub}ttft.json`)\n\n{}; codec {}\n\n\
         | link | cloud + edge tokens | edge-only s | llama.cpp edge-only s | EdgePrompt pipelined s | ratio | vs llama.cpp | served cold s (/ pipelined) | served, auto split: from, s | non-pipelined s | planner s | planner error | regime | exact split: cloud layers from, s (predicted) |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        machine_line(&v),
        v["codec"].as_str().unwrap_or("?")
    );
    let mut errors = Vec::new();
    for r in &rows {
        let (eo, pipe, pred) = (
            f(&r["edge_only_s"]),
            f(&r["pipelined_s"]),
            f(&r["predicted_pipelined_s"]),
        );
        let err = (pred - pipe) / pipe;
        errors.push(err.abs());
        let llama = r["llama_edge_only_s"].as_f64();
        let _ = writeln!(
            md,
            "| {} | {} + {} | {eo:.2} | {} | {pipe:.2} | {:.2}x | {} | {} | {} | {:.2} | {pred:.2} | {:+.1} % | {} | {} |",
            r["profile"].as_str().unwrap_or("?"),
            r["cloud_tokens"],
            r["edge_tokens"],
            llama.map_or("-".into(), |l| format!("{l:.2}")),
            pipe / eo,
            llama.map_or("-".into(), |l| format!("{:.2}x", pipe / l)),
            r["served_cold_s"]
                .as_f64()
                .map_or("-".into(), |t| format!("{t:.2} ({:.2}x)", t / pipe)),
            auto_cell(r),
            f(&r["sequential_s"]),
            100.0 * err,
            r["regime"].as_str().unwrap_or("?"),
            split_cell(r)
        );
    }
    if !errors.is_empty() {
        let within = errors.iter().filter(|e| **e <= PLANNER_GOAL).count();
        let mean = errors.iter().sum::<f64>() / errors.len() as f64;
        let max = errors.iter().cloned().fold(0.0, f64::max);
        let _ = writeln!(
            md,
            "\n**Planner validation** (EdgePrompt eqs. 6-7 from measured per-layer compute and the link's \
             bandwidth/RTT vs the measured pipelined TTFT): {within}/{} points within {:.0} %, mean |error| \
             {:.1} %, max {:.1} %. ![planner](results/{sub}planner-validation.svg)\n\n\
             Plots: ![5g](results/{sub}ttft-5g.svg) ![constrained](results/{sub}ttft-constrained.svg) \
             ![timeline](results/{sub}pipeline-timeline.svg)\n",
            errors.len(),
            100.0 * PLANNER_GOAL,
            100.0 * mean,
            100.0 * max
        );
        planner_plot(&dir.join(sub), &v, &rows)?;
    }
    Ok(())
}

/// The planner's exact split for a TTFT row: the first layer loaded (`all local` when it
/// computes every layer) and the TTFT measured there, with its prediction.
fn split_cell(r: &serde_json::Value) -> String {
    let (Some(k), Some(t), Some(p)) = (
        r["planned_split"].as_u64(),
        r["planned_split_s"].as_f64(),
        r["predicted_split_s"].as_f64(),
    ) else {
        return "-".into();
    };
    format!("{}, {t:.2} ({p:.2})", first_loaded(r, k))
}

/// `serve`'s own automatic split for a TTFT row: the first layer it loaded and its TTFT.
fn auto_cell(r: &serde_json::Value) -> String {
    let (Some(k), Some(t)) = (r["served_auto_split"].as_u64(), r["served_auto_s"].as_f64()) else {
        return "-".into();
    };
    format!("{}, {t:.2}", first_loaded(r, k))
}

/// A split as the first cloud layer loaded, or `all local` when it computes every layer.
fn first_loaded(r: &serde_json::Value, k: u64) -> String {
    r["layers"]
        .as_u64()
        .filter(|&n| k >= n)
        .map_or(k.to_string(), |_| "all local".into())
}

/// Two models of one size on the wire (`bench ttft` on each, the same prompts): bytes down and
/// TTFT against the cloud prompt's length.
struct Pair<'a> {
    title: &'a str,
    files: [&'a str; 2],
    names: [&'a str; 2],
    what: &'a str,
}

/// A hybrid model against the pure-attention model of its size, and Gemma 4 E2B's shared-KV
/// layers against the same layers each owning its KV.
const PAIRS: [Pair; 2] = [
    Pair {
        title: "A hybrid model on the wire",
        files: ["ttft-qwen35-0.8b.json", "ttft-qwen3-0.6b.json"],
        names: ["Qwen3.5", "Qwen3"],
        what: "Qwen3.5-0.8B's shape (18 Gated DeltaNet layers sending their state, 6 attention \
               layers sending KV) against Qwen3-0.6B's (28 attention layers), both synthetic, \
               Q4_K_M",
    },
    Pair {
        title: "Shared KV on the wire",
        files: ["ttft-gemma4-e2b.json", "ttft-gemma4-e2b-own.json"],
        names: ["shared", "owned"],
        what: "Gemma 4 E2B's shape (35 layers; the last 20 read layers 13 and 14's KV and send \
               nothing; sliding layers cut to the window of 512) against the same layers each \
               owning its KV (and without E2B's doubled FFN on the shared ones, and SmolLM2's \
               vocabulary: the bytes sent depend on neither, the edge-only time does), both \
               synthetic, Q4_K_M",
    },
];

/// The pairs' sections, each where `<sub>` holds both runs.
pub fn pair_sections(dir: &Path, sub: &str, md: &mut String) {
    for p in &PAIRS {
        pair_section(dir, sub, p, md);
    }
}

fn pair_section(dir: &Path, sub: &str, p: &Pair, md: &mut String) {
    let (Some(h), Some(a)) = (
        load(dir, &format!("{sub}{}", p.files[0])),
        load(dir, &format!("{sub}{}", p.files[1])),
    ) else {
        return;
    };
    let [x, y] = p.names;
    let _ = writeln!(
        md,
        "## {} (`edgeprompt-bench ttft`, `{sub}{}`, `{sub}{}`)\n\n{}; codec {}. {}; the same \
         cloud and private prompts; pipelined EdgePrompt against the edge prefilling everything \
         itself.\n\n\
         | link | cloud + edge tokens | {x} MB down | {y} MB down | {x} / {y} bytes | {x} edge-only s | split s | split vs edge-only | {y} edge-only s | split s | split vs edge-only |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        p.title,
        p.files[0],
        p.files[1],
        machine_line(&h),
        h["codec"].as_str().unwrap_or("?"),
        p.what
    );
    let rows = |v: &Value| v["rows"].as_array().cloned().unwrap_or_default();
    let (hr, ar) = (rows(&h), rows(&a));
    for r in &hr {
        let other = ar.iter().find(|x| {
            x["profile"] == r["profile"]
                && x["cloud_tokens"].as_u64().map(|n| n / 64)
                    == r["cloud_tokens"].as_u64().map(|n| n / 64)
        });
        let Some(o) = other else { continue };
        let (hb, ab) = (f(&r["kv_bytes_down"]), f(&o["kv_bytes_down"]));
        let (he, hs, ae, as_) = (
            f(&r["edge_only_s"]),
            f(&r["pipelined_s"]),
            f(&o["edge_only_s"]),
            f(&o["pipelined_s"]),
        );
        let _ = writeln!(
            md,
            "| {} | {} + {} | {:.1} | {:.1} | {:.2} | {he:.2} | {hs:.2} | {:.2}x | {ae:.2} | {as_:.2} | {:.2}x |",
            r["profile"].as_str().unwrap_or("?"),
            r["cloud_tokens"],
            r["edge_tokens"],
            hb / 1e6,
            ab / 1e6,
            hb / ab,
            hs / he,
            as_ / ae
        );
    }
    let _ = writeln!(md);
}

/// Sliding-window layers cut on the wire (`bench ttft` on a Gemma 3 model): the same requests
/// with the window layers cut and sent whole, against edge-only.
pub fn window_section(dir: &Path, md: &mut String) {
    let Some(v) = load(dir, "ttft-window.json") else {
        return;
    };
    let _ = writeln!(
        md,
        "## Sliding-window cut on the wire (`edgeprompt-bench ttft --model gemma3`)\n\n{}; \
         codec {}. A sliding layer's cloud KV is cut to the last window - 1 positions (what a private \
         token can still see); \"whole\" sends every position.\n\n\
         | link | cloud + edge tokens | edge-only s | llama.cpp edge-only s | EdgePrompt cut s | MB down | whole s | MB down | cut vs edge-only | cut vs whole |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        machine_line(&v),
        v["codec"].as_str().unwrap_or("?")
    );
    for r in v["rows"].as_array().into_iter().flatten() {
        let (eo, cut, whole) = (
            f(&r["edge_only_s"]),
            f(&r["pipelined_s"]),
            f(&r["pipelined_uncut_s"]),
        );
        let _ = writeln!(
            md,
            "| {} | {} + {} | {eo:.2} | {} | {cut:.2} | {:.1} | {whole:.2} | {:.1} | {:.2}x | {:.2}x |",
            r["profile"].as_str().unwrap_or("?"),
            r["cloud_tokens"],
            r["edge_tokens"],
            r["llama_edge_only_s"]
                .as_f64()
                .map_or("-".into(), |l| format!("{l:.2}")),
            f(&r["kv_bytes_down"]) / 1e6,
            f(&r["kv_bytes_down_uncut"]) / 1e6,
            cut / eo,
            cut / whole
        );
    }
    let _ = writeln!(
        md,
        "\n![5g](results/ttft-window-5g.svg) ![constrained](results/ttft-window-constrained.svg)\n"
    );
}

/// Measured against predicted TTFT, one series per link profile, and the y = x line.
fn planner_plot(dir: &Path, v: &Value, rows: &[Value]) -> Result<(), BenchError> {
    let mut profiles: Vec<&str> = rows.iter().filter_map(|r| r["profile"].as_str()).collect();
    profiles.dedup();
    let mut series: Vec<Series> = profiles
        .iter()
        .map(|p| {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r["profile"].as_str() == Some(p))
                .map(|r| (f(&r["predicted_pipelined_s"]), f(&r["pipelined_s"])))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                name: p.to_string(),
                points,
                dashed: false,
            }
        })
        .collect();
    let top = rows
        .iter()
        .map(|r| f(&r["pipelined_s"]).max(f(&r["predicted_pipelined_s"])))
        .fold(0.0, f64::max);
    series.push(Series {
        name: "measured = predicted".into(),
        points: vec![(0.0, 0.0), (top, top)],
        dashed: true,
    });
    let title = format!(
        "{}: planner-predicted vs measured pipelined TTFT",
        v["model"].as_str().unwrap_or("?")
    );
    std::fs::write(
        dir.join("planner-validation.svg"),
        line_chart(&title, "predicted TTFT (s)", "measured TTFT (s)", &series),
    )?;
    Ok(())
}
