//! The fleet's section of docs/results.md: the real run's table, the simulator's error against
//! it (and its plot), the Fig. 7 grid beside the paper's reading, and the deployer's answers;
//! then `fleet-scaleout`'s, the simulator with a store and replicas.

use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

use crate::plot::{line_chart, Series};
use crate::results::{f, load, machine_of};

/// The bar for the simulator against the real fleet.
const GOAL: f64 = 0.15;

fn machine(v: &Value) -> String {
    machine_of(&v["machine"])
}

fn points(v: &Value) -> Vec<&Value> {
    v["points"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn setups(v: &Value) -> Vec<String> {
    let mut s: Vec<String> = Vec::new();
    for p in points(v) {
        let name = p["setup"].as_str().unwrap_or("?").to_string();
        if !s.contains(&name) {
            s.push(name);
        }
    }
    s
}

/// The highest rate a setup completed: its saturation throughput when the last rate overloads it.
fn capacity(v: &Value, setup: &str, key: &str) -> f64 {
    points(v)
        .iter()
        .filter(|p| p["setup"] == setup)
        .map(|p| f(&p[key]["req_s"]))
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max)
}

pub fn section(dir: &Path, md: &mut String) {
    real_section(dir, md);
    grid_section(dir, md);
}

fn real_section(dir: &Path, md: &mut String) {
    let Some(v) = load(dir, "fleet.json") else {
        return;
    };
    let _ = writeln!(
        md,
        "## A fleet under load, measured (`edgeprompt-bench fleet`)\n\n{}. Cloud `{}`, edges `{}` \
         (CE-LSLM: layers {}.. from the cloud), each node a real process pinned to its own core, each edge \
         behind its own `{}` link; {} cloud prompts of {} tokens, private prompts of {} tokens (ShareGPT), \
         at most {} output tokens; {} s of seeded Poisson arrivals per rate over the fleet, after every \
         server answered each cloud prompt once. Cloud-only: the cloud model answers every request on both \
         cores (our server; llama.cpp's `llama-server`: {}).\n",
        machine(&v),
        v["cloud_model"].as_str().unwrap_or("?"),
        v["edge_model"].as_str().unwrap_or("?"),
        v["split"],
        v["link"].as_str().unwrap_or("?"),
        v["prompts"],
        v["prefix_len"],
        v["private_len"],
        v["max_tokens"],
        v["secs_per_rate"],
        v["llama_server_args"].as_str().unwrap_or("not run"),
    );
    let _ = writeln!(
        md,
        "| setup | offered req/s | arrived req/s | done req/s | mean latency s | s / output token | TTFT mean s | TTFT p99 s | failed | KV from | simulated latency s | error |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for p in points(&v) {
        let m = &p["measured"];
        let sources: Vec<String> = m["sources"]
            .as_object()
            .map(|o| o.iter().map(|(k, n)| format!("{k} {n}")).collect())
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} | {} | {} | {} | {} |",
            p["setup"].as_str().unwrap_or("?"),
            f(&p["rate"]),
            // The seeded arrivals as they fell.
            f(&m["requests"]) / f(&v["secs_per_rate"]),
            f(&m["req_s"]),
            f(&m["mean_latency_s"]),
            f(&m["mean_s_per_token"]),
            f(&m["mean_ttft_s"]),
            f(&m["ttft_p99_s"]),
            m["failed"],
            sources.join(", "),
            p["simulated"]["mean_latency_s"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.2}")),
            p["latency_error"]
                .as_f64()
                .map_or("-".into(), |x| format!("{:+.1} %", x * 100.0)),
        );
    }
    for x in v["failures"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "\n**`{}` could not be measured:** {}",
            x["setup"].as_str().unwrap_or("?"),
            x["error"]
                .as_str()
                .unwrap_or("?")
                .lines()
                .next()
                .unwrap_or("?")
        );
    }
    nodes_table(&v, md);
    // Below saturation: the setup completed what arrived (within 10 %).
    let mut worst: f64 = 0.0;
    let mut counted = 0;
    let mut lines = Vec::new();
    for s in setups(&v) {
        if s == "llama-server" {
            continue;
        }
        let (m, sim) = (capacity(&v, &s, "measured"), capacity(&v, &s, "simulated"));
        let all = points(&v);
        let below: Vec<&&Value> = all
            .iter()
            .filter(|p| {
                // Offered as realised: the seeded arrivals over their seconds.
                let offered = f(&p["measured"]["requests"]) / f(&v["secs_per_rate"]);
                p["setup"] == s.as_str() && f(&p["measured"]["req_s"]) >= 0.9 * offered
            })
            .collect();
        let errs: Vec<f64> = below.iter().map(|p| f(&p["latency_error"]).abs()).collect();
        counted += errs.len();
        let w = errs.iter().copied().fold(0.0, f64::max);
        worst = worst.max(w);
        lines.push(format!(
            "- `{s}`: mean latency within {:.1} % at the {} rates below saturation; the most it completed: {m:.2} req/s measured, {sim:.2} simulated ({:+.1} %).",
            w * 100.0,
            errs.len(),
            (sim - m) / m * 100.0
        ));
    }
    let _ = writeln!(
        md,
        "\n**Simulator against the measurement** (goal: within {:.0} %): {} points below saturation, worst {:.1} % — {}.\n\n{}\n",
        GOAL * 100.0,
        counted,
        worst * 100.0,
        if worst <= GOAL { "met" } else { "missed" },
        lines.join("\n")
    );
    let _ = writeln!(md, "Costs fitted on this machine (`fleet-costs`, one process per node kind, pinned):\n\n| node | model | cores | fixed ms | per prompt token ms | per decoding sequence ms | per attended pair ns | fit error |\n| --- | --- | --- | --- | --- | --- | --- | --- |");
    for c in v["calibration"].as_array().into_iter().flatten() {
        let k = &c["costs"];
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.3} | {:.3} | {:.2} | {:.1} % |",
            c["node"].as_str().unwrap_or("?"),
            c["model"].as_str().unwrap_or("?"),
            c["cores"],
            f(&k["fixed"]) * 1e3,
            f(&k["per_token"]) * 1e3,
            f(&k["per_seq"]) * 1e3,
            f(&k["per_attend"]) * 1e9,
            f(&c["fit_error"]) * 100.0
        );
    }
    let _ = writeln!(
        md,
        "\nWhat each real server adds to the engine's fitted costs (negative: takes away), timed on it after the warm-up (lone \
         requests; then a burst at every server at once, the per-sequence cost that makes the simulated \
         bursts end when the real ones did):\n\n| setup | per decode step ms | per request ms | per sequence under load ms | burst |\n| --- | --- | --- | --- | --- |"
    );
    for o in v["overheads"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {:+.1} | {:+.1} | {:+.2} | {} requests in {:.1} s |",
            o["setup"].as_str().unwrap_or("?"),
            f(&o["step_secs"]) * 1e3,
            f(&o["request_secs"]) * 1e3,
            f(&o["seq_secs"]) * 1e3,
            o["burst"],
            f(&o["burst_secs"]),
        );
    }
    let mut series = Vec::new();
    for s in setups(&v) {
        let pts = |key: &str| -> Vec<(f64, f64)> {
            points(&v)
                .iter()
                .filter(|p| p["setup"] == s.as_str() && p[key]["mean_latency_s"].is_number())
                .map(|p| (f(&p["rate"]), f(&p[key]["mean_latency_s"])))
                .collect()
        };
        series.push(Series {
            name: format!("{s} measured"),
            points: pts("measured"),
            dashed: false,
        });
        if s != "llama-server" {
            series.push(Series {
                name: format!("{s} simulated"),
                points: pts("simulated"),
                dashed: true,
            });
        }
    }
    let _ = std::fs::write(
        dir.join("fleet-validation.svg"),
        line_chart(
            "Fleet: mean latency, measured (solid) vs simulated (dashed)",
            "offered requests/s",
            "mean latency, s",
            &series,
        ),
    );
    let _ = writeln!(md, "\n![fleet validation](results/fleet-validation.svg)\n");
}

