//! The edge against a hostile cloud, a hostile peer and a hostile disk: real tonic servers on
//! loopback written to send every malformed or forged thing a sender on the path could. Each
//! attack must end as a clear error on that lookup or as a fallback whose KV is bit for bit the
//! single-node KV; nothing panics, memory stays bounded, and the next ordinary lookup works.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use edgeprompt_cloud::stream::{header, manifest, send_layer, LayerSeal, Layout};
use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::peer::{PeerPolicy, PeerService};
use edgeprompt_edge::prefixes::{PrefixConfig, Prefixes, Source};
use edgeprompt_edge::{ClientSecurity, CloudClient, CloudTrust, EdgeError};
use edgeprompt_engine::{Model, PrefixKv, Sequence};
use edgeprompt_kv::{Codec, DiskStore, Seal, SealKey, TrustKey};
use edgeprompt_protocol::cloud_kv_server::{CloudKv, CloudKvServer};
use edgeprompt_protocol::{fetch_message::Body, FetchMessage, FetchRequest, PromptRef};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::common;
use common::{edge_ids, model, CODING, SUPPORT};

const USER: &str = "Can I bring my bike on the train tomorrow?";

/// A private system message a path would like to confirm.
const PRIVATE: &str = "You assist the account of Dana Whitfield, number 4417. Be brief.";

/// What the hostile sender does to an honest, signed stream.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Attack {
    Honest,
    /// More token ids than the model's context.
    IdsPastContext,
    /// A header of millions of ids: past the message bound.
    HugeHeader,
    IdsPastVocab,
    WrongHeads,
    WrongLayers,
    StartsPastTheWindow,
    /// A header for another prompt than the one asked for.
    OtherPromptHeader,
    ChunkPastSegment,
    /// One chunk claiming thousands of tokens (the header claims a long prompt).
    ChunkTooLong,
    /// Positions near 2^32 (negative as i32).
    HugeCounts,
    /// A few KB of zstd that inflate to 16 MB.
    ZstdBomb,
    /// One 20 MB chunk.
    OversizedChunk,
    OutOfOrder,
    Duplicated,
    MissingLayer,
    Truncated,
    /// Values changed, the CRC recomputed, the signature kept.
    AlteredWithCrc,
    /// Values changed and the stream signed with another key.
    WrongKey,
    Unsigned,
    /// Another prompt's genuine signed layers under this prompt's header.
    ReplayedLayers,
    /// The genuine header and layers, the signed prompt id changed.
    RenamedPrompt,
    /// Asked by id: a header naming that id over another prompt's ids (and their address),
    /// then unsigned layers: the sender choosing which system prompt the id means.
    ForgedIdHeader,
    /// The fetch accepted, then nothing at all: no header, ever.
    Silent,
    /// The header, then nothing.
    HeaderThenSilence,
    /// Every layer, each a little sooner than the per-layer deadline: slow enough that the
    /// whole fetch would take far longer than the edge allows.
    Drip,
    /// Unsigned, with one chunk's values NaN (its CRC recomputed).
    NanValues,
    /// An f16 header over a chunk in int4 (CRC recomputed).
    Int4ChunkInF16Stream,
    /// The header says the values were decoded from int4 (what a relay of int4 KV says),
    /// the stream is f16: KV of a codec the edge did not ask for.
    Int4ValuesAsF16,
    /// The cloud's genuine int4 stream replayed to an edge that asked for f16.
    ReplayedInt4,
    /// The list with a guessed private prompt's address added (re-signed with another key):
    /// a path fishing for whether an edge holds that prompt.
    ForgedList,
    // A hybrid model's recurrent states (Qwen3.5): what a sender could do to them.
    /// One state value changed, the CRC recomputed, the signature kept.
    AlteredState,
    /// A state cut short.
    TruncatedState,
    /// A 20 MB state: past the message bound.
    OversizedState,
    /// A state with NaN in it (unsigned, the CRC recomputed).
    NanState,
    /// A recurrent layer's chunk with its state taken off.
    MissingState,
    /// An attention layer's last chunk carrying a state.
    StateOnAttentionLayer,
    /// The header says the recurrent layers hold positions from 0.
    RowsOnRecurrentLayer,
    /// The header without the state's shape, and with another one.
    NoStateShape,
    WrongStateShape,
    /// The other prompt's genuine signed state in this prompt's stream.
    ReplayedState,
    /// Gemma 4: the header says the last layer owns its KV (it reads another's), and sends it
    /// (its source's chunks again, as that layer's).
    SharedLayerClaimed,
    /// The header says a layer that owns KV reads another's (its chunks dropped).
    OwnedLayerOmitted,
    /// The header without the per-layer map, and with a sliding layer of the global size.
    NoLayerMap,
    WrongHeadDims,
    /// A signed layer of this stream moved to a layer that reads another's KV.
    ChunkOnSharedLayer,
}

const ATTACKS: [Attack; 25] = [
    Attack::IdsPastContext,
    Attack::HugeHeader,
    Attack::IdsPastVocab,
    Attack::WrongHeads,
    Attack::WrongLayers,
    Attack::StartsPastTheWindow,
    Attack::OtherPromptHeader,
    Attack::ChunkPastSegment,
    Attack::ChunkTooLong,
    Attack::HugeCounts,
    Attack::ZstdBomb,
    Attack::OversizedChunk,
    Attack::OutOfOrder,
    Attack::Duplicated,
    Attack::MissingLayer,
    Attack::Truncated,
    Attack::AlteredWithCrc,
    Attack::WrongKey,
    Attack::Unsigned,
    Attack::ReplayedLayers,
    Attack::RenamedPrompt,
    Attack::NanValues,
    Attack::Int4ChunkInF16Stream,
    Attack::Int4ValuesAsF16,
    Attack::ReplayedInt4,
];

/// Every attack on a hybrid model's states.
const STATE_ATTACKS: [Attack; 10] = [
    Attack::AlteredState,
    Attack::TruncatedState,
    Attack::OversizedState,
    Attack::NanState,
    Attack::MissingState,
    Attack::StateOnAttentionLayer,
    Attack::RowsOnRecurrentLayer,
    Attack::NoStateShape,
    Attack::WrongStateShape,
    Attack::ReplayedState,
];

/// Every attack on a model whose layers differ in head size and share KV (Gemma 4).
const LAYER_MAP_ATTACKS: [Attack; 5] = [
    Attack::SharedLayerClaimed,
    Attack::OwnedLayerOmitted,
    Attack::NoLayerMap,
    Attack::WrongHeadDims,
    Attack::ChunkOnSharedLayer,
];

/// The genuine KV of the two prompts, the keys, and each attack's messages (made once, so
/// memory measured during the attacks is the edge's, not the making of them).
struct Genuine {
    model: Arc<Model>,
    support: PrefixKv,
    coding: PrefixKv,
    key: SealKey,
    wrong: SealKey,
    made: Mutex<Vec<(Attack, Arc<Vec<FetchMessage>>)>>,
}

