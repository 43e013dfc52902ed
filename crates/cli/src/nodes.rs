//! `edgeprompt cloud`, `edgeprompt link`, `edgeprompt edge` and `edgeprompt demo`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use edgeprompt_cloud::{CloudNode, CloudService, Limits, PromptSpec, PromptsFile};

use crate::security::{self, ServerSection};
use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::prefixes::{PrefixConfig, Prefixes, Source};
use edgeprompt_edge::{prefill_following, CloudTrust, Timeline};
use edgeprompt_engine::sample::Sampler;
use edgeprompt_engine::{Message, Model, SamplingParams, Sequence};
use edgeprompt_kv::Codec;
use edgeprompt_link::{Link, Profile};
use tokio_stream::wrappers::TcpListenerStream;

#[derive(clap::Args)]
pub struct CloudArgs {
    #[arg(long, default_value = "qwen05")]
    model: String,
    /// A Jinja chat template for a model whose GGUF has none (or to replace its own).
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// TOML file with [[prompt]] id = "...", system = "..."
    #[arg(long)]
    prompts: PathBuf,
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: String,
    /// Bytes of prompt KV the cloud keeps in memory (LRU).
    #[arg(long, default_value_t = 1 << 30)]
    cache_bytes: usize,
    /// CE-LSLM adapter files from `edgeprompt align` (repeatable): edges running those
    /// smaller models get their deep layers' KV mapped from this model's.
    #[arg(long)]
    adapters: Vec<PathBuf>,
    /// CE-LSLM fuser from `scripts/fuser/train.py`: edges running --fuser-edge-model that ask
    /// for fused KV get that model's own KV of each prompt fused with this model's.
    #[arg(long, requires = "fuser_edge_model")]
    fuser: Option<PathBuf>,
    /// The small model the fuser serves (name or GGUF path): the cloud computes its KV too.
    #[arg(long, requires = "fuser")]
    fuser_edge_model: Option<String>,
    /// Where the cloud keeps its signing key when the prompts file's [server] table names
    /// none: cloud.key (made on first start, mode 0600) and cloud.pub (default: the prompts
    /// file's directory).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct LinkArgs {
    #[arg(long)]
    listen: String,
    #[arg(long)]
    upstream: String,
    /// Named profile: 6g, 5g, wifi, 4g, constrained, loopback.
    #[arg(long)]
    profile: Option<String>,
    /// e.g. 100mbit (overrides the profile's).
    #[arg(long)]
    bandwidth: Option<String>,
    /// e.g. 20ms (overrides the profile's).
    #[arg(long)]
    rtt: Option<String>,
    /// Probability in [0, 1) that a chunk needs a retransmission (arrives one RTO late).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
}

#[derive(clap::Args)]
pub struct EdgeArgs {
    #[arg(long, default_value = "qwen05")]
    model: String,
    /// Cloud URL, e.g. http://127.0.0.1:50051
    #[arg(long)]
    cloud: String,
    /// The cloud prompt's id, checked against the cloud's list: the system message must be
    /// its text (without it, the system message is looked up on the list by its content).
    #[arg(long)]
    prompt_id: Option<String>,
    /// The system message. A cloud prompt's text is fetched from the cloud; any other is
    /// private and computed here, named on no link.
    #[arg(long)]
    system: String,
    /// The private message: it stays on this machine.
    #[arg(long)]
    prompt: String,
    /// KV codec asked of the cloud: f16 (exact), int8ch / int4ch (keys per channel, values per
    /// token), int8 / int4 (per row).
    #[arg(long, default_value = "f16")]
    codec: String,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Wait for all cloud layers before computing (for comparison).
    #[arg(long)]
    no_pipeline: bool,
    /// CE-LSLM: compute the cloud prompt's layers below this one here and load the rest from
    /// a cloud running a larger model with adapters for this one (0 = all from the cloud).
    #[arg(long, default_value_t = 0)]
    cloud_layers_from: usize,
    #[command(flatten)]
    security: security::ClientArgs,
}

