//! `edgeprompt serve`: the edge node as an OpenAI-compatible HTTP server.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use edgeprompt_edge::codec_choice::AutoCodec;
use edgeprompt_edge::http::access::ApiKeys;
use edgeprompt_edge::http::conn::ConnLimits;
use edgeprompt_edge::http::{serve_with, EdgeServer, ServerConfig};
use edgeprompt_edge::peer::PeerService;
use edgeprompt_edge::prefixes::{PrefixConfig, UnknownSystem};
use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_edge::split_choice::AutoSplit;
use edgeprompt_kv::Codec;

#[derive(clap::Args)]
pub struct ServeArgs {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// A Jinja chat template for a model whose GGUF has none (without one, such a model
    /// serves completions only and chat is a 400).
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Cloud node URL (e.g. http://127.0.0.1:50051), or the replicas of one cloud service
    /// separated by commas (each prompt has its own order over them; a replica that fails is
    /// followed by the next). Without it, system prompts are computed here.
    #[arg(long, value_delimiter = ',')]
    cloud: Vec<String>,
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// KV codec asked of the cloud: f16, int8, int4, int8ch or int4ch; or auto: per fetch, from
    /// the link this edge measures, among the codecs whose measured next-token agreement on this
    /// model (in --codec-table) reaches --min-agreement.
    #[arg(long, default_value = "f16")]
    codec: String,
    /// The codec quality table `edgeprompt-bench codecs` writes (for --codec auto).
    #[arg(long, default_value = "docs/results/codecs.json")]
    codec_table: PathBuf,
    /// Least teacher-forced next-token agreement a codec needs for --codec auto.
    #[arg(long, default_value_t = 0.99)]
    min_agreement: f64,
    /// Refuse system messages that are not registered cloud prompts (default: compute them here).
    #[arg(long)]
    refuse_unknown_system: bool,
    /// Most sequences decoding together.
    #[arg(long, default_value_t = 32)]
    max_batch: usize,
    /// Prompt tokens prefilled per step (chunked prefill).
    #[arg(long, default_value_t = 256)]
    prefill_chunk: usize,
    /// Megabytes of private KV admitted requests may reserve; beyond it requests get 429.
    #[arg(long, default_value_t = 1024)]
    kv_budget_mb: usize,
    /// Megabytes of finished conversations' KV kept in memory for their next turns (per API
    /// key and `cache_salt`; never on disk or any link), least recently used dropped first.
    #[arg(long, default_value_t = 256)]
    private_cache_mb: usize,
    /// Keep no conversation's KV: every turn recomputes its private messages.
    #[arg(long)]
    no_private_cache: bool,
    /// Admitted requests that may wait for a batch slot; beyond it requests get 429.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// On SIGTERM or Ctrl-C: seconds running requests get to finish (new ones get 503)
    /// before they are ended and the process exits.
    #[arg(long, default_value_t = 30)]
    drain_secs: u64,
    /// Take the cloud prompt's layers from this one on from the cloud and compute the layers
    /// below it here. auto: per cloud prompt, the split the planner predicts fastest on the
    /// measured link and this machine's measured compute. A cloud running this same model
    /// streams its exact KV from any layer, so every split gives the same answer. A cloud
    /// mapping a larger model's KV to this one (CE-LSLM, `edgeprompt align`) is never asked
    /// below the quality floor (--lslm-table, --split-min-agreement). A number fixes the
    /// split; 0 takes every layer from the cloud.
    #[arg(long, default_value = "auto")]
    cloud_layers_from: String,
    /// CE-LSLM fuser: take each cloud prompt's KV fused with the cloud's larger model, where
    /// the cloud has a fuser for this model (`edgeprompt cloud --fuser`): every layer from the
    /// cloud, answers closer to the larger model's. Replaces --cloud-layers-from (a layer
    /// computed here would not be fused); a cloud without a fuser streams exact KV or none.
    #[arg(long)]
    fused: bool,
    /// The CE-LSLM quality table `edgeprompt-bench lslm` writes (for --cloud-layers-from auto).
    #[arg(long, default_value = "docs/results/lslm.json")]
    lslm_table: PathBuf,
    /// Least next-token agreement with this model alone a split needs (--cloud-layers-from auto).
    #[arg(long, default_value_t = 0.9)]
    split_min_agreement: f64,
    /// The private prompt length --cloud-layers-from auto plans for (a longer one hides more of
    /// the stream and moves the split down). Requests' own lengths are never used: the first
    /// layer asked of the cloud would tell it them.
    #[arg(long, default_value_t = edgeprompt_edge::split_choice::DEFAULT_PRIVATE_TOKENS)]
    split_private_tokens: usize,
    /// Megabytes of cloud-prompt KV cached in memory.
    #[arg(long, default_value_t = 1024)]
    prefix_cache_mb: usize,
    /// Megabytes of the cloud's published prompts fetched as soon as it lists them (in the
    /// list's order, kept in memory while listed), so no fetch depends on which system
    /// messages this edge sees; a published prompt past it is computed here when used.
    /// Default: half of --prefix-cache-mb. 0: published prompts are fetched when first used
    /// (a cloud that publishes a guessed private message's address then learns whether it is
    /// used here).
    #[arg(long)]
    prefetch_mb: Option<usize>,
    /// Directory of the disk tier of cloud-prompt KV (survives restarts).
    #[arg(long)]
    cache_dir: Option<std::path::PathBuf>,
    /// Megabytes the disk tier may hold; past it the least recently used prompts are removed.
    #[arg(long, default_value_t = 16384)]
    cache_max_mb: u64,
    /// System prompts the cloud does not know computed here at once (more get 429); their KV
    /// at once is bounded by --prefix-cache-mb too.
    #[arg(long, default_value_t = 2)]
    max_local_prefills: usize,
    /// gRPC URL of a peer edge asked before the cloud (repeatable).
    #[arg(long = "peer")]
    peers: Vec<String>,
    /// The object store the cloud replicas keep published prompts in, read before the cloud:
    /// `https://cdn.example/edgeprompt` (over HTTP, e.g. a CDN), or `s3://bucket/prefix` with
    /// the `AWS_*` variables (a read-only key). Without it, the store the cloud's signed list
    /// names is read (over HTTP(S), with no credentials).
    #[arg(long)]
    kv_store: Option<String>,
    /// Do not read the store the cloud's list names: published prompts come from the cloud
    /// (or --kv-store).
    #[arg(long)]
    no_listed_store: bool,
    /// Serve this edge's cached cloud prompts to peers over gRPC on this address.
    #[arg(long)]
    peer_listen: Option<String>,
    #[arg(long, default_value_t = 300)]
    request_timeout_secs: u64,
    /// Seconds a fetch of a cloud prompt may take before this edge gives up on it and computes
    /// the prompt itself (a floor: a slow measured link gets more). A cloud or peer that sends
    /// no header within 10 s, or no next layer within 30 s, is given up on sooner.
    #[arg(long, default_value_t = 120)]
    fetch_timeout_secs: u64,
    /// Do not run a completion whose prompt begins with a cloud prompt held here on that
    /// prompt's KV (by default it does; the echoed prompt's shared tokens are then not scored).
    #[arg(long)]
    no_prompt_matching: bool,
    #[command(flatten)]
    security: crate::security::ClientArgs,
    #[command(flatten)]
    peer: crate::security::PeerArgs,
    #[arg(long, default_value_t = 256)]
    default_max_tokens: usize,
    /// Seconds a client has to send a request's headers (and to start the next request on a
    /// kept-alive connection); its body has 30 s more.
    #[arg(long, default_value_t = 10)]
    header_timeout_secs: u64,
    /// Seconds a response may wait on a client that reads nothing before its connection ends.
    #[arg(long, default_value_t = 30)]
    write_stall_secs: u64,
    /// Connections one client address may hold at once (more are closed on arrival; behind a
    /// reverse proxy, every client is the proxy's address: raise it).
    #[arg(long, default_value_t = 64)]
    max_connections_per_peer: usize,
    /// Connections the server holds at once.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// A key clients must send as `Authorization: Bearer <key>` on /v1/* (repeatable; with
    /// none, no --api-key-file and no EDGEPROMPT_API_KEYS the API is open). /health stays
    /// open; /metrics then needs the admin key. Visible to every local user in the process list: prefer
    /// --api-key-file or EDGEPROMPT_API_KEYS (keys separated by commas or newlines).
    #[arg(long = "api-key")]
    api_keys: Vec<String>,
    /// A file of API keys, one per line (`#` comments and blank lines skipped).
    #[arg(long)]
    api_key_file: Option<std::path::PathBuf>,
    /// A file holding the operator's admin key (or EDGEPROMPT_ADMIN_KEY): with API keys set,
    /// /metrics answers only to `Authorization: Bearer <admin key>` (it counts every
    /// tenant's traffic); without one it answers no one. An open API leaves /metrics open.
    #[arg(long)]
    admin_key_file: Option<std::path::PathBuf>,
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let model = Arc::new(super::models::load_with(
        &a.model,
        a.chat_template.as_deref(),
    )?);
    let n_layer = model.cfg.n_layer;
    let (cloud_layers_from, auto_split) = match a.cloud_layers_from.as_str() {
        // Without a cloud every layer is computed here; fused KV is taken whole.
        "auto" if a.cloud.is_empty() || a.fused => (0, None),
        _ if a.fused => {
            anyhow::bail!("--fused takes every layer from the cloud: leave out --cloud-layers-from")
        }
        "auto" => {
            // A table for another model (or none) leaves no CE-LSLM floor: the cloud is
            // expected to run this model, and its headers are checked for it.
            let floor = AutoSplit::floor_from_table(
                &a.lslm_table,
                &model.cfg.name,
                n_layer,
                a.split_min_agreement,
            );
            let per = AutoSplit::measure(&model)?;
            match &floor {
                Ok(f) => eprintln!(
                    "cloud layers from auto: a cloud mapping a larger model's KV is asked from layer {f} on (agreement >= {} in {}); one running this model, from any layer",
                    a.split_min_agreement,
                    a.lslm_table.display(),
                ),
                Err(e) => eprintln!(
                    "cloud layers from auto: the cloud is expected to run this model (its KV is exact from any layer; a mapped stream is refused); no CE-LSLM floor applies ({e})"
                ),
            }
            eprintln!(
                "cloud layers from auto: prefill here {:.1} us per token per layer",
                per * 1e6
            );
            let floor = floor.unwrap_or(0);
            let auto =
                AutoSplit::new(&model, floor, per).with_private_tokens(a.split_private_tokens);
            (0, Some(Arc::new(auto)))
        }
        n => {
            let n: usize = n.parse().with_context(|| {
                format!("--cloud-layers-from is a layer number or auto, not {n:?}")
            })?;
            anyhow::ensure!(
                n < n_layer,
                "--cloud-layers-from {n} is past the model's {n_layer} layers"
            );
            (n, None)
        }
    };
    let (codec, auto_codec) = match a.codec.as_str() {
        "auto" => {
            let auto = AutoCodec::from_table(&a.codec_table, &model.cfg.name, a.min_agreement)?;
            let names = |qs: &[edgeprompt_edge::codec_choice::Quality]| {
                qs.iter()
                    .map(|q| format!("{} ({:.3})", q.codec.name(), q.agreement))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            eprintln!(
                "codec auto: f16 or {} by the measured link; refused below agreement {}: {}",
                names(auto.allowed()),
                a.min_agreement,
                names(auto.refused())
            );
            (Codec::F16, Some(Arc::new(auto)))
        }
        name => (
            Codec::parse(name)
                .with_context(|| format!("codec is auto or one of {}", Codec::names()))?,
            None,
        ),
    };
    // Everything that would send a secret in the clear, or serve peers to anyone, is refused
    // here, before the edge says it serves.
    let security = a.security.load()?;
    for url in &a.cloud {
        crate::security::check_credentials("--cloud", url, &security)?;
    }
    let peer_security = a.peer.client()?;
    for p in &a.peers {
        crate::security::check_credentials("--peer", p, &peer_security)?;
    }
    let trust = match a.cloud.is_empty() {
        false => a.security.trust()?,
        true => Default::default(),
    };
    let peer_policy = a
        .peer
        .policy(a.peer_listen.as_deref().unwrap_or("127.0.0.1:0"))?;
    let peer_tls = a.peer.identity()?;
    // The server's background work (the prefetch of published prompts among it) starts with
    // it, so the runtime comes first.
    let rt = tokio::runtime::Runtime::new()?;
    let entered = rt.enter();
    let state = EdgeServer::start(
        model.clone(),
        ServerConfig {
            model_id: a.model.clone(),
            default_max_tokens: a.default_max_tokens,
            api_keys: ApiKeys::new(api_keys(&a.api_keys)?, a.api_key_file.as_deref())
                .with_context(|| {
                    a.api_key_file.as_ref().map_or("--api-key".into(), |f| {
                        format!("API keys from {}", f.display())
                    })
                })?
                .with_admin(&admin_keys(a.admin_key_file.as_deref())?)?,
        },
        SchedulerConfig {
            max_batch: a.max_batch.max(1),
            prefill_chunk: a.prefill_chunk.max(1),
            kv_budget_bytes: a.kv_budget_mb << 20,
            private_cache_bytes: if a.no_private_cache {
                0
            } else {
                a.private_cache_mb << 20
            },
            max_queue: a.max_queue,
            request_timeout: Duration::from_secs(a.request_timeout_secs),
        },
        PrefixConfig {
            cloud_url: a.cloud.first().cloned(),
            cloud_replicas: a.cloud.iter().skip(1).cloned().collect(),
            codec,
            unknown_system: if a.refuse_unknown_system {
                UnknownSystem::Refuse
            } else {
                UnknownSystem::ComputeLocally
            },
            cache_bytes: a.prefix_cache_mb << 20,
            disk_dir: a.cache_dir.clone(),
            peers: a.peers.clone(),
            kv_store: match &a.kv_store {
                Some(url) => Some(Arc::new(edgeprompt_kv::BucketStore::open(url)?)),
                None => None,
            },
            listed_store: !a.no_listed_store,
            security,
            cloud_layers_from,
            auto_codec,
            auto_split,
            fused: a.fused,
            peer_security,
            trust,
            cloud_prompts: a.security.cloud_prompts(),
            deadlines: edgeprompt_edge::prefixes::Deadlines {
                whole: Duration::from_secs(a.fetch_timeout_secs.max(1)),
                ..Default::default()
            },
            disk_max_bytes: a.cache_max_mb << 20,
            max_local_prefills: a.max_local_prefills,
            match_prompts: !a.no_prompt_matching,
            prefetch_bytes: a.prefetch_mb.unwrap_or(a.prefix_cache_mb / 2) << 20,
        },
    )?;
    drop(entered);
    let served = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&a.listen)
            .await
            .with_context(|| format!("binding {}", a.listen))?;
        // Both ports bound before the edge says it serves: one that cannot serve its peers
        // fails at start, not after callers were told it is up.
        let peer_listener = match &a.peer_listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding {addr}"))?,
            ),
            None => None,
        };
        eprintln!(
            "edge serving {} ({}) on http://{}/v1, cloud {}",
            a.model,
            model.cfg.name,
            listener.local_addr()?,
            match a.cloud.is_empty() {
                true => "none (system prompts computed here)".to_string(),
                false => a.cloud.join(", "),
            }
        );
        if let Some(l) = peer_listener {
            eprintln!(
                "serving cached cloud prompts to peers on {}",
                l.local_addr()?
            );
            let mut builder = tonic::transport::Server::builder();
            if let Some(id) = peer_tls {
                builder =
                    builder.tls_config(tonic::transport::ServerTlsConfig::new().identity(id))?;
            }
            tokio::spawn(
                builder
                    .add_service(PeerService::server(state.prefixes.clone(), peer_policy))
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)),
            );
        }
        // The cloud's list asked now, so the first request finds it.
        let prefixes = state.prefixes.clone();
        tokio::spawn(async move { prefixes.published().await });
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let limits = ConnLimits {
            headers: Duration::from_secs(a.header_timeout_secs.max(1)),
            write_stall: Duration::from_secs(a.write_stall_secs.max(1)),
            per_peer: a.max_connections_per_peer.max(1),
            total: a.max_connections.max(1),
            ..ConnLimits::default()
        };
        let mut server = tokio::spawn(serve_with(listener, state.clone(), limits, async {
            let _ = stop_rx.await;
        }));
        tokio::select! {
            r = &mut server => return r.context("http server")?.context("http server"),
            why = state.scheduler.wait_dead() => {
                // Its requests are ended already; exit non-zero so a supervisor restarts us.
                let _ = stop_tx.send(());
                let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
                anyhow::bail!("{why}");
            }
            s = shutdown_signal() => eprintln!(
                "{s}: draining for up to {} s ({} answers pending; new requests get 503)",
                a.drain_secs,
                state.scheduler.pending()
            ),
        }
        let d = state.drain(Duration::from_secs(a.drain_secs)).await;
        eprintln!(
            "drained in {:.1} s: {} answers ended unfinished, {} disk writes unfinished; exiting",
            d.took.as_secs_f64(),
            d.cut,
            d.unflushed
        );
        // Let the last responses reach their clients, but do not wait on idle connections.
        let _ = stop_tx.send(());
        match tokio::time::timeout(Duration::from_secs(5), server).await {
            Ok(r) => r.context("http server")?.context("http server"),
            Err(_) => Ok(()),
        }
    });
    // Bounded: a blocking task stuck on a dead disk must not hold the exit.
    rt.shutdown_timeout(Duration::from_secs(5));
    served
}

