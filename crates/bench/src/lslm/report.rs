//! The CE-LSLM sections of `docs/results.md`: the layer matching (`align.json`, from
//! `edgeprompt align`), `lslm.json`'s quality and TTFT with their plots redrawn, and the fuser.

use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

use crate::results::{f, load, pair_line};

/// `align-cka.svg` and `align-rsa.svg` (CE-LSLM Fig. 5) drawn from `align.json`'s similarity
/// matrices, the eq. 16 matches outlined.
fn align_heat_maps(dir: &Path, v: &Value) {
    let matrix = |name: &str| -> Vec<Vec<f64>> {
        v["similarity"][name]
            .as_array()
            .map(|rows| {
                rows.iter()
                    .map(|r| {
                        r.as_array()
                            .map(|c| c.iter().map(f).collect())
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let marks: Vec<(usize, usize)> = v["matches"]
        .as_array()
        .map(|m| {
            m.iter()
                .enumerate()
                .filter_map(|(j, i)| Some((i.as_u64()? as usize, j)))
                .collect()
        })
        .unwrap_or_default();
    for name in ["cka", "rsa"] {
        let values = matrix(name);
        if values.is_empty() {
            continue;
        }
        let title = format!(
            "{}: cloud LLM layer (rows) vs edge SLM layer (columns); eq. 16 matches outlined",
            name.to_uppercase()
        );
        let svg = crate::plot::heat_map(&title, "LLM layer", "SLM layer", &values, &marks);
        let file = format!("align-{name}.svg");
        if let Err(e) = std::fs::write(dir.join(&file), svg) {
            eprintln!("could not write {file}: {e}");
        }
    }
}

/// The layer matching, then `lslm.json`'s quality and TTFT.
pub fn section(dir: &Path, md: &mut String) {
    if let Some(v) = load(dir, "align.json") {
        align_heat_maps(dir, &v);
        let _ = writeln!(
            md,
            "## CE-LSLM layer matching (`edgeprompt align`, CE-LSLM Fig. 5 and eq. 16)\n\n{}; calibration {} \
             ShareGPT sequences, {} tokens; similarity on {} sampled tokens; thresholds CKA >= {}, RSA >= {}; \
             ridge {}. R² is on held-out calibration tokens (keys without RoPE).\n\n\
             ![cka](results/align-cka.svg) ![rsa](results/align-rsa.svg)\n\n\
             | SLM layer | LLM layer | CKA | RSA | R² keys | R² values | R² keys, ThinK |\n| --- | --- | --- | --- | --- | --- | --- |",
            pair_line(&v),
            v["calibration_sequences"],
            v["calibration_tokens"],
            v["similarity_tokens"],
            v["t_cka"],
            v["t_rsa"],
            v["ridge"]
        );
        let adapters = v["adapters"].as_array().cloned().unwrap_or_default();
        let pair = |a: usize, j: usize| -> Option<Value> {
            adapters.get(a)?["pairs"]
                .as_array()?
                .iter()
                .find(|p| p["slm_layer"].as_u64() == Some(j as u64))
                .cloned()
        };
        for (j, m) in v["matches"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            match (m.as_u64(), pair(0, j)) {
                (Some(i), Some(p)) => {
                    let think =
                        pair(1, j).map_or("-".to_string(), |t| format!("{:.3}", f(&t["r2_keys"])));
                    let _ = writeln!(
                        md,
                        "| {j} | {i} | {:.3} | {:.3} | {:.3} | {:.3} | {think} |",
                        f(&p["cka"]),
                        f(&p["rsa"]),
                        f(&p["r2_keys"]),
                        f(&p["r2_values"])
                    );
                }
                _ => {
                    let _ = writeln!(md, "| {j} | below threshold | | | | | |");
                }
            }
        }
        let _ = writeln!(md);
    }
    let Some(v) = load(dir, "lslm.json") else {
        return;
    };
    // Redraw the plots from the data (so a plot change needs no new measurement).
    if let Ok(d) = serde_json::from_value::<crate::lslm::PlotData>(v.clone()) {
        for (name, svg) in crate::lslm::plots(d.quality.as_ref(), &d.latency) {
            if let Err(e) = std::fs::write(dir.join(&name), svg) {
                eprintln!("could not write {name}: {e}");
            }
        }
    }
    if let Some(q) = v["quality"].as_object() {
        let _ = writeln!(
            md,
            "## CE-LSLM quality (`edgeprompt-bench lslm`)\n\n{}; {} held-out ShareGPT conversations (the earlier \
             turns are the cloud prompt, mean {:.0} tokens; the next user turn is private), {} answer tokens scored \
             with teacher forcing. Agreement = same top-1 next token.\n\n\
             ![quality](results/lslm-quality.svg) ![layers](results/lslm-layers.svg)\n\n\
             | configuration | perplexity | agreement with SLM alone | agreement with LLM alone |\n| --- | --- | --- | --- |",
            pair_line(&v),
            q["cases"],
            f(&q["cloud_tokens_mean"]),
            q["scored_tokens"]
        );
        for c in q["configs"].as_array().cloned().unwrap_or_default() {
            let _ = writeln!(
                md,
                "| {} | {:.2} | {:.1} % | {:.1} % |",
                c["name"].as_str().unwrap_or("?"),
                f(&c["perplexity"]),
                100.0 * f(&c["agree_slm"]),
                100.0 * f(&c["agree_llm"])
            );
        }
        let _ = writeln!(md);
    }
    let rows = v["latency"].as_array().cloned().unwrap_or_default();
    if !rows.is_empty() {
        let _ = writeln!(
            md,
            "## CE-LSLM TTFT and bytes (`edgeprompt-bench lslm`)\n\n{}; f16 wire; adapters on the cloud. The planner \
             (eq. 19/20) picks the split from per-layer times measured in the run, among the splits that kept at \
             least {:.0} % next-token agreement with the SLM alone in the quality run (layers {}..); layers split.. \
             come from the cloud while the edge computes 0..split.\n\n![ttft](results/lslm-ttft.svg)\n\n\
             | link | cloud + private tokens | SLM alone s | LLM alone s | planner split | predicted s | measured s | \
             lowest allowed split: measured s | MB down (split / lowest) | LLM KV MB for the same layers |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            pair_line(&v),
            100.0 * f(&v["min_agreement"]),
            v["quality_split"]
        );
        for r in rows {
            let _ = writeln!(
                md,
                "| {} | {} + {} | {:.3} | {:.3} | {} | {:.3} | {:.3} | {}: {:.3} | {:.2} / {:.2} | {:.2} |",
                r["profile"].as_str().unwrap_or("?"),
                r["cloud_tokens"],
                r["edge_tokens"],
                f(&r["slm_alone_s"]),
                f(&r["llm_alone_s"]),
                r["split"],
                f(&r["predicted_s"]),
                f(&r["measured_s"]),
                r["min_split"],
                f(&r["min_split_s"]),
                f(&r["bytes_down"]) / 1e6,
                f(&r["min_split_bytes"]) / 1e6,
                f(&r["llm_kv_bytes_same_layers"]) / 1e6
            );
        }
        let _ = writeln!(md);
    }
}

/// The `docs/results.md` section from `<sub>fuser.json` and, where present, the learning
/// curve `<sub>fuser-train.jsonl` the training script logged.
pub fn fuser_section(dir: &Path, sub: &str, md: &mut String) {
    let Some(v) = load(dir, &format!("{sub}fuser.json")) else {
        return;
    };
    let t = &v["fuser_training"];
    let _ = writeln!(
        md,
        "## CE-LSLM fuser (`edgeprompt-bench fuser`)\n\n{}; {} held-out ShareGPT conversations (records {}.., \
         the first 8 those of \"CE-LSLM quality\"); the fuser trained {} steps of a {}-step schedule on {} \
         conversations (records 10000..), both models frozen (`docs/lslm.md`, \"The fuser\"). Multiple \
         choice: which of {} answers (the real one, the others from other conversations, all cut to one \
         length) the model finds most likely after the prompt and the private turn.\n\n\
         | configuration | perplexity | agreement with SLM alone | agreement with LLM alone | multiple choice |\n\
         | --- | --- | --- | --- | --- |",
        pair_line(&v),
        v["cases"],
        v["first_record"],
        t["steps"],
        t["schedule_steps"].as_u64().unwrap_or(400),
        t["cases"],
        v["choices"],
    );
    for c in v["configs"].as_array().cloned().unwrap_or_default() {
        let _ = writeln!(
            md,
            "| {} | {:.3} | {:.1} % | {:.1} % | {:.1} % |",
            c["name"].as_str().unwrap_or("?"),
            f(&c["perplexity"]),
            100.0 * f(&c["agree_slm"]),
            100.0 * f(&c["agree_llm"]),
            100.0 * f(&c["choice_exact"])
        );
    }
    // The first 8 cases alone (those of the lslm quality run), from the per-case losses.
    let rows = v["per_case"].as_array().cloned().unwrap_or_default();
    let ppl = |rows: &[serde_json::Value], key: &str| {
        let (mut nll, mut n) = (0.0, 0.0);
        for r in rows {
            let a = f(&r["answer_tokens"]);
            nll += f(&r[key]) * a;
            n += a;
        }
        (nll / n.max(1.0)).exp()
    };
    let first = &rows[..rows.len().min(8)];
    let worst = rows
        .iter()
        .map(|r| f(&r["fused_nll"]) - f(&r["slm_nll"]))
        .fold(f64::NEG_INFINITY, f64::max);
    let _ = writeln!(
        md,
        "\nGap closed (SLM alone to LLM alone, perplexity): {:.1} % over all {}; on the first 8: SLM {:.2}, \
         fused {:.2}, LLM {:.2} ({:.1} %). Cases worse with the fused KV than the SLM alone by more than two \
         standard errors of the paired per-token difference: {} of {} (largest mean increase {:.3} nats per token).\n",
        100.0 * f(&v["gap_closed"]),
        v["cases"],
        ppl(first, "slm_nll"),
        ppl(first, "fused_nll"),
        ppl(first, "llm_nll"),
        100.0 * (ppl(first, "slm_nll") - ppl(first, "fused_nll"))
            / (ppl(first, "slm_nll") - ppl(first, "llm_nll")),
        v["worse_beyond_noise"],
        v["cases"],
        worst
    );
    let wire = v["wire"].as_array().cloned().unwrap_or_default();
    if !wire.is_empty() {
        let _ = writeln!(
            md,
            "TTFT (fetch, private prefill, first token) and bytes down over loopback gRPC through the same link \
             profile: the cloud running the LLM with the fuser vs one running the SLM (EdgePrompt mode). Warm: \
             median of three fetches after the first (the cloud's cached KV); cold: the first.\n\n\
             | link | cloud + private tokens | fused warm s | EdgePrompt warm s | fused cold s | EdgePrompt cold s | bytes fused / EdgePrompt |\n\
             | --- | --- | --- | --- | --- | --- | --- |"
        );
        for r in wire {
            let _ = writeln!(
                md,
                "| {} | {} + {} | {:.3} | {:.3} | {:.3} | {:.3} | {} / {} |",
                r["profile"].as_str().unwrap_or("?"),
                r["cloud_tokens"],
                r["private_tokens"],
                f(&r["fused_warm_s"]),
                f(&r["exact_warm_s"]),
                f(&r["fused_cold_s"]),
                f(&r["exact_cold_s"]),
                r["fused_bytes"],
                r["exact_bytes"]
            );
        }
        let _ = writeln!(md);
    }
    let curve =
        std::fs::read_to_string(dir.join(format!("{sub}fuser-train.jsonl"))).unwrap_or_default();
    let points: Vec<serde_json::Value> = curve
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    if !points.is_empty() {
        let _ = writeln!(
            md,
            "Learning curve (the 24 held-apart training-range conversations, the script's own forward pass): {}.\n",
            points
                .iter()
                .map(|p| format!(
                    "step {} perplexity {:.3}, agreement with LLM {:.1} %",
                    p["step"],
                    f(&p["val_ppl"]),
                    100.0 * f(&p["val_agree_llm"])
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
}