/// `edgeprompt kv-export`: a cloud prompt's KV as this edge fetches and checks it, to a file.
#[derive(clap::Args)]
pub struct ExportArgs {
    #[arg(long, default_value = "qwen05")]
    model: String,
    /// Cloud URL, e.g. http://127.0.0.1:50051
    #[arg(long)]
    cloud: String,
    /// The published cloud prompt to fetch.
    #[arg(long)]
    prompt_id: String,
    /// KV codec asked of the cloud; the file holds the values it decodes to.
    #[arg(long, default_value = "f16")]
    codec: String,
    /// Where to write the KV (docs/protocol.md, "Exported KV").
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    security: security::ClientArgs,
}

#[derive(clap::Args)]
pub struct DemoArgs {
    #[arg(long, default_value = "qwen05")]
    model: String,
    #[arg(long, default_value = DEMO_SYSTEM)]
    system: String,
    #[arg(long, default_value = DEMO_USER)]
    prompt: String,
    /// Link profile between edge and cloud.
    #[arg(long, default_value = "5g")]
    link: String,
    /// KV codec asked of the cloud: f16 (exact), int8ch / int4ch (keys per channel, values per
    /// token), int8 / int4 (per row).
    #[arg(long, default_value = "f16")]
    codec: String,
    #[arg(long, default_value_t = 96)]
    max_tokens: usize,
    /// Serve the KV unsigned (by default the cloud signs every layer with a fresh key and the
    /// edge checks each one as it lands).
    #[arg(long)]
    unsigned: bool,
}

const DEMO_SYSTEM: &str = "You are the coding assistant for the Acme Payments Python SDK. Answer briefly with \
corrected code.\n\
SDK reference:\n\
- `acme.Client(api_key: str, timeout: float = 10.0)` creates a client. Keys start with `sk_live_` or `sk_test_`.\n\
- `client.charges.create(amount: int, currency: str, source: str, idempotency_key: str | None = None)` \
charges `amount` in the smallest currency unit (cents). Returns a `Charge` with `.id` and `.status` \
(`succeeded`, `pending`, `failed`).\n\
- `client.refunds.create(charge_id: str, amount: int | None = None)` refunds all or part of a charge.\n\
- `client.customers.retrieve(customer_id: str)` returns a `Customer` with `.email` and `.default_source`.\n\
- Errors: `acme.CardError` (declined card, has `.code`), `acme.RateLimitError` (retry with backoff), \
`acme.AuthenticationError` (bad key).\n\
- Always pass an `idempotency_key` when retrying a charge, so a retry never charges twice.\n\
- Amounts are integers: 12.50 EUR is `1250`.";
const DEMO_USER: &str =
    "Our internal billing job (do not share) fails for customer cus_8842 of Dana Whitfield:\n\
```python\n\
client = acme.Client(api_key=\"sk_live_51Hx9InternalKey\")\n\
charge = client.charges.create(amount=12.50, currency=\"eur\", source=cust.default_source)\n\
```\n\
What is wrong?";

fn parse_ms(s: &str) -> anyhow::Result<std::time::Duration> {
    let n: f64 = s
        .trim()
        .trim_end_matches("ms")
        .parse()
        .context("rtt like 20ms")?;
    Ok(std::time::Duration::from_secs_f64(n / 1000.0))
}

fn profile(name: Option<&str>, bw: Option<&str>, rtt: Option<&str>) -> anyhow::Result<Profile> {
    let mut p = match name {
        Some(n) => Profile::named(n).with_context(|| format!("unknown link profile {n}"))?,
        None => Profile::UNLIMITED,
    };
    if let Some(b) = bw {
        p.bandwidth_bps =
            Profile::parse_bandwidth(b).with_context(|| format!("bad bandwidth {b}"))?;
    }
    if let Some(r) = rtt {
        p.rtt = parse_ms(r)?;
    }
    Ok(p)
}

async fn serve_cloud(
    node: Arc<CloudNode>,
    listen: &str,
    tls: Option<tonic::transport::Identity>,
) -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let mut builder = tonic::transport::Server::builder();
    if let Some(id) = tls {
        builder = builder.tls_config(tonic::transport::ServerTlsConfig::new().identity(id))?;
    }
    tokio::spawn(
        builder
            .add_service(CloudService::server(node))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    Ok(addr)
}

