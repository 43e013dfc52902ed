//! A cloud prompt's KV while it arrives: layers land one by one (the cloud's stream, or the
//! shallow layers computed here for CE-LSLM), and every request waiting on the prompt prefills
//! its private layer `l` as soon as layer `l` is here, inside the running batch.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use edgeprompt_engine::{LayerKv, PrefixKv};

/// One layer that landed: its KV, when, and its size on the wire (0 when computed here).
#[derive(Clone)]
pub struct Landed {
    pub kv: Arc<LayerKv>,
    pub at: Instant,
    pub wire_bytes: usize,
}

/// Bytes a lookup put on the network: `up` what this edge sent (a prompt reference, never
/// private text), `down` what it received (the header and the KV).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Wire {
    pub up: usize,
    pub down: usize,
}

/// Why a streaming prompt could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamFailure {
    /// The edge had no room to compute it now (retry later), rather than a failure.
    pub busy: bool,
    pub message: String,
}

impl std::fmt::Display for StreamFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<&str> for StreamFailure {
    fn from(m: &str) -> Self {
        Self {
            busy: false,
            message: m.to_string(),
        }
    }
}

#[derive(Default)]
struct State {
    layers: Vec<Option<Landed>>,
    /// The whole prompt once resolved (the layers as streamed, or a local recomputation after
    /// the cloud failed), or why it could not be.
    outcome: Option<Result<Arc<PrefixKv>, StreamFailure>>,
}

pub struct LayerStream {
    token_ids: Vec<u32>,
    state: Mutex<State>,
    /// Woken when a layer lands or the prompt resolves (for a blocking reader).
    changed: Condvar,
    /// A layer from the cloud has landed: with the cloud's key, its signature bound these ids
    /// to the prompt.
    vouched: std::sync::atomic::AtomicBool,
    /// The request and header bytes of the fetch feeding this stream.
    opened: Wire,
    /// The fetch failed and the prompt was computed here (the layers that had landed were
    /// already the same bits).
    computed_here: std::sync::atomic::AtomicBool,
}

impl LayerStream {
    pub fn new(token_ids: Vec<u32>, n_layer: usize) -> Self {
        Self {
            token_ids,
            state: Mutex::new(State {
                layers: vec![None; n_layer],
                outcome: None,
            }),
            changed: Condvar::new(),
            vouched: Default::default(),
            opened: Wire::default(),
            computed_here: Default::default(),
        }
    }

    /// The fetch that opens the stream sent `up` bytes and got a `down`-byte header.
    pub fn opened_with(mut self, wire: Wire) -> Self {
        self.opened = wire;
        self
    }

    /// The fetch's bytes so far: its request, its header and the layers landed from the wire.
    pub fn wire(&self) -> Wire {
        let layers: usize = self
            .state()
            .layers
            .iter()
            .flatten()
            .map(|l| l.wire_bytes)
            .sum();
        Wire {
            up: self.opened.up,
            down: self.opened.down + layers,
        }
    }

    pub fn vouch(&self) {
        self.vouched
            .store(true, std::sync::atomic::Ordering::Release);
    }

    pub fn vouched(&self) -> bool {
        self.vouched.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The prompt's tokens (from the cloud's header): known before any layer.
    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn put(&self, layer: usize, kv: Arc<LayerKv>, wire_bytes: usize) {
        let mut s = self.state();
        if let Some(slot) = s.layers.get_mut(layer) {
            *slot = Some(Landed {
                kv,
                at: Instant::now(),
                wire_bytes,
            });
        }
        self.changed.notify_all();
    }

    /// The prompt is resolved: layers that never landed (the cloud died mid-stream and the
    /// prompt was computed here) are taken from `prefix`, bit for bit what the cloud sends.
    pub fn complete(&self, prefix: Arc<PrefixKv>) {
        let mut s = self.state();
        for (l, slot) in s.layers.iter_mut().enumerate() {
            if slot.is_none() {
                if let Some(kv) = prefix.layers.get(l) {
                    *slot = Some(Landed {
                        kv: kv.clone(),
                        at: Instant::now(),
                        wire_bytes: 0,
                    });
                }
            }
        }
        s.outcome = Some(Ok(prefix));
        self.changed.notify_all();
    }

