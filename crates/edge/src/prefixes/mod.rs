//! Where a request's cloud-prompt KV comes from, in order (docs/design.md §5): this edge's memory,
//! its disk (survives restarts), peer edges, the cloud, or computed here (a cloud that is down or
//! dies mid-stream: the result is the same KV, bit for bit). One lookup per prompt however many
//! requests ask at once; every request on the prompt then shares that one copy.
//!
//! Only prompts the cloud publishes (`catalog`) are looked up anywhere but here: a system
//! message that is not on the cloud's list is private, computed on this edge, never written to
//! disk and never served to peers; nothing of it (text, ids, length, address) goes on a link.
//! Its KV belongs to the tenant that sent it (`Scope`: API key and `cache_salt`): another
//! tenant sending the same text computes it anew, as it would a text nobody sent, so neither
//! timing nor a response field tells whether someone else used it. Callers with neither (an
//! open API without a salt) are one tenant: the server cannot tell them apart.

use sha2::Digest;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use edgeprompt_engine::{Model, PrefixKv};
use edgeprompt_kv::{content_address, Codec, DiskStore, Seal};
use edgeprompt_protocol::PromptRef;
use lru::LruCache;
use tokio::sync::OnceCell;

use crate::catalog::Catalog;
use crate::layer_stream::{PromptKv, StreamFailure, Wire};
use crate::link_meter::LinkMeter;
use crate::metrics::Metrics;
use crate::private_cache::Scope;
use crate::CloudClient;

mod config;
mod fetch;
mod flight;
mod prefetch;
mod tiers;

pub use config::{Deadlines, PrefixConfig, UnknownSystem};
use flight::{Flight, Interest, Slot};

/// How far a lookup may go for a prompt's KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// A private system message: computed here, asked of no one, kept for its tenant only.
    Private,
    /// A published prompt a system message matched while this edge prefetches: memory, disk
    /// or the prefetch in flight, else computed here; never fetched because it was used.
    Here,
    /// Every tier: disk, peers, the cloud (a prompt named by id, a prefetch, or a published
    /// prompt when prefetching is off).
    Anywhere,
}

impl Reach {
    fn public(self) -> bool {
        self != Reach::Private
    }
}

/// How long a cloud prompt id the cloud did not know is answered as unknown without asking
/// again, and how many such ids are remembered.
const UNKNOWN_ID_TTL: Duration = Duration::from_secs(5);
const UNKNOWN_IDS_KEPT: usize = 1024;

/// The key of a private system message's entry: its tier key (address) and whose it is, after
/// `@`.
fn private_key(key: &str, scope: &Scope) -> String {
    format!("{key}@{}", scope.tag())
}

/// The key of `key`'s prompt in the tiers below memory (the disk's file name): without the
/// owner a private entry carries.
fn tier_key(key: &str) -> &str {
    key.split('@').next().unwrap_or(key)
}

/// Where a prompt's KV came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Memory,
    Disk,
    Peer,
    /// The cloud's object store (or a CDN in front of it).
    Store,
    Cloud,
    Local,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Memory => "memory",
            Source::Disk => "disk",
            Source::Peer => "peer",
            Source::Store => "store",
            Source::Cloud => "cloud",
            Source::Local => "local",
        }
    }
}

/// A cloud prompt a request may name by id.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[schema(as = NamedPrompt)]
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
    /// While a fetch streams: the requests that hold it keep it going; when the last one is
    /// gone (refused, cancelled, done), the fetch is stopped.
    _interest: Option<Arc<Interest>>,
}

impl StreamFailure {
    fn of(e: &LookupError) -> Self {
        Self {
            busy: matches!(e, LookupError::Busy(_)),
            message: e.to_string(),
        }
    }
}