/// The `[server]` table of the cloud's prompts file, if any.
fn server_section(path: &std::path::Path) -> anyhow::Result<ServerSection> {
    #[derive(serde::Deserialize)]
    struct File {
        server: Option<ServerSection>,
    }
    let text = std::fs::read_to_string(path)?;
    let f: File = toml::from_str(&text).with_context(|| format!("{}: [server]", path.display()))?;
    Ok(f.server.unwrap_or_default())
}

pub fn cloud(a: CloudArgs) -> anyhow::Result<()> {
    let model = Arc::new(super::models::load_with(
        &a.model,
        a.chat_template.as_deref(),
    )?);
    let specs = PromptsFile::load(&a.prompts)?.prompts;
    let server = server_section(&a.prompts)?;
    let defaults = Limits::default();
    let limits = Limits {
        max_streams: server.max_streams.unwrap_or(defaults.max_streams),
        per_client_rate: server.per_client_rate.unwrap_or(defaults.per_client_rate),
        per_client_burst: 2.0 * server.per_client_rate.unwrap_or(defaults.per_client_rate),
    };
    let token = security::token(server.token_file.as_ref(), server.token_env.as_deref())?;
    let data_dir = match &a.data_dir {
        Some(d) => d.clone(),
        None => a
            .prompts
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), PathBuf::from),
    };
    let (signing, key_from) = security::cloud_signing_key(
        server.signing_key_file.as_ref(),
        server.signing_key_env.as_deref(),
        &data_dir,
    )?;
    let tls = match (&server.tls_cert, &server.tls_key) {
        (Some(c), Some(k)) => Some(tonic::transport::Identity::from_pem(
            std::fs::read(c).with_context(|| format!("reading {}", c.display()))?,
            std::fs::read(k).with_context(|| format!("reading {}", k.display()))?,
        )),
        (None, None) => None,
        _ => bail!("[server] needs both tls_cert and tls_key"),
    };
    let (tls_on, token_on) = (tls.is_some(), token.is_some());
    let adapters = a
        .adapters
        .iter()
        .map(|p| {
            edgeprompt_align::AdapterSet::load(p)
                .with_context(|| "run `edgeprompt align` for this model pair".to_string())
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let n_adapters = adapters.len();
    let mut node = CloudNode::new(model, &specs, a.cache_bytes)?
        .with_guard(limits, token)
        .with_adapters(adapters)?;
    if let (Some(f), Some(m)) = (&a.fuser, &a.fuser_edge_model) {
        let fuser = edgeprompt_align::Fuser::load(f)
            .with_context(|| "train one with scripts/fuser/train.py".to_string())?;
        let slm = Arc::new(super::models::load_with(m, None)?);
        eprintln!(
            "serving {} fused KV (fuser {}, layers {:?})",
            slm.cfg.name,
            &fuser.sha256[..12],
            fuser.fused_layers()
        );
        node = node.with_fuser(slm, fuser)?;
    }
    eprintln!(
        "signing the KV served with key {} ({key_from})",
        signing.public().short()
    );
    node = node.with_signing(signing);
    if n_adapters > 0 {
        eprintln!("serving {n_adapters} smaller edge model(s) through CE-LSLM adapters");
    }
    let ns = server.redis_namespace.as_deref().unwrap_or("edgeprompt");
    // The CA of a rediss:// server's certificate (default: the system's roots). A PEM file is
    // small; anything far larger is not one.
    let redis_ca = match &server.redis_ca_file {
        Some(p) => {
            let len = std::fs::metadata(p)
                .with_context(|| format!("reading {}", p.display()))?
                .len();
            anyhow::ensure!(
                len <= 1 << 20,
                "{} is {len} bytes: not a CA file",
                p.display()
            );
            Some(std::fs::read(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => None,
    };
    match (&server.redis_url, &server.redis_cluster) {
        (Some(_), Some(_)) => anyhow::bail!("[server] names both redis_url and redis_cluster"),
        (Some(url), None) => {
            let store = edgeprompt_kv::RedisStore::open_with(url, ns, redis_ca.as_deref())?;
            node = node.with_shared(Arc::new(store));
            eprintln!("shared tier: Redis at {url}, namespace {ns}");
        }
        (None, Some(nodes)) => {
            let store =
                edgeprompt_kv::RedisStore::open_cluster_with(nodes, ns, redis_ca.as_deref())?;
            node = node.with_shared(Arc::new(store));
            eprintln!(
                "shared tier: Redis Cluster at {}, namespace {ns}",
                nodes.join(", ")
            );
        }
        (None, None) => {}
    }
    if let Some(url) = &server.store_url {
        node = node.with_bucket(Arc::new(edgeprompt_kv::BucketStore::open(url)?));
        eprintln!("shared tier: object store at {url}");
    }
    if let Some(url) = &server.public_store_url {
        node = node.with_public_store(url)?;
        eprintln!("edges are told to read published prompts at {url}");
    }
    let node = Arc::new(node);
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let addr = serve_cloud(node.clone(), &a.listen, tls).await?;
        eprintln!(
            "cloud serving {} prompt(s) on {addr} (TLS {}, bearer token {}, at most {} streams, {} fetches/s per client)",
            specs.len(),
            if tls_on { "on" } else { "off" },
            if token_on { "required" } else { "not required" },
            limits.max_streams,
            limits.per_client_rate
        );
        for id in node.prompt_ids() {
            let t = Instant::now();
            node.warm(&id)
                .await
                .map_err(|s| anyhow::anyhow!("{}", s.message()))?;
            eprintln!(
                "  {id}: {} tokens prefilled in {:.2} s",
                node.prompt_tokens(&id).unwrap_or(0),
                t.elapsed().as_secs_f64()
            );
        }
        tokio::signal::ctrl_c().await?;
        Ok(())
    })
}

pub fn link(a: LinkArgs) -> anyhow::Result<()> {
    let p = profile(
        a.profile.as_deref(),
        a.bandwidth.as_deref(),
        a.rtt.as_deref(),
    )?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let link = Link::start(&a.listen, a.upstream.clone(), p).await?;
        eprintln!(
            "link {} -> {} ({:.0} Mbit/s, RTT {:?}, loss {})",
            link.addr,
            a.upstream,
            p.bandwidth_bps as f64 / 1e6,
            p.rtt,
            p.loss
        );
        tokio::signal::ctrl_c().await?;
        eprintln!(
            "bytes up {}, down {}",
            link.counters.up(),
            link.counters.down()
        );
        Ok(())
    })
}

