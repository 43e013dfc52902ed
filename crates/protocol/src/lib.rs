//! The edge-to-cloud protocol (docs/design.md §4): the edge asks for a cloud prompt's KV; the cloud
//! answers with a header and then sealed chunks in layer-major order.
//!
//! Privacy is a property of these types: `FetchRequest` names a cloud prompt (a short id or a
//! 32-byte content address), the edge's model fingerprint and the codecs it accepts. There is
//! no field for text, token ids or KV, so nothing of the edge's prompt can be sent.

pub mod untrusted;

use edgeprompt_kv::{Chunk, Codec};

include!(concat!(env!("OUT_DIR"), "/edgeprompt.v1.CloudKv.rs"));

#[derive(Clone, PartialEq, prost::Message)]
pub struct FetchRequest {
    #[prost(oneof = "PromptRef", tags = "1, 2")]
    pub prompt: Option<PromptRef>,
    /// SHA-256 of the edge's GGUF, hex; the cloud refuses a mismatch.
    #[prost(string, tag = "3")]
    pub model_fingerprint: String,
    /// Codec names the edge can decode, preferred first ("f16", "int8", "int4").
    #[prost(string, repeated, tag = "4")]
    pub accept_codecs: Vec<String>,
    #[prost(bool, tag = "5")]
    pub accept_zstd: bool,
    /// CE-LSLM: the edge computes the layers below this one itself; 0 asks for all.
    #[prost(uint32, tag = "6")]
    pub first_layer: u32,
}

/// Which cloud prompts the cloud serves to a model: the fingerprint only, like a fetch.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListRequest {
    #[prost(string, tag = "1")]
    pub model_fingerprint: String,
}

/// What the cloud publishes: the only prompts an edge (or a peer) may ask anyone for.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListReply {
    #[prost(message, repeated, tag = "1")]
    pub prompts: Vec<PromptInfo>,
    /// The Ed25519 public key (32 bytes) that signs this cloud's KV; empty when it signs
    /// nothing. An edge without a configured key pins the first one it sees.
    #[prost(bytes = "vec", tag = "2")]
    pub signing_key: Vec<u8>,
    /// That key's Ed25519 signature of the list (the asking fingerprint and each prompt's id,
    /// address and token count, in order): a path cannot add addresses to it.
    #[prost(bytes = "vec", tag = "3")]
    pub signature: Vec<u8>,
}

/// A cloud prompt's public facts.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PromptInfo {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(uint32, tag = "2")]
    pub tokens: u32,
    /// Its content address for the model the list was asked for (32 bytes): an edge matches
    /// system messages against these locally and asks for nothing else.
    #[prost(bytes = "vec", tag = "3")]
    pub content_address: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum PromptRef {
    /// A registered cloud prompt's name: `[A-Za-z0-9_.-]{1,64}`.
    #[prost(string, tag = "1")]
    Id(String),
    /// The content address of its KV (32 bytes).
    #[prost(bytes = "vec", tag = "2")]
    ContentAddress(Vec<u8>),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FetchMessage {
    #[prost(oneof = "fetch_message::Body", tags = "1, 2")]
    pub body: Option<fetch_message::Body>,
}

pub mod fetch_message {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Body {
        #[prost(message, tag = "1")]
        Header(super::Header),
        #[prost(message, tag = "2")]
        Chunk(super::WireChunk),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Header {
    #[prost(string, tag = "1")]
    pub prompt_id: String,
    #[prost(bytes = "vec", tag = "2")]
    pub content_address: Vec<u8>,
    /// The cloud prompt's (public) token ids: the edge can recompute missing layers itself.
    #[prost(uint32, repeated, tag = "3")]
    pub token_ids: Vec<u32>,
    #[prost(uint32, tag = "4")]
    pub n_layers: u32,
    #[prost(uint32, tag = "5")]
    pub n_kv_head: u32,
    #[prost(uint32, tag = "6")]
    pub head_dim: u32,
    #[prost(string, tag = "7")]
    pub codec: String,
    #[prost(bool, tag = "8")]
    pub compressed: bool,
    #[prost(string, tag = "9")]
    pub model_fingerprint: String,
    /// The first layer streamed (layers below it are not sent).
    #[prost(uint32, tag = "10")]
    pub first_layer: u32,
    /// Per layer, the first position streamed: a sliding-window layer is cut to the positions
    /// a token after the prompt can still see. Empty: every layer from position 0.
    #[prost(uint32, repeated, tag = "11")]
    pub layer_starts: Vec<u32>,
    /// CE-LSLM: the layers are a larger cloud model's KV mapped to the edge model's by adapters
    /// (approximate). False: the edge model's own KV, exact, whatever the first layer.
    #[prost(bool, tag = "12")]
    pub mapped: bool,
    /// The codec the values were decoded from where they were made (what the cloud signed),
    /// when it differs from the wire's `codec`: a peer relays f16 of int8-decoded KV.
    #[prost(string, tag = "13")]
    pub values_codec: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WireChunk {
    #[prost(uint32, tag = "1")]
    pub layer: u32,
    #[prost(uint32, tag = "2")]
    pub start: u32,
    #[prost(uint32, tag = "3")]
    pub end: u32,
    #[prost(string, tag = "4")]
    pub codec: String,
    #[prost(bool, tag = "5")]
    pub compressed: bool,
    #[prost(bytes = "vec", tag = "6")]
    pub payload: Vec<u8>,
    #[prost(fixed32, tag = "7")]
    pub checksum: u32,
    /// On a layer's last chunk: the cloud's Ed25519 signature of that layer (its manifest and
    /// the SHA-256 of its decoded values); empty when the KV is unsigned.
    #[prost(bytes = "vec", tag = "8")]
    pub layer_seal: Vec<u8>,
}

impl From<Chunk> for WireChunk {
    fn from(c: Chunk) -> Self {
        Self {
            layer: c.layer,
            start: c.start,
            end: c.end,
            codec: c.codec.name().to_string(),
            compressed: c.compressed,
            payload: c.payload,
            checksum: c.checksum,
            layer_seal: Vec::new(),
        }
    }
}

impl TryFrom<WireChunk> for Chunk {
    type Error = String;
    fn try_from(w: WireChunk) -> Result<Self, String> {
        Ok(Chunk {
            layer: w.layer,
            start: w.start,
            end: w.end,
            codec: Codec::parse(&w.codec).ok_or_else(|| format!("unknown codec {:?}", w.codec))?,
            compressed: w.compressed,
            payload: w.payload,
            checksum: w.checksum,
        })
    }
}

/// Whether a prompt id is acceptable (short, plain): ids are names, not content.
pub fn valid_prompt_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}
