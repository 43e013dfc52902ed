//! The edge's OpenAI-compatible server driven by the real `openai` Python client, with a real
//! cloud node on loopback gRPC and the real SmolLM2 model (the checks are in openai_api.py).

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use edgeprompt_edge::http::access::ApiKeys;
use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
use edgeprompt_edge::prefixes::{PrefixConfig, UnknownSystem};
use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_engine::Model;

use crate::common;
use common::{edge_ids, model, python, start_cloud, CODING, SUPPORT};

const USER: &str = "I booked a train for tomorrow at 9am. Can I still get my money back?";
const ECHO_TEXT: &str = "Refunds are possible up to 24 hours before departure.";

async fn start_server(
    model: Arc<Model>,
    cloud: &str,
    kv_budget_bytes: usize,
    unknown_system: UnknownSystem,
    api_keys: ApiKeys,
) -> String {
    let state = EdgeServer::start(
        model,
        ServerConfig {
            model_id: "smollm2".into(),
            default_max_tokens: 64,
            api_keys,
        },
        SchedulerConfig {
            kv_budget_bytes,
            request_timeout: Duration::from_secs(120),
            ..SchedulerConfig::default()
        },
        PrefixConfig {
            unknown_system,
            ..common::prefix_config(cloud)
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, state));
    format!("http://{addr}/v1")
}

/// An edge server on its own cloud, system prompts computed here when unknown, no API keys;
/// its address.
async fn open_server(m: Arc<Model>) -> std::net::SocketAddr {
    let cloud = start_cloud(m.clone()).await;
    let base = start_server(
        m,
        &cloud,
        1 << 30,
        UnknownSystem::ComputeLocally,
        ApiKeys::default(),
    )
    .await;
    base.trim_start_matches("http://")
        .trim_end_matches("/v1")
        .parse()
        .unwrap()
}

#[test]
fn openai_client_against_the_edge_server() {
    let m = model();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("keys");
    std::fs::write(&key_file, "# clients\nsk-team-a\nsk-team-b\n").unwrap();
    let keys = ApiKeys::new(vec!["sk-flag".into()], Some(&key_file)).unwrap();
    let (base, tiny, keyed) = rt.block_on(async {
        let cloud = start_cloud(m.clone()).await;
        let open = ApiKeys::default;
        let base = start_server(
            m.clone(),
            &cloud,
            1 << 30,
            UnknownSystem::ComputeLocally,
            open(),
        )
        .await;
        // Room for one 200-token request, not two.
        let tiny = start_server(m.clone(), &cloud, 6 << 20, UnknownSystem::Refuse, open()).await;
        let keyed = start_server(
            m.clone(),
            &cloud,
            1 << 30,
            UnknownSystem::ComputeLocally,
            keys,
        )
        .await;
        (base, tiny, keyed)
    });
    let (cloud_ids, private_ids) = edge_ids(&m, SUPPORT, USER);
    let logprobs = reference_logprobs(&m, &cloud_ids, &private_ids, 8, 3);
    // Echo: a continuation of cloud prompt "support" (its ids: the system turn), and a prompt
    // of its own (BOS first, which nothing scores).
    let support_ids = edge_ids(&m, SUPPORT, USER).0;
    let echo_ids = m.tokenizer.encode(ECHO_TEXT).unwrap();
    let echo_ref = reference_scores(&m, &support_ids, &echo_ids, 2);
    let plain_ids = m.tokenizer.encode_prompt(ECHO_TEXT).unwrap();
    let echo_plain_ref = reference_scores(&m, &[], &plain_ids, 2);
    let cfg = dir.path().join("config.json");
    let json = serde_json::json!({
        "base": base,
        "tiny": tiny,
        "keyed": keyed,
        "keys": ["sk-flag", "sk-team-a", "sk-team-b"],
        "context_length": m.max_positions(),
        "model": "smollm2",
        "system_a": SUPPORT,
        "cloud_prompt_a": "support",
        "system_b": CODING,
        "user": USER,
        "prompt_tokens": cloud_ids.len() + private_ids.len(),
        "logprobs_ref": logprobs,
        "echo_text": ECHO_TEXT,
        "echo_ref": echo_ref,
        "echo_plain_ref": echo_plain_ref,
    });
    std::fs::write(&cfg, json.to_string()).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_api.py");
    let status = Command::new(python())
        .arg(&script)
        .arg(&cfg)
        .status()
        .unwrap();
    assert!(status.success(), "openai client checks failed: {status}");
    drop(rt);
}

