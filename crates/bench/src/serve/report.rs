//! The serving sections of `docs/results.md`: each machine's and model's `serve*.json`
//! against llama-server, and their plots.

use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

use crate::results::{f, load, machine_line};

/// Every model's run on the machine of `<sub>`, where there is one.
pub fn section(dir: &Path, sub: &str, md: &mut String) {
    for model in ["smollm2", "qwen05", "qwen15"] {
        model_section(
            dir,
            md,
            &format!("{sub}serve{}", crate::serve::file_tag(model)),
        );
    }
}

/// `name`: the JSON's path under `dir` without `.json` (its plots share it).
fn model_section(dir: &Path, md: &mut String, name: &str) {
    let Some(v) = load(dir, &format!("{name}.json")) else {
        return;
    };
    let w = &v["workload"];
    let _ = writeln!(
        md,
        "## Serving under Poisson load (`edgeprompt-bench serve`, `{name}.json`): {}\n\n{}; {} cloud prompts of {} tokens × {} \
         requests each, private prompts of {} tokens, max_tokens {}, seed {}{}{}{}\n\n\
         | server | offered req/s | done req/s | output tok/s | s / token | TTFT p50 s | TTFT p99 s | failed |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |",
        v["model"].as_str().unwrap_or("?"),
        machine_line(&v),
        w["groups"],
        w["cloud_len"],
        w["per_group"],
        w["edge_len"],
        v["max_tokens"],
        w["seed"],
        v["max_batch"]
            .as_u64()
            .map(|b| format!("; our batch {b}"))
            .unwrap_or_default(),
        v["llama_server_args"]
            .as_str()
            .map(|a| format!("; baseline in the same run: `{a}`"))
            .unwrap_or_default(),
        if v["fresh_prompts"].as_bool() == Some(true) {
            ". Fresh private prompts at every rate and for every server (no request repeats)"
        } else {
            ". **Measured with repeated requests**: the same requests at every rate, so a \
             server's prompt cache could answer later rates' from earlier ones"
        }
    );
    for p in v["points"].as_array().cloned().unwrap_or_default() {
        let _ = writeln!(
            md,
            "| {} | {:.2} | {:.2} | {:.1} | {:.3} | {:.2} | {:.2} | {} |",
            p["server"].as_str().unwrap_or("?"),
            f(&p["rate"]),
            f(&p["req_s"]),
            f(&p["tok_s"]),
            f(&p["s_per_token"]),
            f(&p["ttft_p50_s"]),
            f(&p["ttft_p99_s"]),
            p["failed"]
        );
    }
    let _ = writeln!(
        md,
        "\n{}![latency](results/{name}-latency.svg) ![ttft](results/{name}-ttft.svg) ![throughput](results/{name}-throughput.svg)\n",
        summary(&v)
    );
}

/// Ours against llama-server where both ran: the most requests a second either finished at any
/// offered rate (saturation) and the median TTFT at 1 req/s. Empty without a baseline.
fn summary(v: &Value) -> String {
    let points = v["points"].as_array().cloned().unwrap_or_default();
    let of = |server: &str| -> (f64, Option<f64>) {
        let mine = points
            .iter()
            .filter(|p| p["server"].as_str() == Some(server));
        let top = mine.clone().map(|p| f(&p["req_s"])).fold(0.0, f64::max);
        let ttft = mine
            .filter(|p| (f(&p["rate"]) - 1.0).abs() < 1e-9)
            .map(|p| f(&p["ttft_p50_s"]))
            .next();
        (top, ttft)
    };
    let ((ours, ours_ttft), (base, base_ttft)) = (of("edgeprompt"), of("llama-server"));
    if ours <= 0.0 || base <= 0.0 {
        return String::new();
    }
    // Below llama-server's saturation: the offered rates under the first at which it finished
    // its most requests a second.
    let at = |server: &str, rate: f64| {
        points
            .iter()
            .find(|p| p["server"].as_str() == Some(server) && f(&p["rate"]) == rate)
            .map(|p| f(&p["ttft_p50_s"]))
    };
    let knee = points
        .iter()
        .filter(|p| p["server"].as_str() == Some("llama-server") && f(&p["req_s"]) >= base)
        .map(|p| f(&p["rate"]))
        .fold(f64::INFINITY, f64::min);
    let below: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p["server"].as_str() == Some("llama-server") && f(&p["rate"]) < knee)
        .filter_map(|p| {
            let r = f(&p["rate"]);
            Some((r, at("edgeprompt", r)? / at("llama-server", r)?))
        })
        .collect();
    let under = if below.is_empty() {
        String::new()
    } else {
        let worst = below.iter().map(|b| b.1).fold(f64::NAN, f64::max);
        format!(
            "; median TTFT at every rate below llama-server's saturation ({knee:.2} req/s offered), ours / llama-server's: {} (worst **{worst:.2}x**)",
            below
                .iter()
                .map(|(r, x)| format!("{x:.2}x at {r:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let ttft = match (ours_ttft, base_ttft) {
        (Some(a), Some(b)) if b > 0.0 => {
            format!(
                "; median TTFT at 1 req/s {a:.2} vs {b:.2} s (**{:.2}x**)",
                a / b
            )
        }
        _ => String::new(),
    };
    format!(
        "Saturation (the most requests done a second at any offered rate): {ours:.2} vs {base:.2} \
         req/s (**{:.2}x** llama-server){ttft}{under}.\n\n",
        ours / base
    )
}
