//! `edgeprompt-bench fleet-scaleout`: the fleet simulator with the object store and cloud
//! replicas, checked against the runs on real processes (`fanout`, `replicas`), then run at
//! 10^4 to 10^6 edges: the replicas and the store egress a rollout of new prompts needs.
//!
//! Checks, each fitted on part of a run and predicting the rest:
//! - fan-out: the store's (and the cloud's) egress and time to first byte fitted on the 16- and
//!   64-edge runs; the 256-edge run's seconds and bytes predicted.
//! - scale-out: the replicas share one machine (one host: its prefill and its sending), whose
//!   sending rate is fitted on the 1-replica run (its p99), the SmolLM2 forward-pass costs
//!   measured (`fleet-costs`); the 2- and 3-replica runs' p99 and every run's prefills
//!   predicted.

use std::path::{Path, PathBuf};

use edgeprompt_planner::fleet::model::{simulate, Costs, Fleet, Home, Link, Mode, Request, Store};
use edgeprompt_planner::fleet::scenario::{plan, plan_with_store, Load};
use serde::{Deserialize, Serialize};

use crate::fleet::costs::Fitted;
use crate::machine::Machine;
use crate::BenchError;

pub struct Settings {
    /// Where `fanout.json`, `replicas.json` and `fleet-costs-smollm2.json` are.
    pub runs: PathBuf,
    /// `fleet-grid.json`: the costs the large fleets are planned on.
    pub grid: PathBuf,
    /// Edge counts of the large fleets.
    pub edges: Vec<usize>,
    /// Seconds of load simulated per large fleet.
    pub secs: f64,
    pub out: PathBuf,
}

/// One figure of a real run against the simulator's.
#[derive(Debug, Serialize)]
pub struct Check {
    pub what: String,
    pub measured: f64,
    pub simulated: f64,
    /// (simulated - measured) / measured.
    pub error: f64,
    /// Used to fit the simulator (so not a prediction).
    pub fitted: bool,
}

/// A large fleet: what a rollout needs with the cloud alone and with a store.
#[derive(Debug, Serialize)]
pub struct Scale {
    pub edges: usize,
    pub rate: f64,
    /// Replicas (10 Gbit/s egress each, edges naming every replica) without a store.
    pub replicas: usize,
    pub replicas_enough: bool,
    pub cloud_gb: f64,
    pub ttft_p99_s: f64,
    /// With the store: replicas, and the least store egress that keeps up.
    pub replicas_with_store: usize,
    pub store_gbit: f64,
    pub store_enough: bool,
    pub store_gb: f64,
    pub cloud_gb_with_store: f64,
    pub ttft_p99_with_store_s: f64,
    pub lone_latency_s: f64,
    pub mean_latency_s: f64,
    pub mean_latency_with_store_s: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub checks: Vec<Check>,
    /// Largest error of a predicted (not fitted) figure.
    pub worst_predicted_error: f64,
    pub edge_model: String,
    pub cloud_model: String,
    pub prompts: usize,
    pub prompt_tokens: usize,
    /// Requests per edge per second in the large fleets.
    pub per_edge_rate: f64,
    pub link: String,
    pub scale: Vec<Scale>,
}

#[derive(Deserialize)]
struct FanoutRow {
    edges: usize,
    path: String,
    cloud_bytes: f64,
    store_bytes: f64,
    seconds: f64,
}

#[derive(Deserialize)]
struct Fanout {
    object_bytes: f64,
    prompt_tokens: usize,
    rows: Vec<FanoutRow>,
}

#[derive(Deserialize)]
struct ReplicaRow {
    replicas: usize,
    prefills: usize,
    p99_s: f64,
}

#[derive(Deserialize)]
struct Replicas {
    prompts: usize,
    lookups: usize,
    prompt_tokens: usize,
    rows: Vec<ReplicaRow>,
}

#[derive(Deserialize)]
struct Grid {
    edge_model: String,
    cloud_model: String,
    edge_costs: Costs,
    cloud_costs: Costs,
    kv_bytes_per_token: usize,
    mean_private: f64,
    mean_output: f64,
}