/// Each of `ids`' log-probabilities after `before` and the ids before it, on one node fed one
/// token at a time, with a plain f64 log-softmax: `{text, logprob, top: [[text, logprob]]}`, or
/// `null` for a first token with nothing before it.
fn reference_scores(m: &Model, before: &[u32], ids: &[u32], top: usize) -> serde_json::Value {
    let mut seq = edgeprompt_engine::Sequence::new(m);
    let mut logits = (!before.is_empty()).then(|| seq.prefill(m, before).unwrap());
    let mut out = Vec::new();
    for &id in ids {
        out.push(match &logits {
            Some(l) => {
                let (lp, order) = log_softmax(l);
                let text = |i: usize| m.tokenizer.decode(&[i as u32]).unwrap();
                serde_json::json!({
                    "text": text(id as usize),
                    "logprob": lp[id as usize],
                    "top": order[..top].iter().map(|&i| serde_json::json!([text(i), lp[i]])).collect::<Vec<_>>(),
                })
            }
            None => serde_json::Value::Null,
        });
        logits = Some(seq.prefill(m, &[id]).unwrap());
    }
    serde_json::Value::Array(out)
}

/// Log-softmax in f64 and the ids by falling logit (the lower id first on a tie).
fn log_softmax(logits: &[f32]) -> (Vec<f64>, Vec<usize>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    (logits.iter().map(|&x| x as f64 - lse).collect(), order)
}

/// The greedy answer's log-probabilities computed here, on one node, from the engine's raw
/// logits with a plain f64 log-softmax: per token `{id, text, logprob, top: [[id, logprob]]}`.
fn reference_logprobs(
    m: &Model,
    cloud: &[u32],
    private: &[u32],
    tokens: usize,
    top: usize,
) -> serde_json::Value {
    let mut seq = edgeprompt_engine::Sequence::new(m);
    let mut ids = cloud.to_vec();
    ids.extend_from_slice(private);
    let mut logits = seq.prefill(m, &ids).unwrap();
    let mut out = Vec::new();
    for _ in 0..tokens {
        let (lps, order) = log_softmax(&logits);
        let id = order[0] as u32;
        let lp = |i: usize| lps[i];
        out.push(serde_json::json!({
            "id": id,
            "text": m.tokenizer.decode(&[id]).unwrap(),
            "logprob": lp(id as usize),
            "top": order[..top].iter().map(|&i| serde_json::json!([i, lp(i)])).collect::<Vec<_>>(),
        }));
        logits = seq.prefill(m, &[id]).unwrap();
    }
    serde_json::Value::Array(out)
}

