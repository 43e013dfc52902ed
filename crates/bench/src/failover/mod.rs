//! `edgeprompt-bench failover`: a scaled-out deployment as separate processes on loopback
//! (SeaweedFS with three volume servers and two copies of every object, a six-node Redis
//! Cluster, three cloud replicas sharing both, two edges: one reading the store, one only the
//! replicas) under a seeded Poisson load of chats, while a volume server, the Redis master
//! holding most prompts and a cloud replica are killed in turn, none restarted. The edges'
//! prompt caches hold two prompts of eight and the replicas' memory two, so the tiers are read
//! all through. Every request is accounted for and every answer checked against the
//! single-node answer; per fault: what failed, the latency, where prompts came from, and how
//! long until the service was back to normal.

pub mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprompt_engine::Model;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::inputs::{beside, resolve, sharegpt};
use crate::machine::Machine;
use crate::soak::client::{self, Outcome, Spec};
use crate::soak::cluster::{toml_str, wait_port};
use crate::soak::procs::{free_port, Proc};
use crate::soak::samples::{edge_counts, EdgeCounts};
use crate::BenchError;

pub struct Settings {
    pub model: PathBuf,
    /// The product binary the processes run.
    pub edgeprompt: PathBuf,
    pub sharegpt: PathBuf,
    /// Length of the load; the faults come at a quarter, a half and three quarters of it.
    pub secs: f64,
    /// Poisson arrivals per second over both edges.
    pub rate: f64,
    pub prompts: usize,
    pub cloud_len: usize,
    pub user_len: usize,
    pub max_tokens: usize,
    pub seed: u64,
    pub client_timeout_secs: u64,
    pub dir: PathBuf,
    pub out: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    None,
    KillVolumeServer,
    KillRedisMaster,
    KillCloudReplica,
}

/// One stretch of the load: from a fault (or the start) to the next.
#[derive(Debug, Serialize)]
pub struct Phase {
    pub fault: Fault,
    /// Seconds after the load started.
    pub at_s: f64,
    /// What was killed, and what its recovery means.
    pub note: String,
    /// Seconds from the kill until the part it broke worked again (see `note`).
    pub component_recovery_s: Option<f64>,
    /// Requests started in this phase, and those that did not end in an answer.
    pub requests: usize,
    pub failed: usize,
    pub p50_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
    /// Seconds from the kill until the last of this phase's requests (started after the kill,
    /// done before the next fault) slower than twice the warm healthy p99 ended: from then on
    /// every request was served as before the fault (0: none was slower).
    pub served_normally_after_s: f64,
    /// Per edge: where its cloud prompts came from in this phase.
    pub edge_sources: Vec<BTreeMap<String, u64>>,
    /// The replicas' reads of prompts they did not hold, by tier, in this phase.
    pub replica_tier_reads: BTreeMap<String, usize>,
    /// Fetches the edges began at replica 0 and carried on at the next replica (their logs).
    pub fetches_moved_off_replica0: usize,
    /// Every replica streamed every prompt whole when asked during the fault (the Redis
    /// fault: replicas lacking a prompt read it from the tiers then).
    pub every_prompt_served: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub secs: f64,
    pub rate: f64,
    pub prompts: usize,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    pub seed: u64,
    pub sent: usize,
    pub outcomes: BTreeMap<String, usize>,
    pub answers_compared: usize,
    pub answers_identical: usize,
    pub mismatches: Vec<String>,
    pub panics: Vec<String>,
    pub phases: Vec<Phase>,
}

impl Report {
    /// What must hold: every request answered, every answer the single node's, no panic.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let answered = self.outcomes.get("answer").copied().unwrap_or(0);
        if answered != self.sent {
            v.push(format!(
                "{} of {} requests not answered: {:?}",
                self.sent - answered,
                self.sent,
                self.outcomes
            ));
        }
        if self.answers_identical != self.answers_compared {
            v.push(format!(
                "{} answers differ from single-node: {:?}",
                self.answers_compared - self.answers_identical,
                self.mismatches
            ));
        }
        if !self.panics.is_empty() {
            v.push(format!("panics: {:?}", self.panics));
        }
        for p in &self.phases {
            if p.every_prompt_served == Some(false) {
                v.push(format!(
                    "{:?}: a replica did not serve every prompt",
                    p.fault
                ));
            }
        }
        v
    }
}

const ROOT: &str = "failover";

