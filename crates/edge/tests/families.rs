//! The cloud/edge split for every model family the engine loads, through the real server: for
//! each synthetic GGUF of `scripts/ref/synth.py` (random weights in the family's own tensors and
//! metadata), a signing cloud node streams a plain-text cloud prompt, an edge server takes the
//! cloud's layers from several split points (computing the ones below itself) and answers a
//! completion; the answer is the single-node answer on the concatenated ids, token for token.
//! Gemma 2's sliding-window layers arrive cut to the window, as Gemma 3's do; the recurrent
//! layers of Qwen3.5, Qwen3.5-MoE and LFM2 arrive as their state at the prompt's end, signed,
//! and no positions; Gemma 4's last layers, which read earlier layers' KV, do not arrive at all
//! (nothing sent, nothing signed), its sliding layers cut, of their own head size.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_edge::http::access::ApiKeys;
use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::prefixes::{PrefixConfig, Prefixes};
use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_engine::Model;

use crate::common;
use common::post_json;

/// Each family, and a Llama whose every matrix is in one of the formats the packed kernels
/// gained after the first six, or in f16 or bf16 (the float kernels).
const FAMILIES: [&str; 19] = [
    "qwen3",
    "gemma4",
    "qwen35",
    "qwen35moe",
    "lfm2",
    "llama3",
    "granite",
    "smollm3",
    "phi3",
    "gemma2",
    "qwen3moe",
    "fmt_q5_1",
    "fmt_q2_k",
    "fmt_q3_k",
    "fmt_q5_k",
    "fmt_iq4_nl",
    "fmt_iq4_xs",
    "fmt_f16",
    "fmt_bf16",
];

const CLOUD: &str = "Acme Rail handbook. Tickets are refundable in full up to 24 hours before \
departure; after that a 20% fee applies. Seat changes are free. Pets travel free in carriers.";
const PRIVATE: &str = " My booking 7781-XK leaves in six hours. What do I get back?";

fn synth(name: &str) -> Arc<Model> {
    let p: PathBuf = common::models_dir()
        .join("synth")
        .join(format!("{name}.gguf"));
    assert!(
        p.exists(),
        "{} missing: run python3 scripts/ref/synth.py (scripts/test.sh does)",
        p.display()
    );
    Arc::new(Model::load(p).unwrap())
}

/// The greedy answer (8 tokens at most) after the cloud prompt and the private text, on one
/// node: its text and its tokens' log-probabilities.
fn single_node(m: &Model) -> (String, Vec<f32>) {
    common::plain_single_node(m, CLOUD, PRIVATE, 8)
}

async fn edge(m: &Arc<Model>, cloud: &str, split: usize) -> std::net::SocketAddr {
    let state = EdgeServer::start(
        m.clone(),
        ServerConfig {
            model_id: "synth".into(),
            default_max_tokens: 8,
            api_keys: ApiKeys::default(),
        },
        SchedulerConfig {
            request_timeout: Duration::from_secs(120),
            ..Default::default()
        },
        PrefixConfig {
            cloud_layers_from: split,
            ..common::prefix_config(cloud)
        },
    )
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve(l, state));
    addr
}

#[test]
fn every_family_splits_exactly_through_the_server_at_several_layers() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for name in FAMILIES {
        let m = synth(name);
        let (want, want_lps) = single_node(&m);
        assert!(!want.is_empty(), "{name}: an answer to compare");
        let n = m.cfg.n_layer;
        rt.block_on(async {
            let specs = vec![PromptSpec {
                id: "doc".into(),
                system: String::new(),
                text: Some(CLOUD.into()),
            }];
            let node = Arc::new(CloudNode::new(m.clone(), &specs, 64 << 20).unwrap());
            let cloud = common::serve_cloud(node).await;
            for split in [0, n / 2, n - 1] {
                let addr = edge(&m, &cloud, split).await;
                let body = serde_json::json!({
                    "model": "synth", "cloud_prompt": "doc", "prompt": PRIVATE,
                    "max_tokens": 8, "temperature": 0, "logprobs": 0,
                })
                .to_string();
                let (status, v) =
                    tokio::task::spawn_blocking(move || post_json(addr, "/v1/completions", &body))
                        .await
                        .unwrap();
                assert_eq!(status, 200, "{name} split {split}: {v}");
                assert_eq!(v["edgeprompt"]["cloud_prompt"]["source"], "cloud", "{name}");
                let got = v["choices"][0]["text"].as_str().unwrap();
                assert_eq!(got, want, "{name}: split at layer {split} of {n}");
                // Bit for bit: random weights answer in few distinct tokens.
                let (_, lps) = common::completion_answer(&v);
                assert_eq!(lps, want_lps, "{name}: log-probabilities, split at {split}");
            }
            let prefixes = || {
                Prefixes::new(
                    m.clone(),
                    common::prefix_config(&cloud),
                    Arc::new(Metrics::new()),
                )
                .unwrap()
            };
            if name.starts_with("qwen35") || name == "lfm2" {
                let got = prefixes().for_id("doc").await.unwrap();
                let n = got.prefix.n_tokens();
                for (l, layer) in got.prefix.layers.iter().enumerate() {
                    let recurrent = m.cfg.is_recurrent(l);
                    assert_eq!(layer.state.is_some(), recurrent, "{name} layer {l}");
                    assert_eq!(
                        layer.len(),
                        if recurrent { 0 } else { n },
                        "{name} layer {l}"
                    );
                }
            }
            if name == "gemma4" {
                let p = prefixes();
                let got = p.for_id("doc").await.unwrap();
                let (c, n) = (&m.cfg, got.prefix.n_tokens());
                for (l, layer) in got.prefix.layers.iter().enumerate() {
                    let rows = match (c.owns_kv(l), c.window_of(l)) {
                        (false, _) => 0,
                        (true, Some(w)) => n.min(w - 1),
                        (true, None) => n,
                    };
                    assert_eq!(layer.len(), rows, "gemma4 layer {l}");
                    assert_eq!(layer.head_dim, c.head_dim_of(l), "gemma4 layer {l}");
                    let reads = (!c.owns_kv(l)).then(|| c.kv_source_of(l));
                    assert_eq!(layer.kv_of, reads, "gemma4 layer {l}");
                }
                // Kept signed: one signature per layer that owns KV, none for the others.
                let address = edgeprompt_kv::content_address(&m.fingerprint, &got.prefix.token_ids);
                let (_, seal) = p.cached(&address).await.unwrap();
                let owners = (0..c.n_layer).filter(|&l| c.owns_kv(l)).count();
                assert_eq!(seal.unwrap().signatures.len(), owners, "gemma4 seal");
            }
            if name == "gemma2" {
                // The sliding layers came cut to the window (16): a later token sees no more.
                let got = prefixes().for_id("doc").await.unwrap();
                let w = m.cfg.window.unwrap();
                for (l, layer) in got.prefix.layers.iter().enumerate() {
                    let cut = m.cfg.window_of(l).is_some();
                    assert_eq!(
                        layer.len() == w - 1,
                        cut,
                        "gemma2 layer {l}: {}",
                        layer.len()
                    );
                }
            }
        });
        println!(
            "{name}: the split answer equals single-node's at layers 0, {}, {}",
            n / 2,
            n - 1
        );
    }
}
