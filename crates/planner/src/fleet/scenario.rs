//! Workloads at fleet scale and what they come to: Poisson requests spread over the edges, on
//! shared cloud prompts or on fresh ones (a document seen once), with (private, output)
//! lengths drawn from measured pairs; and the plan a deployer asks for: how many cloud nodes
//! keep up, at what latency.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::exponential;
use super::model::{simulate, Fleet, Kv, Mode, Outcome, Request, Usage};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Load {
    /// Requests per second over the whole fleet.
    pub rate: f64,
    /// Seconds of arrivals.
    pub secs: f64,
    /// Shared cloud prompts in use.
    pub prompts: usize,
    /// Tokens of each cloud prompt.
    pub prompt_tokens: usize,
    /// Share of requests that bring a cloud prompt no one used before.
    pub fresh: f64,
    /// (private tokens, output tokens) pairs, drawn uniformly.
    pub lengths: Vec<(usize, usize)>,
    pub seed: u64,
}

/// The requests of `load` over `edges` edges (at least one), and the fleet's cloud prompts'
/// token counts (the shared ones, then one per fresh request).
pub fn requests(load: &Load, edges: usize) -> (Vec<Request>, Vec<usize>) {
    let mut rng = StdRng::seed_from_u64(load.seed);
    let mut prompts = vec![load.prompt_tokens; load.prompts.max(1)];
    let mut out = Vec::new();
    if load.rate <= 0.0 || load.lengths.is_empty() {
        return (out, prompts);
    }
    let mut at = exponential(&mut rng, load.rate);
    while at < load.secs {
        let (private, output) = load.lengths[rng.random_range(0..load.lengths.len())];
        let prompt = if rng.random::<f64>() < load.fresh {
            prompts.push(load.prompt_tokens);
            prompts.len() - 1
        } else {
            rng.random_range(0..load.prompts.max(1))
        };
        out.push(Request {
            at,
            edge: rng.random_range(0..edges.max(1)),
            prompt,
            private,
            output,
        });
        at += exponential(&mut rng, load.rate);
    }
    (out, prompts)
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stats {
    pub requests: usize,
    pub mean_latency_s: f64,
    /// Mean of latency / output tokens.
    pub s_per_token: f64,
    pub mean_ttft_s: f64,
    pub ttft_p99_s: f64,
    /// Completed requests per second, first arrival to last completion.
    pub req_s: f64,
    /// Busiest cloud node's busy share of the run (per prefill slot or batch).
    pub cloud_busy: f64,
    pub edge_busy: f64,
    pub max_prefill_queue: usize,
    pub cloud_prefills: usize,
    pub cloud_gb: f64,
    pub peer_gb: f64,
    pub sources: BTreeMap<String, usize>,
}

fn kv_name(kv: Kv) -> &'static str {
    match kv {
        Kv::Memory => "memory",
        Kv::Peer => "peer",
        Kv::Cloud => "cloud",
        Kv::Tier => "tier",
        Kv::Prefilled => "prefilled",
        Kv::CloudOnly => "cloud-only",
    }
}

pub fn stats(f: &Fleet, reqs: &[Request], out: &[Outcome], u: &Usage) -> Stats {
    let n = out.len().max(1) as f64;
    let first = reqs.first().map_or(0.0, |r| r.at);
    let last = reqs
        .iter()
        .zip(out)
        .map(|(r, o)| r.at + o.latency)
        .fold(0.0, f64::max);
    let span = (last - first).max(1e-9);
    let mut ttft: Vec<f64> = out.iter().map(|o| o.ttft).collect();
    ttft.sort_by(f64::total_cmp);
    let mut sources = BTreeMap::new();
    for o in out {
        *sources.entry(kv_name(o.kv).to_string()).or_insert(0) += 1;
    }
    let slots = f.cloud_prefill_slots.max(1) as f64;
    Stats {
        requests: out.len(),
        mean_latency_s: out.iter().map(|o| o.latency).sum::<f64>() / n,
        s_per_token: out
            .iter()
            .map(|o| o.latency / o.output.max(1) as f64)
            .sum::<f64>()
            / n,
        mean_ttft_s: ttft.iter().sum::<f64>() / n,
        ttft_p99_s: ttft
            .get(((ttft.len().max(1) - 1) as f64 * 0.99).round() as usize)
            .copied()
            .unwrap_or(0.0),
        req_s: out.len() as f64 / span,
        cloud_busy: u.cloud_busy_secs.iter().fold(0.0, |a, &b| f64::max(a, b)) / slots / span,
        edge_busy: u.edge_busy_secs.iter().fold(0.0, |a, &b| f64::max(a, b)) / span,
        max_prefill_queue: u.max_prefill_queue,
        cloud_prefills: u.cloud_prefills,
        cloud_gb: u.cloud_bytes / 1e9,
        peer_gb: u.peer_bytes / 1e9,
        sources,
    }
}

