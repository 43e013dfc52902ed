//! Where a request's cloud-prompt KV comes from, in order (docs/design.md §5): this edge's memory,
//! its disk (survives restarts), peer edges, the cloud, or computed here (a system message the
//! cloud does not know, or a cloud that is down or dies mid-stream: the result is the same KV,
//! bit for bit). One lookup per prompt however many requests ask at once; every request on the
//! prompt then shares that one copy.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use edgeprompt_engine::{Model, PrefixKv, Sequence};
use edgeprompt_kv::{content_address, Codec, DiskStore, Expect, Seal, TrustKey};
use edgeprompt_protocol::PromptRef;
use lru::LruCache;
use tokio::sync::OnceCell;

use crate::layer_stream::{LayerStream, PromptKv, Wire};
use crate::metrics::Metrics;
use crate::{ClientSecurity, CloudClient, EdgeError};

/// A lookup in flight, joined by every request on its prompt: the stream, once the cloud's
/// header is in.
type Slot = tokio::sync::watch::Sender<Option<Arc<LayerStream>>>;

/// Longest wait for the cloud's next layer before the fetch counts as failed.
const LAYER_STALL: Duration = Duration::from_secs(30);

/// How long a cloud prompt id the cloud did not know is answered as unknown without asking
/// again, and how many such ids are remembered.
const UNKNOWN_ID_TTL: Duration = Duration::from_secs(5);
const UNKNOWN_IDS_KEPT: usize = 1024;

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
    /// Directory of the disk tier (none: no disk tier).
    pub disk_dir: Option<PathBuf>,
    /// gRPC URLs of peer edges asked (by content address) before the cloud.
    pub peers: Vec<String>,
    /// TLS trust and bearer token for the cloud.
    pub security: ClientSecurity,
    /// TLS trust and the peer token for peers (never the cloud's token).
    pub peer_security: ClientSecurity,
    /// The cloud's public key: with it, KV from the cloud, a peer or the disk is used only if
    /// the cloud signed every layer of it.
    pub trust: Option<TrustKey>,
    /// Bytes the disk tier may hold (least recently used files go first).
    pub disk_max_bytes: u64,
    /// System prompts computed here at once (beyond it: busy, retry later).
    pub max_local_prefills: usize,
    /// CE-LSLM: the first layer taken from the cloud (a larger model's KV mapped to this
    /// model's by the cloud's adapters); the layers below it are computed here. 0: all layers
    /// from the cloud, exact.
    pub cloud_layers_from: usize,
    /// `--codec auto`: the codec per fetch from the measured link and the quality table
    /// (overrides `codec`).
    pub auto_codec: Option<Arc<crate::codec_choice::AutoCodec>>,
    /// `--cloud-layers-from auto`: the CE-LSLM split per fetch from the measured link, the
    /// engine's per-layer compute and a quality floor (overrides `cloud_layers_from`).
    pub auto_split: Option<Arc<crate::split_choice::AutoSplit>>,
    /// A completion whose prompt begins with a cloud prompt held here runs on its KV (the
    /// echoed prompt's shared tokens are then not scored).
    pub match_prompts: bool,
}

impl Default for PrefixConfig {
    fn default() -> Self {
        Self {
            cloud_url: None,
            codec: Codec::F16,
            unknown_system: UnknownSystem::ComputeLocally,
            cache_bytes: 1 << 30,
            disk_dir: None,
            peers: Vec::new(),
            security: ClientSecurity::default(),
            peer_security: ClientSecurity::default(),
            trust: None,
            disk_max_bytes: u64::MAX,
            max_local_prefills: 4,
            cloud_layers_from: 0,
            auto_codec: None,
            auto_split: None,
            match_prompts: true,
        }
    }
}

/// Where a prompt's KV came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Memory,
    Disk,
    Peer,
    Cloud,
    Local,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Memory => "memory",
            Source::Disk => "disk",
            Source::Peer => "peer",
            Source::Cloud => "cloud",
            Source::Local => "local",
        }
    }
}

/// How long the cloud's list of prompts is reused.
const LIST_TTL: Duration = Duration::from_secs(5);

type Listed = Result<Vec<(String, usize)>, String>;

/// A cloud prompt a request may name by id.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Named {
    pub id: String,
    pub tokens: usize,
    /// Its KV is in this edge's memory.
    pub in_memory: bool,
}

/// A resolved cloud prompt.
pub struct Resolved {
    pub prefix: Arc<PrefixKv>,
    pub source: Source,
    /// What getting it put on the network (nothing when it was here already).
    pub wire: Wire,
}

/// A request's cloud prompt, whole or streaming, and where it came from.
#[derive(Clone)]
pub struct Lookup {
    pub kv: PromptKv,
    pub source: Source,
    wire: Wire,
}

impl Lookup {
    /// The bytes of the fetch behind it (so far, while it streams).
    pub fn wire(&self) -> Wire {
        match &self.kv {
            PromptKv::Streaming(s) => s.wire(),
            PromptKv::Ready(_) => self.wire,
        }
    }
}

