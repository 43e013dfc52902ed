//! The soak's deployment on loopback, as separate processes: Redis, two cloud nodes sharing
//! it, a shaped link in front of each, and two edge servers with disk caches that are each
//! other's peers. Faults act on these processes; probes time the recoveries.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use edgeprompt_engine::Model;
use edgeprompt_kv::Codec;
use edgeprompt_protocol::PromptRef;

use super::chaos::{Fault, Kind};
use super::procs::{free_port, Proc};
use crate::BenchError;

pub struct Config {
    pub edgeprompt: PathBuf,
    pub model: PathBuf,
    pub dir: PathBuf,
    /// Cloud prompts (id `p<i>`, system text).
    pub prompts: Vec<String>,
    pub link: String,
    pub kv_budget_mb: usize,
    pub prefix_cache_mb: usize,
    pub private_cache_mb: usize,
    pub max_queue: usize,
}

pub struct Cluster {
    pub redis: Mutex<Proc>,
    pub clouds: Vec<Mutex<Proc>>,
    pub links: Vec<Mutex<Proc>>,
    pub edges: Vec<Mutex<Proc>>,
    /// `http://127.0.0.1:port` of each edge's API.
    pub edge_urls: Vec<String>,
    /// gRPC URL of each link (what edge i calls its cloud).
    pub link_urls: Vec<String>,
    pub caches: Vec<PathBuf>,
    pub t0: Instant,
    n_prompts: usize,
}

fn s(x: impl ToString) -> String {
    x.to_string()
}

