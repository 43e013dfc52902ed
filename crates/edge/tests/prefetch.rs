//! A cloud that lists the address of a guessed private message learns nothing from the edge's
//! fetches: a prefetching edge fetches what the list publishes when it takes the list, in the
//! list's order and within its budget, whatever its users send. Two edges, one whose user sends
//! the guessed message and one whose users never do, ask their clouds for the same prompts, each
//! once; an edge whose budget leaves the guessed prompt out computes it here when it is used and
//! never asks for it. Answers are the single node's.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgeprompt_cloud::{CloudNode, CloudService, PromptSpec};
use edgeprompt_engine::Model;
use edgeprompt_protocol::cloud_kv_server::{CloudKv, CloudKvServer};
use edgeprompt_protocol::fetch_request::Prompt;
use edgeprompt_protocol::{FetchMessage, FetchRequest, ListReply, ListRequest};
use serde_json::{json, Value};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

use crate::common;
use common::{edge_ids, model, post_json, CODING, SUPPORT};

/// The private message a cloud guessed and published (longer than SUPPORT, so a budget can
/// hold the others and not it).
const GUESSED: &str = "You are the assistant of Dana Whitfield, account 4417-2209-8810, \
    diagnosed with type 2 diabetes in March; she lives at 14 Harbour Lane and works nights at \
    the depot. Answer her questions about her account and her appointments, briefly.";

type FetchStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<FetchMessage, Status>> + Send>>;

/// The cloud's service, recording which prompt each fetch names (hex address or id).
struct Recorder {
    inner: CloudService,
    asked: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl CloudKv for Recorder {
    type FetchStream = FetchStream;

    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        self.inner.list(req).await
    }

    async fn fetch(&self, req: Request<FetchRequest>) -> Result<Response<FetchStream>, Status> {
        let named = match &req.get_ref().prompt {
            Some(Prompt::ContentAddress(a)) => hex::encode(a),
            Some(Prompt::Id(id)) => format!("id:{id}"),
            None => "none".into(),
        };
        self.asked.lock().unwrap().push(named);
        self.inner.fetch(req).await
    }
}

/// A cloud publishing SUPPORT, CODING and the guessed message; its URL and what it was asked.
async fn cloud(m: &Arc<Model>) -> (String, Arc<Mutex<Vec<String>>>) {
    let mut specs = common::prompt_specs();
    specs.push(PromptSpec {
        id: "guess".into(),
        system: GUESSED.into(),
        text: None,
    });
    let node = Arc::new(CloudNode::new(m.clone(), &specs, 256 << 20).unwrap());
    let asked = Arc::new(Mutex::new(Vec::new()));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                CloudKvServer::new(Recorder {
                    inner: CloudService(node),
                    asked: asked.clone(),
                })
                .max_encoding_message_size(64 << 20),
            )
            .serve_with_incoming(TcpListenerStream::new(l)),
    );
    (url, asked)
}

async fn edge(m: &Arc<Model>, cloud: &str, prefetch_bytes: usize) -> SocketAddr {
    let prefixes = edgeprompt_edge::prefixes::PrefixConfig {
        prefetch_bytes,
        ..common::prefix_config(cloud)
    };
    common::http_edge(m, prefixes).await
}

const USER: &str = "When is my next appointment?";

fn ask(addr: SocketAddr, system: &str) -> Value {
    let body = json!({
        "model": "smollm2",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": USER}],
        "max_tokens": 6,
        "temperature": 0,
        "cache_salt": "one-user",
    });
    let (status, v) = post_json(addr, "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{v}");
    v
}

fn single_node(m: &Model, system: &str) -> String {
    common::single_node_text(m, system, USER, 6)
}

fn address(m: &Model, system: &str) -> String {
    let (ids, _) = edge_ids(m, system, "x");
    edgeprompt_kv::content_address(&m.fingerprint, &ids)
}

fn sorted(v: &Mutex<Vec<String>>) -> Vec<String> {
    let mut v = v.lock().unwrap().clone();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_an_edge_fetches_does_not_depend_on_the_private_messages_it_sees() {
    let m = model();
    let per_token = m.cfg.kv_bytes_per_token();
    let tokens = |s: &str| edge_ids(&m, s, "x").0.len();
    assert!(tokens(GUESSED) > tokens(SUPPORT) && tokens(GUESSED) > tokens(CODING));
    let (url_a, asked_a) = cloud(&m).await;
    let (url_b, asked_b) = cloud(&m).await;
    let (url_c, asked_c) = cloud(&m).await;
    let a = edge(&m, &url_a, 256 << 20).await;
    let b = edge(&m, &url_b, 256 << 20).await;
    // In list order (by id): coding fits, the guess does not fit what is left, support does.
    let c = edge(&m, &url_c, (tokens(CODING) + tokens(SUPPORT)) * per_token).await;
    let want = (
        single_node(&m, GUESSED),
        single_node(&m, SUPPORT),
        single_node(&m, CODING),
    );
    let text = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let source = |v: &Value| {
        v["edgeprompt"]["cloud_prompt"]["source"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (m2, want2) = (m.clone(), want.clone());
    tokio::task::spawn_blocking(move || {
        // A's user sends the guessed message (three times) and a public one; B's users only
        // public ones; C's user sends the guessed message, which its budget left out.
        for _ in 0..3 {
            let v = ask(a, GUESSED);
            assert!(["cloud", "memory"].contains(&source(&v).as_str()), "{v}");
            assert_eq!(text(&v), want2.0);
        }
        assert_eq!(text(&ask(a, SUPPORT)), want2.1);
        assert_eq!(text(&ask(b, SUPPORT)), want2.1);
        assert_eq!(text(&ask(b, CODING)), want2.2);
        // Computed here, then held here (as a prompt computed here is).
        for want_source in ["local", "memory"] {
            let v = ask(c, GUESSED);
            assert_eq!(source(&v), want_source, "{v}");
            assert_eq!(text(&v), want2.0);
        }
        let v = ask(c, SUPPORT);
        assert!(["cloud", "memory"].contains(&source(&v).as_str()), "{v}");
        let _ = m2;
    })
    .await
    .unwrap();
    // Let the lists of the next seconds be taken and walked too: nothing more is asked.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let every = {
        let mut v: Vec<String> = [GUESSED, SUPPORT, CODING]
            .iter()
            .map(|s| address(&m, s))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        sorted(&asked_a),
        every,
        "A asked for each published prompt once"
    );
    assert_eq!(
        sorted(&asked_b),
        sorted(&asked_a),
        "B, whose users never sent it, the same"
    );
    let mut within = vec![address(&m, SUPPORT), address(&m, CODING)];
    within.sort();
    assert_eq!(
        sorted(&asked_c),
        within,
        "C never asked for the guessed prompt"
    );
}