/// A prompt got from a tier below memory.
struct Got {
    prefix: PrefixKv,
    source: Source,
    seal: Option<Seal>,
    wire: Wire,
}

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("the system message is not a registered cloud prompt, and this edge is configured to refuse others")]
    UnknownSystem,
    #[error("no cloud prompt {0:?}")]
    UnknownId(String),
    #[error("{0}")]
    Failed(String),
    #[error("disk tier: {0}")]
    Disk(#[from] edgeprompt_kv::KvError),
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    TooLong(String),
}

struct Entry {
    cell: Arc<OnceCell<Arc<PrefixKv>>>,
    /// The cloud's signatures of the prefix, when it came signed (served on to peers and kept
    /// on disk with it).
    seal: Option<Arc<Seal>>,
    last_used: u64,
}

pub struct Prefixes {
    model: Arc<Model>,
    cfg: PrefixConfig,
    metrics: Arc<Metrics>,
    disk: Option<Arc<DiskStore>>,
    entries: Mutex<HashMap<String, Entry>>,
    /// Lookups that may stream, by key, while they run.
    streams: Mutex<HashMap<String, Arc<Slot>>>,
    /// Cloud prompt id -> content address, learnt from the cloud's headers.
    ids: Mutex<HashMap<String, String>>,
    clock: AtomicU64,
    /// Disk writes started and not finished (a drain waits for them).
    writes: Arc<AtomicUsize>,
    /// The last cloud probe: when, and whether it answered.
    probe: tokio::sync::Mutex<Option<(Instant, bool)>>,
    /// The cloud's last list of prompts (or why it gave none) and when: asked at most every
    /// `LIST_TTL`, one asking at a time, so pages and clients cannot spend the edge's fetch
    /// budget at the cloud.
    listed: tokio::sync::Mutex<Option<(Instant, Listed)>>,
    /// Cloud prompt ids the cloud said it does not know, and when.
    unknown_ids: Mutex<LruCache<String, Instant>>,
    /// Prompt bytes being computed here now (bounded by the memory budget) and how many.
    local: Mutex<(usize, usize)>,
}

