//! Hybrid models through the real server at every cloud prompt length around the convolution
//! width: for Qwen3.5 (Gated DeltaNet) and LFM2 (short convolutions), a signing cloud node holds
//! cloud prompts of 1, 2, 3, 4, 5, 63, 64, 65 and 1000 tokens; an edge server answers a
//! completion after each, one request at a time and all at once (batched), and every answer is
//! the single-node answer on the concatenated ids, token for token, each token's log-probability
//! bit for bit (random weights answer in few distinct tokens; the log-probabilities tell apart
//! any difference in the logits). Gemma 4 likewise around its window of 16 (1, 2, 15, 16, 17,
//! 40 and 1000 tokens): its last layers read earlier layers' KV, sent once.

use std::sync::Arc;
use std::time::Duration;

use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_edge::http::access::ApiKeys;
use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_engine::Model;

use crate::common;
use common::post_json;

const LENGTHS: [usize; 9] = [1, 2, 3, 4, 5, 63, 64, 65, 1000];
/// Around the synthetic Gemma 4's window (16 positions).
const WINDOW_LENGTHS: [usize; 7] = [1, 2, 15, 16, 17, 40, 1000];
const PRIVATE: &str = " My booking leaves in six hours. What do I get back?";
const ANSWER: usize = 8;

/// A cloud prompt of exactly `n` tokens: one word repeated.
fn cloud_text(m: &Model, n: usize) -> String {
    let text = format!("the{}", " the".repeat(n - 1));
    let ids = m.tokenizer.encode_prompt(&text).unwrap();
    assert_eq!(ids.len(), n, "{text:?} is {} tokens", ids.len());
    text
}

/// An answer: its text and each token's log-probability.
type Answer = (String, Vec<f32>);

/// The edge's answer after cloud prompt `p{n}`, which came from `source` (`cloud`, or `memory`:
/// the states and KV the cloud sent, kept).
async fn ask(addr: std::net::SocketAddr, n: usize, source: &'static str) -> Answer {
    let body = serde_json::json!({
        "model": "synth", "cloud_prompt": format!("p{n}"), "prompt": PRIVATE,
        "max_tokens": ANSWER, "temperature": 0, "logprobs": 0,
    })
    .to_string();
    let (status, v) =
        tokio::task::spawn_blocking(move || post_json(addr, "/v1/completions", &body))
            .await
            .unwrap();
    assert_eq!(status, 200, "{n} tokens: {v}");
    assert_eq!(v["edgeprompt"]["cloud_prompt"]["source"], source, "{n}");
    common::completion_answer(&v)
}

#[test]
fn hybrid_answers_equal_single_node_at_every_length_alone_and_batched() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let models = [
        ("qwen35", &LENGTHS[..]),
        ("lfm2", &LENGTHS[..]),
        ("gemma4", &WINDOW_LENGTHS[..]),
    ];
    for (name, lengths) in models {
        let m =
            Arc::new(Model::load(common::models_dir().join(format!("synth/{name}.gguf"))).unwrap());
        let texts: Vec<String> = lengths.iter().map(|&n| cloud_text(&m, n)).collect();
        let want: Vec<Answer> = texts
            .iter()
            .map(|t| common::plain_single_node(&m, t, PRIVATE, ANSWER))
            .collect();
        let tokens: usize = want.iter().map(|w| w.1.len()).sum();
        assert!(
            tokens >= lengths.len(),
            "{name}: {tokens} answer tokens to compare"
        );
        rt.block_on(async {
            let specs = lengths
                .iter()
                .zip(&texts)
                .map(|(n, t)| PromptSpec {
                    id: format!("p{n}"),
                    system: String::new(),
                    text: Some(t.clone()),
                })
                .collect::<Vec<_>>();
            let node = Arc::new(CloudNode::new(m.clone(), &specs, 256 << 20).unwrap());
            let cloud = common::serve_cloud(node).await;
            let state = EdgeServer::start(
                m.clone(),
                ServerConfig {
                    model_id: "synth".into(),
                    default_max_tokens: ANSWER,
                    api_keys: ApiKeys::default(),
                },
                SchedulerConfig {
                    request_timeout: Duration::from_secs(120),
                    ..Default::default()
                },
                common::prefix_config(&cloud),
            )
            .unwrap();
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            tokio::spawn(serve(l, state));
            for (n, want) in lengths.iter().zip(&want) {
                assert_eq!(
                    &ask(addr, *n, "cloud").await,
                    want,
                    "{name}: {n} tokens, alone"
                );
            }
            let all: Vec<_> = lengths
                .iter()
                .map(|&n| tokio::spawn(ask(addr, n, "memory")))
                .collect();
            for ((n, got), want) in lengths.iter().zip(all).zip(&want) {
                assert_eq!(&got.await.unwrap(), want, "{name}: {n} tokens, batched");
            }
        });
    }
}
