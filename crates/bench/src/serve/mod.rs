//! `edgeprompt-bench serve` (EdgePrompt Figs. 4-5): Poisson arrivals at a sweep of request
//! rates against a running OpenAI-compatible server, streamed over real loopback HTTP:
//! throughput (req/s, tok/s), normalised latency (s per output token) and TTFT p50/p99.
//! The edge server (with its cloud node) runs in this process; the same workload can be sent
//! to llama.cpp's C++ `llama-server` (`--llama-server`) in the same run.

pub mod report;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_kv::Codec;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

use crate::inputs::{resolve, sharegpt};
use crate::machine::Machine;
use crate::nodes;
use crate::plot::{line_chart, Series};
use crate::workload::{Request, Workload, WorkloadSpec};
use crate::BenchError;

pub struct Settings {
    pub model: PathBuf,
    /// The name requests carry as `model`.
    pub model_id: String,
    pub workload: WorkloadSpec,
    /// Requests per second to sweep.
    pub rates: Vec<f64>,
    pub max_tokens: usize,
    pub threads: usize,
    /// Our scheduler's batch (llama-server's slots should be the same).
    pub max_batch: usize,
    /// llama.cpp's `llama-server` on the same GGUF (`.../v1`), driven the same way.
    pub llama_server: Option<String>,
    /// How that server was started (recorded with the results).
    pub llama_server_args: Option<String>,
    pub out: PathBuf,
}

/// One request as the client saw it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sample {
    pub ttft_s: f64,
    pub total_s: f64,
    pub tokens: usize,
    /// As the server counted them (0 when it does not report usage).
    pub prompt_tokens: usize,
}

