//! `edgeprompt-bench table` (CE-LSLM Table II analogue): the same chat requests served
//! cloud-only (the whole prompt goes up the link to a server next to the cloud's KV), edge-only
//! (the edge computes everything, its cache cold) and cloud-edge (EdgePrompt: the cloud
//! prompt's KV comes down the link per codec, the private prompt stays). Per scheme: TTFT, total
//! time, the KV the edge holds, the share of user data uploaded, bytes on the link, and answer
//! quality as agreement with the single-node (edge-only) answer.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use edgeprompt_edge::scheduler::kv_bytes_per_token;
use edgeprompt_kv::Codec;
use edgeprompt_link::{Link, Profile};
use serde::Serialize;

use crate::inputs::{resolve, sharegpt};
use crate::machine::Machine;
use crate::nodes;
use crate::plot::bar_chart;
use crate::results::{f, load, machine_line};
use crate::serve::one;
use crate::workload::{Workload, WorkloadSpec};
use crate::BenchError;

pub struct Settings {
    pub model: PathBuf,
    pub model_id: String,
    /// One request per group, each on its own (cold) cloud prompt.
    pub workload: WorkloadSpec,
    pub max_tokens: usize,
    pub profile: String,
    pub codecs: Vec<Codec>,
    pub threads: usize,
    pub out: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Row {
    pub scheme: String,
    pub ttft_s: f64,
    pub total_s: f64,
    /// KV the edge holds for a request (cloud prompt + private prompt + answer).
    pub edge_kv_mb: f64,
    /// Share of the user's private message that leaves the edge.
    pub user_data_uploaded: f64,
    pub link_up_mb: f64,
    pub link_down_mb: f64,
    /// Requests whose answer is identical to the single-node answer.
    pub identical_answers: f64,
    /// Mean share of the single-node answer's tokens reproduced before the first difference.
    pub common_prefix: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub threads: usize,
    pub max_tokens: usize,
    pub profile: (String, Profile),
    pub workload: WorkloadSpec,
    pub rows: Vec<Row>,
}

/// What one scheme produced for every request.
struct Outcome {
    ttft: Vec<f64>,
    total: Vec<f64>,
    texts: Vec<String>,
    /// Prompt + completion tokens per request: what the edge's KV holds.
    context: Vec<usize>,
    up: u64,
    down: u64,
}

async fn drive(
    url: &str,
    s: &Settings,
    w: &Workload,
    link: Option<&Link>,
) -> Result<Outcome, BenchError> {
    let client = crate::http().build().unwrap_or_default();
    let (up0, down0) = link.map_or((0, 0), |l| (l.counters.up(), l.counters.down()));
    let mut o = Outcome {
        ttft: vec![],
        total: vec![],
        texts: vec![],
        context: vec![],
        up: 0,
        down: 0,
    };
    for r in &w.requests {
        let (sample, text) = one(
            &client,
            url,
            &s.model_id,
            &w.cloud[r.cloud],
            &r.user,
            s.max_tokens,
        )
        .await
        .map_err(BenchError::Data)?;
        o.ttft.push(sample.ttft_s);
        o.total.push(sample.total_s);
        o.context.push(sample.prompt_tokens + sample.tokens);
        o.texts.push(text);
    }
    if let Some(l) = link {
        o.up = l.counters.up() - up0;
        o.down = l.counters.down() - down0;
    }
    Ok(o)
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let (machine, model) = crate::setup(s.threads, &s.model)?;
    let w = Workload::build(
        &model,
        &WorkloadSpec {
            per_group: 1,
            ..s.workload.clone()
        },
    )?;
    let profile = Profile::named(&s.profile)
        .ok_or_else(|| BenchError::Data(format!("unknown profile {}", s.profile)))?;
    eprintln!(
        "machine: {}; model {}; threads {}; {} requests, each on its own cloud prompt of ~{} tokens, private ~{} tokens, max_tokens {}; link {}",
        machine, model.cfg.name, s.threads, w.requests.len(),
        s.workload.cloud_len, s.workload.edge_len, s.max_tokens, s.profile
    );
    let rt = tokio::runtime::Runtime::new()?;
    let rows = rt.block_on(async {
        let cloud_addr = nodes::cloud(&model, &nodes::numbered(&w.cloud)).await?;
        let cloud = format!("http://{cloud_addr}");
        let mut outcomes: Vec<(String, Outcome)> = Vec::new();
        // Edge-only first: its answers are the single-node reference.
        let edge = nodes::edge(&model, &s.model_id, None, Codec::F16).await?;
        outcomes.push(("edge-only".into(), drive(&edge, s, &w, None).await?));
        // Cloud-only: a server beside the cloud's KV (warmed), reached through the link.
        let beside = nodes::edge(&model, &s.model_id, Some(cloud.clone()), Codec::F16).await?;
        for sys in &w.cloud {
            one(&crate::http().build().unwrap_or_default(), &beside, &s.model_id, sys, "Hi.", 1).await.map_err(BenchError::Data)?;
        }
        let beside_addr = beside.trim_start_matches("http://").trim_end_matches("/v1").to_string();
        let link = Link::start("127.0.0.1:0", beside_addr, profile).await?;
        outcomes.push(("cloud-only".into(), drive(&format!("http://{}/v1", link.addr), s, &w, Some(&link)).await?));
        // Cloud-edge: a fresh edge (cold cache) fetching KV through the link, per codec.
        for &codec in &s.codecs {
            let link = Link::start("127.0.0.1:0", cloud_addr.to_string(), profile).await?;
            let edge = nodes::edge(&model, &s.model_id, Some(format!("http://{}", link.addr)), codec).await?;
            outcomes.push((format!("cloud-edge {}", codec.name()), drive(&edge, s, &w, Some(&link)).await?));
        }
        let reference = outcomes[0].1.texts.clone();
        let n = w.requests.len() as f64;
        let mut rows = Vec::new();
        for (name, o) in &outcomes {
            let mut identical = 0.0;
            let mut prefix = 0.0;
            for (got, want) in o.texts.iter().zip(&reference) {
                let (g, r) = (model.tokenizer.encode(got)?, model.tokenizer.encode(want)?);
                let same = g.iter().zip(&r).take_while(|(a, b)| a == b).count();
                prefix += if r.is_empty() { 1.0 } else { same as f64 / r.len() as f64 };
                identical += f64::from(u8::from(got == want));
            }
            let kv = o.context.iter().map(|t| (t * kv_bytes_per_token(&model)) as f64).sum::<f64>() / n;
            let cloud_only = name == "cloud-only";
            let r = Row {
                scheme: name.clone(),
                ttft_s: o.ttft.iter().sum::<f64>() / n,
                total_s: o.total.iter().sum::<f64>() / n,
                edge_kv_mb: if cloud_only { 0.0 } else { kv / 1e6 },
                // Cloud-only sends the user's message up; the edge's request type cannot carry
                // it (crates/protocol; proven on real traffic by edge/tests/network.rs).
                user_data_uploaded: if cloud_only { 1.0 } else { 0.0 },
                link_up_mb: o.up as f64 / 1e6,
                link_down_mb: o.down as f64 / 1e6,
                identical_answers: identical / n,
                common_prefix: prefix / n,
            };
            eprintln!(
                "  {:>17}: TTFT {:.3} s, total {:.2} s, edge KV {:.1} MB, user data up {:.0} %, link up {:.3} MB down {:.2} MB, identical {:.0} %, common prefix {:.0} %",
                r.scheme, r.ttft_s, r.total_s, r.edge_kv_mb, 100.0 * r.user_data_uploaded, r.link_up_mb, r.link_down_mb,
                100.0 * r.identical_answers, 100.0 * r.common_prefix
            );
            rows.push(r);
        }
        Ok::<_, BenchError>(rows)
    })?;
    let report = Report {
        machine,
        model: model.cfg.name.clone(),
        threads: s.threads,
        max_tokens: s.max_tokens,
        profile: (s.profile.clone(), profile),
        workload: s.workload.clone(),
        rows,
    };
    crate::write_json(&s.out, "table.json", &report)?;
    let bars = |f: &dyn Fn(&Row) -> f64| -> Vec<(String, f64)> {
        report
            .rows
            .iter()
            .map(|r| (r.scheme.clone(), f(r)))
            .collect()
    };
    let title = |what: &str| format!("{}: {what} ({} link)", report.model, s.profile);
    std::fs::write(
        s.out.join("table-ttft.svg"),
        bar_chart(&title("mean TTFT"), "seconds", &bars(&|r| r.ttft_s)),
    )?;
    std::fs::write(
        s.out.join("table-link.svg"),
        bar_chart(
            &title("bytes on the link, all requests"),
            "MB",
            &bars(&|r| r.link_up_mb + r.link_down_mb),
        ),
    )?;
    Ok(report)
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Requests, each on its own cloud prompt.
    #[arg(long, default_value_t = 8)]
    requests: usize,
    #[arg(long, default_value_t = 512)]
    cloud_len: usize,
    #[arg(long, default_value_t = 128)]
    edge_len: usize,
    #[arg(long, default_value_t = 48)]
    max_tokens: usize,
    #[arg(long, default_value = "5g")]
    profile: String,
    #[arg(long, value_delimiter = ',', default_value = "f16,int8,int4")]
    codecs: Vec<String>,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench table`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let codecs = a
        .codecs
        .iter()
        .map(|c| {
            Codec::parse(c)
                .ok_or_else(|| BenchError::Failed(format!("codec {c}: one of {}", Codec::names())))
        })
        .collect::<Result<Vec<_>, BenchError>>()?;
    let s = Settings {
        model: resolve(&a.model)?,
        model_id: a.model.clone(),
        workload: WorkloadSpec {
            sharegpt: sharegpt()?,
            groups: a.requests.max(1),
            per_group: 1,
            cloud_len: a.cloud_len,
            edge_len: a.edge_len,
            seed: a.seed,
        },
        max_tokens: a.max_tokens,
        profile: a.profile,
        codecs,
        threads: a.threads,
        out: a.out.clone(),
    };
    let r = run(&s)?;
    eprintln!(
        "wrote {} rows to {}/table.json",
        r.rows.len(),
        a.out.display()
    );
    Ok(())
}

/// The section of `docs/results.md` from `table.json`.
pub fn section(dir: &Path, md: &mut String) {
    let Some(v) = load(dir, "table.json") else {
        return;
    };
    let w = &v["workload"];
    let _ = writeln!(
        md,
        "## Cloud-only vs edge-only vs cloud-edge (`edgeprompt-bench table`, CE-LSLM Table II analogue)\n\n{}; {} \
         requests, each on its own cloud prompt of {} tokens, private prompts of {} tokens, max_tokens {}, link {}. \
         Quality: answers identical to the single-node (edge-only) answer, and the share of its tokens reproduced \
         before the first difference.\n\n| scheme | mean TTFT s | mean total s | edge KV MB per request | user data uploaded | link up MB, all requests | link down MB, all requests | identical answers | common prefix |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        machine_line(&v),
        w["groups"],
        w["cloud_len"],
        w["edge_len"],
        v["max_tokens"],
        v["profile"][0].as_str().unwrap_or("?")
    );
    for r in v["rows"].as_array().cloned().unwrap_or_default() {
        let _ = writeln!(
            md,
            "| {} | {:.3} | {:.2} | {:.1} | {:.0} % | {:.3} | {:.2} | {:.0} % | {:.0} % |",
            r["scheme"].as_str().unwrap_or("?"),
            f(&r["ttft_s"]),
            f(&r["total_s"]),
            f(&r["edge_kv_mb"]),
            100.0 * f(&r["user_data_uploaded"]),
            f(&r["link_up_mb"]),
            f(&r["link_down_mb"]),
            100.0 * f(&r["identical_answers"]),
            100.0 * f(&r["common_prefix"])
        );
    }
    let _ = writeln!(
        md,
        "\n![ttft](results/table-ttft.svg) ![link](results/table-link.svg)\n"
    );
}