/// Per node and rate: CPU seconds, requests, KV bytes fetched, and the queue its `/metrics`
/// showed (waiting for a batch slot; being computed).
fn nodes_table(v: &Value, md: &mut String) {
    let _ = writeln!(
        md,
        "\nPer node (CPU seconds from `/proc` over the rate's load, for the link processes and the load's \
         client too, which are not pinned; the queue sampled every 250 ms from the server's `/metrics`; \
         the cloud node of an EdgePrompt fleet serves gRPC and has none; a node under 0.05 CPU s and \
         without a queue is left out: idle):\n\n\
         | setup | offered req/s | node | CPU s | requests | KV MB fetched | waiting mean | waiting max | running mean | running max |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for p in points(v) {
        for n in p["nodes"].as_array().into_iter().flatten() {
            let q = &n["queue"];
            if !q.is_object() && f(&n["cpu_secs"]) < 0.05 {
                continue;
            }
            let (wm, wx, rm, rx) = if q.is_object() {
                (
                    format!("{:.1}", f(&q["mean_waiting"])),
                    q["max_waiting"].to_string(),
                    format!("{:.1}", f(&q["mean_running"])),
                    q["max_running"].to_string(),
                )
            } else {
                ("-".into(), "-".into(), "-".into(), "-".into())
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} | {} | {:.1} | {wm} | {wx} | {rm} | {rx} |",
                p["setup"].as_str().unwrap_or("?"),
                f(&p["rate"]),
                n["node"].as_str().unwrap_or("?"),
                f(&n["cpu_secs"]),
                n["requests"].as_u64().unwrap_or(0),
                n["kv_bytes"].as_u64().unwrap_or(0) as f64 / 1e6,
            );
        }
    }
}