pub(crate) fn wait_port(port: u16, within: Duration) -> Result<(), BenchError> {
    let until = Instant::now() + within;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > until {
            return Err(BenchError::Data(format!("nothing listens on {port}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

impl Cluster {
    pub fn start(c: &Config, t0: Instant) -> Result<Self, BenchError> {
        std::fs::create_dir_all(&c.dir)?;
        let redis_port = free_port()?;
        let redis = Proc::new(
            "redis",
            "redis-server",
            &[
                s("--port"),
                s(redis_port),
                s("--bind"),
                s("127.0.0.1"),
                s("--dir"),
                c.dir.display().to_string(),
                // Saved at shutdown, so a stopped Redis comes back with its data.
                s("--save"),
                s("3600 1"),
                s("--appendonly"),
                s("no"),
            ],
            t0,
        );
        let mut toml = format!(
            "[server]\nredis_url = \"redis://127.0.0.1:{redis_port}/\"\nredis_namespace = \"soak\"\n"
        );
        for (i, p) in c.prompts.iter().enumerate() {
            toml += &format!("\n[[prompt]]\nid = \"p{i}\"\nsystem = {}\n", toml_str(p));
        }
        let prompts = c.dir.join("prompts.toml");
        std::fs::write(&prompts, toml)?;
        let model = c.model.display().to_string();
        let (mut clouds, mut links, mut edges) = (Vec::new(), Vec::new(), Vec::new());
        let (mut edge_urls, mut link_urls, mut caches) = (Vec::new(), Vec::new(), Vec::new());
        let peer_ports = [free_port()?, free_port()?];
        for i in 0..2 {
            let cloud_port = free_port()?;
            clouds.push(
                Proc::new(
                    &format!("cloud{i}"),
                    &c.edgeprompt,
                    &[
                        s("cloud"),
                        s("--model"),
                        model.clone(),
                        s("--prompts"),
                        prompts.display().to_string(),
                        s("--listen"),
                        format!("127.0.0.1:{cloud_port}"),
                    ],
                    t0,
                )
                .env("RUST_LOG", "edgeprompt_cloud=info,warn"),
            );
            let link_port = free_port()?;
            links.push(Proc::link(
                &format!("link{i}"),
                &c.edgeprompt,
                link_port,
                cloud_port,
                &c.link,
                t0,
            ));
            link_urls.push(format!("http://127.0.0.1:{link_port}"));
            let edge_port = free_port()?;
            let cache = c.dir.join(format!("edge{i}-cache"));
            edges.push(
                Proc::new(
                    &format!("edge{i}"),
                    &c.edgeprompt,
                    &[
                        s("serve"),
                        s("--model"),
                        model.clone(),
                        s("--cloud"),
                        format!("http://127.0.0.1:{link_port}"),
                        s("--listen"),
                        format!("127.0.0.1:{edge_port}"),
                        s("--cache-dir"),
                        cache.display().to_string(),
                        // The clouds' key pinned for this run, kept across the edge's restarts.
                        s("--known-clouds"),
                        c.dir
                            .join(format!("edge{i}-known-clouds"))
                            .display()
                            .to_string(),
                        s("--peer"),
                        format!("http://127.0.0.1:{}", peer_ports[1 - i]),
                        s("--peer-listen"),
                        format!("127.0.0.1:{}", peer_ports[i]),
                        s("--kv-budget-mb"),
                        s(c.kv_budget_mb),
                        s("--prefix-cache-mb"),
                        s(c.prefix_cache_mb),
                        s("--private-cache-mb"),
                        s(c.private_cache_mb),
                        // Published prompts fetched on use: the faults are aimed at the
                        // fetch paths (cloud, peer, disk), which prefetching would take
                        // out of the load (past its budget, prompts are computed here).
                        s("--prefetch-mb"),
                        s(0),
                        s("--max-queue"),
                        s(c.max_queue),
                        s("--request-timeout-secs"),
                        s(120),
                        s("--drain-secs"),
                        s(20),
                    ],
                    t0,
                )
                .env("RUST_LOG", "warn"),
            );
            edge_urls.push(format!("http://127.0.0.1:{edge_port}"));
            caches.push(cache);
        }
        let cluster = Self {
            redis: Mutex::new(redis),
            clouds: clouds.into_iter().map(Mutex::new).collect(),
            links: links.into_iter().map(Mutex::new).collect(),
            edges: edges.into_iter().map(Mutex::new).collect(),
            edge_urls,
            link_urls,
            caches,
            t0,
            n_prompts: c.prompts.len(),
        };
        lock(&cluster.redis).start()?;
        wait_port(redis_port, Duration::from_secs(20))?;
        for i in 0..2 {
            cluster.start_cloud(i)?;
            cluster.start_link(i)?;
        }
        for i in 0..2 {
            let mut e = lock(&cluster.edges[i]);
            e.start()?;
            e.wait_line("edge serving", 0.0, Duration::from_secs(120))?;
        }
        Ok(cluster)
    }

    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// Start cloud `i` and wait until it has every prompt's KV (from Redis or prefilled).
    fn start_cloud(&self, i: usize) -> Result<(), BenchError> {
        let since = self.now();
        let mut p = lock(&self.clouds[i]);
        p.start()?;
        p.wait_line("cloud serving", since, Duration::from_secs(120))?;
        let last = format!("p{}: ", self.n_prompts.saturating_sub(1));
        p.wait_line(&last, since, Duration::from_secs(300))?;
        Ok(())
    }

    fn start_link(&self, i: usize) -> Result<(), BenchError> {
        let mut p = lock(&self.links[i]);
        p.start()?;
        let port = self.link_urls[i]
            .rsplit(':')
            .next()
            .and_then(|x| x.parse().ok())
            .unwrap_or(0);
        wait_port(port, Duration::from_secs(20))
    }

    /// Carry out one fault; returns when it is over (restarts done) with what was seen.
    /// `during` runs once the fault is in place and holds it: the fault ends when it returns.
    pub fn apply(
        &self,
        f: &Fault,
        model: &Arc<Model>,
        during: &dyn Fn(&Fault),
    ) -> Result<FaultRecord, BenchError> {
        let start = self.now();
        let mut rec = FaultRecord {
            fault: f.clone(),
            started_s: start,
            ended_s: start,
            recovery_s: None,
            note: String::new(),
        };
        match f.kind {
            Kind::StopRedis => {
                let code = lock(&self.redis).term(Duration::from_secs(10));
                during(f);
                rec.note = format!("redis-server exited with {code:?}");
            }
            Kind::StartRedis => {
                lock(&self.redis).start()?;
                during(f);
                // Recovered when a cloud node next reads a prompt's KV from Redis (the
                // cloud restart that follows in the schedule does).
                rec.note =
                    "recovery: first shared-tier hit in a cloud log after the restart (Redis is read \
                     when a cloud node lacks a prompt: here at the next cloud restart)"
                    .into();
            }
            Kind::KillCloud | Kind::CutLink => {
                let (procs, what) = match f.kind {
                    Kind::KillCloud => (&self.clouds, "kill"),
                    _ => (&self.links, "cut"),
                };
                lock(&procs[f.target]).kill9();
                during(f);
                match f.kind {
                    Kind::KillCloud => self.start_cloud(f.target)?,
                    _ => self.start_link(f.target)?,
                }
                rec.recovery_s = probe(&self.link_urls[f.target], model, Duration::from_secs(60))
                    .map(|_| self.now() - start);
                rec.note =
                    format!("recovery: first whole KV fetch through the link after the {what}");
            }
            Kind::DiskUnwritable => {
                // The directory moved away and a plain file in its place: every write (and
                // read) fails, as on a vanished mount. (A read-only mode would not do: root,
                // which CI runs as, writes regardless.)
                let dir = &self.caches[f.target];
                let aside = dir.with_extension("aside");
                std::fs::rename(dir, &aside)?;
                std::fs::write(dir, b"not a directory")?;
                during(f);
                std::fs::remove_file(dir)?;
                std::fs::rename(&aside, dir)?;
                rec.note = format!("{} replaced by a file", dir.display());
            }
            Kind::FillBudget => {
                during(f);
                rec.note = "a burst of long requests (see the burst outcomes)".into();
            }
        }
        rec.ended_s = self.now();
        Ok(rec)
    }

    /// The first time, at or after `since`, that a cloud node read a prompt's KV from Redis.
    pub fn first_shared_hit(&self, since: f64) -> Option<f64> {
        self.clouds
            .iter()
            .filter_map(|c| lock(c).line_after("from the shared tier", since))
            .reduce(f64::min)
    }

    /// Lines containing "panicked" in any process's output, with the process name.
    pub fn panics(&self) -> Vec<String> {
        let all = std::iter::once(&self.redis)
            .chain(&self.clouds)
            .chain(&self.links)
            .chain(&self.edges);
        let mut out = Vec::new();
        for p in all {
            let p = lock(p);
            let log = p.log.clone();
            let l = lock(&log);
            out.extend(
                l.iter()
                    .filter(|(_, s)| s.contains("panicked"))
                    .map(|(t, s)| format!("{} [{t:.1}] {s}", p.name)),
            );
        }
        out
    }

    /// SIGTERM each edge (a graceful drain) and return their exit codes.
    pub fn stop_edges(&self) -> Vec<Option<i32>> {
        self.edges
            .iter()
            .map(|e| lock(e).term(Duration::from_secs(40)))
            .collect()
    }
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A TOML basic string.
pub(crate) fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Fetch `p0` whole through `url` until it works or `within` passes; the time it worked.
fn probe(url: &str, model: &Arc<Model>, within: Duration) -> Option<Instant> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let until = Instant::now() + within;
    rt.block_on(async {
        while Instant::now() < until {
            if fetch_once(url, model, "p0").await {
                return Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    })
}

/// Whether `url` streams prompt `id`'s every layer.
pub(crate) async fn fetch_once(url: &str, model: &Model, id: &str) -> bool {
    let Ok(mut c) = edgeprompt_edge::CloudClient::connect(url).await else {
        return false;
    };
    let Ok((header, mut rx)) = c
        .fetch(model, PromptRef::Id(id.into()), &[Codec::F16], false)
        .await
    else {
        return false;
    };
    for _ in 0..header.n_layers {
        match rx.recv().await {
            Some(Ok(_)) => {}
            _ => return false,
        }
    }
    true
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct FaultRecord {
    pub fault: Fault,
    pub started_s: f64,
    pub ended_s: f64,
    /// Seconds from the fault to the service it broke working again.
    pub recovery_s: Option<f64>,
    pub note: String,
}
