//! Where a request's cloud-prompt KV comes from: this edge's memory, the cloud, or (a system
//! message the cloud does not know) computed here. One fetch or computation per prompt however
//! many requests ask at once; every request on the prompt then shares that one copy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use edgeprompt_engine::{Model, PrefixKv, Sequence};
use edgeprompt_kv::{content_address, Codec};
use edgeprompt_protocol::PromptRef;
use tokio::sync::OnceCell;

use crate::metrics::Metrics;
use crate::{CloudClient, EdgeError};

/// What to do with a system message no cloud prompt matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownSystem {
    /// Prefill it on the edge (once) and share it like a cloud prompt.
    ComputeLocally,
    Refuse,
}

#[derive(Debug, Clone)]
pub struct PrefixConfig {
    /// gRPC URL of the cloud node; none means every prefix is computed here.
    pub cloud_url: Option<String>,
    pub codec: Codec,
    pub unknown_system: UnknownSystem,
    /// Bytes of prompt KV kept in memory; idle prompts beyond it are dropped, oldest first.
    pub cache_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("the system message is not a registered cloud prompt, and this edge is configured to refuse others")]
    UnknownSystem,
    #[error("no cloud prompt {0:?}")]
    UnknownId(String),
    #[error("{0}")]
    Failed(String),
}

struct Entry {
    cell: Arc<OnceCell<Arc<PrefixKv>>>,
    last_used: u64,
}

pub struct Prefixes {
    model: Arc<Model>,
    cfg: PrefixConfig,
    metrics: Arc<Metrics>,
    entries: Mutex<HashMap<String, Entry>>,
    /// Cloud prompt id -> content address, learnt from the cloud's headers.
    ids: Mutex<HashMap<String, String>>,
    clock: AtomicU64,
}

