//! A response's `edgeprompt` block: where the cloud prompt's KV came from, what crossed the
//! network for it (the request up, the KV down), what stayed here, and the answer's timing.

use std::time::Instant;

use super::response::{CloudPromptOrigin, EdgepromptBlock};
use crate::layer_stream::PromptKv;
use crate::prefixes::Lookup;
use crate::private_cache::Hit;
use crate::scheduler::Done;

pub struct Origin {
    /// When the HTTP request came in.
    pub arrived: Instant,
    cloud: Option<Cloud>,
    /// This conversation's earlier turns, from the private prefix cache, and how many of
    /// their tokens are private (after the cloud prompt).
    held: Option<(Hit, usize)>,
}

/// The request's cloud prompt: its lookup until the first answer is done (a stream's bytes
/// are counted to its end), then only the facts, so a slow reader pins no KV.
enum Cloud {
    Lookup(Lookup, Option<String>),
    Facts(CloudPromptOrigin),
}

impl Origin {
    pub fn new(arrived: Instant, lookup: Option<Lookup>, id: Option<&String>) -> Self {
        Self {
            arrived,
            cloud: lookup.map(|l| Cloud::Lookup(l, id.cloned())),
            held: None,
        }
    }

    /// Run on `kv`, the conversation so far, of which `private` tokens are private.
    pub fn hold(&mut self, hit: Hit, private: usize) {
        self.held = Some((hit, private));
    }

    /// The conversation's earlier turns, when the private prefix cache held them.
    pub fn kept(&self) -> Option<&Hit> {
        self.held.as_ref().map(|(hit, _)| hit)
    }

    /// The cloud prompt's KV, whole or streaming, until the facts are settled.
    pub fn kv(&self) -> Option<&PromptKv> {
        match &self.cloud {
            Some(Cloud::Lookup(l, _)) => Some(&l.kv),
            _ => None,
        }
    }

    /// The block for one answer of `private_tokens` prompt tokens of its own.
    pub fn block(&mut self, done: &Done, private_tokens: usize) -> EdgepromptBlock {
        if let Some(Cloud::Lookup(l, id)) = &self.cloud {
            let wire = l.wire();
            self.cloud = Some(Cloud::Facts(CloudPromptOrigin {
                id: id.clone(),
                tokens: l.kv.token_ids().len(),
                source: l.source().name(),
                bytes_up: wire.up,
                bytes_down: wire.down,
            }));
        }
        let cloud_prompt = match &self.cloud {
            Some(Cloud::Facts(o)) => Some(o.clone()),
            _ => None,
        };
        let held = self.held.as_ref().map_or(0, |(_, n)| *n);
        let secs = |t: Instant| t.saturating_duration_since(self.arrived).as_secs_f64();
        EdgepromptBlock {
            cloud_prompt,
            // The whole private prompt; of it, what earlier turns computed.
            private_tokens: private_tokens + held,
            private_cached_tokens: held,
            admitted_s: secs(done.served.admitted),
            ttft_s: done.served.first_token.map(secs),
            timeline: done.timeline.as_ref().map(|t| t.layers.clone()),
        }
    }
}