#[derive(Debug, Serialize)]
pub struct Point {
    pub server: String,
    pub rate: f64,
    pub requests: usize,
    pub failed: usize,
    pub makespan_s: f64,
    pub req_s: f64,
    pub tok_s: f64,
    /// Mean over requests of end-to-end latency / output tokens.
    pub s_per_token: f64,
    pub ttft_p50_s: f64,
    pub ttft_p99_s: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub threads: usize,
    pub max_batch: usize,
    pub max_tokens: usize,
    pub workload: WorkloadSpec,
    /// Every server and rate got private prompts of their own (no request repeated).
    pub fresh_prompts: bool,
    /// How the llama.cpp server was started, when one ran.
    pub llama_server_args: Option<String>,
    pub points: Vec<Point>,
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let (machine, model) = crate::setup(s.threads, &s.model)?;
    let w = Workload::build(&model, &s.workload)?;
    let servers_n = 1 + s.llama_server.is_some() as usize;
    // Fresh private prompts for every server and rate: a request never repeats, so no
    // server answers one from a cache its earlier rates filled.
    let mut rounds = w
        .fresh_rounds(&model, &s.workload, servers_n * s.rates.len())?
        .into_iter();
    eprintln!(
        "machine: {}; model {}; threads {}; {} requests per rate over {} cloud prompts of ~{} tokens, private ~{} tokens, max_tokens {}",
        machine, model.cfg.name, s.threads,
        w.requests.len(), w.cloud.len(), s.workload.cloud_len, s.workload.edge_len, s.max_tokens
    );
    let rt = tokio::runtime::Runtime::new()?;
    let points = rt.block_on(async {
        let servers = servers(&model, &s.model_id, &w.cloud, s.max_batch, s.llama_server.as_deref()).await?;
        let client = client()?;
        let mut points = Vec::new();
        for (name, url) in &servers {
            warm(&client, url, &s.model_id, &w.cloud).await?;
            for &rate in &s.rates {
                let requests = rounds.next().unwrap_or_default();
                let p = sweep_point(&client, name, url, &s.model_id, &w.cloud, &requests, rate, s.max_tokens, s.workload.seed).await;
                eprintln!(
                    "  {name:>10} {rate:5.2} req/s: {:.2} req/s done, {:.1} tok/s, {:.3} s/token, TTFT p50 {:.2} s p99 {:.2} s, {} failed",
                    p.req_s, p.tok_s, p.s_per_token, p.ttft_p50_s, p.ttft_p99_s, p.failed
                );
                points.push(p);
            }
        }
        Ok::<_, BenchError>(points)
    })?;
    let report = Report {
        machine,
        model: model.cfg.name.clone(),
        threads: s.threads,
        max_batch: s.max_batch,
        max_tokens: s.max_tokens,
        workload: s.workload.clone(),
        fresh_prompts: true,
        llama_server_args: s.llama_server_args.clone(),
        points,
    };
    write_outputs(&report, s)?;
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
async fn sweep_point(
    client: &reqwest::Client,
    name: &str,
    url: &str,
    model_id: &str,
    cloud: &[String],
    requests: &[Request],
    rate: f64,
    max_tokens: usize,
    seed: u64,
) -> Point {
    // Poisson arrivals: exponential gaps with mean 1 / rate, seeded.
    let mut rng = StdRng::seed_from_u64(seed ^ rate.to_bits());
    let mut at = 0.0;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(requests.len());
    for r in requests {
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            start + Duration::from_secs_f64(at),
        ))
        .await;
        let (client, url, model_id) = (client.clone(), url.to_string(), model_id.to_string());
        let (sys, user) = (cloud[r.cloud].clone(), r.user.clone());
        tasks.push(tokio::spawn(async move {
            one(&client, &url, &model_id, &sys, &user, max_tokens).await
        }));
        at += -(1.0 - rng.random::<f64>()).ln() / rate;
    }
    let mut samples = Vec::new();
    let mut failed = 0;
    for t in tasks {
        match t.await {
            Ok(Ok((s, _))) if s.tokens > 0 => samples.push(s),
            Ok(Err(e)) => {
                failed += 1;
                eprintln!("    request failed: {e}");
            }
            _ => failed += 1,
        }
    }
    let makespan = start.elapsed().as_secs_f64();
    let tokens: usize = samples.iter().map(|s| s.tokens).sum();
    let mut ttft: Vec<f64> = samples.iter().map(|s| s.ttft_s).collect();
    ttft.sort_by(f64::total_cmp);
    let n = samples.len().max(1) as f64;
    Point {
        server: name.into(),
        rate,
        requests: requests.len(),
        failed,
        makespan_s: makespan,
        req_s: samples.len() as f64 / makespan,
        tok_s: tokens as f64 / makespan,
        s_per_token: samples
            .iter()
            .map(|s| s.total_s / s.tokens as f64)
            .sum::<f64>()
            / n,
        ttft_p50_s: percentile(&ttft, 0.50),
        ttft_p99_s: percentile(&ttft, 0.99),
    }
}

/// The servers a run drives, by name and `/v1` URL: our edge (batch `max_batch`) behind a
/// cloud node serving `cloud`, and llama.cpp's server at `llama` when given.
pub async fn servers(
    model: &std::sync::Arc<edgeprompt_engine::Model>,
    model_id: &str,
    cloud: &[String],
    max_batch: usize,
    llama: Option<&str>,
) -> Result<Vec<(String, String)>, BenchError> {
    let node = nodes::cloud(model, &nodes::numbered(cloud)).await?;
    let scheduler = SchedulerConfig {
        max_batch,
        ..Default::default()
    };
    let url = Some(format!("http://{node}"));
    let ours = nodes::edge_with(model, model_id, url, Codec::F16, None, scheduler).await?;
    let mut servers = vec![("edgeprompt".to_string(), ours)];
    if let Some(url) = llama {
        servers.push(("llama-server".into(), url.trim_end_matches('/').to_string()));
    }
    Ok(servers)
}