fn exact_prefix(m: &Model, ids: &[u32]) -> PrefixKv {
    let mut seq = Sequence::new(m);
    seq.prefill_chunked(m, ids, 256).unwrap();
    seq.export_prefix(m).unwrap().window_cut(&m.cfg)
}

impl Genuine {
    fn new() -> Self {
        Self::of(model())
    }

    /// The genuine KV of the two prompts under `model`.
    fn of(model: Arc<Model>) -> Self {
        let (support_ids, _) = edge_ids(&model, SUPPORT, USER);
        let (coding_ids, _) = edge_ids(&model, CODING, USER);
        Self {
            support: exact_prefix(&model, &support_ids),
            coding: exact_prefix(&model, &coding_ids),
            model,
            key: SealKey::from_seed([3; 32]),
            wrong: SealKey::from_seed([4; 32]),
            made: Mutex::new(Vec::new()),
        }
    }

    /// The messages of attack `a`, made on first use.
    async fn messages(&self, a: Attack) -> Arc<Vec<FetchMessage>> {
        if let Some(m) = self.made.lock().unwrap().iter().find(|x| x.0 == a) {
            return m.1.clone();
        }
        let m = Arc::new(self.attack(a).await);
        self.made.lock().unwrap().push((a, m.clone()));
        m
    }

    /// The honest messages for `p`, named `id`, signed with `key` (none: unsigned).
    async fn stream(&self, p: &PrefixKv, id: &str, key: Option<&SealKey>) -> Vec<FetchMessage> {
        self.stream_in(p, id, key, Codec::F16).await
    }

    /// `stream` in `codec`.
    async fn stream_in(
        &self,
        p: &PrefixKv,
        id: &str,
        key: Option<&SealKey>,
        codec: Codec,
    ) -> Vec<FetchMessage> {
        let layout = Layout::full(&self.model);
        let address = edgeprompt_kv::content_address(&p.fingerprint, &p.token_ids);
        let m = manifest(&layout, id, &p.token_ids, codec);
        let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
        tx.send(Ok(header(
            &layout,
            id,
            &address,
            &p.token_ids,
            codec,
            None,
            None,
        )))
        .await
        .unwrap();
        let starts = layout.starts(p.token_ids.len());
        for (l, layer) in p.layers.iter().enumerate() {
            let seal = key.map_or(LayerSeal::None, |k| LayerSeal::Sign(k, &m));
            send_layer(&tx, l, layer, starts[l], codec, None, seal)
                .await
                .unwrap();
        }
        drop(tx);
        let mut out = Vec::new();
        while let Some(m) = rx.recv().await {
            out.push(m.unwrap());
        }
        out
    }

    /// What a hostile cloud answers to a fetch of the support prompt.
    async fn attack(&self, a: Attack) -> Vec<FetchMessage> {
        let (p, id) = (&self.support, "support");
        let cfg = self.model.cfg.clone();
        let mut msgs = match a {
            Attack::Unsigned => self.stream(p, id, None).await,
            Attack::ReplayedLayers => {
                let mut theirs = self.stream(&self.coding, "coding", Some(&self.key)).await;
                theirs[0] = self.stream(p, id, Some(&self.key)).await.remove(0);
                theirs
            }
            Attack::OtherPromptHeader => self.stream(&self.coding, "coding", Some(&self.key)).await,
            Attack::ForgedIdHeader => self.stream(&self.coding, id, None).await,
            Attack::NanValues
            | Attack::Int4ChunkInF16Stream
            | Attack::Int4ValuesAsF16
            | Attack::NanState => self.stream(p, id, None).await,
            Attack::ReplayedInt4 => self.stream_in(p, id, Some(&self.key), Codec::Int4).await,
            Attack::WrongKey => self.stream(p, id, Some(&self.wrong)).await,
            _ => self.stream(p, id, Some(&self.key)).await,
        };
        let n_ctx = cfg.context_length;
        match a {
            Attack::IdsPastContext => head(&mut msgs).token_ids = vec![1; n_ctx + 1],
            Attack::HugeHeader => head(&mut msgs).token_ids = vec![1; 8_000_000],
            Attack::IdsPastVocab => head(&mut msgs).token_ids[3] = cfg.vocab_size as u32 + 7,
            Attack::WrongHeads => head(&mut msgs).n_kv_head += 1,
            Attack::WrongLayers => head(&mut msgs).n_layers -= 1,
            Attack::StartsPastTheWindow => {
                let h = head(&mut msgs);
                h.layer_starts = vec![h.token_ids.len() as u32 - 1; cfg.n_layer]
            }
            Attack::ChunkPastSegment => reseal(chunk(&mut msgs, 1), |c| c.end += 100),
            Attack::ChunkTooLong => {
                let h = head(&mut msgs);
                h.token_ids = vec![1; 5000];
                let a = edgeprompt_kv::content_address(&h.model_fingerprint, &h.token_ids);
                h.content_address = hex::decode(a).unwrap();
                reseal(chunk(&mut msgs, 1), |c| c.end = 5000);
            }
            Attack::HugeCounts => reseal(chunk(&mut msgs, 1), |c| {
                c.start = u32::MAX - 1;
                c.end = u32::MAX;
            }),
            Attack::ZstdBomb => reseal(chunk(&mut msgs, 1), |c| {
                c.compressed = true;
                c.payload = zstd::bulk::compress(&vec![0u8; 16 << 20], 19).unwrap();
            }),
            Attack::OversizedChunk => {
                reseal(chunk(&mut msgs, 1), |c| c.payload = vec![7u8; 20 << 20])
            }
            Attack::OutOfOrder => msgs.swap(2, 3),
            Attack::Duplicated => {
                let d = msgs[2].clone();
                msgs.insert(2, d);
            }
            Attack::MissingLayer => {
                msgs.remove(4);
            }
            Attack::Truncated => msgs.truncate(msgs.len() / 2),
            Attack::AlteredWithCrc | Attack::WrongKey => {
                reseal(chunk(&mut msgs, 5), |c| c.payload[10] ^= 0x08)
            }
            Attack::RenamedPrompt => head(&mut msgs).prompt_id = "coding".into(),
            Attack::NanValues => reseal(chunk(&mut msgs, 3), |c| {
                for b in c.payload.chunks_exact_mut(2).take(16) {
                    b.copy_from_slice(&half::f16::NAN.to_le_bytes());
                }
            }),
            Attack::Int4ChunkInF16Stream => {
                let layer = &self.support.layers[0];
                let end = layer.end().min(edgeprompt_cloud::stream::CHUNK_TOKENS);
                let c = edgeprompt_kv::Chunk::encode(0, layer, 0, end, Codec::Int4, None).unwrap();
                *chunk(&mut msgs, 1) = c.into();
            }
            Attack::Int4ValuesAsF16 => head(&mut msgs).values_codec = "int4".into(),
            Attack::AlteredState => reseal(state_chunk(&mut msgs), |c| c.state[9] ^= 0x01),
            Attack::TruncatedState => reseal(state_chunk(&mut msgs), |c| {
                c.state.truncate(c.state.len() - 4)
            }),
            Attack::OversizedState => {
                reseal(state_chunk(&mut msgs), |c| c.state = vec![0u8; 20 << 20])
            }
            Attack::NanState => reseal(state_chunk(&mut msgs), |c| {
                c.state[..4].copy_from_slice(&f32::NAN.to_le_bytes())
            }),
            Attack::MissingState => reseal(state_chunk(&mut msgs), |c| c.state.clear()),
            Attack::StateOnAttentionLayer => {
                let l = (0..cfg.n_layer).find(|&l| !cfg.is_recurrent(l)).unwrap() as u32;
                let at = msgs
                    .iter()
                    .rposition(|m| matches!(&m.body, Some(Body::Chunk(c)) if c.layer == l))
                    .unwrap();
                let state = state_chunk(&mut msgs).state.clone();
                reseal(chunk(&mut msgs, at), |c| c.state = state);
            }
            Attack::RowsOnRecurrentLayer => {
                let h = head(&mut msgs);
                for l in 0..cfg.n_layer {
                    if cfg.is_recurrent(l) {
                        h.layer_starts[l] = 0;
                    }
                }
            }
            Attack::NoStateShape => head(&mut msgs).state_shape = None,
            Attack::WrongStateShape => {
                if let Some(s) = head(&mut msgs).state_shape.as_mut() {
                    s.v_heads += 1;
                }
            }
            Attack::SharedLayerClaimed => {
                let last = cfg.n_layer - 1;
                let src = cfg.kv_source_of(last) as u32;
                let h = head(&mut msgs);
                h.kv_sources[last] = last as u32;
                h.layer_starts[last] = h.layer_starts[src as usize];
                let copies: Vec<FetchMessage> = msgs
                    .iter()
                    .filter(|m| matches!(&m.body, Some(Body::Chunk(c)) if c.layer == src))
                    .cloned()
                    .collect();
                for mut m in copies {
                    if let Some(Body::Chunk(c)) = m.body.as_mut() {
                        c.layer = last as u32;
                        reseal(c, |_| {});
                    }
                    msgs.push(m);
                }
            }
            Attack::OwnedLayerOmitted => {
                let owner = cfg.kv_source_of(cfg.n_layer - 1) as u32;
                let h = head(&mut msgs);
                h.kv_sources[owner as usize] = owner - 1;
                h.layer_starts[owner as usize] = h.token_ids.len() as u32;
                msgs.retain(|m| !matches!(&m.body, Some(Body::Chunk(c)) if c.layer == owner));
            }
            Attack::NoLayerMap => {
                let h = head(&mut msgs);
                h.head_dims.clear();
                h.kv_sources.clear();
            }
            Attack::WrongHeadDims => {
                let h = head(&mut msgs);
                let global = *h.head_dims.iter().max().unwrap();
                h.head_dims[0] = global;
            }
            Attack::ChunkOnSharedLayer => {
                let last = msgs.len() - 1;
                reseal(chunk(&mut msgs, last), |c| c.layer = cfg.n_layer as u32 - 1);
            }
            Attack::ReplayedState => {
                let theirs = self.stream(&self.coding, "coding", Some(&self.key)).await;
                let mut theirs = theirs;
                let replayed = state_chunk(&mut theirs).clone();
                *state_chunk(&mut msgs) = replayed;
            }
            _ => {}
        }
        msgs
    }
}

