//! The gRPC service.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::{Message, Model, PrefixKv};
use edgeprompt_kv::{
    content_address, BucketStore, Codec, Expect, Manifest, MemoryStore, RedisStore, Seal, SealKey,
    TrustKey,
};
use edgeprompt_protocol::cloud_kv_server::CloudKv;
use edgeprompt_protocol::{
    FetchMessage, FetchRequest, ListReply, ListRequest, PromptInfo, PromptRef,
};
use tokio::sync::{mpsc, Mutex};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::guard::{Guard, Limits};
use crate::stream::Layout;
use crate::tiers::{Entry, SharedTiers, Tier};
use crate::{CloudError, PromptSpec};

pub(crate) struct Prompt {
    pub(crate) id: String,
    pub(crate) token_ids: Vec<u32>,
    address: String,
    /// Held while the prompt's KV is being computed, so it is computed once.
    compute: Mutex<()>,
}

pub struct CloudNode {
    pub(crate) model: Arc<Model>,
    pub(crate) prompts: HashMap<String, Arc<Prompt>>,
    by_address: HashMap<String, String>,
    cache: MemoryStore,
    /// Tiers shared with other cloud nodes (Redis, an object store).
    shared: SharedTiers,
    prefills: AtomicUsize,
    /// Prompts found in a shared tier instead of prefilled.
    shared_hits: AtomicUsize,
    guard: Guard,
    pub(crate) lslm: crate::adapters::Adapters,
    /// Sliding-window layers sent and kept cut to the window (on unless turned off to
    /// measure what the cut saves).
    window_cut: bool,
    /// The key this node signs the KV it serves with (none: unsigned, by explicit choice).
    signing: Option<Arc<SealKey>>,
    /// Where edges may read the published prompts' objects (named in the signed list).
    public_store: Option<String>,
}

impl CloudNode {
    pub fn new(
        model: Arc<Model>,
        specs: &[PromptSpec],
        cache_bytes: usize,
    ) -> Result<Self, CloudError> {
        let mut prompts = HashMap::new();
        let mut by_address = HashMap::new();
        for s in specs {
            // A model without a chat template (a base model) reads a system prompt as text.
            let token_ids = match (&s.text, &model.chat) {
                (Some(text), _) => model.tokenizer.encode_prompt(text)?,
                (None, Some(chat)) => {
                    let text = chat.render(&[Message::new("system", &s.system)], false)?;
                    model.tokenizer.encode(&text)?
                }
                (None, None) => model.tokenizer.encode_prompt(&s.system)?,
            };
            let address = content_address(&model.fingerprint, &token_ids);
            by_address.insert(address.clone(), s.id.clone());
            prompts.insert(
                s.id.clone(),
                Arc::new(Prompt {
                    id: s.id.clone(),
                    token_ids,
                    address,
                    compute: Mutex::new(()),
                }),
            );
        }
        Ok(Self {
            model,
            prompts,
            by_address,
            cache: MemoryStore::new(cache_bytes),
            shared: SharedTiers::default(),
            prefills: AtomicUsize::new(0),
            shared_hits: AtomicUsize::new(0),
            guard: Guard::new(Limits::default(), None),
            lslm: Default::default(),
            window_cut: true,
            // Signed by default: a fresh key unless `with_signing` names the deployment's.
            signing: Some(Arc::new(SealKey::generate()?.0)),
            public_store: None,
        })
    }

    /// Sign every layer this node serves (and stores in the shared tier) with `key`; edges
    /// holding its public key then take the KV from any relay, unaltered or not at all.
    pub fn with_signing(mut self, key: SealKey) -> Self {
        self.signing = Some(Arc::new(key));
        self
    }

    /// Serve the KV unsigned: an edge cannot tell it from a forgery, and takes it only when
    /// told to (`--allow-unsigned-kv`).
    pub fn unsigned(mut self) -> Self {
        self.signing = None;
        self
    }

