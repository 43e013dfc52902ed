//! The chat page and what it reads: `/` and its script (open, under a strict content policy),
//! the cloud prompts a request may name (the cloud's own list over gRPC, behind its token),
//! and each answer's `edgeprompt` block: where the KV came from and what crossed the network.
//! The page in a real browser is `scripts/browser_check.sh`.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;

use edgeprompt_cloud::{CloudNode, Limits};
use edgeprompt_edge::http::access::ApiKeys;
use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
use edgeprompt_edge::prefixes::PrefixConfig;
use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_edge::ClientSecurity;
use edgeprompt_engine::Model;
use serde_json::{json, Value};

use crate::common;
use common::{model, serve_cloud, SUPPORT};

const TOKEN: &str = "cloud-s3cret";
const KEY: &str = "sk-page";

async fn edge(m: Arc<Model>, prefixes: PrefixConfig, keys: ApiKeys) -> SocketAddr {
    let state = EdgeServer::start(
        m,
        ServerConfig {
            model_id: "smollm2".into(),
            default_max_tokens: 8,
            api_keys: keys,
        },
        SchedulerConfig::default(),
        prefixes,
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, state));
    addr
}

/// One HTTP/1.1 request: status, the head's lines (lowercase) and the body.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let auth = key.map_or(String::new(), |k| format!("authorization: Bearer {k}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\n{auth}content-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_lowercase(), body.to_string())
}

