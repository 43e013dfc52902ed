//! TLS, bearer-token and shared-tier settings: the edge's flags, the cloud's `[server]` table.
//! Secrets come from a file or an environment variable, never from the command line, and are
//! never printed.

use std::path::PathBuf;

use anyhow::Context;
use edgeprompt_edge::ClientSecurity;
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
    /// The cloud's public key (hex, or a file holding it: `edgeprompt keygen` writes NAME.pub).
    /// With it, KV is used only if the cloud signed every layer, whoever relays it.
    #[arg(long)]
    cloud_key: Option<String>,
}

impl ClientArgs {
    /// The cloud's public key, if one is configured.
    pub fn trust(&self) -> anyhow::Result<Option<TrustKey>> {
        self.cloud_key.as_deref().map(trust_key).transpose()
    }
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

    pub fn policy(&self) -> anyhow::Result<edgeprompt_edge::peer::PeerPolicy> {
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

/// `edgeprompt keygen`: a new signing key pair for a cloud (or a deployment of clouds).
#[derive(clap::Args)]
pub struct KeygenArgs {
    /// Writes OUT.key (the secret, mode 0600, for the cloud) and OUT.pub (for the edges).
    #[arg(long, default_value = "cloud")]
    out: PathBuf,
}

pub fn keygen(a: KeygenArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let key = SealKey::from_seed(seed);
    let secret = a.out.with_extension("key");
    let public = a.out.with_extension("pub");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode_secret()
        .open(&secret)
        .with_context(|| format!("creating {} (it must not exist)", secret.display()))?;
    writeln!(f, "{}", hex::encode(seed))?;
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
    /// Key prefix in that Redis (default "edgeprompt").
    pub redis_namespace: Option<String>,
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