/// The first chunk that carries a state (a recurrent layer's).
fn state_chunk(msgs: &mut [FetchMessage]) -> &mut edgeprompt_protocol::WireChunk {
    msgs.iter_mut()
        .find_map(|m| match &mut m.body {
            Some(Body::Chunk(c)) if !c.state.is_empty() => Some(c),
            _ => None,
        })
        .expect("a stream of a hybrid model")
}

fn head(msgs: &mut [FetchMessage]) -> &mut edgeprompt_protocol::Header {
    match &mut msgs[0].body {
        Some(Body::Header(h)) => h,
        _ => unreachable!("the first message is the header"),
    }
}

fn chunk(msgs: &mut [FetchMessage], i: usize) -> &mut edgeprompt_protocol::WireChunk {
    match &mut msgs[i].body {
        Some(Body::Chunk(c)) => c,
        _ => unreachable!("message {i} is a chunk"),
    }
}

/// Change a chunk and recompute its CRC, as any sender on the path can.
fn reseal(
    c: &mut edgeprompt_protocol::WireChunk,
    change: impl FnOnce(&mut edgeprompt_protocol::WireChunk),
) {
    change(c);
    let mut k = edgeprompt_kv::Chunk::try_from(c.clone()).unwrap();
    k.checksum = 0;
    c.checksum = k.compute_checksum();
}

type FetchStream = Pin<Box<dyn Stream<Item = Result<FetchMessage, Status>> + Send>>;

/// A cloud or peer that answers every fetch with the attack of the moment, and remembers the
/// `authorization` each fetch carried.
#[derive(Clone)]
struct Hostile {
    genuine: Arc<Genuine>,
    attack: Arc<Mutex<Attack>>,
    auth: Arc<Mutex<Vec<String>>>,
    /// Paced streams the edge let go of (it stopped reading and closed them).
    gone: Arc<std::sync::atomic::AtomicUsize>,
}

