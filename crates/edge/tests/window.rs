//! Gemma 3 over real loopback gRPC: the cloud streams a sliding-window layer cut to the
//! positions a private token can still see, the bytes on the wire are exactly the formula's,
//! and the pipelined edge answers bit for bit what single-node inference answers; the same
//! model served over HTTP (completions after a cloud prompt; chat refused without a template).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_edge::{prefill_from_cloud, CloudClient};
use edgeprompt_engine::sample::argmax;
use edgeprompt_engine::{Model, Sequence};
use edgeprompt_kv::Codec;
use edgeprompt_protocol::PromptRef;

use crate::common;

const CLOUD_TOKENS: usize = 2048;

fn gemma3() -> Arc<Model> {
    common::load("gemma-3-270m-q4_k_m.gguf")
}

/// A text that tokenizes (BOS included) to exactly `n` tokens: ShareGPT answers joined.
fn text_of(model: &Model, n: usize) -> String {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/split_pairs.json");
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let all: String = fx["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| format!("{}\n\n", p["cloud"].as_str().unwrap()))
        .collect();
    let ids = model.tokenizer.encode_prompt(&all).unwrap();
    assert!(ids.len() > n + 8, "not enough text");
    // Cutting the ids and decoding may re-tokenize differently at the seam: try nearby cuts.
    (n - 4..n + 4)
        .map(|k| model.tokenizer.decode(&ids[1..k]).unwrap())
        .find(|t| model.tokenizer.encode_prompt(t).unwrap().len() == n)
        .expect("a cut that re-tokenizes to n tokens")
}

fn greedy(model: &Model, seq: &mut Sequence, mut logits: Vec<f32>, n: usize) -> Vec<u32> {
    let mut out = Vec::new();
    for _ in 0..n {
        let id = argmax(&logits);
        out.push(id);
        logits = seq.prefill(model, &[id]).unwrap();
    }
    out
}

/// A cloud node serving `text` as the plain-text prompt "manual"; its URL.
async fn start_cloud(m: &Arc<Model>, text: &str) -> String {
    let specs = vec![PromptSpec {
        id: "manual".into(),
        system: String::new(),
        text: Some(text.into()),
    }];
    let node = Arc::new(CloudNode::new(m.clone(), &specs, 256 << 20).unwrap());
    let url = common::serve_cloud(node).await;
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow: run in CI with --include-ignored"]
async fn sliding_layers_are_cut_on_the_wire_and_the_answer_is_exact() {
    let m = gemma3();
    let text = text_of(&m, CLOUD_TOKENS);
    let url = start_cloud(&m, &text).await;
    let cloud_ids = m.tokenizer.encode_prompt(&text).unwrap();
    let edge_ids = m
        .tokenizer
        .encode("\n\nQuestion: what is this text about?\nAnswer:")
        .unwrap();

    // Single node: the whole prompt here.
    let want = {
        let (m, all) = (m.clone(), [&cloud_ids[..], &edge_ids[..]].concat());
        tokio::task::spawn_blocking(move || {
            let mut seq = Sequence::new(&m);
            let logits = seq.prefill(&m, &all).unwrap();
            greedy(&m, &mut seq, logits, 16)
        })
        .await
        .unwrap()
    };

    // Bytes per token of one layer (K and V, f16): the formula the wire must match.
    let c = &m.cfg;
    let per_token = 2 * c.n_kv_head * c.head_dim * 2;
    let sliding = c.sliding.iter().filter(|&&s| s).count();
    let full = c.n_layer - sliding;
    let window = c.window.unwrap();
    let formula = (full * CLOUD_TOKENS + sliding * (window - 1)) * per_token;
    eprintln!(
        "gemma3: {full} full + {sliding} sliding layers, {CLOUD_TOKENS}-token cloud prompt: \
         {formula} bytes expected, {} without the cut",
        c.n_layer * CLOUD_TOKENS * per_token
    );
    // Cold (computed while streaming), then warm (from the cloud's cache, kept cut).
    for round in ["cold", "warm"] {
        let mut client = CloudClient::connect(&url).await.unwrap();
        let (header, mut rx) = client
            .fetch(&m, PromptRef::Id("manual".into()), &[Codec::F16], false)
            .await
            .unwrap();
        assert_eq!(header.token_ids, cloud_ids);
        let starts: Vec<usize> = (0..c.n_layer)
            .map(|l| c.visible_from(l, CLOUD_TOKENS))
            .collect();
        assert_eq!(
            header.layer_starts, starts,
            "the header says what each layer holds"
        );
        let (m2, ids) = (m.clone(), edge_ids.clone());
        let (got, bytes) = tokio::task::spawn_blocking(move || {
            let (mut seq, logits, tl) =
                prefill_from_cloud(&m2, &header, &mut rx, &ids, Instant::now(), true).unwrap();
            (greedy(&m2, &mut seq, logits, 16), tl.bytes_down())
        })
        .await
        .unwrap();
        eprintln!("{round}: {bytes} bytes down, answer {got:?}");
        assert_eq!(bytes, formula, "{round}: bytes on the wire");
        assert_eq!(got, want, "{round}: split answer differs from single-node");
    }
}

/// Greedy text of `n` tokens after `ids`, single node.
fn single_node_text(m: &Model, ids: &[u32], n: usize) -> String {
    let mut seq = Sequence::new(m);
    let logits = seq.prefill(m, ids).unwrap();
    common::greedy_text(m, &mut seq, logits, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow: run in CI with --include-ignored"]
async fn gemma_is_served_over_http_completions() {
    use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
    let m = gemma3();
    let text = text_of(&m, 700);
    let cloud = start_cloud(&m, &text).await;
    let state = EdgeServer::start(
        m.clone(),
        ServerConfig {
            model_id: "gemma3".into(),
            default_max_tokens: 16,
            api_keys: Default::default(),
        },
        Default::default(),
        common::prefix_config(&cloud),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, state));
    let question = "\n\nQuestion: what is this text about?\nAnswer:";
    let body = move |cloud: bool| {
        let mut v = serde_json::json!({
            "model": "gemma3", "prompt": question, "max_tokens": 16, "temperature": 0
        });
        if cloud {
            v["cloud_prompt"] = "manual".into();
        }
        v.to_string()
    };
    let (m2, q) = (m.clone(), question.to_string());
    let (split, alone, chat, want_split, want_alone) = tokio::task::spawn_blocking(move || {
        let split = common::post_json(addr, "/v1/completions", &body(true));
        let alone = common::post_json(addr, "/v1/completions", &body(false));
        let chat = common::post_json(
            addr,
            "/v1/chat/completions",
            r#"{"model": "gemma3", "messages": [{"role": "user", "content": "hi"}]}"#,
        );
        let cloud_ids = m2.tokenizer.encode_prompt(&text).unwrap();
        let ids = [cloud_ids, m2.tokenizer.encode(&q).unwrap()].concat();
        let want_split = single_node_text(&m2, &ids, 16);
        let want_alone = single_node_text(&m2, &m2.tokenizer.encode_prompt(&q).unwrap(), 16);
        (split, alone, chat, want_split, want_alone)
    })
    .await
    .unwrap();
    assert_eq!(split.0, 200, "{}", split.1);
    assert_eq!(
        split.1["choices"][0]["text"],
        want_split.as_str(),
        "after the cloud prompt"
    );
    assert_eq!(alone.0, 200, "{}", alone.1);
    assert_eq!(
        alone.1["choices"][0]["text"],
        want_alone.as_str(),
        "BOS added on its own"
    );
    assert_eq!(chat.0, 400, "chat without a template: {}", chat.1);
    let msg = chat.1["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("chat template"), "{msg}");
}