fn grid_section(dir: &Path, md: &mut String) {
    let Some(v) = load(dir, "fleet-grid.json") else {
        return;
    };
    let _ = writeln!(
        md,
        "## CE-LSLM Fig. 7 at scale, simulated (`edgeprompt-bench fleet-grid`)\n\n{}. Costs fitted here: \
         edges `{}` on 2 cores each, cloud `{}` on 2 cores, and a 16-core cloud node modelled as 8x the \
         arithmetic and 3x the memory bandwidth. Links `{}`; KV {} B per cloud-prompt token on the wire, \
         the edge computing {:.0} % of the layers; 8 shared cloud prompts, held by every edge (and in the \
         cloud-only cache) before the load starts; {} ShareGPT (private, output) pairs, mean {:.0} / {:.0} \
         tokens (capped at 256 / 128).\n",
        machine(&v),
        v["edge_model"].as_str().unwrap_or("?"),
        v["cloud_model"].as_str().unwrap_or("?"),
        v["link"].as_str().unwrap_or("?"),
        v["kv_bytes_per_token"],
        f(&v["edge_layers"]) * 100.0,
        v["lengths"],
        f(&v["mean_private"]),
        f(&v["mean_output"]),
    );
    let rows: Vec<&Value> = v["grid"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let get = |setup: &str, prefix: u64, rate: f64| {
        rows.iter()
            .find(|r| r["setup"] == setup && r["prefix"] == prefix && f(&r["rate"]) == rate)
            .map(|r| &r["stats"])
    };
    let _ = writeln!(
        md,
        "| prefix | req/s | CE-LSLM 5 edges latency s | 32 edges s | cloud-only 2 cores s | cloud-only 16 cores s | CE-LSLM 5 edges s/token | cloud-only 16 s/token | done req/s: 5 edges / 32 / cloud 2 / 16 |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for prefix in [256u64, 512, 1024] {
        for rate in [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0] {
            let (Some(e), Some(e32), Some(c2), Some(c16)) = (
                get("ce-lslm", prefix, rate),
                get("ce-lslm-32", prefix, rate),
                get("cloud-only-2", prefix, rate),
                get("cloud-only-16", prefix, rate),
            ) else {
                continue;
            };
            let _ = writeln!(
                md,
                "| {prefix} | {rate} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.1} / {:.1} / {:.1} / {:.1} |",
                f(&e["mean_latency_s"]),
                f(&e32["mean_latency_s"]),
                f(&c2["mean_latency_s"]),
                f(&c16["mean_latency_s"]),
                f(&e["s_per_token"]),
                f(&c16["s_per_token"]),
                f(&e["req_s"]),
                f(&e32["req_s"]),
                f(&c2["req_s"]),
                f(&c16["req_s"]),
            );
        }
    }
    // The paper's reading beside ours, per prefix.
    let _ = writeln!(
        md,
        "\nThe paper (OPT-6.7B on vLLM in the cloud, OPT-1.3B edges, on shared A800 GPUs): CE-LSLM stays near 1 s while cloud-only \
         passes 4 s at 32 req/s, and serves 4-6x the throughput at 64 req/s. Here:\n"
    );
    for prefix in [256u64, 512, 1024] {
        let at = |setup: &str, rate: f64, k: &str| {
            get(setup, prefix, rate).map_or(f64::NAN, |s| f(&s[k]))
        };
        let _ = writeln!(
            md,
            "- prefix {prefix}: at 32 req/s CE-LSLM {:.2} s with 5 edges and {:.2} s with 32, against cloud-only {:.2} s (2 cores) and {:.2} s (16 cores); \
             at 64 req/s CE-LSLM completes {:.1} req/s with 5 edges and {:.1} with 32: {:.1}x cloud-only on 2 cores and {:.1}x on 16 (32 edges).",
            at("ce-lslm", 32.0, "mean_latency_s"),
            at("ce-lslm-32", 32.0, "mean_latency_s"),
            at("cloud-only-2", 32.0, "mean_latency_s"),
            at("cloud-only-16", 32.0, "mean_latency_s"),
            at("ce-lslm", 64.0, "req_s"),
            at("ce-lslm-32", 64.0, "req_s"),
            at("ce-lslm-32", 64.0, "req_s") / at("cloud-only-2", 64.0, "req_s"),
            at("ce-lslm-32", 64.0, "req_s") / at("cloud-only-16", 64.0, "req_s"),
        );
    }
    for prefix in [256u64, 512, 1024] {
        let mut lat = Vec::new();
        let mut norm = Vec::new();
        for (setup, name) in [
            ("ce-lslm", "CE-LSLM, 5 edges"),
            ("ce-lslm-32", "CE-LSLM, 32 edges"),
            ("cloud-only-2", "cloud-only, 2 cores"),
            ("cloud-only-16", "cloud-only, 16 cores"),
        ] {
            let pts = |k: &str| -> Vec<(f64, f64)> {
                rows.iter()
                    .filter(|r| r["setup"] == setup && r["prefix"] == prefix)
                    .map(|r| (f(&r["rate"]), f(&r["stats"][k])))
                    .collect()
            };
            lat.push(Series {
                name: name.into(),
                points: pts("mean_latency_s"),
                dashed: !setup.starts_with("ce-lslm"),
            });
            norm.push(Series {
                name: name.into(),
                points: pts("s_per_token"),
                dashed: !setup.starts_with("ce-lslm"),
            });
        }
        let _ = std::fs::write(
            dir.join(format!("fleet-fig7-latency-{prefix}.svg")),
            line_chart(
                &format!("Fig. 7, prefix {prefix}: mean latency (simulated)"),
                "requests/s",
                "mean latency, s",
                &lat,
            ),
        );
        let _ = std::fs::write(
            dir.join(format!("fleet-fig7-normalised-{prefix}.svg")),
            line_chart(
                &format!("Fig. 7, prefix {prefix}: normalised latency (simulated)"),
                "requests/s",
                "s per output token",
                &norm,
            ),
        );
        let _ = writeln!(
            md,
            "\n![latency {prefix}](results/fleet-fig7-latency-{prefix}.svg) ![normalised {prefix}](results/fleet-fig7-normalised-{prefix}.svg)"
        );
    }
    let _ = writeln!(md, "\n**Edges per cloud node** (each edge at 0.5 req/s for 10 minutes; a share of requests brings a fresh 1024-token cloud prompt the cloud must prefill; the queue counts prompts waiting for the cloud's prefill, the 8 shared ones at the start included):\n\n| cloud cores | edges | fresh | cloud node busy | prefill queue (most) | TTFT mean s | TTFT p99 s |\n| --- | --- | --- | --- | --- | --- | --- |");
    for r in v["feed"].as_array().into_iter().flatten() {
        let s = &r["stats"];
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} % | {:.0} % | {} | {:.2} | {:.2} |",
            r["cloud_cores"],
            r["edges"],
            f(&r["fresh"]) * 100.0,
            f(&s["cloud_busy"]) * 100.0,
            s["max_prefill_queue"],
            f(&s["mean_ttft_s"]),
            f(&s["ttft_p99_s"])
        );
    }
    let _ = writeln!(md, "\n**Edges joining cold** (each at a seeded moment within a minute, then 0.2 req/s; 8 cloud prompts of 1024 tokens; cloud nodes of 2 cores, egress 10 Gbit/s each; peers on a 1 Gbit/s LAN; Redis at 10 Gbit/s):\n\n| edges | variant | cold requests | cold TTFT mean s | cold TTFT p99 s | cloud prefills | GB from the cloud | GB between peers |\n| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in v["join"].as_array().into_iter().flatten() {
        let s = &r["stats"];
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.2} | {} | {:.2} | {:.2} |",
            r["edges"],
            r["variant"].as_str().unwrap_or("?"),
            r["cold_requests"],
            f(&r["cold_ttft_mean_s"]),
            f(&r["cold_ttft_p99_s"]),
            s["cloud_prefills"],
            f(&s["cloud_gb"]),
            f(&s["peer_gb"])
        );
    }
    let _ = writeln!(md);
}