/// What one edge request measured.
struct EdgeRun {
    text: String,
    ttft: f64,
    prefill_done: f64,
    tokens: usize,
    total: f64,
    timeline: Timeline,
    /// Where the cloud prompt's KV came from, and what getting it put on the network.
    source: &'static str,
    wire: edgeprompt_edge::layer_stream::Wire,
}

/// One chat turn as the edge sees it.
struct Turn<'a> {
    /// The cloud prompt the system message must be (checked against the cloud's list).
    prompt_id: Option<&'a str>,
    system: &'a str,
    user: &'a str,
    pipeline: bool,
    max_tokens: usize,
    echo: bool,
}

/// One chat turn through the edge's own lookup (the server's: memory, disk, peers, the cloud,
/// or computed here, every layer checked before it is used, the same fallback), then the
/// private prompt prefilled here as the cloud's layers land, and the answer decoded.
async fn edge_request(prefixes: Arc<Prefixes>, t: Turn<'_>) -> anyhow::Result<EdgeRun> {
    let model = prefixes.model().clone();
    let chat = model.chat.as_ref().context("no chat template")?;
    let split = chat.split(t.system, &[Message::new("user", t.user)])?;
    let edge_ids = model.tokenizer.encode(&split.edge)?;
    let cloud_ids = model.tokenizer.encode(&split.cloud)?;
    let start = Instant::now();
    let lookup = prefixes
        .for_system_streaming(&cloud_ids)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(id) = t.prompt_id {
        // The cloud's list, as the lookup just saw it (empty while the cloud is down).
        let published = prefixes.published().await.unwrap_or_default();
        let address = edgeprompt_kv::content_address(&model.fingerprint, &cloud_ids);
        if let Some(p) = published.named(id).filter(|p| p.address != address) {
            bail!(
                "the system message is not the text of cloud prompt {:?} ({} tokens)",
                p.id,
                p.tokens
            );
        }
    }
    let (pipeline, max_tokens, echo) = (t.pipeline, t.max_tokens, t.echo);
    tokio::task::spawn_blocking(move || -> anyhow::Result<EdgeRun> {
        let (mut seq, mut logits, timeline) =
            prefill_following(&model, &lookup.kv, &edge_ids, start, pipeline)?;
        let prefill_done = start.elapsed().as_secs_f64();
        let (text, ttft, tokens) = decode(&model, &mut seq, &mut logits, max_tokens, start, echo)?;
        Ok(EdgeRun {
            text,
            ttft,
            prefill_done,
            tokens,
            total: start.elapsed().as_secs_f64(),
            timeline,
            // Read after the prefill: a stream that failed was computed here meanwhile.
            source: lookup.source().name(),
            wire: lookup.wire(),
        })
    })
    .await?
}