    /// The key edges check this node's KV with (none: unsigned).
    pub fn public_key(&self) -> Option<TrustKey> {
        self.signing.as_ref().map(|k| k.public())
    }

    /// How a layer of a stream with manifest `m` is sealed.
    pub(crate) fn layer_seal<'a>(&'a self, m: &'a Manifest) -> crate::stream::LayerSeal<'a> {
        match &self.signing {
            Some(k) => crate::stream::LayerSeal::Sign(k, m),
            None => crate::stream::LayerSeal::None,
        }
    }

    /// The seal a prompt's whole KV is stored with (none when this node does not sign).
    fn whole_seal(&self, id: &str, kv: &PrefixKv) -> Option<Seal> {
        self.signing
            .as_ref()
            .map(|k| Seal::sign(k, id, kv, Codec::F16, 0, false))
    }

    /// Send and keep sliding-window layers whole (for comparison; the cut is exact).
    pub fn without_window_cut(mut self) -> Self {
        self.window_cut = false;
        self
    }

    /// This node's own layout: every layer, cut to the windows unless turned off.
    fn own_layout(&self) -> Layout {
        let mut layout = Layout::full(&self.model);
        if !self.window_cut {
            layout.windows.iter_mut().for_each(|w| *w = None);
        }
        layout
    }

    /// A tier shared with other cloud nodes: a prompt any of them prefilled is not prefilled
    /// again here.
    pub fn with_shared(mut self, store: Arc<RedisStore>) -> Self {
        self.shared.redis = Some(store);
        self
    }

    /// A durable tier in an object store, shared with other cloud nodes (after Redis, if
    /// both): read on a miss, written create-only after a prefill.
    pub fn with_bucket(mut self, store: Arc<BucketStore>) -> Self {
        self.shared.bucket = Some(store);
        self
    }

