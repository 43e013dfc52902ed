//! `edgeprompt-bench soak`: the deployment as separate processes on loopback (Redis, two
//! cloud nodes sharing it, shaped links, two edge servers with disk caches that are each
//! other's peers) under a seeded Poisson load of streamed and whole chats, some clients
//! hanging up, while a seeded schedule kills and restarts the cloud, Redis and a link, turns a
//! disk cache unwritable and takes an edge's KV budget with a burst. Every request is accounted
//! for, every completed greedy answer is checked against the single-node answer computed here,
//! and the edges' memory bounds are sampled every second.

pub mod chaos;
pub(crate) mod client;
pub(crate) mod cluster;
pub(crate) mod procs;
pub mod report;
pub(crate) mod samples;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprompt_engine::{GenerateOptions, Generator, Message, Model, Sequence};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::inputs::{beside, resolve, sharegpt};
use crate::machine::Machine;
use crate::BenchError;
use client::{Outcome, Spec};
use cluster::{Cluster, Config, FaultRecord};
pub use samples::{Bucket, EdgeCounts, Sample};

pub struct Settings {
    pub model: PathBuf,
    /// The product binary the processes run.
    pub edgeprompt: PathBuf,
    pub sharegpt: PathBuf,
    pub secs: f64,
    /// Poisson arrivals per second, over both edges.
    pub rate: f64,
    /// Cloud prompts registered with the cloud nodes.
    pub prompts: usize,
    pub cloud_len: usize,
    pub user_len: usize,
    pub max_tokens: usize,
    pub link: String,
    pub kv_budget_mb: usize,
    pub prefix_cache_mb: usize,
    /// Each edge's private prefix cache (finished conversations kept for their next turns).
    pub private_cache_mb: usize,
    pub max_queue: usize,
    pub seed: u64,
    /// Client-side limit on one request (beyond it the request counts as a hang).
    pub client_timeout_secs: u64,
    /// Where the processes keep their files (Redis dump, disk caches, prompts).
    pub dir: PathBuf,
    pub out: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Limits {
    pub kv_budget_bytes: u64,
    pub prefix_cache_bytes: u64,
    pub private_cache_bytes: u64,
    pub max_queue: u64,
    /// Each edge's RSS once ready + the KV budget + both caches + 128 MB of working room.
    pub rss_bytes: Vec<u64>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub secs: f64,
    pub rate: f64,
    pub prompts: usize,
    pub seed: u64,
    pub link: String,
    pub max_tokens: usize,
    pub sent: usize,
    /// Outcome kind -> requests (`answer`, `http_<status>`, `stream_error`, `cancelled`,
    /// `broken`, `hang`).
    pub outcomes: BTreeMap<String, usize>,
    /// Requests sent without an outcome (a client task that died): must be 0.
    pub unaccounted: usize,
    /// Outcomes of the requests the schedule sent (included above).
    pub chaos_outcomes: BTreeMap<String, usize>,
    pub answers_compared: usize,
    pub answers_identical: usize,
    /// Up to five answers that differ from the single-node answer.
    pub mismatches: Vec<String>,
    /// Up to ten broken or hung requests, with what the client saw.
    pub defects: Vec<String>,
    pub panics: Vec<String>,
    pub edge_exit_codes: Vec<Option<i32>>,
    /// Per edge: where its cloud prompts came from (the fallback paths the faults exercised).
    pub edges: Vec<EdgeCounts>,
    pub faults: Vec<FaultRecord>,
    pub limits: Limits,
    /// Every bound held at every sample.
    pub bounds_held: bool,
    /// Each broken bound with its worst sample.
    pub bounds_exceeded: Vec<String>,
    pub samples: Vec<Sample>,
    pub timeline: Vec<Bucket>,
}

impl Report {
    /// What must hold after any soak: one outcome each, no defect, no panic, exact answers,
    /// bounds kept, edges drained to exit 0. Empty when all is well.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let count = |k: &str| self.outcomes.get(k).copied().unwrap_or(0);
        if self.unaccounted > 0 {
            v.push(format!("{} requests unaccounted", self.unaccounted));
        }
        for k in ["broken", "hang"] {
            if count(k) > 0 {
                v.push(format!("{} {k} requests: {:?}", count(k), self.defects));
            }
        }
        // The faults may cost a request a 429 (the burst) or the client's own hang-up, never a
        // server error: the fallbacks must answer.
        let unexpected: Vec<String> = self
            .outcomes
            .iter()
            .filter(|(k, _)| {
                !["answer", "cancelled", "http_429", "broken", "hang"].contains(&k.as_str())
            })
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        if !unexpected.is_empty() {
            v.push(format!(
                "outcomes no fault should cause: {}",
                unexpected.join(", ")
            ));
        }
        if !self.panics.is_empty() {
            v.push(format!("panics: {:?}", self.panics));
        }
        if self.answers_identical != self.answers_compared {
            v.push(format!(
                "{} of {} answers differ from single-node: {:?}",
                self.answers_compared - self.answers_identical,
                self.answers_compared,
                self.mismatches
            ));
        }
        for b in &self.bounds_exceeded {
            v.push(format!("bound exceeded: {b}"));
        }
        if self.edge_exit_codes.iter().any(|c| *c != Some(0)) {
            v.push(format!("edge exit codes {:?}", self.edge_exit_codes));
        }
        v
    }
}

