//! `edgeprompt-bench fleet` (CE-LSLM Fig. 7, measured small and simulated): one cloud node
//! with the large model and N edge servers with the small one (CE-LSLM), each a real process
//! on its own core behind its own shaped link, under seeded Poisson load of ShareGPT chats
//! over shared cloud prompts; against cloud-only serving of every request by the large model
//! on the same machine (our server, and llama.cpp's `llama-server`). Every request's TTFT,
//! latency and KV source; every node's CPU time. The same traces then run through the
//! simulator (`edgeprompt_planner::fleet`) with costs fitted on this machine
//! (`fleet-costs`), and its error against the measurement is the validation.

pub mod costs;
pub mod grid;
pub mod queue;
mod real;
pub mod report;
pub mod scaleout;
pub mod sim;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprompt_planner::fleet::model::{Costs, Kv};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::inputs::{beside, resolve, sharegpt};
use crate::workload::{Workload, WorkloadSpec};
use crate::BenchError;
use real::{cpu_secs, Launch, Nodes};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Setup {
    /// A cloud node and this many edges.
    EdgePrompt(usize),
    CloudOnly,
    LlamaServer,
}

impl Setup {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "cloud-only" => Some(Self::CloudOnly),
            "llama-server" => Some(Self::LlamaServer),
            _ => s
                .strip_prefix("edgeprompt")
                .and_then(|n| n.trim_start_matches(['-', ':']).parse().ok())
                .filter(|&n: &usize| n > 0)
                .map(Self::EdgePrompt),
        }
    }

    pub fn name(&self) -> String {
        match self {
            Self::EdgePrompt(n) => format!("edgeprompt-{n}"),
            Self::CloudOnly => "cloud-only".into(),
            Self::LlamaServer => "llama-server".into(),
        }
    }
}

pub struct Settings {
    pub edgeprompt: PathBuf,
    /// This benchmark's own binary (it runs `fleet-costs` pinned).
    pub bench: PathBuf,
    pub cloud_model: PathBuf,
    pub cloud_model_id: String,
    pub edge_model: PathBuf,
    pub edge_model_id: String,
    /// CE-LSLM adapters (when the edge model differs from the cloud's).
    pub adapters: Option<PathBuf>,
    /// The edge takes the cloud prompt's layers from this one on from the cloud.
    pub split: usize,
    pub sharegpt: PathBuf,
    pub prompts: usize,
    pub prefix_len: usize,
    pub private_len: usize,
    pub max_tokens: usize,
    pub link: String,
    pub setups: Vec<Setup>,
    /// Offered requests per second (over the whole fleet).
    pub rates: Vec<f64>,
    /// Seconds of arrivals per rate.
    pub secs: f64,
    pub seed: u64,
    pub llama_server: Option<PathBuf>,
    /// Rates llama-server gets (it saturates far below ours; its overloaded points drain for
    /// minutes): `rates` when empty.
    pub llama_rates: Vec<f64>,
    /// Parallel sequences of llama-server.
    pub slots: usize,
    /// Timings per calibration pass.
    pub repeats: usize,
    pub dir: PathBuf,
    pub out: PathBuf,
}

/// One request as the client saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub at: f64,
    pub edge: usize,
    pub prompt: usize,
    /// `None`: the request failed (its error in `error`).
    pub ttft_s: Option<f64>,
    pub latency_s: Option<f64>,
    pub tokens: usize,
    pub private_tokens: usize,
    pub cloud_tokens: usize,
    /// Where the cloud prompt's KV came from (the server's `edgeprompt` block).
    pub source: Option<String>,
    pub bytes_down: u64,
    pub error: Option<String>,
}