fn read<T: for<'a> Deserialize<'a>>(p: &Path) -> Result<T, BenchError> {
    let bytes = std::fs::read(p).map_err(|e| BenchError::data(format!("{}: {e}", p.display())))?;
    serde_json::from_slice(&bytes).map_err(|e| BenchError::data(format!("{}: {e}", p.display())))
}

const FREE: Costs = Costs {
    fixed: 0.0,
    per_token: 0.0,
    per_seq: 0.0,
    per_attend: 0.0,
};

/// A loopback link: no bandwidth limit of its own, `rtt` to the first byte.
fn loopback(rtt: f64) -> Link {
    Link {
        bytes_per_sec: f64::INFINITY,
        rtt_secs: rtt,
    }
}

fn check(checks: &mut Vec<Check>, what: String, measured: f64, simulated: f64, fitted: bool) {
    checks.push(Check {
        what,
        measured,
        simulated,
        error: (simulated - measured) / measured,
        fitted,
    });
}

/// Edge `n` (one more than the fan-out's) makes the cloud prefill and store the prompt, then
/// `n` edges ask at once: the last one's time to the whole KV, and the bytes.
fn fan_out(f: &Fleet, n: usize) -> (f64, f64, f64) {
    let one = |edge, at| Request {
        at,
        edge,
        prompt: 0,
        private: 1,
        output: 1,
    };
    let mut reqs = vec![one(n, 0.0)];
    reqs.extend((0..n).map(|e| one(e, 1000.0)));
    let (out, u) = simulate(
        &Fleet {
            edges: n + 1,
            ..f.clone()
        },
        Mode::EdgePrompt,
        &reqs,
    );
    let (_, first) = simulate(
        &Fleet {
            edges: n + 1,
            ..f.clone()
        },
        Mode::EdgePrompt,
        &reqs[..1],
    );
    let last = out[1..].iter().map(|o| o.latency).fold(0.0, f64::max);
    (
        last,
        u.cloud_bytes - first.cloud_bytes,
        u.store_bytes - first.store_bytes,
    )
}

fn fanout_checks(runs: &Path, checks: &mut Vec<Check>) -> Result<(), BenchError> {
    let fo: Fanout = read(&runs.join("fanout.json"))?;
    for path in ["store", "grpc"] {
        let rows: Vec<&FanoutRow> = fo.rows.iter().filter(|r| r.path == path).collect();
        let [a, b, rest @ ..] = rows.as_slice() else {
            return Err(BenchError::data("fanout.json: fewer than two runs a path"));
        };
        // Two points fit a sending rate and a time to the first byte, as the simulator adds
        // them: the last of n edges lands after n objects sent and what of the first byte's
        // time the first object's sending did not cover.
        let rate = (b.edges - a.edges) as f64 * fo.object_bytes / (b.seconds - a.seconds);
        let send = fo.object_bytes / rate;
        let rtt = a.seconds - a.edges as f64 * send + send;
        // What the cloud sends an edge: the list (store), or the list and the stream (gRPC).
        let per_edge = a.cloud_bytes / a.edges as f64;
        let (list, wire) = match path {
            "store" => (per_edge, fo.object_bytes),
            _ => (0.0, per_edge),
        };
        let f = Fleet {
            prompts: vec![1],
            kv_bytes_per_token: wire.round() as usize,
            list_bytes: list.round() as usize,
            cloud_egress: (path == "grpc").then_some(rate),
            store: (path == "store").then_some(Store {
                egress_bytes_per_sec: rate,
                rtt_secs: rtt,
            }),
            ..Fleet::new(
                1,
                FREE,
                FREE,
                loopback(if path == "grpc" { rtt } else { 0.0 }),
            )
        };
        for (i, r) in [a, b].into_iter().chain(rest.iter()).enumerate() {
            let (secs, cloud, store) = fan_out(&f, r.edges);
            let fitted = i < 2;
            check(
                checks,
                format!("fan-out {path}, {} edges: seconds", r.edges),
                r.seconds,
                secs,
                fitted,
            );
            check(
                checks,
                format!("fan-out {path}, {} edges: bytes from the cloud", r.edges),
                r.cloud_bytes,
                cloud,
                i == 0,
            );
            if path == "store" {
                check(
                    checks,
                    format!("fan-out store, {} edges: bytes from the store", r.edges),
                    r.store_bytes,
                    store,
                    false,
                );
            }
        }
    }
    Ok(())
}