/// Where API keys may come from without showing in the process list.
const API_KEYS_ENV: &str = "EDGEPROMPT_API_KEYS";

/// The keys of `--api-key` (with a warning) and of `EDGEPROMPT_API_KEYS`.
fn api_keys(flags: &[String]) -> anyhow::Result<Vec<String>> {
    if !flags.is_empty() {
        eprintln!("warning: --api-key is visible to every local user in the process list; use --api-key-file or {API_KEYS_ENV}");
    }
    let mut keys = flags.to_vec();
    if let Some(v) = std::env::var_os(API_KEYS_ENV) {
        let v = v
            .into_string()
            .map_err(|_| anyhow::anyhow!("{API_KEYS_ENV} is not UTF-8"))?;
        keys.extend(ApiKeys::list_from_env(API_KEYS_ENV, &v)?);
    }
    Ok(keys)
}

/// Where the admin key may come from without showing in the process list.
const ADMIN_KEY_ENV: &str = "EDGEPROMPT_ADMIN_KEY";

/// The admin key of `--admin-key-file` (its first line that is not blank or a comment) and of
/// `EDGEPROMPT_ADMIN_KEY`.
fn admin_keys(file: Option<&std::path::Path>) -> anyhow::Result<Vec<String>> {
    let mut keys = Vec::new();
    if let Some(f) = file {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("the admin key file {}", f.display()))?;
        let key = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .ok_or_else(|| anyhow::anyhow!("{} holds no admin key", f.display()))?;
        keys.push(key.to_string());
    }
    if let Some(v) = std::env::var_os(ADMIN_KEY_ENV) {
        let v = v
            .into_string()
            .map_err(|_| anyhow::anyhow!("{ADMIN_KEY_ENV} is not UTF-8"))?;
        keys.extend(ApiKeys::list_from_env(ADMIN_KEY_ENV, &v)?);
    }
    Ok(keys)
}

/// SIGTERM (what service managers send) or Ctrl-C.
async fn shutdown_signal() -> &'static str {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = term => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "interrupt",
    }
}