/// Counts a paced stream out when the server drops it (the client closed it).
struct Gone(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Gone {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The pause before each message of a dripping stream.
const DRIP: std::time::Duration = std::time::Duration::from_millis(150);

#[tonic::async_trait]
impl CloudKv for Hostile {
    type FetchStream = FetchStream;

    /// The genuine list: both prompts published, the deployment's key.
    async fn list(
        &self,
        _req: Request<edgeprompt_protocol::ListRequest>,
    ) -> Result<Response<edgeprompt_protocol::ListReply>, Status> {
        let g = &self.genuine;
        let info = |id: &str, p: &PrefixKv| edgeprompt_protocol::PromptInfo {
            id: id.into(),
            tokens: p.token_ids.len() as u32,
            content_address: hex::decode(edgeprompt_kv::content_address(
                &p.fingerprint,
                &p.token_ids,
            ))
            .unwrap(),
        };
        let mut prompts = vec![info("support", &g.support), info("coding", &g.coding)];
        let mut signer = &g.key;
        if *self.attack.lock().unwrap() == Attack::ForgedList {
            let (guess, _) = edge_ids(&g.model, PRIVATE, USER);
            prompts.push(edgeprompt_protocol::PromptInfo {
                id: "guess".into(),
                tokens: guess.len() as u32,
                content_address: hex::decode(edgeprompt_kv::content_address(
                    &g.model.fingerprint,
                    &guess,
                ))
                .unwrap(),
            });
            signer = &g.wrong;
        }
        let entries = edgeprompt_cloud::list_entries(&prompts);
        let issued = edgeprompt_kv::Issued {
            unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64,
            max_age_secs: 300,
        };
        Ok(Response::new(edgeprompt_protocol::ListReply {
            signature: signer.sign_list(&g.model.fingerprint, &entries).to_vec(),
            fresh_signature: signer
                .sign_list_fresh(&g.model.fingerprint, &entries, issued)
                .to_vec(),
            issued_unix_ms: issued.unix_ms,
            max_age_secs: issued.max_age_secs,
            prompts,
            signing_key: g.key.public().to_bytes().to_vec(),
            ..Default::default()
        }))
    }

    async fn fetch(&self, req: Request<FetchRequest>) -> Result<Response<FetchStream>, Status> {
        let auth = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        self.auth.lock().unwrap().push(auth);
        let a = *self.attack.lock().unwrap();
        let honest = self.genuine.messages(Attack::Honest).await;
        // The paced attacks: the held stream's end is noted when the edge lets it go.
        let gone = self.gone.clone();
        let held = |upto: usize| {
            let guard = Gone(gone.clone());
            let msgs = honest.clone();
            tokio_stream::iter((0..upto).map(move |i| Ok(msgs[i].clone())))
                .chain(tokio_stream::pending())
                .map(move |m| {
                    let _ = &guard;
                    m
                })
        };
        match a {
            Attack::Silent => return Ok(Response::new(Box::pin(held(0)))),
            Attack::HeaderThenSilence => return Ok(Response::new(Box::pin(held(1)))),
            Attack::Drip => {
                let msgs = honest.clone();
                let guard = Gone(gone);
                let paced = tokio_stream::iter(0..msgs.len()).then(move |i| {
                    let m = msgs[i].clone();
                    let _ = &guard;
                    async move {
                        tokio::time::sleep(DRIP).await;
                        Ok(m)
                    }
                });
                return Ok(Response::new(Box::pin(paced)));
            }
            _ => {}
        }
        let msgs = self.genuine.messages(a).await;
        let n = msgs.len();
        // One message cloned at a time, as the stream is read.
        Ok(Response::new(Box::pin(tokio_stream::iter(
            (0..n).map(move |i| Ok(msgs[i].clone())),
        ))))
    }
}

async fn serve(h: Hostile) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CloudKvServer::new(h).max_encoding_message_size(usize::MAX))
            .serve_with_incoming(TcpListenerStream::new(l)),
    );
    format!("http://{addr}")
}

fn prefixes(m: &Arc<Model>, cfg: PrefixConfig) -> Arc<Prefixes> {
    Arc::new(Prefixes::new(m.clone(), cfg, Arc::new(Metrics::new())).unwrap())
}

/// Signatures checked with `key`, or (none) unsigned KV allowed.
fn trusting(key: Option<TrustKey>) -> CloudTrust {
    key.map_or(CloudTrust::AllowUnsigned, CloudTrust::Key)
}

/// An edge asking `url`, checking signatures with `trust` if given.
fn edge(m: &Arc<Model>, url: &str, trust: Option<TrustKey>) -> Arc<Prefixes> {
    prefixes(
        m,
        PrefixConfig {
            cloud_url: Some(url.into()),
            trust: trusting(trust),
            ..Default::default()
        },
    )
}

/// A hostile server on loopback doing `attack`; its URL.
async fn hostile(g: &Arc<Genuine>, attack: Arc<Mutex<Attack>>) -> String {
    serve(Hostile {
        genuine: g.clone(),
        attack,
        auth: Default::default(),
        gone: Default::default(),
    })
    .await
}

fn same(a: &PrefixKv, b: &PrefixKv) -> bool {
    a.token_ids == b.token_ids
        && a.layers.len() == b.layers.len()
        && a.layers.iter().zip(&b.layers).all(|(x, y)| **x == **y)
}

/// Peak resident memory of this process so far (VmHWM), in MB.
fn peak_rss_mb() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

#[test]
fn every_hostile_cloud_stream_ends_in_an_error_or_the_exact_fallback() {
    let g = Arc::new(Genuine::new());
    let m = g.model.clone();
    let (ids, _) = edge_ids(&m, SUPPORT, USER);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let attack = Arc::new(Mutex::new(Attack::Honest));
        let url = hostile(&g, attack.clone()).await;
        let trust = Some(g.key.public());
        // Warm up the paths once before measuring memory.
        let p = edge(&m, &url, trust);
        let r = p.for_system(&ids).await.unwrap();
        assert_eq!(r.source, Source::Cloud, "the honest signed stream is taken");
        assert!(same(&r.prefix, &g.support));
        for a in ATTACKS {
            g.messages(a).await;
        }
        let before = peak_rss_mb();
        let mut rows = Vec::new();
        for a in ATTACKS {
            *attack.lock().unwrap() = a;
            // A fresh edge each time: nothing cached from the attack before.
            let p = edge(&m, &url, trust);
            // A system prompt: the edge knows its ids, so it falls back to computing it.
            let r = p.for_system(&ids).await.unwrap();
            assert_eq!(r.source, Source::Local, "{a:?}: the attack is not used");
            assert!(same(&r.prefix, &g.support), "{a:?}: the fallback is exact");
            // The same attack on a direct fetch by id: a clear error, never a panic.
            let err = fetch_error(&m, &url, trust).await;
            rows.push(format!("{a:?}: {err}"));
        }
        let after = peak_rss_mb();
        println!("attack outcomes (direct fetch errors):");
        for r in &rows {
            println!("  {r}");
        }
        println!(
            "peak RSS {before:.0} MB before the attacks, {after:.0} MB after ({} attacks)",
            ATTACKS.len()
        );
        // The 8 M-id header and the 20 MB chunk were refused at the message bound, the
        // 16 MB bomb at the chunk bound: none was decoded in full.
        assert!(
            after - before < 200.0,
            "memory grew {:.0} MB under attack",
            after - before
        );
        // And the next ordinary lookup is answered.
        *attack.lock().unwrap() = Attack::Honest;
        let p = edge(&m, &url, trust);
        let r = p.for_system(&ids).await.unwrap();
        assert_eq!(r.source, Source::Cloud);
    });
}