impl Prefixes {
    pub fn new(model: Arc<Model>, cfg: PrefixConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            model,
            cfg,
            metrics,
            entries: Mutex::new(HashMap::new()),
            ids: Mutex::new(HashMap::new()),
            clock: AtomicU64::new(0),
        }
    }

    /// The KV of a rendered system turn (`ids`), by content address.
    pub async fn for_system(&self, ids: &[u32]) -> Result<Arc<PrefixKv>, LookupError> {
        let address = content_address(&self.model.fingerprint, ids);
        let bytes = hex::decode(&address).unwrap_or_default();
        self.lookup(&address, PromptRef::ContentAddress(bytes), Some(ids))
            .await
    }

    /// The KV of a cloud prompt named by its id.
    pub async fn for_id(&self, id: &str) -> Result<Arc<PrefixKv>, LookupError> {
        if !edgeprompt_protocol::valid_prompt_id(id) {
            return Err(LookupError::UnknownId(id.into()));
        }
        let known = self.ids.lock().ok().and_then(|m| m.get(id).cloned());
        let key = known.unwrap_or_else(|| format!("id:{id}"));
        self.lookup(&key, PromptRef::Id(id.into()), None).await
    }

    async fn lookup(
        &self,
        key: &str,
        prompt: PromptRef,
        ids: Option<&[u32]>,
    ) -> Result<Arc<PrefixKv>, LookupError> {
        let cell = self.cell(key);
        let id = match &prompt {
            PromptRef::Id(id) => Some(id.clone()),
            PromptRef::ContentAddress(_) => None,
        };
        let mut source = "memory";
        let prefix = cell
            .get_or_try_init(|| async {
                let (p, s) = self.fetch_or_compute(prompt, ids).await?;
                source = s;
                Ok::<_, LookupError>(Arc::new(p))
            })
            .await?
            .clone();
        self.metrics.lookup(source);
        if source != "memory" {
            tracing::info!(
                tokens = prefix.n_tokens(),
                source,
                "cloud prompt KV resolved"
            );
            if let Some(id) = id {
                let address = content_address(&prefix.fingerprint, &prefix.token_ids);
                if let Ok(mut m) = self.ids.lock() {
                    m.insert(id, address.clone());
                }
                if let Ok(mut e) = self.entries.lock() {
                    if let Some(entry) = e.remove(key) {
                        e.insert(address, entry);
                    }
                }
            }
            self.evict();
        }
        Ok(prefix)
    }

    fn cell(&self, key: &str) -> Arc<OnceCell<Arc<PrefixKv>>> {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut e = match self.entries.lock() {
            Ok(e) => e,
            Err(p) => p.into_inner(),
        };
        let entry = e.entry(key.to_string()).or_insert_with(|| Entry {
            cell: Arc::new(OnceCell::new()),
            last_used: now,
        });
        entry.last_used = now;
        entry.cell.clone()
    }

    /// Drop the least recently used prompts that no request holds until under the budget.
    fn evict(&self) {
        let Ok(mut e) = self.entries.lock() else {
            return;
        };
        let size = |e: &Entry| e.cell.get().map_or(0, |p| p.bytes());
        let mut total: usize = e.values().map(size).sum();
        while total > self.cfg.cache_bytes {
            let idle = e
                .iter()
                .filter(|(_, v)| v.cell.get().is_some_and(|p| Arc::strong_count(p) == 1))
                .min_by_key(|(_, v)| v.last_used)
                .map(|(k, _)| k.clone());
            let Some(k) = idle else { break };
            if let Some(v) = e.remove(&k) {
                total -= size(&v);
            }
        }
    }

    async fn fetch_or_compute(
        &self,
        prompt: PromptRef,
        ids: Option<&[u32]>,
    ) -> Result<(PrefixKv, &'static str), LookupError> {
        let fetched = match &self.cfg.cloud_url {
            Some(url) => Some(self.fetch(url, prompt.clone(), ids).await),
            None => None,
        };
        let by_id = |id: &str| LookupError::UnknownId(id.to_string());
        match (fetched, ids, &prompt) {
            (Some(Ok(p)), _, _) => Ok((p, "cloud")),
            (Some(Err(EdgeError::NotFound(_))) | None, None, PromptRef::Id(id)) => Err(by_id(id)),
            (Some(Err(e)), None, _) => Err(LookupError::Failed(e.to_string())),
            (_, Some(_), _) if self.cfg.unknown_system == UnknownSystem::Refuse => {
                Err(LookupError::UnknownSystem)
            }
            (fetched, Some(ids), _) => {
                if let Some(Err(e)) = fetched {
                    if !matches!(e, EdgeError::NotFound(_)) {
                        tracing::warn!("cloud unavailable ({e}); computing the prompt here");
                    }
                }
                Ok((self.compute(ids).await?, "local"))
            }
            (None, None, PromptRef::ContentAddress(_)) => {
                Err(LookupError::Failed("no cloud configured".into()))
            }
        }
    }

    async fn fetch(
        &self,
        url: &str,
        prompt: PromptRef,
        ids: Option<&[u32]>,
    ) -> Result<PrefixKv, EdgeError> {
        let mut client = CloudClient::connect(url).await?;
        let (header, mut rx) = client
            .fetch(&self.model, prompt, &[self.cfg.codec], false)
            .await?;
        if ids.is_some_and(|ids| ids != header.token_ids.as_slice()) {
            return Err(EdgeError::Stream(
                "the cloud's prompt tokens differ from this edge's tokenization".into(),
            ));
        }
        let mut layers = Vec::with_capacity(header.n_layers);
        for _ in 0..header.n_layers {
            let a = rx
                .recv()
                .await
                .ok_or_else(|| EdgeError::Stream("cloud stream closed early".into()))??;
            self.metrics.cloud_bytes.inc_by(a.wire_bytes as u64);
            layers.push(Arc::new(a.kv));
        }
        Ok(PrefixKv {
            fingerprint: self.model.fingerprint.clone(),
            token_ids: header.token_ids,
            layers,
        })
    }

    async fn compute(&self, ids: &[u32]) -> Result<PrefixKv, LookupError> {
        let (model, ids) = (self.model.clone(), ids.to_vec());
        tokio::task::spawn_blocking(move || {
            let mut seq = Sequence::new(&model);
            seq.prefill_chunked(&model, &ids, 256)?;
            seq.export_prefix(&model)
        })
        .await
        .map_err(|e| LookupError::Failed(e.to_string()))?
        .map_err(|e| LookupError::Failed(e.to_string()))
    }
}
