use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error("cannot read model file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Missing(String),
    #[error("GGUF: {0}")]
    Gguf(String),
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("invalid input: {0}")]
    Input(String),
    #[error("KV does not fit this model: {0}")]
    KvMismatch(String),
}

pub type Result<T> = std::result::Result<T, EngineError>;