/// What a set of outcomes comes to.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    pub requests: usize,
    pub failed: usize,
    /// Completed requests per second, from the first arrival to the last completion.
    pub req_s: f64,
    pub mean_latency_s: f64,
    /// Mean of latency / output tokens.
    pub mean_s_per_token: f64,
    pub mean_ttft_s: f64,
    pub ttft_p99_s: f64,
    /// Requests by KV source.
    pub sources: BTreeMap<String, usize>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct NodeUse {
    pub node: String,
    pub cpu_secs: f64,
    /// Requests it served and the KV bytes they fetched (servers only).
    #[serde(default)]
    pub requests: usize,
    #[serde(default)]
    pub kv_bytes: u64,
    /// Its queue, sampled from its `/metrics` (servers only; the cloud node of an EdgePrompt
    /// fleet has none).
    #[serde(default)]
    pub queue: Option<queue::Queue>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Point {
    pub setup: String,
    pub rate: f64,
    pub measured: Summary,
    /// The simulator on the same trace (absent for llama-server: not our engine's costs).
    pub simulated: Option<Summary>,
    /// (simulated - measured) / measured mean latency.
    pub latency_error: Option<f64>,
    pub nodes: Vec<NodeUse>,
    pub records: Vec<Record>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Calibration {
    pub node: String,
    pub model: String,
    pub cores: usize,
    pub costs: Costs,
    pub fit_error: f64,
}

/// What a real server adds to the engine's fitted costs (signed), from lone requests on it after the
/// warm-up (no load): per decode step, and per request before its prompt is computed (HTTP,
/// chat template, tokenizing, admission).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Overhead {
    pub setup: String,
    pub step_secs: f64,
    /// Per sequence in a decode step, under load.
    #[serde(default)]
    pub seq_secs: f64,
    pub request_secs: f64,
    pub probes: usize,
    /// Requests sent at once (`BURST` to every server) to time the fleet under load, and when
    /// a server's last one ended (the mean over the servers).
    #[serde(default)]
    pub burst: usize,
    #[serde(default)]
    pub burst_secs: f64,
}

/// Requests in the load probe (the edge's batch is 32).
const BURST: usize = 24;

#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    /// `Machine`, kept as JSON so a saved report reads back for `--replay`.
    pub machine: serde_json::Value,
    pub cloud_model: String,
    pub edge_model: String,
    pub split: usize,
    pub link: String,
    pub prompts: usize,
    pub prefix_len: usize,
    pub private_len: usize,
    pub max_tokens: usize,
    pub secs_per_rate: f64,
    pub seed: u64,
    pub llama_server_args: Option<String>,
    pub calibration: Vec<Calibration>,
    pub overheads: Vec<Overhead>,
    /// Wire bytes per cloud-prompt token the edges measured.
    pub kv_bytes_per_token: f64,
    pub points: Vec<Point>,
    /// Setups that could not be measured, and why.
    #[serde(default)]
    pub failures: Vec<Failure>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Failure {
    pub setup: String,
    pub error: String,
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let machine = crate::start(1);
    let cores = machine.cores.max(1);
    let edge_model = Arc::new(edgeprompt_engine::Model::load(&s.edge_model)?);
    let n_layer = edge_model.cfg.n_layer;
    let max_rate = s.rates.iter().copied().fold(0.0, f64::max);
    let per_group = ((max_rate * s.secs * 1.5) as usize / s.prompts.max(1)).max(4);
    let w = Workload::build(
        &edge_model,
        &WorkloadSpec {
            sharegpt: s.sharegpt.clone(),
            groups: s.prompts,
            per_group,
            cloud_len: s.prefix_len,
            edge_len: s.private_len,
            seed: s.seed,
        },
    )?;
    eprintln!(
        "machine: {machine}; cloud {} edge {} (split {}), {} cloud prompts of {} tokens, private {} tokens, max_tokens {}, link {}, {} s per rate",
        s.cloud_model_id, s.edge_model_id, s.split, s.prompts, s.prefix_len, s.private_len,
        s.max_tokens, s.link, s.secs
    );
    let calibration = calibrate(s, cores)?;
    let rt = tokio::runtime::Runtime::new()?;
    let t0 = Instant::now();
    let launch = Launch {
        edgeprompt: &s.edgeprompt,
        dir: &s.dir,
        t0,
    };
    let toml = real::prompts_toml(&s.dir, &w.cloud)?;
    let mut points = Vec::new();
    let mut llama_args = None;
    let mut kv_bytes = Vec::new();
    let mut overheads = Vec::new();
    let mut failures = Vec::new();
    for setup in &s.setups {
        let launched = match *setup {
            Setup::EdgePrompt(n) => launch
                .edgeprompt(
                    // Names, not paths: a server calls itself what it was started with.
                    std::path::Path::new(&s.cloud_model_id),
                    std::path::Path::new(&s.edge_model_id),
                    s.adapters.as_deref(),
                    s.split,
                    &toml,
                    n,
                    &s.link,
                    cores,
                )
                .map(|x| (x, s.edge_model_id.as_str())),
            Setup::CloudOnly => launch
                .cloud_only(std::path::Path::new(&s.cloud_model_id), cores)
                .map(|x| (x, s.cloud_model_id.as_str())),
            Setup::LlamaServer => {
                let Some(server) = &s.llama_server else {
                    eprintln!("  no --llama-server binary: skipping that setup");
                    continue;
                };
                launch
                    .llama_server(server, &s.cloud_model, &s.cloud_model_id, s.slots, cores)
                    .map(|(n, args)| {
                        llama_args = Some(args);
                        (n, s.cloud_model_id.as_str())
                    })
            }
        };
        // A setup that fails is reported with its servers' last words; the others go on.
        let got = launched.and_then(|(nodes, model_id)| {
            measure(&rt, s, &w, &calibration, setup, &nodes, model_id).map_err(|e| {
                let tails: Vec<String> = nodes.procs.iter().map(|p| p.tail(8)).collect();
                BenchError::Data(format!(
                    "{e}; the servers' last lines:\n{}",
                    tails.join("\n")
                ))
            })
        });
        match got {
            Ok(m) => {
                kv_bytes.extend(m.kv_bytes);
                overheads.extend(m.overhead);
                points.extend(m.points);
            }
            Err(e) => {
                eprintln!("{}: failed: {e}", setup.name());
                failures.push(Failure {
                    setup: setup.name(),
                    error: e.to_string(),
                });
            }
        }
    }
    if points.is_empty() && !failures.is_empty() {
        let why: Vec<String> = failures
            .iter()
            .map(|f| format!("{}: {}", f.setup, f.error))
            .collect();
        return Err(BenchError::Data(format!(
            "no setup could be measured:\n{}",
            why.join("\n")
        )));
    }
    let kv_bytes_per_token = if kv_bytes.is_empty() {
        0.0
    } else {
        kv_bytes.iter().sum::<f64>() / kv_bytes.len() as f64
    };
    let mut report = Report {
        machine: serde_json::to_value(&machine)?,
        cloud_model: s.cloud_model_id.clone(),
        edge_model: s.edge_model_id.clone(),
        split: s.split,
        link: s.link.clone(),
        prompts: s.prompts,
        prefix_len: s.prefix_len,
        private_len: s.private_len,
        max_tokens: s.max_tokens,
        secs_per_rate: s.secs,
        seed: s.seed,
        llama_server_args: llama_args,
        calibration,
        overheads,
        failures,
        kv_bytes_per_token,
        points,
    };
    sim::replay(&mut report, n_layer)?;
    crate::write_json(&s.out, "fleet.json", &report)?;
    Ok(report)
}

/// A saved run's traces through the simulator again (after a change to the model or its
/// costs): `simulated` and `latency_error` are rewritten.
pub fn replay(file: &std::path::Path, edge_model: &std::path::Path) -> Result<Report, BenchError> {
    let mut r: Report = serde_json::from_slice(&std::fs::read(file)?)?;
    let n_layer = edgeprompt_engine::Model::load(edge_model)?.cfg.n_layer;
    sim::replay(&mut r, n_layer)?;
    std::fs::write(file, serde_json::to_string_pretty(&r)?)?;
    Ok(r)
}

/// Costs of each node kind, each fitted in its own process pinned to the node's cores.
fn calibrate(s: &Settings, cores: usize) -> Result<Vec<Calibration>, BenchError> {
    let mut kinds: Vec<(&str, &PathBuf, usize)> = Vec::new();
    if s.setups.iter().any(|x| matches!(x, Setup::EdgePrompt(_))) {
        kinds.push(("edge", &s.edge_model, 1));
        kinds.push(("cloud", &s.cloud_model, 1));
    }
    if s.setups.contains(&Setup::CloudOnly) {
        kinds.push(("cloud-only", &s.cloud_model, cores));
    }
    let mut out = Vec::new();
    for (node, model, n) in kinds {
        eprintln!("calibrating {node}: {} on {n} core(s)", model.display());
        let file = s.dir.join(format!("costs-{node}.json"));
        let f = grid::fitted(&s.bench, model, n, s.repeats, &file)?;
        out.push(Calibration {
            node: node.into(),
            model: f.model,
            cores: f.threads,
            costs: f.costs,
            fit_error: f.fit_error,
        });
    }
    Ok(out)
}

/// What one setup measured.
struct Measured {
    points: Vec<Point>,
    overhead: Option<Overhead>,
    kv_bytes: Vec<f64>,
}

/// One launched setup: the warm-up, the probe (ours), then each rate's load.
fn measure(
    rt: &tokio::runtime::Runtime,
    s: &Settings,
    w: &Workload,
    calibration: &[Calibration],
    setup: &Setup,
    nodes: &Nodes,
    model_id: &str,
) -> Result<Measured, BenchError> {
    eprintln!("{}: up", setup.name());
    // Warm: every cloud prompt once at every server (the edges fetch, caches fill).
    let kv_bytes = rt.block_on(warm_up(nodes, model_id, w))?;
    let mut overhead = None;
    if *setup != Setup::LlamaServer {
        let node = if matches!(setup, Setup::EdgePrompt(_)) {
            "edge"
        } else {
            "cloud-only"
        };
        let costs = calibration
            .iter()
            .find(|c| c.node == node)
            .map(|c| c.costs)
            .ok_or_else(|| BenchError::Data(format!("no {node} calibration")))?;
        let o = rt.block_on(probe(nodes, model_id, w, s, &costs, setup))?;
        eprintln!(
            "  {}: the server adds {:+.1} ms a decode step, {:+.1} ms a request ({} lone requests) and {:+.2} ms a sequence in a step under load ({} at once, {:.1} s) to the engine's costs",
            setup.name(), o.step_secs * 1e3, o.request_secs * 1e3, o.probes, o.seq_secs * 1e3, o.burst, o.burst_secs
        );
        overhead = Some(o);
    }
    let mut points = Vec::new();
    let rates = match setup {
        Setup::LlamaServer if !s.llama_rates.is_empty() => &s.llama_rates,
        _ => &s.rates,
    };
    for &rate in rates {
        let before: Vec<f64> = usage(nodes);
        let (records, queues) = rt.block_on(watched_load(nodes, model_id, w, rate, s))?;
        let after: Vec<f64> = usage(nodes);
        let measured = summarize(&records);
        // The nodes, then this process: the load's client, unpinned, on the nodes' cores.
        let node_use = nodes
            .named
            .iter()
            .map(|(name, _)| name.as_str())
            .chain(["client"])
            .zip(before.iter().zip(&after))
            .enumerate()
            .map(|(k, (name, (b, a)))| {
                let server = nodes.url_node.iter().position(|&n| n == k);
                let mine = records.iter().filter(|r| Some(r.edge) == server);
                NodeUse {
                    node: name.to_string(),
                    cpu_secs: a - b,
                    requests: mine.clone().count(),
                    kv_bytes: mine.map(|r| r.bytes_down).sum(),
                    queue: server.and_then(|i| queues.get(i).cloned().flatten()),
                }
            })
            .collect();
        eprintln!(
            "  {:>14} {rate:6.2} req/s offered: {:5.2} req/s done, latency {:6.2} s, {:.3} s/token, TTFT {:.2} s (p99 {:.2}), {} failed, sources {:?}",
            setup.name(), measured.req_s, measured.mean_latency_s, measured.mean_s_per_token,
            measured.mean_ttft_s, measured.ttft_p99_s, measured.failed, measured.sources
        );
        points.push(Point {
            setup: setup.name(),
            rate,
            measured,
            simulated: None,
            latency_error: None,
            nodes: node_use,
            records,
        });
    }
    Ok(Measured {
        points,
        overhead,
        kv_bytes,
    })
}

/// CPU seconds of each named node, then of this process.
fn usage(n: &Nodes) -> Vec<f64> {
    n.named
        .iter()
        .map(|(_, i)| n.procs[*i].pid())
        .chain([Some(std::process::id())])
        .map(|pid| pid.and_then(cpu_secs).unwrap_or(0.0))
        .collect()
}

/// Each cloud prompt once at each server; the wire bytes per cloud-prompt token of the fetches.
async fn warm_up(n: &Nodes, model: &str, w: &Workload) -> Result<Vec<f64>, BenchError> {
    let client = crate::http().build().unwrap_or_default();
    let mut per_token = Vec::new();
    for url in &n.urls {
        for sys in &w.cloud {
            // A server just up may drop its first connections: three tries, 2 s apart.
            let mut tries = 0;
            let (_, _, block) = loop {
                match crate::serve::one_with_block(&client, url, model, sys, "Hello.", 2).await {
                    Ok(x) => break x,
                    Err(e) if tries == 2 => return Err(BenchError::Data(e)),
                    Err(_) => tries += 1,
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            };
            let c = &block["cloud_prompt"];
            if c["source"] == "cloud" {
                let (b, t) = (c["bytes_down"].as_f64(), c["tokens"].as_f64());
                if let (Some(b), Some(t)) = (b, t.filter(|&t| t > 0.0)) {
                    per_token.push(b / t);
                }
            }
        }
    }
    Ok(per_token)
}

/// Lone requests, one after another, at the first server, then a burst at every server at
/// once: what the server adds to the fitted costs per step, per request, and per sequence under load.
async fn probe(
    n: &Nodes,
    model: &str,
    w: &Workload,
    s: &Settings,
    costs: &Costs,
    setup: &Setup,
) -> Result<Overhead, BenchError> {
    use edgeprompt_planner::fleet::server::{Batcher, Job, StepCost, Work};
    let client = crate::http().build().unwrap_or_default();
    let ask = |server: usize, r: &crate::workload::Request| {
        let (client, url, model) = (client.clone(), n.urls[server].clone(), model.to_string());
        let (sys, user, max) = (w.cloud[r.cloud].clone(), r.user.clone(), s.max_tokens);
        async move {
            crate::serve::one_with_block(&client, &url, &model, &sys, &user, max)
                .await
                .map_err(BenchError::Data)
        }
    };
    // (measured - fitted) seconds a decode step, per batch size; before the first token; and
    // the fitted prompt pass.
    let step_excess = |sample: &crate::serve::Sample, block: &serde_json::Value, b: usize| {
        let cloud = block["cloud_prompt"]["tokens"].as_u64().unwrap_or(0) as usize;
        let private = block["private_tokens"].as_u64().unwrap_or(0) as usize;
        if sample.tokens < 2 || !sample.ttft_s.is_finite() {
            return None;
        }
        let context = (cloud + private + sample.tokens / 2) as f64;
        let step = costs.step_secs(&Work {
            decoding: b,
            context: b as f64 * context,
            ..Work::default()
        });
        let measured = (sample.total_s - sample.ttft_s) / (sample.tokens - 1) as f64;
        let prefill = costs.prefill_secs(private, cloud);
        Some((measured - step, sample.ttft_s - prefill, prefill))
    };
    let (mut one, mut request, mut probes, mut least) = (0.0, 0.0, 0, f64::INFINITY);
    let picks: Vec<&crate::workload::Request> = w.requests.iter().rev().take(4).collect();
    for r in &picks {
        let (sample, _, block) = ask(0, r).await?;
        if let Some((x, q, prefill)) = step_excess(&sample, &block, 1) {
            one += x;
            request += q;
            least = least.min(prefill);
            probes += 1;
        }
    }
    if probes == 0 {
        return Err(BenchError::Data("no lone request gave two tokens".into()));
    }
    // Signed: the server may be faster than the engine's fit was (the fit moves a few ms from
    // run to run on a shared host), but a step never costs less than nothing.
    let one = (one / probes as f64).max(-costs.fixed);
    // A burst of different requests at once, a batch's worth at every server: the fleet
    // under load, its servers sharing this host's memory bandwidth as they do under the load.
    // The per-sequence cost the engine's fit misses there is the one that makes the same
    // bursts, simulated, end when they did (on average over the servers).
    let servers = n.urls.len();
    let burst: Vec<_> = (0..servers * BURST)
        .map(|k| {
            let r = &w.requests[k % w.requests.len()];
            (k / BURST, tokio::spawn(ask(k / BURST, r)))
        })
        .collect();
    let (mut jobs, mut makespan) = (vec![Vec::new(); servers], vec![0.0f64; servers]);
    for (server, got) in burst {
        let (sample, _, block) = got.await.map_err(|e| BenchError::Data(e.to_string()))??;
        makespan[server] = makespan[server].max(sample.total_s);
        jobs[server].push(Job {
            tag: (),
            prompt: block["private_tokens"].as_u64().unwrap_or(0) as usize,
            output: sample.tokens.max(1),
            prefix: block["cloud_prompt"]["tokens"].as_u64().unwrap_or(0) as usize,
        });
    }
    let mean_makespan = makespan.iter().sum::<f64>() / servers.max(1) as f64;
    let request = (request / probes as f64).max(-least);
    let base = Costs {
        fixed: costs.fixed + one,
        ..*costs
    };
    // Each server's burst drained by the simulated batcher, averaged over the servers.
    let drain = |extra: f64| {
        let c = Costs {
            per_seq: base.per_seq + extra,
            ..base
        };
        let mut total = 0.0;
        for js in &jobs {
            let mut b = Batcher::new(32, 256);
            for j in js {
                b.arrive(j.clone());
            }
            let mut t = request;
            while let Some(st) = b.step(&c) {
                t += st.secs;
            }
            total += t;
        }
        total / servers.max(1) as f64
    };
    let (mut lo, mut hi) = (-base.per_seq, 0.5);
    if drain(lo) >= mean_makespan {
        hi = lo;
    }
    for _ in 0..40 {
        let mid = (lo + hi) / 2.0;
        if drain(mid) < mean_makespan {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let seq = hi;
    Ok(Overhead {
        setup: setup.name(),
        step_secs: one,
        seq_secs: seq,
        request_secs: request,
        probes,
        burst: jobs.iter().map(Vec::len).sum(),
        burst_secs: mean_makespan,
    })
}

/// `load`, with every server's queue sampled while it runs.
async fn watched_load(
    n: &Nodes,
    model: &str,
    w: &Workload,
    rate: f64,
    s: &Settings,
) -> Result<(Vec<Record>, Vec<Option<queue::Queue>>), BenchError> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let servers = n
        .urls
        .iter()
        .map(|u| u.trim_end_matches("/v1").to_string())
        .collect();
    let watcher = tokio::spawn(queue::watch(servers, stop.clone()));
    let records = load(n, model, w, rate, s).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let queues = watcher.await.map_err(|e| BenchError::Data(e.to_string()))?;
    Ok((records?, queues))
}

/// Seeded Poisson arrivals at `rate` for `s.secs`, each to a random server.
async fn load(
    n: &Nodes,
    model: &str,
    w: &Workload,
    rate: f64,
    s: &Settings,
) -> Result<Vec<Record>, BenchError> {
    let mut rng = StdRng::seed_from_u64(s.seed ^ rate.to_bits());
    let client = crate::http()
        .timeout(Duration::from_secs(900))
        .build()
        .map_err(|e| BenchError::Data(e.to_string()))?;
    let start = Instant::now();
    let mut at = -(1.0 - rng.random::<f64>()).ln() / rate;
    let mut tasks = Vec::new();
    let mut i = 0;
    while at < s.secs {
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            start + Duration::from_secs_f64(at),
        ))
        .await;
        let r = &w.requests[i % w.requests.len()];
        let edge = rng.random_range(0..n.urls.len());
        let (client, url, model) = (client.clone(), n.urls[edge].clone(), model.to_string());
        let (sys, user, max) = (w.cloud[r.cloud].clone(), r.user.clone(), s.max_tokens);
        let prompt = r.cloud;
        tasks.push(tokio::spawn(async move {
            let sent = start.elapsed().as_secs_f64();
            let got = crate::serve::one_with_block(&client, &url, &model, &sys, &user, max).await;
            (sent, edge, prompt, got)
        }));
        at += -(1.0 - rng.random::<f64>()).ln() / rate;
        i += 1;
    }
    let mut records = Vec::with_capacity(tasks.len());
    for t in tasks {
        let (at, edge, prompt, got) = t.await.map_err(|e| BenchError::Data(e.to_string()))?;
        records.push(match got {
            Ok((sample, _, block)) => {
                let c = &block["cloud_prompt"];
                let cloud_tokens = c["tokens"].as_u64().unwrap_or(0) as usize;
                let private = block["private_tokens"]
                    .as_u64()
                    .map(|p| p as usize)
                    .unwrap_or(sample.prompt_tokens.saturating_sub(cloud_tokens));
                Record {
                    at,
                    edge,
                    prompt,
                    ttft_s: Some(sample.ttft_s).filter(|t| t.is_finite()),
                    latency_s: Some(sample.total_s),
                    tokens: sample.tokens,
                    private_tokens: private,
                    cloud_tokens,
                    source: c["source"].as_str().map(String::from),
                    bytes_down: c["bytes_down"].as_u64().unwrap_or(0),
                    error: None,
                }
            }
            Err(e) => Record {
                at,
                edge,
                prompt,
                ttft_s: None,
                latency_s: None,
                tokens: 0,
                private_tokens: 0,
                cloud_tokens: 0,
                source: None,
                bytes_down: 0,
                error: Some(e),
            },
        });
    }
    Ok(records)
}

/// One outcome to summarise: a failure has no latency.
pub struct Outcome {
    pub at: f64,
    pub ttft: Option<f64>,
    pub latency: Option<f64>,
    pub tokens: usize,
    pub source: String,
}

pub fn summarize_with(rows: &[Outcome]) -> Summary {
    let ok: Vec<_> = rows.iter().filter(|r| r.latency.is_some()).collect();
    let n = ok.len().max(1) as f64;
    let first = rows.iter().map(|r| r.at).fold(f64::INFINITY, f64::min);
    let last = ok
        .iter()
        .map(|r| r.at + r.latency.unwrap_or(0.0))
        .fold(0.0, f64::max);
    let mut ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft).collect();
    ttft.sort_by(f64::total_cmp);
    let mut sources = BTreeMap::new();
    for r in &ok {
        *sources.entry(r.source.clone()).or_insert(0) += 1;
    }
    Summary {
        requests: rows.len(),
        failed: rows.len() - ok.len(),
        req_s: if last > first {
            ok.len() as f64 / (last - first)
        } else {
            0.0
        },
        mean_latency_s: ok.iter().filter_map(|r| r.latency).sum::<f64>() / n,
        mean_s_per_token: ok
            .iter()
            .map(|r| r.latency.unwrap_or(0.0) / r.tokens.max(1) as f64)
            .sum::<f64>()
            / n,
        mean_ttft_s: ttft.iter().sum::<f64>() / ttft.len().max(1) as f64,
        ttft_p99_s: ttft
            .get(((ttft.len().max(1) - 1) as f64 * 0.99).round() as usize)
            .copied()
            .unwrap_or(f64::NAN),
        sources,
    }
}

