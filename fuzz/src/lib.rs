//! What the fuzz targets share: the real models, loaded once per process from `models/`
//! (or `$EDGEPROMPT_MODELS`; `python3 scripts/models.py` fetches them).

use std::path::PathBuf;
use std::sync::OnceLock;

use edgeprompt_engine::Model;

fn load(file: &str) -> Model {
    let dir = std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models"));
    let path = dir.join(file);
    Model::load(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run python3 scripts/models.py)", path.display()))
}

/// SmolLM2-135M: byte-level BPE, a ChatML template.
pub fn smollm2() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| load("SmolLM2-135M-Instruct.Q4_1.gguf"))
}

/// Qwen2.5-Coder-0.5B: BPE with its own pre-tokenizer and template.
pub fn qwen() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| load("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
}

/// Gemma 3 270M: SentencePiece, no chat template.
pub fn gemma() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| load("gemma-3-270m-q4_k_m.gguf"))
}
