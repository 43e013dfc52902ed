//! The cloud node: holds named cloud prompts, prefills each once with the shared model, caches
//! the KV and streams it to edges over gRPC in layer-major chunks. A cold prompt streams layer
//! `l` as soon as layer `l` is computed. With CE-LSLM adapters it also serves a smaller edge
//! model: its deep layers' KV, mapped from this model's (`lslm`).

mod adapters;
pub mod guard;
mod lslm;
mod prompts;
mod service;
pub mod stream;
pub mod tiers;

pub use guard::Limits;
pub use prompts::{PromptSpec, PromptsFile};
pub use service::{list_entries, CloudNode, CloudService, MAX_LISTED};

#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    #[error("prompts file {path}: {msg}")]
    Prompts { path: String, msg: String },
    #[error(transparent)]
    Engine(#[from] edgeprompt_engine::EngineError),
    #[error(transparent)]
    Kv(#[from] edgeprompt_kv::KvError),
    #[error("CE-LSLM adapters: {0}")]
    Adapters(String),
    #[error("{0}")]
    Store(String),
}
