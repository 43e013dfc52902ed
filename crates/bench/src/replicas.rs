//! `edgeprompt-bench replicas`: the scale-out curve. 1, 2, 3 ... cloud replicas behind one
//! object store (SeaweedFS) and one Redis, all on loopback; edges ask for published prompts
//! (each prompt's replica picked by rendezvous hashing). Counted: prefills across the replicas
//! (the lease makes it the number of distinct prompts), what each replica served, completed
//! lookups and their latency (an edge's time to the prompt's KV, its TTFT before the private
//! part), every KV checked bit for bit against a single node's.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_cloud::guard::Limits;
use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::prefixes::{PrefixConfig, Prefixes, Source};
use edgeprompt_engine::{Model, PrefixKv};
use edgeprompt_kv::{RedisStore, SealKey};
use serde::Serialize;

use crate::inputs::resolve;
use crate::machine::Machine;
use crate::nodes::{cloud_ids, same_kv, serve};
use crate::results::{f, load, machine_of};
use crate::BenchError;

pub struct Settings {
    pub model: PathBuf,
    pub replicas: Vec<usize>,
    /// Distinct published prompts.
    pub prompts: usize,
    /// Edge lookups per run, all started at once, each for a prompt drawn with `seed`.
    pub lookups: usize,
    pub prompt_words: usize,
    pub seed: u64,
    pub out: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Row {
    pub replicas: usize,
    /// Prefills across the replicas (goal: `prompts`).
    pub prefills: usize,
    /// Prompts each replica found in a shared tier instead of prefilling.
    pub shared_hits: Vec<usize>,
    pub completed: usize,
    /// Lookups whose KV came from the cloud (the rest computed at the edge after a refusal).
    pub from_cloud: usize,
    pub exact: usize,
    pub p50_s: f64,
    pub p99_s: f64,
    pub seconds: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub prompts: usize,
    pub lookups: usize,
    pub prompt_tokens: usize,
    pub rows: Vec<Row>,
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let model = Arc::new(Model::load(&s.model).map_err(BenchError::data)?);
    let rt = tokio::runtime::Runtime::new().map_err(BenchError::data)?;
    let weed = edgeprompt_testbed::weed();
    let (_redis, redis_url) = edgeprompt_testbed::redis::single();
    let specs: Vec<PromptSpec> = (0..s.prompts)
        .map(|p| PromptSpec {
            id: format!("p{p}"),
            system: format!(
                "You are assistant number {p} of Acme Rail. House rules: {}.",
                (0..s.prompt_words)
                    .map(|i| format!("rule{p}x{i}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            text: None,
        })
        .collect();
    let ids: Vec<Vec<u32>> = specs
        .iter()
        .map(|p| cloud_ids(&model, &p.system))
        .collect::<Result<_, _>>()?;
    // The reference: each prompt's KV on a single node with no tier.
    let reference: Vec<Arc<PrefixKv>> = rt.block_on(async {
        let solo =
            Arc::new(CloudNode::new(model.clone(), &specs, 4 << 30).map_err(BenchError::data)?);
        let mut out = Vec::new();
        for p in &specs {
            out.push(
                solo.warm(&p.id)
                    .await
                    .map_err(|e| BenchError::data(e.message()))?,
            );
        }
        Ok::<_, BenchError>(out)
    })?;
    let mut rng = s.seed | 1;
    let draws: Vec<usize> = (0..s.lookups)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % s.prompts as u64) as usize
        })
        .collect();
    let mut rows = Vec::new();
    for &r in &s.replicas {
        let row = rt.block_on(async {
            // A deployment of its own per run: cold tiers.
            let ns = format!("scale-{r}");
            let mut nodes = Vec::new();
            let mut urls = Vec::new();
            for _ in 0..r {
                let n = Arc::new(
                    CloudNode::new(model.clone(), &specs, 4 << 30)
                        .map_err(BenchError::data)?
                        .with_signing(SealKey::from_seed([9; 32]))
                        // Every simulated edge is 127.0.0.1: no per-client rate between them.
                        .with_guard(
                            Limits {
                                max_streams: 1024,
                                per_client_rate: 1e6,
                                per_client_burst: 1e6,
                            },
                            None,
                        )
                        .with_shared(Arc::new(
                            RedisStore::open(&redis_url, &ns).map_err(BenchError::data)?,
                        ))
                        .with_bucket(edgeprompt_testbed::bucket(&weed, &ns)),
                );
                urls.push(format!("http://{}", serve(n.clone()).await?));
                nodes.push(n);
            }
            let t0 = Instant::now();
            let mut tasks = Vec::new();
            for &d in &draws {
                let cfg = PrefixConfig {
                    cloud_url: Some(urls[0].clone()),
                    cloud_replicas: urls[1..].to_vec(),
                    cache_bytes: 256 << 20,
                    ..Default::default()
                };
                let (m, ids, want) = (model.clone(), ids[d].clone(), reference[d].clone());
                tasks.push(tokio::spawn(async move {
                    let asked = Instant::now();
                    let p = Prefixes::new(m, cfg, Arc::new(Metrics::new())).ok()?;
                    let got = p.for_system(&ids).await.ok()?;
                    let cloud = got.source == Source::Cloud;
                    Some((
                        asked.elapsed().as_secs_f64(),
                        same_kv(&got.prefix, &want),
                        cloud,
                    ))
                }));
            }
            let mut lat = Vec::new();
            let (mut exact, mut from_cloud) = (0, 0);
            for t in tasks {
                if let Ok(Some((secs, ok, cloud))) = t.await {
                    lat.push(secs);
                    exact += usize::from(ok);
                    from_cloud += usize::from(cloud);
                }
            }
            lat.sort_by(f64::total_cmp);
            let at = |q: f64| {
                lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
                    .copied()
                    .unwrap_or(f64::NAN)
            };
            let row = Row {
                replicas: r,
                prefills: nodes.iter().map(|n| n.prefills()).sum(),
                shared_hits: nodes.iter().map(|n| n.shared_hits()).collect(),
                completed: lat.len(),
                from_cloud,
                exact,
                p50_s: at(0.5),
                p99_s: at(0.99),
                seconds: t0.elapsed().as_secs_f64(),
            };
            Ok::<_, BenchError>(row)
        })?;
        eprintln!(
            "{r} replicas: {} prefills for {} prompts, shared hits {:?}, {} of {} done ({} from the cloud, {} exact), p50 {:.2} s p99 {:.2} s",
            row.prefills, s.prompts, row.shared_hits, row.completed, s.lookups, row.from_cloud, row.exact, row.p50_s, row.p99_s
        );
        rows.push(row);
    }
    let report = Report {
        machine: Machine::detect(),
        model: model.cfg.name.clone(),
        prompts: s.prompts,
        lookups: s.lookups,
        prompt_tokens: ids.iter().map(Vec::len).sum::<usize>() / ids.len().max(1),
        rows,
    };
    std::fs::create_dir_all(&s.out).map_err(BenchError::data)?;
    let json = serde_json::to_string_pretty(&report).map_err(BenchError::data)?;
    std::fs::write(s.out.join("replicas.json"), json).map_err(BenchError::data)?;
    Ok(report)
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    replicas: Vec<usize>,
    #[arg(long, default_value_t = 12)]
    prompts: usize,
    #[arg(long, default_value_t = 96)]
    lookups: usize,
    #[arg(long, default_value_t = 100)]
    prompt_words: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench replicas`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let s = Settings {
        model: resolve(&a.model)?,
        replicas: a.replicas.clone(),
        prompts: a.prompts.max(1),
        lookups: a.lookups,
        prompt_words: a.prompt_words,
        seed: a.seed,
        out: a.out.clone(),
    };
    let r = run(&s)?;
    eprintln!(
        "wrote {} rows to {}/replicas.json",
        r.rows.len(),
        a.out.display()
    );
    Ok(())
}

/// The section of `docs/results.md` from `<sub>replicas.json`.
pub fn section(dir: &Path, sub: &str, md: &mut String) {
    let Some(v) = load(dir, &format!("{sub}replicas.json")) else {
        return;
    };
    let _ = writeln!(
        md,
        "## Scale-out: cloud replicas behind one store (`edgeprompt-bench replicas`)\n\n{}; model {}; \
         R cloud replicas (in one process, real gRPC) sharing one `redis-server` and SeaweedFS, \
         cold for each R; {} edge lookups started at once over {} published prompts of {} tokens \
         (each prompt's replica by rendezvous hashing); latency is an edge's time to the prompt's \
         whole KV (`{sub}replicas.json`).\n\n\
         | replicas | prefills | shared-tier hits per replica | completed | from the cloud | exact | p50 s | p99 s | wall s |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        machine_of(&v["machine"]),
        v["model"].as_str().unwrap_or("?"),
        v["lookups"],
        v["prompts"],
        v["prompt_tokens"],
    );
    for r in v["rows"].as_array().into_iter().flatten() {
        let hits: Vec<String> = r["shared_hits"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|h| h.to_string())
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
            r["replicas"],
            r["prefills"],
            hits.join(" / "),
            r["completed"],
            r["from_cloud"],
            r["exact"],
            f(&r["p50_s"]),
            f(&r["p99_s"]),
            f(&r["seconds"]),
        );
    }
    md.push('\n');
}
