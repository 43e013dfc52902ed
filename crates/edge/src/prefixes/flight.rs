//! One lookup per prompt, joined by every request that asks for it while it runs: its
//! stream's slot, the requests that hold it (the fetch stops when the last one is gone), and
//! the memory entry its answer fills.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use edgeprompt_engine::PrefixKv;
use edgeprompt_protocol::PromptRef;
use tokio::sync::OnceCell;

use super::{Entry, Lookup, LookupError, Prefixes, Reach, Resolved, Source};
use crate::layer_stream::Wire;
use crate::layer_stream::{LayerStream, PromptKv, StreamFailure};

/// A lookup in flight, joined by every request on its prompt: the stream, once the cloud's
/// header is in.
pub(super) type Slot = tokio::sync::watch::Sender<Option<Arc<LayerStream>>>;

/// Stops the lookups of a fetch in the background when the last request holding it is gone.
pub struct Interest(Mutex<Vec<tokio::task::AbortHandle>>);

impl Drop for Interest {
    fn drop(&mut self) {
        for h in self.0.get_mut().unwrap_or_else(|p| p.into_inner()).iter() {
            h.abort();
        }
    }
}

/// Settles a lookup's stream however its task ends, even one stopped before it first ran: a
/// task stopped because no request held it any more fails the stream and leaves no entry, so
/// nothing waits on it.
pub(super) struct Settling {
    pub(super) prefixes: Arc<Prefixes>,
    pub(super) key: String,
    pub(super) slot: Arc<Slot>,
    pub(super) done: bool,
}

impl Settling {
    pub(super) fn settle(&mut self, got: &Result<Resolved, LookupError>) {
        self.prefixes.settle(&self.key, &self.slot, got);
        self.done = true;
    }
}

impl Drop for Settling {
    fn drop(&mut self) {
        if !self.done {
            let why = LookupError::Failed("no request holds this fetch any more".into());
            self.prefixes.settle(&self.key, &self.slot, &Err(why));
            self.prefixes.forget_unfilled(&self.key, None);
        }
    }
}

/// A lookup in flight with the requests that hold it.
pub(super) struct Flight {
    pub(super) slot: Arc<Slot>,
    pub(super) interest: std::sync::Weak<Interest>,
    /// Started by the prefetcher: its fetch is the list's, whichever joined lookup runs it.
    pub(super) prefetch: bool,
}

