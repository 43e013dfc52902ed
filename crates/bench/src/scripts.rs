//! The sections of `docs/results.md` whose runs a script makes, not a bench: the build
//! (`scripts/build_timings.sh`), the evaluation harnesses (`scripts/lm_eval.sh`) and slow
//! clients (`scripts/bench_flood.py`).

use std::fmt::Write;
use std::path::Path;

use crate::results::{f, load, machine_line, machine_of, num};

/// The product's build from an empty target directory (`scripts/build_timings.sh`).
pub(crate) fn build_section(dir: &Path, md: &mut String) {
    let Some(v) = load(dir, "build.json") else {
        return;
    };
    let _ = writeln!(
        md,
        "## Build time and binary size (`scripts/build_timings.sh`, `build.json`)\n\n{}\n\n\
         `{}`: **{:.0} s**, binary **{:.1} MB**, {} units. The ten slowest:\n\n| unit | s |\n| --- | --- |",
        machine_of(&v["machine"]),
        v["command"].as_str().unwrap_or("?"),
        f(&v["secs"]),
        f(&v["bytes"]) / 1e6,
        v["units"],
    );
    for u in v["slowest"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {:.1} |",
            u["unit"].as_str().unwrap_or("?"),
            f(&u["secs"])
        );
    }
    md.push('\n');
}

/// The lm-evaluation-harness table `scripts/lm_eval.sh` writes.
pub(crate) fn lm_eval_section(dir: &Path, md: &mut String) {
    let Some(v) = load(dir, "lm_eval.json") else {
        return;
    };
    let tasks = [
        ("ep_arith_mc", "addition, multiple choice: acc"),
        ("ep_arith_gen", "addition, generated: exact match"),
        ("ep_sharegpt_ppl", "ShareGPT: word perplexity"),
    ];
    let _ = writeln!(
        md,
        "## Evaluation harnesses (`scripts/lm_eval.sh`, `lm_eval.json`)\n\n{}; {}, unchanged, on tasks made \
         from local data: {} addition items after an 8-example few-shot preamble (loglikelihood and \
         generate_until) and {} ShareGPT messages (loglikelihood_rolling). `ours-cloud`: the preamble is a \
         cloud prompt, and every prompt that begins with it runs on the cloud's KV. On the same GGUF: \
         llama.cpp's `llama-server` through the same harness clients (generation), and llama.cpp in \
         process (llama-cpp-python) scoring the loglikelihood requests the harness sent us.\n\n| run | {} |\n| --- |{}",
        machine_line(&v),
        v["harness"].as_str().unwrap_or("?"),
        v["items"],
        v["documents"],
        tasks.map(|t| t.1).join(" | "),
        " --- |".repeat(tasks.len())
    );
    if let Some(scores) = v["scores"].as_object() {
        for (run, s) in scores {
            let cells: Vec<String> = tasks
                .iter()
                .map(|(t, _)| s[*t].as_f64().map_or("-".into(), |x| format!("{x:.4}")))
                .collect();
            let _ = writeln!(md, "| {run} | {} |", cells.join(" | "));
        }
    }
    let _ = writeln!(md);
    if let Some(eq) = v["equal_with_cloud_prompt"].as_object() {
        let parts: Vec<String> = eq
            .iter()
            .map(|(t, e)| format!("{t} {} of {}", e["equal"], e["samples"]))
            .collect();
        let _ = writeln!(
            md,
            "With the cloud prompt, samples scored exactly as without it: {}; {} prompts ran on the \
             preamble's cloud KV.\n",
            parts.join(", "),
            v["prompts_on_cloud_kv"]
        );
    }
    for g in v["vs_llama_cpp"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "- {} vs {} on {}: {:.4} vs {:.4}, {:+.2} points",
            g["ours"].as_str().unwrap_or("?"),
            g["baseline"].as_str().unwrap_or("?"),
            g["task"].as_str().unwrap_or("?"),
            f(&g["ours_score"]),
            f(&g["baseline_score"]),
            f(&g["points"])
        );
    }
    let ll = &v["llama_cpp_loglikelihoods"];
    if let Some(m) = ll["ep_arith_mc"].as_object() {
        let _ = writeln!(
            md,
            "- loglikelihoods of the same requests, ours vs llama.cpp (llama-cpp-python in process): mean |diff| \
             {:.3} nats, max {:.3}",
            f(&m["mean_abs_diff"]),
            f(&m["max_abs_diff"])
        );
    }
    if let Some(p) = ll["ep_sharegpt_ppl"].as_object() {
        let _ = writeln!(
            md,
            "- word perplexity, llama.cpp: {:.2}; per document the log-likelihoods are at most {:.1} % apart",
            f(&p["word_perplexity"]),
            100.0 * f(&p["max_rel_diff"])
        );
    }
    if let Some(e) = v["llama_server_echo"].as_str() {
        let _ = writeln!(
            md,
            "- llama-server on the harness's loglikelihood request (`echo`, `logprobs`): {e}"
        );
    }
    let _ = writeln!(md);
}

/// Slow and never-reading clients against `edgeprompt serve` (`scripts/bench_flood.py`): the
/// normal client's chats during the flood and the server's memory, bounds off and on.
pub(crate) fn flood_section(dir: &Path, sub: &str, md: &mut String) {
    let Some(v) = load(dir, &format!("{sub}flood.json")) else {
        return;
    };
    let _ = writeln!(
        md,
        "## Slow and never-reading clients (`scripts/bench_flood.py`)\n\n{}; model {}; {} connections \
         from 127.0.0.2 for {:.0} s (half send half a request's headers and hold, half ask a streamed \
         256-token answer on the normal client's system message and never read), a normal chat (8 \
         tokens) from 127.0.0.1 every {} s; the server's RSS 10 s after the flood went (`{sub}flood.json`).\n\n\
         | connection bounds | normal chats answered | failed | latency median / p90 / max s | RSS before / peak / 10 s after MB | flood connections still open at its end |\n\
         | --- | --- | --- | --- | --- | --- |",
        machine_of(&v["machine"]),
        v["model"].as_str().unwrap_or("?"),
        v["flood"],
        f(&v["secs"]),
        v["interval"],
    );
    for r in v["runs"].as_array().into_iter().flatten() {
        let mut lat: Vec<f64> = r["latency"]
            .as_array()
            .into_iter()
            .flatten()
            .map(f)
            .collect();
        lat.sort_by(f64::total_cmp);
        let at = |q: f64| {
            lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
                .copied()
                .unwrap_or(f64::NAN)
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} / {} / {} | {} / {} / {} ({:+.0} %) | {} of {} |",
            if r["bounded"].as_bool() == Some(true) {
                "on (defaults)"
            } else {
                "off"
            },
            lat.len(),
            r["failed"],
            num(at(0.5), 2),
            num(at(0.9), 2),
            num(lat.last().copied().unwrap_or(f64::NAN), 2),
            num(f(&r["before"]), 0),
            num(f(&r["peak"]), 0),
            num(f(&r["after"]), 0),
            (f(&r["after"]) / f(&r["before"]) - 1.0) * 100.0,
            r["still_open"],
            r["held"],
        );
    }
    md.push('\n');
}
