//! Shared helpers for the engine's integration tests: real GGUF models fetched by
//! `scripts/models.py`, fixtures under the repository's `tests/fixtures/`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use edgeprompt_engine::Model;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures").join(name)
}

pub fn model_path(file: &str) -> PathBuf {
    let dir = std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("models"));
    let p = dir.join(file);
    assert!(
        p.exists(),
        "{} is missing: run `python3 scripts/models.py` first",
        p.display()
    );
    p
}

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const QWEN05: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

fn cached(cell: &'static OnceLock<Arc<Model>>, file: &str) -> Arc<Model> {
    cell.get_or_init(|| Arc::new(Model::load(model_path(file)).expect("model loads")))
        .clone()
}

pub fn smollm2() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    cached(&M, SMOLLM2)
}

pub fn qwen05() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    cached(&M, QWEN05)
}

pub fn gemma3() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    cached(&M, GEMMA3)
}

pub fn read_json(name: &str) -> serde_json::Value {
    let p = fixture(name);
    let text =
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()));
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// A fixture of float16 rows of `width` values each.
pub fn read_f16_rows(name: &str, width: usize) -> Vec<Vec<f32>> {
    let bytes = std::fs::read(fixture(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"));
    bytes
        .chunks_exact(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect::<Vec<f32>>()
        .chunks_exact(width)
        .map(<[f32]>::to_vec)
        .collect()
}