/// The replicas bench's draws (xorshift from its seed, 7).
fn draws(lookups: usize, prompts: usize) -> Vec<usize> {
    let mut rng = 7u64 | 1;
    (0..lookups)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % prompts as u64) as usize
        })
        .collect()
}

/// The replicas run in the simulator: `lookups` cold edges at once, R replicas on one host
/// (sharing its prefill and its sending `rate`); the p99 of the edges' time to the KV and the
/// prefills.
fn replicas_sim(rp: &Replicas, smol: &Costs, wire: usize, r: usize, rate: f64) -> (f64, usize) {
    let f = Fleet {
        cloud_nodes: r,
        cloud_hosts: 1,
        home: Home::Prompt,
        prompts: vec![rp.prompt_tokens; rp.prompts],
        kv_bytes_per_token: wire,
        cloud_egress: Some(rate),
        ..Fleet::new(rp.lookups, FREE, *smol, loopback(0.0))
    };
    let reqs: Vec<Request> = draws(rp.lookups, rp.prompts)
        .into_iter()
        .enumerate()
        .map(|(edge, prompt)| Request {
            at: 0.0,
            edge,
            prompt,
            private: 1,
            output: 1,
        })
        .collect();
    let (out, u) = simulate(&f, Mode::EdgePrompt, &reqs);
    let mut lat: Vec<f64> = out.iter().map(|o| o.latency).collect();
    lat.sort_by(f64::total_cmp);
    let p99 = lat[((lat.len() as f64 * 0.99) as usize).min(lat.len() - 1)];
    (p99, u.cloud_prefills)
}

