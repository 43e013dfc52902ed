//! CE-LSLM layer alignment (CE-LSLM §V, eqs. 11-16): how alike a large and a small model's
//! layers are, so the small edge model can take deep-layer KV from the large cloud model.
//!
//! Representations are row-major `[n, d]` matrices (n tokens, d features); the two models may
//! have different `d`. Both measures compare the n × n token-similarity structure, never the
//! features themselves.

pub mod cka;
pub mod matching;
pub mod rsa;

pub use cka::{centered_gram, cka, cka_from_grams};
pub use matching::match_layers;
pub use rsa::{rsa, rsa_from_sims, similarity_matrix};

#[cfg(test)]
mod testutil;
