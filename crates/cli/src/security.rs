//! TLS, bearer-token and shared-tier settings: the edge's flags, the cloud's `[server]` table.
//! Secrets come from a file or an environment variable, never from the command line, and are
//! never printed.

use std::path::{Path, PathBuf};

use anyhow::Context;
use edgeprompt_edge::client::plaintext_ok;
use edgeprompt_edge::{ClientSecurity, CloudTrust};
use edgeprompt_kv::{SealKey, TrustKey};

/// Environment variable holding the bearer token when no file is given.
pub const TOKEN_ENV: &str = "EDGEPROMPT_CLOUD_TOKEN";
/// Environment variable holding the peer token when no file is given.
pub const PEER_TOKEN_ENV: &str = "EDGEPROMPT_PEER_TOKEN";
/// Environment variable holding the cloud's signing key (hex) when no file is given.
pub const SIGNING_KEY_ENV: &str = "EDGEPROMPT_CLOUD_SIGNING_KEY";

#[derive(clap::Args, Clone, Default)]
pub struct ClientArgs {
    /// PEM of the CA that signed the cloud's certificate (turns on TLS; use an https:// URL).
    #[arg(long)]
    cloud_ca: Option<PathBuf>,
    /// Name the cloud's certificate must carry, if not the URL's host.
    #[arg(long)]
    cloud_domain: Option<String>,
    /// File holding the bearer token (default: $EDGEPROMPT_CLOUD_TOKEN, if set).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The cloud's public key (hex, or a file holding it: the cloud writes cloud.pub beside
    /// its key). Without it, the key the cloud shows on first contact is pinned in
    /// --known-clouds and required from then on. Either way, KV is used only if the cloud
    /// signed every layer, whoever relays it.
    #[arg(long, conflicts_with = "allow_unsigned_kv")]
    cloud_key: Option<String>,
    /// Where the keys pinned on first contact are kept, one `host:port key` line per cloud
    /// (default: ~/.local/state/edgeprompt/known_clouds; never in the cache directory, which
    /// holds what others sent).
    #[arg(long)]
    known_clouds: Option<PathBuf>,
    /// Take KV the cloud did not sign. Insecure: anyone on the path, a peer or a file in the
    /// cache directory can then change answers with forged values.
    #[arg(long)]
    allow_unsigned_kv: bool,
    /// Only these of the cloud's published prompts are ever asked for (comma-separated ids):
    /// a cloud cannot then publish the address of a guessed private system message and watch
    /// whether this edge asks for it. Default: every prompt the cloud publishes.
    #[arg(long, value_delimiter = ',')]
    cloud_prompts: Vec<String>,
}

impl ClientArgs {
    /// Whether unsigned KV was allowed (`--allow-unsigned-kv`).
    pub fn allows_unsigned(&self) -> bool {
        self.allow_unsigned_kv
    }

    /// The published prompts this edge takes (none given: every one).
    pub fn cloud_prompts(&self) -> Option<Vec<String>> {
        (!self.cloud_prompts.is_empty()).then(|| self.cloud_prompts.clone())
    }

    /// How this edge learns its cloud's key: given, pinned on first use (kept in
    /// `--known-clouds`, else the user's state directory), or not at all when unsigned KV is
    /// allowed (warned).
    pub fn trust(&self) -> anyhow::Result<CloudTrust> {
        if self.allow_unsigned_kv {
            eprintln!("warning: --allow-unsigned-kv: KV from the cloud, peers and disk is used unsigned; anyone on the path can change this edge's answers with forged values");
            return Ok(CloudTrust::AllowUnsigned);
        }
        if let Some(k) = &self.cloud_key {
            let k = trust_key(k)?;
            eprintln!("cloud KV is used only if signed by {}", k.short());
            return Ok(CloudTrust::Key(k));
        }
        let file = self
            .known_clouds
            .clone()
            .or_else(|| user_state().map(|d| d.join("known_clouds")));
        match &file {
            Some(f) => eprintln!(
                "cloud KV is used only if signed by the key the cloud showed first (pinned in {})",
                f.display()
            ),
            None => eprintln!("warning: no state directory for --known-clouds: the cloud's key is pinned for this process only"),
        }
        Ok(CloudTrust::FirstUse(file))
    }
}