/// The error a one-shot fetch of "support" by id ends with.
async fn fetch_error(m: &Arc<Model>, url: &str, trust: Option<TrustKey>) -> String {
    let mut c = CloudClient::connect(url).await.unwrap().trusting(trust);
    let got = c
        .fetch(m, PromptRef::Id("support".into()), &[Codec::F16], false)
        .await;
    let mut rx = match got {
        Err(e) => return format!("refused at the header: {e}"),
        Ok((_, rx)) => rx,
    };
    let mut layers = 0;
    while let Some(l) = rx.recv().await {
        match l {
            Ok(_) => layers += 1,
            Err(e) => return format!("after {layers} layers: {e}"),
        }
    }
    if layers == m.cfg.n_layer {
        panic!("every layer of a hostile stream was accepted");
    }
    format!("stream ended after {layers} layers")
}

#[test]
fn without_a_key_the_edge_still_checks_what_it_asked_for() {
    let g = Arc::new(Genuine::new());
    let m = g.model.clone();
    let (ids, _) = edge_ids(&m, SUPPORT, USER);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let attack = Arc::new(Mutex::new(Attack::OtherPromptHeader));
        let url = hostile(&g, attack.clone()).await;
        for a in [
            Attack::OtherPromptHeader,
            Attack::ReplayedLayers,
            Attack::IdsPastContext,
            Attack::ZstdBomb,
            Attack::NanValues,
            Attack::Int4ChunkInF16Stream,
            Attack::Int4ValuesAsF16,
            Attack::ReplayedInt4,
        ] {
            *attack.lock().unwrap() = a;
            let p = edge(&m, &url, None);
            let r = p.for_system(&ids).await.unwrap();
            assert_eq!(r.source, Source::Local, "{a:?}");
            assert!(same(&r.prefix, &g.support), "{a:?}");
        }
    });
}

#[test]
fn peers_get_the_peer_token_never_the_clouds_and_forged_peer_kv_is_refused() {
    let g = Arc::new(Genuine::new());
    let m = g.model.clone();
    let (ids, _) = edge_ids(&m, SUPPORT, USER);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let trust = Some(g.key.public());
        // The honest cloud (signing with the deployment's key).
        let cloud = Arc::new(Mutex::new(Attack::Honest));
        let cloud_url = serve(Hostile {
            genuine: g.clone(),
            attack: cloud,
            auth: Default::default(),
            gone: Default::default(),
        })
        .await;
        // A peer that forges (values altered, CRC recomputed, the cloud's signature kept).
        let peer_auth = Arc::new(Mutex::new(Vec::new()));
        let peer_url = serve(Hostile {
            genuine: g.clone(),
            attack: Arc::new(Mutex::new(Attack::AlteredWithCrc)),
            auth: peer_auth.clone(),
            gone: Default::default(),
        })
        .await;
        let token = |t: &str| ClientSecurity {
            token: Some(t.into()),
            ..Default::default()
        };
        let b = prefixes(
            &m,
            PrefixConfig {
                cloud_url: Some(cloud_url.clone()),
                peers: vec![peer_url.clone()],
                security: token("cloud-secret"),
                peer_security: token("peer-secret"),
                trust: trusting(trust),
                ..Default::default()
            },
        );
        let r = b.for_system(&ids).await.unwrap();
        assert_eq!(r.source, Source::Cloud, "the forged peer copy is refused");
        assert!(same(&r.prefix, &g.support));
        assert_eq!(
            *peer_auth.lock().unwrap(),
            vec!["Bearer peer-secret".to_string()],
            "the peer saw the peer token and nothing else"
        );

        // A real peer edge holding the signed prompt, requiring the peer token.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let real_peer = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(PeerService::server(
                    b.clone(),
                    PeerPolicy {
                        token: Some("peer-secret".into()),
                        signed_only: true,
                        ..Default::default()
                    },
                ))
                .serve_with_incoming(TcpListenerStream::new(l)),
        );
        // A cloud that lists its prompts but streams them unsigned (refused): what the asker
        // gets, it gets from the peer or computes.
        let unsigned = hostile(&g, Arc::new(Mutex::new(Attack::Unsigned))).await;
        let asker = |peer_token: Option<&str>| {
            prefixes(
                &m,
                PrefixConfig {
                    cloud_url: Some(unsigned.clone()),
                    peers: vec![real_peer.clone()],
                    peer_security: ClientSecurity {
                        token: peer_token.map(Into::into),
                        ..Default::default()
                    },
                    trust: trusting(trust),
                    ..Default::default()
                },
            )
        };
        // With the token: the relayed KV verifies against the cloud's key.
        let r = asker(Some("peer-secret")).for_system(&ids).await.unwrap();
        assert_eq!(r.source, Source::Peer);
        assert!(same(&r.prefix, &g.support));
        // Without it, or with the wrong one: refused; the cloud's copy is refused, so
        // computed here.
        for t in [None, Some("wrong")] {
            let r = asker(t).for_system(&ids).await.unwrap();
            assert_eq!(r.source, Source::Local, "token {t:?}");
        }
        // Asked directly without the token: unauthenticated.
        let mut c = CloudClient::connect(&real_peer).await.unwrap();
        let address = edgeprompt_kv::content_address(&m.fingerprint, &ids);
        let got = c
            .fetch(
                &m,
                PromptRef::ContentAddress(hex::decode(address).unwrap()),
                &[Codec::F16],
                false,
            )
            .await;
        let Err(e) = got else {
            panic!("served without the peer token")
        };
        assert!(e.to_string().contains("Unauthenticated"), "{e}");
    });
}

#[test]
fn a_token_never_leaves_in_plaintext_except_to_loopback() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let sec = ClientSecurity {
            token: Some("secret".into()),
            ..Default::default()
        };
        // Refused before any connection is tried.
        for url in ["http://192.0.2.1:50051", "http://cloud.example:50051"] {
            match CloudClient::connect_with(url, &sec).await {
                Err(EdgeError::Config(m)) => assert!(m.contains("unencrypted"), "{m}"),
                Err(e) => panic!("{url}: {e}"),
                Ok(_) => panic!("{url}: connected"),
            }
        }
        for url in ["http://127.0.0.1:9", "http://localhost:9", "http://[::1]:9"] {
            assert!(edgeprompt_edge::client::plaintext_ok(url), "{url}");
        }
    });
}

