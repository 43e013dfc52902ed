//! What the edge integration tests share: the SmolLM2 model, a cloud node on loopback.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use edgeprompt_cloud::{CloudNode, CloudService, PromptSpec};
use edgeprompt_edge::scheduler::{Done, Event, Job};
use edgeprompt_engine::{Message, Model, PrefixKv, SamplingParams};
use tokio::sync::mpsc;
use tokio_stream::wrappers::TcpListenerStream;

pub const SUPPORT: &str = "You are the support assistant of Acme Rail. Answer in two sentences. \
Refund policy: tickets are refundable up to 24 hours before departure; after that, a 20% fee \
applies. Seat changes are free. Pets travel free in carriers. Bikes need a reservation.";
pub const CODING: &str = "You are a senior Rust reviewer. Point out one bug and suggest a fix. \
Prefer iterators over index loops, never unwrap on user input, and keep functions short.";

pub fn models_dir() -> PathBuf {
    std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"))
}

/// A model file from `models/`, loaded.
pub fn load(file: &str) -> Arc<Model> {
    let p = models_dir().join(file);
    assert!(
        p.exists(),
        "{} missing: run python3 scripts/models.py",
        p.display()
    );
    Arc::new(Model::load(p).unwrap())
}

pub fn model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| load("SmolLM2-135M-Instruct.Q4_1.gguf"))
        .clone()
}

/// `single_node_text` for a plain-text cloud prompt `cloud` and private text `private`, and each
/// answer token's log-probability (what a completion with `logprobs: 0` lists).
pub fn plain_single_node(m: &Model, cloud: &str, private: &str, n: usize) -> (String, Vec<f32>) {
    let mut ids = m.tokenizer.encode_prompt(cloud).unwrap();
    ids.extend(m.tokenizer.encode(private).unwrap());
    let mut seq = edgeprompt_engine::Sequence::new(m);
    let logits = seq.prefill(m, &ids).unwrap();
    greedy_answer(m, &mut seq, logits, n)
}

/// A completion's text and its tokens' log-probabilities (asked with `logprobs: 0`).
pub fn completion_answer(v: &serde_json::Value) -> (String, Vec<f32>) {
    let lps = v["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no log-probabilities: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    (v["choices"][0]["text"].as_str().unwrap().to_string(), lps)
}

/// A hybrid model: the synthetic Qwen3.5 (Gated DeltaNet layers, whose prompts are states
/// beside KV; `scripts/ref/synth.py`), with Qwen2.5's chat template.
pub fn hybrid() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| load("synth/qwen35.gguf")).clone()
}

/// An HTTP edge (open API, model id `smollm2`, 6 tokens by default, the default scheduler)
/// looking prompts up with `prefixes`, on an ephemeral loopback port; its address.
pub async fn http_edge(
    m: &Arc<Model>,
    prefixes: edgeprompt_edge::prefixes::PrefixConfig,
) -> std::net::SocketAddr {
    use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
    let state = EdgeServer::start(
        m.clone(),
        ServerConfig {
            model_id: "smollm2".into(),
            default_max_tokens: 6,
            api_keys: Default::default(),
        },
        Default::default(),
        prefixes,
    )
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve(l, state));
    addr
}

/// The single node's greedy answer of `n` tokens to `user` after `system`: the whole prompt
/// prefilled at once, the reference every split answer must equal.
pub fn single_node_text(m: &Model, system: &str, user: &str, n: usize) -> String {
    let (cloud, edge) = edge_ids(m, system, user);
    let all: Vec<u32> = cloud.into_iter().chain(edge).collect();
    let mut seq = edgeprompt_engine::Sequence::new(m);
    let logits = seq.prefill(m, &all).unwrap();
    greedy_text(m, &mut seq, logits, n)
}

/// Greedy continuation of `seq` from `logits`: the answer's text (stops at the model's end
/// tokens), as the one-shot edge prints it.
pub fn greedy_text(
    m: &Model,
    seq: &mut edgeprompt_engine::Sequence,
    logits: Vec<f32>,
    n: usize,
) -> String {
    greedy_answer(m, seq, logits, n).0
}

/// `greedy_text`, and each answer token's log-probability.
pub fn greedy_answer(
    m: &Model,
    seq: &mut edgeprompt_engine::Sequence,
    mut logits: Vec<f32>,
    n: usize,
) -> (String, Vec<f32>) {
    let mut text = edgeprompt_engine::TextStream::new(&[]);
    let mut lps = Vec::new();
    for _ in 0..n {
        let id = edgeprompt_engine::sample::argmax(&logits);
        let (_, stopped) = text.push(&m.tokenizer, id).unwrap();
        if stopped {
            break;
        }
        lps.push(edgeprompt_engine::logprobs(&logits, id, 0).logprob);
        if text.ids().len() == n {
            break;
        }
        logits = seq.prefill(m, &[id]).unwrap();
    }
    text.finish();
    (text.text().to_string(), lps)
}

/// The cloud prompts the tests' clouds serve: `support` and `coding`.
pub fn prompt_specs() -> Vec<PromptSpec> {
    vec![
        PromptSpec {
            id: "support".into(),
            system: SUPPORT.into(),
            text: None,
        },
        PromptSpec {
            id: "coding".into(),
            system: CODING.into(),
            text: None,
        },
    ]
}