    /// Name `url` in the list as where edges read the published prompts (the object store's
    /// public face, e.g. a CDN: `<url>/<fingerprint>/<address>.kv`). HTTP(S) without
    /// credentials only: every edge will fetch from it.
    pub fn with_public_store(mut self, url: &str) -> Result<Self, CloudError> {
        let bad = |why: &str| CloudError::Store(format!("public store {url}: {why}"));
        let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(bad("edges read http:// or https:// only"));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(bad("a URL every edge is sent carries no credentials"));
        }
        self.public_store = Some(url.trim_end_matches('/').to_string());
        Ok(self)
    }

    /// Prompts this node has prefilled itself (not found in memory or a shared tier).
    pub fn prefills(&self) -> usize {
        self.prefills.load(Ordering::Relaxed)
    }

    /// Prompts this node found in a shared tier instead of prefilling them.
    pub fn shared_hits(&self) -> usize {
        self.shared_hits.load(Ordering::Relaxed)
    }

    /// A prompt's KV from the shared tiers, if one holds it as this node would serve it, or
    /// will once the node holding its prefill lease stored it; `None`: prefill it here.
    async fn read_shared(&self, address: &str) -> Option<(Tier, Arc<PrefixKv>)> {
        let expect = Expect::of(&self.model.cfg);
        let fp = &self.model.fingerprint;
        let accept = |tier, entry| self.accept_shared(tier, address, entry);
        match self.shared.find(fp, address, &expect, &accept).await {
            Some(found) => Some(found),
            None => self.shared.claim(fp, address, &expect, &accept).await,
        }
    }

    /// Another node's bytes are taken only if they are this model's KV of the prompt asked for
    /// and (when this node signs) carry this deployment's signature on every layer.
    fn accept_shared(&self, tier: Tier, address: &str, entry: Entry) -> Option<Arc<PrefixKv>> {
        let (kv, seal) = entry;
        let fits = kv.check_fits(&self.model.cfg, &self.model.fingerprint);
        let addressed = content_address(&kv.fingerprint, &kv.token_ids) == address;
        let signed = match (&self.signing, &seal) {
            (None, _) => Ok(()),
            // Whole, exact f16 KV only: a seal from a later layer leaves the ones below it
            // unsigned, and this node re-signs whatever it serves.
            (Some(k), Some(s)) => s.verify_whole(&k.public(), &kv, |c| c == Codec::F16),
            (Some(_), None) => Err(edgeprompt_kv::KvError::Seal("unsigned".into())),
        };
        match (fits, addressed, signed) {
            (Ok(()), true, Ok(())) => Some(Arc::new(kv)),
            (fits, addressed, signed) => {
                tracing::warn!(
                    "shared tier {}: entry {address} refused (fits: {fits:?}, address matches: {addressed}, signature: {signed:?}); looking further",
                    tier.name()
                );
                None
            }
        }
    }

    /// Limits on streams and per-client rate, and the bearer token fetches must carry.
    pub fn with_guard(mut self, limits: Limits, token: Option<String>) -> Self {
        self.guard = Guard::new(limits, token);
        self
    }

    pub fn prompt_ids(&self) -> Vec<String> {
        self.prompts.keys().cloned().collect()
    }

    /// Token count of a prompt (for reporting).
    pub fn prompt_tokens(&self, id: &str) -> Option<usize> {
        self.prompts.get(id).map(|p| p.token_ids.len())
    }

    /// Compute (or fetch from cache) the KV of a prompt without streaming it.
    pub async fn warm(self: &Arc<Self>, id: &str) -> Result<Arc<PrefixKv>, Status> {
        let p = self
            .prompts
            .get(id)
            .cloned()
            .ok_or_else(|| Status::not_found(id.to_string()))?;
        self.kv_of(p).await
    }

    pub(crate) async fn kv_of(self: &Arc<Self>, p: Arc<Prompt>) -> Result<Arc<PrefixKv>, Status> {
        let layout = self.own_layout();
        let (tx, mut rx) = mpsc::channel(64);
        let me = self.clone();
        let task = tokio::spawn(async move { me.produce(p, layout, Codec::F16, None, tx).await });
        while rx.recv().await.is_some() {}
        task.await.map_err(|e| Status::internal(e.to_string()))?
    }

    fn resolve(&self, req: &FetchRequest) -> Result<Arc<Prompt>, Status> {
        let id = match &req.prompt {
            Some(PromptRef::Id(id)) => id.clone(),
            Some(PromptRef::ContentAddress(a)) => {
                let a = hex::encode(a);
                let mapped = || match (req.first_layer, req.accept_fused) {
                    (0, false) => None,
                    _ => self.lslm.by_address.get(&a),
                };
                self.by_address
                    .get(&a)
                    .or_else(mapped)
                    .cloned()
                    .ok_or_else(|| Status::not_found("no cloud prompt with that content address"))?
            }
            None => {
                return Err(Status::invalid_argument(
                    "the request names no cloud prompt",
                ))
            }
        };
        self.prompts
            .get(&id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("unknown cloud prompt {id:?}")))
    }

    /// Send the header and the chunks of `p` from `layout.first_layer` on into `tx`,
    /// computing the KV first if it is not cached (layer by layer, each layer sent as soon as
    /// it is computed).
    async fn produce(
        self: Arc<Self>,
        p: Arc<Prompt>,
        layout: Layout,
        codec: Codec,
        zstd: Option<i32>,
        tx: mpsc::Sender<Result<FetchMessage, Status>>,
    ) -> Result<Arc<PrefixKv>, Status> {
        let first = layout.first_layer;
        let starts = layout.starts(p.token_ids.len());
        let header =
            crate::stream::header(&layout, &p.id, &p.address, &p.token_ids, codec, zstd, None);
        let _ = tx.send(Ok(header)).await;
        let manifest = crate::stream::manifest(&layout, &p.id, &p.token_ids, codec);
        let guard = p.compute.lock().await;
        let cached = match self.cache.get(&p.address) {
            Some(kv) => Some(kv),
            None => match self.read_shared(&p.address).await {
                Some((tier, kv)) => {
                    tracing::info!(prompt = %p.id, "cloud prompt KV from the shared tier ({})", tier.name());
                    self.shared_hits.fetch_add(1, Ordering::Relaxed);
                    self.cache.put(&p.address, kv.clone());
                    let seal = self.whole_seal(&p.id, &kv);
                    self.shared
                        .store(&p.address, kv.clone(), seal, Some(tier))
                        .await;
                    Some(kv)
                }
                None => None,
            },
        };
        if let Some(kv) = cached {
            drop(guard);
            for (l, layer) in kv.layers.iter().enumerate().skip(first) {
                let seal = self.layer_seal(&manifest);
                crate::stream::send_layer(&tx, l, layer, starts[l], codec, zstd, seal).await?;
            }
            return Ok(kv);
        }
        // Cold: compute layer by layer on a blocking thread, streaming each layer.
        let (ltx, mut lrx) = mpsc::channel::<(usize, Arc<edgeprompt_engine::LayerKv>)>(4);
        let model = self.model.clone();
        let ids = p.token_ids.clone();
        let cut = self.window_cut;
        let compute = tokio::task::spawn_blocking(move || -> Result<PrefixKv, Status> {
            let err = |e: edgeprompt_engine::EngineError| Status::internal(e.to_string());
            let mut pass = PrefillPass::new(&model, &ids, 0).map_err(err)?;
            for l in 0..model.cfg.n_layer {
                pass.run_layer(&model, None).map_err(err)?;
                let _ = ltx.blocking_send((l, Arc::new(pass.layer_kv(l).clone())));
            }
            // Kept cut to the sliding windows: all any edge is sent.
            let kv = pass.into_prefix(&model).map_err(err)?;
            Ok(if cut { kv.window_cut(&model.cfg) } else { kv })
        });
        while let Some((l, layer)) = lrx.recv().await {
            if l < first {
                continue;
            }
            // A client that went away does not stop the computation: the cache still gets it.
            let seal = self.layer_seal(&manifest);
            let _ = crate::stream::send_layer(&tx, l, &layer, starts[l], codec, zstd, seal).await;
        }
        let computed = compute
            .await
            .map_err(|e| Status::internal(e.to_string()))
            .and_then(|r| r);
        let kv = match computed {
            Ok(kv) => Arc::new(kv),
            Err(e) => {
                // Others waiting on this node's lease need not wait for it to run out.
                self.shared.release(&p.address).await;
                return Err(e);
            }
        };
        self.cache.put(&p.address, kv.clone());
        self.prefills.fetch_add(1, Ordering::Relaxed);
        if !self.shared.is_empty() {
            let seal = self.whole_seal(&p.id, &kv);
            self.shared.store(&p.address, kv.clone(), seal, None).await;
        }
        drop(guard);
        tracing::info!(prompt = %p.id, tokens = p.token_ids.len(), "cloud prompt prefilled and cached");
        Ok(kv)
    }
}