/// Greedy decode with streaming; returns text, TTFT and token count.
fn decode(
    model: &Model,
    seq: &mut Sequence,
    logits: &mut Vec<f32>,
    max_tokens: usize,
    start: Instant,
    echo: bool,
) -> anyhow::Result<(String, f64, usize)> {
    let mut sampler = Sampler::new(SamplingParams::default());
    let (mut ids, mut shown, mut ttft) = (Vec::new(), 0, 0.0);
    let mut out = std::io::stdout();
    while ids.len() < max_tokens {
        let id = sampler.sample(logits);
        if ids.is_empty() {
            ttft = start.elapsed().as_secs_f64();
        }
        if model.tokenizer.stop_ids.contains(&id) {
            break;
        }
        ids.push(id);
        let text = model.tokenizer.decode(&ids)?;
        if echo && !text.ends_with('\u{FFFD}') {
            let _ = out.write_all(&text.as_bytes()[shown..]);
            let _ = out.flush();
            shown = text.len();
        }
        *logits = seq.prefill(model, &[id])?;
    }
    if echo {
        println!();
    }
    Ok((model.tokenizer.decode(&ids)?, ttft, ids.len()))
}

/// A one-shot edge's lookup against `cloud`: the model, and the configuration the server's
/// lookup would take from the same flags.
fn one_shot(
    model: &str,
    cloud: &str,
    codec: &str,
    client: &security::ClientArgs,
) -> anyhow::Result<(Arc<Model>, PrefixConfig)> {
    let model = Arc::new(super::models::load(model)?);
    let codec =
        Codec::parse(codec).with_context(|| format!("codec is one of {}", Codec::names()))?;
    let security = client.load()?;
    security::check_credentials("--cloud", cloud, &security)?;
    let cfg = PrefixConfig {
        cloud_url: Some(cloud.to_string()),
        codec,
        trust: client.trust()?,
        cloud_prompts: client.cloud_prompts(),
        security,
        ..Default::default()
    };
    Ok((model, cfg))
}

pub fn edge(a: EdgeArgs) -> anyhow::Result<()> {
    let (model, cfg) = one_shot(&a.model, &a.cloud, &a.codec, &a.security)?;
    let cfg = PrefixConfig {
        cloud_layers_from: a.cloud_layers_from,
        ..cfg
    };
    let rt = tokio::runtime::Runtime::new()?;
    let run = rt.block_on(async {
        let prefixes = Arc::new(Prefixes::new(model, cfg, Arc::new(Metrics::new()))?);
        edge_request(
            prefixes,
            Turn {
                prompt_id: a.prompt_id.as_deref(),
                system: &a.system,
                user: &a.prompt,
                pipeline: !a.no_pipeline,
                max_tokens: a.max_tokens,
                echo: true,
            },
        )
        .await
    })?;
    eprintln!(
        "TTFT {:.3} s (prefill done {:.3} s), {} tokens in {:.2} s; cloud prompt KV from {}: {} bytes up, {} down",
        run.ttft, run.prefill_done, run.tokens, run.total, run.source, run.wire.up, run.wire.down
    );
    Ok(())
}

