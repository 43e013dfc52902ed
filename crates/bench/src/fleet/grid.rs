//! `edgeprompt-bench fleet-grid`: the simulator at the paper's scale and beyond, on costs
//! fitted on this machine. CE-LSLM Fig. 7 (5 edges of 2 cores each, one cloud node of 2 or 16
//! cores, cloud prompts of 256 / 512 / 1024 tokens, 1-64 req/s, ShareGPT lengths) against
//! cloud-only serving; then the deployer's questions: how many edges one cloud node feeds as
//! fresh prompts arrive, and what peers and the shared tier save when 5, 100 or 1000 edges
//! join cold over a minute.

use std::path::{Path, PathBuf};

use edgeprompt_planner::fleet::model::{simulate, Costs, Fleet, Kv, Link, Mode};
use edgeprompt_planner::fleet::scenario::{self, Load, Stats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::inputs::{resolve, sharegpt};
use crate::machine::Machine;
use crate::BenchError;

pub struct Settings {
    pub bench: PathBuf,
    pub cloud_model: PathBuf,
    pub edge_model: PathBuf,
    pub sharegpt: PathBuf,
    /// The real fleet run (`fleet.json`): the CE-LSLM split and the KV bytes per token on the wire.
    pub fleet: PathBuf,
    /// The link between an edge and the cloud, and a client and the cloud.
    pub link: String,
    pub repeats: usize,
    pub dir: PathBuf,
    pub out: PathBuf,
}

/// A 16-core cloud node against the measured 2 cores: 8x the arithmetic, 3x the memory
/// bandwidth (a server socket's channels shared by more cores).
pub const SIXTEEN: (f64, f64) = (8.0, 3.0);

/// Edges join cold at seeded moments within this many seconds.
const JOIN_SECS: f64 = 60.0;

#[derive(Debug, Serialize)]
pub struct Row {
    pub setup: String,
    pub prefix: usize,
    pub rate: f64,
    pub stats: Stats,
}

#[derive(Debug, Serialize)]
pub struct Feed {
    pub cloud_cores: usize,
    pub edges: usize,
    pub fresh: f64,
    pub per_edge_rate: f64,
    pub stats: Stats,
}

#[derive(Debug, Serialize)]
pub struct Join {
    pub edges: usize,
    pub variant: String,
    pub cloud_nodes: usize,
    /// Requests that found no KV at their edge: their mean and p99 TTFT.
    pub cold_requests: usize,
    pub cold_ttft_mean_s: f64,
    pub cold_ttft_p99_s: f64,
    pub stats: Stats,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub edge_model: String,
    pub cloud_model: String,
    pub link: String,
    pub edge_costs: Costs,
    pub cloud_costs: Costs,
    pub cloud16_costs: Costs,
    pub kv_bytes_per_token: usize,
    pub edge_layers: f64,
    pub lengths: usize,
    pub mean_private: f64,
    pub mean_output: f64,
    pub grid: Vec<Row>,
    pub feed: Vec<Feed>,
    pub join: Vec<Join>,
}

/// A fleet-costs run in its own process, pinned to `cores`.
pub fn fitted(
    bench: &Path,
    model: &Path,
    cores: usize,
    repeats: usize,
    file: &Path,
) -> Result<super::costs::Fitted, BenchError> {
    if let Some(d) = file.parent() {
        std::fs::create_dir_all(d)?;
    }
    let status = std::process::Command::new("taskset")
        .args(["-c", &super::real::all_cores(cores)])
        .arg(bench)
        .args(["fleet-costs", "--model"])
        .arg(model)
        .args([
            "--threads",
            &cores.to_string(),
            "--repeats",
            &repeats.to_string(),
        ])
        .arg("--out")
        .arg(file)
        .status()?;
    if !status.success() {
        return Err(BenchError::Data(format!(
            "fleet-costs for {} failed",
            model.display()
        )));
    }
    Ok(serde_json::from_slice(&std::fs::read(file)?)?)
}

/// (private, output) token pairs of ShareGPT: a human turn and the reply, capped.
fn lengths(model: &Path, sharegpt: &Path) -> Result<Vec<(usize, usize)>, BenchError> {
    let tok = edgeprompt_engine::Model::load(model)?;
    let mut v = Vec::new();
    for conv in crate::sharegpt::conversations(sharegpt, 3000)? {
        for w in conv.windows(2) {
            if w[0].from == "human" && w[1].from == "gpt" {
                let p = tok.tokenizer.encode(&w[0].text)?.len();
                let o = tok.tokenizer.encode(&w[1].text)?.len();
                if p > 0 && o > 0 {
                    v.push((p.min(256), o.min(128)));
                }
                break;
            }
        }
        if v.len() >= 2000 {
            break;
        }
    }
    Ok(v)
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let machine = crate::start(1);
    let cores = machine.cores.max(1);
    let fleet_json: serde_json::Value = serde_json::from_slice(&std::fs::read(&s.fleet)?)?;
    let kv_bytes_per_token = fleet_json["kv_bytes_per_token"]
        .as_f64()
        .unwrap_or(0.0)
        .round() as usize;
    let edge_model_cfg = edgeprompt_engine::Model::load(&s.edge_model)?;
    let n_layer = edge_model_cfg.cfg.n_layer;
    drop(edge_model_cfg);
    let split = fleet_json["split"].as_u64().unwrap_or(0) as usize;
    let edge_layers = split as f64 / n_layer.max(1) as f64;
    eprintln!("machine: {machine}; calibrating the edge and cloud models on {cores} cores");
    let edge = fitted(
        &s.bench,
        &s.edge_model,
        cores,
        s.repeats,
        &s.dir.join("edge.json"),
    )?;
    let cloud = fitted(
        &s.bench,
        &s.cloud_model,
        cores,
        s.repeats,
        &s.dir.join("cloud.json"),
    )?;
    let cloud16 = cloud.costs.scaled(SIXTEEN.0, SIXTEEN.1);
    let pairs = lengths(&s.edge_model, &s.sharegpt)?;
    let mean = |f: &dyn Fn(&(usize, usize)) -> usize| {
        pairs.iter().map(f).sum::<usize>() as f64 / pairs.len().max(1) as f64
    };
    eprintln!(
        "{} ShareGPT (private, output) pairs: mean {:.0} / {:.0} tokens; KV {kv_bytes_per_token} B per token on the wire, the edge computes {:.0} % of the layers",
        pairs.len(), mean(&|p| p.0), mean(&|p| p.1), edge_layers * 100.0
    );
    let profile = edgeprompt_link::Profile::named(&s.link)
        .ok_or_else(|| BenchError::Data(format!("unknown link profile {}", s.link)))?;
    let link = Link {
        bytes_per_sec: profile.bandwidth_bps.max(1) as f64 / 8.0,
        rtt_secs: profile.rtt.as_secs_f64(),
    };
    let base = Fleet {
        // The paper's cloud batches more than our server's 32.
        cloud_batch: 64,
        kv_bytes_per_token,
        edge_layers,
        cloud_egress: Some(10e9 / 8.0),
        ..Fleet::new(5, edge.costs, cloud.costs, link)
    };
    let load = |rate: f64, prefix: usize, seed: u64| Load {
        rate,
        secs: (400.0 / rate).clamp(60.0, 300.0),
        prompts: 8,
        prompt_tokens: prefix,
        fresh: 0.0,
        lengths: pairs.clone(),
        seed,
        rollout: false,
    };

    let mut grid = Vec::new();
    for prefix in [256, 512, 1024] {
        for rate in [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0] {
            let l = load(rate, prefix, 11);
            for (setup, f, mode) in [
                ("ce-lslm", base.clone(), Mode::EdgePrompt),
                // As many edges as it takes to stay flat at the paper's top rate on CPU edges.
                (
                    "ce-lslm-32",
                    Fleet {
                        edges: 32,
                        ..base.clone()
                    },
                    Mode::EdgePrompt,
                ),
                ("cloud-only-2", base.clone(), Mode::CloudOnly),
                (
                    "cloud-only-16",
                    Fleet {
                        cloud: cloud16,
                        ..base.clone()
                    },
                    Mode::CloudOnly,
                ),
            ] {
                let st = scenario::run_load(&f, mode, &l);
                eprintln!(
                    "  prefix {prefix:4} {rate:4} req/s {setup:>13}: latency {:8.2} s, {:.3} s/token, TTFT {:6.2} s, done {:5.2} req/s",
                    st.mean_latency_s, st.s_per_token, st.mean_ttft_s, st.req_s
                );
                grid.push(Row {
                    setup: setup.into(),
                    prefix,
                    rate,
                    stats: st,
                });
            }
        }
    }

    // Edges per cloud node: each edge at 0.5 req/s, a share of requests on a fresh 1024-token
    // prompt (a document seen once) that the cloud must prefill; ten minutes, so the shared
    // prompts' first prefills weigh little.
    let mut feed = Vec::new();
    for (cores, cloud_costs) in [(2, cloud.costs), (16, cloud16)] {
        for fresh in [0.02, 0.1] {
            for edges in [2, 5, 10, 20, 50, 100, 200] {
                let f = Fleet {
                    edges,
                    cloud: cloud_costs,
                    ..base.clone()
                };
                let l = Load {
                    rate: 0.5 * edges as f64,
                    secs: 600.0,
                    fresh,
                    ..load(1.0, 1024, 13)
                };
                let st = scenario::run(&f, Mode::EdgePrompt, &l);
                eprintln!(
                    "  feed: cloud of {cores:2} cores, {edges:4} edges, {:3.0} % fresh: cloud busy {:5.1} %, prefill queue up to {}, TTFT {:.2} s",
                    fresh * 100.0, st.cloud_busy * 100.0, st.max_prefill_queue, st.mean_ttft_s
                );
                feed.push(Feed {
                    cloud_cores: cores,
                    edges,
                    fresh,
                    per_edge_rate: 0.5,
                    stats: st,
                });
            }
        }
    }

    // Edges joining cold over a minute (each at a seeded moment, then 0.2 req/s): 8 prompts of
    // 1024 tokens.
    let (peer, tier) = (Link::PEERS, Link::TIER);
    let mut join = Vec::new();
    for edges in [5, 100, 1000] {
        for (variant, nodes, peer_link, tier_link) in [
            ("one cloud node", 1, None, None),
            ("one cloud node + peers", 1, Some(peer), None),
            ("4 cloud nodes, no shared tier", 4, None, None),
            ("4 cloud nodes + Redis tier", 4, None, Some(tier)),
            (
                "4 cloud nodes + Redis tier + peers",
                4,
                Some(peer),
                Some(tier),
            ),
        ] {
            let f = Fleet {
                edges,
                cloud_nodes: nodes,
                peer_link,
                tier_link,
                ..base.clone()
            };
            let l = Load {
                rate: 0.2 * edges as f64,
                secs: JOIN_SECS + 60.0,
                ..load(1.0, 1024, 17)
            };
            let (reqs, prompts) = scenario::requests(&l, edges);
            let mut rng = StdRng::seed_from_u64(19);
            let joins: Vec<f64> = (0..edges)
                .map(|_| rng.random_range(0.0..JOIN_SECS))
                .collect();
            let reqs: Vec<_> = reqs.into_iter().filter(|r| r.at >= joins[r.edge]).collect();
            let f = Fleet { prompts, ..f };
            let (out, usage) = simulate(&f, Mode::EdgePrompt, &reqs);
            let st = scenario::stats(&f, &reqs, &out, &usage);
            let mut cold: Vec<f64> = out
                .iter()
                .filter(|o| o.kv != Kv::Memory)
                .map(|o| o.ttft)
                .collect();
            cold.sort_by(f64::total_cmp);
            let cold_mean = cold.iter().sum::<f64>() / cold.len().max(1) as f64;
            let p99 = cold
                .get(((cold.len().max(1) - 1) as f64 * 0.99).round() as usize)
                .copied()
                .unwrap_or(0.0);
            eprintln!(
                "  join: {edges:4} edges, {variant:>34}: {} cold requests, TTFT mean {cold_mean:.2} s p99 {p99:.2} s, {} prefills, cloud {:.2} GB, peers {:.2} GB",
                cold.len(), st.cloud_prefills, st.cloud_gb, st.peer_gb
            );
            join.push(Join {
                edges,
                variant: variant.into(),
                cloud_nodes: nodes,
                cold_requests: cold.len(),
                cold_ttft_mean_s: cold_mean,
                cold_ttft_p99_s: p99,
                stats: st,
            });
        }
    }
    let report = Report {
        machine,
        edge_model: edge.model,
        cloud_model: cloud.model,
        link: s.link.clone(),
        edge_costs: edge.costs,
        cloud_costs: cloud.costs,
        cloud16_costs: cloud16,
        kv_bytes_per_token,
        edge_layers,
        lengths: pairs.len(),
        mean_private: mean(&|p| p.0),
        mean_output: mean(&|p| p.1),
        grid,
        feed,
        join,
    };
    crate::write_json(&s.out, "fleet-grid.json", &report)?;
    Ok(report)
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "qwen15")]
    cloud_model: String,
    #[arg(long, default_value = "qwen05")]
    edge_model: String,
    /// The real fleet run: its CE-LSLM split and KV bytes per token.
    #[arg(long, default_value = "docs/results/fleet.json")]
    fleet: PathBuf,
    #[arg(long, default_value = "5g")]
    link: String,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench fleet-grid`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let s = Settings {
        bench: std::env::current_exe()?,
        cloud_model: resolve(&a.cloud_model)?,
        edge_model: resolve(&a.edge_model)?,
        sharegpt: sharegpt()?,
        fleet: a.fleet,
        link: a.link,
        repeats: a.repeats.max(1),
        dir: std::env::temp_dir().join(format!("edgeprompt-grid-{}", std::process::id())),
        out: a.out.clone(),
    };
    run(&s)?;
    let _ = std::fs::remove_dir_all(&s.dir);
    eprintln!("wrote {}/fleet-grid.json", a.out.display());
    Ok(())
}