/// The seeded load: Poisson arrivals; 90 % on the registered cloud prompts, 10 % with a
/// one-off system prompt (computed and cached by the edge); half streamed; a tenth of the
/// streamed clients hang up after a few pieces.
fn load(s: &Settings, model: &Model) -> Result<(Vec<String>, Vec<Spec>), BenchError> {
    let turns = crate::sharegpt::turns(&s.sharegpt, 2000)?;
    let mut rng = StdRng::seed_from_u64(s.seed);
    let text = |rng: &mut StdRng, n: usize| crate::workload::text(model, &turns, rng, n);
    let prompts = (0..s.prompts)
        .map(|_| text(&mut rng, s.cloud_len))
        .collect::<Result<Vec<_>, _>>()?;
    let mut specs = Vec::new();
    let mut at = 0.0;
    loop {
        at += -(1.0 - rng.random::<f64>()).ln() / s.rate;
        if at >= s.secs {
            break;
        }
        let id = specs.len();
        let system = if rng.random::<f64>() < 0.1 {
            format!("You are assistant number {id}. {}", text(&mut rng, 48)?)
        } else {
            prompts[rng.random_range(0..prompts.len())].clone()
        };
        let stream = rng.random::<bool>();
        specs.push(Spec {
            id,
            at,
            edge: rng.random_range(0..2),
            system,
            user: text(&mut rng, s.user_len)?,
            max_tokens: s.max_tokens,
            stream,
            cancel_after: (stream && rng.random::<f64>() < 0.1).then_some(3),
            by_chaos: false,
            after_fault: None,
        });
    }
    // One more cloud prompt, published and never asked for by the load: the disk fault's
    // requests use it, so their edge must fetch it and write it down after the fault, whatever
    // its memory holds by then (a system prompt the cloud does not publish is private and
    // never written to disk).
    let mut prompts = prompts;
    prompts.push(text(&mut rng, s.cloud_len)?);
    Ok((prompts, specs))
}

