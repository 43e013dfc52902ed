//! The project's benchmarks. Each prints the machine, the model, the settings and the
//! baselines measured in the same run, and writes JSON under `bench-out/`. A bench's module
//! also holds its flags (`Args`), its subcommand (`cli`) and its section of `docs/results.md`.

pub mod batch;
pub mod chat;
pub mod codecs;
pub mod decode;
pub mod engine;
pub mod failover;
pub mod fanout;
pub mod fleet;
pub mod grammar;
mod inputs;
pub mod lslm;
pub mod nodes;
pub mod plot;
pub mod replicas;
pub mod report;
mod results;
mod scripts;
pub mod serve;
pub mod soak;
pub mod table;
pub mod ttft;
pub mod workload;

// Shared with the product: what a run ran on, and the ShareGPT loader calibration uses too.
pub use edgeprompt_align::sharegpt;
pub use edgeprompt_engine::machine;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Engine(#[from] edgeprompt_engine::EngineError),
    #[cfg(feature = "candle")]
    #[error("candle baseline: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("llama.cpp baseline: {0}")]
    Llama(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("data: {0}")]
    Data(String),
    #[error("edge: {0}")]
    Edge(#[from] edgeprompt_edge::EdgeError),
    #[error("cloud: {0}")]
    Cloud(#[from] edgeprompt_cloud::CloudError),
    #[error("alignment: {0}")]
    Align(#[from] edgeprompt_align::AlignError),
    #[error("kv: {0}")]
    Kv(#[from] edgeprompt_kv::KvError),
    /// A message that says it all: a flag's bad value, a missing input, a run's failed checks.
    #[error("{0}")]
    Failed(String),
}

pub use edgeprompt_engine::machine::start;

/// A model name or path as part of one results file's name: separators become `_`.
pub fn file_part(model: &str) -> String {
    model.replace(['/', '\\'], "_")
}

/// `value` as pretty JSON in `dir/name`, creating `dir`: how every bench saves its report.
pub fn write_json(
    dir: &std::path::Path,
    name: &str,
    value: &impl serde::Serialize,
) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(name), serde_json::to_string_pretty(value)?)?;
    Ok(())
}

/// What every bench starts with: the global thread pool sized to `threads` (a no-op if one
/// exists), the machine description, and the model.
pub fn setup(
    threads: usize,
    model: &std::path::Path,
) -> Result<(machine::Machine, std::sync::Arc<edgeprompt_engine::Model>), BenchError> {
    let machine = start(threads);
    let model = std::sync::Arc::new(edgeprompt_engine::Model::load(model)?);
    Ok((machine, model))
}

impl BenchError {
    /// Any other failure, as its message.
    pub fn data(e: impl std::fmt::Display) -> Self {
        BenchError::Data(e.to_string())
    }
}

/// An HTTP client for the load generators, TLS through the product's rustls provider (ring),
/// installed first: reqwest is built without a provider of its own.
pub fn http() -> reqwest::ClientBuilder {
    edgeprompt_kv::bucket::install_tls();
    reqwest::Client::builder()
}