    /// `complete`, with a prompt computed here after the fetch failed.
    pub fn complete_here(&self, prefix: Arc<PrefixKv>) {
        self.computed_here
            .store(true, std::sync::atomic::Ordering::Release);
        self.complete(prefix);
    }

    /// Whether the prompt was computed here after its fetch failed.
    pub fn computed_here(&self) -> bool {
        self.computed_here
            .load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn fail(&self, why: StreamFailure) {
        let mut s = self.state();
        if s.outcome.is_none() {
            s.outcome = Some(Err(why));
        }
        self.changed.notify_all();
    }

    /// Block until layer `l` has landed (`Ok`), or the prompt failed (`Err`). Every wait on a
    /// stream ends: the fetch feeding it ends in time, failed or complete.
    pub fn wait_layer(&self, l: usize) -> Result<Landed, StreamFailure> {
        let mut s = self.state();
        loop {
            if let Some(Some(landed)) = s.layers.get(l) {
                return Ok(landed.clone());
            }
            match &s.outcome {
                Some(Err(e)) => return Err(e.clone()),
                Some(Ok(_)) => return Err(format!("layer {l} never landed").as_str().into()),
                None => {}
            }
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Block until the prompt is resolved.
    pub fn wait_outcome(&self) -> Result<Arc<PrefixKv>, StreamFailure> {
        let mut s = self.state();
        loop {
            if let Some(o) = &s.outcome {
                return o.clone();
            }
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Layer `l`, if it has landed.
    pub fn layer(&self, l: usize) -> Option<Landed> {
        self.state().layers.get(l).cloned().flatten()
    }

    /// The whole prompt once resolved; `Some(Err)` when it cannot be.
    pub fn outcome(&self) -> Option<Result<Arc<PrefixKv>, StreamFailure>> {
        self.state().outcome.clone()
    }
}

/// A request's cloud prompt: whole, or still streaming.
#[derive(Clone)]
pub enum PromptKv {
    Ready(Arc<PrefixKv>),
    Streaming(Arc<LayerStream>),
}

impl PromptKv {
    pub fn token_ids(&self) -> &[u32] {
        match self {
            PromptKv::Ready(p) => &p.token_ids,
            PromptKv::Streaming(s) => s.token_ids(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(v: f32) -> Arc<LayerKv> {
        let mut kv = LayerKv::new(1, 2);
        kv.append(&[v, v], &[v, v], 1);
        Arc::new(kv)
    }

    #[test]
    fn layers_land_in_any_order_and_completion_fills_the_gaps() {
        let s = LayerStream::new(vec![1], 3);
        s.put(1, layer(1.0), 10);
        assert!(s.layer(0).is_none());
        assert_eq!(s.layer(1).map(|l| l.wire_bytes), Some(10));
        let prefix = Arc::new(PrefixKv {
            fingerprint: "f".into(),
            token_ids: vec![1],
            layers: vec![layer(7.0), layer(8.0), layer(9.0)],
        });
        s.complete(prefix.clone());
        // The landed layer stays what it was; the others come from the prefix.
        assert!(Arc::ptr_eq(&s.layer(0).expect("0").kv, &prefix.layers[0]));
        assert!(!Arc::ptr_eq(&s.layer(1).expect("1").kv, &prefix.layers[1]));
        assert!(Arc::ptr_eq(&s.layer(2).expect("2").kv, &prefix.layers[2]));
        assert!(matches!(s.outcome(), Some(Ok(_))));
        s.fail("late".into());
        assert!(s.wait_layer(1).is_ok() && s.wait_outcome().is_ok());
        assert!(
            matches!(s.outcome(), Some(Ok(_))),
            "a resolved prompt stays resolved"
        );
    }
}