/// Requests that take edge `edge`'s KV budget: two that each reserve 49 % of it (hanging up
/// after 80 pieces) and, 0.15 s later, six ordinary ones that find it taken: 80 pieces take
/// at least 0.4 s even at SmolLM2's ~190 tok/s alone, so the fastest engine still holds the
/// budget when they arrive.
fn burst(
    s: &Settings,
    model: &Model,
    edge: usize,
    at: f64,
    first_id: usize,
    user: &str,
) -> Vec<Spec> {
    let per_token = edgeprompt_edge::scheduler::kv_bytes_per_token(model);
    let big = ((s.kv_budget_mb << 20) * 49 / 100 / per_token).max(s.max_tokens);
    (0..8)
        .map(|i| Spec {
            id: first_id + i,
            at: if i < 2 { at } else { at + 0.15 },
            edge,
            system: "You are a storyteller who never stops.".into(),
            user: user.into(),
            max_tokens: if i < 2 { big } else { s.max_tokens },
            stream: true,
            cancel_after: (i < 2).then_some(80),
            by_chaos: true,
            after_fault: None,
        })
        .collect()
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let machine = crate::start(2);
    let model = Arc::new(Model::load(&s.model)?);
    eprintln!("machine: {machine}");
    let (prompts, mut specs) = load(s, &model)?;
    let faults = chaos::schedule(s.secs, s.seed);
    let user = specs.first().map(|x| x.user.clone()).unwrap_or_default();
    for (i, f) in faults.iter().enumerate() {
        match f.kind {
            chaos::Kind::FillBudget => {
                let b = burst(s, &model, f.target, f.at, specs.len(), &user);
                specs.extend(b);
            }
            // A cloud prompt the edge has not seen, once its disk cannot be written: it is
            // fetched and cannot be stored; the answers must not suffer.
            chaos::Kind::DiskUnwritable => {
                let unseen = prompts.last().cloned().unwrap_or_default();
                for k in 0..2 {
                    specs.push(Spec {
                        id: specs.len(),
                        at: f.at + f.hold_s * (k + 1) as f64 / 3.0,
                        edge: f.target,
                        system: unseen.clone(),
                        user: user.clone(),
                        max_tokens: s.max_tokens,
                        stream: k == 0,
                        cancel_after: None,
                        by_chaos: true,
                        after_fault: Some(i),
                    });
                }
            }
            _ => {}
        }
    }
    eprintln!(
        "soak: {} requests over {:.0} s ({} sent by the fault schedule), {} cloud prompts (the last one for the disk fault only), faults at {:?}",
        specs.len(),
        s.secs,
        specs.iter().filter(|x| x.by_chaos).count(),
        prompts.len(),
        faults.iter().map(|f| (f.kind, f.at.round())).collect::<Vec<_>>()
    );
    let _ = std::fs::remove_dir_all(&s.dir);
    let t0 = Instant::now();
    let cluster = Arc::new(Cluster::start(
        &Config {
            edgeprompt: s.edgeprompt.clone(),
            model: s.model.clone(),
            dir: s.dir.clone(),
            prompts,
            link: s.link.clone(),
            kv_budget_mb: s.kv_budget_mb,
            prefix_cache_mb: s.prefix_cache_mb,
            private_cache_mb: s.private_cache_mb,
            max_queue: s.max_queue,
        },
        t0,
    )?);
    eprintln!("soak: cluster up in {:.1} s", t0.elapsed().as_secs_f64());
    let rt = tokio::runtime::Runtime::new()?;
    let load_start = t0.elapsed().as_secs_f64();
    let (outcomes, records, samples, rss0) =
        rt.block_on(drive(s, &cluster, &model, &specs, &faults))?;
    let edges = rt.block_on(async {
        let http = crate::http().build().unwrap_or_default();
        samples::edge_counts(&http, &cluster.edge_urls).await
    });
    let edge_exit_codes = cluster.stop_edges();
    let panics = cluster.panics();
    let shift = |r: &mut FaultRecord| {
        r.started_s -= load_start;
        r.ended_s -= load_start;
    };
    let mut faults_seen = records;
    for r in &mut faults_seen {
        if r.fault.kind == chaos::Kind::StartRedis {
            r.recovery_s = cluster
                .first_shared_hit(r.started_s)
                .map(|t| t - r.started_s);
        }
        shift(r);
    }
    eprintln!("soak: load done; checking answers against single-node generation");
    let (compared, identical, mismatches) = check_answers(&model, &specs, &outcomes)?;
    let limits = Limits {
        kv_budget_bytes: (s.kv_budget_mb as u64) << 20,
        prefix_cache_bytes: (s.prefix_cache_mb as u64) << 20,
        private_cache_bytes: (s.private_cache_mb as u64) << 20,
        max_queue: s.max_queue as u64,
        rss_bytes: rss0
            .iter()
            .map(|r| {
                r + (((s.kv_budget_mb + s.prefix_cache_mb + s.private_cache_mb) as u64) << 20)
                    + (128 << 20)
            })
            .collect(),
    };
    let bounds_exceeded = samples::bounds_exceeded(&samples, &limits);
    let mut counts = BTreeMap::new();
    let mut chaos_counts = BTreeMap::new();
    let mut defects = Vec::new();
    for (spec, (_, _, o)) in specs.iter().zip(&outcomes) {
        if let Some(o) = o {
            *counts.entry(o.kind()).or_insert(0) += 1;
            if spec.by_chaos {
                *chaos_counts.entry(o.kind()).or_insert(0) += 1;
            }
            if matches!(o, Outcome::Broken { .. } | Outcome::Hang) && defects.len() < 10 {
                defects.push(format!("request {} on edge {}: {o:?}", spec.id, spec.edge));
            }
        }
    }
    let report = Report {
        machine,
        model: model.cfg.name.clone(),
        secs: s.secs,
        rate: s.rate,
        prompts: s.prompts,
        seed: s.seed,
        link: s.link.clone(),
        max_tokens: s.max_tokens,
        sent: specs.len(),
        unaccounted: outcomes.iter().filter(|o| o.2.is_none()).count(),
        outcomes: counts,
        chaos_outcomes: chaos_counts,
        answers_compared: compared,
        answers_identical: identical,
        mismatches,
        defects,
        panics,
        edge_exit_codes,
        edges,
        faults: faults_seen,
        limits,
        bounds_held: bounds_exceeded.is_empty(),
        bounds_exceeded,
        timeline: samples::timeline(&specs, &outcomes, s.secs),
        samples,
    };
    crate::write_json(&s.out, "soak.json", &report)?;
    eprintln!("{}", summary(&report));
    Ok(report)
}

