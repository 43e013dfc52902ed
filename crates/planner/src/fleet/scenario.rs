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
    /// Edges start without the shared prompts (a new deployment, or a new version of the
    /// prompts reaching every edge); otherwise they hold them (steady state).
    #[serde(default)]
    pub rollout: bool,
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
    pub store_gb: f64,
    /// The store's egress busy share of the run (first arrival to last completion).
    pub store_busy: f64,
    pub sources: BTreeMap<String, usize>,
}

fn kv_name(kv: Kv) -> &'static str {
    match kv {
        Kv::Memory => "memory",
        Kv::Peer => "peer",
        Kv::Store => "store",
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
        store_gb: u.store_bytes / 1e9,
        store_busy: u.store_busy_secs / span,
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

/// `run` from where the load says: the cloud nodes, tiers and store hold the shared prompts
/// from the start (prefilled as the cloud published them); the edges too in steady state, none
/// in a rollout. A fresh prompt is still prefilled and fetched.
pub fn run_load(fleet: &Fleet, mode: Mode, load: &Load) -> Stats {
    let (reqs, prompts) = requests(load, fleet.edges);
    let f = Fleet {
        prompts,
        prefilled: load.prompts.max(1),
        edges_warm: !load.rollout,
        ..fleet.clone()
    };
    let (out, usage) = simulate(&f, mode, &reqs);
    stats(&f, &reqs, &out, &usage)
}

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

/// One request alone on `fleet`: steady state, its prompt held where the load mostly finds it;
/// a rollout, a cold edge fetching a prompt the cloud (and store) hold.
pub fn lone_latency(fleet: &Fleet, mode: Mode, load: &Load) -> f64 {
    let (mut reqs, prompts) = requests(load, fleet.edges);
    reqs.truncate(1);
    let f = Fleet {
        prompts,
        ..fleet.clone()
    };
    let one = reqs.first().copied().unwrap_or(Request {
        at: 0.0,
        edge: 0,
        prompt: 0,
        private: 1,
        output: 1,
    });
    let (out, _) = simulate(&f, mode, &[one]);
    let again = Request {
        at: out.first().map_or(0.0, |o| o.latency) + 1.0,
        // A rollout's lone request is a cold edge's, on the same cloud node where edges have
        // their own.
        edge: match load.rollout {
            true => {
                let step = fleet.cloud_nodes.max(1);
                match (one.edge + step) % fleet.edges.max(1) {
                    e if e != one.edge => e,
                    _ => (one.edge + 1) % fleet.edges.max(1),
                }
            }
            false => one.edge,
        },
        ..one
    };
    let (out, _) = simulate(&f, mode, &[one, again]);
    out.get(1).map_or(0.0, |o| o.latency)
}

/// The fewest cloud nodes (up to `max_nodes`) that keep up with `load` on `fleet`: the mean
/// latency within `slack` times a lone request's, the busiest cloud node below `busy_limit`
/// (EdgePrompt: its prefill slots; the queue of prompts it has not started stays bounded).
/// Node counts double until one keeps up, then halve the gap (more nodes never hurt).
pub fn plan(
    fleet: &Fleet,
    mode: Mode,
    load: &Load,
    max_nodes: usize,
    slack: f64,
    busy_limit: f64,
) -> Plan {
    let lone = lone_latency(fleet, mode, load);
    let max_nodes = max_nodes.max(1);
    let try_nodes = |nodes: usize| {
        let f = Fleet {
            cloud_nodes: nodes,
            ..fleet.clone()
        };
        let s = run_load(&f, mode, load);
        // A batching cloud is busy whenever anything runs: only latency tells it is behind.
        let ok = s.mean_latency_s <= slack * lone
            && (mode == Mode::CloudOnly || s.cloud_busy < busy_limit);
        Plan {
            cloud_nodes: nodes,
            edges_saturated: s.edge_busy > 0.95,
            stats: s,
            lone_latency_s: lone,
            enough: ok,
        }
    };
    let mut bad = 0;
    let mut n = 1;
    let mut good = loop {
        let p = try_nodes(n);
        if p.enough {
            break p;
        }
        bad = n;
        if n == max_nodes {
            return p;
        }
        n = (2 * n).min(max_nodes);
    };
    while good.cloud_nodes - bad > 1 {
        let mid = (bad + good.cloud_nodes) / 2;
        let p = try_nodes(mid);
        if p.enough {
            good = p;
        } else {
            bad = mid;
        }
    }
    good
}

/// How much store egress a fleet needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StorePlan {
    /// The least egress tried that keeps up, in Gbit/s.
    pub egress_gbit: f64,
    pub stats: Stats,
    /// One request alone with a store of unbounded egress.
    pub lone_latency_s: f64,
    /// `false` when the largest egress tried was not enough.
    pub enough: bool,
}

/// A fleet whose edges read a store of `rtt_secs` to the first byte: the cloud nodes it needs
/// with a store as fast as needed, then the least store egress (of `STORE_GBIT`) for them.
pub fn plan_with_store(
    fleet: &Fleet,
    load: &Load,
    rtt_secs: f64,
    max_nodes: usize,
    slack: f64,
    busy_limit: f64,
) -> (Plan, StorePlan) {
    let with_store = Fleet {
        store: Some(super::model::Store {
            egress_bytes_per_sec: f64::INFINITY,
            rtt_secs,
        }),
        ..fleet.clone()
    };
    let nodes = plan(
        &with_store,
        Mode::EdgePrompt,
        load,
        max_nodes,
        slack,
        busy_limit,
    );
    let sized = plan_store(
        &Fleet {
            cloud_nodes: nodes.cloud_nodes,
            ..with_store
        },
        load,
        &STORE_GBIT,
        slack,
        busy_limit,
    );
    (nodes, sized)
}

/// Store egress sizes a plan tries, Gbit/s.
pub const STORE_GBIT: [f64; 13] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// The least store egress of `ladder` (Gbit/s, ascending) that keeps up with `load` on
/// `fleet` (which has a store): the mean latency within `slack` times a lone request's on an
/// unbounded store, and the store's egress busy below `busy_limit`.
pub fn plan_store(
    fleet: &Fleet,
    load: &Load,
    ladder: &[f64],
    slack: f64,
    busy_limit: f64,
) -> StorePlan {
    let rtt = fleet.store.map_or(0.0, |s| s.rtt_secs);
    let with = |gbit: f64| Fleet {
        store: Some(super::model::Store {
            egress_bytes_per_sec: gbit * 1e9 / 8.0,
            rtt_secs: rtt,
        }),
        ..fleet.clone()
    };
    let lone = lone_latency(&with(f64::INFINITY), Mode::EdgePrompt, load);
    let mut last = None;
    for &gbit in ladder {
        let s = run_load(&with(gbit), Mode::EdgePrompt, load);
        let ok = s.mean_latency_s <= slack * lone && s.store_busy < busy_limit;
        let p = StorePlan {
            egress_gbit: gbit,
            stats: s,
            lone_latency_s: lone,
            enough: ok,
        };
        if ok {
            return p;
        }
        last = Some(p);
    }
    last.unwrap_or(StorePlan {
        egress_gbit: 0.0,
        stats: Stats::default(),
        lone_latency_s: lone,
        enough: false,
    })
}