/// Every cloud prompt once, before anything is timed (the edge fetches its KV; llama.cpp
/// fills its cache).
pub async fn warm(
    client: &reqwest::Client,
    url: &str,
    model_id: &str,
    cloud: &[String],
) -> Result<(), BenchError> {
    for sys in cloud {
        one(client, url, model_id, sys, "Hello.", 2)
            .await
            .map_err(BenchError::Data)?;
    }
    Ok(())
}

/// An error and what caused it, on one line.
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut at = e.source();
    while let Some(s) = at {
        out.push_str(&format!(": {s}"));
        at = s.source();
    }
    out
}

/// The load generators' HTTP client: a connection per request (loopback, well under a
/// millisecond). llama-server may close a kept-alive connection just as a request is sent on
/// it, and that request fails without reaching the server.
pub fn client() -> Result<reqwest::Client, BenchError> {
    crate::http()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| BenchError::Data(e.to_string()))
}

/// The `q` quantile of sorted values (nearest rank); NaN for none.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One streamed chat request: time to the first content, total time, tokens; and the text.
pub async fn one(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    system: &str,
    user: &str,
    max_tokens: usize,
) -> Result<(Sample, String), String> {
    one_with_block(client, url, model, system, user, max_tokens)
        .await
        .map(|(s, t, _)| (s, t))
}

/// `one`, with the answer's `edgeprompt` block (null from servers that send none).
pub async fn one_with_block(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    system: &str,
    user: &str,
    max_tokens: usize,
) -> Result<(Sample, String, Value), String> {
    let messages =
        json!([{"role": "system", "content": system}, {"role": "user", "content": user}]);
    chat(client, url, model, messages, max_tokens, None).await
}

