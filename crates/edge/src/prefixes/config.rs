//! How an edge looks up cloud prompts: where the cloud is, how long a fetch may take, the
//! tiers' sizes and what a system message nobody publishes becomes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use edgeprompt_kv::Codec;

use crate::trust::CloudTrust;
use crate::ClientSecurity;

/// How long a fetch may take before it counts as failed (the caller then falls back): the
/// header, each layer, and the whole fetch. Each is a floor: the edge lengthens the header's
/// and the whole fetch's by what it measured of its link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Deadlines {
    pub header: Duration,
    pub layer: Duration,
    pub whole: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            header: crate::client::HEADER_TIMEOUT,
            layer: Duration::from_secs(30),
            whole: Duration::from_secs(120),
        }
    }
}

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
    /// More endpoints of the same cloud service (its replicas, signing with its key): each
    /// prompt is asked of the endpoints in an order of its own (rendezvous hashing on its
    /// address), so replicas share the prompts; one that fails is followed by the next.
    pub cloud_replicas: Vec<String>,
    /// The object store the cloud replicas keep published prompts in (or a CDN in front of
    /// it), read before the cloud: only published prompts, by address, each checked as from
    /// the disk tier.
    pub kv_store: Option<Arc<edgeprompt_kv::BucketStore>>,
    /// Without `kv_store`, read published prompts from the store the cloud's signed list
    /// names (over HTTP(S), given no credentials).
    pub listed_store: bool,
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
    /// The key KV from the cloud, a peer or the disk must be signed by: given, pinned on
    /// first contact (the default), or none by explicit choice.
    pub trust: CloudTrust,
    /// When a fetch is given up (and the prompt computed here).
    pub deadlines: Deadlines,
    /// The cloud's published prompts this edge takes at all (none: every one it publishes).
    pub cloud_prompts: Option<Vec<String>>,
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
    /// CE-LSLM fuser: take every layer of a cloud prompt fused with the cloud's larger model
    /// where the cloud has a fuser for this model (overrides both splits: a layer computed
    /// here would not be fused). Never from peers or the object store, never offered to peers.
    pub fused: bool,
    /// A completion whose prompt begins with a cloud prompt held here runs on its KV (the
    /// echoed prompt's shared tokens are then not scored).
    pub match_prompts: bool,
    /// Bytes of published prompts fetched as soon as the cloud lists them and kept while
    /// listed, once `start_prefetch` runs (`EdgeServer::start` does); a system message
    /// matching a published prompt is then never fetched on use. 0: published prompts are
    /// fetched when first used.
    pub prefetch_bytes: usize,
}

impl Default for PrefixConfig {
    fn default() -> Self {
        Self {
            cloud_url: None,
            cloud_replicas: Vec::new(),
            kv_store: None,
            listed_store: true,
            codec: Codec::F16,
            unknown_system: UnknownSystem::ComputeLocally,
            cache_bytes: 1 << 30,
            disk_dir: None,
            peers: Vec::new(),
            security: ClientSecurity::default(),
            peer_security: ClientSecurity::default(),
            trust: CloudTrust::default(),
            deadlines: Deadlines::default(),
            cloud_prompts: None,
            disk_max_bytes: u64::MAX,
            max_local_prefills: 4,
            cloud_layers_from: 0,
            auto_codec: None,
            auto_split: None,
            fused: false,
            match_prompts: true,
            prefetch_bytes: 0,
        }
    }
}