/// `stop` is bounded as OpenAI bounds it (every sampled token scans the answer's tail for each
/// stop sequence): at most 4, each 1-256 bytes; past that a 400 naming the limit, on both
/// endpoints, before anything is computed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sequences_are_limited() {
    let m = model();
    let addr = open_server(m.clone()).await;
    let chat = |stop: serde_json::Value, stream: bool| {
        serde_json::json!({
            "model": "smollm2", "max_tokens": 4, "temperature": 0, "stream": stream, "stop": stop,
            "messages": [{"role": "system", "content": SUPPORT}, {"role": "user", "content": USER}]
        })
    };
    let completion = |stop: serde_json::Value| serde_json::json!({"model": "smollm2", "max_tokens": 4, "prompt": ECHO_TEXT, "stop": stop});
    let long = "x".repeat(257);
    // 256 bytes in 128 two-byte characters: the limit counts bytes.
    let widest = "é".repeat(128);
    let refused = [
        (
            chat(serde_json::json!(["a", "b", "c", "d", "e"]), false),
            "at most 4",
        ),
        (
            chat(serde_json::json!(["a", "b", "c", "d", "e"]), true),
            "at most 4",
        ),
        (
            chat(serde_json::json!([long.clone()]), false),
            "at most 256",
        ),
        (chat(serde_json::json!(long.clone()), false), "at most 256"),
        (
            chat(serde_json::json!(["a", ""]), false),
            "must not be empty",
        ),
        (chat(serde_json::json!(""), false), "must not be empty"),
        (
            completion(serde_json::json!(["1", "2", "3", "4", "5"])),
            "at most 4",
        ),
        (
            completion(serde_json::json!(format!("{widest}x"))),
            "at most 256",
        ),
    ];
    for (body, why) in refused {
        let path = if body.get("messages").is_some() {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let (status, v) =
            tokio::task::spawn_blocking(move || common::post_json(addr, path, &body.to_string()))
                .await
                .unwrap();
        assert_eq!(status, 400, "{v}");
        let e = &v["error"];
        assert_eq!(e["type"], "invalid_request_error", "{v}");
        assert_eq!(e["param"], "stop", "{v}");
        let msg = e["message"].as_str().unwrap_or_default();
        assert!(msg.contains(why), "{why:?} not in {msg:?}");
    }
    let allowed = [
        chat(
            serde_json::json!([widest.clone(), "\n\n", "END", "x".repeat(256)]),
            false,
        ),
        chat(serde_json::json!([]), false),
        completion(serde_json::json!(widest)),
    ];
    for body in allowed {
        let path = if body.get("messages").is_some() {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let (status, v) =
            tokio::task::spawn_blocking(move || common::post_json(addr, path, &body.to_string()))
                .await
                .unwrap();
        assert_eq!(status, 200, "{v}");
    }
}

/// Token-id prompts and the tokenizer endpoints (llama-server's and vLLM's shapes): the ids
/// `/tokenize` gives, sent as the prompt, answer exactly as the text does; `/detokenize` gives
/// the text back; ids past the vocabulary are a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_id_prompts_and_the_tokenizer_endpoints() {
    let m = model();
    let addr = open_server(m.clone()).await;
    let post = |path: &'static str, body: serde_json::Value| {
        tokio::task::spawn_blocking(move || common::post_json(addr, path, &body.to_string()))
    };
    let (status, t) = post("/tokenize", serde_json::json!({"content": ECHO_TEXT}))
        .await
        .unwrap();
    assert_eq!(status, 200, "{t}");
    let ids: Vec<u32> = serde_json::from_value(t["tokens"].clone()).unwrap();
    assert_eq!(ids, m.tokenizer.encode_prompt(ECHO_TEXT).unwrap());
    assert_eq!(t["count"], ids.len());
    // vLLM's field names, and no special tokens.
    let (_, plain) = post(
        "/tokenize",
        serde_json::json!({"prompt": ECHO_TEXT, "add_special_tokens": false}),
    )
    .await
    .unwrap();
    assert_eq!(
        plain["tokens"],
        serde_json::json!(m.tokenizer.encode(ECHO_TEXT).unwrap())
    );
    let (status, d) = post(
        "/detokenize",
        serde_json::json!({"tokens": plain["tokens"]}),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(d["content"], ECHO_TEXT);
    assert_eq!(d["prompt"], ECHO_TEXT);

    // The same greedy answer and scores from the text, the ids, and a batch of one id list.
    let answer = |prompt: serde_json::Value| {
        post(
            "/v1/completions",
            serde_json::json!({"model": "smollm2", "prompt": prompt, "max_tokens": 12,
                "temperature": 0, "logprobs": 2}),
        )
    };
    let (s1, by_text) = answer(serde_json::json!(ECHO_TEXT)).await.unwrap();
    let (s2, by_ids) = answer(serde_json::json!(ids)).await.unwrap();
    let (s3, by_batch) = answer(serde_json::json!([ids])).await.unwrap();
    assert_eq!((s1, s2, s3), (200, 200, 200), "{by_ids}");
    for v in [&by_ids, &by_batch] {
        assert_eq!(v["choices"][0]["text"], by_text["choices"][0]["text"]);
        assert_eq!(
            v["choices"][0]["logprobs"],
            by_text["choices"][0]["logprobs"]
        );
        assert_eq!(v["usage"], by_text["usage"]);
    }
    let past = m.tokenizer.vocab_size() as u32;
    for bad in [
        serde_json::json!([1, past]),
        serde_json::json!([[1], [2]]),
        serde_json::json!([]),
    ] {
        let (status, v) = answer(bad.clone()).await.unwrap();
        assert_eq!(status, 400, "{bad}: {v}");
    }
    let (status, v) = post("/detokenize", serde_json::json!({"tokens": [past]}))
        .await
        .unwrap();
    assert_eq!(status, 400, "{v}");

    let (status, info) =
        tokio::task::spawn_blocking(move || common::http(addr, "GET", "/tokenizer_info", ""))
            .await
            .unwrap();
    assert_eq!(status, 200);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["vocab_size"], m.tokenizer.vocab_size());
    assert_eq!(info["eos_token_id"], serde_json::json!(m.tokenizer.eos_id));
}

