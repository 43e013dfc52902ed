//! The edge node: fetches a cloud prompt's KV layer by layer and computes the private prompt's
//! layer `l` as soon as cloud layer `l` has arrived (transfer overlaps compute, EdgePrompt
//! eq. 7), then decodes locally. Nothing of the private prompt is sent: the only message to
//! the cloud is `FetchRequest`.
//!
//! As a server (`http`), it answers OpenAI-style requests with continuous batching
//! (`scheduler`), every request on a cloud prompt sharing one copy of its KV (`prefixes`).

pub mod catalog;
pub mod client;
pub mod codec_choice;
pub mod http;
pub mod layer_stream;
pub mod link_meter;
pub mod metrics;
pub mod peer;
pub mod pipeline;
pub mod prefixes;
pub mod private_cache;
pub mod scheduler;
pub mod split_choice;
pub mod trust;

pub use client::{ClientSecurity, CloudClient, CloudHeader, LayerArrival};
pub use layer_stream::{LayerStream, PromptKv, StreamFailure};
pub use pipeline::{prefill_following, prefill_from_cloud, LayerTiming, Timeline};
pub use trust::CloudTrust;

#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error("cannot reach the cloud at {url}: {msg}")]
    Connect { url: String, msg: String },
    #[error("cloud refused: NotFound: {0}")]
    NotFound(String),
    #[error("cloud refused: {0}")]
    Refused(String),
    #[error("cloud stream: {0}")]
    Stream(String),
    #[error("cloud KV rejected: {0}")]
    Kv(#[from] edgeprompt_kv::KvError),
    #[error(transparent)]
    Engine(#[from] edgeprompt_engine::EngineError),
    #[error("configuration: {0}")]
    Config(String),
    /// This edge has no room for the prompt now (retry later).
    #[error("{0}")]
    Busy(String),
    /// The prompt is larger than this edge's prompt cache could ever hold.
    #[error("{0}")]
    TooLong(String),
}

pub type Result<T> = std::result::Result<T, EdgeError>;