/// One streamed, greedy chat completion of `messages` (with `cache_salt` when given): the
/// sample, the answer's text and its `edgeprompt` block.
pub async fn chat(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    messages: Value,
    max_tokens: usize,
    cache_salt: Option<&str>,
) -> Result<(Sample, String, Value), String> {
    let mut body = json!({
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(salt) = cache_salt {
        body["cache_salt"] = json!(salt);
    }
    let t0 = Instant::now();
    let mut resp = client
        .post(format!("{url}/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| with_sources(&e))?;
    if !resp.status().is_success() {
        let status = resp.status();
        return Err(format!(
            "{status}: {}",
            resp.text().await.unwrap_or_default()
        ));
    }
    let (mut buf, mut ttft, mut chunks, mut usage) = (String::new(), None, 0, None);
    let (mut text, mut prompt_tokens, mut block) = (String::new(), 0, Value::Null);
    while let Some(bytes) = resp.chunk().await.map_err(|e| e.to_string())? {
        buf.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(i) = buf.find('\n') {
            let line: String = buf.drain(..=i).collect();
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data.trim()) else {
                continue;
            };
            if v["edgeprompt"].is_object() {
                block = v["edgeprompt"].clone();
            }
            let content = v["choices"][0]["delta"]["content"].as_str().unwrap_or("");
            if !content.is_empty() {
                ttft.get_or_insert(t0.elapsed().as_secs_f64());
                chunks += 1;
                text.push_str(content);
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                usage = Some(n as usize);
                prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as usize;
            }
        }
    }
    let sample = Sample {
        ttft_s: ttft.unwrap_or(f64::NAN),
        total_s: t0.elapsed().as_secs_f64(),
        tokens: usage.unwrap_or(chunks),
        prompt_tokens,
    };
    Ok((sample, text, block))
}

/// Files of a model's run: `serve.json` etc. for SmolLM2 (the default workload), else
/// `serve-<model>.json` etc., so one results folder holds several models (`file_part`).
pub fn file_tag(model_id: &str) -> String {
    match model_id {
        "smollm2" => String::new(),
        m => format!("-{}", crate::file_part(m)),
    }
}

fn write_outputs(r: &Report, s: &Settings) -> Result<(), BenchError> {
    let tag = file_tag(&s.model_id);
    crate::write_json(&s.out, &format!("serve{tag}.json"), r)?;
    let servers: Vec<&str> = {
        let mut v: Vec<&str> = r.points.iter().map(|p| p.server.as_str()).collect();
        v.dedup();
        v
    };
    let series = |f: &dyn Fn(&Point) -> f64, dashed: bool, suffix: &str| -> Vec<Series> {
        servers
            .iter()
            .map(|name| Series {
                name: format!("{name}{suffix}"),
                points: r
                    .points
                    .iter()
                    .filter(|p| p.server == *name)
                    .map(|p| (p.rate, f(p)))
                    .collect(),
                dashed,
            })
            .collect()
    };
    let title = |what: &str| {
        format!(
            "{}: {what} against request rate (Poisson arrivals)",
            r.model
        )
    };
    std::fs::write(
        s.out.join(format!("serve{tag}-latency.svg")),
        line_chart(
            &title("normalised latency"),
            "requests/s",
            "s per output token",
            &series(&|p| p.s_per_token, false, ""),
        ),
    )?;
    let mut ttft = series(&|p| p.ttft_p50_s, false, " p50");
    ttft.extend(series(&|p| p.ttft_p99_s, true, " p99"));
    std::fs::write(
        s.out.join(format!("serve{tag}-ttft.svg")),
        line_chart(&title("TTFT"), "requests/s", "seconds", &ttft),
    )?;
    std::fs::write(
        s.out.join(format!("serve{tag}-throughput.svg")),
        line_chart(
            &title("throughput"),
            "requests/s offered",
            "output tokens/s",
            &series(&|p| p.tok_s, false, ""),
        ),
    )?;
    Ok(())
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Offered request rates (req/s).
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1,2")]
    rates: Vec<f64>,
    /// Distinct cloud prompts.
    #[arg(long, default_value_t = 4)]
    groups: usize,
    /// Requests per cloud prompt (per rate), each with a private prompt no other request has.
    #[arg(long, default_value_t = 6)]
    per_group: usize,
    #[arg(long, default_value_t = 512)]
    cloud_len: usize,
    #[arg(long, default_value_t = 128)]
    edge_len: usize,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Our edge's batch; llama-server's slots should be the same (scripts/bench_serve.sh).
    #[arg(long, default_value_t = 8)]
    max_batch: usize,
    /// llama.cpp's OpenAI-compatible server on the same GGUF, e.g. http://127.0.0.1:8090/v1
    /// (scripts/bench_serve.sh starts one).
    #[arg(long)]
    llama_server: Option<String>,
    /// How that server was started, recorded with the results (scripts/bench_serve.sh sets it).
    #[arg(long)]
    llama_server_args: Option<String>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench serve`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let s = Settings {
        model: resolve(&a.model)?,
        model_id: a.model.clone(),
        workload: WorkloadSpec {
            sharegpt: sharegpt()?,
            groups: a.groups.max(1),
            per_group: a.per_group.max(1),
            cloud_len: a.cloud_len,
            edge_len: a.edge_len,
            seed: a.seed,
        },
        rates: a.rates,
        max_tokens: a.max_tokens,
        threads: a.threads,
        max_batch: a.max_batch.max(1),
        llama_server: a.llama_server,
        llama_server_args: a.llama_server_args,
        out: a.out.clone(),
    };
    let r = run(&s)?;
    let tag = file_tag(&s.model_id);
    eprintln!(
        "wrote {} points to {}/serve{tag}.json and serve{tag}-*.svg",
        r.points.len(),
        a.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::file_tag;

    #[test]
    fn a_model_path_tags_one_file_in_the_results_folder() {
        assert_eq!(file_tag("smollm2"), "");
        assert_eq!(file_tag("qwen05"), "-qwen05");
        let tag = file_tag("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert_eq!(tag, "-models_SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(std::path::Path::new(&format!("serve{tag}.json"))
            .parent()
            .is_some_and(|p| p.as_os_str().is_empty()));
    }
}