/// Fetch a published prompt through the edge's own path (every layer checked against the
/// cloud's key) and write what it reassembled; a prompt the edge had to compute is an error.
pub fn kv_export(a: ExportArgs) -> anyhow::Result<()> {
    if a.security.allows_unsigned() {
        bail!(
            "kv-export writes only KV whose every layer the cloud signed: drop --allow-unsigned-kv"
        );
    }
    let (model, cfg) = one_shot(&a.model, &a.cloud, &a.codec, &a.security)?;
    let codec = cfg.codec;
    let recurrence = model.cfg.features.recurrence;
    let rt = tokio::runtime::Runtime::new()?;
    let got = rt.block_on(async {
        let prefixes = Prefixes::new(model, cfg, Arc::new(Metrics::new()))?;
        prefixes
            .for_id(&a.prompt_id)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
    })?;
    if got.source != Source::Cloud {
        bail!(
            "the KV of {:?} came from {}, not the cloud (its log says why)",
            a.prompt_id,
            got.source.name()
        );
    }
    // Written beside the target and renamed: no partial file under the name asked for.
    let dir = a.out.parent().filter(|d| !d.as_os_str().is_empty());
    let tmp = tempfile::NamedTempFile::new_in(dir.unwrap_or(std::path::Path::new(".")))?;
    let mut out = std::io::BufWriter::new(tmp);
    edgeprompt_kv::export::write_export(&mut out, &a.prompt_id, codec, recurrence, &got.prefix)?;
    let tmp = out.into_inner().map_err(|e| e.into_error())?;
    tmp.as_file().sync_all()?;
    tmp.persist(&a.out)
        .with_context(|| format!("{}", a.out.display()))?;
    eprintln!(
        "{}: {} layers of {} tokens ({} values), {} bytes down",
        a.out.display(),
        got.prefix.layers.len(),
        got.prefix.n_tokens(),
        codec.name(),
        got.wire.down
    );
    Ok(())
}