/// (start, end) seconds of the load clock and the outcome of each spec.
type Ended = (f64, f64, Option<Outcome>);

async fn drive(
    s: &Settings,
    cluster: &Arc<Cluster>,
    model: &Arc<Model>,
    specs: &[Spec],
    faults: &[chaos::Fault],
) -> Result<(Vec<Ended>, Vec<FaultRecord>, Vec<Sample>, Vec<u64>), BenchError> {
    let http = crate::http()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| BenchError::Data(e.to_string()))?;
    let begin = Instant::now();
    let rss0 = samples::rss_now(&http, &cluster.edge_urls).await;
    let sampler = tokio::spawn(samples::sample_every_second(
        http.clone(),
        cluster.edge_urls.clone(),
        begin,
        Duration::from_secs_f64(s.secs + 5.0),
    ));
    // How many faults have been applied, for the requests that must follow theirs.
    let (applied_tx, applied_rx) = tokio::sync::watch::channel(0usize);
    let chaos = {
        let (cluster, model, faults) = (cluster.clone(), model.clone(), faults.to_vec());
        let (applied, http, rt) = (applied_tx, http.clone(), tokio::runtime::Handle::current());
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            for (i, f) in faults.iter().enumerate() {
                let wait = f.at - begin.elapsed().as_secs_f64();
                if wait > 0.0 {
                    std::thread::sleep(Duration::from_secs_f64(wait));
                }
                eprintln!("soak: [{:6.1} s] fault {:?} on {}", f.at, f.kind, f.target);
                let during = |f: &chaos::Fault| {
                    // In place: the requests that follow this fault go now.
                    applied.send_replace(i + 1);
                    std::thread::sleep(Duration::from_secs_f64(f.hold_s));
                    if f.kind == chaos::Kind::DiskUnwritable {
                        // Held until its edge has failed a write (its requests make it fetch a
                        // prompt it must store), within a deadline: the order of events, not
                        // the speed of the machine, decides what the check sees.
                        let url = [cluster.edge_urls[f.target].clone()];
                        let deadline = Instant::now() + Duration::from_secs(90);
                        while Instant::now() < deadline
                            && rt
                                .block_on(samples::edge_counts(&http, &url))
                                .first()
                                .is_none_or(|c| c.disk_write_errors == 0)
                        {
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                };
                out.push(cluster.apply(f, &model, &during));
                // Also when `apply` failed before the fault was in place: its requests go anyway.
                applied.send_replace(i + 1);
            }
            out
        })
    };
    let timeout = Duration::from_secs(s.client_timeout_secs);
    let mut tasks = Vec::with_capacity(specs.len());
    for spec in specs {
        let (http, base, spec, mut applied) = (
            http.clone(),
            cluster.edge_urls[spec.edge].clone(),
            spec.clone(),
            applied_rx.clone(),
        );
        // The edges serve the model under the name they were started with: its path.
        let model_id = s.model.display().to_string();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until((begin + Duration::from_secs_f64(spec.at)).into()).await;
            if let Some(f) = spec.after_fault {
                // The chaos task applies every fault, then ends: the wait ends either way.
                let _ = applied.wait_for(|n| *n > f).await;
            }
            let start = begin.elapsed().as_secs_f64();
            let o = client::send(&http, &base, &model_id, &spec, timeout).await;
            (start, begin.elapsed().as_secs_f64(), o)
        }));
    }
    let mut ended = Vec::with_capacity(tasks.len());
    for t in tasks {
        ended.push(match t.await {
            Ok((a, b, o)) => (a, b, Some(o)),
            Err(_) => (f64::NAN, f64::NAN, None),
        });
    }
    let records = chaos
        .await
        .map_err(|e| BenchError::Data(format!("chaos task: {e}")))?
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let samples = sampler.await.unwrap_or_default();
    Ok((ended, records, samples, rss0))
}