impl Lookup {
    /// Where the prompt came from: for a stream, `Local` once its fetch failed and the
    /// prompt was computed here instead.
    pub fn source(&self) -> Source {
        match &self.kv {
            PromptKv::Streaming(s) if s.computed_here() => Source::Local,
            PromptKv::Streaming(_) | PromptKv::Ready(_) => self.source,
        }
    }

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
    /// Where it came from: only what came from the cloud (or signed, from anywhere) is served
    /// to peers.
    source: Source,
    last_used: u64,
}

pub struct Prefixes {
    model: Arc<Model>,
    cfg: PrefixConfig,
    metrics: Arc<Metrics>,
    disk: Option<Arc<DiskStore>>,
    entries: Mutex<HashMap<String, Entry>>,
    /// Lookups that may stream, by key, while they run.
    streams: Mutex<HashMap<String, Flight>>,
    /// Cloud prompt id -> content address, learnt from the cloud's headers.
    ids: Mutex<HashMap<String, String>>,
    clock: AtomicU64,
    /// Disk writes started and not finished (a drain waits for them).
    writes: Arc<AtomicUsize>,
    /// The last cloud probe: when, and whether it answered.
    probe: tokio::sync::Mutex<Option<(Instant, bool)>>,
    /// What the cloud publishes, and the key its KV must be signed by.
    catalog: Catalog,
    /// The link to the cloud as measured by fetches (for their deadlines).
    meter: LinkMeter,
    /// Cloud prompt ids the cloud said it does not know, and when.
    unknown_ids: Mutex<LruCache<String, Instant>>,
    /// Prompt bytes arriving or being computed now (bounded by the memory budget), and how
    /// many prompts are being computed here.
    pending: Arc<Mutex<(usize, usize)>>,
    /// Key conflicts already acted on (`distrust`).
    distrusted: AtomicU64,
    /// What is prefetched (`prefetch.rs`).
    prefetch: Mutex<prefetch::Prefetch>,
    /// These prefixes, for the prefetcher's tasks (set by `start_prefetch`).
    me: std::sync::OnceLock<std::sync::Weak<Prefixes>>,
    /// The store the cloud's list names, opened once per URL.
    listed_store: Mutex<Option<(String, Arc<edgeprompt_kv::BucketStore>)>>,
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
        let catalog = Catalog::new(
            model.clone(),
            cfg.cloud_url.clone(),
            cfg.cloud_replicas.clone(),
            cfg.security.clone(),
            cfg.trust.clone(),
            cfg.deadlines.header,
            cfg.cloud_prompts.clone(),
        )
        .map_err(|e| LookupError::Failed(e.to_string()))?;
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
            catalog,
            meter: LinkMeter::default(),
            unknown_ids: Mutex::new(LruCache::new(
                std::num::NonZeroUsize::new(UNKNOWN_IDS_KEPT).expect("nonzero"),
            )),
            pending: Arc::new(Mutex::new((0, 0))),
            distrusted: AtomicU64::new(0),
            prefetch: Default::default(),
            me: Default::default(),
            listed_store: Mutex::new(None),
        })
    }

    /// Why the cloud's KV is not trusted now: the cloud showed another key than the pinned
    /// one (`/health` is then not ok, until an operator settles which key is the cloud's).
    pub fn trust_conflict(&self) -> Option<String> {
        self.distrust();
        self.catalog.trust().conflict().map(|e| e.to_string())
    }

    /// On a new key conflict, drop every prompt the pinned key vouched for from memory (it is
    /// served from there unchecked): it may be a forger's (an attacker who answered first), and the edge cannot tell.
    /// Prompts computed here stay; new lookups compute here until the conflict is settled.
    fn distrust(&self) {
        let trust = self.catalog.trust();
        let now = trust.conflicts();
        if self.distrusted.swap(now, Ordering::AcqRel) == now {
            return;
        }
        let dropped = self.entries.lock().map_or(0, |mut e| {
            let before = e.len();
            e.retain(|_, x| x.cell.get().is_none() || x.source == Source::Local);
            before - e.len()
        });
        // The disk tier is checked on every read against the key in force (none during the
        // conflict), and a file the trusted key refuses is removed then: wiping it now would
        // let anyone who shows a key on the path empty it.
        tracing::error!(
            "the cloud's signing key is in conflict: dropped {dropped} prompts from memory that \
             its pinned key vouched for; prompts are computed here until the conflict is settled"
        );
    }

    pub fn has_cloud(&self) -> bool {
        self.cfg.cloud_url.is_some()
    }

    /// Whether `url` is one of the cloud's endpoints (not a peer).
    fn is_cloud(&self, url: &str) -> bool {
        self.cfg.cloud_url.as_deref() == Some(url)
            || self.cfg.cloud_replicas.iter().any(|r| r == url)
    }

    /// The cloud's endpoints in the order a published prompt (by address, or by id) asks them:
    /// highest rendezvous score first, so each prompt has a home replica and moves only if it
    /// fails. Public names only: nothing private picks a replica.
    fn cloud_order(&self, prompt: &PromptRef) -> Vec<String> {
        // By address, so a prompt asked by id or by its text has one home; by id only when
        // the list has not named it.
        let listed = match prompt {
            PromptRef::Id(id) => self
                .catalog
                .current()
                .named(id)
                .and_then(|l| hex::decode(&l.address).ok()),
            PromptRef::ContentAddress(_) => None,
        };
        let key: &[u8] = match (prompt, &listed) {
            (_, Some(a)) => a,
            (PromptRef::Id(id), None) => id.as_bytes(),
            (PromptRef::ContentAddress(a), None) => a,
        };
        let urls: Vec<String> = self
            .cfg
            .cloud_url
            .iter()
            .chain(&self.cfg.cloud_replicas)
            .cloned()
            .collect();
        rendezvous(&urls, key)
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
        let listed = self.catalog.refresh().await;
        let mut out: Vec<Named> = Vec::new();
        let published = listed.clone().unwrap_or_default();
        for p in &published.prompts {
            out.push(Named {
                id: p.id.clone(),
                tokens: p.tokens,
                in_memory: held.contains_key(&p.id) || self.held(&self.key(&p.address)),
            });
        }
        for (id, tokens) in held {
            if published.named(&id).is_none() {
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
        if !self.exact() || !self.cfg.match_prompts {
            return None;
        }
        self.distrust();
        // Named by an id: learnt from a cloud's header, or on its signed list (a prefetched
        // prompt was fetched by address).
        let mut named: Vec<String> = self.ids.lock().ok()?.values().cloned().collect();
        named.extend(
            self.catalog
                .current()
                .prompts
                .iter()
                .map(|p| self.key(&p.address)),
        );
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
            _interest: None,
        })
    }

    /// Bytes of cloud-prompt KV in memory, and of those the bytes requests hold. Idle prompts
    /// over the budget go first (a request that ended may have left them idle).
    pub fn memory_bytes(&self) -> (usize, usize) {
        self.entries
            .lock()
            .map_or((0, 0), |mut e| self.evict_in(&mut e))
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

    /// For a peer: a prompt the cloud publishes that this edge holds as the cloud made it
    /// (memory or disk), with the cloud's signatures if it has them. Never a prompt computed
    /// here, never one the cloud does not publish (held or not: the answer is the same, so
    /// the port is no oracle for private prompts), never unsigned KV that came from a peer;
    /// never asks anyone else.
    pub async fn cached(&self, address: &str) -> Option<(Arc<PrefixKv>, Option<Arc<Seal>>)> {
        self.distrust();
        let published = self.catalog.refresh().await.ok()?;
        published.at(address)?;
        let in_memory = self.entries.lock().ok().and_then(|e| {
            let x = e.get(address)?;
            let relayable = x.source == Source::Cloud || (x.seal.is_some() && self.verifies());
            relayable
                .then(|| x.cell.get().map(|p| (p.clone(), x.seal.clone())))
                .flatten()
        });
        if in_memory.is_some() {
            return in_memory;
        }
        // On disk: only what the cloud signed, checked (an unsigned file may have come from
        // anywhere).
        match self.read_disk(address).await {
            Some((p, Some(s))) if self.verifies() => Some((Arc::new(p), Some(Arc::new(s)))),
            _ => None,
        }
    }

    /// Prompt-cache bytes reserved now by prompts arriving or being computed here.
    pub fn in_flight_bytes(&self) -> usize {
        self.pending.lock().map_or(0, |l| l.0)
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

    /// Whether this edge takes only KV its cloud signed (everything but `--allow-unsigned-kv`).
    pub fn verifies(&self) -> bool {
        self.catalog.trust().requires_signature()
    }

    /// What the cloud publishes (asked again when the last list is stale).
    pub async fn published(&self) -> Result<Arc<crate::catalog::Published>, String> {
        self.catalog.refresh().await
    }

    /// Where this edge keeps a prompt's KV: its content address, marked when the deep layers
    /// are (or may be) CE-LSLM's mapped ones, not the exact KV that address names to other
    /// edges.
    fn key(&self, address: &str) -> String {
        if self.cfg.fused {
            return format!("{address}-fused");
        }
        match (self.cfg.cloud_layers_from, &self.cfg.auto_split) {
            (_, Some(a)) if !a.may_map() => address.to_string(),
            (_, Some(_)) => format!("{address}-lslm-auto"),
            (0, None) => address.to_string(),
            (n, None) => format!("{address}-lslm{n}"),
        }
    }

    /// Whether the deep layers may come mapped from a larger cloud model (CE-LSLM): a fixed
    /// split, or an automatic one that may map (`AutoSplit::may_map`).
    /// Whether every cloud prompt's KV here is the model's own, exact (not mapped by CE-LSLM
    /// adapters, nor decoded from a lossy codec): the same bits however it was obtained.
    pub fn exact(&self) -> bool {
        !self.lslm() && self.cfg.codec == Codec::F16 && self.cfg.auto_codec.is_none()
    }

    fn lslm(&self) -> bool {
        self.cfg.fused
            || self.cfg.cloud_layers_from > 0
            || self.cfg.auto_split.as_ref().is_some_and(|a| a.may_map())
    }

    /// The first layer to take from the cloud for a prompt of `tokens` (None: length unknown).
    fn cloud_first_layer(&self, tokens: Option<usize>) -> usize {
        if self.cfg.fused {
            return 0;
        }
        let Some(auto) = &self.cfg.auto_split else {
            return self.cfg.cloud_layers_from;
        };
        let c = auto.choose(tokens);
        tracing::info!(split = c.split, "cloud layers from auto: {}", c.reason);
        self.metrics.cloud_layers_from.set(c.split as i64);
        c.split
    }

    /// Where a rendered system turn's KV is kept, how the cloud is asked for it, and whether
    /// the cloud publishes it (else it is private: nothing of it leaves this edge). The list
    /// is refreshed first whatever the message holds, so when it is asked tells nothing.
    /// A private one is kept for `scope` only.
    /// A published one is fetched on use only when this edge does not prefetch.
    async fn system_ref(&self, ids: &[u32], scope: &Scope) -> (String, PromptRef, Reach) {
        let address = content_address(&self.model.fingerprint, ids);
        let public = match self.catalog.refresh().await {
            Ok(p) => {
                // Whatever the message, the list is walked first: a published prompt's
                // prefetch is under way before the lookup below asks for it.
                self.walk_if_new(&p);
                p.at(&address).is_some()
            }
            Err(_) => false,
        };
        let bytes = hex::decode(&address).unwrap_or_default();
        let (key, reach) = match (public, self.prefetches()) {
            (true, true) => (self.key(&address), Reach::Here),
            (true, false) => (self.key(&address), Reach::Anywhere),
            (false, _) => (private_key(&self.key(&address), scope), Reach::Private),
        };
        (key, PromptRef::ContentAddress(bytes), reach)
    }

    /// Where a cloud prompt named by id is kept: under the address the cloud's list gives
    /// it. An id the list does not name is asked of no one (a client's id is the client's
    /// text): it is served only if this edge holds it already, else it is unknown.
    async fn id_key(&self, id: &str) -> Result<String, LookupError> {
        if !edgeprompt_protocol::valid_prompt_id(id) {
            return Err(LookupError::UnknownId(id.into()));
        }
        let listed = self.catalog.refresh().await;
        if let Some(l) = listed.as_ref().ok().and_then(|p| p.named(id)) {
            return Ok(self.key(&l.address));
        }
        let known = self.ids.lock().ok().and_then(|m| m.get(id).cloned());
        match (known, listed) {
            (Some(key), _) if self.held(&key) => Ok(key),
            (_, Ok(_)) => Err(LookupError::UnknownId(id.into())),
            (_, Err(e)) => Err(LookupError::Failed(format!(
                "the cloud's list of prompts is not at hand ({e}), so {id:?} cannot be asked for"
            ))),
        }
    }

    /// The KV of a rendered system turn (`ids`), by content address, for this edge's own use
    /// (the one-shot `edge`, the demo): a private one is kept in the edge's own scope.
    pub async fn for_system(&self, ids: &[u32]) -> Result<Resolved, LookupError> {
        let own = Scope::own();
        let (key, prompt, reach) = self.system_ref(ids, &own).await;
        self.lookup(&key, prompt, Some(ids), reach, None).await
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
        let key = self.id_key(id).await?;
        self.lookup(&key, PromptRef::Id(id.into()), None, Reach::Anywhere, None)
            .await
    }

    /// `for_system`, except that a prompt coming from the cloud is answered as soon as its
    /// header is in, still streaming, so the request's private prefill can follow its layers.
    pub async fn for_system_streaming(
        self: &Arc<Self>,
        ids: &[u32],
    ) -> Result<Lookup, LookupError> {
        self.for_tenant_streaming(ids, &Scope::own()).await
    }

    /// `for_system_streaming` for a tenant of the HTTP API (`scope`).
    pub async fn for_tenant_streaming(
        self: &Arc<Self>,
        ids: &[u32],
        scope: &Scope,
    ) -> Result<Lookup, LookupError> {
        let (key, prompt, reach) = self.system_ref(ids, scope).await;
        self.resolve(key, prompt, Some(ids.to_vec()), reach).await
    }

    /// `for_id`, streaming like `for_system_streaming`.
    pub async fn for_id_streaming(self: &Arc<Self>, id: &str) -> Result<Lookup, LookupError> {
        self.known_unknown(id)?;
        let key = self.id_key(id).await?;
        self.resolve(key, PromptRef::Id(id.into()), None, Reach::Anywhere)
            .await
    }

    /// The lookup; with `slot`, a cloud fetch publishes its stream there as layers land.
    /// `public`: the cloud publishes the prompt (or it is named by id); anything else is
    /// computed here and asked of no one.
    async fn lookup(
        &self,
        key: &str,
        prompt: PromptRef,
        ids: Option<&[u32]>,
        reach: Reach,
        slot: Option<&Arc<Slot>>,
    ) -> Result<Resolved, LookupError> {
        self.distrust();
        let public = reach.public();
        let cell = self.cell(key);
        let id = match &prompt {
            PromptRef::Id(id) => Some(id.clone()),
            PromptRef::ContentAddress(_) => None,
        };
        let mut source = Source::Memory;
        let mut wire = Wire::default();
        let mut seal = None;
        let address = (!key.starts_with("id:")).then(|| tier_key(key).to_string());
        let got = cell
            .get_or_try_init(|| async {
                let got = self
                    .fetch_or_compute(prompt, address.as_deref(), ids, reach, slot)
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
                // know, a short-lived note of it. Only this lookup's own cell, and only if no
                // other request waits on it: a waiter may still fill it.
                self.forget_unfilled(key, Some(&cell));
                if let (LookupError::UnknownId(_), Some(id)) = (&e, &id) {
                    if let Ok(mut m) = self.unknown_ids.lock() {
                        m.put(id.clone(), Instant::now());
                    }
                }
                return Err(e);
            }
        };
        if source != Source::Memory {
            if let Ok(mut m) = self.entries.lock() {
                if let Some(x) = m.get_mut(key) {
                    x.seal = seal.clone();
                    x.source = source;
                }
            }
        }
        // A private prompt's lookups are counted alike, held or computed: the count tells no
        // one whether a tenant's message was held. (The disk holds published prompts only, so
        // a disk hit, while the list cannot be had, says nothing of a tenant.)
        self.metrics.lookup(match (public, source) {
            (true, _) | (false, Source::Disk) => source.name(),
            (false, _) => "private",
        });
        if source != Source::Memory {
            tracing::info!(
                tokens = prefix.n_tokens(),
                source = source.name(),
                "cloud prompt KV resolved"
            );
            if self.keeps_on_disk(source, seal.is_some(), public) {
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
            if public && home != key {
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

    /// Drop the least recently used prompts that no request holds until under the budget.
    fn evict(&self) {
        let _ = self.memory_bytes();
    }

    /// Returns the bytes left and, of those, the bytes requests hold, both from one reading
    /// of who holds what (a request may let go meanwhile): the first exceeds the budget by at
    /// most the second.
    fn evict_in(&self, e: &mut HashMap<String, Entry>) -> (usize, usize) {
        let mut idle = Vec::new();
        let (mut total, mut held) = (0, 0);
        for (k, v) in e.iter() {
            let Some(p) = v.cell.get() else { continue };
            total += p.bytes();
            // A prefetched prompt stays while listed, as if a request held it.
            if Arc::strong_count(p) == 1 && !self.kept_for_prefetch(k) {
                idle.push((v.last_used, p.bytes(), k.clone()));
            } else {
                held += p.bytes();
            }
        }
        idle.sort_unstable();
        for (_, bytes, k) in idle {
            if total <= self.cfg.cache_bytes {
                break;
            }
            e.remove(&k);
            total -= bytes;
        }
        (total, held)
    }
}

/// `urls` ordered for `key` by rendezvous hashing (highest SHA-256 of url, 0, key first): each
/// key has a home, and removing an endpoint moves only the keys whose home it was.
pub fn rendezvous(urls: &[String], key: &[u8]) -> Vec<String> {
    let mut scored: Vec<([u8; 32], &String)> = urls
        .iter()
        .map(|u| {
            let score = sha2::Sha256::new()
                .chain_update(u.as_bytes())
                .chain_update([0])
                .chain_update(key)
                .finalize();
            (score.into(), u)
        })
        .collect();
    scored.sort_by_key(|s| std::cmp::Reverse(s.0));
    scored.into_iter().map(|(_, u)| u.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::rendezvous;

    /// Keys spread over the replicas, and a replica that goes moves its own keys only.
    #[test]
    fn rendezvous_moves_only_the_keys_of_a_replica_that_goes() {
        let urls: Vec<String> = (0..3).map(|i| format!("http://10.0.0.{i}:50051")).collect();
        let keys: Vec<[u8; 8]> = (0..600u64).map(u64::to_le_bytes).collect();
        let home = |urls: &[String], k: &[u8]| rendezvous(urls, k)[0].clone();
        for u in &urls {
            let n = keys.iter().filter(|k| &home(&urls, &k[..]) == u).count();
            assert!((150..=250).contains(&n), "{u} is home to {n} of 600 keys");
        }
        let without: Vec<String> = urls[1..].to_vec();
        for k in &keys {
            let before = rendezvous(&urls, k);
            let after = rendezvous(&without, k);
            // The order of the others is kept: the next replica is the one failover took.
            let kept: Vec<String> = before.into_iter().filter(|u| u != &urls[0]).collect();
            assert_eq!(kept, after);
        }
    }
}
