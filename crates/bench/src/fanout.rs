//! `edgeprompt-bench fanout`: bytes leaving the cloud against the number of edges, when edges
//! read a published prompt from the object store (as from a CDN) and when the cloud streams it
//! to each over gRPC. Real processes and sockets on loopback: one cloud node, SeaweedFS
//! (`weed mini`), and N edge lookups (the edge's `Prefixes`, each with its own memory), each
//! behind a byte-counting link. Every edge's KV is checked bit for bit against the cloud's.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::prefixes::{PrefixConfig, Prefixes, Source};
use edgeprompt_engine::Model;
use edgeprompt_kv::{BucketStore, SealKey};
use edgeprompt_link::{Link, Profile};
use serde::Serialize;

use crate::inputs::resolve;
use crate::machine::Machine;
use crate::nodes::{cloud_ids, same_kv, serve};
use crate::results::{f, load, machine_of};
use crate::BenchError;

pub struct Settings {
    pub model: PathBuf,
    /// Edge counts, one run per count and path.
    pub edges: Vec<usize>,
    /// Edges fetching at once (each holds a prompt's KV while it fetches).
    pub concurrency: usize,
    /// Words of the cloud prompt (its tokens are reported).
    pub prompt_words: usize,
    pub out: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Row {
    pub edges: usize,
    /// "store" (edges read the object store) or "grpc" (the cloud streams to each).
    pub path: &'static str,
    /// Bytes the cloud node sent (lists, headers, KV), all edges together.
    pub cloud_bytes: u64,
    /// Bytes the store sent.
    pub store_bytes: u64,
    pub seconds: f64,
    /// Edges whose KV came from where the path says, equal to the cloud's bit for bit.
    pub exact: usize,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub model: String,
    pub prompt_tokens: usize,
    /// The prompt's KV in the stored format (one object).
    pub object_bytes: u64,
    pub concurrency: usize,
    pub rows: Vec<Row>,
}

pub fn run(s: &Settings) -> Result<Report, BenchError> {
    let model = Arc::new(Model::load(&s.model).map_err(BenchError::data)?);
    let rt = tokio::runtime::Runtime::new().map_err(BenchError::data)?;
    let weed = edgeprompt_testbed::weed();
    rt.block_on(async {
        let text: Vec<String> = (0..s.prompt_words)
            .map(|i| format!("rule{i}"))
            .collect();
        let system = format!(
            "You are the support assistant of Acme Rail. House rules: {}.",
            text.join(", ")
        );
        let specs = [PromptSpec {
            id: "support".into(),
            system: system.clone(),
            text: None,
        }];
        let bucket = edgeprompt_testbed::bucket(&weed, "fanout");
        let node = Arc::new(
            CloudNode::new(model.clone(), &specs, 1 << 30)
                .map_err(BenchError::data)?
                .with_signing(SealKey::from_seed([8; 32]))
                .with_bucket(bucket.clone()),
        );
        let exact = node.warm("support").await.map_err(|e| BenchError::data(e.message()))?;
        let cloud = serve(node.clone()).await?;
        let cloud_link = Link::start("127.0.0.1:0", cloud.to_string(), Profile::UNLIMITED)
            .await
            .map_err(BenchError::data)?;
        let store_link = Link::start(
            "127.0.0.1:0",
            format!("127.0.0.1:{}", weed.filer),
            Profile::UNLIMITED,
        )
        .await
        .map_err(BenchError::data)?;
        let cdn = format!(
            "http://{}/buckets/edgeprompt-kv/fanout",
            store_link.addr
        );
        let ids = cloud_ids(&model, &system)?;
        let object_bytes = {
            let mut b = Vec::new();
            edgeprompt_kv::write_prefix(&mut b, &exact, None).map_err(BenchError::data)?;
            b.len() as u64
        };
        let mut rows = Vec::new();
        for &n in &s.edges {
            for path in ["store", "grpc"] {
                let (c0, s0) = (cloud_link.counters.down(), store_link.counters.down());
                let t0 = Instant::now();
                let gate = Arc::new(tokio::sync::Semaphore::new(s.concurrency.max(1)));
                let mut tasks = Vec::new();
                for _ in 0..n {
                    let cfg = PrefixConfig {
                        cloud_url: Some(format!("http://{}", cloud_link.addr)),
                        kv_store: match path {
                            "store" => Some(Arc::new(BucketStore::open_with(&cdn, []).map_err(BenchError::data)?)),
                            _ => None,
                        },
                        cache_bytes: 256 << 20,
                        ..Default::default()
                    };
                    let (m, ids, exact, gate) = (model.clone(), ids.clone(), exact.clone(), gate.clone());
                    tasks.push(tokio::spawn(async move {
                        let _turn = gate.acquire_owned().await;
                        let p = Prefixes::new(m, cfg, Arc::new(Metrics::new())).ok()?;
                        let got = p.for_system(&ids).await.ok()?;
                        let want = match path {
                            "store" => Source::Store,
                            _ => Source::Cloud,
                        };
                        Some(got.source == want && same_kv(&got.prefix, &exact))
                    }));
                }
                let mut ok = 0;
                for t in tasks {
                    ok += usize::from(t.await.ok().flatten() == Some(true));
                }
                let row = Row {
                    edges: n,
                    path,
                    cloud_bytes: cloud_link.counters.down() - c0,
                    store_bytes: store_link.counters.down() - s0,
                    seconds: t0.elapsed().as_secs_f64(),
                    exact: ok,
                };
                eprintln!(
                    "{n} edges via {path}: cloud sent {:.1} MB, store {:.1} MB, {:.2} s, {ok} exact",
                    row.cloud_bytes as f64 / 1e6,
                    row.store_bytes as f64 / 1e6,
                    row.seconds
                );
                rows.push(row);
            }
        }
        let report = Report {
            machine: Machine::detect(),
            model: model.cfg.name.clone(),
            prompt_tokens: ids.len(),
            object_bytes,
            concurrency: s.concurrency,
            rows,
        };
        std::fs::create_dir_all(&s.out).map_err(BenchError::data)?;
        let json = serde_json::to_string_pretty(&report).map_err(BenchError::data)?;
        std::fs::write(s.out.join("fanout.json"), json).map_err(BenchError::data)?;
        Ok(report)
    })
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
    edges: Vec<usize>,
    /// Edges fetching at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Words in the cloud prompt's house rules (about 3 tokens each).
    #[arg(long, default_value_t = 300)]
    prompt_words: usize,
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

/// `edgeprompt-bench fanout`: the settings from the flags, the run, and what it wrote.
pub fn cli(a: Args) -> Result<(), BenchError> {
    let s = Settings {
        model: resolve(&a.model)?,
        edges: a.edges.clone(),
        concurrency: a.concurrency,
        prompt_words: a.prompt_words,
        out: a.out.clone(),
    };
    let r = run(&s)?;
    eprintln!(
        "wrote {} rows to {}/fanout.json",
        r.rows.len(),
        a.out.display()
    );
    Ok(())
}

/// The section of `docs/results.md` from `<sub>fanout.json`.
pub fn section(dir: &Path, sub: &str, md: &mut String) {
    let Some(v) = load(dir, &format!("{sub}fanout.json")) else {
        return;
    };
    let _ = writeln!(
        md,
        "## Fan-out: edges reading the object store (`edgeprompt-bench fanout`)\n\n{}; model {}; one \
         cloud node and SeaweedFS (`weed mini`) on loopback, a published prompt of {} tokens ({:.1} MB \
         as one object), N edge lookups ({} at once) each behind a byte-counting link; `store`: edges \
         read the object over HTTP (the filer, standing for a CDN), `grpc`: the cloud streams it to \
         each (`{sub}fanout.json`).\n\n\
         | edges | path | bytes from the cloud | MB from the store | seconds | exact |\n\
         | --- | --- | --- | --- | --- | --- |",
        machine_of(&v["machine"]),
        v["model"].as_str().unwrap_or("?"),
        v["prompt_tokens"],
        f(&v["object_bytes"]) / 1e6,
        v["concurrency"],
    );
    for r in v["rows"].as_array().into_iter().flatten() {
        let cloud = f(&r["cloud_bytes"]);
        let shown = match cloud >= 1e6 {
            true => format!("{:.1} MB", cloud / 1e6),
            false => format!("{:.1} kB", cloud / 1e3),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {shown} | {:.1} | {:.2} | {} of {} |",
            r["edges"],
            r["path"].as_str().unwrap_or("?"),
            f(&r["store_bytes"]) / 1e6,
            f(&r["seconds"]),
            r["exact"],
            r["edges"],
        );
    }
    md.push('\n');
}