#[test]
fn hostile_disk_files_are_ignored_and_fetched_again() {
    let g = Arc::new(Genuine::new());
    let m = g.model.clone();
    let (ids, _) = edge_ids(&m, SUPPORT, USER);
    let address = edgeprompt_kv::content_address(&m.fingerprint, &ids);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = hostile(&g, Arc::new(Mutex::new(Attack::Honest))).await;
        let trust = Some(g.key.public());
        let seal = Seal::sign(&g.key, "support", &g.support, Codec::F16, 0, false);
        let mut tampered = g.support.clone();
        let mut l = (*tampered.layers[7]).clone();
        l.truncate(l.len() - 1);
        tampered.layers[7] = Arc::new(l);
        let other_seal = Seal::sign(&g.key, "coding", &g.coding, Codec::F16, 0, false);
        let wrong_seal = Seal::sign(&g.wrong, "support", &g.support, Codec::F16, 0, false);
        // What a hostile disk may hold under this prompt's name.
        type Make<'a> = Box<dyn Fn(&std::path::Path) + 'a>;
        let files: Vec<(&str, Make)> = vec![
            (
                "garbage",
                Box::new(|p| std::fs::write(p, b"EPKV1\ngarbage").unwrap()),
            ),
            (
                "header length 2^62",
                Box::new(|p| {
                    let mut b = b"EPKV1\n".to_vec();
                    b.extend((1u64 << 62).to_le_bytes());
                    std::fs::write(p, b).unwrap()
                }),
            ),
            ("unsigned", Box::new(|p| write(p, &g.support, None))),
            (
                "tampered, stale seal",
                Box::new(|p| write(p, &tampered, Some(&seal))),
            ),
            (
                "another prompt's signed KV",
                Box::new(|p| write(p, &g.coding, Some(&other_seal))),
            ),
            (
                "signed with another key",
                Box::new(|p| write(p, &g.support, Some(&wrong_seal))),
            ),
        ];
        for (what, make) in &files {
            let dir = tempfile::tempdir().unwrap();
            make(&dir.path().join(format!("{address}.kv")));
            let p = prefixes(
                &m,
                PrefixConfig {
                    cloud_url: Some(url.clone()),
                    disk_dir: Some(dir.path().to_path_buf()),
                    trust: trusting(trust),
                    ..Default::default()
                },
            );
            let r = p.for_system(&ids).await.unwrap();
            assert_eq!(r.source, Source::Cloud, "{what}: not taken from disk");
            assert!(same(&r.prefix, &g.support), "{what}");
            // The good copy replaces it, signed, and is taken from disk after a restart.
            assert_eq!(p.flush(std::time::Duration::from_secs(10)).await, 0);
            let again = prefixes(
                &m,
                PrefixConfig {
                    cloud_url: Some("http://127.0.0.1:9".into()),
                    disk_dir: Some(dir.path().to_path_buf()),
                    trust: trusting(trust),
                    ..Default::default()
                },
            );
            let r = again.for_system(&ids).await.unwrap();
            assert_eq!(r.source, Source::Disk, "{what}: the fetched copy was kept");
        }
        // The genuine signed file is taken as it is.
        let dir = tempfile::tempdir().unwrap();
        write(
            &dir.path().join(format!("{address}.kv")),
            &g.support,
            Some(&seal),
        );
        let p = prefixes(
            &m,
            PrefixConfig {
                cloud_url: Some("http://127.0.0.1:9".into()),
                disk_dir: Some(dir.path().to_path_buf()),
                trust: trusting(trust),
                ..Default::default()
            },
        );
        assert_eq!(p.for_system(&ids).await.unwrap().source, Source::Disk);
    });
}

fn write(path: &std::path::Path, p: &PrefixKv, seal: Option<&Seal>) {
    let dir = path.parent().unwrap();
    let key = path.file_stem().unwrap().to_str().unwrap();
    DiskStore::open(dir).unwrap().put(key, p, seal).unwrap();
}

/// The ids of a prompt asked for by id come from its header, which nobody signs: with the
/// cloud's key they are used (to compute the prompt here after a failure) only once a signed
/// layer bound them to the prompt. A forged header cannot choose what "support" means.
#[test]
fn a_forged_header_cannot_choose_the_prompt_an_id_names() {
    let g = Arc::new(Genuine::new());
    let m = g.model.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = hostile(&g, Arc::new(Mutex::new(Attack::ForgedIdHeader))).await;
        let p = edge(&m, &url, Some(g.key.public()));
        assert!(p.for_id("support").await.is_err(), "whole: refused");
        // Held while it streams, as a request holds it.
        let held = p.for_id_streaming("support").await;
        match held.as_ref().map(|l| &l.kv) {
            Err(_) => {}
            Ok(edgeprompt_edge::PromptKv::Ready(k)) => {
                panic!("resolved to {} tokens of the sender's choice", k.n_tokens())
            }
            Ok(edgeprompt_edge::PromptKv::Streaming(s)) => {
                let out = loop {
                    if let Some(o) = s.outcome() {
                        break o;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                };
                let why = out.expect_err("streamed: the lookup fails, nothing is computed");
                assert!(!why.message.contains("no request holds"), "{why}");
            }
        }
        drop(held);
        assert_eq!(p.entries(), 0);
        // Without a key the edge cannot tell, and computes what the header names (the
        // documented limit of running without --cloud-key).
        let open = edge(&m, &url, None);
        assert!(open.for_id_streaming("support").await.is_ok());
    });
}

/// Deadlines short enough for a test: a header within 1 s, a layer within 10 s, the whole
/// fetch within 2 s (a dripping stream takes over 4 s).
fn impatient(m: &Arc<Model>, url: &str, trust: Option<TrustKey>) -> Arc<Prefixes> {
    prefixes(
        m,
        PrefixConfig {
            cloud_url: Some(url.into()),
            trust: trusting(trust),
            deadlines: edgeprompt_edge::prefixes::Deadlines {
                header: std::time::Duration::from_secs(1),
                layer: std::time::Duration::from_secs(10),
                whole: std::time::Duration::from_secs(2),
            },
            ..Default::default()
        },
    )
}

/// Within `secs`, or the test fails (a hang is the bug these tests look for).
async fn within<T>(secs: u64, what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(secs), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: still waiting after {secs} s"))
}

/// Until `f` holds, or the test fails after 120 s.
async fn until(what: &str, f: impl Fn() -> bool) {
    within(120, what, async {
        while !f() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
}

#[test]
fn a_silent_stalled_or_dripping_cloud_is_given_up_and_the_prompt_computed_here() {
    let g = Arc::new(Genuine::new());
    let m = g.model.clone();
    let (ids, _) = edge_ids(&m, SUPPORT, USER);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let attack = Arc::new(Mutex::new(Attack::Silent));
        let h = Hostile {
            genuine: g.clone(),
            attack: attack.clone(),
            auth: Default::default(),
            gone: Default::default(),
        };
        let gone = h.gone.clone();
        let url = serve(h).await;
        let mut let_go = 0;
        for a in [Attack::Silent, Attack::HeaderThenSilence, Attack::Drip] {
            *attack.lock().unwrap() = a;
            let trust = Some(g.key.public());
            // A system message: the fallback, bit for bit.
            let p = impatient(&m, &url, trust);
            let r = within(60, &format!("{a:?}"), p.for_system(&ids))
                .await
                .unwrap();
            assert_eq!(r.source, Source::Local, "{a:?}");
            assert!(same(&r.prefix, &g.support), "{a:?}");
            // Streaming, as a request does: the stream ends, resolved here.
            let p = impatient(&m, &url, trust);
            let l = within(
                60,
                &format!("{a:?} streaming"),
                p.for_system_streaming(&ids),
            )
            .await
            .unwrap();
            if let edgeprompt_edge::PromptKv::Streaming(s) = &l.kv {
                let s = s.clone();
                let out = within(60, "the stream's outcome", async move {
                    tokio::task::spawn_blocking(move || s.wait_outcome())
                        .await
                        .unwrap()
                })
                .await;
                assert!(same(&out.unwrap(), &g.support), "{a:?} streaming");
            }
            // By id: the edge cannot compute it, so a clear error, in time.
            let p = impatient(&m, &url, trust);
            let err = within(60, &format!("{a:?} by id"), p.for_id("support")).await;
            let err = err.err().map(|e| e.to_string()).unwrap_or_default();
            println!("{a:?}: by id: {err}");
            assert!(!err.is_empty(), "{a:?}: by id is an error");
            // Every held stream was let go of: the edge closed it.
            let_go += 3;
            until(&format!("{a:?}: the edge lets go"), || {
                gone.load(std::sync::atomic::Ordering::SeqCst) >= let_go
            })
            .await;
        }
    });
}

