//! Continuous batching on the edge: requests join the running batch at step boundaries, every
//! step is one forward pass over the weights for all active sequences (decoding ones feed one
//! token, prefilling ones a chunk of their prompt), and sequences on the same cloud prompt
//! share one read-only copy of its KV, attended for the whole batch at once.
//!
//! Because the engine's kernels are batch-invariant, a request's tokens do not depend on what
//! else is in the batch: batched answers equal answers computed alone, bit for bit.

mod admission;
mod batcher;
mod cold;
mod fair;
mod plan;
mod request;
mod reservation;
mod running;
mod worker;

use std::time::Duration;

pub use admission::kv_bytes_per_token;
pub use batcher::Batcher;
pub use request::*;
pub use worker::Scheduler;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most sequences in one batch; more wait in the queue.
    pub max_batch: usize,
    /// Prompt tokens prefilled per step, across sequences (chunked prefill: a long prompt
    /// cannot stall the decoding sequences for more than one chunk).
    pub prefill_chunk: usize,
    /// Bytes of private KV the admitted requests may reserve (prompt + max_tokens each).
    pub kv_budget_bytes: usize,
    /// Bytes of finished conversations' KV kept for their next turns (the private prefix
    /// cache, per tenant); 0 keeps none.
    pub private_cache_bytes: usize,
    /// Admitted requests waiting for a batch slot beyond `max_batch`; more get 429.
    pub max_queue: usize,
    pub request_timeout: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_batch: 32,
            prefill_chunk: 256,
            kv_budget_bytes: 1 << 30,
            private_cache_bytes: 256 << 20,
            max_queue: 256,
            request_timeout: Duration::from_secs(300),
        }
    }
}
