//! KV segments on the move and at rest: wire codecs (f16, int8, int4, optional zstd), sealed
//! chunks with checksums, the layer-major reassembler, content addresses and stores.

pub mod address;
pub mod bucket;
pub mod chunk;
pub mod codec;
pub mod export;
pub mod layers;
pub mod redis_store;
pub mod seal;
pub mod store;

pub use address::content_address;
pub use bucket::{BucketStore, Stored};
pub use chunk::{Chunk, Reassembler};
pub use codec::Codec;
pub use layers::LayerMap;
pub use redis_store::RedisStore;
pub use seal::{Issued, ListEntry, Manifest, Seal, SealKey, TrustKey};
pub use store::{read_prefix, write_prefix, DiskStore, Expect, MemoryStore};

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("chunk checksum mismatch (layer {layer}, tokens {start}..{end})")]
    Checksum { layer: u32, start: u32, end: u32 },
    #[error("chunk out of order: expected layer {want_layer} from token {want_start}, got layer {layer} from token {start}")]
    Order {
        want_layer: u32,
        want_start: u32,
        layer: u32,
        start: u32,
    },
    #[error("chunk does not fit the segment: {0}")]
    Shape(String),
    #[error("codec: {0}")]
    Codec(String),
    #[error("store: {0}")]
    Store(String),
    #[error("signature: {0}")]
    Seal(String),
    #[error("{0}")]
    Bound(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Engine(#[from] edgeprompt_engine::EngineError),
}

pub type Result<T> = std::result::Result<T, KvError>;