/// `edgeprompt trust`: the keys pinned for clouds, shown (no `--cloud`), provisioned out of
/// band or replaced (`--cloud` and `--key`: to settle a conflict, whose two keys the edge's
/// `/health` names), or forgotten (`--cloud` and `--forget`).
#[derive(clap::Args)]
pub struct TrustArgs {
    /// The known clouds file (default: ~/.local/state/edgeprompt/known_clouds, as the edge's).
    #[arg(long)]
    known_clouds: Option<PathBuf>,
    /// The cloud's URL, as the edge's --cloud.
    #[arg(long, requires = "change")]
    cloud: Option<String>,
    /// Pin this public key for the cloud: hex, or a file holding it (the cloud's cloud.pub).
    #[arg(long, group = "change")]
    key: Option<String>,
    /// Remove the cloud's pin: the edge pins what the cloud shows at its next contact.
    #[arg(long, group = "change")]
    forget: bool,
}

pub fn trust(a: TrustArgs) -> anyhow::Result<()> {
    use edgeprompt_edge::trust::{pins, set_pin};
    let file = a
        .known_clouds
        .or_else(|| user_state().map(|d| d.join("known_clouds")))
        .context("no state directory: give --known-clouds")?;
    let Some(cloud) = a.cloud else {
        let p = pins(&file)?;
        if p.is_empty() {
            println!("no cloud is pinned in {}", file.display());
        }
        for (cloud, key) in p {
            println!("{cloud} {}", key.to_hex());
        }
        return Ok(());
    };
    match a.key {
        Some(key) => {
            let k = trust_key(&key)?;
            match set_pin(&file, &cloud, Some(&k))? {
                Some(old) if old != k => println!(
                    "{cloud}: pinned {} (was {}) in {}; restart its edges",
                    k.to_hex(),
                    old.to_hex(),
                    file.display()
                ),
                _ => println!("{cloud}: pinned {} in {}", k.to_hex(), file.display()),
            }
        }
        None => match set_pin(&file, &cloud, None)? {
            Some(old) => println!("{cloud}: forgot {} in {}", old.to_hex(), file.display()),
            None => println!("{cloud}: no pin in {}", file.display()),
        },
    }
    Ok(())
}

/// `$XDG_STATE_HOME/edgeprompt`, else `~/.local/state/edgeprompt`.
fn user_state() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(base.join("edgeprompt"))
}

/// Refused at start, not at first use: a bearer token for `url` that would travel unencrypted
/// to another machine.
pub fn check_credentials(what: &str, url: &str, sec: &ClientSecurity) -> anyhow::Result<()> {
    let tls = sec.ca_pem.is_some() && url.starts_with("https://");
    if sec.token.is_some() && !tls && !plaintext_ok(url) {
        anyhow::bail!(
            "{what} {url}: a bearer token would travel unencrypted; use https:// with a CA (--cloud-ca / --peer-ca), or loopback"
        );
    }
    Ok(())
}

/// A public key given as hex or as a file holding it.
pub fn trust_key(s: &str) -> anyhow::Result<TrustKey> {
    let text = match std::path::Path::new(s).is_file() {
        true => std::fs::read_to_string(s).with_context(|| format!("reading {s}"))?,
        false => s.to_string(),
    };
    TrustKey::from_hex(&text).with_context(|| format!("--cloud-key {s}: not a public key"))
}

/// The peer plane of `edgeprompt serve`: the token peers share (never the cloud's), TLS both
/// ways, and what this edge serves.
#[derive(clap::Args, Clone, Default)]
pub struct PeerArgs {
    /// File holding the token peers send and this edge requires from them (default:
    /// $EDGEPROMPT_PEER_TOKEN, if set).
    #[arg(long)]
    peer_token_file: Option<PathBuf>,
    /// PEM of the CA that signed the peers' certificates (TLS to peers; use https:// peer URLs).
    #[arg(long)]
    peer_ca: Option<PathBuf>,
    /// Name the peers' certificates must carry, if not the URL's host.
    #[arg(long)]
    peer_domain: Option<String>,
    /// Certificate (PEM) this edge serves peers with (with --peer-tls-key: TLS on --peer-listen).
    #[arg(long)]
    peer_tls_cert: Option<PathBuf>,
    #[arg(long)]
    peer_tls_key: Option<PathBuf>,
    /// Serve peers only KV whose every layer carries the cloud's signature.
    #[arg(long)]
    peer_signed_only: bool,
    /// KV streams served to peers at once.
    #[arg(long, default_value_t = 64)]
    peer_max_streams: usize,
    /// Sustained fetches per second per peer address.
    #[arg(long, default_value_t = 20.0)]
    peer_rate: f64,
}