fn summarize(records: &[Record]) -> Summary {
    let rows: Vec<_> = records
        .iter()
        .map(|r| Outcome {
            at: r.at,
            ttft: r.ttft_s,
            latency: r.latency_s,
            tokens: r.tokens,
            source: r.source.clone().unwrap_or_else(|| "none".into()),
        })
        .collect();
    summarize_with(&rows)
}

/// The simulator's name of a source, as the edge's block names it.
pub fn kv_name(kv: Kv) -> &'static str {
    match kv {
        Kv::Memory => "memory",
        Kv::Peer => "peer",
        Kv::Store => "store",
        Kv::Cloud | Kv::Tier | Kv::Prefilled => "cloud",
        Kv::CloudOnly => "cloud-only",
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// The cloud node's model (and cloud-only's).
    #[arg(long, default_value = "qwen15")]
    cloud_model: String,
    /// The edges' model; CE-LSLM when it differs from the cloud's.
    #[arg(long, default_value = "qwen05")]
    edge_model: String,
    /// CE-LSLM adapters (`edgeprompt align`); made with `edgeprompt align` when missing.
    #[arg(long, default_value = "models/align/adapters.safetensors")]
    adapters: PathBuf,
    /// Layers from this one on come from the cloud [default: the smallest split the CE-LSLM
    /// quality table allows, or 0 for one model].
    #[arg(long)]
    split: Option<usize>,
    #[arg(long, default_value = "docs/results/lslm.json")]
    lslm_table: PathBuf,
    #[arg(long, default_value_t = 4)]
    prompts: usize,
    #[arg(long, default_value_t = 512)]
    prefix_len: usize,
    #[arg(long, default_value_t = 48)]
    private_len: usize,
    #[arg(long, default_value_t = 48)]
    max_tokens: usize,
    #[arg(long, default_value = "wifi")]
    link: String,
    /// edgeprompt-N (a cloud and N edges), cloud-only, llama-server.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "edgeprompt-1,edgeprompt-2,cloud-only,llama-server"
    )]
    setups: Vec<String>,
    /// Offered requests per second over the fleet.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1,2")]
    rates: Vec<f64>,
    /// Seconds of arrivals per rate.
    #[arg(long, default_value_t = 60.0)]
    secs: f64,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// llama.cpp's `llama-server` binary (scripts/llama_server.sh builds it).
    #[arg(long)]
    llama_server: Option<PathBuf>,
    /// Rates for llama-server [default: --rates].
    #[arg(long, value_delimiter = ',')]
    llama_rates: Vec<f64>,
    #[arg(long, default_value_t = 8)]
    slots: usize,
    /// Timings per calibration pass (the median is kept).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long)]
    edgeprompt: Option<PathBuf>,
    /// Run nothing: replay a saved fleet.json's traces through the simulator again, in place.
    #[arg(long)]
    replay: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench fleet`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    if let Some(file) = &a.replay {
        replay(file, &resolve(&a.edge_model)?)?;
        eprintln!("rewrote {}", file.display());
        return Ok(());
    }
    let edgeprompt = beside(a.edgeprompt)?;
    let setups = a
        .setups
        .iter()
        .map(|x| {
            Setup::parse(x).ok_or_else(|| {
                BenchError::Failed(format!(
                    "setup {x}: edgeprompt-N, cloud-only or llama-server"
                ))
            })
        })
        .collect::<Result<Vec<_>, BenchError>>()?;
    let lslm = a.cloud_model != a.edge_model;
    if lslm && !a.adapters.exists() {
        eprintln!(
            "no {}: running `edgeprompt align` (about a minute)",
            a.adapters.display()
        );
        let ok = std::process::Command::new(&edgeprompt)
            .args(["align", "--llm", &a.cloud_model, "--slm", &a.edge_model])
            .status()?
            .success();
        if !(ok && a.adapters.exists()) {
            return Err(BenchError::Failed(format!(
                "edgeprompt align did not write {}",
                a.adapters.display()
            )));
        }
    }
    let split = match a.split {
        Some(k) => k,
        None if lslm => crate::lslm::quality_floor(&a.lslm_table).ok_or_else(|| {
            BenchError::Failed(format!(
                "no split floor in {}: pass --split",
                a.lslm_table.display()
            ))
        })?,
        None => 0,
    };
    let s = Settings {
        edgeprompt,
        bench: std::env::current_exe()?,
        cloud_model: resolve(&a.cloud_model)?,
        cloud_model_id: a.cloud_model.clone(),
        edge_model: resolve(&a.edge_model)?,
        edge_model_id: a.edge_model.clone(),
        adapters: lslm.then_some(a.adapters.clone()),
        split,
        sharegpt: sharegpt()?,
        prompts: a.prompts.max(1),
        prefix_len: a.prefix_len,
        private_len: a.private_len,
        max_tokens: a.max_tokens,
        link: a.link,
        setups,
        rates: a.rates,
        secs: a.secs,
        seed: a.seed,
        llama_server: a.llama_server,
        llama_rates: a.llama_rates,
        slots: a.slots,
        repeats: a.repeats.max(1),
        dir: std::env::temp_dir().join(format!("edgeprompt-fleet-{}", std::process::id())),
        out: a.out.clone(),
    };
    run(&s)?;
    let _ = std::fs::remove_dir_all(&s.dir);
    eprintln!("wrote {}/fleet.json", a.out.display());
    Ok(())
}