/// The deployment: the store and Redis (killed when dropped), the replicas and the edges.
struct Deployment {
    weed: edgeprompt_testbed::WeedCluster,
    redis: edgeprompt_testbed::redis::Cluster,
    clouds: Vec<Proc>,
    edges: Vec<Proc>,
    edge_urls: Vec<String>,
    cloud_urls: Vec<String>,
}

fn s(x: impl ToString) -> String {
    x.to_string()
}

impl Deployment {
    /// `per_prompt`: bytes of one prompt's KV; each replica's memory and each edge's cache
    /// hold two.
    fn start(
        st: &Settings,
        prompts: &[String],
        per_prompt: usize,
        t0: Instant,
    ) -> Result<Self, BenchError> {
        std::fs::create_dir_all(&st.dir)?;
        let weed = edgeprompt_testbed::weed_cluster(3);
        let redis = edgeprompt_testbed::redis::cluster();
        let key = st.dir.join("deployment");
        let ok = std::process::Command::new(&st.edgeprompt)
            .args(["keygen", "--out"])
            .arg(&key)
            .stdout(std::process::Stdio::null())
            .status()?
            .success();
        if !ok {
            return Err(BenchError::data("edgeprompt keygen failed"));
        }
        let masters: Vec<String> = redis.urls().iter().map(|u| toml_str(u)).collect();
        // Every simulated client is 127.0.0.1: the per-client fetch rate is lifted.
        let mut toml = format!(
            "[server]\nsigning_key_file = {}\nredis_cluster = [{}]\nredis_namespace = \"{ROOT}\"\n\
             store_url = \"s3://edgeprompt-kv/{ROOT}\"\nper_client_rate = 1000.0\n",
            toml_str(&key.with_extension("key").display().to_string()),
            masters.join(", ")
        );
        for (i, p) in prompts.iter().enumerate() {
            toml += &format!("\n[[prompt]]\nid = \"p{i}\"\nsystem = {}\n", toml_str(p));
        }
        let prompts_file = st.dir.join("prompts.toml");
        std::fs::write(&prompts_file, toml)?;
        let aws = [
            ("AWS_ENDPOINT", format!("http://127.0.0.1:{}", weed.s3)),
            ("AWS_ALLOW_HTTP", s("true")),
            ("AWS_REGION", s("us-east-1")),
            ("AWS_ACCESS_KEY_ID", s(edgeprompt_testbed::KEY_ID)),
            ("AWS_SECRET_ACCESS_KEY", s(edgeprompt_testbed::SECRET)),
        ];
        let model = st.model.display().to_string();
        let mut clouds = Vec::new();
        let mut cloud_urls = Vec::new();
        for i in 0..3 {
            let port = free_port()?;
            let mut p = Proc::new(
                &format!("cloud{i}"),
                &st.edgeprompt,
                &[
                    s("cloud"),
                    s("--model"),
                    model.clone(),
                    s("--prompts"),
                    prompts_file.display().to_string(),
                    s("--listen"),
                    format!("127.0.0.1:{port}"),
                    s("--cache-bytes"),
                    s(2 * per_prompt),
                ],
                t0,
            )
            .env("RUST_LOG", "edgeprompt_cloud=info,warn");
            for (k, v) in &aws {
                p = p.env(k, v);
            }
            cloud_urls.push(format!("http://127.0.0.1:{port}"));
            clouds.push(p);
        }
        // The first replica prefills every prompt (and stores it); the others read the tiers.
        let last = format!("p{}: ", prompts.len().saturating_sub(1));
        for c in &mut clouds {
            c.start()?;
            c.wait_line("cloud serving", 0.0, Duration::from_secs(120))?;
            c.wait_line(&last, 0.0, Duration::from_secs(300))?;
        }
        let mut edges = Vec::new();
        let mut edge_urls = Vec::new();
        for i in 0..2 {
            let port = free_port()?;
            let mut args = vec![
                s("serve"),
                s("--model"),
                model.clone(),
                s("--cloud"),
                cloud_urls.join(","),
                s("--cloud-key"),
                key.with_extension("pub").display().to_string(),
                s("--known-clouds"),
                st.dir.join(format!("edge{i}-known")).display().to_string(),
                s("--listen"),
                format!("127.0.0.1:{port}"),
                s("--prefix-cache-mb"),
                s((2 * per_prompt).div_ceil(1 << 20)),
                s("--prefetch-mb"),
                s(0),
                s("--request-timeout-secs"),
                s(120),
            ];
            if i == 0 {
                args.extend([s("--kv-store"), format!("s3://edgeprompt-kv/{ROOT}")]);
            }
            let mut p =
                Proc::new(&format!("edge{i}"), &st.edgeprompt, &args, t0).env("RUST_LOG", "warn");
            if i == 0 {
                for (k, v) in &aws {
                    p = p.env(k, v);
                }
            }
            p.start()?;
            p.wait_line("edge serving", 0.0, Duration::from_secs(120))?;
            wait_port(port, Duration::from_secs(20))?;
            edge_urls.push(format!("http://127.0.0.1:{port}"));
            edges.push(p);
        }
        Ok(Self {
            weed,
            redis,
            clouds,
            edges,
            edge_urls,
            cloud_urls,
        })
    }