/// `load` on `fleet` (its prompts replaced by the load's) served `mode`'s way.
pub fn run(fleet: &Fleet, mode: Mode, load: &Load) -> Stats {
    let (reqs, prompts) = requests(load, fleet.edges);
    let f = Fleet {
        prompts,
        ..fleet.clone()
    };
    let (out, usage) = simulate(&f, mode, &reqs);
    stats(&f, &reqs, &out, &usage)
}

/// `run` in steady state: first every server gets each shared prompt once (edges fetch, the
/// cloud-only cache fills), then the load; the stats are the load's.
pub fn run_warm(fleet: &Fleet, mode: Mode, load: &Load) -> Stats {
    let (reqs, prompts) = requests(load, fleet.edges);
    let servers = match mode {
        Mode::EdgePrompt => fleet.edges.max(1),
        Mode::CloudOnly => fleet.cloud_nodes.max(1),
    };
    let mut all = Vec::new();
    for e in 0..servers {
        for p in 0..load.prompts.max(1) {
            all.push(Request {
                at: 0.0,
                edge: e,
                prompt: p,
                private: 1,
                output: 1,
            });
        }
    }
    // Cloud-only request `i` goes to node `i % nodes`: ordered by prompt, then server, each
    // node sees every prompt.
    if mode == Mode::CloudOnly {
        all.sort_by_key(|r| (r.prompt, r.edge));
    }
    let warm = all.len();
    all.extend(reqs.iter().map(|r| Request {
        at: r.at + WARM_SECS,
        ..*r
    }));
    let f = Fleet {
        prompts,
        ..fleet.clone()
    };
    let (out, mut usage) = simulate(&f, mode, &all);
    // The load's usage: the warm-up's own taken out.
    let (_, before) = simulate(&f, mode, &all[..warm]);
    for (a, b) in usage
        .cloud_busy_secs
        .iter_mut()
        .zip(&before.cloud_busy_secs)
    {
        *a -= b;
    }
    for (a, b) in usage.edge_busy_secs.iter_mut().zip(&before.edge_busy_secs) {
        *a -= b;
    }
    usage.cloud_prefills -= before.cloud_prefills.min(usage.cloud_prefills);
    usage.cloud_bytes -= before.cloud_bytes;
    usage.peer_bytes -= before.peer_bytes;
    stats(&f, &all[warm..], &out[warm..], &usage)
}

/// Simulated time the warm-up gets before the load starts.
const WARM_SECS: f64 = 3600.0;

/// How many cloud nodes a fleet needs and what its requests see.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub cloud_nodes: usize,
    pub stats: Stats,
    /// One request alone on the same fleet: what the latency would be without load.
    pub lone_latency_s: f64,
    /// The busiest edge's busy share is near 1: the edges, not the cloud, limit the fleet.
    pub edges_saturated: bool,
    /// `false` when `max_nodes` were not enough.
    pub enough: bool,
}

/// The fewest cloud nodes (up to `max_nodes`) that keep up with `load` on `fleet`: the mean
/// latency within `slack` times a lone request's, the busiest cloud node below `busy_limit`
/// (EdgePrompt: its prefill slots; the queue of prompts it has not started stays bounded).
pub fn plan(
    fleet: &Fleet,
    mode: Mode,
    load: &Load,
    max_nodes: usize,
    slack: f64,
    busy_limit: f64,
) -> Plan {
    let lone = {
        let (mut reqs, prompts) = requests(load, fleet.edges);
        reqs.truncate(1);
        let f = Fleet {
            prompts,
            ..fleet.clone()
        };
        // Warm: the lone request finds its prompt held where the load mostly would.
        let (out, _) = simulate(&f, mode, &reqs);
        let warm = Request {
            at: out.first().map_or(0.0, |o| o.latency) + 1.0,
            ..reqs.first().copied().unwrap_or(Request {
                at: 0.0,
                edge: 0,
                prompt: 0,
                private: 1,
                output: 1,
            })
        };
        let two = [reqs.first().copied().unwrap_or(warm), warm];
        let (out, _) = simulate(&f, mode, &two);
        out.get(1).map_or(0.0, |o| o.latency)
    };
    let mut last = None;
    for nodes in 1..=max_nodes.max(1) {
        let f = Fleet {
            cloud_nodes: nodes,
            ..fleet.clone()
        };
        let s = run_warm(&f, mode, load);
        // A batching cloud is busy whenever anything runs: only latency tells it is behind.
        let ok = s.mean_latency_s <= slack * lone
            && (mode == Mode::CloudOnly || s.cloud_busy < busy_limit);
        let p = Plan {
            cloud_nodes: nodes,
            edges_saturated: s.edge_busy > 0.95,
            stats: s,
            lone_latency_s: lone,
            enough: ok,
        };
        if ok {
            return p;
        }
        last = Some(p);
    }
    last.expect("at least one node tried")
}
