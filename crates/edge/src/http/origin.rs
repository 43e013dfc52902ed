//! A response's `edgeprompt` block: where the cloud prompt's KV came from, what crossed the
//! network for it (the request up, the KV down), what stayed here, and the answer's timing.

use std::time::Instant;

use serde_json::{json, Value};

use crate::prefixes::Lookup;
use crate::scheduler::Done;

pub struct Origin {
    /// When the HTTP request came in.
    pub arrived: Instant,
    /// The request's cloud prompt, and the id it was named by.
    pub cloud: Option<(Lookup, Option<String>)>,
}

impl Origin {
    pub fn new(arrived: Instant, lookup: Option<Lookup>, id: Option<&String>) -> Self {
        Self {
            arrived,
            cloud: lookup.map(|l| (l, id.cloned())),
        }
    }

    /// The block for one answer of `private_tokens` prompt tokens of its own.
    pub fn block(&self, done: &Done, private_tokens: usize) -> Value {
        let secs = |t: Instant| t.saturating_duration_since(self.arrived).as_secs_f64();
        let cloud = self.cloud.as_ref().map(|(l, id)| {
            let wire = l.wire();
            json!({
                "id": id,
                "tokens": l.kv.token_ids().len(),
                "source": l.source.name(),
                "bytes_up": wire.up,
                "bytes_down": wire.down,
            })
        });
        let mut v = json!({
            "cloud_prompt": cloud,
            "private_tokens": private_tokens,
            "admitted_s": secs(done.served.admitted),
            "ttft_s": done.served.first_token.map(secs),
        });
        if let Some(t) = &done.timeline {
            v["timeline"] = json!(t.layers);
        }
        v
    }
}