fn json_of(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let (status, _, body) = request(addr, method, path, key, body);
    (status, serde_json::from_str(&body).unwrap_or_default())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

fn chat(cloud_prompt: Option<&str>, system: Option<&str>, stream: bool) -> String {
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(json!({"role": "system", "content": s}));
    }
    messages.push(json!({"role": "user", "content": "Can I bring my bike?"}));
    let mut body = json!({"model": "smollm2", "max_tokens": 6, "temperature": 0, "messages": messages, "stream": stream});
    if let Some(id) = cloud_prompt {
        body["cloud_prompt"] = id.into();
    }
    body.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_the_cloud_prompt_list_and_each_answers_origin() {
    let m = model();
    let node = Arc::new(
        CloudNode::new(m.clone(), &common::prompt_specs(), 256 << 20)
            .unwrap()
            .with_guard(Limits::default(), Some(TOKEN.into())),
    );
    let tokens = |id: &str| node.prompt_tokens(id).unwrap() as u64;
    let (support_tokens, coding_tokens) = (tokens("support"), tokens("coding"));
    let cloud = serve_cloud(node.clone()).await;
    let with_token = ClientSecurity {
        token: Some(TOKEN.into()),
        ..ClientSecurity::default()
    };
    let keys = ApiKeys::new(vec![KEY.into()], None).unwrap();
    let good = edge(
        m.clone(),
        PrefixConfig {
            security: with_token,
            ..common::prefix_config(&cloud)
        },
        keys,
    )
    .await;
    let tokenless = edge(m.clone(), common::prefix_config(&cloud), ApiKeys::default()).await;
    let alone = edge(
        m.clone(),
        PrefixConfig {
            cloud_url: None,
            ..common::prefix_config(&cloud)
        },
        ApiKeys::default(),
    )
    .await;

    // The page needs no key (it holds no secret) and runs only its own script.
    let (status, head, body) = blocking(move || request(good, "GET", "/", None, "")).await;
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'self'"),
        "{head}"
    );
    assert!(body.contains("<script src=\"page.js\">") && body.contains("id=\"cloud\""));
    let (status, head, body) = blocking(move || request(good, "GET", "/page.js", None, "")).await;
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/javascript"), "{head}");
    assert!(body.contains("/v1/cloud_prompts") && body.contains("textContent"));

    // The list is the API's: behind the key. It is the cloud's, asked with the cloud's token.
    let list =
        move |addr, key| blocking(move || json_of(addr, "GET", "/v1/cloud_prompts", key, ""));
    assert_eq!(list(good, None).await.0, 401);
    let (status, v) = list(good, Some(KEY)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["cloud"], "reachable");
    assert_eq!(
        v["data"],
        json!([
            {"id": "coding", "tokens": coding_tokens, "in_memory": false},
            {"id": "support", "tokens": support_tokens, "in_memory": false},
        ])
    );

    // A cold answer: the KV from the cloud; up, only the request's few bytes.
    let (status, v) = blocking(move || {
        json_of(
            good,
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            &chat(Some("support"), None, false),
        )
    })
    .await;
    assert_eq!(status, 200, "{v}");
    let b = &v["edgeprompt"];
    let c = &b["cloud_prompt"];
    assert_eq!(
        (c["id"].as_str(), c["source"].as_str()),
        (Some("support"), Some("cloud")),
        "{b}"
    );
    assert_eq!(c["tokens"].as_u64(), Some(support_tokens));
    let kv = support_tokens as usize * m.cfg.kv_bytes_per_token();
    let down = c["bytes_down"].as_u64().unwrap() as usize;
    assert!(
        down >= kv && down < kv + kv / 8,
        "{down} bytes down for {kv} of KV"
    );
    let up = c["bytes_up"].as_u64().unwrap();
    assert!(up > 0 && up < 256, "{up} bytes up");
    let private = v["usage"]["prompt_tokens"].as_u64().unwrap() - support_tokens;
    assert_eq!(b["private_tokens"].as_u64(), Some(private));
    let ttft = b["ttft_s"].as_f64().unwrap();
    assert!(
        ttft > 0.0 && ttft >= b["admitted_s"].as_f64().unwrap(),
        "{b}"
    );
    let (_, v) = list(good, Some(KEY)).await;
    assert_eq!(
        v["data"][1],
        json!({"id": "support", "tokens": support_tokens, "in_memory": true})
    );

    // Streamed, warm: the block comes on the chunk that finishes the answer.
    let (status, _, body) = blocking(move || {
        request(
            good,
            "POST",
            "/v1/chat/completions",
            Some(KEY),
            &chat(Some("support"), None, true),
        )
    })
    .await;
    assert_eq!(status, 200);
    let chunks: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let with_block: Vec<&Value> = chunks
        .iter()
        .filter(|c| c.get("edgeprompt").is_some())
        .collect();
    assert_eq!(with_block.len(), 1, "{body}");
    assert!(with_block[0]["choices"][0]["finish_reason"].is_string());
    let c = &with_block[0]["edgeprompt"]["cloud_prompt"];
    assert_eq!(
        (
            c["source"].as_str(),
            c["bytes_up"].as_u64(),
            c["bytes_down"].as_u64()
        ),
        (Some("memory"), Some(0), Some(0))
    );

    // Without the cloud's token the cloud lists nothing, and the edge says why.
    let (status, v) = list(tokenless, None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["cloud"].as_str(), v["data"].clone()),
        (Some("unreachable"), json!([]))
    );
    assert!(v["cloud_error"].as_str().unwrap().contains("token"), "{v}");

    // No cloud: a system message computed here, then from memory; nothing on any wire.
    let (_, v) = list(alone, None).await;
    assert_eq!(
        (v["cloud"].as_str(), v["data"].clone()),
        (Some("none"), json!([]))
    );
    for want in ["local", "memory"] {
        let (status, v) = blocking(move || {
            json_of(
                alone,
                "POST",
                "/v1/chat/completions",
                None,
                &chat(None, Some(SUPPORT), false),
            )
        })
        .await;
        assert_eq!(status, 200, "{v}");
        let c = &v["edgeprompt"]["cloud_prompt"];
        assert_eq!(
            (c["id"].clone(), c["source"].as_str()),
            (Value::Null, Some(want)),
            "{v}"
        );
        assert_eq!(
            (c["bytes_up"].as_u64(), c["bytes_down"].as_u64()),
            (Some(0), Some(0))
        );
    }
    // A chat with no system message has no cloud prompt.
    let (_, v) = blocking(move || {
        json_of(
            alone,
            "POST",
            "/v1/chat/completions",
            None,
            &chat(None, None, false),
        )
    })
    .await;
    assert!(v["edgeprompt"]["cloud_prompt"].is_null(), "{v}");
}