/// `fleet-scaleout`'s section: the simulator against the fan-out and scale-out runs, then a
/// rollout at scale.
pub fn scaleout_section(dir: &Path, sub: &str, md: &mut String) {
    let Some(v) = load(dir, &format!("{sub}fleet-scaleout.json")) else {
        return;
    };
    let _ = writeln!(
        md,
        "## The fleet simulator with a store and replicas (`edgeprompt-bench fleet-scaleout`)\n\n\
         {}. The simulator against the fan-out and scale-out runs above: the store's and the \
         cloud's sending rate and time to first byte fitted on 16 and 64 edges, 256 predicted; \
         the replicas share one host (its prefill and sending), the host's sending rate fitted on \
         1 replica, 2 and 3 predicted (SmolLM2's forward passes measured, `{sub}fleet-costs-smollm2.json`). \
         Worst error of a predicted figure: **{:.1} %** (`{sub}fleet-scaleout.json`). The \
         predictions with substance are the 256-edge times; bytes follow from the object's size, \
         prefills from the prompts drawn, and on one shared host the replica count cannot move \
         the simulated p99 (the measured one moved by under 5 %).\n\n\
         | figure | measured | simulated | error | |\n| --- | --- | --- | --- | --- |",
        machine_of(&v["machine"]),
        f(&v["worst_predicted_error"]) * 100.0,
    );
    for c in v["checks"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {:.4} | {:.4} | {:+.1} % | {} |",
            c["what"].as_str().unwrap_or("?"),
            f(&c["measured"]),
            f(&c["simulated"]),
            f(&c["error"]) * 100.0,
            if c["fitted"].as_bool() == Some(true) {
                "fitted"
            } else {
                "predicted"
            },
        );
    }
    let _ = writeln!(
        md,
        "\nThen a rollout at scale: {} new prompts of {} tokens, prefilled once by the cloud, \
         reach edges that hold none (edge {}, cloud {}, costs of `fleet-grid.json`; {} link; \
         each edge one request every {:.0} s, so nearly every request fetches). Replicas have 10 \
         Gbit/s of egress each and edges name every replica; a plan keeps the mean latency within \
         1.5x a lone cold request's and every server under 80 % busy (`edgeprompt plan --rollout \
         --every-replica --store` answers the same for any load).\n\n\
         | edges | req/s | replicas, no store | GB from the replicas | TTFT p99 s | replicas with a store | store egress Gbit/s | GB from the store | GB from the replicas | TTFT p99 s |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        v["prompts"],
        v["prompt_tokens"],
        v["edge_model"].as_str().unwrap_or("?"),
        v["cloud_model"].as_str().unwrap_or("?"),
        v["link"].as_str().unwrap_or("?"),
        1.0 / f(&v["per_edge_rate"]),
    );
    for r in v["scale"].as_array().into_iter().flatten() {
        let more = |ok: &serde_json::Value| if ok.as_bool() == Some(true) { "" } else { "> " };
        let _ = writeln!(
            md,
            "| {} | {:.1} | {}{} | {:.1} | {:.2} | {} | {}{} | {:.1} | {:.2} | {:.2} |",
            r["edges"],
            f(&r["rate"]),
            more(&r["replicas_enough"]),
            r["replicas"],
            f(&r["cloud_gb"]),
            f(&r["ttft_p99_s"]),
            r["replicas_with_store"],
            more(&r["store_enough"]),
            f(&r["store_gbit"]),
            f(&r["store_gb"]),
            f(&r["cloud_gb_with_store"]),
            f(&r["ttft_p99_with_store_s"]),
        );
    }
    md.push('\n');
}