    /// Lines with "panicked" in any of our processes' output.
    fn panics(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in self.clouds.iter().chain(&self.edges) {
            if let Ok(l) = p.log.lock() {
                out.extend(
                    l.iter()
                        .filter(|(_, x)| x.contains("panicked"))
                        .map(|(t, x)| format!("{} [{t:.1}] {x}", p.name)),
                );
            }
        }
        out
    }

    /// The replicas' tier reads (their log lines) in `[from, to)` seconds of the run.
    fn tier_reads(&self, from: f64, to: f64) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for c in &self.clouds {
            if let Ok(l) = c.log.lock() {
                for (_, x) in l.iter().filter(|(t, _)| *t >= from && *t < to) {
                    if let Some(rest) = x.split("from the shared tier (").nth(1) {
                        let tier = rest.split(')').next().unwrap_or("?").to_string();
                        *out.entry(tier).or_insert(0) += 1;
                    }
                }
            }
        }
        out
    }

    /// Fetches the edges moved from replica 0 to the next in `[from, to)` seconds of the run:
    /// their log's "fetch from <replica 0>: ...; asking <next>" (before the header) and
    /// "... resuming from <next>" (mid-stream) lines.
    fn moved_off_replica0(&self, from: f64, to: f64) -> usize {
        let pat = format!("fetch from {}: ", self.cloud_urls[0]);
        self.edges
            .iter()
            .filter_map(|e| {
                let l = e.log.lock().ok()?;
                Some(
                    l.iter()
                        .filter(|(t, x)| {
                            *t >= from
                                && *t < to
                                && x.contains(&pat)
                                && (x.contains("; asking ") || x.contains("; resuming from "))
                        })
                        .count(),
                )
            })
            .sum()
    }

    /// Carry out `f`; the seconds until the part it broke works again, and what that means.
    fn apply(
        &mut self,
        f: Fault,
        rt: &tokio::runtime::Runtime,
        model: &Model,
        prompts: usize,
    ) -> Applied {
        let t = Instant::now();
        let done = |back: Option<f64>, note: String| Applied {
            back,
            note,
            every_prompt_served: None,
        };
        match f {
            Fault::None => done(None, String::new()),
            Fault::KillVolumeServer => {
                self.weed.kill_volume(0);
                // Every stored prompt read whole through the gateway again.
                let until = t + Duration::from_secs(60);
                let ok = rt.block_on(async {
                    while Instant::now() < until {
                        if edgeprompt_testbed::all_readable(self.weed.s3, ROOT).await > 0 {
                            return true;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    false
                });
                done(
                    ok.then(|| t.elapsed().as_secs_f64()),
                    "volume server 0 of 3 SIGKILLed (never restarted); recovery: every stored \
                     prompt's object read whole through the S3 gateway"
                        .into(),
                )
            }
            Fault::KillRedisMaster => {
                use edgeprompt_testbed::redis::{cluster_ok, holders, info};
                let ports: Vec<u16> = self.redis.servers.iter().map(|x| x.port).collect();
                // The master holding the most prompts, and its replica.
                let keys = |p: u16| edgeprompt_testbed::redis::keys(p, &format!("{ROOT}:kv:*"));
                let masters: Vec<u16> = ports
                    .iter()
                    .copied()
                    .filter(|&p| info(p, "replication").contains("role:master"))
                    .collect();
                let Some(&master) = masters.iter().max_by_key(|&&p| keys(p).len()) else {
                    return done(None, "no Redis master found".into());
                };
                let held = keys(master).len();
                let Some(key) = keys(master).first().cloned() else {
                    return done(None, "no prompt in Redis".into());
                };
                let (_, replica) = holders(&ports, &key);
                let t = Instant::now();
                self.redis.kill(master);
                // Every replica asked for every prompt while the cluster fails over: those a
                // replica does not hold it reads from the tiers (the load alone may not ask a
                // replica for one it lacks within the fault).
                let all_served = rt.block_on(async {
                    let mut ok = true;
                    for url in &self.cloud_urls {
                        for p in 0..prompts {
                            ok &= crate::soak::cluster::fetch_once(url, model, &format!("p{p}"))
                                .await;
                        }
                    }
                    ok
                });
                let served_in = t.elapsed().as_secs_f64();
                let until = t + Duration::from_secs(60);
                let mut back = None;
                while Instant::now() < until {
                    if info(replica, "replication").contains("role:master") && cluster_ok(replica) {
                        back = Some(t.elapsed().as_secs_f64());
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Applied {
                    back,
                    note: format!(
                        "the Redis master holding {held} of the prompts SIGKILLed (never \
                         restarted); recovery: its replica promoted and the cluster state ok; \
                         every replica asked for every prompt right after the kill (served \
                         in {served_in:.2} s)"
                    ),
                    every_prompt_served: Some(all_served),
                }
            }
            Fault::KillCloudReplica => {
                self.clouds[0].kill9();
                done(
                    None,
                    "cloud replica 0 of 3 SIGKILLed (never restarted): the edges' first choice \
                     for about a third of the prompts"
                        .into(),
                )
            }
        }
    }
}

/// The seeded load: Poisson arrivals on the published prompts, each edge alike.
fn load(s: &Settings, model: &Model) -> Result<(Vec<String>, Vec<Spec>), BenchError> {
    let turns = crate::sharegpt::turns(&s.sharegpt, 2000)?;
    let mut rng = StdRng::seed_from_u64(s.seed);
    let text = |rng: &mut StdRng, n: usize| crate::workload::text(model, &turns, rng, n);
    let prompts = (0..s.prompts.max(1))
        .map(|_| text(&mut rng, s.cloud_len))
        .collect::<Result<Vec<_>, _>>()?;
    // A few private messages, so answers repeat and the single-node check stays short.
    let users = (0..8)
        .map(|_| text(&mut rng, s.user_len))
        .collect::<Result<Vec<_>, _>>()?;
    let mut specs = Vec::new();
    let mut at = 0.0;
    loop {
        at += -(1.0 - rng.random::<f64>()).ln() / s.rate;
        if at >= s.secs {
            break;
        }
        specs.push(Spec {
            id: specs.len(),
            at,
            edge: rng.random_range(0..2),
            system: prompts[rng.random_range(0..prompts.len())].clone(),
            user: users[rng.random_range(0..users.len())].clone(),
            max_tokens: s.max_tokens,
            stream: rng.random::<bool>(),
            cancel_after: None,
            by_chaos: false,
            after_fault: None,
        });
    }
    Ok((prompts, specs))
}

/// A fault as applied: when, how long its part took to come back, the edges' counters then.
struct Mark {
    fault: Fault,
    at: f64,
    applied: Applied,
    counts: Vec<EdgeCounts>,
}

/// What applying a fault saw.
struct Applied {
    /// Seconds until the broken part worked again.
    back: Option<f64>,
    note: String,
    /// Every replica served every prompt during the fault (asked where it applies).
    every_prompt_served: Option<bool>,
}

/// The faults, in order, as shares of the run.
const SCHEDULE: [(Fault, f64); 4] = [
    (Fault::None, 0.0),
    (Fault::KillVolumeServer, 0.25),
    (Fault::KillRedisMaster, 0.5),
    (Fault::KillCloudReplica, 0.75),
];

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let machine = crate::start(2);
    eprintln!("machine: {machine}");
    let model = Arc::new(Model::load(&s.model)?);
    let (prompts, specs) = load(s, &model)?;
    let prompt_tokens = prompts
        .iter()
        .map(|p| model.tokenizer.encode(p).map(|v| v.len()).unwrap_or(0))
        .sum::<usize>()
        / prompts.len().max(1);
    let _ = std::fs::remove_dir_all(&s.dir);
    let t0 = Instant::now();
    // Template tokens around each prompt: 64 is ample.
    let per_prompt = edgeprompt_edge::scheduler::kv_bytes_per_token(&model) * (prompt_tokens + 64);
    let mut d = Deployment::start(s, &prompts, per_prompt, t0)?;
    eprintln!(
        "failover: deployment up in {:.1} s; {} requests over {:.0} s",
        t0.elapsed().as_secs_f64(),
        specs.len(),
        s.secs
    );
    let rt = tokio::runtime::Runtime::new()?;
    let http = crate::http()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(BenchError::data)?;
    let begin = Instant::now();
    let load_t0 = t0.elapsed().as_secs_f64();
    let model_id = s.model.display().to_string();
    let timeout = Duration::from_secs(s.client_timeout_secs);
    let tasks: Vec<_> = specs
        .iter()
        .map(|spec| {
            let (http, base, spec, model_id) = (
                http.clone(),
                d.edge_urls[spec.edge].clone(),
                spec.clone(),
                model_id.clone(),
            );
            rt.spawn(async move {
                tokio::time::sleep_until((begin + Duration::from_secs_f64(spec.at)).into()).await;
                let start = begin.elapsed().as_secs_f64();
                let o = client::send(&http, &base, &model_id, &spec, timeout).await;
                (start, begin.elapsed().as_secs_f64(), o)
            })
        })
        .collect();
    // The faults, on this thread, at their times; the edges' counters at each.
    let mut marks: Vec<Mark> = Vec::new();
    for (f, share) in SCHEDULE {
        let wait = share * s.secs - begin.elapsed().as_secs_f64();
        if wait > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(wait));
        }
        let counts = rt.block_on(edge_counts(&http, &d.edge_urls));
        let at = begin.elapsed().as_secs_f64();
        if f != Fault::None {
            eprintln!("failover: [{at:6.1} s] {f:?}");
        }
        let a = d.apply(f, &rt, &model, prompts.len());
        if let Some(r) = a.back {
            eprintln!("failover:   recovered in {r:.2} s");
        }
        marks.push(Mark {
            fault: f,
            at,
            applied: a,
            counts,
        });
    }
    let ended: Vec<(f64, f64, Outcome)> = rt.block_on(async {
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap_or((
                f64::NAN,
                f64::NAN,
                Outcome::Broken {
                    what: "client task died".into(),
                },
            )));
        }
        out
    });
    let end_counts = rt.block_on(edge_counts(&http, &d.edge_urls));
    let panics = d.panics();
    eprintln!("failover: load done; checking answers against single-node generation");
    let outs: Vec<(f64, f64, Option<Outcome>)> = ended
        .iter()
        .map(|(a, b, o)| (*a, *b, Some(o.clone())))
        .collect();
    let (compared, identical, mismatches) = crate::soak::check_answers(&model, &specs, &outs)?;

    let mut outcomes = BTreeMap::new();
    for (_, _, o) in &ended {
        *outcomes.entry(o.kind()).or_insert(0) += 1;
    }
    // Slow: over twice the p99 of the warm healthy phase (its second half, requests done
    // before the first fault; a single slower request there is noise).
    let slow = {
        let end = marks.get(1).map_or(f64::INFINITY, |m| m.at);
        let mut lat: Vec<f64> = ended
            .iter()
            .filter(|(a, b, _)| *a >= end / 2.0 && *b < end)
            .map(|(a, b, _)| b - a)
            .collect();
        lat.sort_by(f64::total_cmp);
        2.0 * lat
            .get(((lat.len() as f64 * 0.99) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    let mut phases = Vec::new();
    for (i, m) in marks.iter().enumerate() {
        let (f, at, counts) = (&m.fault, &m.at, &m.counts);
        let (rec, note) = (&m.applied.back, &m.applied.note);
        let to = marks.get(i + 1).map_or(f64::INFINITY, |m| m.at);
        let next_counts = marks.get(i + 1).map_or(&end_counts, |m| &m.counts);
        let mine: Vec<&(f64, f64, Outcome)> = ended
            .iter()
            .filter(|(a, _, _)| *a >= *at && *a < to)
            .collect();
        let mut lat: Vec<f64> = mine.iter().map(|(a, b, _)| b - a).collect();
        lat.sort_by(f64::total_cmp);
        let q = |x: f64| {
            lat.get(((lat.len() as f64 * x) as usize).min(lat.len().saturating_sub(1)))
                .copied()
                .unwrap_or(f64::NAN)
        };
        // Requests of this phase only: started after its fault, done before the next.
        let slow_end = ended
            .iter()
            .filter(|(a, b, _)| *a >= *at && *b <= to && b - a > slow)
            .map(|(_, b, _)| b - at)
            .fold(0.0, f64::max);
        let edge_sources = next_counts
            .iter()
            .zip(counts)
            .map(|(n, o)| {
                n.lookups
                    .iter()
                    .map(|(k, v)| (k.clone(), v - o.lookups.get(k).copied().unwrap_or(0)))
                    .filter(|(_, v)| *v > 0)
                    .collect()
            })
            .collect();
        phases.push(Phase {
            fault: *f,
            at_s: *at,
            note: note.clone(),
            component_recovery_s: *rec,
            requests: mine.len(),
            failed: mine
                .iter()
                .filter(|(_, _, o)| !matches!(o, Outcome::Answer { .. }))
                .count(),
            p50_s: q(0.5),
            p99_s: q(0.99),
            max_s: lat.last().copied().unwrap_or(f64::NAN),
            served_normally_after_s: if *f == Fault::None { 0.0 } else { slow_end },
            edge_sources,
            replica_tier_reads: d.tier_reads(load_t0 + at, load_t0 + to),
            fetches_moved_off_replica0: d.moved_off_replica0(load_t0 + at, load_t0 + to),
            every_prompt_served: m.applied.every_prompt_served,
        });
    }
    for e in &mut d.edges {
        e.term(Duration::from_secs(20));
    }
    let report = Report {
        machine,
        model: model.cfg.name.clone(),
        secs: s.secs,
        rate: s.rate,
        prompts: prompts.len(),
        prompt_tokens,
        max_tokens: s.max_tokens,
        seed: s.seed,
        sent: specs.len(),
        outcomes,
        answers_compared: compared,
        answers_identical: identical,
        mismatches,
        panics,
        phases,
    };
    crate::write_json(&s.out, "failover.json", &report)?;
    eprintln!("{}", summary(&report));
    Ok(report)
}

pub fn summary(r: &Report) -> String {
    let mut t = format!(
        "{} | {} ({} prompts of {} tokens), {:.0} s at {} req/s, seed {}\nsent {}, outcomes {:?}, \
         answers identical to single-node {}/{}, panics {}\n",
        r.machine,
        r.model,
        r.prompts,
        r.prompt_tokens,
        r.secs,
        r.rate,
        r.seed,
        r.sent,
        r.outcomes,
        r.answers_identical,
        r.answers_compared,
        r.panics.len()
    );
    for p in &r.phases {
        t += &format!(
            "  {:>6.1} s {:?}: {} requests, {} failed, latency p50 {:.2} s p99 {:.2} s max {:.2} s; \
             part back in {}; served as before after {:.2} s; edges {:?}; replicas read {:?}; \
             fetches moved off replica 0: {}\n",
            p.at_s,
            p.fault,
            p.requests,
            p.failed,
            p.p50_s,
            p.p99_s,
            p.max_s,
            p.component_recovery_s
                .map_or("-".into(), |x| format!("{x:.2} s")),
            p.served_normally_after_s,
            p.edge_sources,
            p.replica_tier_reads,
            p.fetches_moved_off_replica0
        );
    }
    t
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Length of the load (the faults come at 1/4, 1/2 and 3/4 of it).
    #[arg(long, default_value_t = 120.0)]
    secs: f64,
    /// Poisson arrivals per second over both edges.
    #[arg(long, default_value_t = 2.0)]
    rate: f64,
    #[arg(long, default_value_t = 8)]
    prompts: usize,
    #[arg(long, default_value_t = 384)]
    cloud_len: usize,
    #[arg(long, default_value_t = 32)]
    user_len: usize,
    #[arg(long, default_value_t = 16)]
    max_tokens: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The `edgeprompt` binary the processes run (default: beside this one).
    #[arg(long)]
    edgeprompt: Option<PathBuf>,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench failover`: the settings from the flags, the run, and what it wrote.
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
        seed: a.seed,
        client_timeout_secs: 180,
        dir: std::env::temp_dir().join(format!("edgeprompt-failover-{}", std::process::id())),
        out: a.out.clone(),
    };
    let r = run(&s)?;
    let _ = std::fs::remove_dir_all(&s.dir);
    eprintln!("wrote {}/failover.json", a.out.display());
    let bad = r.violations();
    if !bad.is_empty() {
        return Err(BenchError::Failed(format!("failover: {}", bad.join("; "))));
    }
    Ok(())
}
