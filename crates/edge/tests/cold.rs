//! A cold cloud prompt inside the server: the first requests on it join the batch at once and
//! prefill their private layer `l` as cloud layer `l` lands, over a real shaped link; they
//! share one fetch, a decoding batch keeps producing tokens meanwhile, and every answer equals
//! the warm path's and the single node's.

use std::sync::Arc;

use edgeprompt_cloud::{CloudNode, CloudService, PromptSpec};
use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
use edgeprompt_edge::layer_stream::LayerStream;
use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::prefixes::{PrefixConfig, UnknownSystem};
use edgeprompt_edge::scheduler::{Batcher, Event, Extras, SchedulerConfig};
use edgeprompt_engine::{Model, PrefixKv, Sequence};
use edgeprompt_link::{Link, Profile};
use edgeprompt_protocol::cloud_kv_server::{CloudKv, CloudKvServer};
use edgeprompt_protocol::{
    fetch_message::Body, FetchMessage, FetchRequest, ListReply, ListRequest,
};

use crate::common;
use common::{done, edge_ids, greedy_text, job, model, CODING, SUPPORT};

const USERS: [&str; 3] = [
    "My train was cancelled. What do I get back?",
    "Can I take my bike on the 8:15?",
    "Review: for i in 0..v.len() { sum += v[i]; }",
];

/// A cloud prompt of ~450 tokens: ~10 MB of f16 KV, 1.7 s on a 4g link.
fn long_system() -> String {
    [SUPPORT, CODING].repeat(2).join(" ")
}

fn kv_bytes(m: &Model, tokens: usize) -> u64 {
    let c = &m.cfg;
    (tokens * c.n_layer * c.n_kv_head * c.head_dim * 2 * 2) as u64
}

/// The single node: cloud prompt and private prompt prefilled here, greedy.
fn single_node(m: &Arc<Model>, system: &str, user: &str, n: usize) -> String {
    let (cloud, edge) = edge_ids(m, system, user);
    let mut seq = Sequence::new(m);
    seq.prefill_chunked(m, &cloud, 256).unwrap();
    let logits = seq.prefill(m, &edge).unwrap();
    greedy_text(m, &mut seq, logits, n)
}

/// The cloud's service with its stream's last layer held back until `open` says so: the test,
/// not the clock, decides that the private layers run while the cloud prompt still streams.
#[derive(Clone)]
struct Gated {
    inner: CloudService,
    last_layer: u32,
    open: Arc<tokio::sync::watch::Sender<bool>>,
}

type FetchStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<FetchMessage, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl CloudKv for Gated {
    type FetchStream = FetchStream;

    async fn list(
        &self,
        req: tonic::Request<ListRequest>,
    ) -> Result<tonic::Response<ListReply>, tonic::Status> {
        self.inner.list(req).await
    }

    async fn fetch(
        &self,
        req: tonic::Request<FetchRequest>,
    ) -> Result<tonic::Response<FetchStream>, tonic::Status> {
        let mut inner = self.inner.fetch(req).await?.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let (last, mut open) = (self.last_layer, self.open.subscribe());
        tokio::spawn(async move {
            use tokio_stream::StreamExt;
            while let Some(m) = inner.next().await {
                if let Ok(FetchMessage {
                    body: Some(Body::Chunk(c)),
                }) = &m
                {
                    if c.layer == last {
                        let _ = open.wait_for(|o| *o).await;
                    }
                }
                if tx.send(m).await.is_err() {
                    return;
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_prompt_requests_follow_the_stream_share_one_fetch_and_answer_as_warm() {
    let m = model();
    let system = long_system();
    let specs = vec![PromptSpec {
        id: "long".into(),
        system: system.clone(),
        text: None,
    }];
    let node = Arc::new(CloudNode::new(m.clone(), &specs, 256 << 20).unwrap());
    let open = Arc::new(tokio::sync::watch::Sender::new(false));
    let gated = Gated {
        inner: CloudService(node),
        last_layer: m.cfg.n_layer as u32 - 1,
        open: open.clone(),
    };
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = l.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CloudKvServer::new(gated))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)),
    );
    let link = Link::start("127.0.0.1:0", upstream, Profile::named("4g").unwrap())
        .await
        .unwrap();
    let state = EdgeServer::start(
        m.clone(),
        ServerConfig {
            model_id: "smollm2".into(),
            default_max_tokens: 8,
            api_keys: Default::default(),
        },
        SchedulerConfig::default(),
        PrefixConfig {
            unknown_system: UnknownSystem::Refuse,
            ..common::prefix_config(&format!("http://{}", link.addr))
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, state));

    let ask = move |system: String, user: &'static str| {
        let body = serde_json::json!({
            "model": "smollm2", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]
        });
        let (status, v) = common::post_json(addr, "/v1/chat/completions", &body.to_string());
        assert_eq!(status, 200, "{v}");
        v
    };
    // Three first requests at once on the cold prompt. The cloud's last layer is held until
    // each has run every private layer it could (all but the last): then it is let through.
    let n_layer = m.cfg.n_layer;
    let cold: Vec<serde_json::Value> = {
        let handles: Vec<_> = USERS
            .iter()
            .map(|&u| {
                let s = system.clone();
                tokio::task::spawn_blocking(move || ask(s, u))
            })
            .collect();
        let ran = || async {
            let m =
                tokio::task::spawn_blocking(move || common::http(addr, "GET", "/metrics", "").1);
            metric(&m.await.unwrap(), "edgeprompt_cold_layers_run_total")
        };
        let t = std::time::Instant::now();
        while ran().await < (USERS.len() * (n_layer - 1)) as f64 {
            assert!(t.elapsed().as_secs() < 600, "the private layers never ran");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        open.send_replace(true);
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    };
    let down = link.counters.down();
    let n_tokens = edge_ids(&m, &system, USERS[0]).0.len();
    let one = kv_bytes(&m, n_tokens);
    assert!(
        down >= one && down < one + one / 2,
        "one fetch of {one} bytes expected, {down} came down"
    );
    for (v, user) in cold.iter().zip(USERS) {
        let t = v["edgeprompt"]["timeline"]
            .as_array()
            .unwrap_or_else(|| panic!("a cold request reports its timeline: {v}"));
        assert_eq!(t.len(), n_layer);
        let f = |l: &serde_json::Value, k: &str| l[k].as_f64().unwrap();
        let last = t.iter().map(|l| f(l, "arrived")).fold(0.0, f64::max);
        let early = t.iter().filter(|l| f(l, "compute_start") < last).count();
        eprintln!("{user:?}: {early} of {n_layer} private layers ran before the last cloud layer landed ({last:.2} s)");
        assert_eq!(
            early,
            n_layer - 1,
            "every private layer but the last ran while the last cloud layer was held"
        );
        // The block says where the KV came from and what crossed the link for it: the
        // request's few bytes up, the one fetch down.
        let c = &v["edgeprompt"]["cloud_prompt"];
        assert_eq!(c["source"], "cloud", "{v}");
        assert_eq!(c["tokens"].as_u64(), Some(n_tokens as u64));
        let got = c["bytes_down"].as_u64().unwrap();
        assert!(
            got >= one && got <= down,
            "{got} bytes down of {down} on the link"
        );
        let up = c["bytes_up"].as_u64().unwrap();
        assert!(up > 0 && up < 512, "{up} bytes up");
        let ttft = v["edgeprompt"]["ttft_s"].as_f64().unwrap();
        assert!(ttft >= last, "the first token came before the last layer");
        for (l, x) in t.iter().enumerate() {
            assert_eq!(x["layer"].as_u64(), Some(l as u64));
            assert!(
                f(x, "compute_start") >= f(x, "arrived"),
                "layer {l} ran before it landed"
            );
        }
    }
    // Warm now: same answers, no timeline, nothing more on the link; and the single node's.
    for (c, user) in cold.iter().zip(USERS) {
        let s = system.clone();
        let w = tokio::task::spawn_blocking(move || ask(s, user))
            .await
            .unwrap();
        assert!(w["edgeprompt"].get("timeline").is_none());
        let o = &w["edgeprompt"]["cloud_prompt"];
        assert_eq!(o["source"], "memory", "{w}");
        assert_eq!(
            (o["bytes_up"].as_u64(), o["bytes_down"].as_u64()),
            (Some(0), Some(0))
        );
        let text = |v: &serde_json::Value| v["choices"][0]["message"]["content"].clone();
        assert_eq!(text(c), text(&w), "{user:?}: cold and warm answers differ");
        let want = single_node(&m, &system, user, 8);
        assert_eq!(text(&w).as_str(), Some(want.as_str()), "{user:?}");
    }
    // No more KV came down: at most the cloud's list, asked again behind the requests.
    let more = link.counters.down() - down;
    assert!(
        more < 4096,
        "{more} more bytes came down after the prompt was held"
    );
    let metrics = tokio::task::spawn_blocking(move || common::http(addr, "GET", "/metrics", "").1)
        .await
        .unwrap();
    assert_eq!(metric(&metrics, "edgeprompt_cold_prefills_total"), 3.0);
    assert_eq!(
        metric(&metrics, "edgeprompt_cold_layers_overlapped_total"),
        (3 * (n_layer - 1)) as f64
    );
}

/// `prompt` after `prefix`, alone in a batcher.
fn alone(m: &Arc<Model>, prefix: &Arc<PrefixKv>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut b = Batcher::new(
        m.clone(),
        SchedulerConfig::default(),
        Arc::new(Metrics::new()),
    );
    let (j, mut rx) = job(Some(prefix.clone()), prompt.to_vec(), n);
    b.admit(j).unwrap();
    while !b.is_idle() {
        b.step();
    }
    done(&mut rx).token_ids
}

#[test]
fn a_decoding_batch_keeps_producing_tokens_while_a_cold_prompt_streams() {
    let m = model();
    let system = long_system();
    let (cloud_ids, a_prompt) = edge_ids(&m, &system, USERS[0]);
    let b_prompt = edge_ids(&m, &system, USERS[1]).1;
    let mut seq = Sequence::new(&m);
    seq.prefill_chunked(&m, &cloud_ids, 256).unwrap();
    let prefix = Arc::new(seq.export_prefix(&m).unwrap());
    let n_layer = m.cfg.n_layer;

    let mut b = Batcher::new(
        m.clone(),
        SchedulerConfig::default(),
        Arc::new(Metrics::new()),
    );
    let (a, mut a_rx) = job(Some(prefix.clone()), a_prompt.clone(), 3 * n_layer);
    b.admit(a).unwrap();
    assert_eq!(b.step(), a_prompt.len(), "A's prompt in one step");
    // B's cloud prompt streams in, one layer between steps (the cloud's pace).
    let stream = Arc::new(LayerStream::new(cloud_ids.clone(), n_layer));
    let (bj, mut b_rx) = job(None, b_prompt.clone(), 8);
    b.admit_with(
        bj,
        Extras {
            cold: Some(stream.clone()),
            ..Extras::default()
        },
    )
    .unwrap();
    assert_eq!(b.step(), 1, "no layer yet: A decodes, B waits");
    assert!(b.waits_for_layers());
    for l in 0..n_layer {
        stream.put(l, prefix.layers[l].clone(), 0);
        assert_eq!(b.step(), 1, "layer {l}: A decodes while B's layer runs");
    }
    // Every layer is in; B starts decoding once the prompt is resolved.
    assert!(b.waits_for_layers());
    stream.complete(prefix.clone());
    assert_eq!(b.step(), 2, "B's first token sampled, both decode");
    assert!(!b.waits_for_layers());
    while !b.is_idle() {
        b.step();
    }
    let (a_done, b_done) = (done(&mut a_rx), done(&mut b_rx));
    assert_eq!(a_done.token_ids, alone(&m, &prefix, &a_prompt, 3 * n_layer));
    assert_eq!(b_done.token_ids, alone(&m, &prefix, &b_prompt, 8));
    assert!(a_done.timeline.is_none());
    let t = b_done.timeline.expect("B followed the stream");
    assert_eq!(t.layers.len(), n_layer);
    assert_eq!(b_done.prompt_tokens, cloud_ids.len() + b_prompt.len());
}

#[test]
fn a_cold_prompt_that_fails_ends_its_request_and_not_the_batch() {
    let m = model();
    let (cloud_ids, prompt) = edge_ids(&m, SUPPORT, USERS[0]);
    let mut b = Batcher::new(
        m.clone(),
        SchedulerConfig::default(),
        Arc::new(Metrics::new()),
    );
    let stream = Arc::new(LayerStream::new(cloud_ids, m.cfg.n_layer));
    let (j, mut rx) = job(None, prompt, 4);
    let cold = Extras {
        cold: Some(stream.clone()),
        ..Extras::default()
    };
    b.admit_with(j, cold).unwrap();
    b.step();
    stream.fail("the cloud went away".into());
    b.step();
    assert!(b.is_idle());
    match rx.try_recv() {
        Ok(Event::Failed(e)) => assert!(e.contains("the cloud went away"), "{e}"),
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// Echo with logprobs: a cold prompt's layer-by-layer pass scores the private prompt as the
/// warm path does in prefill chunks (7 tokens here, so chunk boundaries are crossed), every
/// token including the first (scored from the cloud prompt's last position).
#[test]
fn a_cold_prompt_scores_its_private_prompt_as_the_warm_path_does() {
    let m = model();
    let (cloud_ids, prompt) = edge_ids(&m, SUPPORT, USERS[0]);
    let mut seq = Sequence::new(&m);
    seq.prefill_chunked(&m, &cloud_ids, 256).unwrap();
    let prefix = Arc::new(seq.export_prefix(&m).unwrap());
    let scored = |max_tokens: usize, cold: bool| {
        let cfg = SchedulerConfig {
            prefill_chunk: 7,
            ..SchedulerConfig::default()
        };
        let mut b = Batcher::new(m.clone(), cfg, Arc::new(Metrics::new()));
        let stream = Arc::new(LayerStream::new(cloud_ids.clone(), m.cfg.n_layer));
        let (j, mut rx) = job((!cold).then(|| prefix.clone()), prompt.clone(), max_tokens);
        let extras = Extras {
            cold: cold.then(|| stream.clone()),
            logprobs: Some(2),
            echo: true,
            ..Extras::default()
        };
        b.admit_with(j, extras).unwrap();
        for (l, kv) in prefix.layers.iter().enumerate() {
            stream.put(l, kv.clone(), 0);
        }
        stream.complete(prefix.clone());
        while !b.is_idle() {
            b.step();
        }
        done(&mut rx)
    };
    let (warm, cold) = (scored(4, false), scored(4, true));
    assert_eq!(warm.prompt_logprobs.len(), prompt.len());
    assert!(warm.prompt_logprobs.iter().all(|l| l.is_some()));
    assert_eq!(cold.prompt_logprobs, warm.prompt_logprobs);
    assert_eq!(cold.logprobs, warm.logprobs);
    assert_eq!(cold.token_ids, warm.token_ids);
    let only = scored(0, true);
    assert_eq!(only.prompt_logprobs, warm.prompt_logprobs);
    assert_eq!((only.completion_tokens, only.finish_reason), (0, "length"));
}