impl PeerArgs {
    pub fn token(&self) -> anyhow::Result<Option<String>> {
        token(self.peer_token_file.as_ref(), Some(PEER_TOKEN_ENV))
    }

    /// How this edge reaches its peers.
    pub fn client(&self) -> anyhow::Result<ClientSecurity> {
        Ok(ClientSecurity {
            ca_pem: read_opt(self.peer_ca.as_ref())?,
            domain: self.peer_domain.clone(),
            token: self.token()?,
        })
    }

    /// The TLS identity served to peers, if any.
    pub fn identity(&self) -> anyhow::Result<Option<tonic::transport::Identity>> {
        match (&self.peer_tls_cert, &self.peer_tls_key) {
            (Some(c), Some(k)) => Ok(Some(tonic::transport::Identity::from_pem(
                std::fs::read(c).with_context(|| format!("reading {}", c.display()))?,
                std::fs::read(k).with_context(|| format!("reading {}", k.display()))?,
            ))),
            (None, None) => Ok(None),
            _ => anyhow::bail!("--peer-tls-cert and --peer-tls-key go together"),
        }
    }

    /// What this edge serves its peers on `listen`: refused on an address other hosts reach
    /// without a peer token.
    pub fn policy(&self, listen: &str) -> anyhow::Result<edgeprompt_edge::peer::PeerPolicy> {
        let loopback = listen
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback())
            || listen.starts_with("localhost:");
        if !loopback && self.token()?.is_none() {
            anyhow::bail!(
                "--peer-listen {listen}: other hosts can reach it, so peers need a token: --peer-token-file FILE (or ${PEER_TOKEN_ENV}) on this edge and its peers"
            );
        }
        if !loopback && self.peer_tls_cert.is_none() {
            anyhow::bail!(
                "--peer-listen {listen}: other hosts can reach it, and the peer token must not cross the network in the clear: serve peers over TLS (--peer-tls-cert, --peer-tls-key)"
            );
        }
        Ok(edgeprompt_edge::peer::PeerPolicy {
            token: self.token()?,
            limits: edgeprompt_cloud::Limits {
                max_streams: self.peer_max_streams.max(1),
                per_client_rate: self.peer_rate,
                per_client_burst: 2.0 * self.peer_rate,
            },
            signed_only: self.peer_signed_only,
        })
    }
}

fn read_opt(p: Option<&PathBuf>) -> anyhow::Result<Option<Vec<u8>>> {
    p.map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display())))
        .transpose()
}

/// The cloud's signing key from `file`, else from `env` (default $EDGEPROMPT_CLOUD_SIGNING_KEY);
/// none if neither is set.
pub fn signing_key(file: Option<&PathBuf>, env: Option<&str>) -> anyhow::Result<Option<SealKey>> {
    let Some(text) = token(file, Some(env.unwrap_or(SIGNING_KEY_ENV)))? else {
        return Ok(None);
    };
    SealKey::from_hex(&text)
        .map(Some)
        .context("the signing key is not 32 bytes of hex (`edgeprompt keygen` writes one)")
}

/// The key a cloud signs with: the configured one, else `cloud.key` in `dir`, made on first
/// start (mode 0600, with `cloud.pub` beside it for edges that want to give --cloud-key).
/// Returns the key and where it came from.
pub fn cloud_signing_key(
    file: Option<&PathBuf>,
    env: Option<&str>,
    dir: &Path,
) -> anyhow::Result<(SealKey, String)> {
    if let Some(k) = signing_key(file, env)? {
        let from = match file {
            Some(f) => f.display().to_string(),
            None => format!("${}", env.unwrap_or(SIGNING_KEY_ENV)),
        };
        return Ok((k, from));
    }
    let secret = dir.join("cloud.key");
    let public = dir.join("cloud.pub");
    if !secret.exists() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let (key, seed) = SealKey::generate()?;
        // Written whole under a name of its own, then linked in: a cloud starting beside this
        // one reads either no key or all of it, and only one key is ever made.
        let tmp = dir.join(format!(".cloud.key.{}", std::process::id()));
        write_secret(&tmp, &seed).with_context(|| format!("creating {}", tmp.display()))?;
        let linked = std::fs::hard_link(&tmp, &secret);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                std::fs::write(&public, format!("{}\n", key.public().to_hex()))
                    .with_context(|| format!("writing {}", public.display()))?;
                eprintln!(
                    "made a signing key for this cloud: {} (secret) and {} (for edges' --cloud-key)",
                    secret.display(),
                    public.display()
                );
            }
            // Another cloud sharing the directory made it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "creating {} (or set signing_key_file in [server], or --data-dir)",
                        secret.display()
                    )
                })
            }
        }
    }
    let text = std::fs::read_to_string(&secret)
        .with_context(|| format!("reading {}", secret.display()))?;
    let key = SealKey::from_hex(&text)
        .with_context(|| format!("{}: not a signing key", secret.display()))?;
    if !public.exists() {
        std::fs::write(&public, format!("{}\n", key.public().to_hex()))
            .with_context(|| format!("writing {}", public.display()))?;
    }
    Ok((key, secret.display().to_string()))
}

