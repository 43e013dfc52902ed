//! What the benches' flags name, found on disk: a model by its catalog name, the ShareGPT
//! file and the `edgeprompt` binary the multi-process benches run.

use std::path::PathBuf;

use edgeprompt_engine::catalog;

use crate::BenchError;

/// The ShareGPT file, from where the models are.
pub(crate) fn sharegpt() -> Result<PathBuf, BenchError> {
    Ok(catalog::sharegpt()?)
}

/// A model's GGUF file, from its name (`smollm2`, `qwen05`, `qwen15`) or its path.
pub(crate) fn resolve(name: &str) -> Result<PathBuf, BenchError> {
    Ok(catalog::resolve(name)?)
}

/// The `edgeprompt` binary: the one given, or the one beside this.
pub(crate) fn beside(given: Option<PathBuf>) -> Result<PathBuf, BenchError> {
    let p = match given {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("edgeprompt"),
    };
    if !p.exists() {
        return Err(BenchError::Failed(format!(
            "{} not found: build it with `cargo build --release --bin edgeprompt` or pass --edgeprompt",
            p.display()
        )));
    }
    Ok(p)
}
