use thiserror::Error;

#[derive(Debug, Error)]
pub enum AlignError {
    #[error(transparent)]
    Engine(#[from] edgeprompt_engine::EngineError),
    #[error("{path}: {msg}")]
    File { path: String, msg: String },
    #[error("adapters do not fit: {0}")]
    Mismatch(String),
    #[error("CE-LSLM maps attention models' KV; {0} has recurrent layers (Gated DeltaNet, short convolutions), whose state it does not map")]
    Recurrent(String),
    #[error("calibration: {0}")]
    Calibration(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("least squares: {0}")]
    Solve(String),
}

pub type Result<T> = std::result::Result<T, AlignError>;
