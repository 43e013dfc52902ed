//! The nodes the benchmarks run against, on loopback in this process: a cloud node with warm
//! prompts (real gRPC) and edge HTTP servers (real axum).

use std::net::SocketAddr;
use std::sync::Arc;

use edgeprompt_cloud::{CloudNode, CloudService, PromptSpec};
use edgeprompt_edge::http::{EdgeServer, ServerConfig};
use edgeprompt_edge::prefixes::{PrefixConfig, UnknownSystem};
use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_engine::Model;
use edgeprompt_kv::Codec;
use tokio_stream::wrappers::TcpListenerStream;

use crate::BenchError;

/// A cloud node serving `prompts` (id, system text), each prefilled before this returns.
pub async fn cloud(
    model: &Arc<Model>,
    prompts: &[(String, String)],
) -> Result<SocketAddr, BenchError> {
    cloud_with(model, prompts, Vec::new()).await
}

/// `cloud`, also serving smaller edge models through CE-LSLM adapters.
pub async fn cloud_with(
    model: &Arc<Model>,
    prompts: &[(String, String)],
    adapters: Vec<edgeprompt_align::AdapterSet>,
) -> Result<SocketAddr, BenchError> {
    let node = CloudNode::new(model.clone(), &specs(model, prompts), 4 << 30)?;
    serve_warm(node.with_adapters(adapters)?).await
}

/// `cloud` sending sliding-window layers whole: what the window cut saves.
pub async fn cloud_uncut(
    model: &Arc<Model>,
    prompts: &[(String, String)],
) -> Result<SocketAddr, BenchError> {
    let node = CloudNode::new(model.clone(), &specs(model, prompts), 4 << 30)?;
    serve_warm(node.without_window_cut()).await
}

/// A model without a chat template takes its cloud prompts as plain text.
fn specs(model: &Model, prompts: &[(String, String)]) -> Vec<PromptSpec> {
    prompts
        .iter()
        .map(|(id, system)| PromptSpec {
            id: id.clone(),
            system: system.clone(),
            text: model.chat.is_none().then(|| system.clone()),
        })
        .collect()
}

/// `node`'s gRPC service on a loopback port (nothing prefilled first).
pub async fn serve(node: Arc<CloudNode>) -> Result<SocketAddr, BenchError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CloudService::server(node))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    Ok(addr)
}

/// The cloud part of a chat with this system message, as an edge tokenizes it.
pub fn cloud_ids(model: &Model, system: &str) -> Result<Vec<u32>, BenchError> {
    let chat = model
        .chat
        .as_ref()
        .ok_or_else(|| BenchError::data("a chat model"))?;
    let split = chat
        .split(system, &[edgeprompt_engine::Message::new("user", "hello")])
        .map_err(BenchError::data)?;
    model
        .tokenizer
        .encode(&split.cloud)
        .map_err(BenchError::data)
}

/// Two prompts' KV bit for bit.
pub fn same_kv(a: &edgeprompt_engine::PrefixKv, b: &edgeprompt_engine::PrefixKv) -> bool {
    a.token_ids == b.token_ids && a.layers.iter().zip(&b.layers).all(|(x, y)| x == y)
}

async fn serve_warm(node: CloudNode) -> Result<SocketAddr, BenchError> {
    let node = Arc::new(node);
    let addr = serve(node.clone()).await?;
    for id in node.prompt_ids() {
        node.warm(&id)
            .await
            .map_err(|e| BenchError::Data(e.message().to_string()))?;
    }
    Ok(addr)
}

/// Prompts named `p0`, `p1`, ... for the given system texts.
pub fn numbered(systems: &[String]) -> Vec<(String, String)> {
    systems
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("p{i}"), s.clone()))
        .collect()
}

/// An edge HTTP server (default scheduler) asking `cloud` for prompts; returns its `/v1` URL.
pub async fn edge(
    model: &Arc<Model>,
    model_id: &str,
    cloud: Option<String>,
    codec: Codec,
) -> Result<String, BenchError> {
    edge_with(
        model,
        model_id,
        cloud,
        codec,
        None,
        SchedulerConfig::default(),
    )
    .await
}

/// `edge`, with `serve --cloud-layers-from auto`'s split choice when `auto_split` is given,
/// and its own scheduler settings (batch, private cache).
pub async fn edge_with(
    model: &Arc<Model>,
    model_id: &str,
    cloud: Option<String>,
    codec: Codec,
    auto_split: Option<Arc<edgeprompt_edge::split_choice::AutoSplit>>,
    scheduler: SchedulerConfig,
) -> Result<String, BenchError> {
    let state = EdgeServer::start(
        model.clone(),
        ServerConfig {
            model_id: model_id.into(),
            default_max_tokens: 256,
            api_keys: Default::default(),
        },
        scheduler,
        PrefixConfig {
            cloud_url: cloud,
            codec,
            unknown_system: UnknownSystem::ComputeLocally,
            cache_bytes: 1 << 30,
            disk_dir: None,
            peers: Vec::new(),
            security: Default::default(),
            cloud_layers_from: 0,
            auto_codec: None,
            auto_split,
            ..Default::default()
        },
    )?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1", listener.local_addr()?);
    tokio::spawn(edgeprompt_edge::http::serve(listener, state));
    Ok(url)
}

/// One edge request against `url`: fetch cloud prompt `id` from `first_layer` on, prefill the
/// private `ids` (layers below `first_layer` of the cloud prompt computed here), pick the first
/// token. Returns the TTFT from before connecting, and the layer timeline.
pub async fn edge_ttft(
    model: &Arc<Model>,
    url: &str,
    id: &str,
    ids: &[u32],
    codec: Codec,
    pipeline: bool,
    first_layer: usize,
) -> Result<(f64, edgeprompt_edge::Timeline), BenchError> {
    let start = std::time::Instant::now();
    let mut client = edgeprompt_edge::CloudClient::connect(url).await?;
    let (header, mut rx) = client
        .fetch_from(
            model,
            edgeprompt_protocol::PromptRef::Id(id.into()),
            &[codec],
            false,
            first_layer,
        )
        .await?;
    let (m, ids) = (model.clone(), ids.to_vec());
    tokio::task::spawn_blocking(move || {
        let (_, logits, tl) =
            edgeprompt_edge::prefill_from_cloud(&m, &header, &mut rx, &ids, start, pipeline)?;
        let _ = edgeprompt_engine::sample::argmax(&logits);
        Ok((start.elapsed().as_secs_f64(), tl))
    })
    .await
    .map_err(|e| BenchError::Data(e.to_string()))?
}
