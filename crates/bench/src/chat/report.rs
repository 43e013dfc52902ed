//! The multi-turn section of docs/results.md, from `chat*.json`.

use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

use crate::results::{f, load, machine_line};

/// Every machine's and model's multi-turn run, where there is one.
pub fn section(dir: &Path, md: &mut String) {
    for sub in ["", "avx512/", "zen4/", "xeon-emr/", "zen1/"] {
        for model in ["smollm2", "qwen05", "qwen15"] {
            let name = format!("{sub}chat{}", crate::serve::file_tag(model));
            if let Some(v) = load(dir, &format!("{name}.json")) {
                model_section(&v, &name, md);
            }
        }
    }
}

fn model_section(v: &Value, name: &str, md: &mut String) {
    let _ = writeln!(
        md,
        "## Multi-turn chat (`edgeprompt-bench chat`, `{name}.json`): {}\n\n{}; batch {}; {} ShareGPT \
         conversations × {} user turns per rate (each turn ≤ {} tokens, sent after the last answer \
         with the whole conversation), on {} cloud prompts of {} tokens, max_tokens {}, seed {}{}. \
         *new* is what a turn adds beyond the last turn's prompt and answer; *kept* is what our \
         edge ran on from its private prefix cache.\n\n\
         | server | conv/s | turn | done | prompt tokens | new tokens | kept | TTFT p50 s | TTFT p99 s |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        v["model"].as_str().unwrap_or("?"),
        machine_line(v),
        v["max_batch"],
        v["conversations"],
        v["turns"],
        v["turn_len"],
        v["groups"],
        v["cloud_len"],
        v["max_tokens"],
        v["seed"],
        v["llama_server_args"]
            .as_str()
            .map(|a| format!("; baseline in the same run: `{a}`"))
            .unwrap_or_default(),
    );
    let points = v["points"].as_array().cloned().unwrap_or_default();
    for p in &points {
        let _ = writeln!(
            md,
            "| {} | {:.2} | {} | {} | {:.0} | {} | {} | {:.3} | {:.3} |",
            p["server"].as_str().unwrap_or("?"),
            f(&p["rate"]),
            p["turn"],
            p["done"],
            f(&p["prompt_tokens"]),
            count(&p["new_tokens"]),
            count(&p["cached_tokens"]),
            f(&p["ttft_p50_s"]),
            f(&p["ttft_p99_s"]),
        );
    }
    let _ = writeln!(md, "\n{}", summary(&points));
}

/// A mean count, or "-" where there is none.
fn count(v: &Value) -> String {
    v.as_f64().map_or("-".to_string(), |c| format!("{c:.0}"))
}

/// Per rate: ours against llama-server's median TTFT at its worst turn, and how much each
/// server's median grows from the first turn to the last.
fn summary(points: &[Value]) -> String {
    let at = |server: &str, rate: f64| -> Vec<f64> {
        points
            .iter()
            .filter(|p| p["server"].as_str() == Some(server) && f(&p["rate"]) == rate)
            .map(|p| f(&p["ttft_p50_s"]))
            .collect()
    };
    let mut rates: Vec<f64> = points.iter().map(|p| f(&p["rate"])).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    let mut out = String::new();
    for rate in rates {
        let (ours, base) = (at("edgeprompt", rate), at("llama-server", rate));
        let growth = |v: &[f64]| match (v.first(), v.last()) {
            (Some(a), Some(b)) if *a > 0.0 => format!("{:.2}x", b / a),
            _ => "-".into(),
        };
        let worst = ours
            .iter()
            .zip(&base)
            .map(|(a, b)| a / b)
            .fold(f64::NAN, f64::max);
        let _ = write!(
            out,
            "At {rate:.2} conversations/s: median TTFT from the first turn to the last grows {} for us{}",
            growth(&ours),
            if base.is_empty() {
                ".\n".to_string()
            } else {
                format!(
                    ", {} for llama-server; ours / llama-server's at the worst turn **{worst:.2}x**.\n",
                    growth(&base)
                )
            }
        );
    }
    out
}
