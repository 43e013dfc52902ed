//! The soak's section of docs/results.md and its timeline plot, drawn from soak.json.

use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

use crate::plot::{timeline, Panel, Series};
use crate::results::{f, load, machine_line};

pub fn section(dir: &Path, md: &mut String) {
    let Some(v) = load(dir, "soak.json") else {
        return;
    };
    let _ = writeln!(
        md,
        "## Chaos under load (`edgeprompt-bench soak`)\n\n{}; {:.0} s of Poisson load at {} req/s over two \
         edges, {} cloud prompts, {} tokens per answer, link `{}`, seed {}. Processes: `redis-server`, two \
         cloud nodes sharing it, a shaped link in front of each, two edge servers with disk caches that \
         are each other's peers.\n",
        machine_line(&v),
        f(&v["secs"]),
        v["rate"],
        v["prompts"],
        v["max_tokens"],
        v["link"].as_str().unwrap_or("?"),
        v["seed"],
    );
    let kinds: Vec<String> = v["outcomes"]
        .as_object()
        .map(|o| o.iter().map(|(k, n)| format!("{k} {n}")).collect())
        .unwrap_or_default();
    let _ = writeln!(
        md,
        "**{} requests sent: {}; unaccounted {}.** Answers identical to the single-node answer: {} of {}. \
         Panics in any log: {}. Edges stopped with SIGTERM exited with {}.\n",
        v["sent"],
        kinds.join(", "),
        v["unaccounted"],
        v["answers_identical"],
        v["answers_compared"],
        v["panics"].as_array().map_or(0, |a| a.len()),
        v["edge_exit_codes"]
    );
    let _ = writeln!(
        md,
        "| fault | at s | target | recovery s | how recovery is timed |\n| --- | --- | --- | --- | --- |"
    );
    for r in v["faults"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {:.1} | {} | {} | {} |",
            r["fault"]["kind"].as_str().unwrap_or("?"),
            f(&r["started_s"]),
            r["fault"]["target"],
            r["recovery_s"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.1}")),
            r["note"].as_str().unwrap_or("")
        );
    }
    let _ = writeln!(md, "\n{}\n", bounds_line(&v));
    for (i, e) in v["edges"].as_array().into_iter().flatten().enumerate() {
        let _ = writeln!(
            md,
            "Edge {i}: cloud prompts from {}; failed disk-cache writes {}.\n",
            e["lookups"], e["disk_write_errors"]
        );
    }
    let _ = writeln!(md, "![soak](results/soak.svg)\n");
    if let Err(e) = std::fs::write(dir.join("soak.svg"), plot(&v)) {
        eprintln!("could not write soak.svg: {e}");
    }
}

fn bounds_line(v: &Value) -> String {
    let samples = v["samples"].as_array().cloned().unwrap_or_default();
    let max = |key: &str, edge: Option<usize>| {
        samples
            .iter()
            .filter(|s| edge.is_none_or(|e| s["edge"].as_u64() == Some(e as u64)))
            .map(|s| f(&s[key]))
            .fold(0.0, f64::max)
    };
    let l = &v["limits"];
    let mut t = format!(
        "Bounds, sampled every second on both edges ({} samples; held: **{}**): reserved private KV max \
         {:.1} MB of {:.0} MB; prefix cache max {:.1} MB of {:.0} MB (beyond it only by the prompts \
         requests hold: idle prompts only are evicted); queue max {} of {}",
        samples.len(),
        v["bounds_held"],
        max("kv_reserved_bytes", None) / 1e6,
        f(&l["kv_budget_bytes"]) / 1e6,
        max("prefix_cache_bytes", None) / 1e6,
        f(&l["prefix_cache_bytes"]) / 1e6,
        max("queue_depth", None),
        l["max_queue"]
    );
    for (i, lim) in l["rss_bytes"].as_array().into_iter().flatten().enumerate() {
        let _ = write!(
            t,
            "; edge {i} RSS max {:.0} MB of {:.0} MB",
            max("rss_bytes", Some(i)) / 1e6,
            f(lim) / 1e6
        );
    }
    t + "."
}

fn plot(v: &Value) -> String {
    let buckets = v["timeline"].as_array().cloned().unwrap_or_default();
    let line = |name: &str, key: &str, scale: f64| Series {
        name: name.into(),
        points: buckets
            .iter()
            .filter(|b| b[key].is_number())
            .map(|b| (f(&b["t"]), f(&b[key]) * scale))
            .collect(),
        dashed: false,
    };
    let samples = v["samples"].as_array().cloned().unwrap_or_default();
    let rss = (0..2)
        .map(|e| Series {
            name: format!("edge {e}"),
            points: samples
                .iter()
                .filter(|s| s["edge"].as_u64() == Some(e))
                .map(|s| (f(&s["t"]), f(&s["rss_bytes"]) / 1e6))
                .collect(),
            dashed: false,
        })
        .collect();
    let events: Vec<(f64, String)> = v["faults"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let kind = r["fault"]["kind"].as_str().unwrap_or("?").replace('_', " ");
            (
                f(&r["started_s"]),
                format!("{kind} {}", r["fault"]["target"]),
            )
        })
        .collect();
    timeline(
        &format!("{}: soak under faults", v["model"].as_str().unwrap_or("?")),
        "seconds into the load",
        &[
            Panel {
                y_label: "answers / s".into(),
                series: vec![line("answered", "answered_per_s", 1.0)],
            },
            Panel {
                y_label: "TTFT s (streamed)".into(),
                series: vec![
                    line("p50", "ttft_p50_s", 1.0),
                    line("p99", "ttft_p99_s", 1.0),
                ],
            },
            Panel {
                y_label: "RSS MB".into(),
                series: rss,
            },
        ],
        &events,
    )
}