/// The support prompt's ids and a private system prompt's, for the prompt cache's budget tests.
fn two_prompts(m: &Model) -> (Vec<u32>, Vec<u32>) {
    let private = "You handle the payroll of Acme GmbH; salaries are confidential. Be brief.";
    (edge_ids(m, SUPPORT, USER).0, edge_ids(m, private, USER).0)
}

#[test]
fn in_flight_kv_counts_against_the_prompt_cache_and_a_dropped_request_stops_its_fetch() {
    let g = Arc::new(Genuine::new());
    let m = g.model.clone();
    let (ids, private_ids) = two_prompts(&m);
    let bytes = |n: usize| n * m.cfg.kv_bytes_per_token();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let h = Hostile {
            genuine: g.clone(),
            attack: Arc::new(Mutex::new(Attack::HeaderThenSilence)),
            auth: Default::default(),
            gone: Default::default(),
        };
        let gone = h.gone.clone();
        let url = serve(h).await;
        // Room for either prompt, not both.
        let p = prefixes(
            &m,
            PrefixConfig {
                cloud_url: Some(url),
                trust: trusting(Some(g.key.public())),
                cache_bytes: bytes(ids.len()) + bytes(private_ids.len()) - 1,
                ..Default::default()
            },
        );
        let held = p.for_system_streaming(&ids).await.unwrap();
        assert!(matches!(held.kv, edgeprompt_edge::PromptKv::Streaming(_)));
        assert_eq!(
            p.in_flight_bytes(),
            bytes(ids.len()),
            "the arriving prompt is counted"
        );
        match p.for_system(&private_ids).await {
            Err(edgeprompt_edge::prefixes::LookupError::Busy(m)) => {
                assert!(m.contains("retry later"), "{m}")
            }
            other => panic!("expected busy, got {:?}", other.map(|r| r.source)),
        }
        // The request that held the fetch goes away: the download stops and its bytes are
        // given back.
        drop(held);
        until("the stalled fetch is closed", || {
            gone.load(std::sync::atomic::Ordering::SeqCst) == 1
        })
        .await;
        until("its bytes are given back", || p.in_flight_bytes() == 0).await;
        assert_eq!(p.entries(), 0, "nothing is left of it");
        let r = p.for_system(&private_ids).await.unwrap();
        assert_eq!(r.source, Source::Local);
    });
}

#[test]
fn the_prompt_cache_exceeds_its_budget_only_by_what_requests_hold() {
    let g = Arc::new(Genuine::new());
    let m = g.model.clone();
    let (ids, private_ids) = two_prompts(&m);
    let bytes = |n: usize| n * m.cfg.kv_bytes_per_token();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Room for the larger prompt, not both; computed here (no cloud).
        let p = prefixes(
            &m,
            PrefixConfig {
                cache_bytes: bytes(ids.len().max(private_ids.len())),
                ..Default::default()
            },
        );
        let a = p.for_system(&ids).await.unwrap();
        let b = p.for_system(&private_ids).await.unwrap();
        assert_eq!((a.source, b.source), (Source::Local, Source::Local));
        let both = a.prefix.bytes() + b.prefix.bytes();
        // Both held: both kept, over the budget by what is held.
        assert_eq!(p.memory_bytes(), (both, both));
        // One let go: it is evicted when the cache is next measured, not at the next lookup.
        drop(a);
        assert_eq!(p.memory_bytes(), (b.prefix.bytes(), b.prefix.bytes()));
        assert_eq!(p.entries(), 1);
        // The last one let go fits the budget: kept, idle.
        let kept = b.prefix.bytes();
        drop(b);
        assert_eq!(p.memory_bytes(), (kept, 0));
    });
}

#[test]
fn a_fifo_or_a_symlink_in_the_cache_dir_is_not_read() {
    let g = Arc::new(Genuine::new());
    let m = g.model.clone();
    let (ids, _) = edge_ids(&m, SUPPORT, USER);
    let address = edgeprompt_kv::content_address(&m.fingerprint, &ids);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = hostile(&g, Arc::new(Mutex::new(Attack::Honest))).await;
        let seal = Seal::sign(&g.key, "support", &g.support, Codec::F16, 0, false);
        let elsewhere = tempfile::tempdir().unwrap();
        let target = elsewhere.path().join(format!("{address}.kv"));
        write(&target, &g.support, Some(&seal));
        for what in ["fifo", "symlink"] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(format!("{address}.kv"));
            match what {
                "fifo" => {
                    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
                    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
                }
                _ => std::os::unix::fs::symlink(&target, &path).unwrap(),
            }
            let p = prefixes(
                &m,
                PrefixConfig {
                    cloud_url: Some(url.clone()),
                    disk_dir: Some(dir.path().to_path_buf()),
                    trust: trusting(Some(g.key.public())),
                    ..Default::default()
                },
            );
            let r = within(60, what, p.for_system(&ids)).await.unwrap();
            assert_eq!(r.source, Source::Cloud, "{what}: not read, fetched");
            assert!(same(&r.prefix, &g.support), "{what}");
        }
    });
}