type FetchStream = Pin<Box<dyn Stream<Item = Result<FetchMessage, Status>> + Send>>;

/// The gRPC face of a cloud node.
#[derive(Clone)]
pub struct CloudService(pub Arc<CloudNode>);

impl CloudService {
    pub fn server(
        node: Arc<CloudNode>,
    ) -> edgeprompt_protocol::cloud_kv_server::CloudKvServer<Self> {
        edgeprompt_protocol::cloud_kv_server::CloudKvServer::new(Self(node))
            .max_encoding_message_size(64 << 20)
    }
}

#[tonic::async_trait]
impl CloudKv for CloudService {
    type FetchStream = FetchStream;

    async fn fetch(&self, req: Request<FetchRequest>) -> Result<Response<FetchStream>, Status> {
        let this = &self.0;
        let permit = this.guard.admit(&req)?;
        let req = req.into_inner();
        // A smaller model's own KV fused with this one's, where the edge takes it (every
        // layer); else this model's own KV, or a smaller model's through CE-LSLM adapters.
        let fused = match (req.accept_fused, req.first_layer) {
            (true, 0) => this.lslm.fuser_for(&req.model_fingerprint),
            _ => None,
        };
        let adapters = match (&fused, this.lslm.for_edge(&req.model_fingerprint)) {
            (Some(_), _) => None,
            (None, Some(set)) => Some(set),
            (None, None) => {
                crate::stream::check_fingerprint(&req, &this.model.fingerprint)?;
                None
            }
        };
        let p = this.resolve(&req)?;
        let (codec, zstd) = crate::stream::negotiate(&req)?;
        let layout = match &adapters {
            Some(set) => crate::adapters::layout(set, req.first_layer)?,
            None => this.own_layout().from_layer(req.first_layer)?,
        };
        let (tx, rx) = mpsc::channel(64);
        let me = this.clone();
        tokio::spawn(async move {
            // The stream slot is held until the stream ends.
            let _permit = permit;
            let err_tx = tx.clone();
            let done = match (fused, adapters) {
                (Some(f), _) => me.produce_fused(p, f, codec, zstd, tx).await,
                (None, Some(set)) => me.produce_mapped(p, set, layout, codec, zstd, tx).await,
                (None, None) => me.produce(p, layout, codec, zstd, tx).await.map(|_| ()),
            };
            if let Err(e) = done {
                let _ = err_tx.send(Err(e)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        let this = &self.0;
        this.guard.check(&req)?;
        let fp = &req.get_ref().model_fingerprint;
        if fp != &this.model.fingerprint && !this.lslm.serves(fp) {
            return Err(Status::failed_precondition(
                "this cloud serves no KV to a model of that fingerprint",
            ));
        }
        // Addresses as the asking model computes them (a CE-LSLM edge's own fingerprint; the
        // pair shares a tokenizer).
        let mut prompts: Vec<PromptInfo> = this
            .prompts
            .values()
            .map(|p| PromptInfo {
                id: p.id.clone(),
                tokens: p.token_ids.len() as u32,
                content_address: hex::decode(content_address(fp, &p.token_ids)).unwrap_or_default(),
            })
            .collect();
        prompts.sort_by(|a, b| a.id.cmp(&b.id));
        prompts.truncate(MAX_LISTED);
        let entries = list_entries(&prompts);
        let issued = edgeprompt_kv::Issued {
            unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            max_age_secs: LIST_MAX_AGE.as_secs() as u32,
        };
        let (signing_key, signature, fresh_signature) = match &this.signing {
            Some(k) => (
                k.public().to_bytes().to_vec(),
                k.sign_list(fp, &entries).to_vec(),
                k.sign_list_fresh(fp, &entries, issued).to_vec(),
            ),
            None => Default::default(),
        };
        let store_url = this.public_store.clone().unwrap_or_default();
        let store_signature = match (&this.signing, store_url.is_empty()) {
            (Some(k), false) => k.sign_store(fp, &store_url, issued.unix_ms).to_vec(),
            _ => Vec::new(),
        };
        Ok(Response::new(ListReply {
            prompts,
            signing_key,
            signature,
            issued_unix_ms: issued.unix_ms,
            max_age_secs: issued.max_age_secs,
            fresh_signature,
            store_url,
            store_signature,
        }))
    }
}

/// A list's prompts as its signature covers them.
pub fn list_entries(prompts: &[PromptInfo]) -> Vec<edgeprompt_kv::ListEntry> {
    prompts
        .iter()
        .map(|p| edgeprompt_kv::ListEntry {
            id: p.id.clone(),
            tokens: p.tokens,
            address: hex::encode(&p.content_address),
        })
        .collect()
}

/// How long an edge may take a list after the cloud issued it: edges ask every few seconds,
/// so this only has to cover clock skew and a cloud that is briefly away; past it a replayed
/// list is refused.
pub const LIST_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(300);

/// Prompts a list names at most (an edge reads no more).
pub const MAX_LISTED: usize = 1024;