/// Every completed answer against the same request generated greedily on one node here.
pub(crate) fn check_answers(
    model: &Model,
    specs: &[Spec],
    outcomes: &[Ended],
) -> Result<(usize, usize, Vec<String>), BenchError> {
    let chat = model
        .chat
        .as_ref()
        .ok_or_else(|| BenchError::Data("the model has no chat template".into()))?;
    let mut memo: HashMap<(String, String, usize), String> = HashMap::new();
    let (mut compared, mut identical, mut mismatches) = (0, 0, Vec::new());
    for (spec, (_, _, o)) in specs.iter().zip(outcomes) {
        let Some(Outcome::Answer { text, .. }) = o else {
            continue;
        };
        let key = (spec.system.clone(), spec.user.clone(), spec.max_tokens);
        if !memo.contains_key(&key) {
            let split = chat.split(&spec.system, &[Message::new("user", &spec.user)])?;
            let mut ids = model.tokenizer.encode(&split.cloud)?;
            ids.extend(model.tokenizer.encode(&split.edge)?);
            let mut seq = Sequence::new(model);
            let opts = GenerateOptions {
                max_tokens: spec.max_tokens,
                ..GenerateOptions::default()
            };
            let r = Generator::new(model).run(&mut seq, &ids, &opts, |_| {})?;
            memo.insert(key.clone(), r.text);
        }
        compared += 1;
        if memo.get(&key) == Some(text) {
            identical += 1;
        } else if mismatches.len() < 5 {
            mismatches.push(format!(
                "request {}: {:?} vs single-node {:?}",
                spec.id,
                text,
                memo.get(&key)
            ));
        }
    }
    Ok((compared, identical, mismatches))
}

fn summary(r: &Report) -> String {
    let mut t = format!(
        "{} | soak {:.0} s at {} req/s, seed {}, link {}\nsent {}, outcomes {:?}, unaccounted {}\n\
         sent by the fault schedule {:?}\nanswers identical to single-node: {}/{}\npanics {}, edge exit codes {:?}, bounds held: {}\n\
         cloud prompts by source per edge: {:?}\n",
        r.machine,
        r.secs,
        r.rate,
        r.seed,
        r.link,
        r.sent,
        r.outcomes,
        r.unaccounted,
        r.chaos_outcomes,
        r.answers_identical,
        r.answers_compared,
        r.panics.len(),
        r.edge_exit_codes,
        r.bounds_held,
        r.edges
    );
    t += &samples::maxima(&r.samples, &r.limits);
    for f in &r.faults {
        t += &format!(
            "  {:6.1} s {:?} on {}: recovery {} ({})\n",
            f.started_s,
            f.fault.kind,
            f.fault.target,
            f.recovery_s.map_or("-".into(), |x| format!("{x:.1} s")),
            f.note
        );
    }
    t
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Length of the load (faults are placed along it).
    #[arg(long, default_value_t = 600.0)]
    secs: f64,
    /// Poisson arrivals per second over both edges.
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
    /// Cloud prompts registered with the cloud nodes.
    #[arg(long, default_value_t = 8)]
    prompts: usize,
    #[arg(long, default_value_t = 192)]
    cloud_len: usize,
    #[arg(long, default_value_t = 32)]
    user_len: usize,
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// Link profile between each edge and its cloud node.
    #[arg(long, default_value = "wifi")]
    link: String,
    #[arg(long, default_value_t = 128)]
    kv_budget_mb: usize,
    #[arg(long, default_value_t = 16)]
    prefix_cache_mb: usize,
    /// Each edge's private prefix cache (conversations kept for their next turns).
    #[arg(long, default_value_t = 16)]
    private_cache_mb: usize,
    #[arg(long, default_value_t = 32)]
    max_queue: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The `edgeprompt` binary the processes run (default: beside this one).
    #[arg(long)]
    edgeprompt: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench soak`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let s = Settings {
        model: resolve(&a.model)?,
        edgeprompt: beside(a.edgeprompt)?,
        sharegpt: sharegpt()?,
        secs: a.secs,
        rate: a.rate,
        prompts: a.prompts.max(1),
        cloud_len: a.cloud_len,
        user_len: a.user_len,
        max_tokens: a.max_tokens,
        link: a.link,
        kv_budget_mb: a.kv_budget_mb,
        prefix_cache_mb: a.prefix_cache_mb,
        private_cache_mb: a.private_cache_mb,
        max_queue: a.max_queue,
        seed: a.seed,
        client_timeout_secs: 180,
        dir: std::env::temp_dir().join(format!("edgeprompt-soak-{}", std::process::id())),
        out: a.out.clone(),
    };
    let r = run(&s)?;
    let _ = std::fs::remove_dir_all(&s.dir);
    eprintln!("wrote {}/soak.json", a.out.display());
    let bad = r.violations();
    if !bad.is_empty() {
        return Err(BenchError::Failed(format!(
            "the soak found: {}",
            bad.join("; ")
        )));
    }
    Ok(())
}