fn write_secret(path: &Path, seed: &[u8; 32]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode_secret()
        .open(path)?;
    writeln!(f, "{}", hex::encode(seed))
}

/// `edgeprompt keygen`: a new signing key pair for a cloud (or a deployment of clouds).
#[derive(clap::Args)]
pub struct KeygenArgs {
    /// Writes OUT.key (the secret, mode 0600, for the cloud) and OUT.pub (for the edges).
    #[arg(long, default_value = "cloud")]
    out: PathBuf,
}

pub fn keygen(a: KeygenArgs) -> anyhow::Result<()> {
    let (key, seed) = SealKey::generate()?;
    let secret = a.out.with_extension("key");
    let public = a.out.with_extension("pub");
    write_secret(&secret, &seed)
        .with_context(|| format!("creating {} (it must not exist)", secret.display()))?;
    std::fs::write(&public, format!("{}\n", key.public().to_hex()))
        .with_context(|| format!("writing {}", public.display()))?;
    eprintln!(
        "wrote {} (secret: the cloud's [server] signing_key_file, or ${SIGNING_KEY_ENV}) and {} (public: each edge's --cloud-key)",
        secret.display(),
        public.display()
    );
    Ok(())
}

/// Secret files are readable by their owner only.
trait SecretMode {
    fn mode_secret(&mut self) -> &mut Self;
}

impl SecretMode for std::fs::OpenOptions {
    fn mode_secret(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

impl ClientArgs {
    pub fn load(&self) -> anyhow::Result<ClientSecurity> {
        let ca_pem = match &self.cloud_ca {
            Some(p) => Some(std::fs::read(p).with_context(|| format!("reading {}", p.display()))?),
            None => None,
        };
        Ok(ClientSecurity {
            ca_pem,
            domain: self.cloud_domain.clone(),
            token: token(self.token_file.as_ref(), None)?,
        })
    }
}

/// The cloud's `[server]` table in its prompts file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    /// Name of the environment variable with the token (default EDGEPROMPT_CLOUD_TOKEN).
    pub token_env: Option<String>,
    pub max_streams: Option<usize>,
    pub per_client_rate: Option<f64>,
    /// Redis shared by several cloud nodes, e.g. "redis://127.0.0.1:6379/".
    pub redis_url: Option<String>,
    /// Or a Redis Cluster shared by them, any of its nodes, e.g. ["redis://10.0.0.1:7000"].
    pub redis_cluster: Option<Vec<String>>,
    /// PEM of the CA that signed a `rediss://` Redis's certificate (default: the system's
    /// roots).
    pub redis_ca_file: Option<PathBuf>,
    /// Key prefix in that Redis (default "edgeprompt").
    pub redis_namespace: Option<String>,
    /// Object store shared by several cloud nodes, e.g. "s3://bucket/edgeprompt" (endpoint and
    /// credentials from the `AWS_*` variables) or "file:///srv/edgeprompt".
    pub store_url: Option<String>,
    /// Where edges read that store's objects (its public face, e.g. a CDN in front of the
    /// bucket: "https://cdn.example/edgeprompt"), named in the signed list so edges given no
    /// `--kv-store` read published prompts there.
    pub public_store_url: Option<String>,
    /// File holding the key this cloud signs the KV it serves with (`edgeprompt keygen`).
    pub signing_key_file: Option<PathBuf>,
    /// Name of the environment variable with that key (default EDGEPROMPT_CLOUD_SIGNING_KEY).
    pub signing_key_env: Option<String>,
}

/// A token from `file`, else from the environment; trimmed; empty means none.
pub fn token(file: Option<&PathBuf>, env: Option<&str>) -> anyhow::Result<Option<String>> {
    let raw = match file {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => std::env::var(env.unwrap_or(TOKEN_ENV)).ok(),
    };
    Ok(raw.map(|t| t.trim().to_string()).filter(|t| !t.is_empty()))
}