impl Prefixes {
    pub fn new(
        model: Arc<Model>,
        cfg: PrefixConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, LookupError> {
        let disk = match &cfg.disk_dir {
            Some(d) => Some(Arc::new(DiskStore::open_bounded(d, cfg.disk_max_bytes)?)),
            None => None,
        };
        Ok(Self {
            model,
            cfg,
            metrics,
            disk,
            entries: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            ids: Mutex::new(HashMap::new()),
            clock: AtomicU64::new(0),
            writes: Arc::new(AtomicUsize::new(0)),
            probe: tokio::sync::Mutex::new(None),
            listed: tokio::sync::Mutex::new(None),
            unknown_ids: Mutex::new(LruCache::new(
                std::num::NonZeroUsize::new(UNKNOWN_IDS_KEPT).expect("nonzero"),
            )),
            local: Mutex::new((0, 0)),
        })
    }

    pub fn has_cloud(&self) -> bool {
        self.cfg.cloud_url.is_some()
    }

    /// Whether a system message the cloud cannot serve is computed here.
    pub fn computes_locally(&self) -> bool {
        self.cfg.unknown_system == UnknownSystem::ComputeLocally
    }

    /// Whether the cloud accepts a connection now (`None`: no cloud configured). Probed at
    /// most every 2 s, so readiness checks do not load the cloud.
    pub async fn cloud_reachable(&self) -> Option<bool> {
        let url = self.cfg.cloud_url.as_deref()?;
        let mut last = self.probe.lock().await;
        if let Some((at, ok)) = *last {
            if at.elapsed() < Duration::from_secs(2) {
                return Some(ok);
            }
        }
        let ok = tokio::time::timeout(
            Duration::from_secs(2),
            CloudClient::connect_with(url, &self.cfg.security),
        )
        .await
        .is_ok_and(|c| c.is_ok());
        *last = Some((Instant::now(), ok));
        Some(ok)
    }

    /// The cloud prompts a request may name: the cloud's list (when it answers within 5 s)
    /// and the ids this edge holds, each with whether its KV is in memory here. `Err`: why
    /// the cloud did not answer (the ids held here still come).
    pub async fn named(&self) -> (Vec<Named>, Result<(), String>) {
        let held: HashMap<String, usize> = {
            let ids = self.ids.lock().map(|m| m.clone()).unwrap_or_default();
            let entries = self.entries.lock();
            ids.into_iter()
                .filter_map(|(id, key)| {
                    let e = entries.as_ref().ok()?;
                    let p = e.get(&key)?.cell.get()?;
                    Some((id, p.n_tokens()))
                })
                .collect()
        };
        let listed = self.cloud_list().await;
        let mut out: Vec<Named> = Vec::new();
        let cloud = listed.as_ref().map(|l| l.as_slice()).unwrap_or_default();
        for (id, tokens) in cloud {
            out.push(Named {
                id: id.clone(),
                tokens: *tokens,
                in_memory: held.contains_key(id),
            });
        }
        for (id, tokens) in held {
            if !cloud.iter().any(|(c, _)| c == &id) {
                out.push(Named {
                    id,
                    tokens,
                    in_memory: true,
                });
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        (out, listed.map(|_| ()))
    }

    /// The longest cloud prompt held in memory whose tokens begin `ids` and leave at least one
    /// token after them: a completion sent whole (an evaluation harness's few-shot preamble
    /// and question) then runs on the prompt's KV. Only prompts named by a cloud id (public:
    /// a system prompt computed here may be someone's own), and only where the KV is exact:
    /// never mapped (CE-LSLM) nor decoded from a lossy codec.
    pub fn held_prefix_of(&self, ids: &[u32]) -> Option<Lookup> {
        let exact = !self.lslm() && self.cfg.codec == Codec::F16 && self.cfg.auto_codec.is_none();
        if !exact || !self.cfg.match_prompts {
            return None;
        }
        let named: Vec<String> = self.ids.lock().ok()?.values().cloned().collect();
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut e = self.entries.lock().ok()?;
        let key = named
            .iter()
            .filter_map(|k| Some((k, e.get(k)?.cell.get()?.clone())))
            .filter(|(_, p)| p.n_tokens() < ids.len() && ids.starts_with(&p.token_ids))
            .max_by_key(|(_, p)| p.n_tokens())
            .map(|(k, _)| k.clone())?;
        let entry = e.get_mut(&key)?;
        entry.last_used = now;
        let prefix = entry.cell.get()?.clone();
        drop(e);
        self.metrics.lookup(Source::Memory.name());
        self.metrics.prefix_matches.inc();
        Some(Lookup {
            kv: PromptKv::Ready(prefix),
            source: Source::Memory,
            wire: Wire::default(),
        })
    }

    /// The cloud's prompts; an answer younger than `LIST_TTL` is reused.
    async fn cloud_list(&self) -> Listed {
        let Some(url) = &self.cfg.cloud_url else {
            return Ok(Vec::new());
        };
        let mut last = self.listed.lock().await;
        if let Some((at, l)) = last.as_ref() {
            if at.elapsed() < LIST_TTL {
                return l.clone();
            }
        }
        let ask = async {
            let mut c = CloudClient::connect_with(url, &self.cfg.security).await?;
            c.list(&self.model).await
        };
        let l = match tokio::time::timeout(Duration::from_secs(5), ask).await {
            Ok(Ok(l)) => Ok(l),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the cloud did not answer within 5 s".into()),
        };
        *last = Some((Instant::now(), l.clone()));
        l
    }

    /// Bytes of cloud-prompt KV held in memory (over the budget only while requests hold
    /// every entry).
    pub fn memory_bytes(&self) -> usize {
        self.entries.lock().map_or(0, |e| {
            e.values()
                .filter_map(|v| v.cell.get().map(|p| p.bytes()))
                .sum()
        })
    }

    /// Wait until every disk write started so far has finished, or `within` has passed.
    /// Returns the writes still running (0: the disk tier is complete).
    pub async fn flush(&self, within: Duration) -> usize {
        let until = Instant::now() + within;
        loop {
            let n = self.writes.load(Ordering::Acquire);
            if n == 0 || Instant::now() >= until {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// A prompt this edge holds (memory or disk) with the cloud's signatures if it has them,
    /// for peers; never asks anyone else.
    pub async fn cached(&self, address: &str) -> Option<(Arc<PrefixKv>, Option<Arc<Seal>>)> {
        let in_memory = self.entries.lock().ok().and_then(|e| {
            e.get(address)
                .and_then(|x| x.cell.get().map(|p| (p.clone(), x.seal.clone())))
        });
        if in_memory.is_some() {
            return in_memory;
        }
        self.read_disk(address)
            .await
            .map(|(p, s)| (Arc::new(p), s.map(Arc::new)))
    }

    /// Prompts in the memory tier, resolved or being looked up (failed lookups leave none).
    pub fn entries(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.len())
    }

    /// Whether values decoded from `c` are ones this edge would have asked the cloud for (what
    /// a peer or the disk holds must be).
    fn takes_codec(&self, c: Codec) -> bool {
        match &self.cfg.auto_codec {
            Some(a) => c == Codec::F16 || a.allowed().iter().any(|q| q.codec == c),
            None => c == Codec::F16 || c == self.cfg.codec,
        }
    }

    /// Whether this edge checks the cloud's signature on everything it takes.
    pub fn verifies(&self) -> bool {
        self.cfg.trust.is_some()
    }

    /// Where this edge keeps a prompt's KV: its content address, marked when the deep layers
    /// are (or may be) CE-LSLM's mapped ones, not the exact KV that address names to other
    /// edges.
    fn key(&self, address: &str) -> String {
        match (self.cfg.cloud_layers_from, &self.cfg.auto_split) {
            (_, Some(a)) if !a.may_map() => address.to_string(),
            (_, Some(_)) => format!("{address}-lslm-auto"),
            (0, None) => address.to_string(),
            (n, None) => format!("{address}-lslm{n}"),
        }
    }

    /// Whether the deep layers may come mapped from a larger cloud model (CE-LSLM): a fixed
    /// split, or an automatic one that may map (`AutoSplit::may_map`).
    fn lslm(&self) -> bool {
        self.cfg.cloud_layers_from > 0 || self.cfg.auto_split.as_ref().is_some_and(|a| a.may_map())
    }

    /// The first layer to take from the cloud for a prompt of `tokens` (None: length unknown).
    fn cloud_first_layer(&self, tokens: Option<usize>) -> usize {
        let Some(auto) = &self.cfg.auto_split else {
            return self.cfg.cloud_layers_from;
        };
        let c = auto.choose(tokens);
        tracing::info!(split = c.split, "cloud layers from auto: {}", c.reason);
        self.metrics.cloud_layers_from.set(c.split as i64);
        c.split
    }

    /// Where a rendered system turn's KV is kept, and how the cloud is asked for it.
    fn system_ref(&self, ids: &[u32]) -> (String, PromptRef) {
        let address = content_address(&self.model.fingerprint, ids);
        let bytes = hex::decode(&address).unwrap_or_default();
        (self.key(&address), PromptRef::ContentAddress(bytes))
    }

    /// Where a cloud prompt named by id is kept: under its address once a header told it.
    fn id_key(&self, id: &str) -> Result<String, LookupError> {
        if !edgeprompt_protocol::valid_prompt_id(id) {
            return Err(LookupError::UnknownId(id.into()));
        }
        let known = self.ids.lock().ok().and_then(|m| m.get(id).cloned());
        Ok(known.unwrap_or_else(|| format!("id:{id}")))
    }

    /// The KV of a rendered system turn (`ids`), by content address.
    pub async fn for_system(&self, ids: &[u32]) -> Result<Resolved, LookupError> {
        let (key, prompt) = self.system_ref(ids);
        self.lookup(&key, prompt, Some(ids), None).await
    }

    /// An id the cloud said, moments ago, it does not know.
    fn known_unknown(&self, id: &str) -> Result<(), LookupError> {
        let mut m = self.unknown_ids.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(id) {
            Some(at) if at.elapsed() < UNKNOWN_ID_TTL => Err(LookupError::UnknownId(id.into())),
            Some(_) => {
                m.pop(id);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// The KV of a cloud prompt named by its id.
    pub async fn for_id(&self, id: &str) -> Result<Resolved, LookupError> {
        self.known_unknown(id)?;
        let key = self.id_key(id)?;
        self.lookup(&key, PromptRef::Id(id.into()), None, None)
            .await
    }

    /// `for_system`, except that a prompt coming from the cloud is answered as soon as its
    /// header is in, still streaming, so the request's private prefill can follow its layers.
    pub async fn for_system_streaming(
        self: &Arc<Self>,
        ids: &[u32],
    ) -> Result<Lookup, LookupError> {
        let (key, prompt) = self.system_ref(ids);
        self.resolve(key, prompt, Some(ids.to_vec())).await
    }

    /// `for_id`, streaming like `for_system_streaming`.
    pub async fn for_id_streaming(self: &Arc<Self>, id: &str) -> Result<Lookup, LookupError> {
        self.known_unknown(id)?;
        let key = self.id_key(id)?;
        self.resolve(key, PromptRef::Id(id.into()), None).await
    }

    /// Whole from memory; else the lookup runs in the background (joined by every request on
    /// the prompt) and this returns its stream once the cloud's header is in, or the prompt
    /// whole if another tier had it.
    async fn resolve(
        self: &Arc<Self>,
        key: String,
        prompt: PromptRef,
        ids: Option<Vec<u32>>,
    ) -> Result<Lookup, LookupError> {
        let ready = |r: Resolved| Lookup {
            kv: PromptKv::Ready(r.prefix),
            source: r.source,
            wire: r.wire,
        };
        if self.cell(&key).initialized() {
            let r = self.lookup(&key, prompt, ids.as_deref(), None).await?;
            return Ok(ready(r));
        }
        let slot = match self.streams.lock() {
            Ok(mut m) => m
                .entry(key.clone())
                .or_insert_with(|| Arc::new(Slot::new(None)))
                .clone(),
            Err(_) => Arc::new(Slot::new(None)),
        };
        let mut watch = slot.subscribe();
        let me = self.clone();
        let task = tokio::spawn(async move {
            let got = me.lookup(&key, prompt, ids.as_deref(), Some(&slot)).await;
            me.settle(&key, &slot, &got);
            got
        });
        tokio::select! {
            // A failed wait (the lookup ended and dropped the slot) leaves the task's answer.
            // Only a cloud fetch streams.
            Ok(s) = watch.wait_for(Option::is_some) => match s.clone() {
                Some(s) => Ok(Lookup {
                    kv: PromptKv::Streaming(s),
                    source: Source::Cloud,
                    wire: Wire::default(),
                }),
                None => Err(LookupError::Failed("stream vanished".into())),
            },
            r = task => {
                let r = r.map_err(|e| LookupError::Failed(e.to_string()))??;
                Ok(ready(r))
            }
        }
    }

    /// The stream in `slot` learns the lookup's outcome, and the slot leaves the map.
    fn settle(&self, key: &str, slot: &Arc<Slot>, got: &Result<Resolved, LookupError>) {
        if let Some(stream) = slot.borrow().as_ref() {
            match got {
                Ok(r) => stream.complete(r.prefix.clone()),
                Err(e) => stream.fail(e.to_string()),
            }
        }
        if let Ok(mut m) = self.streams.lock() {
            if m.get(key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
                m.remove(key);
            }
        }
    }

    /// The lookup; with `slot`, a cloud fetch publishes its stream there as layers land.
    async fn lookup(
        &self,
        key: &str,
        prompt: PromptRef,
        ids: Option<&[u32]>,
        slot: Option<&Arc<Slot>>,
    ) -> Result<Resolved, LookupError> {
        let cell = self.cell(key);
        let id = match &prompt {
            PromptRef::Id(id) => Some(id.clone()),
            PromptRef::ContentAddress(_) => None,
        };
        let mut source = Source::Memory;
        let mut wire = Wire::default();
        let mut seal = None;
        let address = (!key.starts_with("id:")).then(|| key.to_string());
        let got = cell
            .get_or_try_init(|| async {
                let got = self
                    .fetch_or_compute(prompt, address.as_deref(), ids, slot)
                    .await?;
                source = got.source;
                wire = got.wire;
                seal = got.seal.map(Arc::new);
                Ok::<_, LookupError>(Arc::new(got.prefix))
            })
            .await;
        let prefix = match got {
            Ok(p) => p.clone(),
            Err(e) => {
                // A failed lookup leaves nothing behind but, for an id the cloud does not
                // know, a short-lived note of it.
                if let Ok(mut m) = self.entries.lock() {
                    // Only this lookup's own cell, and only if no other request waits on it
                    // (the map's reference and ours): a waiter may still fill it.
                    if m.get(key).is_some_and(|x| {
                        Arc::ptr_eq(&x.cell, &cell)
                            && x.cell.get().is_none()
                            && Arc::strong_count(&cell) == 2
                    }) {
                        m.remove(key);
                    }
                }
                if let (LookupError::UnknownId(_), Some(id)) = (&e, &id) {
                    if let Ok(mut m) = self.unknown_ids.lock() {
                        m.put(id.clone(), Instant::now());
                    }
                }
                return Err(e);
            }
        };
        if seal.is_some() {
            if let Ok(mut m) = self.entries.lock() {
                if let Some(x) = m.get_mut(key) {
                    x.seal = seal.clone();
                }
            }
        }
        self.metrics.lookup(source.name());
        if source != Source::Memory {
            tracing::info!(
                tokens = prefix.n_tokens(),
                source = source.name(),
                "cloud prompt KV resolved"
            );
            // A CE-LSLM edge keeps no exact fallback on disk: after a restart it asks the
            // cloud again for the mix its peers serve.
            let exact_fallback = source == Source::Local && self.lslm();
            if matches!(source, Source::Peer | Source::Cloud | Source::Local) && !exact_fallback {
                self.write_disk(&prefix, seal.clone());
            }
            // Kept under its address: a prompt named by id, or one fetched before the cloud
            // showed its KV is exact, moves there.
            let home = self.key(&content_address(&prefix.fingerprint, &prefix.token_ids));
            if let Some(id) = id {
                if let Ok(mut m) = self.ids.lock() {
                    m.insert(id, home.clone());
                }
            }
            if home != key {
                if let Ok(mut e) = self.entries.lock() {
                    if let Some(entry) = e.remove(key) {
                        e.insert(home, entry);
                    }
                }
            }
            self.evict();
        }
        Ok(Resolved {
            prefix,
            source,
            wire,
        })
    }

    /// A prompt from the disk tier, only if it is the one `key` names (its ids hash to the
    /// address), fits this model, and, with the cloud's key, carries its signature on every
    /// layer. Anything else is ignored (and fetched again), never used.
    async fn read_disk(&self, key: &str) -> Option<(PrefixKv, Option<Seal>)> {
        let disk = self.disk.clone()?;
        let k = key.to_string();
        let expect = Expect::of(&self.model.cfg);
        let got = tokio::task::spawn_blocking(move || disk.get(&k, &expect))
            .await
            .ok()?;
        let (p, seal) = match got {
            Ok(Some(x)) => x,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!("disk tier: {e}; ignoring the entry");
                return None;
            }
        };
        let address = key.split('-').next().unwrap_or(key);
        let refuse = |why: String| {
            tracing::warn!("disk tier: {key} refused: {why}; fetching it again");
            None
        };
        if let Err(e) = p.check_fits(&self.model.cfg, &self.model.fingerprint) {
            return refuse(e.to_string());
        }
        if content_address(&p.fingerprint, &p.token_ids) != address {
            return refuse("its token ids are not the prompt the file is named for".into());
        }
        if let Some(trust) = &self.cfg.trust {
            match &seal {
                None => return refuse("unsigned, and this edge takes only signed KV".into()),
                Some(s) => {
                    if let Err(e) = s.verify_whole(trust, &p, |c| self.takes_codec(c)) {
                        return refuse(e.to_string());
                    }
                }
            }
        }
        Some((p, seal))
    }

    /// Keep a copy on disk (in the background; a failure only costs the next restart a fetch).
    fn write_disk(&self, prefix: &Arc<PrefixKv>, seal: Option<Arc<Seal>>) {
        let Some(disk) = self.disk.clone() else {
            return;
        };
        let prefix = prefix.clone();
        let key = self.key(&content_address(&prefix.fingerprint, &prefix.token_ids));
        let writes = self.writes.clone();
        writes.fetch_add(1, Ordering::AcqRel);
        let metrics = self.metrics.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = disk.put(&key, &prefix, seal.as_deref()) {
                metrics.disk_write_errors.inc();
                tracing::warn!("disk tier: could not store {key}: {e}");
            }
            writes.fetch_sub(1, Ordering::AcqRel);
        });
    }

    fn cell(&self, key: &str) -> Arc<OnceCell<Arc<PrefixKv>>> {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut e = match self.entries.lock() {
            Ok(e) => e,
            Err(p) => p.into_inner(),
        };
        let entry = e.entry(key.to_string()).or_insert_with(|| Entry {
            cell: Arc::new(OnceCell::new()),
            seal: None,
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

    /// The tiers below memory, in order: disk, peers, cloud, then compute here.
    async fn fetch_or_compute(
        &self,
        prompt: PromptRef,
        address: Option<&str>,
        ids: Option<&[u32]>,
        slot: Option<&Arc<Slot>>,
    ) -> Result<Got, LookupError> {
        let local = |prefix| Got {
            prefix,
            source: Source::Local,
            seal: None,
            wire: Wire::default(),
        };
        if let Some(a) = address {
            if let Some((prefix, seal)) = self.read_disk(a).await {
                return Ok(Got {
                    prefix,
                    source: Source::Disk,
                    seal,
                    wire: Wire::default(),
                });
            }
            let by_address = PromptRef::ContentAddress(hex::decode(a).unwrap_or_default());
            // Peers hold exact prefixes; a CE-LSLM edge takes its mix from the cloud.
            let peers = match self.lslm() {
                false => self.cfg.peers.as_slice(),
                true => &[],
            };
            for peer in peers {
                match self.fetch(peer, by_address.clone(), ids, None, 0).await {
                    Ok((prefix, seal, wire)) => {
                        return Ok(Got {
                            prefix,
                            source: Source::Peer,
                            seal,
                            wire,
                        })
                    }
                    Err(e) => tracing::info!("peer {peer} has no copy ({e})"),
                }
            }
        }
        let first = self.cloud_first_layer(ids.map(<[u32]>::len));
        let fetched = match (&self.cfg.cloud_url, ids) {
            // The planner computes every layer here: the cloud has nothing to add.
            (Some(_), Some(ids)) if first >= self.model.cfg.n_layer => {
                return Ok(local(self.compute(ids).await?));
            }
            (Some(url), _) => {
                let first = first.min(self.model.cfg.n_layer - 1);
                Some(self.fetch(url, prompt.clone(), ids, slot, first).await)
            }
            (None, _) => None,
        };
        // A prompt named by id that failed after its header: its tokens are known now.
        // With the cloud's key, only once a signed layer bound them to the prompt: an unsigned
        // header's ids are the sender's choice.
        let streamed = slot.and_then(|s| {
            s.borrow()
                .as_ref()
                .filter(|s| self.cfg.trust.is_none() || s.vouched())
                .map(|s| s.token_ids().to_vec())
        });
        let ids = ids.or(streamed.as_deref());
        let by_id = |id: &str| LookupError::UnknownId(id.to_string());
        match (fetched, ids, &prompt) {
            (Some(Ok((prefix, seal, wire))), _, _) => Ok(Got {
                prefix,
                source: Source::Cloud,
                seal,
                wire,
            }),
            (Some(Err(EdgeError::NotFound(_))) | None, None, PromptRef::Id(id)) => Err(by_id(id)),
            (Some(Err(e)), None, _) => Err(LookupError::Failed(e.to_string())),
            (Some(Err(EdgeError::NotFound(_))) | None, Some(_), _)
                if self.cfg.unknown_system == UnknownSystem::Refuse =>
            {
                Err(LookupError::UnknownSystem)
            }
            (fetched, Some(ids), _) => {
                // The cloud does not know the prompt, or is down, or died mid-stream: compute
                // it here; the KV is the same bit for bit, so is the answer.
                if let Some(Err(e)) = fetched {
                    if !matches!(e, EdgeError::NotFound(_)) {
                        tracing::warn!("cloud unavailable ({e}); computing the prompt here");
                    }
                }
                Ok(local(self.compute(ids).await?))
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
        slot: Option<&Arc<Slot>>,
        first: usize,
    ) -> Result<(PrefixKv, Option<Seal>, Wire), EdgeError> {
        let to_cloud = self.cfg.cloud_url.as_deref() == Some(url);
        let auto = self.cfg.auto_codec.as_ref().filter(|_| to_cloud);
        let codec = match auto {
            // A peer relays what it holds, as f16.
            _ if !to_cloud => Codec::F16,
            Some(a) => {
                let c = a.choose(ids.map(<[u32]>::len), self.model.cfg.kv_bytes_per_token());
                tracing::info!(codec = c.codec.name(), "codec auto: {}", c.reason);
                self.metrics
                    .codec_choices
                    .get_or_create(&crate::metrics::CodecLabels {
                        codec: c.codec.name().into(),
                    })
                    .inc();
                c.codec
            }
            None => self.cfg.codec,
        };
        let asked = Instant::now();
        // The cloud's token goes to the cloud only; peers get the peer token.
        let security = match to_cloud {
            true => &self.cfg.security,
            false => &self.cfg.peer_security,
        };
        let mut client = CloudClient::connect_with(url, security)
            .await?
            .trusting(self.cfg.trust);
        let (header, mut rx) = client
            .fetch_from(&self.model, prompt, &[codec], false, first)
            .await?;
        let codec_ok = |c: Codec| self.takes_codec(c);
        if to_cloud && header.manifest.codec != codec {
            return Err(EdgeError::Stream(format!(
                "the cloud sent {} KV; this edge asked for {}",
                header.manifest.codec.name(),
                codec.name()
            )));
        }
        if !to_cloud && !codec_ok(header.manifest.codec) {
            return Err(EdgeError::Stream(format!(
                "the peer holds KV decoded from {}, which this edge does not take",
                header.manifest.codec.name()
            )));
        }
        let header_at = Instant::now();
        let opened = Wire {
            up: header.request_bytes,
            down: header.header_bytes,
        };
        let mut received = 0;
        // The link is timed from the first layer's arrival to the last's, over the bytes
        // after the first: the header shares its first packets (or a shaper's first buffer)
        // with the first layer, so timing from the header overstates a small fetch's rate.
        let mut wire: Option<(Instant, usize, Instant)> = None;
        if ids.is_some_and(|ids| ids != header.token_ids.as_slice()) {
            return Err(EdgeError::Stream(
                "the cloud's prompt tokens differ from this edge's tokenization".into(),
            ));
        }
        // Mapped KV must never be kept where exact KV is expected (and served to peers).
        let exact_expected = !self.lslm();
        if header.mapped && exact_expected {
            return Err(EdgeError::Stream(
                "the cloud sent a larger model's KV mapped through adapters (CE-LSLM); this edge asked for its own model's exact KV".into(),
            ));
        }
        // Requests waiting on this prompt follow its layers from here on.
        let stream = slot.map(|slot| {
            let s = Arc::new(
                LayerStream::new(header.token_ids.clone(), self.model.cfg.n_layer)
                    .opened_with(opened),
            );
            slot.send_replace(Some(s.clone()));
            s
        });
        // CE-LSLM: the shallow layers computed here while the deep ones arrive.
        let (model, ids) = (self.model.clone(), header.token_ids.clone());
        let to = stream.clone();
        let shallow =
            tokio::task::spawn_blocking(move || shallow_layers(&model, &ids, first, to.as_deref()));
        let mut deep = Vec::with_capacity(header.n_layers);
        let mut signatures = Vec::with_capacity(header.n_layers);
        for _ in first..header.n_layers {
            // A cloud that stalls mid-stream counts as down (the caller falls back), rather
            // than holding every request on this prompt.
            let a = tokio::time::timeout(LAYER_STALL, rx.recv())
                .await
                .map_err(|_| EdgeError::Stream("the cloud stream stalled".into()))?
                .ok_or_else(|| EdgeError::Stream("cloud stream closed early".into()))??;
            self.metrics.cloud_bytes.inc_by(a.wire_bytes as u64);
            received += a.wire_bytes;
            wire = Some(match wire {
                None => (a.at, 0, a.at),
                Some((first, bytes, _)) => (first, bytes + a.wire_bytes, a.at),
            });
            if deep.is_empty() {
                // The first layer is in (and, with the cloud's key, verified): now what the
                // header says of the cloud (mapped or exact) can be learnt, and its ids vouched.
                if let (Some(a), true) = (&self.cfg.auto_split, to_cloud) {
                    a.learn(header.mapped);
                }
                if let Some(s) = &stream {
                    s.vouch();
                }
            }
            let kv = Arc::new(a.kv);
            if let Some(s) = &stream {
                s.put(a.layer, kv.clone(), a.wire_bytes);
            }
            deep.push(kv);
            signatures.push(a.seal);
        }
        // Kept (and relayed) when every layer streamed was signed.
        let seal = signatures
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .map(|signatures| Seal {
                prompt_id: header.manifest.prompt_id.clone(),
                codec: header.manifest.codec,
                first_layer: first,
                mapped: header.mapped,
                signatures,
            });
        let (bytes, secs) = wire.map_or((0, 0.0), |(first, bytes, last)| {
            (bytes, last.saturating_duration_since(first).as_secs_f64())
        });
        if let Some(s) = &self.cfg.auto_split {
            s.observe(header_at - asked, bytes, secs);
        }
        if let Some(a) = auto {
            a.observe(header_at - asked, bytes, secs);
            if let Some(l) = a.link() {
                self.metrics
                    .link_bytes_per_second
                    .set(l.bytes_per_sec as i64);
            }
        }
        let mut layers = shallow
            .await
            .map_err(|e| EdgeError::Stream(e.to_string()))?
            .map_err(|e| EdgeError::Stream(e.to_string()))?;
        layers.extend(deep);
        // The layers computed here cut like the cloud's: the same prefix as a whole fetch.
        let prefix = PrefixKv {
            fingerprint: self.model.fingerprint.clone(),
            token_ids: header.token_ids,
            layers,
        }
        .window_cut(&self.model.cfg);
        let wire = Wire {
            up: opened.up,
            down: opened.down + received,
        };
        Ok((prefix, seal, wire))
    }

    /// Prefill a prompt here: at most `max_local_prefills` at once, and no more prompt bytes
    /// at once than the memory budget holds (a flood of new system prompts is refused, not
    /// queued without bound).
    async fn compute(&self, ids: &[u32]) -> Result<PrefixKv, LookupError> {
        let bytes = ids.len() * self.model.cfg.kv_bytes_per_token();
        if bytes > self.cfg.cache_bytes {
            return Err(LookupError::TooLong(format!(
                "the system prompt's KV ({} MB for {} tokens) is larger than this edge's prompt cache ({} MB)",
                bytes >> 20,
                ids.len(),
                self.cfg.cache_bytes >> 20
            )));
        }
        {
            let mut l = self.local.lock().unwrap_or_else(|p| p.into_inner());
            if l.1 >= self.cfg.max_local_prefills.max(1) || l.0 + bytes > self.cfg.cache_bytes {
                return Err(LookupError::Busy(format!(
                    "{} system prompts are being computed on this edge; retry later",
                    l.1
                )));
            }
            *l = (l.0 + bytes, l.1 + 1);
        }
        // Given back however this ends, a dropped request included.
        struct Held<'a>(&'a Mutex<(usize, usize)>, usize);
        impl Drop for Held<'_> {
            fn drop(&mut self) {
                let mut l = self.0.lock().unwrap_or_else(|p| p.into_inner());
                *l = (l.0 - self.1, l.1 - 1);
            }
        }
        let _held = Held(&self.local, bytes);
        self.compute_now(ids).await
    }

    async fn compute_now(&self, ids: &[u32]) -> Result<PrefixKv, LookupError> {
        let (model, ids) = (self.model.clone(), ids.to_vec());
        tokio::task::spawn_blocking(move || {
            let mut seq = Sequence::new(&model);
            seq.prefill_chunked(&model, &ids, 256)?;
            // Kept as the cloud would send it: sliding-window layers cut.
            Ok::<_, edgeprompt_engine::EngineError>(
                seq.export_prefix(&model)?.window_cut(&model.cfg),
            )
        })
        .await
        .map_err(|e| LookupError::Failed(e.to_string()))?
        .map_err(|e| LookupError::Failed(e.to_string()))
    }
}

/// Layers `0..n` of the prompt `ids`, computed here (CE-LSLM's shallow layers), each put on
/// `stream` as it is done.
fn shallow_layers(
    model: &Model,
    ids: &[u32],
    n: usize,
    stream: Option<&LayerStream>,
) -> edgeprompt_engine::Result<Vec<Arc<edgeprompt_engine::LayerKv>>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut pass = edgeprompt_engine::sequence::PrefillPass::new(model, ids, 0)?;
    let mut layers = Vec::with_capacity(n);
    for l in 0..n {
        pass.run_layer(model, None)?;
        let kv = Arc::new(pass.layer_kv(l).clone());
        if let Some(s) = stream {
            s.put(l, kv.clone(), 0);
        }
        layers.push(kv);
    }
    Ok(layers)
}
