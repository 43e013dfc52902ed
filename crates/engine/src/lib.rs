//! EdgePrompt's inference engine: GGUF models run one layer at a time with explicit,
//! exportable per-layer KV, and attention split into a read-only shared prefix and a private
//! causal part (docs/design.md §2).

pub mod arch;
pub mod attention;
pub mod catalog;
pub mod chat;
pub mod config;
mod dequant;
mod error;
mod forward;
pub mod generate;
pub mod gguf;
pub mod grammar;
pub mod kernels;
pub mod kv;
mod linear;
pub mod machine;
pub mod model;
mod moe;
mod norm;
mod par;
mod ple;
mod pool;
pub mod recurrent;
pub mod rope;
pub mod sample;
pub mod sequence;
pub mod tokenizer;
mod weights;

pub use chat::{ChatTemplate, Message};
pub use config::{Arch, ModelConfig, RopeStyle};
pub use error::{EngineError, Result};
pub use generate::{GenerateOptions, GenerateStats, Generator, TextStream};
pub use grammar::{bounded_whitespace, Constraint, GrammarError, Grammars, Spec};
pub use kv::{ContinuedKv, LayerKv, LayerSpan, PrefixKv};
pub use model::{Model, ModelInfo};
pub use sample::{draw, logprobs, sample_each, Draw, Sampler, SamplingParams, TokenLogprobs};
pub use sequence::Sequence;
pub use tokenizer::Tokenizer;
pub use weights::TensorType;
