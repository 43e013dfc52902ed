//! The serving side of the wire, shared by the cloud node and by edges that serve their cached
//! prompts to peers: fingerprint check, codec negotiation, the header, layer-major chunks.

use edgeprompt_engine::config::window_start;
use edgeprompt_engine::{LayerKv, Model};
use edgeprompt_kv::{Chunk, Codec};
use edgeprompt_protocol::{fetch_message::Body, FetchMessage, FetchRequest, Header};
use tokio::sync::mpsc;
use tonic::Status;

/// Tokens per streamed chunk.
pub const CHUNK_TOKENS: usize = 256;

/// KV is only useful to an edge holding the very same weights.
pub fn check_fingerprint(req: &FetchRequest, fingerprint: &str) -> Result<(), Status> {
    if req.model_fingerprint == fingerprint {
        return Ok(());
    }
    Err(Status::failed_precondition(format!(
        "model fingerprint mismatch: this node runs {}, the edge has {}",
        &fingerprint[..fingerprint.len().min(12)],
        req.model_fingerprint
            .get(..12)
            .unwrap_or(&req.model_fingerprint)
    )))
}

/// The first codec of the edge's list this node speaks (f16 when it names none), and zstd.
pub fn negotiate(req: &FetchRequest) -> Result<(Codec, Option<i32>), Status> {
    let codec = if req.accept_codecs.is_empty() {
        Codec::F16
    } else {
        req.accept_codecs
            .iter()
            .find_map(|c| Codec::parse(c))
            .ok_or_else(|| {
                Status::invalid_argument(format!("no supported codec in {:?}", req.accept_codecs))
            })?
    };
    Ok((codec, req.accept_zstd.then_some(3)))
}

/// What a stream carries: whose KV (fingerprint and shape) and from which layer on.
#[derive(Debug, Clone)]
pub struct Layout {
    pub fingerprint: String,
    pub n_layers: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub first_layer: usize,
    /// Per layer, its sliding window if it has one: only the tail of the prompt a later
    /// token can see is sent.
    pub windows: Vec<Option<usize>>,
    /// A larger model's KV mapped to the edge model's (CE-LSLM), not the model's own.
    pub mapped: bool,
}

impl Layout {
    /// All of `model`'s own KV.
    pub fn full(model: &Model) -> Self {
        let c = &model.cfg;
        Self {
            fingerprint: model.fingerprint.clone(),
            n_layers: c.n_layer,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            first_layer: 0,
            windows: (0..c.n_layer).map(|l| c.window_of(l)).collect(),
            mapped: false,
        }
    }

    /// Per layer, the first position of an `n`-token prompt the stream carries.
    pub fn starts(&self, n: usize) -> Vec<usize> {
        (0..self.n_layers)
            .map(|l| window_start(self.windows.get(l).copied().flatten(), n))
            .collect()
    }

    /// `model`'s own KV from the first layer the request asks for.
    pub fn of(model: &Model, req: &FetchRequest) -> Result<Self, Status> {
        Self::full(model).from_layer(req.first_layer)
    }

    /// The same layout starting at `first` (refused past the last layer).
    pub fn from_layer(mut self, first: u32) -> Result<Self, Status> {
        if first as usize >= self.n_layers {
            return Err(Status::invalid_argument(format!(
                "first layer {first} of a {}-layer model",
                self.n_layers
            )));
        }
        self.first_layer = first as usize;
        Ok(self)
    }
}

pub fn header(
    layout: &Layout,
    prompt_id: &str,
    address: &str,
    token_ids: &[u32],
    codec: Codec,
    zstd: Option<i32>,
) -> FetchMessage {
    FetchMessage {
        body: Some(Body::Header(Header {
            prompt_id: prompt_id.into(),
            content_address: hex::decode(address).unwrap_or_default(),
            token_ids: token_ids.to_vec(),
            n_layers: layout.n_layers as u32,
            n_kv_head: layout.n_kv_head as u32,
            head_dim: layout.head_dim as u32,
            codec: codec.name().into(),
            compressed: zstd.is_some(),
            model_fingerprint: layout.fingerprint.clone(),
            first_layer: layout.first_layer as u32,
            layer_starts: match layout.windows.iter().any(Option::is_some) {
                true => layout
                    .starts(token_ids.len())
                    .into_iter()
                    .map(|s| s as u32)
                    .collect(),
                false => Vec::new(),
            },
            mapped: layout.mapped,
        })),
    }
}

/// Layer `l` from position `from` on (or from the first it holds) as sealed chunks of
/// `CHUNK_TOKENS` tokens.
pub async fn send_layer(
    tx: &mpsc::Sender<Result<FetchMessage, Status>>,
    l: usize,
    layer: &LayerKv,
    from: usize,
    codec: Codec,
    zstd: Option<i32>,
) -> Result<(), Status> {
    let mut s = from.max(layer.start()).min(layer.end());
    loop {
        let e = (s + CHUNK_TOKENS).min(layer.end());
        let c = Chunk::encode(l as u32, layer, s, e, codec, zstd)
            .map_err(|e| Status::internal(e.to_string()))?;
        tx.send(Ok(FetchMessage {
            body: Some(Body::Chunk(c.into())),
        }))
        .await
        .map_err(|_| Status::cancelled("client went away"))?;
        s = e;
        if s >= layer.end() {
            return Ok(());
        }
    }
}