/// A completion sent whole (an evaluation harness's few-shot preamble and question) whose
/// prompt begins with a cloud prompt the edge holds runs on that prompt's KV: the private
/// tokens score as one node scores them, the shared ones are echoed unscored, and the answer is
/// the one the request naming the prompt gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_sent_whole_runs_on_a_held_cloud_prompt() {
    let m = model();
    let addr = open_server(m.clone()).await;
    let post = |body: serde_json::Value| {
        tokio::task::spawn_blocking(move || {
            common::post_json(addr, "/v1/completions", &body.to_string())
        })
    };
    let support = edge_ids(&m, SUPPORT, USER).0;
    let private = m.tokenizer.encode(ECHO_TEXT).unwrap();
    let whole: Vec<u32> = support.iter().chain(&private).copied().collect();
    let ask = |prompt: serde_json::Value, named: bool| {
        let mut b = serde_json::json!({"model": "smollm2", "prompt": prompt, "max_tokens": 6,
            "temperature": 0, "logprobs": 2, "echo": true});
        if named {
            b["cloud_prompt"] = "support".into();
        }
        post(b)
    };
    // Not held yet: computed here whole, every token after the first scored.
    let (status, cold) = ask(serde_json::json!(whole), false).await.unwrap();
    assert_eq!(status, 200, "{cold}");
    assert!(cold["edgeprompt"]["cloud_prompt"].is_null(), "{cold}");
    // Held once a request names it; then the whole prompt runs on it.
    let (status, named) = ask(serde_json::json!(private), true).await.unwrap();
    assert_eq!(status, 200, "{named}");
    let (status, warm) = ask(serde_json::json!(whole), false).await.unwrap();
    assert_eq!(status, 200, "{warm}");
    let c = &warm["edgeprompt"]["cloud_prompt"];
    assert_eq!(
        (c["source"].as_str(), c["tokens"].as_u64()),
        (Some("memory"), Some(support.len() as u64)),
        "{warm}"
    );
    assert_eq!(
        warm["edgeprompt"]["private_tokens"].as_u64(),
        Some(private.len() as u64)
    );
    let lp = &warm["choices"][0]["logprobs"];
    let values = lp["token_logprobs"].as_array().unwrap();
    let n = support.len();
    assert_eq!(lp["tokens"].as_array().unwrap().len(), whole.len() + 6);
    assert!(
        values[..n].iter().all(|v| v.is_null()),
        "the shared tokens are not scored"
    );
    // The private tokens: as one node scores them after the cloud prompt, and as the request
    // naming the prompt got them; the answer is that request's and the whole computation's.
    let reference = reference_scores(&m, &support, &private, 2);
    for (i, r) in reference.as_array().unwrap().iter().enumerate() {
        let got = values[n + i].as_f64().unwrap();
        let want = r["logprob"].as_f64().unwrap();
        assert!((got - want).abs() < 1e-5, "token {i}: {got} vs {want}");
    }
    let named_values = named["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(&values[n..], &named_values[..]);
    let answer = |v: &serde_json::Value| {
        let lp = &v["choices"][0]["logprobs"]["token_logprobs"];
        lp.as_array().unwrap()[lp.as_array().unwrap().len() - 6..].to_vec()
    };
    assert_eq!(answer(&warm), answer(&named));
    for (w, c) in answer(&warm).iter().zip(answer(&cold)) {
        assert!((w.as_f64().unwrap() - c.as_f64().unwrap()).abs() < 1e-5);
    }
    let text = |v: &serde_json::Value| v["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(
        text(&warm),
        text(&cold),
        "the echo is the prompt as sent, then the answer"
    );
    let metrics = tokio::task::spawn_blocking(move || common::http(addr, "GET", "/metrics", "").1)
        .await
        .unwrap();
    assert!(
        metrics.contains("edgeprompt_prompt_prefix_matches_total 1\n"),
        "one prompt ran on the held KV"
    );
}
