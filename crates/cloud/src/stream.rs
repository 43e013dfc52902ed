//! The serving side of the wire, shared by the cloud node and by edges that serve their cached
//! prompts to peers: fingerprint check, codec negotiation, the header, layer-major chunks.

use edgeprompt_engine::config::window_start;
use edgeprompt_engine::recurrent::Recurrence;
use edgeprompt_engine::{LayerKv, Model};
use edgeprompt_kv::{codec, Chunk, Codec, LayerMap, Manifest, SealKey};
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
    /// Per layer, whether it is recurrent: it carries its state at the prompt's end, no
    /// positions.
    pub recurrent: Vec<bool>,
    /// The recurrent layers' state shape.
    pub state: Option<Recurrence>,
    /// Per layer head sizes and KV sources, where the layers differ (Gemma 4): a layer that
    /// reads another's KV is not sent.
    pub layers: LayerMap,
    /// The edge model's own KV corrected by this fuser (SHA-256, hex): CE-LSLM fuser.
    pub fuser: Option<String>,
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
            recurrent: c.recurrent.clone(),
            state: c.features.recurrence,
            layers: LayerMap::of(c),
            fuser: None,
        }
    }

    /// Per layer, the first position of an `n`-token prompt the stream carries (a recurrent
    /// layer's, or one reading another's KV: `n`, it carries none).
    pub fn starts(&self, n: usize) -> Vec<usize> {
        (0..self.n_layers)
            .map(|l| {
                let none = self.recurrent.get(l).copied().unwrap_or(false)
                    || self.layers.reads(l).is_some();
                match none {
                    true => n,
                    false => window_start(self.windows.get(l).copied().flatten(), n),
                }
            })
            .collect()
    }

    /// Whether some layer starts past position 0 for some prompt (the header lists starts).
    fn cuts(&self) -> bool {
        self.windows.iter().any(Option::is_some)
            || self.recurrent.iter().any(|&r| r)
            || !self.layers.kv_sources.is_empty()
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

/// The manifest a stream of `layout` in `codec` signs.
pub fn manifest(layout: &Layout, prompt_id: &str, token_ids: &[u32], codec: Codec) -> Manifest {
    Manifest::new(
        prompt_id,
        &layout.fingerprint,
        token_ids,
        (layout.n_layers, layout.n_kv_head, layout.head_dim),
        layout.first_layer,
        codec,
        layout.mapped,
    )
    .with_layers(layout.layers.clone())
    .with_fuser(layout.fuser.as_deref().unwrap_or_default())
}

/// The header. `values_codec`: what the values were decoded from where they were made, when
/// not the wire's `codec` (a peer relaying signed int8 KV as f16).
#[allow(clippy::too_many_arguments)]
pub fn header(
    layout: &Layout,
    prompt_id: &str,
    address: &str,
    token_ids: &[u32],
    codec: Codec,
    zstd: Option<i32>,
    values_codec: Option<Codec>,
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
            layer_starts: match layout.cuts() {
                true => layout
                    .starts(token_ids.len())
                    .into_iter()
                    .map(|s| s as u32)
                    .collect(),
                false => Vec::new(),
            },
            mapped: layout.mapped,
            values_codec: values_codec
                .filter(|&c| c != codec)
                .map_or(String::new(), |c| c.name().into()),
            state_shape: edgeprompt_protocol::state_shape(&layout.recurrent, layout.state),
            head_dims: layout.layers.head_dims.iter().map(|&d| d as u32).collect(),
            kv_sources: layout.layers.kv_sources.iter().map(|&s| s as u32).collect(),
            fuser: layout.fuser.clone().unwrap_or_default(),
        })),
    }
}

/// How a streamed layer is sealed.
pub enum LayerSeal<'a> {
    None,
    /// Signed here: this node's key and the stream's manifest.
    Sign(&'a SealKey, &'a Manifest),
    /// A signature made elsewhere, relayed (a peer serving what the cloud signed).
    Relay(&'a [u8; 64]),
}

/// Layer `l` from position `from` on (or from the first it holds) as checksummed chunks of
/// `CHUNK_TOKENS` tokens, the last carrying the layer's signature when it is sealed. A signature
/// covers the values the receiver decodes: for a lossy codec they are decoded here first. A
/// layer that reads another's KV holds none: nothing is sent.
pub async fn send_layer(
    tx: &mpsc::Sender<Result<FetchMessage, Status>>,
    l: usize,
    layer: &LayerKv,
    from: usize,
    codec: Codec,
    zstd: Option<i32>,
    seal: LayerSeal<'_>,
) -> Result<(), Status> {
    let internal = |e: edgeprompt_kv::KvError| Status::internal(e.to_string());
    if layer.kv_of.is_some() {
        return Ok(());
    }
    let first = from.max(layer.start()).min(layer.end());
    let mut s = first;
    // A state is sent exact in every codec: only KV values are decoded before signing.
    let lossy = matches!(seal, LayerSeal::Sign(..)) && codec != Codec::F16 && layer.state.is_none();
    let (mut dk, mut dv) = (
        vec![Vec::new(); layer.n_kv_head],
        vec![Vec::new(); layer.n_kv_head],
    );
    loop {
        let e = (s + CHUNK_TOKENS).min(layer.end());
        let c = Chunk::encode(l as u32, layer, s, e, codec, zstd).map_err(internal)?;
        if lossy {
            let (k, v) = codec::decode(
                c.codec,
                c.compressed,
                &c.payload,
                layer.n_kv_head,
                layer.head_dim,
                c.n_tokens(),
            )
            .map_err(internal)?;
            for (d, x) in dk.iter_mut().zip(k).chain(dv.iter_mut().zip(v)) {
                d.extend_from_slice(&x);
            }
        }
        let last = e >= layer.end();
        let mut wire: edgeprompt_protocol::WireChunk = c.into();
        if last {
            wire.layer_seal = match seal {
                LayerSeal::None => Vec::new(),
                LayerSeal::Relay(sig) => sig.to_vec(),
                LayerSeal::Sign(key, m) => {
                    let decoded;
                    let values = if lossy {
                        let (k, v) = (std::mem::take(&mut dk), std::mem::take(&mut dv));
                        decoded = LayerKv::from_heads(layer.head_dim, k, v)
                            .map_err(|e| Status::internal(e.to_string()))?
                            .starting_at(first);
                        &decoded
                    } else if first > layer.start() {
                        decoded = layer.cut_before(first);
                        &decoded
                    } else {
                        layer
                    };
                    key.sign_layer(m, l, values).to_vec()
                }
            };
        }
        tx.send(Ok(FetchMessage {
            body: Some(Body::Chunk(wire)),
        }))
        .await
        .map_err(|_| Status::cancelled("client went away"))?;
        s = e;
        if last {
            return Ok(());
        }
    }
}