impl Prefixes {
    /// Whole from memory; else the lookup runs in the background (joined by every request on
    /// the prompt) and this returns its stream once the cloud's header is in, or the prompt
    /// whole if another tier had it. The background fetch lives while a request holds it.
    pub(super) async fn resolve(
        self: &Arc<Self>,
        key: String,
        prompt: PromptRef,
        ids: Option<Vec<u32>>,
        reach: Reach,
    ) -> Result<Lookup, LookupError> {
        let ready = |r: Resolved| Lookup {
            kv: PromptKv::Ready(r.prefix),
            source: r.source,
            wire: r.wire,
            _interest: None,
        };
        self.distrust();
        if self.held(&key) {
            let r = self
                .lookup(&key, prompt, ids.as_deref(), reach, None)
                .await?;
            return Ok(ready(r));
        }
        let (slot, interest, prefetch) = self.join(&key, false);
        let mut watch = slot.subscribe();
        if prefetch {
            // The prefetch's own lookup makes its fetch: a request that ran a lookup of its
            // own might win the prompt's cell, and compute here what is arriving. It waits
            // for the stream, or for the prefetch to end (the slot's last sender gone), then
            // takes what the prefetch left: held, or else computed here.
            drop(slot);
            if let Ok(s) = watch.wait_for(Option::is_some).await {
                if let Some(s) = s.clone() {
                    return Ok(Lookup {
                        kv: PromptKv::Streaming(s),
                        source: Source::Cloud,
                        wire: Wire::default(),
                        _interest: Some(interest),
                    });
                }
            }
            drop(interest);
            let r = self
                .lookup(&key, prompt, ids.as_deref(), reach, None)
                .await?;
            return Ok(ready(r));
        }
        let mut settling = Settling {
            prefixes: self.clone(),
            key,
            slot,
            done: false,
        };
        let task = tokio::spawn(async move {
            let (me, key, slot) = (
                settling.prefixes.clone(),
                settling.key.clone(),
                settling.slot.clone(),
            );
            let got = me
                .lookup(&key, prompt, ids.as_deref(), reach, Some(&slot))
                .await;
            settling.settle(&got);
            got
        });
        interest
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task.abort_handle());
        tokio::select! {
            // A failed wait (the lookup ended and dropped the slot) leaves the task's answer.
            // Only a cloud fetch streams.
            Ok(s) = watch.wait_for(Option::is_some) => match s.clone() {
                Some(s) => Ok(Lookup {
                    kv: PromptKv::Streaming(s),
                    source: Source::Cloud,
                    wire: Wire::default(),
                    _interest: Some(interest),
                }),
                None => Err(LookupError::Failed("stream vanished".into())),
            },
            r = task => {
                let r = r.map_err(|e| LookupError::Failed(e.to_string()))??;
                Ok(ready(r))
            }
        }
    }

    /// Whether `key`'s prompt is in memory (without making an entry for it).
    pub(super) fn held(&self, key: &str) -> bool {
        self.entries
            .lock()
            .is_ok_and(|e| e.get(key).is_some_and(|x| x.cell.initialized()))
    }

    /// The flight of `key`: its stream's slot, the interest its requests hold (a new one
    /// when none runs, or when everyone who held the last one is gone; `prefetch`: started by
    /// the prefetcher), and whether the prefetcher started it.
    pub(super) fn join(&self, key: &str, prefetch: bool) -> (Arc<Slot>, Arc<Interest>, bool) {
        let mut m = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = m.get(key) {
            if let Some(i) = f.interest.upgrade() {
                return (f.slot.clone(), i, f.prefetch);
            }
        }
        let slot = Arc::new(Slot::new(None));
        let interest = Arc::new(Interest(Mutex::new(Vec::new())));
        m.insert(
            key.to_string(),
            Flight {
                slot: slot.clone(),
                interest: Arc::downgrade(&interest),
                prefetch,
            },
        );
        (slot, interest, prefetch)
    }

    /// The stream in `slot` learns the lookup's outcome, and the slot leaves the map.
    pub(super) fn settle(&self, key: &str, slot: &Arc<Slot>, got: &Result<Resolved, LookupError>) {
        if let Some(stream) = slot.borrow().as_ref() {
            match got {
                Ok(r) if r.source == Source::Local => stream.complete_here(r.prefix.clone()),
                Ok(r) => stream.complete(r.prefix.clone()),
                Err(e) => stream.fail(StreamFailure::of(e)),
            }
        }
        if let Ok(mut m) = self.streams.lock() {
            if m.get(key).is_some_and(|f| Arc::ptr_eq(&f.slot, slot)) {
                m.remove(key);
            }
        }
    }

    /// Drop `key`'s entry if it holds nothing and no request waits on it (`waiting`: the
    /// references to its cell the caller knows of, the map's included).
    pub(super) fn forget_unfilled(&self, key: &str, cell: Option<&Arc<OnceCell<Arc<PrefixKv>>>>) {
        let Ok(mut m) = self.entries.lock() else {
            return;
        };
        let idle = m.get(key).is_some_and(|x| {
            x.cell.get().is_none()
                && match cell {
                    Some(c) => Arc::ptr_eq(&x.cell, c) && Arc::strong_count(c) == 2,
                    None => Arc::strong_count(&x.cell) == 1,
                }
        });
        if idle {
            m.remove(key);
        }
    }

    pub(super) fn cell(&self, key: &str) -> Arc<OnceCell<Arc<PrefixKv>>> {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut e = match self.entries.lock() {
            Ok(e) => e,
            Err(p) => p.into_inner(),
        };
        let entry = e.entry(key.to_string()).or_insert_with(|| Entry {
            cell: Arc::new(OnceCell::new()),
            seal: None,
            source: Source::Local,
            last_used: now,
        });
        entry.last_used = now;
        entry.cell.clone()
    }
}