fn replicas_checks(runs: &Path, checks: &mut Vec<Check>) -> Result<(), BenchError> {
    let rp: Replicas = read(&runs.join("replicas.json"))?;
    let smol: Fitted = read(&runs.join("fleet-costs-smollm2.json"))?;
    // SmolLM2's KV bytes a token as stored and sent, from the fan-out's object.
    let fo: Fanout = read(&runs.join("fanout.json"))?;
    let wire = (fo.object_bytes / fo.prompt_tokens as f64).round() as usize;
    let one = rp
        .rows
        .iter()
        .find(|r| r.replicas == 1)
        .ok_or_else(|| BenchError::data("replicas.json: no 1-replica run"))?;
    // The machine's sending rate: the one whose 1-replica p99 is the measured one (the p99
    // falls as the rate grows).
    let (mut lo, mut hi): (f64, f64) = (1e6, 1e11);
    for _ in 0..100 {
        let mid = (lo * hi).sqrt();
        if replicas_sim(&rp, &smol.costs, wire, 1, mid).0 > one.p99_s {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let rate = (lo * hi).sqrt();
    for row in &rp.rows {
        let (p99, prefills) = replicas_sim(&rp, &smol.costs, wire, row.replicas, rate);
        let fitted = row.replicas == 1;
        check(
            checks,
            format!("scale-out, {} replicas: p99 s", row.replicas),
            row.p99_s,
            p99,
            fitted,
        );
        check(
            checks,
            format!("scale-out, {} replicas: prefills", row.replicas),
            row.prefills as f64,
            prefills as f64,
            false,
        );
    }
    Ok(())
}

/// Requests per edge per second in the large fleets: one every ten minutes.
const PER_EDGE_RATE: f64 = 1.0 / 600.0;
const PROMPTS: usize = 8;
const PROMPT_TOKENS: usize = 1024;

fn scale(g: &Grid, edges: usize, secs: f64) -> Scale {
    let link = edgeprompt_link::Profile::named("5g").map_or(
        Link {
            bytes_per_sec: 12.5e6,
            rtt_secs: 0.02,
        },
        |p| Link {
            bytes_per_sec: p.bandwidth_bps.max(1) as f64 / 8.0,
            rtt_secs: p.rtt.as_secs_f64(),
        },
    );
    let fleet = Fleet {
        cloud_batch: 64,
        kv_bytes_per_token: g.kv_bytes_per_token,
        cloud_egress: Some(10e9 / 8.0),
        home: Home::Prompt,
        ..Fleet::new(edges, g.edge_costs, g.cloud_costs, link)
    };
    let load = Load {
        rate: edges as f64 * PER_EDGE_RATE,
        secs,
        prompts: PROMPTS,
        prompt_tokens: PROMPT_TOKENS,
        fresh: 0.0,
        lengths: vec![(
            g.mean_private.round().max(1.0) as usize,
            g.mean_output.round().max(1.0) as usize,
        )],
        seed: 1,
        rollout: true,
    };
    let alone = plan(&fleet, Mode::EdgePrompt, &load, 256, 1.5, 0.8);
    let (nodes, sized) = plan_with_store(&fleet, &load, 0.02, 256, 1.5, 0.8);
    Scale {
        edges,
        rate: load.rate,
        replicas: alone.cloud_nodes,
        replicas_enough: alone.enough,
        cloud_gb: alone.stats.cloud_gb,
        ttft_p99_s: alone.stats.ttft_p99_s,
        replicas_with_store: nodes.cloud_nodes,
        store_gbit: sized.egress_gbit,
        store_enough: sized.enough,
        store_gb: sized.stats.store_gb,
        cloud_gb_with_store: sized.stats.cloud_gb,
        ttft_p99_with_store_s: sized.stats.ttft_p99_s,
        lone_latency_s: alone.lone_latency_s,
        mean_latency_s: alone.stats.mean_latency_s,
        mean_latency_with_store_s: sized.stats.mean_latency_s,
    }
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let mut checks = Vec::new();
    fanout_checks(&s.runs, &mut checks)?;
    replicas_checks(&s.runs, &mut checks)?;
    for c in &checks {
        eprintln!(
            "{:<50} measured {:>14.3} simulated {:>14.3} error {:>+6.1} %{}",
            c.what,
            c.measured,
            c.simulated,
            c.error * 100.0,
            if c.fitted { " (fitted)" } else { "" }
        );
    }
    let worst = checks
        .iter()
        .filter(|c| !c.fitted)
        .map(|c| c.error.abs())
        .fold(0.0, f64::max);
    let g: Grid = read(&s.grid)?;
    let mut rows = Vec::new();
    for &edges in &s.edges {
        let t = std::time::Instant::now();
        let r = scale(&g, edges, s.secs);
        eprintln!(
            "{edges} edges at {:.1} req/s: {} replicas alone ({:.0} GB sent, TTFT p99 {:.2} s); \
             with a store {} replica(s) and {} Gbit/s of store egress ({:.0} GB served, {:.1} GB \
             from the cloud, TTFT p99 {:.2} s) [{:.0} s]",
            r.rate,
            r.replicas,
            r.cloud_gb,
            r.ttft_p99_s,
            r.replicas_with_store,
            r.store_gbit,
            r.store_gb,
            r.cloud_gb_with_store,
            r.ttft_p99_with_store_s,
            t.elapsed().as_secs_f64()
        );
        rows.push(r);
    }
    let report = Report {
        machine: Machine::detect(),
        checks,
        worst_predicted_error: worst,
        edge_model: g.edge_model,
        cloud_model: g.cloud_model,
        prompts: PROMPTS,
        prompt_tokens: PROMPT_TOKENS,
        per_edge_rate: PER_EDGE_RATE,
        link: "5g".into(),
        scale: rows,
    };
    crate::write_json(&s.out, "fleet-scaleout.json", &report)?;
    Ok(report)
}

#[derive(clap::Args)]
pub struct Args {
    /// Where the fan-out, scale-out and SmolLM2 cost runs are.
    #[arg(long, default_value = "docs/results/xeon-207")]
    runs: PathBuf,
    #[arg(long, default_value = "docs/results/fleet-grid.json")]
    grid: PathBuf,
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    edges: Vec<usize>,
    /// Seconds of load simulated per fleet.
    #[arg(long, default_value_t = 120.0)]
    secs: f64,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench fleet-scaleout`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let s = Settings {
        runs: a.runs,
        grid: a.grid,
        edges: a.edges,
        secs: a.secs,
        out: a.out.clone(),
    };
    let r = run(&s)?;
    eprintln!(
        "worst predicted error {:.1} %; wrote {}/fleet-scaleout.json",
        r.worst_predicted_error * 100.0,
        a.out.display()
    );
    Ok(())
}
