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

/// A synthetic GGUF written by `scripts/ref/synth.py` (in `$EDGEPROMPT_MODELS/synth`).
pub fn synth_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("models"));
    let p = dir.join(format!("synth/{name}.gguf"));
    assert!(
        p.exists(),
        "{} is missing: run `python3 scripts/ref/synth.py {name}`",
        p.display()
    );
    p
}

pub fn synth(name: &str) -> Model {
    Model::load(synth_path(name)).unwrap()
}

/// Whether two rows of logits are the same bits.
pub fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The prompt's last logits and `steps` greedy steps' logits.
pub fn answer(
    m: &Model,
    seq: &mut edgeprompt_engine::Sequence,
    first: Vec<f32>,
    steps: usize,
) -> Vec<Vec<f32>> {
    let mut out = vec![first];
    for _ in 0..steps {
        let id = edgeprompt_engine::sample::argmax(out.last().unwrap());
        out.push(seq.prefill(m, &[id]).unwrap());
    }
    out
}

pub fn assert_same(what: &str, a: &[Vec<f32>], b: &[Vec<f32>]) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(same(x, y), "{what}: step {i} differs");
    }
}

/// About a thousand tokens of text.
pub fn long_ids(m: &Model) -> Vec<u32> {
    let text = "Refunds are possible up to 24 hours before departure; after that a 20% fee \
                applies, unless the trip was cancelled by the operator. "
        .repeat(45);
    let ids = m.tokenizer.encode(&text).unwrap();
    assert!(ids.len() >= 1000, "{} tokens", ids.len());
    ids[..1000].to_vec()
}
