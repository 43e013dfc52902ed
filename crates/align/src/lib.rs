//! CE-LSLM (CE-LSLM §V): a small edge model reuses a large cloud model's KV.
//!
//! - `calib`: run a model over calibration text, keep per-layer hidden rows, K and V;
//! - `cka`, `rsa`, `similarity`: how alike each LLM layer is to each SLM layer (eqs. 11-15);
//! - `matching`: the layer-matching table with thresholds (eq. 16);
//! - `ridge`, `adapter`: per matched pair, least-squares maps LLM K/V -> SLM K/V, optionally
//!   after ThinK key-channel selection (eq. 17), saved as safetensors with both fingerprints;
//! - `job`: the whole `edgeprompt align` run over ShareGPT calibration text (`sharegpt`).
//!
//! Representations are row-major `[n, d]` matrices (n tokens, d features); the two models may
//! have different `d`. CKA and RSA compare the n × n token-similarity structure, never the
//! features themselves.

pub mod adapter;
pub mod calib;
pub mod cka;
pub mod conversation;
mod error;
pub mod fuser;
pub mod fuser_data;
pub mod job;
pub mod matching;
pub mod ridge;
pub mod rsa;
pub mod sharegpt;
pub mod similarity;

pub use adapter::{fit_adapters, AdapterSet, FitOptions, PairInfo, Shape};
pub use calib::{collect, Calibration, Sampling};
pub use cka::{centered_gram, cka, cka_from_grams};
pub use error::{AlignError, Result};
pub use fuser::Fuser;
pub use matching::match_layers;
pub use rsa::{rsa, rsa_from_sims, similarity_matrix};
pub use similarity::{compare, Similarity};

#[cfg(test)]
mod testutil;

/// CE-LSLM maps attention KV only: a model with recurrent layers (Qwen3.5) is refused, named.
pub fn attention_only(model: &edgeprompt_engine::Model) -> Result<()> {
    match model.cfg.recurrent.iter().any(|&r| r) {
        true => Err(AlignError::Recurrent(model.cfg.name.clone())),
        false => Ok(()),
    }
}