pub fn demo(a: DemoArgs) -> anyhow::Result<()> {
    let model = Arc::new(super::models::load(&a.model)?);
    let codec =
        Codec::parse(&a.codec).with_context(|| format!("codec is one of {}", Codec::names()))?;
    let link_profile = profile(Some(&a.link), None, None)?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let specs = [PromptSpec {
            id: "acme-support".into(),
            system: a.system.clone(),
            text: None,
        }];
        // The cloud signs with a fresh key, which the edge is given.
        let mut node = CloudNode::new(model.clone(), &specs, 1 << 30)?;
        if a.unsigned {
            node = node.unsigned();
        }
        let trust = node.public_key();
        let node = Arc::new(node);
        let cloud_addr = serve_cloud(node.clone(), "127.0.0.1:0", None).await?;
        let link = Link::start("127.0.0.1:0", cloud_addr.to_string(), link_profile).await?;
        let url = format!("http://{}", link.addr);
        println!("== EdgePrompt demo: {} ==", model.cfg.name);
        println!("cloud on {cloud_addr}, edge reaches it through a {} link ({:.0} Mbit/s, RTT {:?}) on {}", a.link, link_profile.bandwidth_bps as f64 / 1e6, link_profile.rtt, link.addr);
        let t = Instant::now();
        node.warm("acme-support").await.map_err(|s| anyhow::anyhow!("{}", s.message()))?;
        println!(
            "cloud prefilled the public prompt once: {} tokens in {:.2} s (cached for every edge)",
            node.prompt_tokens("acme-support").unwrap_or(0),
            t.elapsed().as_secs_f64()
        );
        println!("\nuser (private, stays on the edge): {}\n\nassistant: ", a.prompt);
        let (up0, down0) = (link.counters.up(), link.counters.down());
        let cfg = PrefixConfig {
            cloud_url: Some(url.clone()),
            codec,
            trust: trust.map_or(CloudTrust::AllowUnsigned, CloudTrust::Key),
            ..Default::default()
        };
        let prefixes = Arc::new(Prefixes::new(model.clone(), cfg, Arc::new(Metrics::new()))?);
        let run = edge_request(
            prefixes,
            Turn {
                prompt_id: Some("acme-support"),
                system: &a.system,
                user: &a.prompt,
                pipeline: true,
                max_tokens: a.max_tokens,
                echo: true,
            },
        ).await?;
        let (up, down) = (link.counters.up() - up0, link.counters.down() - down0);
        println!("\n-- EdgePrompt (cloud KV over the link, private prompt on the edge) --");
        println!(
            "TTFT {:.3} s = KV transfer overlapped with edge compute (prefill done at {:.3} s) + first token",
            run.ttft, run.prefill_done
        );
        // A hybrid model's recurrent layers travel as their state: fixed in size, not KV.
        let payload = match model.cfg.state_bytes() {
            0 => format!("KV payload {}", run.timeline.bytes_down()),
            s => format!(
                "KV and recurrent-state payload {}, of which {s} the states of {} recurrent layers",
                run.timeline.bytes_down(),
                model.cfg.recurrent.iter().filter(|&&r| r).count()
            ),
        };
        println!("{} tokens, {:.2} s total; cloud prompt KV from the {}; bytes down {down} ({payload}), bytes up {up} (the list and fetch requests only; no edge-prompt bytes)", run.tokens, run.total, run.source);
        match trust {
            Some(k) => println!("every cloud layer checked against the cloud's Ed25519 key {} as it landed", &k.to_hex()[..16]),
            None => println!("KV unsigned (--unsigned): the edge could not tell it from a forgery"),
        }
        println!("\nlayer timeline (s since request): arrived | compute start-end");
        let n = run.timeline.layers.len();
        for l in run.timeline.layers.iter().filter(|l| l.layer < 3 || l.layer + 3 >= n) {
            println!(
                "  layer {:2}: {:7.3} | {:7.3}-{:7.3} {}",
                l.layer,
                l.arrived,
                l.compute_start,
                l.compute_end,
                "#".repeat(((l.compute_end - l.compute_start) * 400.0).round() as usize).chars().take(40).collect::<String>()
            );
            if l.layer == 2 && n > 6 {
                println!("  ...");
            }
        }
        let tl = &run.timeline.layers;
        let inputs = edgeprompt_planner::Inputs {
            cloud_layer_secs: vec![0.0; tl.len()],
            layer_bytes: tl.iter().map(|l| l.wire_bytes).collect(),
            bandwidth_bps: link_profile.bandwidth_bps as f64,
            rtt_secs: link_profile.rtt.as_secs_f64(),
            edge_layer_secs: tl.iter().map(|l| l.compute_end - l.compute_start).collect(),
            head_secs: run.ttft - tl.last().map_or(0.0, |l| l.compute_end),
        };
        let p = edgeprompt_planner::predict(&inputs);
        println!(
            "\nplanner (EdgePrompt eqs. 6-7, measured per-layer compute and link bandwidth): regime {:?}; \
             predicted TTFT {:.3} s pipelined ({:.3} s without pipelining); measured {:.3} s",
            p.regime, p.pipelined_secs, p.sequential_secs, run.ttft
        );
        // Edge only: the same request with the public prompt prefilled on the edge.
        let chat = model.chat.as_ref().context("no chat template")?;
        let full = chat.render(&[Message::new("system", &a.system), Message::new("user", &a.prompt)], true)?;
        let ids = model.tokenizer.encode(&full)?;
        let m2 = model.clone();
        let max_tokens = a.max_tokens;
        let (edge_only_ttft, edge_text) = tokio::task::spawn_blocking(move || -> anyhow::Result<(f64, String)> {
            let start = Instant::now();
            let mut seq = Sequence::new(&m2);
            let mut logits = seq.prefill(&m2, &ids)?;
            let (text, ttft, _) = decode(&m2, &mut seq, &mut logits, max_tokens, start, false)?;
            Ok((ttft, text))
        })
        .await??;
        println!("\n-- edge only (public prompt prefilled again on the edge) --");
        println!("TTFT {edge_only_ttft:.3} s -> EdgePrompt TTFT is {:.2}x of it", run.ttft / edge_only_ttft);
        println!(
            "same answer as edge-only: {}",
            if edge_text == run.text { "yes (split inference is exact)" } else { "NO" }
        );
        Ok(())
    })
}