/// Start a cloud node on an ephemeral loopback port; returns its URL.
pub async fn start_cloud(model: Arc<Model>) -> String {
    let node = CloudNode::new(model, &prompt_specs(), 256 << 20).unwrap();
    serve_cloud(Arc::new(node)).await
}

/// Serve `node` over gRPC on an ephemeral loopback port; returns its URL.
pub async fn serve_cloud(node: Arc<CloudNode>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CloudService::server(node))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    format!("http://{addr}")
}

pub fn edge_ids(model: &Model, system: &str, user: &str) -> (Vec<u32>, Vec<u32>) {
    let s = model
        .chat
        .as_ref()
        .unwrap()
        .split(system, &[Message::new("user", user)])
        .unwrap();
    (
        model.tokenizer.encode(&s.cloud).unwrap(),
        model.tokenizer.encode(&s.edge).unwrap(),
    )
}

/// A plain HTTP/1.1 request to `addr` (blocking): status and body.
pub fn http(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    (status, body)
}

/// POST JSON: status and the parsed answer (null if it is not JSON).
pub fn post_json(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, serde_json::Value) {
    let (status, text) = http(addr, "POST", path, body);
    (status, serde_json::from_str(&text).unwrap_or_default())
}

/// The edge's prompt lookup against `cloud` (f16, prompts not in the cloud computed here, a
/// 256 MB memory tier, nothing else); tests override what they exercise.
pub fn prefix_config(cloud: &str) -> edgeprompt_edge::prefixes::PrefixConfig {
    edgeprompt_edge::prefixes::PrefixConfig {
        cloud_url: Some(cloud.into()),
        codec: edgeprompt_kv::Codec::F16,
        unknown_system: edgeprompt_edge::prefixes::UnknownSystem::ComputeLocally,
        cache_bytes: 256 << 20,
        disk_dir: None,
        peers: Vec::new(),
        security: Default::default(),
        cloud_layers_from: 0,
        auto_codec: None,
        auto_split: None,
        ..Default::default()
    }
}

/// A greedy job for a batcher: `prompt` after an optional prefix, and its events.
pub fn job(
    prefix: Option<Arc<PrefixKv>>,
    prompt: Vec<u32>,
    max_tokens: usize,
) -> (Job, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let j = Job {
        prefix,
        prompt,
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        events: tx,
    };
    (j, rx)
}

/// The job's answer from the events it has sent.
pub fn done(rx: &mut mpsc::UnboundedReceiver<Event>) -> Done {
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Event::Done(d) => return d,
            Event::Failed(e) => panic!("request failed: {e}"),
            Event::Text(_) => {}
        }
    }
    panic!("no answer")
}

/// A CA and a certificate for "localhost" signed by it: (CA PEM, cert PEM, key PEM).
pub fn pki() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.clone().self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (ca_cert.pem(), leaf.pem(), key.serialize_pem())
}

/// Python with the `openai` package: $EDGEPROMPT_PYTHON, or the venv scripts/test.sh makes.
pub fn python() -> PathBuf {
    let p = std::env::var_os("EDGEPROMPT_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv-test/bin/python")
        });
    assert!(
        p.exists(),
        "{} missing: run `bash scripts/test.sh` (it installs the openai client) or set EDGEPROMPT_PYTHON",
        p.display()
    );
    p
}

/// A TCP proxy to `upstream` that can be switched off: while off, it closes every connection
/// at once (a cloud gone down, as the edge sees it), while on it forwards both ways.
pub struct Switch {
    pub url: String,
    up: Arc<std::sync::atomic::AtomicBool>,
}

impl Switch {
    pub async fn start(upstream: &str) -> Self {
        use tokio::net::{TcpListener, TcpStream};
        let upstream = upstream.trim_start_matches("http://").to_string();
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let on = up.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = l.accept().await {
                if !on.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Self { url, up }
    }

    /// Off: new connections are closed at once (connections already open stay).
    pub fn off(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A loopback TCP proxy to `upstream` that records every byte on the link: `up` what the
/// client sent, `down` what came back.
pub struct Tap {
    pub url: String,
    pub up: Arc<std::sync::Mutex<Vec<u8>>>,
    pub down: Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Tap {
    pub async fn start(upstream: &str) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let to = upstream.trim_start_matches("http://").to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let up: Arc<std::sync::Mutex<Vec<u8>>> = Arc::default();
        let down: Arc<std::sync::Mutex<Vec<u8>>> = Arc::default();
        let (u, d) = (up.clone(), down.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&to).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (mut r, mut w, log) in [(cr, sw, u.clone()), (sr, cw, d.clone())] {
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 1 << 16];
                        while let Ok(n) = r.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            log.lock().unwrap().extend_from_slice(&buf[..n]);
                            if w.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        Self { url, up, down }
    }

    /// Every byte seen both ways.
    pub fn bytes(&self) -> Vec<u8> {
        let mut all = self.up.lock().unwrap().clone();
        all.extend_from_slice(&self.down.lock().unwrap());
        all
    }
}