#[test]
fn unsigned_kv_from_a_peer_is_neither_kept_on_disk_nor_relayed() {
    let g = Arc::new(Genuine::new());
    let m = g.model.clone();
    let (ids, _) = edge_ids(&m, SUPPORT, USER);
    let address = edgeprompt_kv::content_address(&m.fingerprint, &ids);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cloud = hostile(&g, Arc::new(Mutex::new(Attack::Honest))).await;
        // A fake peer: the values altered, the CRC recomputed, the signature kept.
        let fake = hostile(&g, Arc::new(Mutex::new(Attack::AlteredWithCrc))).await;
        let dir = tempfile::tempdir().unwrap();
        // An edge that was told to take unsigned KV: it cannot tell the forgery...
        let b = prefixes(
            &m,
            PrefixConfig {
                cloud_url: Some(cloud),
                peers: vec![fake],
                disk_dir: Some(dir.path().to_path_buf()),
                trust: CloudTrust::AllowUnsigned,
                ..Default::default()
            },
        );
        let r = b.for_system(&ids).await.unwrap();
        assert_eq!(
            r.source,
            Source::Peer,
            "the documented limit of --allow-unsigned-kv"
        );
        // ...but keeps it only in memory, and serves it to no one.
        assert_eq!(b.flush(std::time::Duration::from_secs(10)).await, 0);
        let files = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(files, 0, "peer KV it could not check was written to disk");
        assert!(b.cached(&address).await.is_none(), "it would be relayed");
    });
}

/// Refused KV of a prompt named by id (the edge cannot compute what the id means) is one clear
/// 502, whole or streamed, never a 500.
#[test]
fn refused_kv_named_by_id_is_one_clear_502() {
    use edgeprompt_edge::http::{access::ApiKeys, serve, EdgeServer, ServerConfig};
    let g = Arc::new(Genuine::new());
    let m = g.model.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let attack = Arc::new(Mutex::new(Attack::Unsigned));
    let addr = rt.block_on(async {
        let url = hostile(&g, attack.clone()).await;
        let state = EdgeServer::start(
            m.clone(),
            ServerConfig {
                model_id: "smollm2".into(),
                default_max_tokens: 2,
                api_keys: ApiKeys::default(),
            },
            Default::default(),
            PrefixConfig {
                cloud_url: Some(url),
                trust: trusting(Some(g.key.public())),
                ..Default::default()
            },
        )
        .unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(serve(l, state));
        addr
    });
    for a in [Attack::Unsigned, Attack::ForgedIdHeader, Attack::WrongKey] {
        *attack.lock().unwrap() = a;
        for stream in [false, true] {
            let body = serde_json::json!({
                "model": "smollm2", "cloud_prompt": "support", "prompt": "Hi", "max_tokens": 2,
                "stream": stream
            });
            let (status, text) = common::http(addr, "POST", "/v1/completions", &body.to_string());
            // Streamed, the error may come after the stream has begun: as its event.
            let code = match (stream, status) {
                (true, 200) => text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
                    .find_map(|v| {
                        v["error"]["code"]
                            .as_u64()
                            .or(v["error"]["status"].as_u64())
                    })
                    .unwrap_or(0),
                _ => status as u64,
            };
            println!(
                "{a:?} stream={stream}: {status} {}",
                text.lines().last().unwrap_or("")
            );
            assert_eq!(code, 502, "{a:?} stream={stream}: {text}");
            assert!(text.contains("could not get the cloud prompt"), "{text}");
        }
    }
}

/// A list forged on the path cannot make the edge name a private system message: the list
/// must carry the pinned key's signature, or nothing on it counts.
#[test]
fn a_list_forged_on_the_path_names_no_private_prompt() {
    let g = Arc::new(Genuine::new());
    let m = g.model.clone();
    let (private_ids, _) = edge_ids(&m, PRIVATE, USER);
    let (support_ids, _) = edge_ids(&m, SUPPORT, USER);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let h = Hostile {
            genuine: g.clone(),
            attack: Arc::new(Mutex::new(Attack::ForgedList)),
            auth: Default::default(),
            gone: Default::default(),
        };
        let fetches = h.auth.clone();
        let url = serve(h).await;
        for trust in [
            CloudTrust::Key(g.key.public()),
            // First contact: the path's list shows the real key, which is pinned, and the
            // list's signature (by another key) fails against it.
            CloudTrust::FirstUse(None),
        ] {
            let p = prefixes(
                &m,
                PrefixConfig {
                    cloud_url: Some(url.clone()),
                    trust: trust.clone(),
                    ..Default::default()
                },
            );
            let r = p.for_system(&private_ids).await.unwrap();
            assert_eq!(r.source, Source::Local, "{trust:?}");
            assert!(
                p.published().await.is_err(),
                "{trust:?}: the forged list is refused"
            );
            // With no list it can trust, the edge asks for nothing at all.
            assert_eq!(
                p.for_system(&support_ids).await.unwrap().source,
                Source::Local
            );
            assert!(
                fetches.lock().unwrap().is_empty(),
                "{trust:?}: a fetch was made"
            );
        }
    });
}

/// Hybrid models' states (Qwen3.5's Gated DeltaNet layers, LFM2's short convolutions) under
/// every attack on them: refused, and the system message computed here, bit for bit the
/// single-node prefix; the honest signed stream is taken with its states.
#[test]
fn every_hostile_state_ends_in_an_error_or_the_exact_fallback() {
    for name in ["qwen35", "lfm2"] {
        hostile_states(name, &STATE_ATTACKS);
    }
}

/// Gemma 4's layer map (which layers own KV, each layer's head size) under every attack on it:
/// refused, and the system message computed here, bit for bit the single-node prefix.
#[test]
fn every_hostile_layer_map_ends_in_an_error_or_the_exact_fallback() {
    hostile_states("gemma4", &LAYER_MAP_ATTACKS);
}

fn hostile_states(name: &str, attacks: &[Attack]) {
    let path = common::models_dir().join(format!("synth/{name}.gguf"));
    assert!(
        path.exists(),
        "{}: run scripts/ref/synth.py",
        path.display()
    );
    let g = Arc::new(Genuine::of(Arc::new(Model::load(path).unwrap())));
    let m = g.model.clone();
    let (ids, _) = edge_ids(&m, SUPPORT, USER);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let attack = Arc::new(Mutex::new(Attack::Honest));
        let url = hostile(&g, attack.clone()).await;
        let trust = Some(g.key.public());
        let r = edge(&m, &url, trust).for_system(&ids).await.unwrap();
        assert_eq!(r.source, Source::Cloud, "the honest signed stream is taken");
        assert!(same(&r.prefix, &g.support));
        assert!(r
            .prefix
            .layers
            .iter()
            .any(|l| l.state.is_some() || l.kv_of.is_some()));
        let mut rows = Vec::new();
        for &a in attacks {
            *attack.lock().unwrap() = a;
            let r = edge(&m, &url, trust).for_system(&ids).await.unwrap();
            assert_eq!(
                r.source,
                Source::Local,
                "{name} {a:?}: the attack is not used"
            );
            assert!(
                same(&r.prefix, &g.support),
                "{name} {a:?}: the fallback is exact"
            );
            let err = fetch_error(&m, &url, trust).await;
            rows.push(format!("{a:?}: {err}"));
        }
        println!("{name}: attack outcomes (direct fetch errors):");
        for r in &rows {
            println!("  {r}");
        }
    });
}
